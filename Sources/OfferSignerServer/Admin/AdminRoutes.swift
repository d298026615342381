import AppStoreServerAPI
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import OfferSignerEligibility
import OfferSignerStorage

/// The operator's dashboard (`/admin`), off unless `serve --admin-token-file` is given.
///
/// Rules:
/// - Not configured: every `/admin` path answers 404 `not_found`, as if it did not exist.
/// - Every page needs the admin credential: `Authorization: Bearer <admin token>`, or the session
///   cookie `POST /admin/login` sets (see ``AdminToken``). Without it: 401 (an HTML page linking
///   to the sign-in form for a client that accepts `text/html`, else the `unauthorized` problem).
///   Only a `Bearer` header is a token (another scheme, e.g. a protecting proxy's `Basic`,
///   falls back to the cookie). A wrong token counts against its address (``AdminGuessLimit``);
///   past it, 429 `rate_limited`; the right token is always admitted.
/// - `POST /admin/login` and `/admin/logout` refuse cross-site requests (``AdminSameOrigin``).
/// - Every page is read-only, has the strict policy of ``AdminLayout`` and `Cache-Control:
///   no-store`, and reads the store with bounded queries (time windows, indexes; on SQLite from
///   a reader connection, so a page never waits for, nor holds back, a signing commit).
struct AdminDashboard: Sendable {
    let token: AdminToken
    let store: any OfferSignerStore
    let metrics: ServerMetrics
    let retentionActivity: RetentionActivity
    let retentionConfigured: Bool
    let retentionBudget: Duration
    let appleClient: AppStoreServerAPIClient?
    let catalogBundles: Set<String>
    /// The ring the server signs and authenticates with (its registry state, for the banner and
    /// the "not served" marks).
    let keyRing: KeyRingHolder
    let checkpointRefusal: @Sendable () -> String?
    let guesses = RateLimiter(limit: AdminGuessLimit.limit)
    let offersCache = AdminOffersCache()

    static let htmlHeaders: HTTPFields = [
        .contentType: "text/html; charset=utf-8", .cacheControl: "no-store", .contentSecurityPolicy: AdminLayout.contentSecurityPolicy,
        .xContentTypeOptions: "nosniff", .init("Referrer-Policy")!: "no-referrer", .init("X-Frame-Options")!: "DENY",
    ]

