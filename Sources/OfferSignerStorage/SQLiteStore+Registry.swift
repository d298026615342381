import Foundation
import GRDB
import GRDBSQLite
import OfferSignerCore
import Synchronization

/// The key registry on SQLite: signing keys with their states, API clients, and the version
/// number that tells a serving process the registry changed.
extension SQLiteStore {
    static func key(from row: Row) throws -> SigningKeyRecord {
        let table = "signing_keys"
        let stateName: String = try row.column("state", table)
        guard let state = SigningKeyState(rawValue: stateName) else {
            throw StoreError(.unavailable, "signing_keys.state holds an unknown state (was the store edited by hand?)")
        }
        return SigningKeyRecord(
            keyID: try row.column("key_id", table), bundleID: try row.column("bundle_id", table), issuerID: try row.column("issuer_id", table),
            state: state, origin: try row.column("origin", table),
            publicKeyPEM: try row.column("public_key_pem", table), fingerprint: try row.column("fingerprint", table),
            importedAt: date(try row.column("imported_at", table) as Int64), activatedAt: date(try row.column("activated_at", table) as Int64?),
            retiredAt: date(try row.column("retired_at", table) as Int64?), revokedAt: date(try row.column("revoked_at", table) as Int64?),
            sealedPrivateKey: try row.column("sealed_private_key", table), registryMAC: row["registry_mac"])
    }

    static func client(from row: Row) throws -> APIClientRecord {
        let table = "api_clients"
        let bundles: String = try row.column("bundle_ids", table)
        return APIClientRecord(
            clientID: try row.column("client_id", table), name: try row.column("name", table),
            bundleIDs: bundles.isEmpty ? [] : bundles.split(separator: " ").map(String.init),
            secretHash: try row.column("secret_hash", table), createdAt: date(try row.column("created_at", table) as Int64),
            revokedAt: date(try row.column("revoked_at", table) as Int64?), registryMAC: row["registry_mac"])
    }

    static func rowsAuthenticated(_ db: Database) throws -> Bool {
        try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = ?", arguments: [RegistryRowsMarker.name]) != nil
    }

    static func storedManifest(_ db: Database) throws -> StoredRegistryManifest? {
        guard let row = try Row.fetchOne(db, sql: "SELECT manifest_version, manifest_mac FROM registry WHERE id = 1"),
            let version = row["manifest_version"] as Int64?, let mac = row["manifest_mac"] as String?
        else { return nil }
        return StoredRegistryManifest(version: version, mac: mac)
    }

    static func manifestEntries(_ db: Database) throws -> [RegistryManifestEntry] {
        let keys = try Row.fetchAll(db, sql: "SELECT key_id, registry_mac FROM signing_keys").map {
            RegistryManifestEntry(table: "signing_keys", rowID: $0["key_id"], rowMAC: $0["registry_mac"])
        }
        let clients = try Row.fetchAll(db, sql: "SELECT client_id, registry_mac FROM api_clients").map {
            RegistryManifestEntry(table: "api_clients", rowID: $0["client_id"], rowMAC: $0["registry_mac"])
        }
        return (keys + clients).sorted()
    }

    static func writeManifest(_ db: Database, _ manifest: StoredRegistryManifest) throws {
        try db.execute(
            sql: "UPDATE registry SET manifest_version = ?, manifest_mac = ?, version = version + 1 WHERE id = 1", arguments: [manifest.version, manifest.mac])
    }

    /// Runs a registry change (see ``RegistryManifest``): the stored manifest must vouch for the
    /// rows first; afterwards the next manifest is written and the version bumped, all in the
    /// caller's transaction.
    ///
    /// `change` appends the entry of every record it writes, as planned; the next manifest is
    /// computed over the verified entries plus those, and the rows read back after the writes
    /// must equal them (``RegistryManifest/checkWritten(expected:actual:)``).
    static func changeRegistry<T>(_ db: Database, _ authenticator: RegistryRowAuthenticator, _ change: (inout [RegistryManifestEntry]) throws -> T) throws -> T {
        let previous = try manifestEntries(db)
        let version = try RegistryManifest.checkBeforeChange(stored: try storedManifest(db), entries: previous, authenticator: authenticator)
        var written: [RegistryManifestEntry] = []
        let result = try change(&written)
        let expected = RegistryManifest.expected(previous: previous, written: written)
        try RegistryManifest.checkWritten(expected: expected, actual: try manifestEntries(db))
        try writeManifest(db, RegistryManifest.next(after: version, entries: expected, authenticator: authenticator))
        return result
    }

    static func writeKeyState(_ db: Database, _ key: SigningKeyRecord, _ written: inout [RegistryManifestEntry]) throws {
        try db.execute(
            sql: "UPDATE signing_keys SET state = ?, activated_at = ?, retired_at = ?, revoked_at = ?, registry_mac = ? WHERE key_id = ?",
            arguments: [key.state.rawValue, millis(key.activatedAt), millis(key.retiredAt), millis(key.revokedAt), key.registryMAC, key.keyID])
        try RegistryManifest.checkOneRowChanged(db.changesCount, "the update of key '\(key.keyID)'")
        written.append(RegistryManifestEntry(key: key))
    }

