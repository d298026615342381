import AppStoreServerAPI
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdCore
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
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
        (.get, "/problems/{code}"),
        (.post, "/v1/apple/notifications"),
        (.post, "/v1/apple/retention"),
        (.get, "/admin"),
        (.get, "/admin/login"),
        (.post, "/admin/login"),
        (.post, "/admin/logout"),
    ] + AdminPage.allCases.map { (.get, $0.path) }

    /// The methods the routes take on `path` (`{name}` in a route matches one path segment).
    static func methods(allowedOn path: String) -> [String] {
        let segments = path.split(separator: "/", omittingEmptySubsequences: false)
        return all.filter { route in
            let pattern = route.path.split(separator: "/", omittingEmptySubsequences: false)
            return pattern.count == segments.count
                && zip(pattern, segments).allSatisfy { expected, actual in
                    expected.hasPrefix("{") && expected.hasSuffix("}") ? !actual.isEmpty : expected == actual
                }
        }.map(\.method.rawValue)
    }
}

extension ServerConfiguration {
    /// Checks every setting ``buildApplication(configuration:store:)`` would refuse, without
    /// touching a store: the port, rate limits, the idle timeout, the largest body, the end-user
    /// JWT keys, the notification catch-up, the App Store Server API settings, that the checkpoint
    /// file can be written (and read, if it exists) and that the registry file can be read (one that
    /// cannot be written is warned about by `buildApplication`, not refused: a read-only key mount).
    /// `serve` calls it before it opens (or makes) the store, so a refused start leaves no store
    /// behind; throws ``ServerConfigurationError``. What only the store can say (its master key,
    /// its registry, its checkpoints) is checked by `buildApplication`; binding the address, by
    /// running it.
    public func check() async throws {
        _ = try await checkedSettings()
    }

    /// What ``check()`` checks, with what `buildApplication` goes on to use from it: the end-user
    /// JWT verifier and the registry file's version (0 without one).
    func checkedSettings() async throws -> (userJWT: UserJWTVerifier?, highestKnownManifest: Int64) {
        guard (0...65535).contains(port) else { throw ServerConfigurationError("the port must be between 0 and 65535 (it is \(port))") }
        for (name, limit) in [("client", clientRateLimit), ("appAccountToken", appAccountTokenRateLimit)] {
            if let problem = limit.problem { throw ServerConfigurationError("the \(name) rate limit cannot be used: \(problem)") }
        }
        guard idleTimeout > .zero, idleTimeout <= ServerConfiguration.longestIdleTimeout else {
            throw ServerConfigurationError("the idle timeout must be more than zero and at most \(ServerConfiguration.longestIdleTimeout) (it is \(idleTimeout))")
        }
        guard ServerConfiguration.maximumBodyBytesRange.contains(maximumBodyBytes) else {
            let range = ServerConfiguration.maximumBodyBytesRange
            throw ServerConfigurationError("the largest request body must be between \(range.lowerBound) and \(range.upperBound) bytes (it is \(maximumBodyBytes))")
        }
        let userJWT: UserJWTVerifier? = if let userJWT { try await UserJWTVerifier(configuration: userJWT) } else { nil }
        if let interval = notificationRecoveryInterval {
            guard eligibility != nil else {
                throw ServerConfigurationError("the notification catch-up needs the offers catalog (--offers) with the apps' appAppleID and environments")
            }
            guard interval >= .seconds(1) else { throw ServerConfigurationError("the notification recovery interval must be at least 1 second") }
        }
        if let eligibility, let problem = eligibility.appStoreServerAPI.problem {
            throw ServerConfigurationError("the App Store Server API settings cannot be used: \(problem)")
        }
        if let checkpointFile {
            do throws(StoreError) {
                try registryFile?.checkDistinct(from: checkpointFile)
                // Unwritable, the service would keep its last checkpoint in the database only,
                // which a database writer can delete: it refuses to start.
                do {
                    try checkpointFile.checkWritable()
                } catch where error.code == .unavailable {
                    throw StoreError(.unavailable, "\(error.message); the last signed audit checkpoint must be kept outside the database (give --checkpoint-file PATH in a directory this process can write)")
                }
                _ = try checkpointFile.read()
            } catch {
                throw ServerConfigurationError(error.message)
            }
        }
        do {
            return (userJWT, try registryFile?.read() ?? 0)
        } catch {
            throw ServerConfigurationError(String(describing: error))
        }
    }
}

