import Foundation
import GRDB
import OfferSignerCore
@testable import OfferSignerStorage
import Testing

/// Upgrading a SQLite store that already has issuances: migration "v9-issuance-days" fills the
/// daily roll-up from the ledger (a request's formats counted once) and drops the ledger's
/// covering time index; signatures appended afterwards add to it.
@Suite("SQLite v9-issuance-days: the roll-up filled from an existing ledger")
struct IssuanceRollUpMigrationTests {
    @Test("A store at v7-dashboard with ledger rows opens with a roll-up equal to the ledger's count, and without issued_by_time")
    func fillsFromTheLedger() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("rollup-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        let day: Int64 = 86_400_000
        let noon = (Int64(Date().timeIntervalSince1970 * 1000) / day) * day + day / 2
        do {
            let queue = try DatabaseQueue(path: path)
            try SQLiteStore.migrator.migrate(queue, upTo: "v7-dashboard")
            try await queue.write { db in
                // One request in two formats, another today by another client, one yesterday.
                for (nonce, at, client, format) in [
                    ("m1", noon, "client:backend", "legacy"), ("m2", noon, "client:backend", "jws"), ("m3", noon + 60_000, "client:other", "legacy"),
                    ("m4", noon - day, "client:backend", "legacy"),
                ] {
                    try db.execute(
                        sql: """
                            INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format)
                            VALUES (?, 0, ?, ?, 'com.example.app', 'pro.monthly', 'A', 'tok-1', 'KEY1234567', ?)
                            """, arguments: [nonce, at, client, format])
                }
            }
            try queue.close()
        }
        let store = try SQLiteStore(path: path)
        let today = noon / day
        let perDay = try await store.offerIssuancesPerDay(since: .distantPast)
        #expect(
            perDay == [
                OfferIssuanceDay(bundleID: "com.example.app", offerID: "A", day: today - 1, issuances: 1),
                OfferIssuanceDay(bundleID: "com.example.app", offerID: "A", day: today, issuances: 2),
            ], "\(perDay)")
        #expect(OfferIssuanceDay.totals(perDay) == (try await store.offerIssuances(since: nil)))
        #expect(
            try await store.lastIssuances(clients: ["client:backend", "client:other"], since: .distantPast)
                == ["client:backend": Date(timeIntervalSince1970: Double(noon) / 1000), "client:other": Date(timeIntervalSince1970: Double(noon + 60_000) / 1000)])
        let indexes = try await store.read { db in
            try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'issued_signatures'")
        }
        #expect(!indexes.contains("issued_by_time") && indexes.contains("issued_by_offer"), "\(indexes)")

        // A signature appended after the upgrade adds to the filled day.
        let signature = IssuedSignature(
            nonce: "m5", issuedAt: Date(timeIntervalSince1970: Double(noon + 120_000) / 1000), client: "client:backend", bundleID: "com.example.app",
            productID: "pro.monthly", offerID: "A", appAccountToken: "tok-2", keyID: "KEY1234567", format: "legacy")
        _ = try await store.appendAudit([AuditAppend(entry: signature.auditEntry, signatures: [signature])], at: signature.issuedAt)
        let after = try await store.offerIssuancesPerDay(since: .distantPast)
        #expect(after.last == OfferIssuanceDay(bundleID: "com.example.app", offerID: "A", day: today, issuances: 3), "\(after)")
        #expect(OfferIssuanceDay.totals(after) == (try await store.offerIssuances(since: nil)))
    }
}