    static func html(_ page: String, status: HTTPResponse.Status = .ok, headers extra: HTTPFields = [:]) -> Response {
        var headers = htmlHeaders
        headers.append(contentsOf: extra)
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: page)))
    }

    enum Access {
        case granted
        case refused(Response)
    }

    /// Whether the request carries the admin credential.
    func access(_ request: Request) throws -> Access {
        if let authorization = request.headers[.authorization], authorization.count >= 7, authorization.prefix(7).lowercased() == "bearer " {
            if token.matches(authorization: authorization) { return .granted }
            try AdminGuessLimit.recordWrongToken(request, in: guesses)
            return .refused(refusal(request, "the admin token is not valid"))
        }
        if let session = AdminToken.sessionCookie(request.headers[.cookie]), token.verifies(session: session, now: Date()) {
            return .granted
        }
        return .refused(refusal(request, "/admin needs Authorization: Bearer <admin token> (--admin-token-file) or a session from POST /admin/login"))
    }

    private func refusal(_ request: Request, _ detail: String) -> Response {
        if (request.headers[.accept] ?? "").contains("text/html") {
            let body: [HTML] = [
                .element("p", text: "This page needs the admin token."), .element("p", [.element("a", [("href", "/admin/login")], text: "Sign in")]),
            ]
            return Self.html(AdminLayout.document(title: "Sign in required", page: "unauthorized", navigation: nil, generatedAt: Date(), body: body), status: .unauthorized)
        }
        return APIProblem.unauthorized(detail).response(requestID: nil)
    }

    func loginForm(status: HTTPResponse.Status = .ok, message: String? = nil) -> Response {
        var body: [HTML] = []
        if let message { body.append(.element("p", [("class", "warn"), ("role", "alert")], text: message)) }
        body.append(
            .element(
                "form", [("class", "login"), ("method", "post"), ("action", "/admin/login")],
                [
                    .element("label", [("for", "token")], text: "Admin token"),
                    .element("input", [("id", "token"), ("type", "password"), ("name", "token"), ("autocomplete", "current-password"), ("required", "required")], []),
                    .element("button", [("type", "submit")], text: "Sign in"),
                ]))
        return Self.html(AdminLayout.document(title: "Sign in", page: "login", navigation: nil, generatedAt: Date(), body: body), status: status)
    }

    func login(_ request: Request) async throws -> Response {
        try AdminSameOrigin.check(request)
        let body = try await request.body.collect(upTo: 4096)
        let presented = Self.formField("token", in: String(buffer: body)) ?? ""
        guard token.matches(token: presented.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            try AdminGuessLimit.recordWrongToken(request, in: guesses)
            return loginForm(status: .unauthorized, message: "That is not the admin token.")
        }
        var cookie = "\(AdminToken.cookieName)=\(token.newSession(now: Date())); Path=/admin; HttpOnly; SameSite=Strict; Max-Age=\(Int(AdminToken.sessionLifetime))"
        // Behind a TLS proxy the cookie is for HTTPS only (a plain-HTTP loopback set-up keeps working).
        if request.headers[.init("X-Forwarded-Proto")!]?.lowercased() == "https" { cookie += "; Secure" }
        return Response(status: .seeOther, headers: [.location: "/admin/offers", .setCookie: cookie, .cacheControl: "no-store"])
    }

    func logout(_ request: Request) throws -> Response {
        try AdminSameOrigin.check(request)
        if let session = AdminToken.sessionCookie(request.headers[.cookie]) { token.logOut(session: session, now: Date()) }
        return Response(
            status: .seeOther,
            headers: [.location: "/admin/login", .setCookie: "\(AdminToken.cookieName)=; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=0", .cacheControl: "no-store"])
    }

    /// A field of an `application/x-www-form-urlencoded` body.
    static func formField(_ name: String, in body: String) -> String? {
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, parts[0] == name else { continue }
            return String(parts[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding
        }
        return nil
    }

    func page(_ page: AdminPage, _ request: Request) async throws -> Response {
        let ring = keyRing.ring
        let banner = AdminRegistryBanner(manifestProblem: keyRing.manifestProblem, rejectedRows: ring.rejectedRows, checkpointRefusal: checkpointRefusal())
        let document = try await unbannered(page, request, ring: ring)
        guard let html = banner.html else { return Self.html(document) }
        return Self.html(AdminRegistryBanner.insert(html, into: document))
    }

    private func unbannered(_ page: AdminPage, _ request: Request, ring: KeyRing) async throws -> String {
        let now = Date()
        switch page {
        case .offers:
            var days = 30
            if let asked = request.uri.queryParameters.get("days") {
                guard let value = Int(asked), AdminOffersReport.windows.contains(value) else {
                    throw APIProblem(.badRequest, code: "invalid_query", detail: "days must be one of \(AdminOffersReport.windows.map(String.init).joined(separator: ", "))")
                }
                days = value
            }
            let (store, window) = (self.store, days)
            return (try await offersCache.page(days: window) { try await AdminOffersReport.load(store: store, days: window).page() })
        case .retention:
            let requests = MetricsExposition.samples(String(decoding: metrics.exposition(), as: UTF8.self), named: "retention_requests_total")
                .map { (outcome: $0.labels["outcome"] ?? "", count: $0.value) }.sorted { $0.outcome < $1.outcome }
            let budget = Double(retentionBudget.components.seconds) + Double(retentionBudget.components.attoseconds) / 1e18
            return (
                AdminRetentionPage(activity: retentionActivity.snapshot(), requestsByOutcome: requests, budgetSeconds: budget, configured: retentionConfigured, generatedAt: now)
                    .page())
        case .apple:
            let bundles = catalogBundles.union(try await store.listKeys().map(\.bundleID))
            let exposition = String(decoding: metrics.exposition(), as: UTF8.self)
            return (try await AdminApplePage.load(store: store, bundleIDs: bundles, exposition: exposition, client: appleClient, now: now).page())
        case .keys:
            return (try await AdminKeysPage.load(store: store, served: ring.authenticKeyIDs, now: now).page())
        case .clients:
            return (try await AdminClientsPage.load(store: store, served: ring.authenticClientIDs, now: now).page())
        }
    }

    /// The dashboard's routes (also when it is not configured: then each answers 404).
    static func register<Context: RequestContext>(on router: Router<Context>, dashboard: AdminDashboard?) {
        @Sendable func guarded(_ body: @escaping @Sendable (AdminDashboard, Request) async throws -> Response) -> @Sendable (Request, Context) async throws -> Response {
            { request, _ in
                guard let dashboard else { throw APIProblem(.notFound, code: "not_found", detail: "no route \(request.method.rawValue) \(request.uri.path)") }
                return try await body(dashboard, request)
            }
        }
        router.get("/admin", use: guarded { dashboard, request in
            if case .refused(let response) = try dashboard.access(request) { return response }
            return Response(status: .seeOther, headers: [.location: "/admin/offers", .cacheControl: "no-store"])
        })
        router.get("/admin/login", use: guarded { dashboard, _ in dashboard.loginForm() })
        router.post("/admin/login", use: guarded { dashboard, request in try await dashboard.login(request) })
        router.post("/admin/logout", use: guarded { dashboard, request in try dashboard.logout(request) })
        for page in AdminPage.allCases {
            router.get(RouterPath(page.path), use: guarded { dashboard, request in
                if case .refused(let response) = try dashboard.access(request) { return response }
                return try await dashboard.page(page, request)
            })
        }
    }
}
