import AppleTestChain
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerStorage
import Testing

/// The ledger (`issued_signatures`) against a database writer without the master key: deleting a
/// customer's rows is not detected (Docs/Security.md says why), but what it can gain is bounded:
/// redemptions Apple recorded still count, and every deleted row's signature stays in the audit
/// log. (In `AppleReadingScenarioTests`' suite, for its server, catalog and history helpers.)
extension AppleReadingScenarioTests {
    @Test("Ledger rows deleted by SQL: an offer Apple recorded as redeemed stays refused, and every deleted signature is still in the audit log", arguments: StoreBackend.testedCases)
    func deletedLedgerRowsAreBounded(backend: StoreBackend) async throws {
        let subscriber = Subscriber(original: "710000077", periods: Self.months(4, endingAt: now.addingTimeInterval(-90 * 86_400)))
        try await withServer(backend) { client, secret, fixture in
            try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            let appleRequest = #"{"productID":"pro.monthly","offerID":"wb_once_apple","appAccountToken":"\#(subscriber.token)","transactionID":"\#(subscriber.original)"}"#
            let signed = try await client.postJSON("/v1/offers/signatures", appleRequest, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            // Apple records the redemption.
            var redeemed = subscriber
            redeemed.periods.append((now.addingTimeInterval(-5), Self.utc.date(byAdding: .month, value: 1, to: now)!))
            redeemed.extra[redeemed.periods.count - 1] = [
                "offerType": 2, "offerIdentifier": "wb_once_apple", "offerDiscountType": "PAY_UP_FRONT", "price": 4990, "transactionReason": "PURCHASE",
            ]
            let answer = try await client.postJSON(
                "/v1/apple/notifications",
                try notification("SUBSCRIBED", subtype: "RESUBSCRIBE", transaction: redeemed.transaction(redeemed.periods.count - 1),
                    renewalInfo: redeemed.renewalInfo(autoRenew: true, at: now)))
            #expect(answer.status == .ok, "\(answer.text)")
            expectProblem(try await client.postJSON("/v1/offers/signatures", appleRequest, bearer: secret), .forbidden, "not_eligible")

            let nonces = try await fixture.store.issuedSignatures(appAccountToken: subscriber.token, bundleID: Self.bundleID).map(\.signature.nonce)
            #expect(!nonces.isEmpty)
            // The attacker removes the customer's ledger.
            try await fixture.execute("DELETE FROM issued_signatures WHERE app_account_token = '\(subscriber.token)'")
            #expect(try await fixture.store.issuedSignatures(appAccountToken: subscriber.token, bundleID: Self.bundleID).isEmpty)

            // Apple's redemption still counts: refused.
            expectProblem(try await client.postJSON("/v1/offers/signatures", appleRequest, bearer: secret), .forbidden, "not_eligible")
            // Every deleted row's signature is still in the audit log (the chain verifies).
            let records = try await fixture.store.auditRecords(after: 0, limit: 10_000)
            for nonce in nonces {
                #expect(records.contains { $0.kind == "signature.issued" && $0.body.contains(nonce) }, "nonce \(nonce) is not in the audit log")
            }
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }
}
