import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// The PostgreSQL schema and its migrations.
///
/// Rules: migrations are numbered from 1 and recorded in `schema_migrations`; they run at open
/// under a session advisory lock, so instances that start together apply each exactly once;
/// an instance that finds a version it does not know refuses to open instead of writing into a
/// schema it does not understand. Times are milliseconds since 1970 (as in SQLite), so records
/// copy between engines unchanged and hash the same.
extension PostgresStore {
    /// The advisory lock key the migrations run under ("offsgnr" in ASCII).
    static let migrationLockKey: Int64 = 0x6F66_6673_676E_72

    /// Each migration's statements, by version (1-based).
    static let migrations: [[String]] = [
        // 1: the same tables as SQLite's "v1" and "v2", plus the chain head every append locks.
        [
            "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE registry (id INTEGER PRIMARY KEY CHECK (id = 1), version BIGINT NOT NULL)",
            "INSERT INTO registry (id, version) VALUES (1, 1)",
            """
            CREATE TABLE signing_keys (
                key_id TEXT PRIMARY KEY,
                bundle_id TEXT NOT NULL,
                issuer_id TEXT,
                state TEXT NOT NULL CHECK (state IN ('ready', 'active', 'retired', 'revoked')),
                origin TEXT NOT NULL,
                public_key_pem TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                sealed_private_key BYTEA NOT NULL,
                imported_at BIGINT NOT NULL,
                activated_at BIGINT,
                retired_at BIGINT,
                revoked_at BIGINT,
                position BIGINT NOT NULL UNIQUE
            )
            """,
            "CREATE UNIQUE INDEX one_active_key_per_bundle ON signing_keys (bundle_id) WHERE state = 'active'",
            """
            CREATE TABLE api_clients (
                client_id TEXT PRIMARY KEY,
                name TEXT NOT NULL UNIQUE,
                bundle_ids TEXT NOT NULL,
                secret_hash TEXT NOT NULL UNIQUE,
                created_at BIGINT NOT NULL,
                revoked_at BIGINT
            )
            """,
            """
            CREATE TABLE audit_log (
                seq BIGINT PRIMARY KEY,
                recorded_at BIGINT NOT NULL,
                kind TEXT NOT NULL,
                body TEXT NOT NULL,
                previous_hash TEXT NOT NULL,
                hash TEXT NOT NULL
            )
            """,
            """
            CREATE TABLE audit_head (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                seq BIGINT NOT NULL,
                hash TEXT NOT NULL
            )
            """,
            "INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '\(AuditChain.genesisHash)')",
            """
            CREATE TABLE issued_signatures (
                nonce TEXT PRIMARY KEY,
                audit_seq BIGINT NOT NULL,
                issued_at BIGINT NOT NULL,
                client TEXT NOT NULL,
                bundle_id TEXT NOT NULL,
                product_id TEXT NOT NULL,
                offer_id TEXT NOT NULL,
                app_account_token TEXT,
                key_id TEXT NOT NULL,
                format TEXT NOT NULL
            )
            """,
            "CREATE INDEX issued_by_customer ON issued_signatures (app_account_token, bundle_id, offer_id)",
            """
            CREATE TABLE audit_signing_key (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                public_key_pem TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                sealed_private_key BYTEA NOT NULL,
                created_at BIGINT NOT NULL
            )
            """,
            """
            CREATE TABLE audit_checkpoints (
                seq BIGINT PRIMARY KEY,
                head_hash TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                key_fingerprint TEXT NOT NULL,
                signature TEXT NOT NULL
            )
            """,
        ],
        // 2: a registry change (key or client) is announced on `offer_signer_registry`, in the
        // transaction that made it (delivered when it commits), so every instance reloads at once
        // (PostgresStore+Instances.swift listens). Polling the version stays the safety net.
        [
            """
            CREATE FUNCTION offer_signer_registry_changed() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_notify('offer_signer_registry', NEW.version::text);
                RETURN NULL;
            END
            $$
            """,
            "CREATE TRIGGER registry_changed AFTER UPDATE ON registry FOR EACH ROW EXECUTE FUNCTION offer_signer_registry_changed()",
        ],
        // 3: Apple's history (App Store Server Notifications V2, App Store Server API answers) and
        // offer redemptions, the same tables as SQLite's "v3".
        AppleHistorySchema.statements,
        // 4: the subscription index leads with the original transaction ID. Led by bundle and
        // environment (one value each for most deployments), it matched the first two columns of
        // every lookup by transaction ID as well as the primary key did; before the table had
        // statistics (a fresh deployment, the first minute of notifications) the planner could
        // take it, and each signing read walked every transaction of the app: about 1 ms at
        // 3,000 rows, growing with the table. An index no lookup by transaction ID can use as a
        // condition leaves the primary key as the only choice. Built before the old one is
        // dropped: the build only holds writes to the table back; the drop's exclusive lock lasts
        // from the drop to the commit, a moment, so running replicas keep reading.
        [
            "CREATE INDEX apple_transactions_by_original ON apple_transactions (original_transaction_id, bundle_id, environment)",
            "DROP INDEX apple_transactions_by_subscription",
        ],
        // 5: registry rows carry a MAC under the master key (RegistryRowAuthenticator), as
        // SQLite's "v4". A store with no key or client yet is authenticated from the start; an
        // older one waits for `offer-signer store authenticate`.
        [
            "ALTER TABLE signing_keys ADD COLUMN registry_mac TEXT",
            "ALTER TABLE api_clients ADD COLUMN registry_mac TEXT",
            """
            INSERT INTO meta (name, value) SELECT '\(RegistryRowsMarker.name)', '\(RegistryRowsMarker.value)'
            WHERE NOT EXISTS (SELECT 1 FROM signing_keys) AND NOT EXISTS (SELECT 1 FROM api_clients)
            """,
        ],
        // 6: the scheduled notification catch-up's watermark per app and environment (SQLite's
        // "v5-notification-recovery").
        [NotificationRecoverySchema.createTable],
        // 7: redemptions recorded `unplaced` until a fetched history places them, and issuances
        // that keep the customer's original transaction and environment (SQLite's
        // "v6-redemption-placement").
        AppleHistorySchema.unplacedRedemptionStatements,
        // 8: the dashboard's windows (/admin), SQLite's "v7-dashboard": the ledger and notifications
        // by time, notifications by app and environment. Building them holds writes to those
        // tables back for the build (seconds on a million issuances), once, at the upgrade.
        DashboardSchema.indexes,
        // 9: the registry manifest (RegistryManifest), as SQLite's "v8-registry-manifest".
        [
            "ALTER TABLE registry ADD COLUMN manifest_version BIGINT",
            "ALTER TABLE registry ADD COLUMN manifest_mac TEXT",
        ],
        // 10: the daily roll-up of issuances (IssuanceRollUp), filled from the ledger, and the
        // ledger's covering time index dropped (SQLite's "v9-issuance-days"). The fill reads the
        // whole ledger once, at the upgrade.
        IssuanceRollUp.statements,
        // 11: the unplaced-redemption sweep's attempts and back-off (RedemptionPlacementSchedule),
        // and whether an issuance's environment was only declared (IssuanceEnvironmentSchema),
        // SQLite's "v10-redemption-placement-attempts".
        RedemptionPlacementSchema.statements + IssuanceEnvironmentSchema.statements,
        // 12: a decision under a customer's lock takes the lock and reads what it decides on in
        // one round trip (`CustomerDecisionLock`, PostgresStore+Instances.swift).
        [CustomerDecisionLock.createFunction],
    ]

