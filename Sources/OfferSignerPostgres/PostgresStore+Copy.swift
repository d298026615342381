import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// Verbatim copies out of and into PostgreSQL (see ``StoreCopy``).
extension PostgresStore {
    static let copiedTables = ["signing_keys", "api_clients", "audit_log", "issued_signatures", "audit_checkpoints", "audit_signing_key"]

    static func hasRows(_ connection: PostgresConnection, _ logger: Logger) async throws -> String? {
        for table in copiedTables + AppleHistorySchema.tables {
            if try await connection.query(PostgresQuery(unsafeSQL: "SELECT 1 FROM \(table) LIMIT 1"), logger: logger).collect().count > 0 { return table }
        }
        if try await connection.query("SELECT 1 FROM meta WHERE name = 'master_key_check'", logger: logger).collect().count > 0 { return "meta" }
        return nil
    }

    public func isEmpty() async throws -> Bool {
        try await transaction("checking that the store is empty") { connection, logger in
            try await Self.hasRows(connection, logger) == nil
        }
    }

    public func copyRegistry() async throws -> StoreCopyRegistry {
        let snapshot = try await registrySnapshot()
        let check = try await rows("reading the master key check", "SELECT value FROM meta WHERE name = 'master_key_check'").first?.decode(String.self)
        let signingKey = try await rows(
            "reading the audit-signing key", "SELECT public_key_pem, fingerprint, sealed_private_key, created_at FROM audit_signing_key WHERE id = 1"
        ).first.map { row in
            let (pem, fingerprint, sealed, createdAt) = try row.decode((String, String, Data, Int64).self)
            return SealedAuditSigningKey(publicKeyPEM: pem, fingerprint: fingerprint, sealedPrivateKey: sealed, createdAt: Self.date(createdAt))
        }
        return StoreCopyRegistry(masterKeyCheck: check, registryVersion: snapshot.version, keys: snapshot.keys, clients: snapshot.clients, auditSigningKey: signingKey,
            rowsAuthenticated: snapshot.rowsAuthenticated, manifest: snapshot.manifest)
    }

    public func ledger(after position: LedgerPosition?, limit: Int) async throws -> [IssuedSignatureRecord] {
        let limit = Int64(max(0, limit))
        let query: PostgresQuery
        if let position {
            query = """
                SELECT \(unescaped: Self.ledgerColumns)
                FROM issued_signatures WHERE (audit_seq, nonce) > (\(position.auditSequence), \(position.nonce))
                ORDER BY audit_seq, nonce LIMIT \(limit)
                """
        } else {
            query = """
                SELECT \(unescaped: Self.ledgerColumns)
                FROM issued_signatures ORDER BY audit_seq, nonce LIMIT \(limit)
                """
        }
        return try await rows("reading the ledger", query).map(Self.ledgerRecord(from:))
    }

