import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing
import X509

/// Offers decided on Apple's word (`historySource`): the real server on loopback asks a fake App
/// Store Server API on loopback, signed by a test chain shaped like Apple's.
@Suite("History sources: Apple's word over HTTP", .serialized)
struct AppleHistorySourceTests {
    static let bundleID = "com.example.app"
    static let token = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    static let otherToken = "11111111-2222-3333-4444-555555555555"
    let chain: TestAppleChain
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
    }

    static func catalog(port: Int) -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production", "Sandbox"],
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production", "sandboxURL": "http://127.0.0.1:\#(port)/sandbox"}}},
         "offers": [
          {"offerID": "wb_apple", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
          {"offerID": "wb_fallback", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple-then-client", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
          {"offerID": "wb_client", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}}
        ]}
        """#
    }

    /// A current subscriber: six monthly renewals, the last one active now.
    func subscriber(token: String? = Self.token) -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "300000001",
            appAccountToken: token, periodStarts: SubscriptionFixture.monthlyStarts(count: 6, activeAt: now))
    }

    /// What a tampered app sends: the first three months only (the latest renewals left out), so
    /// the customer looks lapsed for about three months.
    func omittedEvidence(_ customer: SubscriptionFixture) throws -> String {
        let signed = try customer.signedTransactions(chain).prefix(3)
        return #"{"signedTransactions":[\#(signed.map { "\"\($0)\"" }.joined(separator: ","))],"signedRenewalInfos":[]}"#
    }

    /// Runs a real server whose catalog points at a fake Apple API (which knows the server's key).
    func withServerAndApple(
        customer: SubscriptionFixture, configure: @escaping @Sendable (inout EligibilityConfiguration) -> Void = { _ in },
        _ body: @escaping @Sendable (TestServer, FakeAppStoreServerAPI, String, any TestClientProtocol) async throws -> Void
    ) async throws {
        let server = try await TestServer(bundles: [Self.bundleID])
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        fake.add(try customer.customer(chain, now: now))
        let secret = try await server.createClient(name: "backend")
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { port in
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(Self.catalog(port: port).utf8), trustedRootPEMs: [root])
            // Generous unless a test is about the budget: the suite runs in parallel on a loaded machine.
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            configure(&eligibility)
            var running = server
            running.configuration.eligibility = eligibility
            let configured = running
            try await configured.live { client in try await body(configured, fake, secret, client) }
        }
    }

    func auditedDecisions(_ server: TestServer) async throws -> [[String: Any]] {
        try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "eligibility.decided" }.map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.body.utf8)) as? [String: Any])
        }
    }

    @Test("Omission attack: the app leaves out its latest renewals; under historySource apple the customer is currently_subscribed")
    func omissionAttack() async throws {
        let customer = subscriber()
        let evidence = try omittedEvidence(customer)
        try await withServerAndApple(customer: customer) { server, fake, secret, client in
            let answer = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","evidence":\#(evidence)}"#, bearer: secret)
            #expect(answer.status == .ok, "\(answer.text)")
            let decisions = try #require(answer.json["decisions"] as? [[String: Any]])
            let byOffer = Dictionary(uniqueKeysWithValues: decisions.map { ($0["offerID"] as? String ?? "", $0) })
            // The app's own word is fooled (this is the attack)…
            #expect(byOffer["wb_client"]?["eligible"] as? Bool == true, "\(answer.text)")
            #expect(byOffer["wb_client"]?["historySource"] as? String == "client")
            // …Apple's is not.
            #expect(byOffer["wb_apple"]?["eligible"] as? Bool == false)
            #expect(byOffer["wb_apple"]?["reasons"] as? [String] == ["currently_subscribed"])
            #expect(byOffer["wb_apple"]?["historySource"] as? String == "apple")
            #expect(byOffer["wb_fallback"]?["reasons"] as? [String] == ["currently_subscribed"])
            #expect(byOffer["wb_fallback"]?["historySource"] as? String == "apple")

            let refused = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.transactionID(2))","evidence":\#(evidence)}"#,
                bearer: secret)
            expectProblem(refused, .forbidden, "not_eligible")
            #expect(refused.json["reasons"] as? [String] == ["currently_subscribed"])
            #expect(refused.json["historySource"] as? String == "apple")
            #expect(try server.issuedCount() == 0)
            let audited = try await auditedDecisions(server)
            #expect(audited.count == 1)
            #expect(audited.first?["historySource"] as? String == "apple")
            #expect(audited.first?["transactionID"] as? String == customer.transactionID(2))
            #expect(audited.first?["eligible"] as? Bool == false)
            // Every request to Apple carried a token signed with the app's key, with Apple's claims.
            #expect(!fake.requests.isEmpty)
            #expect(fake.requests.allSatisfy { $0.token?.problems == [] && $0.token?.bundleID == Self.bundleID })
            // Every offer asked about is of group G1: the history was asked for that group's
            // auto-renewable transactions only, on every page (Apple's productType and
            // subscriptionGroupIdentifier filters).
            let historyPages = fake.requests.filter { $0.endpoint == .history }
            #expect(!historyPages.isEmpty)
            #expect(historyPages.allSatisfy { $0.query?.contains("productType=AUTO_RENEWABLE&subscriptionGroupIdentifier=G1") == true }, "\(historyPages.map(\.query))")
        }
    }

    /// An honest lapsed customer's evidence from the app: three paid months that ended two months
    /// ago, signed by the test chain (`{"signedTransactions": [...], "signedRenewalInfos": []}`).
    func lapsedEvidence() throws -> String {
        let lapsed = SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "300000001",
            appAccountToken: Self.token,
            periodStarts: SubscriptionFixture.monthlyStarts(count: 3, activeAt: Date(timeIntervalSinceNow: -75 * 86_400)))
        return #"{"signedTransactions":[\#(try lapsed.signedTransactions(chain).map { "\"\($0)\"" }.joined(separator: ","))],"signedRenewalInfos":[]}"#
    }

    @Test("Apple unreachable: apple refuses with history_unavailable within the budget; apple-then-client lets the app's evidence decide, and the audit says so")
    func appleUnreachable() async throws {
        let customer = subscriber()
        let evidence = try lapsedEvidence()
        try await withServerAndApple(customer: customer, configure: { $0.appStoreServerAPI.timeBudget = .milliseconds(500) }) { server, fake, secret, client in
            fake.setAnswerDelay(.seconds(600))
            let start = ContinuousClock.now
            let refused = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","evidence":\#(evidence)}"#,
                bearer: secret)
            let elapsed = ContinuousClock.now - start
            expectProblem(refused, .forbidden, "not_eligible")
            #expect(refused.json["reasons"] as? [String] == ["history_unavailable"])
            // Far above the budget: the whole suite shares two cores, where a task can wait seconds to run.
            #expect(elapsed < .seconds(60), "the 500 ms budget bounds the answer, not Apple's 600 s (took \(elapsed))")
            #expect(try server.issuedCount() == 0, "no signature")

            let signed = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"wb_fallback","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","evidence":\#(evidence)}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            let legacy = try #require(signed.json["legacy"] as? [String: Any])
            let payload = try PromotionalOfferPayload(
                bundleID: Self.bundleID, keyID: try #require(legacy["keyID"] as? String), productID: "pro.monthly", offerID: "wb_fallback",
                appAccountToken: Self.token, nonce: try #require(legacy["nonce"] as? String), timestamp: try #require(legacy["timestamp"] as? Int64))
            #expect(
                PromotionalOfferVerifier(publicKey: server.keys[Self.bundleID]!.publicKey).verifyLegacy(payload: payload, signature: try #require(legacy["signature"] as? String))
                    == .valid)
            #expect(try server.issuedCount() == 1)

            let audited = try await auditedDecisions(server)
            #expect(audited.count == 2)
            #expect(audited.first?["historySource"] as? String == "none")
            #expect(audited.first?["appleUnavailable"] as? String == "time_budget_exhausted")
            #expect(audited.last?["offerID"] as? String == "wb_fallback")
            #expect(audited.last?["historySource"] as? String == "client", "the app's evidence decided")
            #expect(audited.last?["appleUnavailable"] as? String == "time_budget_exhausted")
            #expect(audited.last?["eligible"] as? Bool == true)
        }
    }

    @Test("apple-then-client: Apple's errors about this service's request (403, 4040003 AppNotFoundError) let the app's evidence decide; its answers about the ID (4000006, 4040001) do not")
    func fallbackOnlyWhenAppleSaidNothingAboutTheID() async throws {
        let customer = subscriber()
        let evidence = try lapsedEvidence()
        try await withServerAndApple(customer: customer) { server, fake, secret, client in
            let cases: [(FakeAppStoreServerAPI.Fault, Bool, String)] = [
                (.status(403), true, "403"),
                (.status(404, errorCode: 4_040_003), true, "4040003 AppNotFoundError"),
                (.status(400, errorCode: 4_000_006), false, "4000006 InvalidTransactionIdError"),
                (.status(404, errorCode: 4_040_001), false, "4040001 AccountNotFoundError"),
            ]
            for (fault, fallsBack, name) in cases {
                fake.always(.history, fault)
                let answer = try await client.postJSON(
                    "/v1/offers/signatures",
                    #"{"productID":"pro.monthly","offerID":"wb_fallback","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","evidence":\#(evidence)}"#,
                    bearer: secret)
                if fallsBack {
                    #expect(answer.status == .created, "\(name): \(answer.text)")
                } else {
                    expectProblem(answer, .forbidden, "not_eligible")
                    #expect(answer.json["reasons"] as? [String] == ["history_unavailable"], "\(name): \(answer.text)")
                }
            }
            let audited = try await auditedDecisions(server)
            #expect(audited.map { $0["historySource"] as? String } == ["client", "client", "none", "none"])
        }
    }

    @Test("Apple's history of another appAccountToken: app_account_token_mismatch; a made-up transaction ID never falls back to the app's word")
    func anotherAccountsHistory() async throws {
        let customer = subscriber(token: Self.otherToken)
        let evidence = try omittedEvidence(subscriber())
        try await withServerAndApple(customer: customer) { server, _, secret, client in
            let answer = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.token)","offerIDs":["wb_apple"],"transactionID":"\#(customer.originalTransactionID)"}"#, bearer: secret)
            #expect(answer.status == .ok, "\(answer.text)")
            let decision = try #require((answer.json["decisions"] as? [[String: Any]])?.first)
            #expect(decision["eligible"] as? Bool == false)
            #expect(decision["reasons"] as? [String] == ["app_account_token_mismatch"])

            let madeUp = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.token)","offerIDs":["wb_fallback"],"transactionID":"999999999","evidence":\#(evidence)}"#, bearer: secret)
            let fallback = try #require((madeUp.json["decisions"] as? [[String: Any]])?.first)
            #expect(fallback["eligible"] as? Bool == false, "\(madeUp.text)")
            #expect(fallback["reasons"] as? [String] == ["history_unavailable"])
            #expect(fallback["historySource"] as? String == "none")
        }
    }

    @Test("An offer decided on Apple's history needs a transactionID: 400 transaction_id_required")
    func transactionIDRequired() async throws {
        let customer = subscriber()
        try await withServerAndApple(customer: customer) { server, fake, secret, client in
            let response = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(Self.token)"}"#, bearer: secret)
            expectProblem(response, .badRequest, "transaction_id_required")
            let eligibility = try await client.postJSON("/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","offerIDs":["wb_fallback"]}"#, bearer: secret)
            expectProblem(eligibility, .badRequest, "transaction_id_required")
            let clientOffer = try await client.postJSON("/v1/offers/eligibility", #"{"offerIDs":["wb_client"],"transactionID":"300000001"}"#, bearer: secret)
            expectProblem(clientOffer, .badRequest, "evidence_required")
            #expect(fake.arrivals == 0, "nothing was asked of Apple")
            #expect(try server.issuedCount() == 0)
        }
    }
}
