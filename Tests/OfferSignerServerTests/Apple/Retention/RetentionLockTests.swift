import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerServer
import OfferSignerStorage
import TestPostgres
import Testing

/// A Retention Messaging answer without an offer adds nothing to the ledger the rules count (its
/// `retention.answered` record carries no signature), so that record is committed after the
/// customer's lock is given back: on PostgreSQL a slow commit keeps no lock place (a pooled
/// connection). An answer with an offer holds the lock through its commit (a late commit is
/// withdrawn under it). Either answer leaves only once its record is committed.
@Suite(
    "Retention Messaging: an answer without an offer is committed after the customer lock (PostgreSQL)", .serialized,
    .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct RetentionLockTests {
    @Test("With the audit chain's head row locked: the fallback's commit waits with no customer lock held and nothing answered; an offer's waits holding its lock; once the head is free, the fallback and the offer, both answers audited")
    func fallbackCommitsAfterTheLock() async throws {
        // A budget longer than every wait below, so no answer is the deadline's.
        try await RetentionHarness.run(.postgres, poolSize: 6, catalog: RetentionDeadlineTests.catalog(port:), configure: { $0.retention.budget = .seconds(90) }) { h in
            let database = try #require(h.fixture.database)
            // Two paid months (the offer asks for three): the fallback. Six: the offer.
            let short = h.subscriber(months: 2, id: "700000001", token: "22222222-aaaa-4aaa-8aaa-000000000001")
            let long = h.subscriber(months: 6, id: "700000002", token: "22222222-aaaa-4aaa-8aaa-000000000002")
            try await h.notify(short)
            try await h.notify(long)
            let shortID = UUID().uuidString.lowercased()
            let longID = UUID().uuidString.lowercased()
            let shortBody = try h.request(short.originalTransactionID, requestIdentifier: shortID)
            let longBody = try h.request(long.originalTransactionID, requestIdentifier: longID)
            let ask = { (body: String, answered: AuditHeadLock.Answered) in
                Task {
                    defer { answered.set() }
                    return try await h.postConcurrently(body)
                }
            }

            try await AuditHeadLock.holding(database: database.name) { head in
                let fallbackAnswered = AuditHeadLock.Answered()
                let fallback = ask(shortBody, fallbackAnswered)
                let waiting = try await AuditHeadLock.poll(within: .seconds(20)) {
                    try await AuditHeadLock.commitsWaiting(in: database.name) >= 1
                }
                #expect(waiting, "the fallback's audit commit never reached the database")
                let givenBack = try await AuditHeadLock.poll(within: .seconds(10)) {
                    try await AuditHeadLock.customerLocks(in: database.name) == 0
                }
                #expect(givenBack, "a customer lock was held while the fallback's record waited for its commit")
                try await Task.sleep(for: .milliseconds(300))
                let locks = try await AuditHeadLock.customerLocks(in: database.name)
                #expect(locks == 0, "a customer lock was taken again while the fallback's record waited: \(String(describing: locks))")

                // The contrast: an offer's commit keeps its customer's lock.
                let offer = ask(longBody, AuditHeadLock.Answered())
                let holding = try await AuditHeadLock.poll(within: .seconds(20)) {
                    try await AuditHeadLock.customerLocks(in: database.name) == 1
                }
                #expect(holding, "the offer's decision never held its customer's lock")
                #expect(!fallbackAnswered.isSet, "the fallback was answered before its record was committed")

                try await head.release()
                let fallbackAnswer = try await fallback.value
                #expect(fallbackAnswer.status == .ok && Array(fallbackAnswer.json.keys) == ["message"], "\(fallbackAnswer.status) \(fallbackAnswer.text)")
                let offerAnswer = try await offer.value
                #expect(offerAnswer.status == .ok && Array(offerAnswer.json.keys) == ["promotionalOffer"], "\(offerAnswer.status) \(offerAnswer.text)")
            }
            let answered = try await h.audited("retention.answered")
            let fallbackRecord = answered.first { $0["requestIdentifier"] as? String == shortID }
            #expect(fallbackRecord?["answer"] as? String == "fallback", "\(answered)")
            #expect(answered.first { $0["requestIdentifier"] as? String == longID }?["answer"] as? String == "promotionalOffer", "\(answered)")
            let allGivenBack = try await AuditHeadLock.poll(within: .seconds(10)) {
                try await AuditHeadLock.customerLocks(in: database.name) == 0
            }
            #expect(allGivenBack, "a customer lock was still held after both answers")
            #expect(try await h.store.verifiedChain().isIntact)
        }
    }
}
