import Foundation
import OfferSignerEligibility
import Testing

@testable import AppStoreServerAPI

/// The short cache of Apple's answers: a notification about a subscription drops it, including
/// an answer that was on its way when the notification came.
@Suite("History cache")
struct HistoryCacheTests {
    static func history(original: String) -> VerifiedHistory {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: Date())
        history.record(VerifiedTransaction(
            transactionID: original, originalTransactionID: original, productID: "pro.monthly", purchaseDate: Date(timeIntervalSince1970: 1_700_000_000),
            environment: .production, bundleID: "com.example.app"))
        return history
    }

    @Test func anAnswerLookedUpBeforeAnInvalidationIsNotStored() {
        let cache = HistoryCache(ttl: .seconds(60), capacity: 10)
        let asked = cache.generation
        cache.invalidate(originalTransactionID: "1000")
        cache.store(Self.history(original: "1000"), bundleID: "com.example.app", transactionID: "1000", lookedUpAt: asked)
        #expect(cache.history(bundleID: "com.example.app", transactionID: "1000") == nil, "the answer predates the notification")

        // Another subscription's notification does not keep an answer out.
        let again = cache.generation
        cache.invalidate(originalTransactionID: "2000")
        cache.store(Self.history(original: "1000"), bundleID: "com.example.app", transactionID: "1000", lookedUpAt: again)
        #expect(cache.history(bundleID: "com.example.app", transactionID: "1000") != nil)

        // And an invalidation drops what is stored.
        cache.invalidate(originalTransactionID: "1000")
        #expect(cache.history(bundleID: "com.example.app", transactionID: "1000") == nil)
        let fresh = cache.generation
        cache.store(Self.history(original: "1000"), bundleID: "com.example.app", transactionID: "1000", lookedUpAt: fresh)
        #expect(cache.history(bundleID: "com.example.app", transactionID: "1000") != nil, "an answer looked up after the notification is kept")
    }
}
