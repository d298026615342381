import Dispatch
import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO
import Synchronization

/// The audit chain, the ledger and signed checkpoints.
extension PostgresStore {
    /// At most this many ledger rows go into one INSERT (13 parameters each, PostgreSQL allows
    /// 65,535 per statement).
    static let ledgerRowsPerStatement = 5000
    /// At most this many audit rows go into one INSERT (6 parameters each).
    static let auditRowsPerStatement = 10000
    /// Records read per query while walking the chain.
    static let walkPageSize = 10000

    /// Appends audit entries (and their ledger rows) inside an open transaction.
    ///
    /// Rule: the chain head is locked once (`FOR UPDATE` on the one `audit_head` row, a separate
    /// statement so later reads see what the previous holder committed); the whole group is
    /// hashed from it, inserted and the head moved in one prepared statement
    /// (``GroupOnLockedHead``), all before the caller's COMMIT. A reused nonce fails with
    /// `StoreError.duplicate`, naming the nonce.
    static func appendAudit(_ connection: PostgresConnection, _ logger: Logger, _ batch: [AuditAppend], at time: Date) async throws -> [AuditRecord] {
        guard !batch.isEmpty else { return [] }
        guard let head = try await connection.query("SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE", logger: logger).collect().first else {
            throw StoreError(.unavailable, "the audit_head row is missing (was the store edited by hand?)")
        }
        let (records, signatures) = chained(batch, on: try head.decode((Int64, String).self), at: time)
        guard let last = records.last else { return [] }
        do {
            // One statement (one round trip) inserts both and moves the head.
            _ = try await collect(GroupOnLockedHead(records: records, signatures: signatures, head: (last.sequence, last.hash)), on: connection, logger: logger)
        } catch where sqlState(error) == "23505" && constraint(error) == "issued_signatures_pkey" {
            throw StoreError(.duplicate, duplicateNonceMessage(error, signatures.map(\.0.nonce)))
        }
        return records
    }

    /// The records of a group hashed onto `head` (sequence and hash of the last record), and its
    /// ledger rows with the sequence of the record each belongs to.
    static func chained(_ batch: [AuditAppend], on head: (Int64, String), at time: Date) -> ([AuditRecord], [(IssuedSignature, Int64)]) {
        var (sequence, previousHash) = head
        let recordedAt = Date(timeIntervalSince1970: Double(time.unixMilliseconds) / 1000)
        let millis = recordedAt.unixMilliseconds
        var records: [AuditRecord] = []
        records.reserveCapacity(batch.count)
        var signatures: [(IssuedSignature, Int64)] = []
        for append in batch {
            sequence += 1
            let hash = AuditVerification.hash(previousHash: previousHash, sequence: sequence, recordedAtMillis: millis, kind: append.entry.kind, body: append.entry.body)
            records.append(AuditRecord(sequence: sequence, recordedAt: recordedAt, kind: append.entry.kind, body: append.entry.body, previousHash: previousHash, hash: hash))
            for signature in append.signatures { signatures.append((signature, sequence)) }
            previousHash = hash
        }
        return (records, signatures)
    }

    /// A group appended in one statement outside an explicit transaction, hashed onto the head
    /// this process last saw: the statement moves the head only if it is still that one (same
    /// sequence and hash) and inserts the rows only if it moved it. Returns false, having written
    /// nothing, when the head had moved (another instance, or another writer of this one);
    /// PostgreSQL re-checks the condition after waiting for a concurrent holder of the row, so
    /// two appends on one head can never both succeed. One round trip instead of four (BEGIN,
    /// the head's lock, the group, COMMIT); the commit is as durable (`synchronous_commit`).
    static func appendAuditOnKnownHead(
        _ connection: PostgresConnection, _ logger: Logger, records: [AuditRecord], signatures: [(IssuedSignature, Int64)], expected: (Int64, String)
    ) async throws -> Bool {
        guard let last = records.last else { return true }
        let statement = GroupOnKnownHead(records: records, signatures: signatures, head: (last.sequence, last.hash), expected: expected)
        do {
            return try await collect(statement, on: connection, logger: logger).first == 1
        } catch where sqlState(error) == "23505" && constraint(error) == "issued_signatures_pkey" {
            throw StoreError(.duplicate, duplicateNonceMessage(error, signatures.map(\.0.nonce)))
        }
    }

