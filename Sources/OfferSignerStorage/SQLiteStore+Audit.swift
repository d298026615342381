import Foundation
import GRDB
import GRDBSQLite
import OfferSignerCore
import Synchronization

/// The hash-chained audit log on SQLite and the issued-signature ledger written with it.
extension SQLiteStore {
    static func record(from row: Row) throws -> AuditRecord {
        let table = "audit_log"
        return AuditRecord(
            sequence: try row.column("seq", table), recordedAt: date(try row.column("recorded_at", table) as Int64),
            kind: try row.column("kind", table), body: try row.column("body", table),
            previousHash: try row.column("previous_hash", table), hash: try row.column("hash", table))
    }

    /// Appends audit entries inside an open write transaction; returns the stored records.
    static func appendAudit(_ db: Database, _ batch: [AuditAppend], at time: Date) throws -> [AuditRecord] {
        let head = try Row.fetchOne(db.cachedStatement(sql: "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1"))
        var sequence: Int64 = head?["seq"] ?? 0
        var previousHash: String = head?["hash"] ?? AuditChain.genesisHash
        let recordedAt = Date(timeIntervalSince1970: Double(time.unixMilliseconds) / 1000)
        var records: [AuditRecord] = []
        records.reserveCapacity(batch.count)
        let insertAudit = try db.cachedStatement(sql: "INSERT INTO audit_log (seq, recorded_at, kind, body, previous_hash, hash) VALUES (?, ?, ?, ?, ?, ?)")
        let insertSignature = try db.cachedStatement(sql: """
            INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format,
                original_transaction_id, environment, environment_declared)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """)
        for append in batch {
            sequence += 1
            let hash = AuditChain.hash(previousHash: previousHash, sequence: sequence, recordedAt: recordedAt, kind: append.entry.kind, body: append.entry.body)
            var row = DirectInsert(insertAudit)
            row.bind(sequence)
            row.bind(recordedAt.unixMilliseconds)
            row.bind(append.entry.kind)
            row.bind(append.entry.body)
            row.bind(previousHash)
            row.bind(hash)
            try row.run(db)
            for signature in append.signatures {
                var row = DirectInsert(insertSignature)
                row.bind(signature.nonce)
                row.bind(sequence)
                row.bind(signature.issuedAt.unixMilliseconds)
                row.bind(signature.client)
                row.bind(signature.bundleID)
                row.bind(signature.productID)
                row.bind(signature.offerID)
                row.bind(signature.appAccountToken)
                row.bind(signature.keyID)
                row.bind(signature.format)
                row.bind(signature.originalTransactionID)
                row.bind(signature.environment)
                row.bind(Int64(signature.environmentIsDeclared ? 1 : 0))
                do {
                    try row.run(db)
                } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_PRIMARYKEY {
                    throw StoreError(.duplicate, "nonce \(signature.nonce) was issued before; nonces are never reused")
                }
            }
            records.append(AuditRecord(sequence: sequence, recordedAt: recordedAt, kind: append.entry.kind, body: append.entry.body, previousHash: previousHash, hash: hash))
            previousHash = hash
        }
        // The roll-up, in the same transaction: one UPSERT per day, app, offer and client of the group.
        try rollUp(db, batch.lazy.flatMap(\.signatures))
        return records
    }

    /// Runs `body` in an IMMEDIATE transaction whose BEGIN and COMMIT are cached statements:
    /// the audit committer runs one per group commit, and GRDB's `write` prepares both anew each
    /// time. Rolls back when `body` or the commit throws.
    static func inAuditTransaction<T>(_ db: Database, _ body: () throws -> T) throws -> T {
        try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        do {
            let result = try body()
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
            return result
        } catch {
            if db.isInsideTransaction { try? db.rollback() }
            throw error
        }
    }

    public func appendAudit(_ batch: [AuditAppend], at time: Date) async throws -> [AuditRecord] {
        try await pool.writeWithoutTransaction { db in self.restartLogIfRequested(db) }
        do {
            let records = try await write { db in try Self.appendAudit(db, batch, at: time) }
            ledgerCache.committed(batch)
            return records
        } catch {
            ledgerCache.clear()
            throw error
        }
    }

    public func appendAuditBlocking(_ batch: [AuditAppend], at time: Date) throws -> [AuditRecord] {
        do {
            let records = try pool.writeWithoutTransaction { db in
                restartLogIfRequested(db)
                return try Self.inAuditTransaction(db) {
                    try checkServingFilesInPlace()
                    return try Self.appendAudit(db, batch, at: time)
                }
            }
            ledgerCache.committed(batch)
            return records
        } catch {
            ledgerCache.clear()
            if let error = error as? StoreError { throw error }
            throw StoreError(.unavailable, "store write failed: \(Self.describe(error))")
        }
    }

