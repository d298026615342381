import AppleTestChain
import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// A stand-in for Apple's App Store Server API, for tests: a real HTTP server on 127.0.0.1 that
/// answers Get Transaction History v2 and Get All Subscription Statuses with items signed by a
/// `TestAppleChain`, under `/production` and `/sandbox` path prefixes (give the client
/// `http://127.0.0.1:PORT/production` and `.../sandbox` as its base URLs).
///
/// Rules it enforces like Apple: every request carries `Authorization: Bearer <JWT>` whose header is
/// `alg` ES256, `kid` the expected key ID, `typ` JWT, whose claims are `iss` the expected issuer ID,
/// `aud` `appstoreconnect-v1`, `bid` the expected bundle ID, `iat` not in the future, `exp` after
/// now and at most 60 minutes after `iat`, and whose ES256 signature verifies with the expected
/// public key; anything else is answered 401. A transaction ID unknown in an environment is
/// answered 404 `{"errorCode":4040010,...}`. History is paged `pageSize` transactions at a time
/// through `revision`/`hasMore`. Faults (statuses, `Retry-After`, slow answers) are scripted per
/// endpoint. Every request is recorded (path, environment, revision and the decoded JWT).
public final class FakeAppStoreServerAPI: Sendable {
    public enum Endpoint: String, Sendable, Hashable {
        case history
        case subscriptions
        case notificationHistory
        case requestTestNotification
        case testNotificationStatus
        case setAppAccountToken
    }

    /// One scripted misbehaviour, used for one request of its endpoint.
    public enum Fault: Sendable, Hashable {
        /// Answer this status, with Apple's error body when `errorCode` is set, and a `Retry-After`
        /// that far ahead, in Apple's form: the UNIX time, in milliseconds, of the next allowed request.
        case status(Int, errorCode: Int? = nil, retryAfterSeconds: Int? = nil)
        /// Answer normally, but only after this long.
        case delay(Duration)
    }

    /// One customer's history in one environment.
    public struct Customer: Sendable {
        public var environment: String
        /// Every transaction ID that names this customer (history answers to any of them).
        public var transactionIDs: Set<String>
        /// Signed transactions, oldest first.
        public var signedTransactions: [String]
        /// Last transactions of the subscription groups: `(groupID, originalTransactionID, status, signedTransaction, signedRenewalInfo)`.
        public var statuses: [Status]

        public struct Status: Sendable {
            public var subscriptionGroupIdentifier: String
            public var originalTransactionID: String
            public var status: Int
            public var signedTransactionInfo: String
            public var signedRenewalInfo: String
            public init(subscriptionGroupIdentifier: String, originalTransactionID: String, status: Int, signedTransactionInfo: String, signedRenewalInfo: String) {
                self.subscriptionGroupIdentifier = subscriptionGroupIdentifier
                self.originalTransactionID = originalTransactionID
                self.status = status
                self.signedTransactionInfo = signedTransactionInfo
                self.signedRenewalInfo = signedRenewalInfo
            }
        }

        public init(environment: String, transactionIDs: Set<String>, signedTransactions: [String], statuses: [Status]) {
            self.environment = environment
            self.transactionIDs = transactionIDs
            self.signedTransactions = signedTransactions
            self.statuses = statuses
        }
    }

    /// The decoded bearer token of one request, and what the fake found wrong with it.
    public struct ReceivedToken: Sendable, Hashable {
        public var header: [String: String]
        public var issuer: String?
        public var audience: String?
        public var bundleID: String?
        public var issuedAt: Int64?
        public var expiresAt: Int64?
        public var signatureVerified: Bool
        /// The token's signature part as sent (tells tokens apart: Apple wants one per request).
        public var signature: String?
        /// Empty when the token was accepted.
        public var problems: [String]
    }

    /// One request the fake received.
    public struct ReceivedRequest: Sendable, Hashable {
        public var environment: String
        public var endpoint: Endpoint
        public var transactionID: String
        public var revision: String?
        public var token: ReceivedToken?
        public var answeredStatus: Int
        /// The request body (notification history and Set App Account Token).
        public var body: String? = nil
        /// The query string as sent (e.g. `revision=…&productType=AUTO_RENEWABLE`), nil without one.
        public var query: String? = nil
    }