    /// Appends one audit record's six values to `binds` and returns its placeholders, `($n, …)`,
    /// in the column order of `audit_log (seq, recorded_at, kind, body, previous_hash, hash)`.
    static func auditRow(_ record: AuditRecord, into binds: inout PostgresBindings) -> String {
        let base = binds.count
        binds.append(record.sequence)
        binds.append(record.recordedAt.unixMilliseconds)
        binds.append(record.kind)
        binds.append(record.body)
        binds.append(record.previousHash)
        binds.append(record.hash)
        return "(" + (1...6).map { "$\(base + $0)" }.joined(separator: ", ") + ")"
    }

    /// Appends one ledger row's thirteen values to `binds` and returns its placeholders, `($n, …)`,
    /// in the column order of `issued_signatures (nonce, audit_seq, issued_at, client, bundle_id,
    /// product_id, offer_id, app_account_token, key_id, format, original_transaction_id,
    /// environment, environment_declared)`.
    static func ledgerRow(_ signature: IssuedSignature, _ sequence: Int64, into binds: inout PostgresBindings) -> String {
        let base = binds.count
        binds.append(signature.nonce)
        binds.append(sequence)
        binds.append(signature.issuedAt.unixMilliseconds)
        binds.append(signature.client)
        binds.append(signature.bundleID)
        binds.append(signature.productID)
        binds.append(signature.offerID)
        binds.append(signature.appAccountToken)
        binds.append(signature.keyID)
        binds.append(signature.format)
        binds.append(signature.originalTransactionID)
        binds.append(signature.environment)
        binds.append(Int64(signature.environmentIsDeclared ? 1 : 0))
        return "(" + (1...13).map { "$\(base + $0)" }.joined(separator: ", ") + ")"
    }

    /// Multi-row INSERTs of audit records, as they are (sequence and hashes included).
    static func insertAuditRecords(_ connection: PostgresConnection, _ logger: Logger, _ records: [AuditRecord]) async throws {
        var start = 0
        while start < records.count {
            let chunk = records[start..<min(records.count, start + auditRowsPerStatement)]
            var sql = "INSERT INTO audit_log (seq, recorded_at, kind, body, previous_hash, hash) VALUES "
            var binds = PostgresBindings(capacity: chunk.count * 6)
            for (offset, record) in chunk.enumerated() {
                if offset > 0 { sql += ", " }
                sql += auditRow(record, into: &binds)
            }
            try await connection.run(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger)
            start += chunk.count
        }
    }

    /// Multi-row INSERTs of ledger rows.
    static func insertLedgerRows(_ connection: PostgresConnection, _ logger: Logger, _ rows: [(IssuedSignature, Int64)]) async throws {
        var start = 0
        while start < rows.count {
            let chunk = rows[start..<min(rows.count, start + ledgerRowsPerStatement)]
            var sql = "INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format, original_transaction_id, environment, environment_declared) VALUES "
            var binds = PostgresBindings(capacity: chunk.count * 13)
            for (offset, (signature, sequence)) in chunk.enumerated() {
                if offset > 0 { sql += ", " }
                sql += ledgerRow(signature, sequence, into: &binds)
            }
            try await connection.run(PostgresQuery(unsafeSQL: sql, binds: binds), logger: logger)
            start += chunk.count
        }
    }

    /// "nonce X was issued before", with X from the server's detail ("Key (nonce)=(X) already
    /// exists.") when it is one of ours, else the first of the batch's nonces that the detail names.
    private static func duplicateNonceMessage(_ error: any Error, _ nonces: [String]) -> String {
        let detail = (error as? PSQLError)?.serverInfo?[.detail] ?? ""
        if let nonce = nonces.first(where: { detail.contains("=(\($0))") }) {
            return "nonce \(nonce) was issued before; nonces are never reused"
        }
        if Set(nonces).count < nonces.count {
            return "a nonce appears twice in one append; nonces are never reused"
        }
        return "a nonce was issued before; nonces are never reused"
    }