    /// The longest an instance waits to open a store whose schema it must check or migrate.
    static let migrationTimeout: Duration = .seconds(600)

    /// The newest schema version this build knows.
    public static var schemaVersion: Int { migrations.count }

    /// Checks the database on a connection of its own and applies the migrations it lacks,
    /// under the migration lock. A database that has them all is only read (so a read-only
    /// server still opens, for reads). Connecting and the check are bounded by the operation
    /// timeout; the lock wait and the migration by ``migrationTimeout``: a migration may build an
    /// index over a large ledger, and an instance starting beside it waits for its lock. A
    /// deadline closes the connection (which also gives up the session's migration lock).
    func migrate() async throws {
        let logger = self.logger
        let description = configuration.redactedDescription
        let connection = try await bounded("opening store \(description)", discardLate: { try? await $0.close() }) { [directConfiguration] in
            try await PostgresConnection.connect(configuration: directConfiguration, id: 0, logger: logger)
        }
        let closeAtDeadline: @Sendable () -> Void = { let _: EventLoopFuture<Void> = connection.close() }
        do {
            let current = try await bounded("opening store \(description)", onDeadline: closeAtDeadline) {
                try await Self.isCurrent(connection, logger: logger)
            }
            if current == false {
                try await bounded("migrating store \(description)", timeout: max(Self.migrationTimeout, configuration.operationTimeout), onDeadline: closeAtDeadline) {
                    try await connection.run("SELECT pg_advisory_lock(\(Self.migrationLockKey))", logger: logger)
                    do {
                        try await Self.migrate(connection, logger: logger)
                    } catch {
                        // Not on a connection the deadline closed (its lock ended with its
                        // session): a query written to a closed connection is never answered.
                        if !connection.isClosed {
                            _ = try? await connection.query("SELECT pg_advisory_unlock(\(Self.migrationLockKey))", logger: logger)
                        }
                        throw error
                    }
                    try await connection.run("SELECT pg_advisory_unlock(\(Self.migrationLockKey))", logger: logger)
                }
            }
        } catch {
            try? await connection.close()
            throw error
        }
        try? await connection.close()
    }