    struct State {
        var customers: [Customer] = []
        var notifications: [SentNotification] = []
        var notificationURLs: [String: String] = [:]
        var notificationSigner: TestAppleChain?
        var testNotifications: [String: Int] = [:]
        var appAccountTokens: [String: String] = [:]
        var faults: [Endpoint: [Fault]] = [:]
        var persistentFault: [Endpoint: Fault] = [:]
        var answerDelay: Duration = .zero
        var bodyTrickle: Duration = .zero
        var requests: [ReceivedRequest] = []
        var arrivals = 0
        /// Requests arrived whose answer was not yet made (a trickled body may still be
        /// streaming after), and the most there ever were at once.
        var inFlight = 0
        var mostInFlight = 0
    }

    public let bundleID: String
    public let appAppleID: Int64
    public let keyID: String
    public let issuerID: String
    public let publicKey: P256.Signing.PublicKey
    public let pageSize: Int
    let state = Mutex(State())

    public init(bundleID: String, appAppleID: Int64 = 1_234_567_890, keyID: String, issuerID: String, publicKey: P256.Signing.PublicKey, pageSize: Int = 2) {
        self.bundleID = bundleID
        self.appAppleID = appAppleID
        self.keyID = keyID
        self.issuerID = issuerID
        self.publicKey = publicKey
        self.pageSize = pageSize
    }

    // MARK: Scripting

    public func add(_ customer: Customer) { state.withLock { $0.customers.append(customer) } }
    /// The next requests of `endpoint` get these faults, one each, in order.
    public func script(_ endpoint: Endpoint, _ faults: [Fault]) { state.withLock { $0.faults[endpoint, default: []].append(contentsOf: faults) } }
    /// Every request of `endpoint` gets this fault until cleared (`nil`).
    public func always(_ endpoint: Endpoint, _ fault: Fault?) { state.withLock { $0.persistentFault[endpoint] = fault } }
    /// Every answer waits this long first.
    public func setAnswerDelay(_ delay: Duration) { state.withLock { $0.answerDelay = delay } }
    /// Every history and status answer sends its head and half its body at once, then one byte
    /// every `interval` for 1,000 bytes, then the rest (a body that trickles: each read comes
    /// before a read timeout would fire).
    public func setBodyTrickle(_ interval: Duration) { state.withLock { $0.bodyTrickle = interval } }
    /// The requests answered, each recorded once its answer is made (after any delay).
    public var requests: [ReceivedRequest] { state.withLock { $0.requests } }
    /// How many requests have arrived, counted before any scripted fault or delay: a request
    /// waiting for a delayed answer is counted here and not yet in `requests`.
    public var arrivals: Int { state.withLock { $0.arrivals } }
    /// The most requests that had arrived and whose answer was not yet made at one moment
    /// (since the last `clearRequests`): how many callers were waiting for Apple at once.
    public var mostInFlight: Int { state.withLock { $0.mostInFlight } }
    /// Waits until a request has arrived, or `timeout` has passed; returns `arrivals`.
    @discardableResult
    public func waitForArrival(within timeout: Duration) async throws -> Int {
        let giveUp = ContinuousClock.now + timeout
        while arrivals == 0, ContinuousClock.now < giveUp { try await Task.sleep(for: .milliseconds(10)) }
        return arrivals
    }
    /// Forgets the requests answered and the arrivals counted so far; `mostInFlight` starts
    /// again from the requests still waiting for their answer.
    public func clearRequests() {
        state.withLock { state in
            state.requests.removeAll()
            state.arrivals = 0
            state.mostInFlight = state.inFlight
        }
    }

    // MARK: Serving