/// Builds the signing service: routes, middleware and its background services (registry
/// poller, audit group committer). `offer-signer serve` runs it; tests run it on loopback.
public func buildApplication(configuration: ServerConfiguration, store: any OfferSignerStore) async throws -> some ApplicationProtocol {
    let logger = configuration.logger
    // Configuration first: a server that will not start must not have touched the store.
    let (userJWT, highestKnownManifest) = try await configuration.checkedSettings()
    if let registryFile = configuration.registryFile {
        // Not refused (a read-only key mount holds it by default), but said: the floor then
        // lives in memory only, and a restart starts from the version the file last held.
        do {
            try registryFile.checkWritable()
        } catch {
            logger.warning(
                "the registry file cannot be written: the highest registry version seen is kept in memory only, so after a restart a registry rolled back in the database to a version at or above the file's is not refused; give --registry-file PATH in a directory this process can write",
                metadata: ["error": "\(error.message)"])
        }
    }
    let configuration = withDevelopmentEnvironments(configuration)
    if let catalog = configuration.eligibility?.catalog {
        // The app's evidence counts only from its accepted environments (Production unless the
        // catalog says otherwise): say so where Sandbox evidence would now be refused unannounced.
        let appEvidenceBundles = Set(catalog.offers.filter { $0.rules != nil && $0.historySource != .apple }.map(\.bundleID))
        for bundleID in appEvidenceBundles.sorted() {
            let app = catalog.appSettings(bundleID: bundleID)
            guard !app.environmentsGiven, !app.environments.contains(.sandbox) else { continue }
            logger.notice(
                "the app's evidence is accepted from Production only (its catalog entry names no environments): Sandbox purchases, from TestFlight, sandbox testers and App Review, are not eligible; add \"environments\": [\"Production\", \"Sandbox\"] to apps.\(bundleID) to accept them",
                metadata: ["bundle_id": "\(bundleID)"])
        }
    }
    try await store.bindMasterKey(configuration.masterKey)
    // Before any request: a SQLite file another process serves is refused here (see
    // `SQLiteStore.prepareForServing`).
    try await store.prepareForServing()
    let metrics = ServerMetrics()
    metrics.rateLimits([("client", configuration.clientRateLimit), ("app_account_token", configuration.appAccountTokenRateLimit)])
    let keyRing = KeyRingHolder(
        store: store, masterKey: configuration.masterKey, interval: configuration.registryPollInterval, logger: logger,
        registryFile: configuration.registryFile, highestKnownManifest: highestKnownManifest,
        onRejectedRows: { metrics.registryRowsRejected($0) }, onManifestRefused: { metrics.registryManifestRefused() })
    do {
        try await keyRing.reload()
    } catch let refusal as RegistryManifestRefused {
        guard refusal.rowsAuthenticated else {
            throw ServerConfigurationError(
                "the store's key and client rows carry no MACs yet (it was made by an earlier offer-signer): check them with `offer-signer keys list` and `offer-signer clients list`, then run `offer-signer store authenticate --store … --master-key-file …` once")
        }
        throw ServerConfigurationError(
            "refusing to serve: \(refusal.problem). A store made before registry manifests gets its first one from `offer-signer store authenticate --store … --master-key-file …`; otherwise restore the store from a backup (see Docs/Security.md, Registry manifest)")
    }
    // Without the marker and without a single row whose MAC verifies: a store made before MACs.
    // With rows that verify, the marker was removed by someone else: rows without a valid MAC are
    // refused anyway, so it serves (and says so).
    if !keyRing.ring.rowsAuthenticated && keyRing.ring.authenticRows > 0 {
        logger.error("the marker that this store's registry rows carry MACs was removed outside offer-signer; rows without a valid MAC are refused")
    }
    guard keyRing.ring.rowsAuthenticated || keyRing.ring.authenticRows > 0 else {
        throw ServerConfigurationError(
            "the store's key and client rows carry no MACs yet (it was made by an earlier offer-signer): check them with `offer-signer keys list` and `offer-signer clients list`, then run `offer-signer store authenticate --store … --master-key-file …` once")
    }
    if let checkpointFile = configuration.checkpointFile {
        try await prepareCheckpointFile(checkpointFile, store: store, masterKey: configuration.masterKey, logger: logger)
    }
    let committer = AuditCommitter(
        store: store, batchLimit: configuration.auditBatchLimit, commitDelay: configuration.auditCommitDelay, metrics: metrics, logger: logger)
    let authenticator = RequestAuthenticator(developmentMode: configuration.developmentMode, userJWT: userJWT, limiter: RateLimiter(limit: configuration.clientRateLimit))
    // Made after the last step that can fail: an unused client must still be shut down.
    let chainCache = AppleChainValidationCache()
    let historyRecorder = AppleHistoryRecorder(store: store, metrics: metrics, logger: logger)
    let appleHistory = try AppleHistoryClientService.make(
        configuration.eligibility, metrics: metrics, logger: logger, chainCache: chainCache, onFetch: { historyRecorder.submit($0) })
    let eligibility = configuration.eligibility.map {
        EligibilityService(configuration: $0, store: store, storeTimeout: configuration.storeTimeout, appleHistory: appleHistory?.client, chainCache: chainCache)
    }
    let apiCredentials = keyRing.appStoreServerAPICredentials
    let redemptionPlacer = appleHistory.map {
        RedemptionPlacer(
            store: store, client: $0.client, catalog: configuration.eligibility?.catalog, servedBundles: { keyRing.ring.configuredBundles },
            credentials: apiCredentials, metrics: metrics, logger: logger, retryInterval: configuration.redemptionPlacementRetryInterval)
    }
    let notificationIntake = AppleNotificationIntake(
        store: store, servedBundles: { keyRing.ring.configuredBundles }, catalog: configuration.eligibility?.catalog,
        trustedRoots: configuration.eligibility?.trustedRoots ?? [.appleRootCAG3], chainCache: chainCache, metrics: metrics, logger: logger,
        storeTimeout: configuration.storeTimeout, onStored: { [client = appleHistory?.client] in client?.invalidate(originalTransactionID: $0) },
        onUnplaced: { redemptionPlacer?.submit($0) })
    let notifications = AppleNotificationController(intake: notificationIntake, maximumBodyBytes: ServerConfiguration.maximumNotificationBytes)
    let notificationCatchUp = try makeNotificationCatchUp(
        configuration: configuration, store: store, credentials: apiCredentials, served: keyRing.ring.configuredBundles, intake: notificationIntake, metrics: metrics)
    let signing = SigningController(
        keyRing: keyRing, committer: committer, authenticator: authenticator,
        tokenLimiter: RateLimiter(limit: configuration.appAccountTokenRateLimit), metrics: metrics,
        maximumBodyBytes: configuration.maximumBodyBytes, eligibility: eligibility, store: store, storeTimeout: configuration.storeTimeout)
    let eligibilityController = EligibilityController(
        keyRing: keyRing, authenticator: authenticator, eligibility: eligibility, maximumBodyBytes: configuration.maximumBodyBytes,
        tokenLimiter: RateLimiter(limit: configuration.appAccountTokenRateLimit))

    let router = Router()
    router.add(middleware: ProblemMiddleware(metrics: metrics, refusalLog: RefusalLogLimiter(linesPerSecond: 20)))
    if configuration.developmentMode { router.add(middleware: DevelopmentHostMiddleware(port: configuration.port)) }
    router.post("/v1/offers/signatures") { request, context in
        try await signing.sign(request, context: context)
    }
    router.post("/v1/offers/eligibility") { request, context in
        try await eligibilityController.decide(request, context: context)
    }
    // Each Apple endpoint has a gate of its own, taken once the body is in (read within
    // appleEndpointBodyDeadline): slow bodies on one endpoint hold connections, not places.
    let notificationGate = ConcurrencyGate(limit: configuration.appleEndpointConcurrency)
    let retentionGate = ConcurrencyGate(limit: configuration.appleEndpointConcurrency)
    router.post("/v1/apple/notifications") { request, _ in
        let body = try await RequestBodyReader.body(
            request, limit: ServerConfiguration.maximumNotificationBytes, deadline: configuration.appleEndpointBodyDeadline)
        return try await notificationGate.run { try await notifications.receive(body: body) }
    }
    let retentionActivity = RetentionActivity()
    let retention = eligibility.map {
        RetentionController(
            store: store, keyRing: keyRing, committer: committer, eligibility: $0, configuration: configuration.retention, metrics: metrics,
            storeTimeout: configuration.storeTimeout, customerLocks: signing.customerLocks, recentRequests: RecentRequestIdentifiers(),
            activity: retentionActivity)
    }
    router.post("/v1/apple/retention") { request, context in
        guard let retention else {
            throw APIProblem(.notFound, code: "eligibility_not_configured", detail: "Retention Messaging needs an offers catalog with apps.<bundle>.retention (serve --offers FILE)")
        }
        let arrived = ContinuousClock.now
        let body = try await RequestBodyReader.body(request, limit: RetentionController.maximumBodyBytes, deadline: configuration.appleEndpointBodyDeadline)
        defer { metrics.retentionAnswered(after: ContinuousClock.now - arrived) }
        return try await retentionGate.run { try await retention.answer(body: body, arrived: arrived, context: context) }
    }
    let checkpointer = AuditCheckpointer(
        store: store, masterKey: configuration.masterKey, everyRecords: configuration.checkpointEveryRecords, every: configuration.checkpointEvery,
        lockTimeout: configuration.storeTimeout, logger: logger, checkpointFile: configuration.checkpointFile,
        onRefusal: { metrics.auditCheckpointRefused() })
    let dashboard = configuration.adminToken.map { token in
        AdminDashboard(
            token: token, store: store, metrics: metrics, retentionActivity: retentionActivity,
            retentionConfigured: configuration.eligibility?.catalog.apps.values.contains { $0.retention != nil } ?? false,
            retentionBudget: configuration.retention.budget, appleClient: appleHistory?.client,
            catalogBundles: Set(configuration.eligibility?.catalog.apps.keys.map { $0 } ?? []),
            keyRing: keyRing, checkpointRefusal: { checkpointer.refusal })
    }
    AdminDashboard.register(on: router, dashboard: dashboard)
    router.get("/healthz") { _, _ in
        Response.json(#"{"status":"ok"}"#)
    }
    let readiness = ReadinessMonitor(
        store: store, keyRing: keyRing, auditHealth: committer.health, checkpointRefusal: { checkpointer.refusal }, timeout: configuration.storeTimeout,
        interval: configuration.readinessInterval, operatorToken: configuration.operatorToken, logger: logger,
        onCheck: { metrics.readiness($0) })
    await readiness.refresh()
    router.get("/readyz") { request, _ in
        try readiness.response(request)
    }
    router.get("/metrics") { request, _ in
        // Its labels name bundles, offers and keys: for operators only (see `OperatorToken`).
        guard let token = configuration.operatorToken else {
            throw APIProblem.unauthorized("GET /metrics needs Authorization: Bearer <operator token> (--operator-token-file)")
        }
        try token.admit(request, what: "GET /metrics")
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4"], body: .init(byteBuffer: ByteBuffer(bytes: metrics.exposition())))
    }
    router.get("/openapi.yaml") { _, _ in
        Response(status: .ok, headers: [.contentType: "application/yaml"], body: .init(byteBuffer: ByteBuffer(string: OpenAPIDocument.yaml)))
    }
    router.get("/problems/{code}") { _, context in
        let code = context.parameters.get("code") ?? ""
        guard let type = ProblemCatalog.type(for: code) else {
            throw APIProblem(.notFound, code: "not_found", detail: "'\(code)' is not a problem code of this service")
        }
        return Response.json(type.json)
    }

    var applicationConfiguration = ApplicationConfiguration(address: .hostname(configuration.host, port: configuration.port), serverName: "offer-signer")
    applicationConfiguration.serverName = "offer-signer"
    let idleTimeout = TimeAmount.nanoseconds(configuration.idleTimeout.nanoseconds)
    let server = HTTPServerBuilder.http1(
        configuration: HTTP1Channel.Configuration(
            additionalChannelHandlers: [RequestDeadlineHandler(timeout: idleTimeout, onTimeout: { metrics.connectionTimedOut() })],
            // Hummingbird's own idle handler is only a backstop behind RequestDeadlineHandler (the
            // rule, and what `offer_signer_connections_timed_out_total` counts): at twice the
            // timeout, so on a loaded event loop the two never race for the same connection.
            idleTimeout: idleTimeout * 2))
    var services: [any Service] = [
        checkpointer,
        keyRing, committer, StoreMaintenance(store: store, interval: .seconds(1), logger: logger), readiness,
    ]
    if let appleHistory { services.append(contentsOf: [appleHistory, historyRecorder] as [any Service]) }
    if let redemptionPlacer { services.append(redemptionPlacer) }
    if let notificationCatchUp { services.append(notificationCatchUp) }
    return Application(
        router: router, server: server, configuration: applicationConfiguration, services: services,
        onServerRunning: { channel in
            logger.notice(
                "offer-signer listening",
                metadata: [
                    "address": "\(channel.localAddress?.description ?? "?")", "dev": "\(configuration.developmentMode)",
                    "apple_endpoint_concurrency": "\(configuration.appleEndpointConcurrency)",
                ])
        },
        logger: logger)
}

/// Moves the checkpoint file (found writable by `checkedSettings()`) forward to the store's
/// newest checkpoint that verifies and extends it (``AuditCheckpointing/advance(_:in:masterKey:)``),
/// so instances with files of their own converge.
private func prepareCheckpointFile(_ file: LastCheckpointFile, store: any OfferSignerStore, masterKey: MasterKey, logger: Logger) async throws {
    do {
        if let moved = try await AuditCheckpointing.advance(file, in: store, masterKey: masterKey) {
            logger.info("checkpoint file moved forward to the store's latest verified checkpoint", metadata: ["sequence": "\(moved.sequence)", "file": "\(file.path)"])
        }
    } catch let error as StoreError where error.code == .conflict {
        throw ServerConfigurationError("the checkpoint file '\(file.path)': \(error.message)")
    } catch {
        logger.error("could not move the checkpoint file forward", metadata: ["error": "\(error)", "file": "\(file.path)"])
    }
}

/// The scheduled notification catch-up (`serve --notification-recovery-interval`), for each
/// catalog app with a key, in each environment it accepts; nil when not asked for.
private func makeNotificationCatchUp(
    configuration: ServerConfiguration, store: any OfferSignerStore, credentials: @escaping @Sendable (String) -> AppStoreServerAPICredentials?,
    served: Set<String>, intake: AppleNotificationIntake, metrics: ServerMetrics
) throws -> NotificationCatchUp? {
    guard let interval = configuration.notificationRecoveryInterval, let eligibility = configuration.eligibility else { return nil }
    let targets = eligibility.catalog.apps.keys.sorted().filter(served.contains).flatMap { bundleID in
        let app = eligibility.catalog.appSettings(bundleID: bundleID)
        return app.environments.filter { $0 == .production || $0 == .sandbox }.map { NotificationCatchUp.Target(app: app, environment: $0) }
    }
    var api = eligibility.appStoreServerAPI
    // A background job, not a request an app waits for: Apple may take its time with a page.
    api.timeBudget = max(api.timeBudget, .seconds(30))
    let client: AppStoreServerAPIClient
    do {
        client = try AppStoreServerAPIClient(configuration: api, trustedRoots: eligibility.trustedRoots, metrics: .none, logger: configuration.logger)
    } catch {
        throw ServerConfigurationError(error.description)
    }
    return NotificationCatchUp(
        store: store, recovery: NotificationRecovery(client: client, intake: intake), client: client, targets: targets,
        credentials: credentials, interval: interval, logger: configuration.logger, metrics: metrics)
}

extension KeyRingHolder {
    /// The credentials of Apple's App Store Server API for an app: its active key, when it has an
    /// issuer ID (read at each call, so a key activated later is used).
    var appStoreServerAPICredentials: @Sendable (String) -> AppStoreServerAPICredentials? {
        { [self] bundleID in
            ring.activeKeys[bundleID].flatMap { active in
                active.issuerID.map { AppStoreServerAPICredentials(key: active.signer.key, issuerID: $0, bundleID: bundleID) }
            }
        }
    }
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
    /// Refused requests (4xx) are logged at most this often; 5xx always.
    let refusalLog: RefusalLogLimiter

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let start = ContinuousClock.now
        var response: Response
        var problemCode: String?
        do {
            response = try await next(request, context)
        } catch let problem as APIProblem {
            problemCode = problem.code
            response = problem.response(requestID: context.id)
        } catch let error as StoreError where error.code == .unavailable || error.code == .timeout {
            // Whatever the request was doing when the store failed, it is refused as a whole.
            context.logger.error("store failure", metadata: ["error": "\(error)"])
            let problem = APIProblem.storeUnavailable(error)
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
            let metadata: Logger.Metadata = ["code": "\(problemCode)", "status": "\(response.status.code)", "path": "\(request.uri.path)"]
            // A genuine fault is logged every time; a refusal a caller can cause at will (a 4xx,
            // or a 503 for an overloaded endpoint or an unready instance) goes through the rate
            // limit, so nobody can flood the log with requests.
            let callerCaused = response.status.code < 500 || problemCode == "overloaded" || problemCode == "not_ready"
            if !callerCaused {
                context.logger.error("request refused", metadata: metadata)
            } else {
                switch refusalLog.admit() {
                case .log(let suppressedBefore):
                    var metadata = metadata
                    if suppressedBefore > 0 { metadata["suppressed_before"] = "\(suppressedBefore)" }
                    if response.status.code >= 500 {
                        context.logger.warning("request refused", metadata: metadata)
                    } else {
                        context.logger.notice("request refused", metadata: metadata)
                    }
                case .suppress:
                    break
                }
            }
        }
        return response
    }

    static func problem(for error: HTTPError, request: Request) -> APIProblem {
        switch error.status {
        case .notFound:
            let path = request.uri.path
            let allowed = OfferSignerRoutes.methods(allowedOn: path)
            if !allowed.isEmpty {
                return APIProblem(
                    .methodNotAllowed, code: "method_not_allowed", detail: "\(request.method.rawValue) is not allowed on \(path); use \(allowed.joined(separator: ", "))",
                    headers: [.allow: allowed.joined(separator: ", ")])
            }
            return APIProblem(.notFound, code: "not_found", detail: "no route \(request.method.rawValue) \(path)")
        case .contentTooLarge:
            return APIProblem(.contentTooLarge, code: "body_too_large", detail: "the body is too large")
        default:
            // Hummingbird's own refusals of a request it cannot read (400s). Anything else from
            // the HTTP layer would be this service's fault.
            if (400..<500).contains(error.status.code) {
                return APIProblem(.badRequest, code: "bad_request", detail: error.body ?? error.status.reasonPhrase)
            }
            return APIProblem(.internalServerError, code: "internal_error", detail: "an unexpected error occurred")
        }
    }
}