    public func registryVersion() async throws -> Int64 {
        try await read { db in try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") ?? 0 }
    }

    public func registryChangeMark() async throws -> String {
        try await read { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT version, manifest_version, manifest_mac FROM registry WHERE id = 1") else { return "" }
            return "\(row["version"] as Int64? ?? 0)/\(row["manifest_version"] as Int64? ?? -1)/\(row["manifest_mac"] as String? ?? "")"
        }
    }

    public func registrySnapshot() async throws -> RegistrySnapshot {
        try await read { db in
            RegistrySnapshot(
                version: try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") ?? 0,
                keys: try Row.fetchAll(db, sql: "SELECT * FROM signing_keys ORDER BY position").map { try Self.key(from: $0) },
                clients: try Row.fetchAll(db, sql: "SELECT * FROM api_clients ORDER BY created_at, name").map { try Self.client(from: $0) },
                rowsAuthenticated: try Self.rowsAuthenticated(db), manifest: try Self.storedManifest(db))
        }
    }

    public func importKey(_ key: SigningKeyRecord, actor: String, reason: String?, authenticator: RegistryRowAuthenticator) async throws -> SigningKeyRecord {
        try await write { db in try Self.changeRegistry(db, authenticator) { written in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM signing_keys WHERE key_id = ?", arguments: [key.keyID]) != nil {
                throw StoreError(.duplicate, "key '\(key.keyID)' is already in the store")
            }
            if let existing = try String.fetchOne(db, sql: "SELECT key_id FROM signing_keys WHERE fingerprint = ?", arguments: [key.fingerprint]) {
                throw StoreError(.duplicate, "this key is already in the store as '\(existing)'")
            }
            let hasActive = try Row.fetchOne(db, sql: "SELECT 1 FROM signing_keys WHERE bundle_id = ? AND state = 'active'", arguments: [key.bundleID]) != nil
            var stored = key
            stored.state = hasActive ? .ready : .active
            stored.activatedAt = hasActive ? nil : key.importedAt
            stored = authenticator.authenticated(stored)
            let position = (try Int64.fetchOne(db, sql: "SELECT MAX(position) FROM signing_keys") ?? 0) + 1
            try db.execute(
                sql: """
                    INSERT INTO signing_keys (key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key, imported_at, activated_at, position, registry_mac)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    stored.keyID, stored.bundleID, stored.issuerID, stored.state.rawValue, stored.origin, stored.publicKeyPEM,
                    stored.fingerprint, stored.sealedPrivateKey, stored.importedAt.unixMilliseconds, Self.millis(stored.activatedAt), position,
                    stored.registryMAC,
                ])
            try RegistryManifest.checkOneRowChanged(db.changesCount, "the insert of key '\(stored.keyID)'")
            written.append(RegistryManifestEntry(key: stored))
            let body = AuditBody.make([
                ("actor", actor), ("reason", reason), ("keyID", stored.keyID), ("bundleID", stored.bundleID),
                ("origin", stored.origin), ("state", stored.state.rawValue), ("fingerprint", stored.fingerprint),
            ])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "key.imported", body: body))], at: key.importedAt)
            return stored
        } }
    }

    public func listKeys() async throws -> [SigningKeyRecord] {
        try await read { db in try Row.fetchAll(db, sql: "SELECT * FROM signing_keys ORDER BY position").map { try Self.key(from: $0) } }
    }

    public func transitionKey(
        keyID: String, to state: SigningKeyState, actor: String, reason: String?, force: Bool, authenticator: RegistryRowAuthenticator
    ) async throws -> SigningKeyRecord {
        // One write transaction: no other writer changes a row between the read and the write,
        // and the MACs written are those of the records as planned from the rows read.
        try await write { db in try Self.changeRegistry(db, authenticator) { written in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE key_id = ?", arguments: [keyID]) else {
                throw StoreError(.notFound, "no key '\(keyID)' in the store")
            }
            let key = try Self.key(from: row)
            let activeRow = try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE bundle_id = ? AND state = 'active'", arguments: [key.bundleID])
            let previousActive = try activeRow.map { try Self.key(from: $0) }
            let now = Date()
            let plan = try KeyRegistry.planTransition(
                key: key, previousActive: previousActive, to: state, force: force, now: now, authenticator: authenticator)
            if let retired = plan.retired { try Self.writeKeyState(db, retired, &written) }
            try Self.writeKeyState(db, plan.key, &written)
            let entry = KeyRegistry.transitionAuditEntry(plan, from: key, previousActive: previousActive, actor: actor, reason: reason)
            _ = try Self.appendAudit(db, [AuditAppend(entry: entry)], at: now)
            return plan.key
        } }
    }

    public func createClient(_ client: APIClientRecord, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord {
        try await write { db in try Self.changeRegistry(db, authenticator) { written in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM api_clients WHERE name = ?", arguments: [client.name]) != nil {
                throw StoreError(.duplicate, "a client named '\(client.name)' exists already")
            }
            let client = authenticator.authenticated(client)
            try db.execute(
                sql: "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at, registry_mac) VALUES (?, ?, ?, ?, ?, ?)",
                arguments: [
                    client.clientID, client.name, client.bundleIDs.joined(separator: " "), client.secretHash, client.createdAt.unixMilliseconds, client.registryMAC,
                ])
            try RegistryManifest.checkOneRowChanged(db.changesCount, "the insert of client '\(client.name)'")
            written.append(RegistryManifestEntry(client: client))
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", client.name), ("bundleIDs", client.bundleIDs.joined(separator: " "))])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "client.created", body: body))], at: client.createdAt)
            return client
        } }
    }

    public func listClients() async throws -> [APIClientRecord] {
        try await read { db in try Row.fetchAll(db, sql: "SELECT * FROM api_clients ORDER BY created_at, name").map { try Self.client(from: $0) } }
    }

    public func revokeClient(name: String, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord {
        try await write { db in try Self.changeRegistry(db, authenticator) { written in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM api_clients WHERE name = ?", arguments: [name]) else {
                throw StoreError(.notFound, "no client named '\(name)'")
            }
            var client = try Self.client(from: row)
            guard client.revokedAt == nil else { throw StoreError(.conflict, "client '\(name)' is already revoked") }
            let now = Date()
            client.revokedAt = Self.date(now.unixMilliseconds)
            client = authenticator.authenticated(client)
            try db.execute(
                sql: "UPDATE api_clients SET revoked_at = ?, registry_mac = ? WHERE client_id = ?",
                arguments: [now.unixMilliseconds, client.registryMAC, client.clientID])
            try RegistryManifest.checkOneRowChanged(db.changesCount, "the update of client '\(name)'")
            written.append(RegistryManifestEntry(client: client))
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", name)])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "client.revoked", body: body))], at: now)
            return client
        } }
    }

    public func authenticateRegistry(authenticator: RegistryRowAuthenticator, actor: String) async throws -> RegistryAuthenticationSummary {
        try await write { db in
            guard try !Self.rowsAuthenticated(db) else { throw KeyRegistry.alreadyAuthenticated }
            let keys = try Row.fetchAll(db, sql: "SELECT * FROM signing_keys WHERE registry_mac IS NULL ORDER BY position").map { try Self.key(from: $0) }
            for key in keys {
                try db.execute(sql: "UPDATE signing_keys SET registry_mac = ? WHERE key_id = ?", arguments: [authenticator.mac(for: key), key.keyID])
            }
            let clients = try Row.fetchAll(db, sql: "SELECT * FROM api_clients WHERE registry_mac IS NULL ORDER BY created_at, name").map { try Self.client(from: $0) }
            for client in clients {
                try db.execute(sql: "UPDATE api_clients SET registry_mac = ? WHERE client_id = ?", arguments: [authenticator.mac(for: client), client.clientID])
            }
            try db.execute(sql: "INSERT INTO meta (name, value) VALUES (?, ?)", arguments: [RegistryRowsMarker.name, RegistryRowsMarker.value])
            // The first manifest, over the rows just authenticated.
            let previous = try Self.storedManifest(db)
            try RegistryManifest.checkNotRolledBack(version: previous?.version ?? 0, authenticator: authenticator)
            let entries = try Self.manifestEntries(db)
            let manifest = RegistryManifest.next(after: previous?.version ?? 0, entries: entries, authenticator: authenticator)
            try Self.writeManifest(db, manifest)
            let summary = RegistryAuthenticationSummary(keyIDs: keys.map(\.keyID), clientNames: clients.map(\.name))
            _ = try Self.appendAudit(db, [AuditAppend(entry: KeyRegistry.authenticationAuditEntry(summary, actor: actor))], at: Date())
            return summary
        }
    }

    public func writeRegistryManifest(authenticator: RegistryRowAuthenticator, actor: String, reason: String) async throws -> StoredRegistryManifest {
        try await write { db in
            let previous = try Self.storedManifest(db)
            let entries = try Self.manifestEntries(db)
            let manifest = RegistryManifest.next(after: previous?.version ?? 0, entries: entries, authenticator: authenticator)
            try Self.writeManifest(db, manifest)
            let entry = RegistryManifest.rewrittenAuditEntry(manifest, previous: previous, rows: entries.count, actor: actor, reason: reason)
            _ = try Self.appendAudit(db, [AuditAppend(entry: entry)], at: Date())
            return manifest
        }
    }
}