    /// The schema versions recorded, or nil when there is no `schema_migrations` table yet.
    private static func appliedVersions(_ connection: PostgresConnection, logger: Logger) async throws -> Set<Int>? {
        let exists = try await connection.query("SELECT to_regclass('schema_migrations') IS NOT NULL", logger: logger).collect().first?.decode(Bool.self) ?? false
        guard exists else { return nil }
        var applied = Set<Int>()
        for try await version in try await connection.query("SELECT version FROM schema_migrations", logger: logger).decode(Int.self) {
            applied.insert(version)
        }
        return applied
    }

    /// Whether every migration is applied (without writing anything); throws for a newer schema.
    private static func isCurrent(_ connection: PostgresConnection, logger: Logger) async throws -> Bool {
        guard let applied = try await appliedVersions(connection, logger: logger) else { return false }
        try refuseNewer(applied)
        return (1...schemaVersion).allSatisfy(applied.contains)
    }

    private static func refuseNewer(_ applied: Set<Int>) throws {
        if let newest = applied.max(), newest > schemaVersion {
            throw StoreError(
                .unavailable,
                "database schema version \(newest) is newer than this offer-signer knows (\(schemaVersion)); upgrade offer-signer")
        }
    }

    private static func migrate(_ connection: PostgresConnection, logger: Logger) async throws {
        try await connection.run(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)", logger: logger)
        let applied = try await appliedVersions(connection, logger: logger) ?? []
        try refuseNewer(applied)
        for (index, statements) in migrations.enumerated() where !applied.contains(index + 1) {
            let version = index + 1
            try await connection.run("BEGIN", logger: logger)
            do {
                for statement in statements {
                    try await connection.run(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                let now = Date().unixMilliseconds
                try await connection.run("INSERT INTO schema_migrations (version, applied_at) VALUES (\(version), \(now))", logger: logger)
                try await connection.run("COMMIT", logger: logger)
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw error
            }
            logger.info("applied store schema migration", metadata: ["version": "\(version)"])
        }
    }
}
