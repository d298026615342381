import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// Master key, keys and clients. Every change locks the registry row first (`FOR UPDATE`), so
/// changes from several instances apply one at a time, bump the version once each, and are
/// audited in the same transaction.
extension PostgresStore {
    static let keyColumns = """
        key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key,
        imported_at, activated_at, retired_at, revoked_at, registry_mac
        """

    typealias KeyRow = (String, String, String?, String, String, String, String, Data, Int64, Int64?, Int64?, Int64?, String?)

    static func key(from row: PostgresRow) throws -> SigningKeyRecord {
        let columns = try row.decode(KeyRow.self)
        guard let state = SigningKeyState(rawValue: columns.3) else {
            throw StoreError(.unavailable, "signing_keys.state holds an unknown state (was the store edited by hand?)")
        }
        return SigningKeyRecord(
            keyID: columns.0, bundleID: columns.1, issuerID: columns.2, state: state, origin: columns.4, publicKeyPEM: columns.5,
            fingerprint: columns.6, importedAt: date(columns.8), activatedAt: optionalDate(columns.9), retiredAt: optionalDate(columns.10),
            revokedAt: optionalDate(columns.11), sealedPrivateKey: columns.7, registryMAC: columns.12)
    }

    static let clientColumns = "client_id, name, bundle_ids, secret_hash, created_at, revoked_at, registry_mac"

    static func client(from row: PostgresRow) throws -> APIClientRecord {
        let (clientID, name, bundles, secretHash, createdAt, revokedAt, mac) = try row.decode((String, String, String, String, Int64, Int64?, String?).self)
        return APIClientRecord(
            clientID: clientID, name: name, bundleIDs: bundles.isEmpty ? [] : bundles.split(separator: " ").map(String.init),
            secretHash: secretHash, createdAt: date(createdAt), revokedAt: optionalDate(revokedAt), registryMAC: mac)
    }

    static func rowsAuthenticated(_ connection: PostgresConnection, _ logger: Logger) async throws -> Bool {
        try await connection.query("SELECT 1 FROM meta WHERE name = \(RegistryRowsMarker.name)", logger: logger).collect().count > 0
    }

    static func storedManifest(_ connection: PostgresConnection, _ logger: Logger) async throws -> StoredRegistryManifest? {
        guard let row = try await connection.query("SELECT manifest_version, manifest_mac FROM registry WHERE id = 1", logger: logger).collect().first else {
            return nil
        }
        let (version, mac) = try row.decode((Int64?, String?).self)
        guard let version, let mac else { return nil }
        return StoredRegistryManifest(version: version, mac: mac)
    }

    static func manifestEntries(_ connection: PostgresConnection, _ logger: Logger) async throws -> [RegistryManifestEntry] {
        var entries: [RegistryManifestEntry] = []
        for try await (id, mac) in try await connection.query("SELECT key_id, registry_mac FROM signing_keys", logger: logger).decode((String, String?).self) {
            entries.append(RegistryManifestEntry(table: "signing_keys", rowID: id, rowMAC: mac))
        }
        for try await (id, mac) in try await connection.query("SELECT client_id, registry_mac FROM api_clients", logger: logger).decode((String, String?).self) {
            entries.append(RegistryManifestEntry(table: "api_clients", rowID: id, rowMAC: mac))
        }
        return entries.sorted()
    }

    static func writeManifest(_ connection: PostgresConnection, _ logger: Logger, _ manifest: StoredRegistryManifest) async throws {
        try await connection.run(
            "UPDATE registry SET manifest_version = \(manifest.version), manifest_mac = \(manifest.mac) WHERE id = 1", logger: logger)
    }

