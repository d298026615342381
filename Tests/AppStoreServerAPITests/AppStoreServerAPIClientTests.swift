@testable import AppStoreServerAPI
import AppleTestChain
import Crypto
import FakeAppStoreServerAPI
import Foundation
import Logging
import MetricsTestKit
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import Testing
import X509

/// The client against a fake App Store Server API on loopback: paging, the JWT Apple checks,
/// Sandbox fallback, retries, the time budget, the circuit breaker, the cache and verification.
@Suite struct AppStoreServerAPIClientTests {
    static let bundleID = "com.example.app"
    static let issuerID = "57246542-96fe-1a63-e053-0824d011072a"
    static let generousBudget: Duration = .seconds(30)
    let chain: TestAppleChain
    let key: InAppPurchaseKey
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
        key = try InAppPurchaseKey.generateForDevelopment(keyID: "APIKEY0001")
    }

    var credentials: AppStoreServerAPICredentials { AppStoreServerAPICredentials(key: key, issuerID: Self.issuerID, bundleID: Self.bundleID) }

    func fake(pageSize: Int = 2) -> FakeAppStoreServerAPI {
        FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: Self.issuerID, publicKey: key.publicKey, pageSize: pageSize)
    }

    func subscriber(_ id: String = "2000000001", months: Int = 7, environment: String = "Production") -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "com.example.app.monthly", subscriptionGroupID: "21345678", originalTransactionID: id,
            environment: environment, periodStarts: SubscriptionFixture.monthlyStarts(count: months, activeAt: now))
    }

    func app(port: Int, environments: [AppleEnvironment] = [.production]) -> AppStoreAppSettings {
        AppStoreAppSettings(
            bundleID: Self.bundleID, appAppleID: 1_234_567_890, environments: environments,
            productionURL: "http://127.0.0.1:\(port)/production", sandboxURL: "http://127.0.0.1:\(port)/sandbox")
    }

    func client(
        _ configure: (inout AppStoreServerAPIConfiguration) -> Void = { _ in }, metrics: TestMetrics = TestMetrics(), roots: [Certificate]? = nil,
        verifiedItems: AppleVerifiedItemCache? = AppleVerifiedItemCache()
    ) throws -> AppStoreServerAPIClient {
        var configuration = AppStoreServerAPIConfiguration()
        configuration.initialBackoff = .milliseconds(10)
        // Generous unless a test is about the budget: the whole suite runs in parallel on a
        // shared, loaded machine, where 2 s for several pages is not always enough.
        configuration.timeBudget = Self.generousBudget
        configure(&configuration)
        var logger = Logger(label: "app-store-server-api-test")
        logger.logLevel = .critical
        return try AppStoreServerAPIClient(
            configuration: configuration, trustedRoots: roots ?? [chain.root], metrics: AppStoreServerAPIMetrics(factory: metrics), logger: logger,
            verifiedItems: verifiedItems)
    }

    func withClient<T: Sendable>(_ client: AppStoreServerAPIClient, _ body: () async throws -> T) async throws -> T {
        do {
            let value = try await body()
            try await client.shutdown()
            return value
        } catch {
            try? await client.shutdown()
            throw error
        }
    }

    @Test func followsEveryPageAndSendsTheTokenAppleChecks() async throws {
        let fake = fake()
        let customer = subscriber(months: 7)
        fake.add(try customer.customer(chain, now: now))
        let metrics = TestMetrics()
        let client = try client(metrics: metrics)
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.transactionID(3), app: app(port: port), credentials: credentials, now: now)
                guard case .history(let history) = lookup else {
                    Issue.record("expected history, got \(lookup)")
                    return
                }
                #expect(history.transactions.map(\.transactionID) == (0..<7).map(customer.transactionID))
                #expect(history.renewalInfos.count == 1)
                #expect(history.renewalInfos.first?.autoRenewEnabled == true)
                #expect(history.environment == .production)
            }
        }
        let historyRequests = fake.requests.filter { $0.endpoint == .history }
        #expect(historyRequests.map(\.revision) == [nil, "rev-2", "rev-4", "rev-6"], "7 transactions at 2 a page: 4 pages")
        #expect(fake.requests.filter { $0.endpoint == .subscriptions }.count == 1)
        for request in fake.requests {
            let token = try #require(request.token)
            #expect(token.problems.isEmpty, "\(token.problems)")
            #expect(token.signatureVerified, "the fake verified the ES256 signature with the key's public half")
            #expect(token.header == ["alg": "ES256", "kid": key.keyID, "typ": "JWT"])
            #expect(token.issuer == Self.issuerID)
            #expect(token.audience == "appstoreconnect-v1")
            #expect(token.bundleID == Self.bundleID)
            let issuedAt = try #require(token.issuedAt)
            let expiresAt = try #require(token.expiresAt)
            #expect(expiresAt - issuedAt == 300, "5 minutes")
            #expect(abs(Double(issuedAt) - Date().timeIntervalSince1970) < 60)
        }
        #expect(Set(fake.requests.compactMap(\.token?.signature)).count == fake.requests.count, "a new token for every request, as Apple says")
        #expect(try metrics.expectCounter("app_store_server_api_calls_total", [("endpoint", "transaction_history"), ("outcome", "ok")]).totalValue == 4)
        #expect(try metrics.expectCounter("app_store_server_api_lookups_total", [("outcome", "history")]).totalValue == 1)
        #expect(try metrics.expectTimer("app_store_server_api_call_duration_seconds", [("endpoint", "transaction_history"), ("outcome", "ok")]).values.count == 4)
    }

    @Test func asksSandboxWhenProductionDoesNotKnowTheTransaction() async throws {
        let fake = fake()
        let customer = subscriber(months: 3, environment: "Sandbox")
        fake.add(try customer.customer(chain, now: now))
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(
                    transactionID: customer.originalTransactionID, app: app(port: port, environments: [.production, .sandbox]), credentials: credentials,
                    now: now)
                guard case .history(let history) = lookup else {
                    Issue.record("expected history, got \(lookup)")
                    return
                }
                #expect(history.environment == .sandbox)
                #expect(history.transactions.count == 3)

                // An app that accepts Production only never asks Sandbox.
                fake.clearRequests()
                let productionOnly = await client.history(
                    transactionID: customer.transactionID(1), app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = productionOnly else {
                    Issue.record("expected unavailable, got \(productionOnly)")
                    return
                }
                #expect(unavailable.reason == .transactionNotFound)
                #expect(!unavailable.allowsFallback)
                #expect(fake.requests.allSatisfy { $0.environment == "Production" })
            }
        }
        let history = fake.requests.filter { $0.endpoint == .history }
        #expect(history.first?.environment == "Production")
        #expect(history.first?.answeredStatus == 404)
    }

    @Test func honoursRetryAfterWithinTheBudget() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(429, errorCode: 4_290_000, retryAfterSeconds: 1)])
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let start = ContinuousClock.now
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                let elapsed = ContinuousClock.now - start
                guard case .history = lookup else {
                    Issue.record("expected history after the wait, got \(lookup)")
                    return
                }
                #expect(elapsed >= .seconds(1), "Retry-After: 1 was honoured")
            }
        }
        #expect(fake.requests.filter { $0.endpoint == .history }.map(\.answeredStatus) == [429, 200])
    }

    @Test func retryAfterIsReadInApplesFormAndHTTPs() {
        let now = Date(timeIntervalSince1970: 1_764_000_000)
        let nowMillis = Int64(now.timeIntervalSince1970 * 1000)
        // Apple: the UNIX time in milliseconds of the next allowed request.
        #expect(AppStoreServerAPIClient.retryAfter(String(nowMillis + 1_500), now: now) == .milliseconds(1_500))
        #expect(AppStoreServerAPIClient.retryAfter(String(nowMillis - 5_000), now: now) == .zero, "a moment already past: no wait")
        // HTTP: delta-seconds and an HTTP-date.
        #expect(AppStoreServerAPIClient.retryAfter(" 3 ", now: now) == .seconds(3))
        #expect(AppStoreServerAPIClient.retryAfter("Mon, 24 Nov 2025 16:00:10 GMT", now: now) == .seconds(10))
        #expect(AppStoreServerAPIClient.retryAfter("soon", now: now) == nil)
        #expect(AppStoreServerAPIClient.retryAfter("-1", now: now) == nil)
        #expect(AppStoreServerAPIClient.retryAfter("", now: now) == nil)
    }

    @Test func applesRetryableNotFoundErrorsAreTriedAgain() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(404, errorCode: 4_040_002)])
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .history = lookup else {
                    Issue.record("expected history after a retry, got \(lookup)")
                    return
                }
            }
        }
        #expect(fake.requests.filter { $0.endpoint == .history }.map(\.answeredStatus) == [404, 200])
    }

    @Test func aRetryAfterPastTheBudgetEndsTheLookupAtOnce() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(429, errorCode: 4_290_000, retryAfterSeconds: 600)])
        let client = try client { $0.timeBudget = .seconds(120) }
        try await fake.run { port in
            try await withClient(client) {
                let start = ContinuousClock.now
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .rateLimited)
                #expect(unavailable.allowsFallback)
                // Far below the budget: the whole suite shares two cores, where a task can wait seconds to run.
                #expect(ContinuousClock.now - start < .seconds(60), "no waiting for a Retry-After that passes the 120 s budget")
            }
        }
    }

    @Test("500 GeneralInternalError (5000000) is not retried, as Apple's error table says; 5000001 (GeneralInternalRetryableError) is")
    func generalInternalErrorIsNotRetried() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(500, errorCode: 5_000_000)])
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .serverError)
                #expect(unavailable.detail.contains("5000000"))
            }
        }
        #expect(fake.requests.filter { $0.endpoint == .history }.map(\.answeredStatus) == [500], "asked once")
    }

    @Test("A Retry-After is remembered for the app: the next lookup within it fails fast without asking Apple")
    func retryAfterIsRememberedBetweenLookups() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(429, errorCode: 4_290_000, retryAfterSeconds: 600)])
        // A budget a loaded machine cannot exhaust before the 429 arrives (5 s was, once), still
        // far shorter than the 600 s Apple asks to wait.
        let client = try client { $0.timeBudget = .seconds(30) }
        try await fake.run { port in
            try await withClient(client) {
                for _ in 0..<2 {
                    let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                    guard case .unavailable(let unavailable) = lookup else {
                        Issue.record("expected unavailable, got \(lookup)")
                        return
                    }
                    #expect(unavailable.reason == .rateLimited)
                }
            }
        }
        #expect(fake.requests.filter { $0.endpoint == .history }.map(\.answeredStatus) == [429], "the second lookup did not ask")
    }

    @Test func retriesServerErrorsThenGivesUpWithinTheBudget() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.script(.history, [.status(503), .status(500, errorCode: 5_000_001)])
        let metrics = TestMetrics()
        let client = try client(metrics: metrics)
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .history = lookup else {
                    Issue.record("expected history after two retries, got \(lookup)")
                    return
                }
                #expect(fake.requests.filter { $0.endpoint == .history }.map(\.answeredStatus) == [503, 500, 200])

                fake.always(.subscriptions, .status(503))
                client.invalidate(originalTransactionID: customer.originalTransactionID)
                let start = ContinuousClock.now
                let failing = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = failing else {
                    Issue.record("expected unavailable, got \(failing)")
                    return
                }
                #expect(unavailable.reason == .serverError)
                // Under the 30 s budget with room for a loaded machine (the whole suite beside it
                // once made four quick attempts take 11.2 s): waiting out the budget still fails.
                #expect(ContinuousClock.now - start < .seconds(20), "four attempts with short backoffs, not the whole budget")
            }
        }
        #expect(try metrics.expectCounter("app_store_server_api_calls_total", [("endpoint", "subscription_statuses"), ("outcome", "server_error")]).totalValue == 4, "four attempts")
        #expect(try metrics.expectCounter("app_store_server_api_unavailable_total", [("reason", "server_error")]).totalValue == 1)
    }

    @Test func aSlowAnswerEndsAtTheBudget() async throws {
        // Far above the budget: the whole suite shares two cores, where a task can wait seconds to run.
        try await expectLookupEndsAtTheBudget(slowedBy: { $0.setAnswerDelay(.seconds(600)) }, within: .seconds(60), "not the 600 s answer")
    }

    /// AsyncHTTPClient's own deadline ends with the head, and no read timeout fires while bytes
    /// keep coming: a body that trickles in is bounded by the budget all the same.
    @Test func aTricklingBodyEndsAtTheBudget() async throws {
        // Far above the budget (the whole suite shares two cores, where a task can wait seconds
        // to run), far below the trickle's 100 s.
        try await expectLookupEndsAtTheBudget(slowedBy: { $0.setBodyTrickle(.milliseconds(100)) }, within: .seconds(30), "not when the trickle ends")
    }

    /// A lookup with a 400 ms budget against a fake slowed by `slow` ends unavailable
    /// (`timeBudgetExhausted`), after at least 350 ms and within `bound`.
    func expectLookupEndsAtTheBudget(
        slowedBy slow: (FakeAppStoreServerAPI) -> Void, within bound: Duration, _ insteadOf: String
    ) async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        slow(fake)
        let client = try client { $0.timeBudget = .milliseconds(400) }
        try await fake.run { port in
            try await withClient(client) {
                let start = ContinuousClock.now
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                let elapsed = ContinuousClock.now - start
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .timeBudgetExhausted, "\(unavailable)")
                #expect(elapsed >= .milliseconds(350))
                #expect(elapsed < bound, "ended at the 400 ms budget, \(insteadOf) (took \(elapsed))")
            }
        }
    }

    @Test func aTokenFromAnotherKeyIsRefusedWith401() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        let impostor = AppStoreServerAPICredentials(
            key: try InAppPurchaseKey.generateForDevelopment(keyID: key.keyID), issuerID: Self.issuerID, bundleID: Self.bundleID)
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: impostor, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .unauthorized)
            }
        }
        #expect(!fake.requests.isEmpty)
        for request in fake.requests {
            #expect(request.answeredStatus == 401)
            #expect(request.token?.signatureVerified == false)
            #expect(request.token?.problems == ["signature does not verify with the key"])
        }
    }

    @Test func theCircuitOpensAfterConsecutiveFailuresAndLetsOneTrialThrough() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        fake.always(.history, .status(502))
        let metrics = TestMetrics()
        let client = try client(
            {
                $0.maximumAttempts = 1
                $0.circuitBreakerThreshold = 2
                $0.circuitBreakerCoolDown = .seconds(3)
            }, metrics: metrics)
        let circuit: @Sendable () throws -> Double? = { try metrics.expectGauge("app_store_server_api_circuit_open", [("bundle_id", Self.bundleID), ("environment", "Production")]).lastValue }
        try await fake.run { port in
            try await withClient(client) {
                for _ in 0..<2 {
                    let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                    guard case .unavailable(let unavailable) = lookup else {
                        Issue.record("expected unavailable, got \(lookup)")
                        return
                    }
                    #expect(unavailable.reason == .serverError)
                }
                #expect(try circuit() == 1, "the second failure opened the circuit")
                let seen = fake.requests.count
                let open = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = open else {
                    Issue.record("expected unavailable, got \(open)")
                    return
                }
                #expect(unavailable.reason == .circuitOpen)
                #expect(fake.requests.count == seen, "an open circuit sends nothing")

                fake.always(.history, nil)
                try await Task.sleep(for: .milliseconds(3100))
                let trial = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .history = trial else {
                    Issue.record("expected the trial to succeed, got \(trial)")
                    return
                }
                #expect(try circuit() == 0, "the trial's success closed the circuit")
            }
        }
    }

    @Test func cachesPerCustomerUntilInvalidated() async throws {
        let fake = fake()
        let customer = subscriber(months: 3)
        fake.add(try customer.customer(chain, now: now))
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                for id in [customer.transactionID(2), customer.transactionID(2), customer.originalTransactionID] {
                    guard case .history = await client.history(transactionID: id, app: app(port: port), credentials: credentials, now: now) else {
                        Issue.record("expected history")
                        return
                    }
                }
                #expect(fake.requests.filter { $0.endpoint == .history }.count == 2, "asked once (two pages); then served from the cache, also by original ID")
                client.invalidate(originalTransactionID: customer.originalTransactionID)
                guard case .history = await client.history(transactionID: customer.transactionID(2), app: app(port: port), credentials: credentials, now: now) else {
                    Issue.record("expected history")
                    return
                }
                #expect(fake.requests.filter { $0.endpoint == .history }.count == 4, "asked again after invalidate")
            }
        }
    }

    @Test("productType / subscriptionGroupIdentifier filters go with every page; a filtered answer is cached under its filter only and is marked filtered")
    func historyFilters() async throws {
        let fake = fake()
        let customer = subscriber(months: 5)
        var apple = try customer.customer(chain, now: now)
        // Three consumables of the same customer, in no subscription group.
        for index in 0..<3 {
            let id = "300000000\(index)"
            apple.signedTransactions.append(try chain.signJWS([
                "transactionId": id, "originalTransactionId": id, "productId": "com.example.app.coins", "purchaseDate": TestAppleChain.milliseconds(now),
                "type": "Consumable", "environment": "Production", "bundleId": Self.bundleID, "inAppOwnershipType": "PURCHASED",
                "signedDate": TestAppleChain.milliseconds(now),
            ]))
        }
        fake.add(apple)
        let client = try client()
        let group = HistoryFilter.subscriptionGroup("21345678")
        try await fake.run { port in
            try await withClient(client) {
                let id = customer.transactionID(0)
                guard case .history(let filtered) = await client.history(transactionID: id, app: app(port: port), credentials: credentials, now: now, filter: group)
                else {
                    Issue.record("no history")
                    return
                }
                #expect(filtered.isFiltered)
                #expect(filtered.transactions.count == 5, "the group's subscription only")
                // Every transaction of the group's subscriptions matched the filter: that subscription is whole.
                #expect(filtered.wholeSubscriptionGroups == group.wholeSubscriptionGroups && !group.wholeSubscriptionGroups.isEmpty)
                #expect(filtered.wholeSubscriptionIDs == Set(filtered.transactions.map(\.originalTransactionID)))
                let pages = fake.requests.filter { $0.endpoint == .history }
                #expect(pages.count == 3, "5 transactions, 2 a page")
                #expect(pages.allSatisfy { $0.query?.contains("productType=AUTO_RENEWABLE&subscriptionGroupIdentifier=21345678") == true }, "\(pages.map(\.query))")
                #expect(pages.filter { $0.revision != nil }.count == 2)

                // Not the whole history: an unfiltered lookup asks Apple.
                fake.clearRequests()
                guard case .history(let whole) = await client.history(transactionID: id, app: app(port: port), credentials: credentials, now: now) else {
                    Issue.record("no history")
                    return
                }
                #expect(!whole.isFiltered && whole.transactions.count == 8)
                #expect(fake.requests.filter { $0.endpoint == .history }.allSatisfy { $0.query == nil || $0.query?.contains("productType") == false })
                #expect(!fake.requests.isEmpty)

                // The whole history serves the filtered lookup from the cache.
                fake.clearRequests()
                guard case .history = await client.history(transactionID: id, app: app(port: port), credentials: credentials, now: now, filter: group) else {
                    Issue.record("no history")
                    return
                }
                #expect(fake.arrivals == 0)

                // A notification about the subscription drops both.
                client.invalidate(originalTransactionID: customer.originalTransactionID)
                _ = await client.history(transactionID: id, app: app(port: port), credentials: credentials, now: now, filter: group)
                #expect(fake.requests.filter { $0.endpoint == .history }.count == 3)
            }
        }
    }

    @Test func itemsSignedOutsideTheTrustedRootAreUnverifiable() async throws {
        let fake = fake()
        let customer = subscriber(months: 2)
        fake.add(try customer.customer(chain, now: now))
        let otherRoot = try TestAppleChain().root
        let client = try client(roots: [otherRoot])
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .unverifiable)
                #expect(unavailable.detail.contains("untrusted_chain"))
            }
        }
    }

    @Test func anAnswerForAnotherAppIsRefused() async throws {
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, appAppleID: 42, keyID: key.keyID, issuerID: Self.issuerID, publicKey: key.publicKey)
        let customer = subscriber(months: 1)
        fake.add(try customer.customer(chain, now: now))
        let client = try client()
        try await fake.run { port in
            try await withClient(client) {
                let lookup = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable, got \(lookup)")
                    return
                }
                #expect(unavailable.reason == .wrongApp)
            }
        }
    }

    @Test func aTransactionIDThatCouldChangeThePathIsNeverSent() async throws {
        let client = try client()
        try await withClient(client) {
            for id in ["../../v1/other", "1 2", "", "a?b=c", String(repeating: "9", count: 200)] {
                let lookup = await client.history(transactionID: id, app: app(port: 9), credentials: credentials, now: now)
                guard case .unavailable(let unavailable) = lookup else {
                    Issue.record("expected unavailable for \(id)")
                    continue
                }
                #expect(unavailable.reason == .rejected)
            }
        }
    }
}

