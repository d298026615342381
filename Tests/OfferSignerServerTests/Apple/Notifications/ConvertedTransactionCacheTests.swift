import Foundation
import OfferSignerEligibility
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// A history fetched again is written back as the same update, its transactions' stored form
/// taken from `ConvertedTransactionCache` only for transactions equal in every field.
@Suite("Transactions converted for the store once")
struct ConvertedTransactionCacheTests {
    static func history(_ transactions: [VerifiedTransaction]) -> VerifiedHistory {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: RedemptionCandidateTests.start)
        for transaction in transactions { _ = history.record(transaction, jws: "jws-of-\(transaction.transactionID)") }
        return history
    }

    static let fourPeriods = (0..<4).map { RedemptionCandidateTests.period($0, offer: $0 == 2 ? "promo_50" : nil) }

    @Test("A history converted again is the same update as without the cache, every transaction served from it")
    func sameUpdateAgain() {
        let history = Self.history(Self.fourPeriods)
        let cache = ConvertedTransactionCache()
        let first = AppleHistoryConversion.update(history, converted: cache)
        #expect(first == AppleHistoryConversion.update(history))
        #expect(first.transactions.count == 4)
        #expect(cache.hits == 0)
        let again = AppleHistoryConversion.update(history, converted: cache)
        #expect(again == first)
        #expect(cache.hits == 4)
    }

    @Test("A transaction Apple changed (refunded) is encoded anew; the unchanged ones come from the cache")
    func changedTransactionEncodedAgain() throws {
        let cache = ConvertedTransactionCache()
        _ = AppleHistoryConversion.update(Self.history(Self.fourPeriods), converted: cache)
        var refunded = Self.fourPeriods
        refunded[3].revocationDate = RedemptionCandidateTests.start.addingTimeInterval(100 * RedemptionCandidateTests.day)
        refunded[3].signedDate = RedemptionCandidateTests.start.addingTimeInterval(100 * RedemptionCandidateTests.day)
        let update = AppleHistoryConversion.update(Self.history(refunded), converted: cache)
        #expect(update == AppleHistoryConversion.update(Self.history(refunded)))
        #expect(cache.hits == 3)
        let item = try #require(update.transactions.first { $0.key == refunded[3].transactionID })
        #expect(item.decoded == AppleHistoryConversion.encoded(refunded[3]))
        #expect(item.decoded.contains("revocationDate"))
    }

    @Test("A full cache forgets what it held and still converts exactly")
    func boundedCache() {
        let cache = ConvertedTransactionCache(capacity: 2)
        let history = Self.history(Self.fourPeriods)
        let first = AppleHistoryConversion.update(history, converted: cache)
        let again = AppleHistoryConversion.update(history, converted: cache)
        #expect(first == again)
        #expect(again == AppleHistoryConversion.update(history))
        #expect(cache.hits <= 2)
    }
}
