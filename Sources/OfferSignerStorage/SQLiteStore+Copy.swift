import Foundation
import GRDB
import OfferSignerCore

/// Verbatim copies out of and into SQLite (see ``StoreCopy``).
extension SQLiteStore {
    public func isEmpty() async throws -> Bool {
        try await read { db in
            for table in ["signing_keys", "api_clients", "audit_log", "issued_signatures", "audit_checkpoints", "audit_signing_key"] + AppleHistorySchema.tables {
                if try Row.fetchOne(db, sql: "SELECT 1 FROM \(table) LIMIT 1") != nil { return false }
            }
            return try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = 'master_key_check'") == nil
        }
    }

    public func copyRegistry() async throws -> StoreCopyRegistry {
        let snapshot = try await registrySnapshot()
        let (check, signingKey) = try await read { db -> (String?, SealedAuditSigningKey?) in
            let check = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = 'master_key_check'")
            let key = try Row.fetchOne(db, sql: "SELECT public_key_pem, fingerprint, sealed_private_key, created_at FROM audit_signing_key WHERE id = 1").map { row in
                SealedAuditSigningKey(
                    publicKeyPEM: try row.column("public_key_pem", "audit_signing_key"), fingerprint: try row.column("fingerprint", "audit_signing_key"),
                    sealedPrivateKey: try row.column("sealed_private_key", "audit_signing_key"),
                    createdAt: Date(timeIntervalSince1970: Double(try row.column("created_at", "audit_signing_key") as Int64) / 1000))
            }
            return (check, key)
        }
        return StoreCopyRegistry(masterKeyCheck: check, registryVersion: snapshot.version, keys: snapshot.keys, clients: snapshot.clients, auditSigningKey: signingKey,
            rowsAuthenticated: snapshot.rowsAuthenticated, manifest: snapshot.manifest)
    }

    public func ledger(after position: LedgerPosition?, limit: Int) async throws -> [IssuedSignatureRecord] {
        try await read { db in
            let table = "issued_signatures"
            let rows: [Row]
            if let position {
                rows = try Row.fetchAll(
                    db, sql: "SELECT * FROM issued_signatures WHERE (audit_seq, nonce) > (?, ?) ORDER BY audit_seq, nonce LIMIT ?",
                    arguments: [position.auditSequence, position.nonce, limit])
            } else {
                rows = try Row.fetchAll(db, sql: "SELECT * FROM issued_signatures ORDER BY audit_seq, nonce LIMIT ?", arguments: [limit])
            }
            return try rows.map { row in
                IssuedSignatureRecord(
                    signature: IssuedSignature(
                        nonce: try row.column("nonce", table),
                        issuedAt: Date(timeIntervalSince1970: Double(try row.column("issued_at", table) as Int64) / 1000),
                        client: try row.column("client", table), bundleID: try row.column("bundle_id", table),
                        productID: try row.column("product_id", table), offerID: try row.column("offer_id", table),
                        appAccountToken: try row.column("app_account_token", table), keyID: try row.column("key_id", table),
                        format: try row.column("format", table), originalTransactionID: try row.column("original_transaction_id", table),
                        environment: try row.column("environment", table),
                        environmentIsDeclared: (try row.column("environment_declared", table) as Int64) != 0),
                    auditSequence: try row.column("audit_seq", table))
            }
        }
    }