@Suite struct AppStoreServerAPITokenTests {
    @Test("A new token for every request, as Apple's page and Python library do: each lives 5 minutes from its own iat and verifies with the key")
    func aNewTokenForEveryRequest() throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "APIKEY0002")
        let credentials = AppStoreServerAPICredentials(key: key, issuerID: "issuer", bundleID: "com.example.app")
        let maker = AppStoreServerAPITokenMaker(lifetime: .seconds(300))
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let first = maker.token(for: credentials, now: start)
        let second = maker.token(for: credentials, now: start)
        #expect(first != second, "never reused, even within the same second (ECDSA signatures are randomized)")
        let later = maker.token(for: credentials, now: start.addingTimeInterval(10))
        let claims = try Self.claims(later)
        #expect(claims["iat"] as? Int == 1_800_000_010)
        #expect(claims["exp"] as? Int == 1_800_000_310)
        for token in [first, second, later] {
            let parts = token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            #expect(parts.count == 3)
            let signature = try #require(Self.base64URL(parts[2]))
            let verified = try P256.Signing.ECDSASignature(rawRepresentation: signature)
            #expect(key.privateKey.publicKey.isValidSignature(verified, for: Data((parts[0] + "." + parts[1]).utf8)))
        }
    }

    @Test func aLifetimeOverSixtyMinutesIsRefusedOrClamped() throws {
        var configuration = AppStoreServerAPIConfiguration()
        configuration.tokenLifetime = .seconds(3601)
        #expect(configuration.problem != nil)
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "APIKEY0003")
        let maker = AppStoreServerAPITokenMaker(lifetime: .seconds(7200))
        let claims = try Self.claims(maker.token(for: .init(key: key, issuerID: "issuer", bundleID: "b"), now: Date(timeIntervalSince1970: 1_800_000_000)))
        #expect((claims["exp"] as? Int ?? 0) - (claims["iat"] as? Int ?? 0) == 3600)
    }

    static func base64URL(_ part: String) -> Data? {
        var base64 = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }

    static func claims(_ token: String) throws -> [String: Any] {
        let part = token.split(separator: ".")[1]
        var base64 = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        let data = try #require(Data(base64Encoded: base64))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }
}

