import AppStoreServerAPI
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerStorage
import ServiceLifecycle

/// The routes the service answers, for 405 detection and the OpenAPI conformance test.
public enum OfferSignerRoutes {
    public static let all: [(method: HTTPRequest.Method, path: String)] = [
        (.post, "/v1/offers/signatures"),
        (.post, "/v1/offers/eligibility"),
        (.get, "/healthz"),
        (.get, "/readyz"),
        (.get, "/metrics"),
        (.get, "/openapi.yaml"),
    ]
}

/// Builds the signing service: routes, middleware and its background services (registry
/// poller, audit group committer). `offer-signer serve` runs it; tests run it on loopback.
public func buildApplication(configuration: ServerConfiguration, store: any OfferSignerStore) async throws -> some ApplicationProtocol {
    let logger = configuration.logger
    // Configuration first: a server that will not start must not have touched the store.
    for (name, limit) in [("client", configuration.clientRateLimit), ("appAccountToken", configuration.appAccountTokenRateLimit)] {
        if let problem = limit.problem { throw ServerConfigurationError("the \(name) rate limit cannot be used: \(problem)") }
    }
    let userJWT: UserJWTVerifier? = if let jwt = configuration.userJWT { try await UserJWTVerifier(configuration: jwt) } else { nil }
    if let eligibility = configuration.eligibility, let problem = eligibility.appStoreServerAPI.problem {
        throw ServerConfigurationError("the App Store Server API settings cannot be used: \(problem)")
    }
    try await store.bindMasterKey(configuration.masterKey)
    let metrics = ServerMetrics()
    let keyRing = KeyRingHolder(store: store, masterKey: configuration.masterKey, interval: configuration.registryPollInterval, logger: logger)
    try await keyRing.reload()
    let committer = AuditCommitter(
        store: store, batchLimit: configuration.auditBatchLimit, commitDelay: configuration.auditCommitDelay, metrics: metrics, logger: logger)
    let authenticator = RequestAuthenticator(developmentMode: configuration.developmentMode, userJWT: userJWT, limiter: RateLimiter(limit: configuration.clientRateLimit))
    // Made after the last step that can fail: an unused client must still be shut down.
    let appleHistory = try AppleHistoryClientService.make(configuration.eligibility, metrics: metrics, logger: logger)
    let eligibility = configuration.eligibility.map { EligibilityService(configuration: $0, store: store, appleHistory: appleHistory?.client) }
    let signing = SigningController(
        keyRing: keyRing, committer: committer, authenticator: authenticator,
        tokenLimiter: RateLimiter(limit: configuration.appAccountTokenRateLimit), metrics: metrics,
        maximumBodyBytes: configuration.maximumBodyBytes, eligibility: eligibility)
    let eligibilityController = EligibilityController(
        keyRing: keyRing, authenticator: authenticator, eligibility: eligibility, maximumBodyBytes: configuration.maximumBodyBytes,
        tokenLimiter: RateLimiter(limit: configuration.appAccountTokenRateLimit))

    let router = Router()
    router.add(middleware: ProblemMiddleware(metrics: metrics))
    router.post("/v1/offers/signatures") { request, context in
        try await signing.sign(request, context: context)
    }
    router.post("/v1/offers/eligibility") { request, context in
        try await eligibilityController.decide(request, context: context)
    }
    router.get("/healthz") { _, _ in
        Response.json(#"{"status":"ok"}"#)
    }
    router.get("/readyz") { _, _ in
        try await readiness(store: store, ring: keyRing.ring)
    }
    router.get("/metrics") { _, _ in
        Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"], body: .init(byteBuffer: ByteBuffer(bytes: metrics.exposition())))
    }
    router.get("/openapi.yaml") { _, _ in
        Response(status: .ok, headers: [.contentType: "application/yaml"], body: .init(byteBuffer: ByteBuffer(string: OpenAPIDocument.yaml)))
    }

    var applicationConfiguration = ApplicationConfiguration(address: .hostname(configuration.host, port: configuration.port), serverName: "offer-signer")
    applicationConfiguration.serverName = "offer-signer"
    var services: [any Service] = [
        AuditCheckpointer(store: store, masterKey: configuration.masterKey, everyRecords: configuration.checkpointEveryRecords, every: configuration.checkpointEvery, logger: logger),
        keyRing, committer, StoreMaintenance(store: store, interval: .seconds(1), logger: logger),
    ]
    if let appleHistory { services.append(appleHistory) }
    return Application(
        router: router, configuration: applicationConfiguration, services: services,
        onServerRunning: { channel in
            logger.notice("offer-signer listening", metadata: ["address": "\(channel.localAddress?.description ?? "?")", "dev": "\(configuration.developmentMode)"])
        },
        logger: logger)
}

private func readiness(store: any OfferSignerStore, ring: KeyRing) async throws -> Response {
    var problems: [String] = []
    do {
        try await store.ping()
    } catch {
        problems.append("store unreachable: \(error)")
    }
    if ring.configuredBundles.isEmpty { problems.append("no signing key configured") }
    for bundle in ring.configuredBundles.sorted() where ring.activeKeys[bundle] == nil {
        problems.append("\(bundle) has no usable active key")
    }
    guard problems.isEmpty else {
        throw APIProblem(.serviceUnavailable, code: "not_ready", detail: problems.joined(separator: "; "))
    }
    var writer = JSONObjectWriter()
    writer.field("status", "ready")
    writer.field("registryVersion", ring.version)
    writer.field("apps", Int64(ring.configuredBundles.count))
    return Response.json(writer.finish())
}

extension Response {
    static func json(_ text: String, status: HTTPResponse.Status = .ok) -> Response {
        Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}

/// Turns every error into a problem document, adds the request ID, logs and measures.
///
/// Rule: clients only ever see problem documents; an unexpected error becomes a 500
/// `internal_error` whose detail names no internals, while the log keeps the error.
struct ProblemMiddleware<Context: RequestContext>: RouterMiddleware {
    let metrics: ServerMetrics

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = ContinuousClock.now
        var response: Response
        var problemCode: String?
        do {
            response = try await next(request, context)
        } catch let problem as APIProblem {
            problemCode = problem.code
            response = problem.response(requestID: context.id)
        } catch let error as HTTPError {
            let problem = Self.problem(for: error, request: request)
            problemCode = problem.code
            response = problem.response(requestID: context.id)
        } catch let error as any HTTPResponseError where error.status == .contentTooLarge {
            let problem = APIProblem(.contentTooLarge, code: "body_too_large", detail: "the body is too large")
            problemCode = problem.code
            response = problem.response(requestID: context.id)
        } catch {
            context.logger.error("unexpected error", metadata: ["error": "\(error)"])
            let problem = APIProblem(.internalServerError, code: "internal_error", detail: "an unexpected error occurred; see the server log for request \(context.id)")
            problemCode = problem.code
            response = problem.response(requestID: context.id)
        }
        response.headers[.init("X-Request-ID")!] = context.id
        let route = context.endpointPath ?? "unmatched"
        metrics.request(route: route == "NotFound" ? "unmatched" : route, method: request.method.rawValue, status: response.status.code, duration: ContinuousClock.now - start)
        if let problemCode {
            metrics.rejection(problemCode)
            let level: Logger.Level = response.status.code >= 500 ? .error : .notice
            context.logger.log(level: level, "request refused", metadata: ["code": "\(problemCode)", "status": "\(response.status.code)", "path": "\(request.uri.path)"])
        }
        return response
    }

    static func problem(for error: HTTPError, request: Request) -> APIProblem {
        switch error.status {
        case .notFound:
            let path = request.uri.path
            let allowed = OfferSignerRoutes.all.filter { $0.path == path }.map(\.method.rawValue)
            if !allowed.isEmpty {
                return APIProblem(
                    .methodNotAllowed, code: "method_not_allowed", detail: "\(request.method.rawValue) is not allowed on \(path); use \(allowed.joined(separator: ", "))",
                    headers: [.allow: allowed.joined(separator: ", ")])
            }
            return APIProblem(.notFound, code: "not_found", detail: "no route \(request.method.rawValue) \(path)")
        case .contentTooLarge:
            return APIProblem(.contentTooLarge, code: "body_too_large", detail: "the body is too large")
        default:
            return APIProblem(error.status, code: error.status.reasonPhrase.lowercased().replacingOccurrences(of: " ", with: "_"), detail: error.body ?? error.status.reasonPhrase)
        }
    }
}
