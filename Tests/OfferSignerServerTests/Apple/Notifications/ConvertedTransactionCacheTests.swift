import Foundation
import OfferSignerEligibility
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// A history fetched again is written back as the same update, its transactions' stored form
/// taken from `ConvertedTransactionCache` only for the same JWS and an equal transaction.
@Suite("Transactions converted for the store once")
struct ConvertedTransactionCacheTests {
    static func history(_ transactions: [VerifiedTransaction], jws: (VerifiedTransaction) -> String = { "jws-of-\($0.transactionID)" }) -> VerifiedHistory {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: RedemptionCandidateTests.start)
        for transaction in transactions { _ = history.record(transaction, jws: jws(transaction)) }
        return history
    }

    /// A string's bytes (`String ==` is canonical equivalence, not byte equality).
    static func bytes(_ text: String?) -> [UInt8]? { text.map { Array($0.utf8) } }

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
        // Apple signs a changed transaction anew: a JWS of its own.
        let jws = { (transaction: VerifiedTransaction) in transaction.revocationDate == nil ? "jws-of-\(transaction.transactionID)" : "jws-refunded" }
        let update = AppleHistoryConversion.update(Self.history(refunded, jws: jws), converted: cache)
        #expect(update == AppleHistoryConversion.update(Self.history(refunded, jws: jws)))
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

    @Test("Strings equal as Unicode but not as bytes (caf\\u{E9}, cafe\\u{301}) are each stored as they are: the cache goes by the JWS")
    func canonicallyEqualStringsKeepTheirBytes() throws {
        var composed = Self.fourPeriods[0]
        composed.productID = "caf\u{E9}"
        var decomposed = composed
        decomposed.productID = "cafe\u{301}"
        #expect(composed == decomposed, "Swift compares strings by canonical equivalence")
        #expect(Self.bytes(AppleHistoryConversion.encoded(composed)) != Self.bytes(AppleHistoryConversion.encoded(decomposed)))
        let cache = ConvertedTransactionCache()
        let first = try #require(AppleHistoryConversion.item(composed, jws: "jws-composed", converted: cache))
        let second = try #require(AppleHistoryConversion.item(decomposed, jws: "jws-decomposed", converted: cache))
        #expect(Self.bytes(first.decoded) == Self.bytes(AppleHistoryConversion.encoded(composed)))
        #expect(Self.bytes(second.decoded) == Self.bytes(AppleHistoryConversion.encoded(decomposed)))
        #expect(cache.hits == 0)
        // Each asked again with its own JWS: served, each with its own bytes.
        #expect(Self.bytes(try #require(AppleHistoryConversion.item(decomposed, jws: "jws-decomposed", converted: cache)).decoded) == Self.bytes(AppleHistoryConversion.encoded(decomposed)))
        #expect(Self.bytes(try #require(AppleHistoryConversion.item(composed, jws: "jws-composed", converted: cache)).decoded) == Self.bytes(AppleHistoryConversion.encoded(composed)))
        #expect(cache.hits == 2)
    }

    @Test("Two JWS strings equal as Unicode but not as bytes are two entries")
    func jwsComparedByBytes() throws {
        let cache = ConvertedTransactionCache()
        let transaction = Self.fourPeriods[0]
        _ = AppleHistoryConversion.item(transaction, jws: "jws-caf\u{E9}", converted: cache)
        _ = AppleHistoryConversion.item(transaction, jws: "jws-cafe\u{301}", converted: cache)
        #expect(cache.hits == 0)
        _ = AppleHistoryConversion.item(transaction, jws: "jws-cafe\u{301}", converted: cache)
        #expect(cache.hits == 1)
    }

    @Test("A transaction without a JWS is never cached")
    func noJWSNoEntry() throws {
        let cache = ConvertedTransactionCache()
        for jws in [nil, ""] as [String?] {
            _ = AppleHistoryConversion.item(Self.fourPeriods[0], jws: jws, converted: cache)
            let again = try #require(AppleHistoryConversion.item(Self.fourPeriods[0], jws: jws, converted: cache))
            #expect(again.decoded == AppleHistoryConversion.encoded(Self.fourPeriods[0]))
        }
        #expect(cache.hits == 0)
    }
}