/// This service's own overload is not Apple's: lookups beyond the concurrency bound wait, then
/// give up as `overloaded`, which never opens the circuit breaker.
@Suite struct LookupOverloadTests {
    @Test("A lookup that finds no room is overloaded, not held against Apple's host")
    func overloadIsNotAppleSlowness() async throws {
        let base = try AppStoreServerAPIClientTests()
        let fake = base.fake()
        let first = base.subscriber("2000000001", months: 2)
        let second = base.subscriber("2000000002", months: 2)
        let third = base.subscriber("2000000003", months: 2)
        for customer in [first, second, third] { fake.add(try customer.customer(base.chain, now: base.now)) }
        fake.setAnswerDelay(.seconds(600))
        let client = try base.client {
            $0.maximumConcurrentLookups = 1
            // Long, so that the second lookup's give-up (at 1 + 30 s) and the first's (at 40 s)
            // stay in that order even when a loaded machine runs both late.
            $0.timeBudget = .seconds(40)
            $0.circuitBreakerThreshold = 2
        }
        try await fake.run { port in
            try await base.withClient(client) {
                let app = base.app(port: port)
                let credentials = base.credentials
                let now = base.now
                // The first lookup takes the only place and waits on Apple for its whole budget…
                let slow = Task { await client.history(transactionID: first.originalTransactionID, app: app, credentials: credentials, now: now) }
                // (Once the first one has reached the fake, it holds the place; the second gives up
                // 30 s after it starts, 9 s before the first lets go.)
                // (Its two calls, statuses and history, arrive concurrently: either one will do.)
                try #require(try await fake.waitForArrival(within: .seconds(20)) > 0, "the first lookup never reached Apple")
                // …so the second finds no room within three quarters of its own.
                let waiting = await client.history(transactionID: second.originalTransactionID, app: app, credentials: credentials, now: now)
                guard case .unavailable(let overloaded) = waiting, case .unavailable(let timedOut) = await slow.value else {
                    Issue.record("expected two unavailable lookups")
                    return
                }
                #expect(overloaded.reason == .overloaded, "\(overloaded)")
                #expect(overloaded.allowsFallback)
                #expect(timedOut.reason == .timeBudgetExhausted, "\(timedOut)")
                // One failure against the host (threshold 2): the breaker is still closed.
                fake.setAnswerDelay(.zero)
                let after = await client.history(transactionID: third.originalTransactionID, app: app, credentials: credentials, now: now)
                guard case .history = after else {
                    Issue.record("expected a history once Apple answers, got \(after) (was the overload held against the host?)")
                    return
                }
            }
        }
    }
}