    /// Runs the fake on 127.0.0.1 (a free port) for the duration of `body`, which gets the port.
    public func run<Value: Sendable>(_ body: @Sendable (Int) async throws -> Value) async throws -> Value {
        let router = Router()
        router.get("/:environment/inApps/v2/history/:transactionID") { request, context in
            await self.answer(.history, request: request, context: context)
        }
        router.get("/:environment/inApps/v1/subscriptions/:transactionID") { request, context in
            await self.answer(.subscriptions, request: request, context: context)
        }
        addNotificationRoutes(to: router)
        var logger = Logger(label: "fake-app-store-server-api")
        logger.logLevel = .critical
        let (ports, continuation) = AsyncStream<Int>.makeStream()
        let application = Application(
            router: router,
            configuration: ApplicationConfiguration(address: .hostname("127.0.0.1", port: 0), serverName: "fake-app-store-server-api"),
            onServerRunning: { channel in continuation.yield(channel.localAddress?.port ?? 0) },
            logger: logger)
        let services = ServiceGroup(configuration: .init(services: [application], gracefulShutdownSignals: [], logger: logger))
        let server = Task { try await services.run() }
        var iterator = ports.makeAsyncIterator()
        guard let port = await iterator.next(), port > 0 else {
            await Self.stop(services, server)
            throw FakeServerError.didNotStart
        }
        do {
            let value = try await body(port)
            await Self.stop(services, server)
            return value
        } catch {
            await Self.stop(services, server)
            throw error
        }
    }

    /// Stops the fake by a graceful shutdown: the listening socket closes and every connection
    /// already accepted is handed to its handler. Cancelling the serving task instead traps in
    /// NIO's debug builds when a connection is accepted but not yet handed over
    /// ("Deinited NIOAsyncWriter without calling finish()", apple/swift-nio#3481), which a client's
    /// pooled connection can make happen at any test's end. Handlers still waiting on a set delay
    /// after 2 s are cancelled.
    private static func stop(_ services: ServiceGroup, _ server: Task<Void, any Error>) async {
        await services.triggerGracefulShutdown()
        let cancelling = Task {
            try await Task.sleep(for: .seconds(2))
            server.cancel()
        }
        _ = await server.result
        cancelling.cancel()
    }

    public enum FakeServerError: Error { case didNotStart }

    private func answer(_ endpoint: Endpoint, request: Request, context: some RequestContext) async -> Response {
        // Get Transaction History's filters, as Apple reads them (each may repeat).
        let items = (request.uri.query ?? "").split(separator: "&").map { $0.split(separator: "=", maxSplits: 1).map(String.init) }
        func values(_ name: String) -> Set<String> { Set(items.filter { $0.count == 2 && $0[0] == name }.map { $0[1].removingPercentEncoding ?? $0[1] }) }
        let (types, groups) = (values("productType"), values("subscriptionGroupIdentifier"))
        return await answer(endpoint, request: request, context: context, requestBody: nil) { environment, transactionID, revision in
            self.content(endpoint, environment: environment, transactionID: transactionID, revision: revision, productTypes: types, groups: groups)
        }
    }

    /// Whether a signed transaction passes Get Transaction History's filters (its payload's
    /// `type`, as Apple's `ProductType` names it, and `subscriptionGroupIdentifier`).
    static func passes(_ jws: String, productTypes: Set<String>, groups: Set<String>) -> Bool {
        // Read once per JWS: measurements of the client (VerifiedItemCacheTests) count this
        // process's CPU, the fake's included.
        let known = filterFields.withLock { $0[jws] }
        let fields: (type: String, group: String)
        if let known {
            fields = known
        } else {
            let parts = jws.split(separator: ".")
            guard parts.count == 3, let data = base64URLDecode(parts[1]),
                let payload = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
            else { return false }
            let typeNames = [
                "Auto-Renewable Subscription": "AUTO_RENEWABLE", "Non-Renewing Subscription": "NON_RENEWABLE", "Consumable": "CONSUMABLE",
                "Non-Consumable": "NON_CONSUMABLE",
            ]
            fields = (typeNames[payload["type"] as? String ?? ""] ?? "", payload["subscriptionGroupIdentifier"] as? String ?? "")
            filterFields.withLock { $0[jws] = fields }
        }
        if !productTypes.isEmpty, !productTypes.contains(fields.type) { return false }
        if !groups.isEmpty, !groups.contains(fields.group) { return false }
        return true
    }

    /// Each signed transaction's product type and subscription group, as `passes` read them.
    private static let filterFields = Mutex<[String: (type: String, group: String)]>([:])