    /// Runs a registry change (see ``RegistryManifest``) in the caller's transaction: locks the
    /// registry row and bumps its version, checks that the stored manifest vouches for the rows,
    /// runs `change`, then writes the next manifest.
    static func changeRegistry<T: Sendable>(
        _ connection: PostgresConnection, _ logger: Logger, _ authenticator: RegistryRowAuthenticator, _ change: (inout [RegistryManifestEntry]) async throws -> T
    ) async throws -> T {
        try await lockAndBumpRegistry(connection, logger)
        let previous = try await manifestEntries(connection, logger)
        let version = try RegistryManifest.checkBeforeChange(
            stored: try await storedManifest(connection, logger), entries: previous, authenticator: authenticator)
        var written: [RegistryManifestEntry] = []
        let result = try await change(&written)
        let expected = RegistryManifest.expected(previous: previous, written: written)
        try RegistryManifest.checkWritten(expected: expected, actual: try await manifestEntries(connection, logger))
        try await writeManifest(connection, logger, RegistryManifest.next(after: version, entries: expected, authenticator: authenticator))
        return result
    }

    /// Runs a registry INSERT or UPDATE (given without RETURNING) and refuses unless it changed
    /// exactly one row (a `DO INSTEAD NOTHING` rule or a trigger returning NULL changes none).
    static func runChangingOneRow(_ connection: PostgresConnection, _ logger: Logger, _ query: PostgresQuery, _ what: String) async throws {
        let returning = PostgresQuery(unsafeSQL: query.sql + " RETURNING 1", binds: query.binds)
        let count = try await connection.query(returning, logger: logger).collect().count
        try RegistryManifest.checkOneRowChanged(count, what)
    }

    static func writeKeyState(_ connection: PostgresConnection, _ logger: Logger, _ key: SigningKeyRecord, _ written: inout [RegistryManifestEntry]) async throws {
        try await runChangingOneRow(connection, logger,
            """
            UPDATE signing_keys SET state = \(key.state.rawValue), activated_at = \(key.activatedAt?.unixMilliseconds), retired_at = \(key.retiredAt?.unixMilliseconds),
                revoked_at = \(key.revokedAt?.unixMilliseconds), registry_mac = \(key.registryMAC)
            WHERE key_id = \(key.keyID)
            """, "the update of key '\(key.keyID)'")
        written.append(RegistryManifestEntry(key: key))
    }

    static func all<T>(_ sequence: PostgresRowSequence, _ transform: (PostgresRow) throws -> T) async throws -> [T] {
        var values: [T] = []
        for try await row in sequence { values.append(try transform(row)) }
        return values
    }

    /// Locks the registry row for the rest of the transaction and bumps its version; then locks
    /// the key and client tables against writes (reads go on), so no row changes between the
    /// manifest check and the manifest written (see ``changeRegistry``).
    static func lockAndBumpRegistry(_ connection: PostgresConnection, _ logger: Logger) async throws {
        try await connection.run("UPDATE registry SET version = version + 1 WHERE id = 1", logger: logger)
        try await connection.run("LOCK TABLE signing_keys, api_clients IN EXCLUSIVE MODE", logger: logger)
    }

    /// Reads the stored check value first, so binding an already bound store writes nothing
    /// (it works on a read-only server); the first binding inserts it, and when two instances
    /// race, the one inserted first is the one compared.
    public func bindMasterKey(_ masterKey: MasterKey) async throws {
        let check = masterKey.checkValue
        let stored = try await rows("binding the master key", "SELECT value FROM meta WHERE name = 'master_key_check'").first?.decode(String.self)
        if let stored {
            guard stored == check else {
                throw StoreError(.masterKeyMismatch, "the master key does not match the one this store's keys were sealed with")
            }
            return
        }
        let auditKey = AuditSigningKey.derived(from: masterKey)
        let sealed = auditKey.sealed(with: masterKey)
        try await transaction("binding the master key") { connection, logger in
            try await connection.run(
                "INSERT INTO meta (name, value) VALUES ('master_key_check', \(check)) ON CONFLICT (name) DO NOTHING", logger: logger)
            let stored = try await connection.query("SELECT value FROM meta WHERE name = 'master_key_check'", logger: logger).collect().first?.decode(String.self)
            guard stored == check else {
                throw StoreError(.masterKeyMismatch, "the master key does not match the one this store's keys were sealed with")
            }
            // A new store gets its audit-signing key (derived) with its master key; an older or
            // tampered one is left to `auditSigningKey`, which refuses.
            try await Self.storeDerivedAuditKeyIfFresh(connection, logger, key: auditKey, sealed: sealed, refuse: false)
        }
    }

