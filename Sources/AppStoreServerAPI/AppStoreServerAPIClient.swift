import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import Synchronization
import X509

/// A client of Apple's App Store Server API for one purpose: a customer's verified history
/// (Get Transaction History v2, every page, and Get All Subscription Statuses).
///
/// Rules:
/// - Every signed item of every answer is verified with `AppleSignedDataVerifier` (x5c chain to
///   `trustedRoots`, Apple's marker OIDs, ES256, bundle ID, environment); one that fails makes the
///   whole answer `unverifiable`. A JWS that verified before for the same app, environment and
///   roots (the same text, byte for byte) is taken from `verifiedItems` instead of being verified
///   again (see ``AppleVerifiedItemCache``: only items validated at their own `signedDate`). The answer's `bundleId`, `environment` and (when configured)
///   `appAppleId` must be the app's.
/// - Environments are asked in the app's order (Production first); the next one only when the
///   previous answered 4040010 (TransactionIdNotFoundError).
/// - One lookup never outlasts `timeBudget`: pages, retries, waits and environments share it.
///   5xx, 429 / 4290000 and network errors are retried with exponential backoff (a `Retry-After`
///   is honoured, but a wait that would pass the budget ends the lookup instead), except 500 with
///   error 5000000, GeneralInternalError, which Apple's error table does not call retryable
///   (https://developer.apple.com/documentation/appstoreserverapi/generalinternalerror; Apple's
///   Python library, api_client.py `APIError.GENERAL_INTERNAL` beside `GENERAL_INTERNAL_RETRYABLE`
///   5000001, "you can try again").
/// - At most `concurrentLookups` lookups ask Apple at once; one that cannot start within the first
///   three quarters of its budget is `overloaded`, which (unlike Apple's own slowness or errors)
///   never trips the breaker.
/// - After `circuitBreakerThreshold` consecutive failed lookups of one app in one environment,
///   its lookups fail fast for `circuitBreakerCoolDown`, then one trial goes through.
/// - A `Retry-After` Apple sends is remembered per app and environment: later calls wait for it
///   (within their budget) or fail fast `rateLimited` without asking Apple.
/// - Answers are cached per app and transaction for `cacheTTL`; `invalidate(originalTransactionID:)`
///   drops a customer's cached history (for App Store Server Notifications).
/// - Expected failures are returned as `.unavailable`, never thrown.
public final class AppStoreServerAPIClient: Sendable {
    public let configuration: AppStoreServerAPIConfiguration
    private let trustedRoots: [Certificate]
    private let http: HTTPClient
    private let tokens: AppStoreServerAPITokenMaker
    private let metrics: AppStoreServerAPIMetrics
    private let logger: Logger
    private let breakers = Mutex([String: CircuitBreaker]())
    /// Per app and environment (bundle ID and host): the moment Apple's last `Retry-After` allows
    /// the next request.
    private let rateLimitedUntil = Mutex([String: ContinuousClock.Instant]())
    private let cache: HistoryCache
    private let limiter: AsyncPermits
    private let chainCache: AppleChainValidationCache?
    private let verifiedItems: AppleVerifiedItemCache?
    private let onFetch: (@Sendable (VerifiedHistory) -> Void)?