    /// Authenticates, applies the scripted faults, answers with `content` and records the request.
    func answer(
        _ endpoint: Endpoint, request: Request, context: some RequestContext, requestBody: String?,
        content: (_ environment: String, _ transactionID: String, _ revision: String?) async -> Response
    ) async -> Response {
        let environmentSegment = context.parameters.get("environment") ?? ""
        let environment = environmentSegment == "sandbox" ? "Sandbox" : "Production"
        let transactionID = context.parameters.get("transactionID") ?? ""
        let revision = request.uri.queryParameters.get("revision") ?? request.uri.queryParameters.get("paginationToken")
        let token = Self.check(request.headers[.authorization], fake: self)
        let (fault, delay) = state.withLock { state -> (Fault?, Duration) in
            state.arrivals += 1
            state.inFlight += 1
            state.mostInFlight = max(state.mostInFlight, state.inFlight)
            if var queue = state.faults[endpoint], !queue.isEmpty {
                let first = queue.removeFirst()
                state.faults[endpoint] = queue
                return (first, state.answerDelay)
            }
            return (state.persistentFault[endpoint], state.answerDelay)
        }
        var wait = delay
        if case .delay(let extra) = fault { wait += extra }
        if wait > .zero { try? await Task.sleep(for: wait) }

        let response: Response
        if let token, !token.problems.isEmpty {
            response = Response(status: .unauthorized)
        } else if token == nil {
            response = Response(status: .unauthorized)
        } else if case .status(let status, let errorCode, let retryAfter) = fault {
            var headers = HTTPFields()
            if let retryAfter { headers[.retryAfter] = String(Int64((Date().timeIntervalSince1970 + Double(retryAfter)) * 1000)) }
            var body = ""
            if let errorCode {
                headers[.contentType] = "application/json"
                body = #"{"errorCode":\#(errorCode),"errorMessage":"scripted fault"}"#
            }
            response = Response(status: .init(code: status), headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
        } else {
            response = await content(environment, transactionID, revision)
        }
        let record = ReceivedRequest(
            environment: environment, endpoint: endpoint, transactionID: transactionID, revision: revision, token: token,
            answeredStatus: Int(response.status.code), body: requestBody, query: request.uri.query)
        state.withLock { state in
            state.requests.append(record)
            state.inFlight -= 1
        }
        return response
    }

    private func content(
        _ endpoint: Endpoint, environment: String, transactionID: String, revision: String?, productTypes: Set<String>, groups: Set<String>
    ) -> Response {
        let trickle = state.withLock { $0.bodyTrickle }
        guard let customer = state.withLock({ $0.customers.first { $0.environment == environment && $0.transactionIDs.contains(transactionID) } }) else {
            return Self.json(#"{"errorCode":4040010,"errorMessage":"Transaction id not found."}"#, status: .notFound)
        }
        switch endpoint {
        case .history:
            let offset = revision.flatMap { $0.hasPrefix("rev-") ? Int($0.dropFirst(4)) : nil } ?? 0
            let selected = customer.signedTransactions.filter { Self.passes($0, productTypes: productTypes, groups: groups) }
            guard revision == nil || (offset > 0 && offset <= selected.count) else {
                return Self.json(#"{"errorCode":4000005,"errorMessage":"Invalid revision."}"#, status: .badRequest)
            }
            let page = Array(selected.dropFirst(offset).prefix(pageSize))
            let next = offset + page.count
            let hasMore = next < selected.count
            let items = page.map { "\"\($0)\"" }.joined(separator: ",")
            return Self.json(
                trickle: trickle,
                #"{"revision":"rev-\#(next)","hasMore":\#(hasMore),"bundleId":"\#(bundleID)","appAppleId":\#(appAppleID),"environment":"\#(environment)","signedTransactions":[\#(items)]}"#)
        case .subscriptions:
            var groups: [String: [String]] = [:]
            for status in customer.statuses {
                groups[status.subscriptionGroupIdentifier, default: []].append(
                    #"{"originalTransactionId":"\#(status.originalTransactionID)","status":\#(status.status),"signedTransactionInfo":"\#(status.signedTransactionInfo)","signedRenewalInfo":"\#(status.signedRenewalInfo)"}"#)
            }
            let data = groups.keys.sorted().map { #"{"subscriptionGroupIdentifier":"\#($0)","lastTransactions":[\#(groups[$0]!.joined(separator: ","))]}"# }
            return Self.json(trickle: trickle, #"{"environment":"\#(environment)","bundleId":"\#(bundleID)","appAppleId":\#(appAppleID),"data":[\#(data.joined(separator: ","))]}"#)
        case .notificationHistory, .requestTestNotification, .testNotificationStatus, .setAppAccountToken:
            // Answered by the notification routes (FakeAppStoreServerAPI+Notifications.swift).
            return Self.json(#"{"errorCode":4040000,"errorMessage":"not a customer endpoint"}"#, status: .notFound)
        }
    }

    static func json(trickle: Duration = .zero, _ text: String, status: HTTPResponse.Status = .ok) -> Response {
        guard trickle > .zero else {
            return Response(status: status, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: text)))
        }
        let bytes = ByteBuffer(string: text)
        let half = bytes.readableBytes / 2
        return Response(
            status: status, headers: [.contentType: "application/json"],
            body: ResponseBody(contentLength: bytes.readableBytes) { writer in
                try await writer.write(bytes.getSlice(at: bytes.readerIndex, length: half)!)
                // 1,000 bytes one at a time, then the rest: a client without a deadline of its
                // own gets the whole answer after 1,000 intervals.
                let trickled = min(1000, bytes.readableBytes - half)
                for offset in half..<(half + trickled) {
                    try await Task.sleep(for: trickle)
                    try await writer.write(bytes.getSlice(at: bytes.readerIndex + offset, length: 1)!)
                }
                try await writer.write(bytes.getSlice(at: bytes.readerIndex + half + trickled, length: bytes.readableBytes - half - trickled)!)
                try await writer.finish(nil)
            })
    }

    /// Decodes and checks a bearer token as Apple does (see the type's rules).
    static func check(_ authorization: String?, fake: FakeAppStoreServerAPI, now: Date = Date()) -> ReceivedToken? {
        guard let authorization, authorization.hasPrefix("Bearer ") else { return nil }
        let parts = authorization.dropFirst("Bearer ".count).split(separator: ".", omittingEmptySubsequences: false)
        var token = ReceivedToken(header: [:], signatureVerified: false, problems: [])
        guard parts.count == 3, let headerData = base64URLDecode(parts[0]), let claimsData = base64URLDecode(parts[1]),
            let signatureData = base64URLDecode(parts[2]),
            let header = (try? JSONSerialization.jsonObject(with: headerData)) as? [String: Any],
            let claims = (try? JSONSerialization.jsonObject(with: claimsData)) as? [String: Any]
        else {
            token.problems.append("not a compact JWS with JSON header and claims")
            return token
        }
        for (name, value) in header { token.header[name] = value as? String ?? "\(value)" }
        token.issuer = claims["iss"] as? String
        token.audience = claims["aud"] as? String
        token.bundleID = claims["bid"] as? String
        token.issuedAt = (claims["iat"] as? NSNumber)?.int64Value
        token.expiresAt = (claims["exp"] as? NSNumber)?.int64Value
        token.signature = String(parts[2])
        if let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureData) {
            token.signatureVerified = fake.publicKey.isValidSignature(signature, for: Data("\(parts[0]).\(parts[1])".utf8))
        }
        if token.header["alg"] != "ES256" { token.problems.append("alg is not ES256") }
        if token.header["kid"] != fake.keyID { token.problems.append("kid is not the key ID") }
        if token.header["typ"] != "JWT" { token.problems.append("typ is not JWT") }
        if token.issuer != fake.issuerID { token.problems.append("iss is not the issuer ID") }
        if token.audience != "appstoreconnect-v1" { token.problems.append("aud is not appstoreconnect-v1") }
        if token.bundleID != fake.bundleID { token.problems.append("bid is not the bundle ID") }
        let nowSeconds = Int64(now.timeIntervalSince1970)
        if let iat = token.issuedAt, let exp = token.expiresAt {
            if iat > nowSeconds + 5 { token.problems.append("iat is in the future") }
            if exp <= nowSeconds { token.problems.append("token expired") }
            if exp - iat > 3600 { token.problems.append("exp is more than 60 minutes after iat") }
        } else {
            token.problems.append("iat or exp missing")
        }
        if !token.signatureVerified { token.problems.append("signature does not verify with the key") }
        return token
    }

    static func base64URLDecode(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }
}
