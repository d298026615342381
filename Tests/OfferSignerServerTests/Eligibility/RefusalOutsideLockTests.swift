import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import TestChildProcess
import TestPostgres
import Testing
import SwiftASN1
import X509

/// A refused decision adds nothing to the ledger the rules count, so its audit record is committed
/// after the customer's lock is given back: a slow commit keeps no lock place (a pooled
/// PostgreSQL connection) and no customer waiting. An issuance still holds its customer's lock
/// until its records are committed (the next decision must count its signature).
@Suite(
    "A refusal's audit commit holds no customer lock; an issuance's does (PostgreSQL)", .serialized,
    .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct RefusalOutsideLockTests {
    static let bundleID = "com.example.app"

    @Test("With the audit chain's head row locked: a refused customer's request waits for its commit with no customer lock held; a lapsed customer's waits holding its lock; once the head is free, 403 and 201, both decisions audited")
    func refusalCommitsAfterTheLock() async throws {
        let chain = try TestAppleChain()
        let now = Date()
        try await StoreFixture.with(.postgres, poolSize: 6) { fixture in
            let store = fixture.store
            let database = try #require(fixture.database)
            // A current subscriber (not eligible for a win-back offer) and one who lapsed about two
            // months ago (eligible), as Apple's API states them (status 1 active, 2 expired).
            let subscriber = SubscriptionFixture(
                bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "610000001",
                appAccountToken: UUID().uuidString.lowercased(), periodStarts: SubscriptionFixture.monthlyStarts(count: 3, activeAt: now))
            let lapsed = SubscriptionFixture(
                bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "620000001",
                appAccountToken: UUID().uuidString.lowercased(),
                periodStarts: SubscriptionFixture.monthlyStarts(count: 3, activeAt: now.addingTimeInterval(-75 * 86_400)))
            try await fixture.withAppleBackedServer(
                keyID: "REFUSAL001", chain: chain, storeTimeout: .seconds(60),
                prepare: { fake in
                    fake.add(try subscriber.customer(chain, now: now, status: 1))
                    fake.add(try lapsed.customer(chain, now: now, status: 2))
                }
            ) { port, secret, _ in
                let ask = { (customer: SubscriptionFixture, answered: AuditHeadLock.Answered) in
                    Task {
                        defer { answered.set() }
                        return try await onOwnThread {
                            try RawSocket.request(
                                port: port, method: "POST", path: "/v1/offers/signatures",
                                headers: ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"],
                                body: #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(customer.appAccountToken!)","transactionID":"\#(customer.originalTransactionID)"}"#,
                                timeout: .seconds(120))
                        }
                    }
                }

                // Every group commit moves the chain's head: with its row locked, none can end.
                try await AuditHeadLock.holding(database: database.name) { head in
                    let refusalAnswered = AuditHeadLock.Answered()
                    let refused = ask(subscriber, refusalAnswered)
                    let refusalWaiting = try await AuditHeadLock.poll(within: .seconds(60)) {
                        try await AuditHeadLock.commitsWaiting(in: database.name) >= 1
                    }
                    #expect(refusalWaiting, "the refusal's audit commit never reached the database")
                    // Its commit is waiting now, and stays waiting while the head is locked:
                    // the lock it was decided under is given back (the unlock is sent by the
                    // lock's holder as the decision ends, so it may reach the database just
                    // after the commit does) and stays so.
                    let lockGivenBack = try await AuditHeadLock.poll(within: .seconds(30)) {
                        try await AuditHeadLock.customerLocks(in: database.name) == 0
                    }
                    #expect(lockGivenBack, "a customer lock was held while the refusal's record waited for its commit")
                    try await Task.sleep(for: .milliseconds(500))
                    let locksDuringRefusal = try await AuditHeadLock.customerLocks(in: database.name)
                    #expect(locksDuringRefusal == 0, "a customer lock was taken again while the refusal's record waited: \(String(describing: locksDuringRefusal))")
                    #expect(try await AuditHeadLock.commitsWaiting(in: database.name) >= 1, "the refusal's commit ended with the head locked")

                    // The contrast, and proof the lock is seen: an issuance keeps its lock until
                    // its records are committed (they wait behind the refusal's group).
                    let issued = ask(lapsed, AuditHeadLock.Answered())
                    let issuanceHolding = try await AuditHeadLock.poll(within: .seconds(60)) {
                        try await AuditHeadLock.customerLocks(in: database.name) == 1
                    }
                    #expect(issuanceHolding, "the issuance never held its customer's lock")
                    try await Task.sleep(for: .milliseconds(500))
                    #expect(try await AuditHeadLock.customerLocks(in: database.name) == 1, "the issuance gave its lock back before its commit")

                    // Its 403 waits for the commit: the audit first.
                    #expect(!refusalAnswered.isSet, "the refusal was answered before its record was committed")
                    try await head.release()
                    let refusal = try await refused.value
                    #expect(refusal.status == 403 && refusal.json["code"] as? String == "not_eligible", "\(refusal.status) \(refusal.body)")
                    let issuance = try await issued.value
                    #expect(issuance.status == 201, "\(issuance.status) \(issuance.body)")
                }
                // Both decisions are in the audit, the refusal's before its 403 was sent.
                let decisions = try await store.auditRecords(after: 0, limit: 100).filter { $0.kind == "eligibility.decided" }
                #expect(decisions.count == 2, "\(decisions.map(\.body))")
                #expect(decisions.contains { $0.body.contains(subscriber.appAccountToken!) && $0.body.contains(#""eligible":false"#) }, "\(decisions.map(\.body))")
                // The issuance's unlock is sent as its decision ends, and may follow its 201.
                let allGivenBack = try await AuditHeadLock.poll(within: .seconds(30)) {
                    try await AuditHeadLock.customerLocks(in: database.name) == 0
                }
                #expect(allGivenBack, "a customer lock was still held after both answers")
            }
        }
    }
}
