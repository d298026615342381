import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// Every issuance keeps the customer's subscription and environment when they can be known: an
/// offer decided on the app's verified evidence keeps what the evidence proves, a plain signature
/// keeps the environment the client declares (`environment`, not verified). Redemptions match
/// them by token or original transaction, within one environment.
extension RedemptionPlacementTests {
    @Test("A plain signature declared Sandbox keeps its environment: a Production redemption does not use it up, a Sandbox one does; unknown spellings are refused")
    func plainSignatureDeclaredEnvironment() async throws {
        try await withServer { server, _, secret, client in
            let refused = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","appAccountToken":"\#(Self.token)","environment":"sandbox"}"#,
                bearer: secret)
            #expect(refused.status == .badRequest && refused.json["code"] as? String == "unknown_environment", "\(refused.text)")
            // Through the decoder (a member the plain reader leaves to it) the same rule applies.
            let refusedDecoded = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","environment":"Staging","evidence":{"signedTransactions":[]}}"#,
                bearer: secret)
            #expect(refusedDecoded.json["code"] as? String == "unknown_environment", "\(refusedDecoded.text)")

            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"plain_offer","appAccountToken":"\#(Self.token)","environment":"Sandbox"}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            let issued = try await server.store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundleID)
            #expect(issued.map(\.signature.environment) == ["Sandbox"])
            #expect(issued.map(\.signature.originalTransactionID) == [nil])
            let record = try #require(try await server.store.auditRecords(after: 0, limit: 100).last { $0.kind == "signature.issued" })
            #expect(record.body.contains(#""environment":"Sandbox""#))

            let purchase = Date()
            let production = RedemptionCandidate(
                transactionID: "910000001", originalTransactionID: "910000000", bundleID: Self.bundleID, environment: "Production",
                productID: "pro.monthly", offerID: "plain_offer", appAccountToken: Self.token, purchaseDate: purchase)
            var sandbox = production
            sandbox.transactionID = "910000002"
            sandbox.environment = "Sandbox"
            guard case .recorded(let redemptions) = try await server.store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [production, sandbox], source: "history"), at: purchase)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.state) == [.unmatched, .matched])
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