    public func withdrawIssuedSignatures(nonces: [String]) async throws -> Int {
        guard !nonces.isEmpty else { return 0 }
        defer {
            // After the delete committed: a read that began before it is then never cached.
            ledgerCache.clear()
        }
        return try await write { db in
            var removed = 0
            var days = Set<IssuanceRollUp.Day>()
            for nonce in nonces {
                if let row = try Row.fetchOne(db, sql: "SELECT issued_at, bundle_id, offer_id, client FROM issued_signatures WHERE nonce = ?", arguments: [nonce]) {
                    let issuedAt: Int64 = row["issued_at"]
                    days.insert(IssuanceRollUp.Day(day: issuedAt / DashboardSchema.dayMilliseconds, bundleID: row["bundle_id"], offerID: row["offer_id"], client: row["client"]))
                }
                try db.execute(sql: "DELETE FROM issued_signatures WHERE nonce = ?", arguments: [nonce])
                removed += db.changesCount
            }
            // The roll-up loses what was withdrawn (the day counted again, in this transaction).
            try Self.recount(db, days)
            return removed
        }
    }

    public func auditRecords(after sequence: Int64, limit: Int) async throws -> [AuditRecord] {
        try await read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?", arguments: [sequence, limit]).map { try Self.record(from: $0) }
        }
    }

    public func auditHead() async throws -> (count: Int64, hash: String) {
        let (count, hash) = try await read { db -> (Int64, String) in
            let row = try Row.fetchOne(db, sql: "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")
            return (row?["seq"] ?? 0, row?["hash"] ?? AuditChain.genesisHash)
        }
        return (count, hash)
    }

    public func issuedSignatures(appAccountToken: String, bundleID: String) async throws -> [IssuedSignatureRecord] {
        try pointRead { db in
            // A cached statement: compiled once per reader connection, not per request.
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT * FROM issued_signatures WHERE app_account_token = ? AND bundle_id = ? ORDER BY issued_at"),
                arguments: [appAccountToken, bundleID]
            ).map { row in
                IssuedSignatureRecord(
                    signature: IssuedSignature(
                        nonce: try row.column("nonce", "issued_signatures"), issuedAt: Self.date(try row.column("issued_at", "issued_signatures") as Int64),
                        client: try row.column("client", "issued_signatures"), bundleID: try row.column("bundle_id", "issued_signatures"),
                        productID: try row.column("product_id", "issued_signatures"), offerID: try row.column("offer_id", "issued_signatures"),
                        appAccountToken: try row.column("app_account_token", "issued_signatures"),
                        keyID: try row.column("key_id", "issued_signatures"), format: try row.column("format", "issued_signatures"),
                        originalTransactionID: try row.column("original_transaction_id", "issued_signatures"),
                        environment: try row.column("environment", "issued_signatures"),
                        environmentIsDeclared: (try row.column("environment_declared", "issued_signatures") as Int64) != 0),
                    auditSequence: try row.column("audit_seq", "issued_signatures"))
            }
        }
    }

    /// From `ledgerCache` once the customer's issuances were read (or none were ever issued here
    /// and read as such); from the database otherwise.
    public func ledgerIssuances(appAccountToken: String, bundleID: String) async throws -> [LedgerIssuance] {
        let customer = LedgerCache.Customer(bundleID: bundleID, appAccountToken: appAccountToken)
        if let cached = ledgerCache.issuances(of: customer) { return cached }
        let ticket = ledgerCache.ticket()
        let issuances = try readLedgerIssuances(appAccountToken: appAccountToken, bundleID: bundleID)
        ledgerCache.fill(customer, issuances, readAfter: ticket)
        return issuances
    }

    func readLedgerIssuances(appAccountToken: String, bundleID: String) throws -> [LedgerIssuance] {
        try pointRead { db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(
                    sql: "SELECT DISTINCT offer_id, issued_at FROM issued_signatures WHERE app_account_token = ? AND bundle_id = ? AND client <> ? AND format <> ? ORDER BY issued_at"),
                arguments: [appAccountToken, bundleID, LedgerIssuance.pageViewClient, LedgerIssuance.introEligibilityFormat])
            var issuances: [LedgerIssuance] = []
            while let row = try rows.next() {
                // By position: the columns are the two selected (a lookup by name costs more than the read).
                let offerID: String
                let issuedAt: Int64
                do {
                    offerID = try row.decode(String.self, atIndex: 0)
                    issuedAt = try row.decode(Int64.self, atIndex: 1)
                } catch {
                    throw StoreError(.unavailable, "issued_signatures holds an offer or a time of the wrong type (was the store edited by hand?)")
                }
                issuances.append(LedgerIssuance(offerID: offerID, issuedAt: Self.date(issuedAt)))
            }
            return issuances
        }
    }

    /// Walks the whole audit chain with a streaming cursor, calling `progress` every
    /// `progressInterval` records. Returns the walker's final state.
    public func verifyAuditChain(progressInterval: Int64 = 100_000, progress: @escaping @Sendable (Int64) -> Void = { _ in }) async throws -> AuditChain.Walker {
        try await read { db in
            var walker = AuditChain.Walker()
            let cursor = try Row.fetchCursor(db, sql: "SELECT seq, recorded_at, kind, body, previous_hash, hash FROM audit_log ORDER BY seq")
            while let row = try cursor.next() {
                guard walker.check(try Self.record(from: row)) else { break }
                if walker.count % progressInterval == 0 { progress(walker.count) }
            }
            return walker
        }
    }
}
