import Foundation
import OfferSignerCore
import Testing

@testable import OfferSignerStorage

/// The customer ledger that eligibility rules count: what a store answers must be what its
/// database holds after every commit, whether the store answers from the database or from the
/// SQLite store's `LedgerCache`.
@Suite("Store conformance: the customer ledger follows every commit")
struct LedgerReadTests {
    static let bundle = AppleHistoryStoreTests.bundle
    static let token = AppleHistoryStoreTests.token
    static let base = AppleHistoryStoreTests.base

    static func signature(_ nonce: String, offer: String = "retain_50", at: Date, format: String = "legacy") -> AuditAppend {
        var append = AppleHistoryStoreTests.signature(nonce, offer: offer, at: at)
        append.signatures[0].format = format
        append.entry = append.signatures[0].auditEntry
        return append
    }

    @Test("Read, commit, read: each answer equals a fresh read of the database", arguments: StoreBackend.testedCases)
    func ledgerFollowsCommits(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            func expectSameAsDatabase(_ comment: Comment) async throws -> [LedgerIssuance] {
                let answered = try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle)
                // A store opened now has read nothing before.
                let fresh = try await fixture.openAnother()
                let stored = try await fresh.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle)
                await fresh.close()
                #expect(answered == stored, comment)
                return answered
            }
            // Read first (nothing issued yet), so that what follows is answered after commits.
            #expect(try await expectSameAsDatabase("empty").isEmpty)

            // Two formats of one request are one issuance; a time with a fraction of a
            // millisecond is stored in milliseconds.
            let first = Self.base.addingTimeInterval(0.0004)
            _ = try await store.appendAudit([Self.signature("n-1", at: first), Self.signature("n-1-jws", at: first, format: "jws")], at: first)
            let afterFirst = try await expectSameAsDatabase("after one request in two formats")
            #expect(afterFirst == [LedgerIssuance(offerID: "retain_50", issuedAt: Self.base)])

            // Another offer later, then one stamped earlier than it (a clock set back): time order.
            _ = try await store.appendAudit([Self.signature("n-2", offer: "winback_1", at: Self.base.addingTimeInterval(2))], at: Self.base)
            _ = try await store.appendAudit([Self.signature("n-3", at: Self.base.addingTimeInterval(1))], at: Self.base)
            let ordered = try await expectSameAsDatabase("after three requests")
            #expect(ordered.map(\.offerID) == ["retain_50", "retain_50", "winback_1"])
            #expect(ordered.map(\.issuedAt) == [0, 1, 2].map { Self.base.addingTimeInterval($0) })

            // A batch that fails halfway is not in the ledger, and later commits still are.
            try await fixture.refuseLedgerRows(offerID: "refused")
            await #expect(throws: (any Error).self) {
                _ = try await store.appendAudit(
                    [Self.signature("n-4", at: Self.base.addingTimeInterval(3)), Self.signature("n-5", offer: "refused", at: Self.base.addingTimeInterval(3))],
                    at: Self.base)
            }
            #expect(try await expectSameAsDatabase("after a failed batch").count == 3)
            _ = try await store.appendAudit([Self.signature("n-6", at: Self.base.addingTimeInterval(4))], at: Self.base)
            #expect(try await expectSameAsDatabase("after a commit that followed the failure").count == 4)

            // Offer IDs that Swift takes as equal but SQLite does not (a precomposed "é" and an
            // "e" with a combining accent) are two issuances in the same millisecond.
            let same = Self.base.addingTimeInterval(5)
            _ = try await store.appendAudit([Self.signature("n-7", offer: "caf\u{e9}", at: same)], at: same)
            _ = try await store.appendAudit([Self.signature("n-8", offer: "cafe\u{301}", at: same)], at: same)
            #expect(try await expectSameAsDatabase("after two offer IDs equal only to Swift").count == 6)

            // Another customer's and another app's ledgers stay apart.
            #expect(try await store.ledgerIssuances(appAccountToken: "00000000-0000-4000-8000-000000000000", bundleID: Self.bundle).isEmpty)
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: "com.example.other").isEmpty)
        }
    }

    @Test("A Retention Messaging answer (a page view) and an introductory-offer eligibility are no ledger issuances, read from the database or the cache", arguments: StoreBackend.testedCases)
    func retentionAnswersAreNotIssuances(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            // Read first, so the SQLite store answers the rest from its cache.
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle).isEmpty)
            let viewed = AppleHistoryStoreTests.signature("n-view", at: Self.base, client: LedgerIssuance.pageViewClient)
            let signed = AppleHistoryStoreTests.signature("n-app", offer: "winback_1", at: Self.base.addingTimeInterval(1))
            // Nor is an introductory-offer eligibility: Apple's intro decision, no attempt at the offer it names.
            let intro = AppleHistoryStoreTests.signature(
                "n-intro", offer: "winback_1", at: Self.base.addingTimeInterval(2), format: LedgerIssuance.introEligibilityFormat)
            _ = try await store.appendAudit([viewed, signed, intro], at: Self.base)
            let expected = [LedgerIssuance(offerID: "winback_1", issuedAt: Self.base.addingTimeInterval(1))]
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle) == expected)
            let fresh = try await fixture.openAnother()
            #expect(try await fresh.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle) == expected)
            await fresh.close()
            // Still in the ledger of signatures (audit, redemption tracking, the offers report).
            #expect(try await store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundle).count == 3)
        }
    }

    @Test("A read that a commit for the same customer overtook is not kept")
    func overtakenReadIsNotKept() {
        let cache = LedgerCache()
        let customer = LedgerCache.Customer(bundleID: Self.bundle, appAccountToken: Self.token)
        let other = LedgerCache.Customer(bundleID: Self.bundle, appAccountToken: "00000000-0000-4000-8000-000000000000")

        // The read began, then a signature for the customer was committed: the read may lack it.
        let overtaken = cache.ticket()
        cache.committed([Self.signature("n-1", at: Self.base)])
        cache.fill(customer, [], readAfter: overtaken)
        #expect(cache.issuances(of: customer) == nil)

        // A commit for someone else does not spoil the read.
        let unrelated = cache.ticket()
        cache.committed([Self.signature("n-2", at: Self.base)])
        cache.fill(other, [], readAfter: unrelated)
        #expect(cache.issuances(of: other) == [])

        // A read that began after the commit is kept, and later commits are added to it.
        let later = cache.ticket()
        let read = [LedgerIssuance(offerID: "retain_50", issuedAt: Self.base)]
        cache.fill(customer, read, readAfter: later)
        #expect(cache.issuances(of: customer) == read)
        cache.committed([Self.signature("n-3", offer: "winback_1", at: Self.base.addingTimeInterval(1))])
        #expect(cache.issuances(of: customer)?.map(\.offerID) == ["retain_50", "winback_1"])

        // A fill never replaces what is there, and a clear (an append of unknown outcome)
        // forgets everything and spoils reads begun before it.
        cache.fill(customer, [], readAfter: cache.ticket())
        #expect(cache.issuances(of: customer)?.count == 2)
        let beforeClear = cache.ticket()
        cache.clear()
        cache.fill(customer, [], readAfter: beforeClear)
        #expect(cache.issuances(of: customer) == nil)
        #expect(cache.issuances(of: other) == nil)
    }

    @Test("The cache keeps at most its capacity: when full, it starts over")
    func boundedCache() {
        let cache = LedgerCache(capacity: 3)
        let customers = (0..<4).map { LedgerCache.Customer(bundleID: Self.bundle, appAccountToken: "customer-\($0)") }
        for customer in customers.prefix(3) { cache.fill(customer, [], readAfter: cache.ticket()) }
        #expect(customers.prefix(3).filter { cache.issuances(of: $0) != nil }.count == 3)
        cache.fill(customers[3], [], readAfter: cache.ticket())
        #expect(customers.allSatisfy { cache.issuances(of: $0) == nil })
    }

    @Test("A withdrawn signature leaves the ledger (and the SQLite cache) at once; its audit record stays", arguments: StoreBackend.testedCases)
    func withdrawnSignatureLeavesTheLedger(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            _ = try await store.appendAudit([Self.signature("w-1", at: Self.base), Self.signature("w-2", offer: "winback_1", at: Self.base.addingTimeInterval(1))], at: Self.base)
            // Read once, so the SQLite store answers the next read from its cache unless the withdrawal clears it.
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle).count == 2)
            #expect(try await store.withdrawIssuedSignatures(nonces: ["w-1"]) == 1)
            #expect(try await store.withdrawIssuedSignatures(nonces: ["w-1", "never-issued"]) == 0, "nothing left to remove")
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle).map(\.offerID) == ["winback_1"])
            #expect(try await store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundle).map(\.signature.nonce) == ["w-2"])
            let fresh = try await fixture.openAnother()
            #expect(try await fresh.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle).map(\.offerID) == ["winback_1"])
            await fresh.close()
            #expect(try await store.auditRecords(after: 0, limit: 10).filter { $0.kind == "signature.issued" }.count == 2, "the chain keeps both records")
            #expect(try await store.verifiedChain().isIntact)
        }
    }
}
