import Foundation
import OfferSignerPostgres
import OfferSignerStorage
import TestPostgres
import Testing

/// A decision under a customer's lock: on PostgreSQL the lock and the reads the decision makes
/// first (the customer's ledger, the stored history's versions) are one round trip (the
/// `offer_signer_customer_decision` function); the lock still serialises the decisions.
@Suite("Customer lock with its decision's reads")
struct CustomerDecisionLockTests {
    static let bundleID = "com.example.app"
    static let token = "6b29fc40-ca47-1067-b31d-00dd010662da"

    @Test(
        "Under REPEATABLE READ the function refuses to run (its reads would miss the previous holder's commit); the store's own connections ask for READ COMMITTED and decide",
        .enabled(if: TestPostgres.isEnabled, "no PostgreSQL"))
    func refusesAnotherIsolationLevel() async throws {
        try await StoreFixture.with(.postgres) { fixture in
            let name = fixture.database!.name
            // The database's default, as a pooler that dropped the start-up parameter would leave it.
            try await fixture.execute("ALTER DATABASE \"\(name)\" SET default_transaction_isolation = 'repeatable read'")
            let call = "SELECT count(*) FROM offer_signer_customer_decision(1, 2, '1000', 'b', 'c', 'p', 'f', ARRAY[]::text[], NULL)"
            await #expect {
                try await TestPostgres.execute(call, database: name)
            } throws: { error in
                String(describing: error).contains("needs READ COMMITTED") && String(describing: error).contains("repeatable read")
            }
            // A new instance's connections (the start-up parameter) still take the lock and read.
            let another = try await fixture.openAnother()
            let lock = StoreLock.customer(bundleID: Self.bundleID, appAccountToken: Self.token)
            let ledger = try await another.withExclusiveLock(lock, timeout: .seconds(10), readingHistory: nil) {
                try await another.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundleID)
            }
            #expect(ledger.isEmpty)
            await another.close()
        }
    }

    @Test(
        "The body's first ledger and history-version reads are answered from the lock's own round trip (what was committed when the lock was granted); later reads go to the database",
        .enabled(if: TestPostgres.isEnabled, "no PostgreSQL"))
    func readsComeWithTheLock() async throws {
        try await StoreFixture.with(.postgres) { fixture in
            let store = fixture.store
            let first = AuditAppendTests.signature(token: Self.token, offerID: "WINBACK50")
            _ = try await store.appendAudit([AuditAppend(entry: first.auditEntry, signatures: [first])], at: Date())
            try await fixture.execute(
                """
                INSERT INTO apple_subscriptions (bundle_id, environment, original_transaction_id, complete, updated_at)
                VALUES ('\(Self.bundleID)', 'Production', '1000000000000001', 1, 1790000000000)
                """)
            try await fixture.execute(
                """
                INSERT INTO apple_transactions (bundle_id, environment, transaction_id, original_transaction_id, signed_date, decoded, jws)
                VALUES ('\(Self.bundleID)', 'Production', '1000000000000007', '1000000000000001', 0, '{}', 'x')
                """)
            let history = CustomerLockHistoryRead(transactionID: "1000000000000007", environments: ["Sandbox", "Production"])
            let lock = StoreLock.customer(bundleID: Self.bundleID, appAccountToken: Self.token)
            try await store.withExclusiveLock(lock, timeout: .seconds(30), readingHistory: history) {
                // Committed by another connection after the lock was granted: the lock's reads
                // came before, a read made now would see it.
                let second = AuditAppendTests.signature(token: Self.token, offerID: "RETURN20")
                _ = try await store.appendAudit([AuditAppend(entry: second.auditEntry, signatures: [second])], at: Date())
                try await fixture.execute("UPDATE apple_subscriptions SET updated_at = 1790000000999")

                let ledger = try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundleID)
                #expect(ledger.map(\.offerID) == ["WINBACK50"])
                let production = try await store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: "1000000000000007")
                #expect(production?.subscription.originalTransactionID == "1000000000000001")
                #expect(production?.isComplete == true)
                #expect(production?.updatedAt == Date(timeIntervalSince1970: 1_790_000_000))
                #expect(try await store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Sandbox", transactionID: "1000000000000007") == nil)

                // Each answer is handed out once: the same reads again see the database now.
                let again = try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundleID)
                #expect(Set(again.map(\.offerID)) == ["WINBACK50", "RETURN20"])
                let now = try await store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: "1000000000000007")
                #expect(now?.updatedAt == Date(timeIntervalSince1970: 1_790_000_000.999))
                // Another customer's ledger, or a transaction not named, is read from the database.
                #expect(try await store.ledgerIssuances(appAccountToken: "00000000-0000-4000-8000-000000000001", bundleID: Self.bundleID).isEmpty)
                #expect(try await store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: "1000000000000001")?.updatedAt
                    == Date(timeIntervalSince1970: 1_790_000_000.999))
            }
            // Outside the lock, the reads are the database's as before.
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundleID).count == 2)
        }
    }

    @Test(
        "Twenty concurrent decisions for one customer on a one-use offer, over two instances on PostgreSQL: exactly one signature (each waiter's reads see the previous holder's commit)",
        arguments: StoreBackend.testedCases)
    func concurrentDecisionsIssueOnce(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend, poolSize: 6) { fixture in
            let stores: [any OfferSignerStore] = backend == .postgres ? [fixture.store, try await fixture.openAnother(poolSize: 6)] : [fixture.store]
            let lock = StoreLock.customer(bundleID: Self.bundleID, appAccountToken: Self.token)
            let history = CustomerLockHistoryRead(transactionID: "1000000000000007", environments: ["Production"])
            let issued = try await withThrowingTaskGroup(of: Bool.self) { group in
                for index in 0..<20 {
                    let store = stores[index % stores.count]
                    group.addTask {
                        try await store.withExclusiveLock(lock, timeout: .seconds(60), readingHistory: history) { () async throws -> Bool in
                            // The decision: a one-use offer is eligible only while the ledger has none.
                            _ = try await store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: "1000000000000007")
                            let ledger = try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundleID)
                            guard !ledger.contains(where: { $0.offerID == "ONCE" }) else { return false }
                            let signature = AuditAppendTests.signature(token: Self.token, offerID: "ONCE")
                            _ = try await store.appendAudit([AuditAppend(entry: signature.auditEntry, signatures: [signature])], at: Date())
                            return true
                        }
                    }
                }
                return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
            #expect(issued == 1)
            #expect(try await fixture.count("issued_signatures", where: "offer_id = 'ONCE'") == 1)
            for store in stores.dropFirst() { await store.close() }
        }
    }
}