    /// Nothing to prepare: PostgreSQL does its own housekeeping.
    public func prepareForServing() async throws {}

    /// Nothing to do: PostgreSQL does its own housekeeping (autovacuum, checkpoints).
    public func performMaintenance() async throws {}

    public func ping() async throws {
        _ = try await rows("pinging the store", "SELECT version FROM registry WHERE id = 1")
    }

    public func registryVersion() async throws -> Int64 {
        try await rows("reading the registry version", "SELECT version FROM registry WHERE id = 1").first?.decode(Int64.self) ?? 0
    }

    public func registryChangeMark() async throws -> String {
        guard let row = try await rows("reading the registry version", "SELECT version, manifest_version, manifest_mac FROM registry WHERE id = 1").first else {
            return ""
        }
        let (version, manifestVersion, mac) = try row.decode((Int64, Int64?, String?).self)
        return "\(version)/\(manifestVersion ?? -1)/\(mac ?? "")"
    }

    public func registrySnapshot() async throws -> RegistrySnapshot {
        // One transaction (REPEATABLE READ) so keys and clients match the version.
        try await transaction("reading the registry") { connection, logger in
            try await connection.run("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger)
            var version: Int64 = 0
            for try await value in try await connection.query("SELECT version FROM registry WHERE id = 1", logger: logger).decode(Int64.self) {
                version = value
            }
            let keys = try await Self.all(
                try await connection.query(PostgresQuery(unsafeSQL: "SELECT \(Self.keyColumns) FROM signing_keys ORDER BY position"), logger: logger),
                Self.key(from:))
            let clients = try await Self.all(
                try await connection.query(PostgresQuery(unsafeSQL: "SELECT \(Self.clientColumns) FROM api_clients ORDER BY created_at, name"), logger: logger),
                Self.client(from:))
            return RegistrySnapshot(
                version: version, keys: keys, clients: clients, rowsAuthenticated: try await Self.rowsAuthenticated(connection, logger),
                manifest: try await Self.storedManifest(connection, logger))
        }
    }

    public func importKey(_ key: SigningKeyRecord, actor: String, reason: String?, authenticator: RegistryRowAuthenticator) async throws -> SigningKeyRecord {
        try await transaction("importing key '\(key.keyID)'") { connection, logger in try await Self.changeRegistry(connection, logger, authenticator) { written in
            if try await connection.query("SELECT 1 FROM signing_keys WHERE key_id = \(key.keyID)", logger: logger).collect().count > 0 {
                throw StoreError(.duplicate, "key '\(key.keyID)' is already in the store")
            }
            if let existing = try await connection.query(
                "SELECT key_id FROM signing_keys WHERE fingerprint = \(key.fingerprint)", logger: logger
            ).collect().first {
                throw StoreError(.duplicate, "this key is already in the store as '\(try existing.decode(String.self))'")
            }
            let hasActive = try await connection.query(
                "SELECT 1 FROM signing_keys WHERE bundle_id = \(key.bundleID) AND state = 'active'", logger: logger
            ).collect().count > 0
            var stored = key
            stored.state = hasActive ? .ready : .active
            stored.activatedAt = hasActive ? nil : key.importedAt
            stored = authenticator.authenticated(stored)
            try await Self.runChangingOneRow(connection, logger,
                """
                INSERT INTO signing_keys (key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key, imported_at, activated_at, position, registry_mac)
                VALUES (\(stored.keyID), \(stored.bundleID), \(stored.issuerID), \(stored.state.rawValue), \(stored.origin), \(stored.publicKeyPEM),
                        \(stored.fingerprint), \(stored.sealedPrivateKey), \(stored.importedAt.unixMilliseconds), \(stored.activatedAt?.unixMilliseconds),
                        (SELECT COALESCE(MAX(position), 0) + 1 FROM signing_keys), \(stored.registryMAC))
                """, "the insert of key '\(stored.keyID)'")
            written.append(RegistryManifestEntry(key: stored))
            let body = AuditBody.make([
                ("actor", actor), ("reason", reason), ("keyID", stored.keyID), ("bundleID", stored.bundleID),
                ("origin", stored.origin), ("state", stored.state.rawValue), ("fingerprint", stored.fingerprint),
            ])
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: AuditEntry(kind: "key.imported", body: body))], at: key.importedAt)
            return stored
        } }
    }

    public func listKeys() async throws -> [SigningKeyRecord] {
        try await rows("listing keys", PostgresQuery(unsafeSQL: "SELECT \(Self.keyColumns) FROM signing_keys ORDER BY position")).map(Self.key(from:))
    }

    static func fetchKey(_ connection: PostgresConnection, _ logger: Logger, where condition: PostgresQuery) async throws -> SigningKeyRecord? {
        let query = PostgresQuery(unsafeSQL: "SELECT \(keyColumns) FROM signing_keys WHERE " + condition.sql, binds: condition.binds)
        return try await connection.query(query, logger: logger).collect().first.map(key(from:))
    }

    /// Locks the rows it reads (`FOR UPDATE`), checks their MACs, and writes the key (and the
    /// bundle's previous active key) as planned from those verified records, with the MACs of
    /// the planned records: a concurrent SQL change of a row either lands before the lock (and
    /// the row's MAC fails) or waits for the commit (and breaks the MAC written).
    public func transitionKey(
        keyID: String, to state: SigningKeyState, actor: String, reason: String?, force: Bool, authenticator: RegistryRowAuthenticator
    ) async throws -> SigningKeyRecord {
        try await transaction("changing key '\(keyID)'") { connection, logger in try await Self.changeRegistry(connection, logger, authenticator) { written in
            guard let key = try await Self.fetchKey(connection, logger, where: "key_id = \(keyID) FOR UPDATE") else {
                throw StoreError(.notFound, "no key '\(keyID)' in the store")
            }
            let previousActive = try await Self.fetchKey(connection, logger, where: "bundle_id = \(key.bundleID) AND state = 'active' FOR UPDATE")
            let now = Date()
            let plan = try KeyRegistry.planTransition(
                key: key, previousActive: previousActive, to: state, force: force, now: now, authenticator: authenticator)
            if let retired = plan.retired { try await Self.writeKeyState(connection, logger, retired, &written) }
            try await Self.writeKeyState(connection, logger, plan.key, &written)
            let entry = KeyRegistry.transitionAuditEntry(plan, from: key, previousActive: previousActive, actor: actor, reason: reason)
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: entry)], at: now)
            return plan.key
        } }
    }

    public func createClient(_ client: APIClientRecord, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord {
        try await transaction("creating client '\(client.name)'") { connection, logger in try await Self.changeRegistry(connection, logger, authenticator) { written in
            if try await connection.query("SELECT 1 FROM api_clients WHERE name = \(client.name)", logger: logger).collect().count > 0 {
                throw StoreError(.duplicate, "a client named '\(client.name)' exists already")
            }
            let bundles = client.bundleIDs.joined(separator: " ")
            let client = authenticator.authenticated(client)
            try await Self.runChangingOneRow(connection, logger,
                """
                INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at, registry_mac)
                VALUES (\(client.clientID), \(client.name), \(bundles), \(client.secretHash), \(client.createdAt.unixMilliseconds), \(client.registryMAC))
                """, "the insert of client '\(client.name)'")
            written.append(RegistryManifestEntry(client: client))
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", client.name), ("bundleIDs", bundles)])
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: AuditEntry(kind: "client.created", body: body))], at: client.createdAt)
            return client
        } }
    }

    public func listClients() async throws -> [APIClientRecord] {
        try await rows("listing clients", PostgresQuery(unsafeSQL: "SELECT \(Self.clientColumns) FROM api_clients ORDER BY created_at, name")).map(Self.client(from:))
    }

    public func revokeClient(name: String, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord {
        try await transaction("revoking client '\(name)'") { connection, logger in try await Self.changeRegistry(connection, logger, authenticator) { written in
            guard let row = try await connection.query(
                "SELECT \(unescaped: Self.clientColumns) FROM api_clients WHERE name = \(name) FOR UPDATE", logger: logger
            ).collect().first else {
                throw StoreError(.notFound, "no client named '\(name)'")
            }
            var client = try Self.client(from: row)
            guard client.revokedAt == nil else { throw StoreError(.conflict, "client '\(name)' is already revoked") }
            let now = Date()
            client.revokedAt = Self.date(now.unixMilliseconds)
            client = authenticator.authenticated(client)
            try await Self.runChangingOneRow(connection, logger,
                "UPDATE api_clients SET revoked_at = \(now.unixMilliseconds), registry_mac = \(client.registryMAC) WHERE client_id = \(client.clientID)",
                "the update of client '\(name)'")
            written.append(RegistryManifestEntry(client: client))
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", name)])
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: AuditEntry(kind: "client.revoked", body: body))], at: now)
            return client
        } }
    }

    public func authenticateRegistry(authenticator: RegistryRowAuthenticator, actor: String) async throws -> RegistryAuthenticationSummary {
        try await transaction("authenticating the registry rows") { connection, logger in
            try await Self.lockAndBumpRegistry(connection, logger)
            guard try await !Self.rowsAuthenticated(connection, logger) else { throw KeyRegistry.alreadyAuthenticated }
            let keys = try await Self.all(
                try await connection.query(
                    PostgresQuery(unsafeSQL: "SELECT \(Self.keyColumns) FROM signing_keys WHERE registry_mac IS NULL ORDER BY position"), logger: logger),
                Self.key(from:))
            for key in keys {
                try await connection.run("UPDATE signing_keys SET registry_mac = \(authenticator.mac(for: key)) WHERE key_id = \(key.keyID)", logger: logger)
            }
            let clients = try await Self.all(
                try await connection.query(
                    PostgresQuery(unsafeSQL: "SELECT \(Self.clientColumns) FROM api_clients WHERE registry_mac IS NULL ORDER BY created_at, name"), logger: logger),
                Self.client(from:))
            for client in clients {
                try await connection.run(
                    "UPDATE api_clients SET registry_mac = \(authenticator.mac(for: client)) WHERE client_id = \(client.clientID)", logger: logger)
            }
            try await connection.run("INSERT INTO meta (name, value) VALUES (\(RegistryRowsMarker.name), \(RegistryRowsMarker.value))", logger: logger)
            // The first manifest, over the rows just authenticated.
            let previous = try await Self.storedManifest(connection, logger)
            try RegistryManifest.checkNotRolledBack(version: previous?.version ?? 0, authenticator: authenticator)
            let manifest = RegistryManifest.next(after: previous?.version ?? 0, entries: try await Self.manifestEntries(connection, logger), authenticator: authenticator)
            try await Self.writeManifest(connection, logger, manifest)
            let summary = RegistryAuthenticationSummary(keyIDs: keys.map(\.keyID), clientNames: clients.map(\.name))
            _ = try await Self.appendAudit(
                connection, logger, [AuditAppend(entry: KeyRegistry.authenticationAuditEntry(summary, actor: actor))], at: Date())
            return summary
        }
    }

    public func writeRegistryManifest(authenticator: RegistryRowAuthenticator, actor: String, reason: String) async throws -> StoredRegistryManifest {
        try await transaction("writing the registry manifest") { connection, logger in
            try await Self.lockAndBumpRegistry(connection, logger)
            let previous = try await Self.storedManifest(connection, logger)
            let entries = try await Self.manifestEntries(connection, logger)
            let manifest = RegistryManifest.next(after: previous?.version ?? 0, entries: entries, authenticator: authenticator)
            try await Self.writeManifest(connection, logger, manifest)
            let entry = RegistryManifest.rewrittenAuditEntry(manifest, previous: previous, rows: entries.count, actor: actor, reason: reason)
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: entry)], at: Date())
            return manifest
        }
    }
}
