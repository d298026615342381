import Foundation
import GRDB
import OfferSignerCore

/// Signed audit checkpoints and the audit-signing key in SQLite (schema "v2").
extension SQLiteStore {
    static func migrateAuditCheckpoints(_ db: Database) throws {
        try db.execute(sql: """
            CREATE TABLE audit_signing_key (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                public_key_pem TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                sealed_private_key BLOB NOT NULL,
                created_at INTEGER NOT NULL
            );
            CREATE TABLE audit_checkpoints (
                seq INTEGER PRIMARY KEY,
                head_hash TEXT NOT NULL,
                created_at INTEGER NOT NULL,
                key_fingerprint TEXT NOT NULL,
                signature TEXT NOT NULL
            );
            """)
    }

    private static func checkpoint(from row: Row) -> AuditCheckpoint {
        AuditCheckpoint(
            sequence: row["seq"], headHash: row["head_hash"], createdAt: Date(timeIntervalSince1970: Double(row["created_at"] as Int64) / 1000),
            keyFingerprint: row["key_fingerprint"], signature: row["signature"])
    }

    public func auditSigningKey(masterKey: MasterKey) async throws -> AuditSigningKey {
        try await bindMasterKey(masterKey)
        let key = AuditSigningKey.derived(from: masterKey)
        let sealed = key.sealed(with: masterKey)
        return try await write { db in
            try Self.storeDerivedAuditKeyIfFresh(db, key: key, sealed: sealed, refuse: true)
            return key
        }
    }

    /// Checks the stored audit-signing key row against `key` (see
    /// ``AuditSigningKey/checkStored(publicKeyPEM:auditRecords:hasCheckpoints:)``) and writes it
    /// for a store with no audit record and no checkpoint. `refuse` false: a store the key does
    /// not fit is left as it is, without an error (binding the master key).
    static func storeDerivedAuditKeyIfFresh(_ db: Database, key: AuditSigningKey, sealed: Data, refuse: Bool) throws {
        var pem = try String.fetchOne(db, sql: "SELECT public_key_pem FROM audit_signing_key WHERE id = 1")
        let records = try Int64.fetchOne(db, sql: "SELECT COALESCE(MAX(seq), 0) FROM audit_log") ?? 0
        let hasCheckpoints = try Row.fetchOne(db, sql: "SELECT 1 FROM audit_checkpoints LIMIT 1") != nil
        if records == 0 && !hasCheckpoints, let stored = pem, stored != key.publicKey.pem {
            // A key an earlier offer-signer generated before anything was signed: replaced.
            try db.execute(sql: "DELETE FROM audit_signing_key")
            pem = nil
        }
        let missing: Bool
        if refuse {
            missing = try key.checkStored(publicKeyPEM: pem, auditRecords: records, hasCheckpoints: hasCheckpoints)
        } else {
            guard let checked = try? key.checkStored(publicKeyPEM: pem, auditRecords: records, hasCheckpoints: hasCheckpoints) else { return }
            missing = checked
        }
        if missing {
            try db.execute(
                sql: "INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at) VALUES (1, ?, ?, ?, ?)",
                arguments: [key.publicKey.pem, key.publicKey.fingerprint, sealed, Date().unixMilliseconds])
        }
    }

    public func replaceAuditSigningKey(_ key: AuditSigningKey, masterKey: MasterKey, resigned: [AuditCheckpoint], entry: AuditEntry) async throws {
        let sealed = key.sealed(with: masterKey)
        try await write { db in
            try db.execute(sql: "DELETE FROM audit_signing_key")
            try db.execute(
                sql: "INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at) VALUES (1, ?, ?, ?, ?)",
                arguments: [key.publicKey.pem, key.publicKey.fingerprint, sealed, Date().unixMilliseconds])
            try db.execute(sql: "DELETE FROM audit_checkpoints")
            for checkpoint in resigned {
                try db.execute(
                    sql: "INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature) VALUES (?, ?, ?, ?, ?)",
                    arguments: [checkpoint.sequence, checkpoint.headHash, checkpoint.createdAt.unixMilliseconds, checkpoint.keyFingerprint, checkpoint.signature])
            }
            _ = try Self.appendAudit(db, [AuditAppend(entry: entry)], at: Date())
        }
    }

    public func auditSigningPublicKey() async throws -> AuditSigningPublicKey? {
        let pem = try await read { db in try String.fetchOne(db, sql: "SELECT public_key_pem FROM audit_signing_key WHERE id = 1") }
        return try pem.map { pem throws(StoreError) in try AuditSigningPublicKey(pem: pem) }
    }

