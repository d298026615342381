// The evidence collector against StoreKitShim.
#if !canImport(StoreKit)
import Foundation
import OfferSignerClient
import StoreKitShim
import Testing

@Suite("Evidence from StoreKit within the service's limits (against StoreKitShim)")
struct EvidenceCollectorTests {
    static func transaction(_ id: UInt64, group: String?, daysAgo: Double, size: Int = 100) -> VerificationResult<Transaction> {
        let jws = "eyJ\(id)." + String(repeating: "A", count: size)
        let value = Transaction(
            id: id, originalID: 1, productID: "pro.monthly", appAccountToken: nil, finishLog: FinishLog(), subscriptionGroupID: group,
            purchaseDate: Date(timeIntervalSince1970: 1_900_000_000 - daysAgo * 86_400), jws: jws)
        return id % 2 == 0 ? .verified(value) : .unverified(value, .invalidSignature)
    }

    @Test("The group's transactions, newest first, verified or not; renewal infos first; other groups left out")
    func collectsTheGroup() {
        let transactions = [
            Self.transaction(1, group: "G1", daysAgo: 300), Self.transaction(2, group: "G2", daysAgo: 10),
            Self.transaction(3, group: "G1", daysAgo: 30), Self.transaction(4, group: nil, daysAgo: 1),
            Self.transaction(6, group: "G1", daysAgo: 60),
        ]
        let renewal = VerificationResult<Product.SubscriptionInfo.RenewalInfo>.verified(.init(jws: "eyJrenewal.x.y"))
        let (evidence, truncated) = PurchaseEvidence.collect(transactions: transactions, renewalInfos: [renewal], subscriptionGroupID: "G1")
        #expect(!truncated)
        #expect(evidence.signedRenewalInfos == ["eyJrenewal.x.y"])
        let expected = [UInt64(3), 6, 1].compactMap { id in transactions.first { $0.unsafePayloadValue.id == id }?.jwsRepresentation }
        #expect(evidence.signedTransactions == expected)
        #expect(expected.count == 3)
    }

    @Test("A long history is cut to 1,000 items, the newest kept")
    func longHistory() {
        let transactions = (0..<1200).map { Self.transaction(UInt64($0), group: "G1", daysAgo: Double($0)) }
        let (evidence, truncated) = PurchaseEvidence.collect(transactions: transactions, renewalInfos: [], subscriptionGroupID: "G1")
        #expect(truncated)
        #expect(evidence.signedTransactions.count == PurchaseEvidence.serviceMaximumItems)
        #expect(evidence.signedTransactions.first == transactions[0].jwsRepresentation)
        #expect(evidence.signedTransactions.last == transactions[999].jwsRepresentation)
    }

    @Test("current(subscriptionGroupID:) reads StoreKit (empty in the shim)")
    func readsStoreKit() async throws {
        let (evidence, truncated) = try await PurchaseEvidence.current(subscriptionGroupID: "G1")
        #expect(evidence == PurchaseEvidence())
        #expect(!truncated)
    }
}
#endif