/// Under `serve --dev`, catalog apps that name no `environments` accept Sandbox too: a development
/// server receives sandbox traffic (TestFlight, sandbox testers). Xcode's StoreKit testing data
/// stays refused: it is not signed by the App Store (Apple's own verifier skips verification for
/// it, `_decode_signed_object` in `appstoreserverlibrary/signed_data_verifier.py`: "Data is not
/// signed by the App Store, and verification should be skipped"), and Apple's servers never send
/// notifications or Retention Messaging requests for it.
func withDevelopmentEnvironments(_ configuration: ServerConfiguration) -> ServerConfiguration {
    guard configuration.developmentMode, var eligibility = configuration.eligibility else { return configuration }
    for (bundleID, app) in eligibility.catalog.apps where !app.environmentsGiven && !app.environments.contains(.sandbox) {
        eligibility.catalog.apps[bundleID]?.environments.append(.sandbox)
    }
    for bundleID in Set(eligibility.catalog.offers.map(\.bundleID)) where eligibility.catalog.apps[bundleID] == nil {
        eligibility.catalog.apps[bundleID] = AppStoreAppSettings(bundleID: bundleID, environments: [.production, .sandbox])
    }
    var adjusted = configuration
    adjusted.eligibility = eligibility
    return adjusted
}