    public func appendCheckpoint(_ checkpoint: AuditCheckpoint) async throws -> Bool {
        try await write { db in
            if let existing = try String.fetchOne(db, sql: "SELECT head_hash FROM audit_checkpoints WHERE seq = ?", arguments: [checkpoint.sequence]) {
                guard existing == checkpoint.headHash else {
                    throw StoreError(.conflict, "a checkpoint of \(checkpoint.sequence) records with another head hash exists already")
                }
                return false
            }
            try db.execute(
                sql: "INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature) VALUES (?, ?, ?, ?, ?)",
                arguments: [checkpoint.sequence, checkpoint.headHash, checkpoint.createdAt.unixMilliseconds, checkpoint.keyFingerprint, checkpoint.signature])
            return true
        }
    }

    public func checkpoints() async throws -> [AuditCheckpoint] {
        try await read { db in try Row.fetchAll(db, sql: "SELECT * FROM audit_checkpoints ORDER BY seq").map(Self.checkpoint(from:)) }
    }

    public func latestCheckpoint() async throws -> AuditCheckpoint? {
        try await read { db in try Row.fetchOne(db, sql: "SELECT * FROM audit_checkpoints ORDER BY seq DESC LIMIT 1").map(Self.checkpoint(from:)) }
    }

    /// Verifies the whole audit chain with a streaming cursor against checkpoints: `trusted`
    /// (an off-machine export, checked with its own key) first, then the store's own
    /// checkpoints with the store's key — which must be the trusted key when one is given.
    /// Calls `progress` every `progressInterval` records.
    public func verifyAudit(
        trusted: AuditCheckpointSet? = nil, progressInterval: Int64 = 100_000, progress: @escaping @Sendable (Int64) -> Void = { _ in }
    ) async throws -> AuditVerificationReport {
        var sets: [AuditCheckpointSet] = []
        if let trusted { sets.append(trusted) }
        let storedKey = try await auditSigningPublicKey()
        let storeSet = AuditCheckpointSet(origin: "the store", publicKey: storedKey, checkpoints: try await checkpoints())
        let storeProblems = AuditVerification.storeProblems(trusted: trusted, store: storeSet)
        sets.append(storeSet)
        let checkpointSets = sets
        var report = try await read { db in
            let verifier = try Self.walkAudit(
                db, from: AuditVerification.Verifier(checkpoints: checkpointSets), through: nil,
                progressInterval: progressInterval, progress: progress)
            return verifier.finish()
        }
        report.checkpointProblems.insert(contentsOf: storeProblems, at: 0)
        return report
    }

    public func continueAuditVerification(_ verifier: AuditVerification.Verifier, through sequence: Int64) async throws -> AuditVerification.Verifier {
        try await read { db in try Self.walkAudit(db, from: verifier, through: sequence, progressInterval: .max, progress: { _ in }) }
    }

    /// Feeds the records after `verifier.count` (through `last`, or to the end when nil) to
    /// `verifier` with a streaming cursor in one read transaction, stopping at the first bad
    /// one. Rows are read as plain columns (no `AuditRecord`, no `Date` round trip).
    static func walkAudit(
        _ db: Database, from verifier: AuditVerification.Verifier, through last: Int64?,
        progressInterval: Int64, progress: @Sendable (Int64) -> Void
    ) throws -> AuditVerification.Verifier {
        var verifier = verifier
        let cursor = try Row.fetchCursor(
            db, sql: "SELECT seq, recorded_at, kind, body, previous_hash, hash FROM audit_log WHERE seq > ? AND seq <= ? ORDER BY seq",
            arguments: [verifier.count, last ?? Int64.max])
        var untilProgress = progressInterval
        while let row = try cursor.next() {
            // Optional reads: a NULL written behind the store's back is reported, never a trap.
            let sequence: Int64? = row[0]
            guard let sequence, let millis: Int64 = row[1], let kind: String = row[2], let body: String = row[3],
                let previousHash: String = row[4], let hash: String = row[5]
            else {
                verifier.reject(sequence: sequence, reason: "a column is NULL (the row was edited)")
                break
            }
            guard verifier.check(sequence: sequence, recordedAtMillis: millis, kind: kind, body: body, previousHash: previousHash, hash: hash) else { break }
            untilProgress -= 1
            if untilProgress == 0 {
                untilProgress = progressInterval
                progress(verifier.count)
            }
        }
        return verifier
    }
}
