import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import JWTKit
import OfferSignerCore
import OfferSignerStorage
import SwiftASN1
import Testing

@testable import OfferSignerServer

/// Every issuance keeps the customer's subscription and environment when they can be known: an
/// offer decided on the app's verified evidence keeps what the evidence proves, a plain signature
/// keeps the environment the client declares (`environment`, not verified, marked declared).
/// Redemptions match them by token or original transaction, within one environment when it was
/// proved; a declared one only orders the candidates.
extension RedemptionPlacementTests {
    @Test("A plain signature keeps its declared environment, marked declared: it orders the issuances a redemption matches and never keeps one from matching; unknown spellings are refused")
    func plainSignatureDeclaredEnvironment() async throws {
        try await withServer { server, _, secret, client in
            let refused = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","appAccountToken":"\#(Self.token)","environment":"sandbox"}"#,
                bearer: secret)
            #expect(refused.status == .badRequest && refused.json["code"] as? String == "unknown_environment", "\(refused.text)")
            // Through the decoder (a member the plain reader leaves to it) the same rule applies,
            // and a long value is not echoed whole.
            let long = String(repeating: "Staging", count: 1000)
            let refusedDecoded = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","environment":"\#(long)","evidence":{"signedTransactions":[]}}"#,
                bearer: secret)
            #expect(refusedDecoded.json["code"] as? String == "unknown_environment", "\(refusedDecoded.text)")
            let detail = try #require(refusedDecoded.json["detail"] as? String)
            #expect(detail.count < 200 && detail.contains("StagingStaging"), "\(detail)")

            // Declared Sandbox, then declared Production (the newer).
            for environment in ["Sandbox", "Production"] {
                let signed = try await client.postJSON(
                    "/v1/offers/signatures",
                    #"{"productID":"pro.monthly","offerID":"plain_offer","appAccountToken":"\#(Self.token)","environment":"\#(environment)"}"#, bearer: secret)
                #expect(signed.status == .created, "\(signed.text)")
            }
            let issued = try await server.store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundleID)
            #expect(issued.map(\.signature.environment) == ["Sandbox", "Production"])
            #expect(issued.allSatisfy { $0.signature.environmentIsDeclared && $0.signature.originalTransactionID == nil })
            let record = try #require(try await server.store.auditRecords(after: 0, limit: 100).last { $0.kind == "signature.issued" })
            #expect(record.body.contains(#""environment":"Production""#) && record.body.contains(#""environmentDeclared":true"#), "\(record.body)")
            let sandboxIssuedAt = try #require(issued.first?.signature.issuedAt)

            // A Sandbox redemption prefers the Sandbox-declared issuance, though it is older.
            let purchase = Date()
            let sandbox = RedemptionCandidate(
                transactionID: "910000001", originalTransactionID: "910000000", bundleID: Self.bundleID, environment: "Sandbox",
                productID: "pro.monthly", offerID: "plain_offer", appAccountToken: Self.token, purchaseDate: purchase)
            guard case .recorded(let first) = try await server.store.recordAppleHistory(AppleHistoryUpdate(redemptions: [sandbox], source: "history"), at: purchase)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(first.map(\.state) == [.matched])
            #expect(first.first?.signatureIssuedAt?.unixMilliseconds == sandboxIssuedAt.unixMilliseconds)