    /// On the head this process last saw, in one statement (see
    /// ``appendAuditOnKnownHead(_:_:records:signatures:expected:)``); when another writer moved
    /// the head meanwhile, or none is known, in a transaction that locks the head first.
    public func appendAudit(_ batch: [AuditAppend], at time: Date) async throws -> [AuditRecord] {
        guard !batch.isEmpty else { return [] }
        if DispatchTime.now().uptimeNanoseconds >= optimisticAppendsPausedUntil.load(ordering: .relaxed), let head = knownAuditHead.withLock({ $0 }) {
            let (records, signatures) = Self.chained(batch, on: head, at: time)
            if let last = records.last {
                let logger = self.logger
                let applied: Bool
                do {
                    applied = try await boundedOnConnection("appending to the audit log") { connection in
                        try await Self.appendAuditOnKnownHead(connection, logger, records: records, signatures: signatures, expected: head)
                    }
                } catch {
                    // The statement may have committed (an autocommit statement whose answer was
                    // lost) or not: the head this process knows is no longer certain.
                    knownAuditHead.withLock { $0 = nil }
                    throw error
                }
                if applied {
                    noteAuditHead(expected: head, now: (last.sequence, last.hash))
                    return records
                }
                // Another writer moved the head: with several instances appending, they would
                // mostly miss, each miss a wasted round trip, so lock the head for a while.
                optimisticAppendsPausedUntil.store(DispatchTime.now().uptimeNanoseconds + Self.optimisticAppendPause, ordering: .relaxed)
            }
        }
        let records = try await transaction("appending to the audit log") { connection, logger in
            try await Self.appendAudit(connection, logger, batch, at: time)
        }
        if let last = records.last { knownAuditHead.withLock { $0 = (last.sequence, last.hash) } }
        return records
    }

    /// How long appends go through the locking transaction after a one-statement append found the
    /// head moved (nanoseconds).
    static let optimisticAppendPause: UInt64 = 1_000_000_000

    /// Moves the known head from `expected` to `now`, unless something else moved it meanwhile.
    private func noteAuditHead(expected: (Int64, String), now: (Int64, String)) {
        knownAuditHead.withLock { known in
            if let current = known, current.0 == expected.0, current.1 == expected.1 { known = now }
        }
    }

    /// Blocks the calling thread (the audit committer's own, never one of the concurrency pool)
    /// until ``appendAudit(_:at:)`` has committed or failed; bounded by two operation timeouts at
    /// most (a one-statement attempt that finds the head moved, then the locking transaction).
    public func appendAuditBlocking(_ batch: [AuditAppend], at time: Date) throws -> [AuditRecord] {
        try blocking("appending to the audit log") { try await self.appendAudit(batch, at: time) }
    }

    /// The audit committer's write test while commits are failing: the database answers and a
    /// new transaction may write (not a standby, not read-only), checked on the commit path's
    /// own terms (blocking its thread, as ``appendAuditBlocking(_:at:)`` does).
    public func checkAuditWritable() throws {
        try blocking("checking the audit log is writable") { try await self.checkWritable() }
    }

    /// Runs `work` on the concurrency pool and blocks the calling thread (never one of the pool's)
    /// until it ends.
    private func blocking<T: Sendable>(_ what: String, _ work: @escaping @Sendable () async throws -> T) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<T, any Error>?>(nil)
        Task {
            let result: Result<T, any Error>
            do {
                result = .success(try await work())
            } catch {
                result = .failure(error)
            }
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        guard let result = outcome.withLock({ $0 }) else { throw StoreError(.unavailable, "\(what) failed: no outcome") }
        return try result.get()
    }

    static let recordColumns = "seq, recorded_at, kind, body, previous_hash, hash"

    static func record(from row: PostgresRow) throws -> AuditRecord {
        let (sequence, millis, kind, body, previousHash, hash) = try row.decode((Int64, Int64, String, String, String, String).self)
        return AuditRecord(sequence: sequence, recordedAt: date(millis), kind: kind, body: body, previousHash: previousHash, hash: hash)
    }

