import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import SwiftASN1
import HTTPTypes
import HummingbirdTesting
import JWTKit
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing
import X509

/// Attacks by a signed-in end user (a user JWT) on the real server on loopback, with Apple's API
/// faked on loopback: what the user may have signed is what policy allows, nothing more.
@Suite("Attacks by an end user: catalogued offers only, a JWS only for the user's own transaction", .serialized)
struct UserPolicyAttackTests {
    static let bundleID = "com.example.app"
    /// The attacker's own appAccountToken (bound in their JWT).
    static let userToken = "6b29fc40-ca47-1067-b31d-00dd010662da"
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
          {"offerID": "goodwill", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"},
          {"offerID": "wb_apple", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1}}
        ]}
        """#
    }

    /// A subscription Apple knows; `token` is the appAccountToken its purchases carry (nil: none).
    func subscription(_ originalTransactionID: String, token: String?, lapsedDaysAgo: Double = 0) -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: originalTransactionID,
            appAccountToken: token, periodStarts: SubscriptionFixture.monthlyStarts(count: 4, activeAt: now.addingTimeInterval(-lapsedDaysAgo * 86_400)))
    }

    func userJWT() async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: AuthenticationTests.hsSecret), digestAlgorithm: .sha256)
        return try await keys.sign(AppUserClaims.valid(token: Self.userToken))
    }

    func withServer(
        catalog: Bool = true, customers: [SubscriptionFixture] = [],
        _ body: @escaping @Sendable (TestServer, String, any TestClientProtocol) async throws -> Void
    ) async throws {
        let server = try await TestServer(bundles: [Self.bundleID]) { configuration in
            configuration.userJWT = UserJWTConfiguration(
                jwksJSON: nil, hs256Secret: AuthenticationTests.hsSecret, issuer: "https://auth.example.com", audience: "offer-signer",
                binding: .claim("https://example.com/app_account_token"))
        }
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        for customer in customers { fake.add(try customer.customer(chain, now: now)) }
        let root = try chain.root.serializeAsPEM().pemString
        let apiKey = try await server.createClient(name: "backend")
        if catalog {
            try await fake.run { port in
                var eligibility = try EligibilityConfiguration(catalogJSON: Data(Self.catalog(port: port).utf8), trustedRootPEMs: [root])
                eligibility.appStoreServerAPI.timeBudget = .seconds(30)
                var running = server
                running.configuration.eligibility = eligibility
                let configured = running
                try await configured.live { client in try await body(configured, apiKey, client) }
            }
        } else {
            let running = server
            try await running.live { client in try await body(running, apiKey, client) }
        }
    }

    @Test("A user asks for an offer the catalog does not name (a goodwill offer of twelve free months): 403 offer_not_in_catalog; an API key still gets it")
    func uncataloguedOffer() async throws {
        let jwt = try await userJWT()
        try await withServer { server, apiKey, client in
            let goodwill = #"{"productID":"pro.monthly","offerID":"SUPPORT_12_MONTHS_FREE"}"#
            expectProblem(try await client.postJSON("/v1/offers/signatures", goodwill, bearer: jwt), .forbidden, "offer_not_in_catalog")
            let asJWS = #"{"productID":"pro.monthly","offerID":"SUPPORT_12_MONTHS_FREE","formats":["jws"],"transactionID":"1"}"#
            expectProblem(try await client.postJSON("/v1/offers/signatures", asJWS, bearer: jwt), .forbidden, "offer_not_in_catalog")
            #expect(try server.issuedCount() == 0)
            // A catalogued offer without rules is signed for the user, bound to the user's token.
            let catalogued = try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill"}"#, bearer: jwt)
            #expect(catalogued.status == .created, "\(catalogued.text)")
            #expect(catalogued.json["appAccountToken"] as? String == Self.userToken)
            // The backend's API key keeps its behaviour: it decides what to sign.
            #expect(try await client.postJSON("/v1/offers/signatures", goodwill, bearer: apiKey).status == .created)
            #expect(try server.issuedCount() == 2)
        }
        // Without an offers catalog nothing is catalogued: users get nothing.
        try await withServer(catalog: false) { server, apiKey, client in
            expectProblem(
                try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill"}"#, bearer: jwt), .forbidden,
                "offer_not_in_catalog")
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill"}"#, bearer: apiKey).status == .created)
            #expect(try server.issuedCount() == 1)
        }
    }

    @Test("A user sends a stranger's originalTransactionId (a history without an appAccountToken): a mismatch, nothing of the stranger disclosed, no JWS")
    func strangersTransaction() async throws {
        let jwt = try await userJWT()
        // The stranger lapsed two months ago, no token on their purchases; Apple knows them.
        let stranger = subscription("700000001", token: nil, lapsedDaysAgo: 60)
        let own = subscription("800000001", token: Self.userToken, lapsedDaysAgo: 60)
        try await withServer(customers: [stranger, own]) { server, apiKey, client in
            let asked = try await client.postJSON(
                "/v1/offers/eligibility", #"{"offerIDs":["wb_apple"],"transactionID":"\#(stranger.originalTransactionID)"}"#, bearer: jwt)
            #expect(asked.status == .ok, "\(asked.text)")
            let decision = try #require((asked.json["decisions"] as? [[String: Any]])?.first)
            #expect(decision["eligible"] as? Bool == false)
            #expect(decision["reasons"] as? [String] == ["app_account_token_mismatch"], "only the mismatch: \(asked.text)")
            #expect(decision["eligibleFrom"] == nil)

            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb_apple","transactionID":"\#(stranger.originalTransactionID)"}"#, bearer: jwt)
            expectProblem(signed, .forbidden, "not_eligible")
            #expect(signed.json["reasons"] as? [String] == ["app_account_token_mismatch"])

            // A JWS (which carries no appAccountToken) for the stranger's transaction, for an offer without rules.
            let strangersJWS = #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"],"transactionID":"\#(stranger.transactionID(2))"}"#
            let refused = try await client.postJSON("/v1/offers/signatures", strangersJWS, bearer: jwt)
            expectProblem(refused, .forbidden, "transaction_not_owned")
            #expect(!refused.text.contains("refund") && !refused.text.contains("storefront"))
            // …or with no transaction at all: a JWS that works on any Apple ID.
            expectProblem(
                try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"]}"#, bearer: jwt),
                .badRequest, "transaction_id_required")
            // The stranger's signed transaction as evidence does not carry the user's token either.
            let strangersEvidence = #"{"signedTransactions":["\#(try stranger.signedTransactions(chain)[0])"],"signedRenewalInfos":[]}"#
            expectProblem(
                try await client.postJSON(
                    "/v1/offers/signatures",
                    #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"],"transactionID":"\#(stranger.originalTransactionID)","evidence":\#(strangersEvidence)}"#,
                    bearer: jwt), .forbidden, "transaction_not_owned")
            #expect(try server.issuedCount() == 0)

            // The user's own transaction: proven by Apple's history carrying the user's token…
            let key = try #require(server.keys[Self.bundleID])
            let ownJWS = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"],"transactionID":"\#(own.originalTransactionID)"}"#,
                bearer: jwt)
            #expect(ownJWS.status == .created, "\(ownJWS.text)")
            let compact = try #require((ownJWS.json["jws"] as? [String: Any])?["compactJWS"] as? String)
            guard case .valid(_, let claims) = PromotionalOfferVerifier(publicKey: key.publicKey).verifyJWS(compact, audience: .promotionalOffer) else {
                Issue.record("the JWS does not verify with the key's public key")
                return
            }
            #expect(claims.transactionId == own.originalTransactionID)
            // …or by the user's own signed transaction as evidence.
            let ownEvidence = #"{"signedTransactions":["\#(try own.signedTransactions(chain)[1])"],"signedRenewalInfos":[]}"#
            let byEvidence = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"],"transactionID":"\#(own.transactionID(1))","evidence":\#(ownEvidence)}"#,
                bearer: jwt)
            #expect(byEvidence.status == .created, "\(byEvidence.text)")
            #expect(try server.issuedCount() == 2)
            // The backend's API key keeps its behaviour on a history without a token.
            let backend = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.userToken)","offerIDs":["wb_apple"],"transactionID":"\#(stranger.originalTransactionID)"}"#, bearer: apiKey)
            let backendDecision = try #require((backend.json["decisions"] as? [[String: Any]])?.first)
            #expect(backendDecision["reasons"] as? [String] != ["app_account_token_mismatch"], "\(backend.text)")
        }
    }

    @Test("An empty or whitespace-only appAccountToken is refused with app_account_token_empty, never signed unbound")
    func emptyAppAccountToken() async throws {
        try await withServer(catalog: false) { server, apiKey, client in
            for token in ["", " ", "\\t", "  \\n "] {
                let body = #"{"productID":"pro.monthly","offerID":"goodwill","appAccountToken":"\#(token)"}"#
                expectProblem(try await client.postJSON("/v1/offers/signatures", body, bearer: apiKey), .badRequest, "app_account_token_empty")
            }
            #expect(try server.issuedCount() == 0)
        }
    }
}