    /// - Parameters:
    ///   - trustedRoots: the roots Apple's signed items must chain to (Apple Root CA - G3 in production).
    ///   - metrics: where calls, errors and latency are counted (e.g. a Prometheus factory).
    ///   - chainCache: where validated certificate chains are remembered (Apple signs every item of
    ///     an answer with the same chain, so only the first is validated in full).
    ///   - verifiedItems: where verified transactions and renewal infos are remembered, so a history
    ///     asked about again (after `cacheTTL`) verifies only the items it has not seen; nil
    ///     verifies every item of every answer.
    ///   - onFetch: called with every history fetched from Apple (not with cached ones), e.g. to store it.
    public init(
        configuration: AppStoreServerAPIConfiguration, trustedRoots: [Certificate], metrics: AppStoreServerAPIMetrics,
        logger: Logger, chainCache: AppleChainValidationCache? = nil, verifiedItems: AppleVerifiedItemCache? = AppleVerifiedItemCache(),
        onFetch: (@Sendable (VerifiedHistory) -> Void)? = nil
    ) throws(AppStoreServerAPIConfigurationError) {
        if let problem = configuration.problem { throw AppStoreServerAPIConfigurationError(problem) }
        self.configuration = configuration
        self.trustedRoots = trustedRoots
        self.metrics = metrics
        self.logger = logger
        self.chainCache = chainCache
        self.verifiedItems = verifiedItems
        self.onFetch = onFetch
        self.tokens = AppStoreServerAPITokenMaker(lifetime: configuration.tokenLifetime)
        self.cache = HistoryCache(ttl: configuration.cacheTTL, capacity: configuration.maximumCachedHistories)
        self.limiter = AsyncPermits(limit: configuration.concurrentLookups)
        var httpConfiguration = HTTPClient.Configuration()
        httpConfiguration.connectionPool = HTTPClient.Configuration.ConnectionPool(
            idleTimeout: .nanoseconds(configuration.connectionIdleTimeout.wholeNanoseconds),
            concurrentHTTP1ConnectionsPerHostSoftLimit: configuration.maximumConnectionsPerHost)
        httpConfiguration.redirectConfiguration = .disallow
        // No tracing: the service bootstraps no tracer, and a span's set-up parses the URL with
        // Foundation on every call (about 1% of a lookup's CPU).
        httpConfiguration.tracing.tracer = nil
        // No read timeout: every call is bounded as a whole by its deadline (`send`), which a read
        // timeout of the budget could only repeat, at the cost of re-arming a timer on every read.
        httpConfiguration.timeout = HTTPClient.Configuration.Timeout(connect: .nanoseconds(configuration.timeBudget.wholeNanoseconds), read: nil)
        self.http = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: httpConfiguration, backgroundActivityLogger: logger)
    }

    /// Closes the connection pool. Call once, when the service stops.
    public func shutdown() async throws {
        try await http.shutdown()
    }

    /// Drops every cached history that covers `originalTransactionID` (any app).
    public func invalidate(originalTransactionID: String) {
        cache.invalidate(originalTransactionID: originalTransactionID)
    }

    /// The customer's history as Apple states it, for the customer who owns `transactionID` (any of
    /// their transactions, e.g. `Transaction.originalID`).
    ///
    /// - Parameters:
    ///   - budget: the time budget of this lookup (`configuration.timeBudget` when nil; a
    ///     background job, not a request an app waits for, may give Apple longer).
    ///   - reportsFetch: whether `onFetch` is called with a fetched history (false when the caller
    ///     stores the answer itself).
    ///   - filter: only these product types and subscription groups (see ``HistoryFilter``); the
    ///     answer is then `isFiltered`.
    public func history(
        transactionID: String, app: AppStoreAppSettings, credentials: AppStoreServerAPICredentials?, now: Date = Date(), budget: Duration? = nil,
        reportsFetch: Bool = true, filter: HistoryFilter? = nil
    ) async -> HistoryLookup {
        let start = ContinuousClock.now
        let result = await lookup(
            transactionID: transactionID, app: app, credentials: credentials, now: now, deadline: start + (budget ?? configuration.timeBudget),
            reportsFetch: reportsFetch, filter: filter.flatMap { $0.isEmpty ? nil : $0 })
        let outcome: String
        switch result {
        case .history: outcome = "history"
        case .unavailable(let unavailable):
            outcome = unavailable.reason.rawValue
            metrics.unavailable(reason: unavailable.reason.rawValue)
            logger.notice(
                "App Store Server API history unavailable",
                metadata: ["bundle_id": "\(app.bundleID)", "reason": "\(unavailable.reason.rawValue)", "detail": "\(unavailable.detail)"])
        }
        metrics.lookup(outcome: outcome, duration: ContinuousClock.now - start)
        return result
    }

    private func lookup(
        transactionID: String, app: AppStoreAppSettings, credentials: AppStoreServerAPICredentials?, now: Date,
        deadline: ContinuousClock.Instant, reportsFetch: Bool, filter: HistoryFilter?
    ) async -> HistoryLookup {
        if let cached = cache.history(bundleID: app.bundleID, transactionID: transactionID, filter: filter) {
            metrics.cache(hit: true)
            return .history(cached)
        }
        metrics.cache(hit: false)
        // Before asking: a notification that arrives meanwhile keeps this answer out of the cache.
        let cacheGeneration = cache.generation
        guard let credentials, credentials.bundleID == app.bundleID, !credentials.issuerID.isEmpty else {
            return .unavailable(.init(.noCredentials, "\(app.bundleID) has no active In-App Purchase key with an issuer ID"))
        }
        guard Self.isPathSafe(transactionID) else {
            // Never sent: Apple would answer 4000006 InvalidTransactionIdError for it.
            return .unavailable(.init(
                .rejected, "the transaction ID is not a string of letters, digits, '-', '_' or '.'", appleErrorCode: AppleErrorCode.invalidTransactionID))
        }
        // A lookup starting with less than a quarter of its budget left would only time out
        // against Apple (and be held against its host): it gives up as overloaded instead.
        guard await limiter.acquire(until: deadline - configuration.timeBudget / 4) else {
            return .unavailable(.init(.overloaded, "\(configuration.concurrentLookups) lookups were asking Apple; none made room within the time budget"))
        }
        defer { limiter.release() }
        var notFound: [String] = []
        for environment in app.environments {
            let baseURL = configuration.baseURL(for: environment, app: app)
            let breaker = breaker(for: app.bundleID + "\n" + baseURL)
            guard breaker.acquire() == .allowed else {
                return .unavailable(.init(.circuitOpen, "recent lookups at \(environment.rawValue) failed; failing fast until the cool-down ends"))
            }
            // What was left of the budget when this environment was asked: a time-out of a lookup
            // that began late (queued here, or after another environment) is this service's doing.
            let timeGiven = ContinuousClock.now.duration(to: deadline)
            let result = await lookup(
                transactionID: transactionID, environment: environment, baseURL: baseURL, app: app, credentials: credentials, now: now,
                deadline: deadline, filter: filter)
            switch result {
            case .found(let history):
                breaker.record(success: true)
                noteCircuit(breaker, app: app, environment: environment)
                cache.store(history, bundleID: app.bundleID, transactionID: transactionID, filter: filter, lookedUpAt: cacheGeneration)
                if reportsFetch { onFetch?(history) }
                return .history(history)
            case .notFound:
                breaker.record(success: true)
                noteCircuit(breaker, app: app, environment: environment)
                notFound.append(environment.rawValue)
            case .failed(let unavailable):
                if Task.isCancelled {
                    // Our caller gave up (its own deadline): nothing is known about the host.
                    breaker.abandon()
                    return .unavailable(.init(.cancelled, "the caller stopped waiting for Apple's answer"))
                }
                if unavailable.reason == .timeBudgetExhausted && timeGiven < configuration.timeBudget / 2 {
                    // Less than half the budget to answer in: the time-out says little about the host.
                    breaker.abandon()
                } else {
                    breaker.record(success: !Self.countsAgainstHost(unavailable.reason))
                }
                noteCircuit(breaker, app: app, environment: environment)
                return .unavailable(unavailable)
            }
        }
        return .unavailable(.init(.transactionNotFound, "no accepted environment (\(notFound.joined(separator: ", "))) knows the transaction ID"))
    }

    /// Publishes the breaker's state (`app_store_server_api_circuit_open`) after an outcome moved it.
    private func noteCircuit(_ breaker: CircuitBreaker, app: AppStoreAppSettings, environment: AppleEnvironment) {
        metrics.circuit(bundleID: app.bundleID, environment: environment.rawValue, open: breaker.isOpen)
    }

    /// Failures that say the host is unwell (and so trip the breaker).
    private static func countsAgainstHost(_ reason: HistoryUnavailable.Reason) -> Bool {
        switch reason {
        case .timeBudgetExhausted, .rateLimited, .serverError, .networkError: true
        default: false
        }
    }

    /// The breaker of one app in one environment (`key`: bundle ID and host): Apple's rate limits
    /// are per app (https://developer.apple.com/documentation/appstoreserverapi/identifying-rate-limits),
    /// so one app's 429s or failures do not stop another's lookups.
    /// Each app and Apple host this client has called, with whether its circuit breaker is open
    /// (refusing lookups) or trying one: for the operator's dashboard.
    public func breakerStates() -> [(bundleID: String, host: String, open: Bool)] {
        breakers.withLock { breakers in
            breakers.map { key, breaker in
                let parts = key.split(separator: "\n", maxSplits: 1, omittingEmptySubsequences: false)
                return (String(parts.first ?? ""), parts.count > 1 ? String(parts[1]) : "", breaker.isOpen)
            }
        }.sorted { ($0.bundleID, $0.host) < ($1.bundleID, $1.host) }
    }

    private func breaker(for key: String) -> CircuitBreaker {
        breakers.withLock { breakers in
            if let breaker = breakers[key] { return breaker }
            let breaker = CircuitBreaker(threshold: configuration.circuitBreakerThreshold, coolDown: configuration.circuitBreakerCoolDown)
            breakers[key] = breaker
            return breaker
        }
    }

    private enum EnvironmentResult {
        case found(VerifiedHistory)
        case notFound
        case failed(HistoryUnavailable)
    }

    /// Both endpoints in one environment, concurrently; the history's pages one after another.
    private func lookup(
        transactionID: String, environment: AppleEnvironment, baseURL: String, app: AppStoreAppSettings,
        credentials: AppStoreServerAPICredentials, now: Date, deadline: ContinuousClock.Instant, filter: HistoryFilter?
    ) async -> EnvironmentResult {
        let verifier = AppleSignedDataVerifier(
            trustedRoots: trustedRoots, bundleID: app.bundleID, environment: environment, appAppleID: app.appAppleID, chainCache: chainCache,
            verifiedItems: verifiedItems)
        async let statuses = subscriptionStatuses(
            transactionID: transactionID, environment: environment, baseURL: baseURL, app: app, credentials: credentials,
            verifier: verifier, now: now, deadline: deadline)
        var history = VerifiedHistory(bundleID: app.bundleID, environment: environment, asOf: now)
        history.isFiltered = filter != nil
        history.wholeSubscriptionGroups = filter?.wholeSubscriptionGroups ?? []
        // The filter goes with every page (Apple: the same query parameters as the first request).
        let filterQuery = (filter?.queryItems ?? []).map { $0.0 + "=" + Self.queryEscaped($0.1) }
        var revision: String?
        var page = 0
        repeat {
            page += 1
            guard page <= configuration.maximumPages else {
                return .failed(.init(.malformedResponse, "the transaction history has more than \(configuration.maximumPages) pages"))
            }
            var path = "/inApps/v2/history/\(transactionID)"
            let query = (revision.map { ["revision=" + Self.queryEscaped($0)] } ?? []) + filterQuery
            if !query.isEmpty { path += "?" + query.joined(separator: "&") }
            let body: HistoryResponseBody
            switch await call(HistoryResponseBody.self, endpoint: .transactionHistory, baseURL: baseURL, path: path, credentials: credentials, deadline: deadline) {
            case .success(let decoded): body = decoded
            case .failure(.notFound):
                return .notFound
            case .failure(.unavailable(let unavailable)):
                return .failed(unavailable)
            }
            if let problem = checkEnvelope(bundleID: body.bundleId, appAppleID: body.appAppleId, environment: body.environment, expected: environment, app: app) {
                return .failed(problem)
            }
            for jws in body.signedTransactions ?? [] {
                switch await verifier.verifyTransaction(jws, now: now) {
                case .success(let transaction): history.record(transaction, jws: jws)
                case .failure(let failure):
                    return .failed(.init(.unverifiable, "a transaction of the history did not verify: \(failure.code.rawValue): \(failure.message)"))
                }
            }
            guard body.hasMore == true else { break }
            guard let next = body.revision, !next.isEmpty, next != revision else {
                return .failed(.init(.malformedResponse, "hasMore is true but the revision does not move on"))
            }
            revision = next
        } while true

        switch await statuses {
        case .failure(.notFound): return .notFound
        case .failure(.unavailable(let unavailable)): return .failed(unavailable)
        case .success(let items):
            for (transaction, jws) in items.transactions { history.record(transaction, jws: jws) }
            for (renewalInfo, jws) in items.renewalInfos { history.record(renewalInfo, jws: jws) }
            return .found(history)
        }
    }

    private struct StatusItems: Sendable {
        var transactions: [(VerifiedTransaction, String)] = []
        var renewalInfos: [(VerifiedRenewalInfo, String)] = []
    }

    private func subscriptionStatuses(
        transactionID: String, environment: AppleEnvironment, baseURL: String, app: AppStoreAppSettings,
        credentials: AppStoreServerAPICredentials, verifier: AppleSignedDataVerifier, now: Date, deadline: ContinuousClock.Instant
    ) async -> Result<StatusItems, CallFailure> {
        let body: StatusResponseBody
        switch await call(StatusResponseBody.self, endpoint: .subscriptionStatuses, baseURL: baseURL, path: "/inApps/v1/subscriptions/\(transactionID)", credentials: credentials, deadline: deadline) {
        case .success(let decoded): body = decoded
        case .failure(let failure): return .failure(failure)
        }
        if let problem = checkEnvelope(bundleID: body.bundleId, appAppleID: body.appAppleId, environment: body.environment, expected: environment, app: app) {
            return .failure(.unavailable(problem))
        }
        var items = StatusItems()
        for group in body.data ?? [] {
            for last in group.lastTransactions ?? [] {
                if let jws = last.signedTransactionInfo {
                    switch await verifier.verifyTransaction(jws, now: now) {
                    case .success(let transaction): items.transactions.append((transaction, jws))
                    case .failure(let failure):
                        return .failure(.unavailable(.init(.unverifiable, "a subscription status transaction did not verify: \(failure.code.rawValue): \(failure.message)")))
                    }
                }
                if let jws = last.signedRenewalInfo {
                    switch await verifier.verifyRenewalInfo(jws, now: now) {
                    case .success(let info): items.renewalInfos.append((info, jws))
                    case .failure(let failure):
                        return .failure(.unavailable(.init(.unverifiable, "a renewal info did not verify: \(failure.code.rawValue): \(failure.message)")))
                    }
                }
            }
        }
        return .success(items)
    }

    private func checkEnvelope(
        bundleID: String?, appAppleID: Int64?, environment: String?, expected: AppleEnvironment, app: AppStoreAppSettings
    ) -> HistoryUnavailable? {
        if let bundleID, bundleID != app.bundleID {
            return .init(.wrongApp, "the answer is for bundle '\(bundleID)', not '\(app.bundleID)'")
        }
        if let expectedID = app.appAppleID, let appAppleID, appAppleID != expectedID {
            return .init(.wrongApp, "the answer is for App Apple ID \(appAppleID), not \(expectedID)")
        }
        if let environment, environment != expected.rawValue {
            return .init(.wrongApp, "the answer is from environment '\(environment)', not '\(expected.rawValue)'")
        }
        return nil
    }

    // MARK: - HTTP

    enum Endpoint: String {
        case transactionHistory = "transaction_history"
        case subscriptionStatuses = "subscription_statuses"
        case notificationHistory = "notification_history"
        case requestTestNotification = "request_test_notification"
        case testNotificationStatus = "test_notification_status"
        case setAppAccountToken = "set_app_account_token"
    }

    enum CallFailure: Error {
        /// 404 with error 4040010.
        case notFound
        case unavailable(HistoryUnavailable)
    }

    /// One GET with retries, decoded; within `deadline`.
    func call<Body: Decodable>(
        _ type: Body.Type, endpoint: Endpoint, baseURL: String, path: String, credentials: AppStoreServerAPICredentials,
        deadline: ContinuousClock.Instant
    ) async -> Result<Body, CallFailure> {
        switch await call(endpoint: endpoint, method: .GET, baseURL: baseURL, path: path, body: nil, credentials: credentials, deadline: deadline) {
        case .failure(let failure): return .failure(failure)
        case .success(let data):
            do {
                return .success(try JSONDecoder().decode(Body.self, from: data))
            } catch {
                return .failure(.unavailable(.init(.malformedResponse, "\(endpoint.rawValue) answered 200 with a body that is not the documented JSON")))
            }
        }
    }

    /// One request with retries (5xx, 429 and network errors; the same request body each time),
    /// its 200 body as sent; within `deadline`.
    func call(
        endpoint: Endpoint, method: HTTPMethod, baseURL: String, path: String, body requestBody: Data?, credentials: AppStoreServerAPICredentials,
        deadline: ContinuousClock.Instant
    ) async -> Result<Data, CallFailure> {
        var attempt = 0
        var lastFailure = HistoryUnavailable(.timeBudgetExhausted, "no time left for \(endpoint.rawValue)")
        /// Giving up: past the deadline that is the budget's doing, whatever the last attempt saw.
        func givingUp() -> HistoryUnavailable {
            guard ContinuousClock.now >= deadline, lastFailure.reason != .timeBudgetExhausted else { return lastFailure }
            return .init(.timeBudgetExhausted, "the \(configuration.timeBudget) budget ran out; last: \(lastFailure.detail)")
        }
        // Apple's rate limits are per app: a Retry-After holds every later call of the app in this
        // environment, not only the retries of the call that got it.
        let limitKey = credentials.bundleID + "\n" + baseURL
        while attempt < configuration.maximumAttempts {
            attempt += 1
            guard ContinuousClock.now < deadline else { break }
            if let until = rateLimitedUntil.withLock({ $0[limitKey] }), until > ContinuousClock.now {
                guard until < deadline else {
                    metrics.call(endpoint: endpoint.rawValue, outcome: "rate_limited", duration: .zero)
                    return .failure(.unavailable(.init(.rateLimited, "\(endpoint.rawValue) not asked: Apple's last Retry-After for this app holds past the time budget")))
                }
                try? await Task.sleep(until: until, clock: .continuous)
            }
            var request = HTTPClientRequest(url: baseURL + path)
            request.method = method
            request.headers.add(name: "Authorization", value: "Bearer " + tokens.token(for: credentials))
            request.headers.add(name: "Accept", value: "application/json")
            if let requestBody {
                request.headers.add(name: "Content-Type", value: "application/json")
                request.body = .bytes(ByteBuffer(bytes: requestBody))
            }
            let start = ContinuousClock.now
            let exchange = await send(request, deadline: deadline)
            let elapsed = ContinuousClock.now - start
            var retryAfter: Duration?
            switch exchange {
            case .timedOut:
                metrics.call(endpoint: endpoint.rawValue, outcome: "timeout", duration: elapsed)
                return .failure(.unavailable(.init(.timeBudgetExhausted, "\(endpoint.rawValue) did not answer within the \(configuration.timeBudget) budget")))
            case .networkError(let description):
                metrics.call(endpoint: endpoint.rawValue, outcome: "network_error", duration: elapsed)
                lastFailure = .init(.networkError, "\(endpoint.rawValue): \(description)")
            case .response(let status, let headers, let body):
                // Apple's error body, on errors only: a 200's body is the whole history page.
                let error = status == 200 ? nil : try? JSONDecoder().decode(ErrorResponseBody.self, from: body)
                switch status {
                case 200:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "ok", duration: elapsed)
                    return .success(body)
                case 404 where error?.errorCode == AppleErrorCode.transactionIDNotFound:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "not_found", duration: elapsed)
                    return .failure(.notFound)
                case 429:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "rate_limited", duration: elapsed)
                    lastFailure = .init(.rateLimited, "\(endpoint.rawValue) answered 429 (error \(error?.errorCode.map(String.init) ?? "none"))")
                    retryAfter = headers.first(name: "Retry-After").flatMap { Self.retryAfter($0, now: Date()) }
                    if let retryAfter {
                        let until = ContinuousClock.now + retryAfter
                        rateLimitedUntil.withLock { $0[limitKey] = max($0[limitKey] ?? until, until) }
                    }
                case 404 where error.flatMap(\.errorCode).map(AppleErrorCode.retryableNotFound.contains) == true:
                    // Apple's "...NotFoundRetryable" errors: its side is not ready yet; tried again like a 5xx.
                    metrics.call(endpoint: endpoint.rawValue, outcome: "retry_later", duration: elapsed)
                    lastFailure = .init(.retryLater, "\(endpoint.rawValue) answered 404 error \(error?.errorCode.map(String.init) ?? "none") (Apple says to retry)")
                case 401:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "unauthorized", duration: elapsed)
                    return .failure(.unavailable(.init(.unauthorized, "\(endpoint.rawValue) refused the token (401); check the key and its issuer ID")))
                case 500 where error?.errorCode == AppleErrorCode.generalInternal:
                    // GeneralInternalError: Apple does not say to try again (unlike 5000001).
                    metrics.call(endpoint: endpoint.rawValue, outcome: "server_error", duration: elapsed)
                    return .failure(.unavailable(.init(.serverError, "\(endpoint.rawValue) answered 500 error 5000000 (GeneralInternalError, not retryable)")))
                case 500...599:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "server_error", duration: elapsed)
                    lastFailure = .init(.serverError, "\(endpoint.rawValue) answered \(status) (error \(error?.errorCode.map(String.init) ?? "none"))")
                default:
                    metrics.call(endpoint: endpoint.rawValue, outcome: "rejected", duration: elapsed)
                    let code = error?.errorCode.map { " error \($0)" } ?? ""
                    let message = error?.errorMessage.map { ": \($0.prefix(200))" } ?? ""
                    return .failure(.unavailable(.init(.rejected, "\(endpoint.rawValue) answered \(status)\(code)\(message)", appleErrorCode: error?.errorCode)))
                }
            }
            guard attempt < configuration.maximumAttempts else { break }
            var wait = backoff(attempt: attempt)
            if let retryAfter, retryAfter > wait { wait = retryAfter }
            guard ContinuousClock.now + wait < deadline else {
                if retryAfter != nil { lastFailure.detail += "; Retry-After would pass the time budget" }
                return .failure(.unavailable(givingUp()))
            }
            do {
                try await Task.sleep(for: wait)
            } catch {
                return .failure(.unavailable(.init(.timeBudgetExhausted, "cancelled")))
            }
        }
        return .failure(.unavailable(givingUp()))
    }

    /// The wait a `Retry-After` header asks for. Apple sends a UNIX time in milliseconds (the
    /// moment the next request may be sent); HTTP's own forms, delta-seconds and an HTTP-date, are
    /// read too. Nil when the value is none of these; never negative.
    static func retryAfter(_ value: String, now: Date) -> Duration? {
        let text = value.trimmingCharacters(in: .whitespaces)
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            guard let number = Int64(text) else { return nil }
            // Milliseconds since 1970 from 1973 on; smaller numbers are delta-seconds.
            if number >= 100_000_000_000 {
                let milliseconds = number - Int64((now.timeIntervalSince1970 * 1000).rounded(.down))
                return .milliseconds(max(0, milliseconds))
            }
            return .seconds(number)
        }
        guard let date = httpDate(text) else { return nil }
        return .milliseconds(max(0, Int64((date.timeIntervalSince(now) * 1000).rounded(.up))))
    }

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the HTTP-date form servers send.
    private static func httpDate(_ text: String) -> Date? {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.date(from: text)
    }

    private func backoff(attempt: Int) -> Duration {
        let exponent = min(attempt - 1, 20)
        let base = min(configuration.initialBackoff * (1 << exponent), configuration.maximumBackoff)
        return base + base * Double.random(in: 0..<0.5)
    }

    private enum Exchange: Sendable {
        case response(status: Int, headers: HTTPHeaders, body: Data)
        case networkError(String)
        case timedOut
    }

    /// One request and its whole body, within the deadline.
    ///
    /// Rule: at `deadline` the request's task is cancelled and the answer is `.timedOut`, whether
    /// the head or only the body was still to come (AsyncHTTPClient's own deadline ends with the
    /// head); a caller that is cancelled cancels the request. The deadline is kept by the shared
    /// `DeadlineWheel` (a task group with a sleeping task per call cost a task, a dispatch timer
    /// and its cancellation on every call).
    private func send(_ request: HTTPClientRequest, deadline: ContinuousClock.Instant) async -> Exchange {
        let remaining = deadline - ContinuousClock.now
        guard remaining > .zero else { return .timedOut }
        let http = self.http
        let limit = configuration.maximumResponseBytes
        let headDeadline = NIODeadline.now() + .nanoseconds(remaining.wholeNanoseconds)
        let exchange = Task { () -> Exchange? in
            do {
                let response = try await http.execute(request, deadline: headDeadline)
                let body = try await response.body.collect(upTo: limit)
                return .response(status: Int(response.status.code), headers: response.headers, body: Data(body.readableBytesView))
            } catch is CancellationError {
                return nil
            } catch let error as HTTPClientError where error == .deadlineExceeded || error == .cancelled {
                return .timedOut
            } catch {
                // A request cancelled at the deadline may fail in other ways (a closed channel).
                if Task.isCancelled { return nil }
                return .networkError(Self.describe(error))
            }
        }
        let timer = DeadlineWheel.shared.schedule(after: remaining) { exchange.cancel() }
        defer { DeadlineWheel.shared.cancel(timer) }
        let outcome = await withTaskCancellationHandler {
            await exchange.value
        } onCancel: {
            exchange.cancel()
        }
        return outcome ?? .timedOut
    }

    private static func describe(_ error: any Error) -> String {
        if error is NIOTooManyBytesError { return "the answer is larger than the accepted size" }
        if let error = error as? HTTPClientError { return "HTTP client error \(error)" }
        return "connection failed (\(type(of: error)))"
    }

    /// Transaction IDs are Apple's digits (or test IDs); anything that could change the path is refused.
    public static func isPathSafe(_ transactionID: String) -> Bool {
        !transactionID.isEmpty && transactionID.utf8.count <= 128
            && transactionID.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x2D || byte == 0x5F || byte == 0x2E
            } && transactionID != "." && transactionID != ".."
    }

    static func queryEscaped(_ value: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return value.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
    }
}

/// An unusable `AppStoreServerAPIConfiguration`.
public struct AppStoreServerAPIConfigurationError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "App Store Server API configuration: \(message)" }
}

extension Duration {
    var wholeNanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
