import Foundation
import OfferSignerEligibility
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// Which promotional-offer transactions of a fetched history are redemptions, and where each
/// one's signature may be (the rule of `AppleHistoryConversion.redemption(_:known:)`).
@Suite("Redemption candidates from Apple's history")
struct RedemptionCandidateTests {
    static let day: TimeInterval = 86400
    static let start = Date(timeIntervalSince1970: 1_790_000_000)

    static func period(_ index: Int, offer: String? = nil, gapDays: Double = 0) -> VerifiedTransaction {
        let begin = start.addingTimeInterval(Double(index) * 30 * day + gapDays * day)
        return VerifiedTransaction(
            transactionID: "50000\(index)", originalTransactionID: "500000", productID: "pro.monthly", subscriptionGroupID: "G1",
            purchaseDate: begin, expiresDate: begin.addingTimeInterval(30 * day), offerType: offer == nil ? nil : .promotional, offerIdentifier: offer,
            environment: .production, bundleID: "com.example.app", appAccountToken: "7E3FB20B-4CDB-47CC-936D-99D65F608138")
    }

    static func candidates(_ transactions: [VerifiedTransaction]) -> [String: RedemptionCandidate] {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: start)
        for transaction in transactions.reversed() { _ = history.record(transaction, jws: "") }
        let update = AppleHistoryConversion.update(history)
        return Dictionary(uniqueKeysWithValues: update.redemptions.map { ($0.transactionID, $0) })
    }

    @Test("An offer that begins at a renewal may have been signed during the period before; its later periods continue it")
    func renewalStartThenContinuation() throws {
        let found = Self.candidates([Self.period(0), Self.period(1), Self.period(2, offer: "promo_50"), Self.period(3, offer: "promo_50")])
        #expect(found.keys.sorted() == ["500002", "500003"])
        let began = try #require(found["500002"])
        #expect(!began.continuesRedemption)
        #expect(began.signatureWindowStart == Self.period(1).purchaseDate.addingTimeInterval(-Self.day))
        #expect(began.appAccountToken == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        let continued = try #require(found["500003"])
        #expect(continued.continuesRedemption)
        #expect(continued.signatureWindowStart == continued.purchaseDate.addingTimeInterval(-Self.day))
    }

    @Test("A purchase after a lapse, or a first purchase, is a redemption at its purchase: the usual 24 hours")
    func purchaseAfterLapse() throws {
        let afterLapse = Self.candidates([Self.period(0), Self.period(1, offer: "promo_50", gapDays: 90)])
        let lapsed = try #require(afterLapse["500001"])
        #expect(!lapsed.continuesRedemption)
        #expect(lapsed.signatureWindowStart == lapsed.purchaseDate.addingTimeInterval(-Self.day))

        let first = try #require(Self.candidates([Self.period(0, offer: "promo_50")])["500000"])
        #expect(!first.continuesRedemption)
        #expect(first.signatureWindowStart == first.purchaseDate.addingTimeInterval(-Self.day))

        // Another offer in the period before is no continuation of this one.
        let switched = try #require(Self.candidates([Self.period(0, offer: "promo_30"), Self.period(1, offer: "promo_50")])["500001"])
        #expect(!switched.continuesRedemption)
        #expect(switched.signatureWindowStart == Self.period(0).purchaseDate.addingTimeInterval(-Self.day))
    }
}