            // The attack: declared Sandbox, redeemed in Production. Matched (the declaration is
            // not verified), so never counted as a redemption without a signature.
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","appAccountToken":"\#(Self.token)","environment":"Sandbox"}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            var production = sandbox
            production.environment = "Production"
            var again = production
            production.transactionID = "910000002"
            again.transactionID = "910000003"
            guard case .recorded(let redemptions) = try await server.store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [production, again], source: "history"), at: purchase)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.state) == [.matched, .matched], "the Production-declared issuance, then the Sandbox-declared one")
        }
    }

    /// A server taking end users' JWTs (HS256, bound to their app account token by a claim), with
    /// the offer `goodwill` (kind any) for an app whose history comes from notifications; and a
    /// JWT of the user whose token is `Self.token`.
    func goodwillServerForUserJWTs() async throws -> (jwt: String, server: TestServer) {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: AuthenticationTests.hsSecret), digestAlgorithm: .sha256)
        let jwt = try await keys.sign(AppUserClaims.valid(token: Self.token))
        var server = try await TestServer(bundles: [Self.bundleID]) { configuration in
            configuration.userJWT = UserJWTConfiguration(
                jwksJSON: nil, hs256Secret: AuthenticationTests.hsSecret, issuer: "https://auth.example.com", audience: "offer-signer",
                binding: .claim("https://example.com/app_account_token"))
        }
        let catalog = #"""
            {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production"], "notificationHistory": true}},
             "offers": [{"offerID": "goodwill", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"}]}
            """#
        do {
            server.configuration.eligibility = try EligibilityConfiguration(
                catalogJSON: Data(catalog.utf8), trustedRootPEMs: [try chain.root.serializeAsPEM().pemString])
        } catch {
            server.cleanUp()
            throw error
        }
        return (jwt, server)
    }

    @Test("Attack: an end user declares Xcode with their JWT and redeems in Production: matched, and the leaked-key warning is not raised")
    func endUserDeclaredEnvironmentRaisesNoLeakedKeyWarning() async throws {
        let (jwt, configured) = try await goodwillServerForUserJWTs()
        defer { configured.cleanUp() }
        try await configured.live { client in
            let signed = try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill","environment":"Xcode"}"#, bearer: jwt)
            #expect(signed.status == .created, "\(signed.text)")
            let issued = try await configured.store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundleID)
            #expect(issued.map(\.signature.environment) == ["Xcode"] && issued.allSatisfy(\.signature.environmentIsDeclared))

            // The user redeems it in Production, as Apple then tells the service.
            var transaction = notifications.subscriber().transactionPayload(5)
            transaction["transactionId"] = "400000001950"
            transaction["purchaseDate"] = TestAppleChain.milliseconds(Date().addingTimeInterval(5))
            transaction["offerType"] = 2
            transaction["offerIdentifier"] = "goodwill"
            transaction["appAccountToken"] = Self.token
            let answer = try await client.postJSON("/v1/apple/notifications", try notifications.body("OFFER_REDEEMED", subtype: "UPGRADE", transaction: transaction))
            #expect(answer.status == .ok, "\(answer.text)")

            let redeemed = try await configured.store.auditRecords(after: 0, limit: 100).filter { $0.kind == "offer.redeemed" }
            #expect(redeemed.count == 1 && redeemed.allSatisfy { $0.body.contains(#""matched":true"#) }, "\(redeemed.map(\.body))")
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"offer_redemptions_total{bundle_id="com.example.app",offer_id="goodwill",matched="true"} 1"#), "\(metrics)")
            #expect(!metrics.contains(#"offer_signer_redemptions_without_signature_total{bundle_id="com.example.app",offer_id="goodwill""#))
        }
    }

    @Test("Attack: one Apple ID, two app accounts: a JWS asked as A, proving A's transaction of a subscription that also carries B's token, is redeemed as B: matched, no leaked-key warning")
    func secondAppAccountRedemptionIsMatched() async throws {
        let otherAccount = "7c3a1d52-0b8e-4f7a-9d2e-5a1f3c4b6d70"
        let (jwt, configured) = try await goodwillServerForUserJWTs()
        defer { configured.cleanUp() }
        // Subscription S of one Apple ID: bought signed in as A (the user's token), renewed last
        // while signed in as B (the same person's second account in the app).
        let subscription = SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "470000001",
            appAccountToken: Self.token, periodStarts: SubscriptionFixture.monthlyStarts(count: 3, activeAt: now))
        var payloads = subscription.periodStarts.indices.map(subscription.transactionPayload)
        payloads[2]["appAccountToken"] = otherAccount
        let signedTransactions = try payloads.map { "\"\(try chain.signJWS($0))\"" }.joined(separator: ",")
        // Redeemed in the app signed in as B: Apple's transaction carries B's token on S.
        var transaction = payloads[2]
        transaction["transactionId"] = "470000001950"
        transaction["purchaseDate"] = TestAppleChain.milliseconds(Date().addingTimeInterval(5))
        transaction["offerType"] = 2
        transaction["offerIdentifier"] = "goodwill"
        let redemption = try notifications.body("OFFER_REDEEMED", subtype: "UPGRADE", transaction: transaction)
        try await configured.live { client in
            // Signed in as A: a JWS proving S's first transaction (carrying A's token).
            let signed = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"goodwill","formats":["jws"],"transactionID":"\#(subscription.transactionID(0))","evidence":{"signedTransactions":[\#(signedTransactions)],"signedRenewalInfos":[]}}"#,
                bearer: jwt)
            #expect(signed.status == .created, "\(signed.text)")
            let issued = try await configured.store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundleID)
            #expect(issued.count == 1)
            #expect(issued.allSatisfy { $0.signature.originalTransactionID == "470000001" && $0.signature.environment == "Production" && !$0.signature.environmentIsDeclared })

            let answer = try await client.postJSON("/v1/apple/notifications", redemption)
            #expect(answer.status == .ok, "\(answer.text)")

            let redeemed = try await configured.store.auditRecords(after: 0, limit: 100).filter { $0.kind == "offer.redeemed" }
            #expect(redeemed.count == 1 && redeemed.allSatisfy { $0.body.contains(#""matched":true"#) }, "\(redeemed.map(\.body))")
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"offer_redemptions_total{bundle_id="com.example.app",offer_id="goodwill",matched="true"} 1"#), "\(metrics)")
            #expect(!metrics.contains(#"offer_signer_redemptions_without_signature_total{bundle_id="com.example.app",offer_id="goodwill""#), "\(metrics)")
        }
    }

    @Test("An offer decided on the app's evidence keeps the evidence's subscription and environment: a redemption without a token matches it by original transaction")
    func appEvidenceIssuanceMatchedByOriginalTransaction() async throws {
        try await withServer { server, _, secret, client in
            // A customer without appAccountTokens who lapsed over a month ago (win-back `wb_client`, decided on the app's evidence).
            let customer = SubscriptionFixture(
                bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "520000001",
                periodStarts: SubscriptionFixture.monthlyStarts(count: 3, activeAt: now.addingTimeInterval(-75 * 86400)))
            let signedTransactions = try customer.signedTransactions(chain).map { "\"\($0)\"" }.joined(separator: ",")
            let renewalInfo = try customer.signedRenewalInfo(chain, signedAt: now)
            let evidence = #"{"signedTransactions":[\#(signedTransactions)],"signedRenewalInfos":["\#(renewalInfo)"]}"#
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb_client","evidence":\#(evidence)}"#, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            let record = try #require(try await server.store.auditRecords(after: 0, limit: 100).last { $0.kind == "signature.issued" })
            #expect(record.body.contains(#""originalTransactionID":"520000001""#) && record.body.contains(#""environment":"Production""#), "\(record.body)")

            // The win-back redemption as Apple states it: no appAccountToken on the purchase.
            let purchase = Date()
            var sandbox = RedemptionCandidate(
                transactionID: "520000009", originalTransactionID: customer.originalTransactionID, bundleID: Self.bundleID, environment: "Sandbox",
                productID: "pro.monthly", offerID: "wb_client", appAccountToken: nil, purchaseDate: purchase)
            var production = sandbox
            production.transactionID = "520000010"
            production.environment = "Production"
            var stranger = production
            stranger.transactionID = "530000010"
            stranger.originalTransactionID = "530000001"
            sandbox.signatureWindowStart = purchase.addingTimeInterval(-86400)
            guard case .recorded(let redemptions) = try await server.store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [sandbox, stranger, production], source: "history"), at: purchase)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.state) == [.unmatched, .unmatched, .matched])
        }
    }
}