    public func auditRecords(after sequence: Int64, limit: Int) async throws -> [AuditRecord] {
        try await rows(
            "reading the audit log",
            "SELECT seq, recorded_at, kind, body, previous_hash, hash FROM audit_log WHERE seq > \(sequence) ORDER BY seq LIMIT \(Int64(max(0, limit)))"
        ).map(Self.record(from:))
    }

    /// Pages through the chain, `walkPageSize` records per query; each page is checked before the
    /// next is read, and the walk stops at the first bad record.
    public func continueAuditVerification(_ verifier: AuditVerification.Verifier, through sequence: Int64) async throws -> AuditVerification.Verifier {
        var verifier = verifier
        while verifier.count < sequence {
            let from = verifier.count
            let page = try await rows(
                "reading the audit log",
                """
                SELECT seq, recorded_at, kind, body, previous_hash, hash FROM audit_log
                WHERE seq > \(from) AND seq <= \(sequence) ORDER BY seq LIMIT \(Int64(Self.walkPageSize))
                """)
            for row in page {
                let (seq, millis, kind, body, previousHash, hash) = try row.decode((Int64, Int64, String, String, String, String).self)
                guard verifier.check(sequence: seq, recordedAtMillis: millis, kind: kind, body: body, previousHash: previousHash, hash: hash) else {
                    return verifier
                }
            }
            // A short page, or one that did not move the walk on: the chain ends (or breaks) here.
            if page.count < Self.walkPageSize || verifier.count == from { break }
        }
        return verifier
    }

    public func auditHead() async throws -> (count: Int64, hash: String) {
        guard let row = try await rows("reading the audit head", "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").first else {
            return (0, AuditChain.genesisHash)
        }
        let (count, hash) = try row.decode((Int64, String).self)
        return (count, hash)
    }

    public func issuedSignatures(appAccountToken: String, bundleID: String) async throws -> [IssuedSignatureRecord] {
        try await rows(
            "reading the ledger",
            """
            SELECT \(unescaped: Self.ledgerColumns)
            FROM issued_signatures WHERE app_account_token = \(appAccountToken) AND bundle_id = \(bundleID) ORDER BY issued_at
            """
        ).map(Self.ledgerRecord(from:))
    }

    /// An unnamed statement, planned for its values each time. A prepared statement settles on a
    /// generic plan after five executions and keeps it until the table is next analyzed: made while
    /// the ledger was empty (a fresh deployment), that plan is a sequential scan, measured at
    /// 0.70 ms a read on 7,000 rows against 0.05 ms (see Performance.md).
    /// Under the customer's lock it runs on the lock's connection (see ``LockConnectionLoan``).
    public func ledgerIssuances(appAccountToken: String, bundleID: String) async throws -> [LedgerIssuance] {
        // Read already, with the customer's lock (`CustomerDecisionLock`).
        if let ledger = try prefetchedRead("reading the ledger", { $0.takeLedger(bundleID: bundleID, customer: appAccountToken) }) {
            return ledger
        }
        let logger = self.logger
        let query: PostgresQuery = """
            SELECT DISTINCT offer_id, issued_at FROM issued_signatures
            WHERE app_account_token = \(appAccountToken) AND bundle_id = \(bundleID) AND client <> \(LedgerIssuance.pageViewClient)
                AND format <> \(LedgerIssuance.introEligibilityFormat) ORDER BY issued_at
            """
        return try await onLockConnection("reading the ledger") { connection in
            try await connection.query(query, logger: logger).collect()
        }.map { row in
            let (offerID, issuedAt) = try row.decode((String, Int64).self)
            return LedgerIssuance(offerID: offerID, issuedAt: Self.date(issuedAt))
        }
    }