    public func importVerbatim(_ batch: VerbatimImport) async throws {
        try await transaction("importing into the store") { connection, logger in
            // Imports take the chain head like appends, so nothing else writes meanwhile.
            guard let head = try await connection.query("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE", logger: logger).collect().first else {
                throw StoreError(.unavailable, "the audit_head row is missing (was the store edited by hand?)")
            }
            let headSequence = try head.decode(Int64.self)
            if let registry = batch.registry {
                if let table = try await Self.hasRows(connection, logger) {
                    throw StoreError(.conflict, "the target store is not empty (\(table) has rows)")
                }
                if let check = registry.masterKeyCheck {
                    try await connection.run("INSERT INTO meta (name, value) VALUES ('master_key_check', \(check))", logger: logger)
                }
                try await connection.run(
                    "UPDATE registry SET version = \(registry.registryVersion), manifest_version = \(registry.manifest?.version), manifest_mac = \(registry.manifest?.mac) WHERE id = 1",
                    logger: logger)
                if !registry.rowsAuthenticated {
                    try await connection.run("DELETE FROM meta WHERE name = \(RegistryRowsMarker.name)", logger: logger)
                }
                for (index, key) in registry.keys.enumerated() {
                    try await connection.run(
                        """
                        INSERT INTO signing_keys (key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key,
                            imported_at, activated_at, retired_at, revoked_at, position, registry_mac)
                        VALUES (\(key.keyID), \(key.bundleID), \(key.issuerID), \(key.state.rawValue), \(key.origin), \(key.publicKeyPEM), \(key.fingerprint),
                            \(key.sealedPrivateKey), \(key.importedAt.unixMilliseconds), \(key.activatedAt?.unixMilliseconds), \(key.retiredAt?.unixMilliseconds),
                            \(key.revokedAt?.unixMilliseconds), \(Int64(index + 1)), \(key.registryMAC))
                        """, logger: logger)
                }
                for client in registry.clients {
                    try await connection.run(
                        """
                        INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at, revoked_at, registry_mac)
                        VALUES (\(client.clientID), \(client.name), \(client.bundleIDs.joined(separator: " ")), \(client.secretHash),
                            \(client.createdAt.unixMilliseconds), \(client.revokedAt?.unixMilliseconds), \(client.registryMAC))
                        """, logger: logger)
                }
                if let key = registry.auditSigningKey {
                    try await connection.run(
                        """
                        INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at)
                        VALUES (1, \(key.publicKeyPEM), \(key.fingerprint), \(key.sealedPrivateKey), \(key.createdAt.unixMilliseconds))
                        """, logger: logger)
                }
            }
            if let first = batch.records.first, let last = batch.records.last {
                let stored = try await connection.query("SELECT COALESCE(MAX(seq), 0) FROM audit_log", logger: logger).collect().first?.decode(Int64.self) ?? 0
                guard first.sequence > max(stored, headSequence) else {
                    throw StoreError(.conflict, "audit record \(first.sequence) does not come after the store's last one (\(max(stored, headSequence)))")
                }
                for (earlier, later) in zip(batch.records, batch.records.dropFirst()) where later.sequence <= earlier.sequence {
                    throw StoreError(.conflict, "audit records to import are out of order at \(later.sequence)")
                }
                try await Self.insertAuditRecords(connection, logger, batch.records)
                try await connection.run("UPDATE audit_head SET seq = \(last.sequence), hash = \(last.hash) WHERE id = 1", logger: logger)
            }
            if !batch.ledger.isEmpty {
                do {
                    try await Self.insertLedgerRows(connection, logger, batch.ledger.map { ($0.signature, $0.auditSequence) })
                } catch where Self.sqlState(error) == "23505" {
                    throw StoreError(.duplicate, "a nonce to import is in the store already")
                }
                // The roll-up of the days these rows fall on, counted from the ledger (a request's
                // formats may arrive in two batches: counting again never counts one twice).
                try await Self.recount(connection, logger, Set(batch.ledger.map { IssuanceRollUp.day(of: $0.signature) }))
            }
            if let (table, rows) = batch.appleHistory {
                guard let spec = AppleHistorySchema.copiedColumns.first(where: { $0.table == table }) else {
                    throw StoreError(.conflict, "'\(table)' is not a table of Apple's history")
                }
                for row in rows {
                    guard row.count == spec.columns.count else { throw StoreError(.conflict, "a row of \(table) has \(row.count) values, not \(spec.columns.count)") }
                    var query = PostgresQuery(unsafeSQL: "INSERT INTO \(table) (\(spec.columns.joined(separator: ", "))) VALUES (\((1...row.count).map { "$\($0)" }.joined(separator: ", ")))")
                    for (value, column) in zip(row, spec.columns) {
                        switch value {
                        case .text(let text): query.binds.append(text)
                        case .integer(let number):
                            if column == "complete" { query.binds.append(Int32(truncatingIfNeeded: number)) } else { query.binds.append(number) }
                        case .null:
                            if AppleHistorySchema.integerColumns.contains(column) { query.binds.append(Optional<Int64>.none) } else { query.binds.append(Optional<String>.none) }
                        }
                    }
                    try await connection.run(query, logger: logger)
                }
            }
            if !batch.checkpoints.isEmpty {
                for checkpoint in batch.checkpoints {
                    try await connection.run(
                        """
                        INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature)
                        VALUES (\(checkpoint.sequence), \(checkpoint.headHash), \(checkpoint.createdAt.unixMilliseconds), \(checkpoint.keyFingerprint), \(checkpoint.signature))
                        """, logger: logger)
                }
            }
        }
    }

    public func appleHistoryRows(table: String, offset: Int, limit: Int) async throws -> [[StoreValue]] {
        guard let spec = AppleHistorySchema.copiedColumns.first(where: { $0.table == table }) else {
            throw StoreError(.conflict, "'\(table)' is not a table of Apple's history")
        }
        let columns = spec.columns.map { AppleHistorySchema.integerColumns.contains($0) ? "\($0)::BIGINT" : $0 }
        var query = PostgresQuery(unsafeSQL: "SELECT \(columns.joined(separator: ", ")) FROM \(table) ORDER BY \(spec.key.joined(separator: ", ")) LIMIT $1 OFFSET $2")
        query.binds.append(Int64(limit))
        query.binds.append(Int64(offset))
        return try await rows("reading \(table)", query).map { row in
            var values: [StoreValue] = []
            for (cell, column) in zip(row, spec.columns) {
                if AppleHistorySchema.integerColumns.contains(column) {
                    values.append(try cell.decode(Int64?.self).map(StoreValue.integer) ?? .null)
                } else {
                    values.append(try cell.decode(String?.self).map(StoreValue.text) ?? .null)
                }
            }
            return values
        }
    }
}