    public func importVerbatim(_ batch: VerbatimImport) async throws {
        // Ledger rows arrive here without an audit append: whatever was cached is forgotten.
        defer { ledgerCache.clear() }
        try await write { db in
            if let registry = batch.registry {
                for table in ["signing_keys", "api_clients", "audit_log", "issued_signatures", "audit_checkpoints", "audit_signing_key"] + AppleHistorySchema.tables {
                    if try Row.fetchOne(db, sql: "SELECT 1 FROM \(table) LIMIT 1") != nil {
                        throw StoreError(.conflict, "the target store is not empty (\(table) has rows)")
                    }
                }
                if let check = registry.masterKeyCheck {
                    try db.execute(sql: "INSERT OR REPLACE INTO meta (name, value) VALUES ('master_key_check', ?)", arguments: [check])
                }
                try db.execute(
                    sql: "UPDATE registry SET version = ?, manifest_version = ?, manifest_mac = ? WHERE id = 1",
                    arguments: [registry.registryVersion, registry.manifest?.version, registry.manifest?.mac])
                if !registry.rowsAuthenticated {
                    try db.execute(sql: "DELETE FROM meta WHERE name = ?", arguments: [RegistryRowsMarker.name])
                }
                for (index, key) in registry.keys.enumerated() {
                    try db.execute(
                        sql: """
                            INSERT INTO signing_keys (key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key,
                                imported_at, activated_at, retired_at, revoked_at, position, registry_mac)
                            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                            """,
                        arguments: [
                            key.keyID, key.bundleID, key.issuerID, key.state.rawValue, key.origin, key.publicKeyPEM, key.fingerprint, key.sealedPrivateKey,
                            key.importedAt.unixMilliseconds, key.activatedAt?.unixMilliseconds, key.retiredAt?.unixMilliseconds,
                            key.revokedAt?.unixMilliseconds, index + 1, key.registryMAC,
                        ])
                }
                for client in registry.clients {
                    try db.execute(
                        sql: "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at, revoked_at, registry_mac) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        arguments: [
                            client.clientID, client.name, client.bundleIDs.joined(separator: " "), client.secretHash, client.createdAt.unixMilliseconds,
                            client.revokedAt?.unixMilliseconds, client.registryMAC,
                        ])
                }
                if let key = registry.auditSigningKey {
                    try db.execute(
                        sql: "INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at) VALUES (1, ?, ?, ?, ?)",
                        arguments: [key.publicKeyPEM, key.fingerprint, key.sealedPrivateKey, key.createdAt.unixMilliseconds])
                }
            }
            if let first = batch.records.first {
                let last = try Int64.fetchOne(db, sql: "SELECT MAX(seq) FROM audit_log") ?? 0
                guard first.sequence > last else {
                    throw StoreError(.conflict, "audit record \(first.sequence) does not come after the store's last one (\(last))")
                }
                let insert = try db.cachedStatement(sql: "INSERT INTO audit_log (seq, recorded_at, kind, body, previous_hash, hash) VALUES (?, ?, ?, ?, ?, ?)")
                var previous = last
                for record in batch.records {
                    guard record.sequence > previous else { throw StoreError(.conflict, "audit records to import are out of order at \(record.sequence)") }
                    try insert.execute(arguments: [
                        record.sequence, record.recordedAt.unixMilliseconds, record.kind, record.body, record.previousHash, record.hash,
                    ])
                    previous = record.sequence
                }
            }
            if !batch.ledger.isEmpty {
                let insert = try db.cachedStatement(sql: """
                    INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format,
                        original_transaction_id, environment, environment_declared)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """)
                for row in batch.ledger {
                    let signature = row.signature
                    do {
                        try insert.execute(arguments: [
                            signature.nonce, row.auditSequence, signature.issuedAt.unixMilliseconds, signature.client, signature.bundleID,
                            signature.productID, signature.offerID, signature.appAccountToken, signature.keyID, signature.format,
                            signature.originalTransactionID, signature.environment, signature.environmentIsDeclared ? 1 : 0,
                        ])
                    } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_PRIMARYKEY {
                        throw StoreError(.duplicate, "nonce \(signature.nonce) is in the store already")
                    }
                }
                // The roll-up of the days these rows fall on, counted from the ledger (a request's
                // formats may arrive in two batches: counting again never counts one twice).
                try Self.recount(db, Set(batch.ledger.map { IssuanceRollUp.day(of: $0.signature) }))
            }
            if let (table, rows) = batch.appleHistory {
                guard let spec = AppleHistorySchema.copiedColumns.first(where: { $0.table == table }) else {
                    throw StoreError(.conflict, "'\(table)' is not a table of Apple's history")
                }
                let insert = try db.cachedStatement(
                    sql: "INSERT INTO \(table) (\(spec.columns.joined(separator: ", "))) VALUES (\(spec.columns.map { _ in "?" }.joined(separator: ", ")))")
                for row in rows {
                    guard row.count == spec.columns.count else { throw StoreError(.conflict, "a row of \(table) has \(row.count) values, not \(spec.columns.count)") }
                    let values: [(any DatabaseValueConvertible)?] = row.map { value in
                        switch value {
                        case .text(let text): text
                        case .integer(let number): number
                        case .null: nil
                        }
                    }
                    try insert.execute(arguments: StatementArguments(values))
                }
            }
            if !batch.checkpoints.isEmpty {
                let insert = try db.cachedStatement(sql: "INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature) VALUES (?, ?, ?, ?, ?)")
                for checkpoint in batch.checkpoints {
                    try insert.execute(arguments: [
                        checkpoint.sequence, checkpoint.headHash, checkpoint.createdAt.unixMilliseconds, checkpoint.keyFingerprint, checkpoint.signature,
                    ])
                }
            }
        }
    }

    public func appleHistoryRows(table: String, offset: Int, limit: Int) async throws -> [[StoreValue]] {
        guard let spec = AppleHistorySchema.copiedColumns.first(where: { $0.table == table }) else {
            throw StoreError(.conflict, "'\(table)' is not a table of Apple's history")
        }
        return try await read { db in
            try Row.fetchAll(
                db, sql: "SELECT \(spec.columns.joined(separator: ", ")) FROM \(table) ORDER BY \(spec.key.joined(separator: ", ")) LIMIT ? OFFSET ?",
                arguments: [limit, offset]
            ).map { row in
                spec.columns.map { column -> StoreValue in
                    if AppleHistorySchema.integerColumns.contains(column) {
                        return (row[column] as Int64?).map(StoreValue.integer) ?? .null
                    }
                    return (row[column] as String?).map(StoreValue.text) ?? .null
                }
            }
        }
    }
}