@Suite struct AsyncPermitsTests {
    @Test("Permits: first come, first served; a waiter past its deadline or cancelled leaves without one")
    func permits() async throws {
        let limiter = AsyncPermits(limit: 1)
        #expect(await limiter.acquire(until: .now + .seconds(1)))
        // Deadline passes: no permit.
        let start = ContinuousClock.now
        #expect(await limiter.acquire(until: .now + .milliseconds(100)) == false)
        #expect(ContinuousClock.now - start >= .milliseconds(90))
        #expect(limiter.waiting == 0)
        // A waiter gets the permit when it is released.
        let waiter = Task { await limiter.acquire(until: .now + .seconds(60)) }
        while limiter.waiting == 0 { try await Task.sleep(for: .milliseconds(1)) }
        limiter.release()
        #expect(await waiter.value)
        // Cancelled while waiting: leaves without a permit.
        let cancelled = Task { await limiter.acquire(until: .now + .seconds(60)) }
        while limiter.waiting == 0 { try await Task.sleep(for: .milliseconds(1)) }
        cancelled.cancel()
        #expect(await cancelled.value == false)
        #expect(limiter.waiting == 0)
        // The permit held by the waiter is still the only one.
        #expect(await limiter.acquire(until: .now) == false)
        limiter.release()
        #expect(await limiter.acquire(until: .now))
    }
}

@Suite struct AsyncPermitsStressTests {
    @Test("Many tasks through one permit: every one gets it in time, none is left waiting with a permit free")
    func noLostWakeups() async throws {
        let permits = AsyncPermits(limit: 1)
        // A lost wakeup leaves a waiter asleep with the permit free until its deadline, when it
        // gives up: fewer than all would be granted.
        let granted = try await withThrowingTaskGroup(of: Bool.self) { group in
            for _ in 0..<200 {
                group.addTask {
                    guard await permits.acquire(until: .now + .seconds(300)) else { return false }
                    await Task.yield()
                    permits.release()
                    return true
                }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        #expect(granted == 200)
        #expect(permits.waiting == 0)
        #expect(await permits.acquire(until: .now), "the permit is free again")
    }
}