    /// Under the customer's lock it runs on the lock's connection (see ``LockConnectionLoan``).
    public func withdrawIssuedSignatures(nonces: [String]) async throws -> Int {
        guard !nonces.isEmpty else { return 0 }
        let logger = self.logger
        let query: PostgresQuery = "DELETE FROM issued_signatures WHERE nonce = ANY(\(nonces)) RETURNING issued_at, bundle_id, offer_id, client"
        return try await onLockConnection("withdrawing ledger rows") { connection in
            // The rows and the roll-up's days they fell on (counted again), in one transaction.
            try await connection.run("BEGIN", logger: logger)
            do {
                let removed = try await connection.query(query, logger: logger).collect()
                var days = Set<IssuanceRollUp.Day>()
                for row in removed {
                    let (issuedAt, bundleID, offerID, client) = try row.decode((Int64, String, String, String).self)
                    days.insert(IssuanceRollUp.Day(day: issuedAt / DashboardSchema.dayMilliseconds, bundleID: bundleID, offerID: offerID, client: client))
                }
                try await Self.recount(connection, logger, days)
                try await connection.run("COMMIT", logger: logger)
                return removed.count
            } catch {
                if !connection.isClosed { _ = try? await connection.query("ROLLBACK", logger: logger) }
                throw error
            }
        }
    }

    /// Counts these days of the roll-up again from the ledger (``IssuanceRollUp/recountStatements``),
    /// inside the caller's transaction.
    static func recount(_ connection: PostgresConnection, _ logger: Logger, _ days: Set<IssuanceRollUp.Day>) async throws {
        for day in days {
            let (start, end) = day.range
            try await connection.run(
                "DELETE FROM offer_issuance_days WHERE day = \(day.day) AND bundle_id = \(day.bundleID) AND offer_id = \(day.offerID) AND client = \(day.client)",
                logger: logger)
            try await connection.run(
                """
                INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at)
                SELECT \(day.day), bundle_id, offer_id, client, COUNT(DISTINCT \(unescaped: AppleHistorySchema.issuanceKey)), MAX(issued_at) FROM issued_signatures
                WHERE bundle_id = \(day.bundleID) AND offer_id = \(day.offerID) AND issued_at >= \(start) AND issued_at < \(end) AND client = \(day.client)
                GROUP BY bundle_id, offer_id, client
                """, logger: logger)
        }
    }

    static let ledgerColumns =
        "nonce, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format, audit_seq, original_transaction_id, environment, "
        + "environment_declared"

    static func ledgerRecord(from row: PostgresRow) throws -> IssuedSignatureRecord {
        let columns = try row.decode((String, Int64, String, String, String, String, String?, String, String, Int64, String?, String?, Int64).self)
        return IssuedSignatureRecord(
            signature: IssuedSignature(
                nonce: columns.0, issuedAt: date(columns.1), client: columns.2, bundleID: columns.3, productID: columns.4, offerID: columns.5,
                appAccountToken: columns.6, keyID: columns.7, format: columns.8, originalTransactionID: columns.10, environment: columns.11,
                environmentIsDeclared: columns.12 != 0),
            auditSequence: columns.9)
    }

    // MARK: - Signed checkpoints

    /// The key derived from the master key, checked against the stored public key (see
    /// ``AuditSigningKey/checkStored(publicKeyPEM:auditRecords:hasCheckpoints:)``); reads first,
    /// so an instance writes nothing once the row exists.
    public func auditSigningKey(masterKey: MasterKey) async throws -> AuditSigningKey {
        try await bindMasterKey(masterKey)
        let key = AuditSigningKey.derived(from: masterKey)
        // The usual case only reads (so it works on a read-only server).
        let stored = try await rows("reading the audit-signing key", "SELECT public_key_pem FROM audit_signing_key WHERE id = 1").first?.decode(String.self)
        if let stored, try AuditSigningPublicKey(pem: stored) == key.publicKey { return key }
        try await transaction("checking the audit-signing key") { connection, logger in
            try await Self.storeDerivedAuditKeyIfFresh(connection, logger, key: key, sealed: key.sealed(with: masterKey), refuse: true)
        }
        return key
    }

    /// See SQLiteStore's function of the same name. Taking the chain head's lock first keeps an
    /// append from slipping in between the count and the insert.
    static func storeDerivedAuditKeyIfFresh(_ connection: PostgresConnection, _ logger: Logger, key: AuditSigningKey, sealed: Data, refuse: Bool) async throws {
        let records = try await connection.query("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE", logger: logger).collect().first?.decode(Int64.self) ?? 0
        var pem = try await connection.query("SELECT public_key_pem FROM audit_signing_key WHERE id = 1", logger: logger).collect().first?.decode(String.self)
        let hasCheckpoints = try await connection.query("SELECT 1 FROM audit_checkpoints LIMIT 1", logger: logger).collect().count > 0
        if records == 0 && !hasCheckpoints, let stored = pem, stored != key.publicKey.pem {
            // A key an earlier offer-signer generated before anything was signed: replaced.
            try await connection.run("DELETE FROM audit_signing_key", logger: logger)
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
            try await connection.run(
                """
                INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at)
                VALUES (1, \(key.publicKey.pem), \(key.publicKey.fingerprint), \(sealed), \(Date().unixMilliseconds)) ON CONFLICT (id) DO NOTHING
                """, logger: logger)
        }
    }

    public func replaceAuditSigningKey(_ key: AuditSigningKey, masterKey: MasterKey, resigned: [AuditCheckpoint], entry: AuditEntry) async throws {
        let sealed = key.sealed(with: masterKey)
        try await transaction("replacing the audit-signing key") { connection, logger in
            try await connection.run("DELETE FROM audit_signing_key", logger: logger)
            try await connection.run(
                """
                INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at)
                VALUES (1, \(key.publicKey.pem), \(key.publicKey.fingerprint), \(sealed), \(Date().unixMilliseconds))
                """, logger: logger)
            try await connection.run("DELETE FROM audit_checkpoints", logger: logger)
            for checkpoint in resigned {
                try await connection.run(
                    """
                    INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature)
                    VALUES (\(checkpoint.sequence), \(checkpoint.headHash), \(checkpoint.createdAt.unixMilliseconds), \(checkpoint.keyFingerprint), \(checkpoint.signature))
                    """, logger: logger)
            }
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: entry)], at: Date())
        }
    }

    public func auditSigningPublicKey() async throws -> AuditSigningPublicKey? {
        guard let row = try await rows("reading the audit-signing key", "SELECT public_key_pem FROM audit_signing_key WHERE id = 1").first else { return nil }
        return try AuditSigningPublicKey(pem: try row.decode(String.self))
    }

    public func appendCheckpoint(_ checkpoint: AuditCheckpoint) async throws -> Bool {
        try await transaction("storing an audit checkpoint") { connection, logger in
            let inserted = try await connection.query(
                """
                INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature)
                VALUES (\(checkpoint.sequence), \(checkpoint.headHash), \(checkpoint.createdAt.unixMilliseconds), \(checkpoint.keyFingerprint), \(checkpoint.signature))
                ON CONFLICT (seq) DO NOTHING RETURNING seq
                """, logger: logger
            ).collect()
            if !inserted.isEmpty { return true }
            let existing = try await connection.query("SELECT head_hash FROM audit_checkpoints WHERE seq = \(checkpoint.sequence)", logger: logger).collect().first
            guard let existing, try existing.decode(String.self) == checkpoint.headHash else {
                throw StoreError(.conflict, "a checkpoint of \(checkpoint.sequence) records with another head hash exists already")
            }
            return false
        }
    }

    static let checkpointColumns = "seq, head_hash, created_at, key_fingerprint, signature"

    static func checkpoint(from row: PostgresRow) throws -> AuditCheckpoint {
        let (sequence, headHash, createdAt, fingerprint, signature) = try row.decode((Int64, String, Int64, String, String).self)
        return AuditCheckpoint(sequence: sequence, headHash: headHash, createdAt: date(createdAt), keyFingerprint: fingerprint, signature: signature)
    }

    public func checkpoints() async throws -> [AuditCheckpoint] {
        try await rows("reading audit checkpoints", "SELECT seq, head_hash, created_at, key_fingerprint, signature FROM audit_checkpoints ORDER BY seq")
            .map(Self.checkpoint(from:))
    }

    public func latestCheckpoint() async throws -> AuditCheckpoint? {
        try await rows(
            "reading audit checkpoints", "SELECT seq, head_hash, created_at, key_fingerprint, signature FROM audit_checkpoints ORDER BY seq DESC LIMIT 1"
        ).first.map(Self.checkpoint(from:))
    }
}
