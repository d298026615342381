import Foundation
import GRDB

/// The SQLite schema: its migrations, applied in order when the store is opened (the later ones
/// in SQLiteStore+AuditCheckpoints.swift and SQLiteStore+AppleHistory.swift).
extension SQLiteStore {
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE registry (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
                INSERT INTO registry (id, version) VALUES (1, 1);
                CREATE TABLE signing_keys (
                    key_id TEXT PRIMARY KEY,
                    bundle_id TEXT NOT NULL,
                    issuer_id TEXT,
                    state TEXT NOT NULL CHECK (state IN ('ready', 'active', 'retired', 'revoked')),
                    origin TEXT NOT NULL,
                    public_key_pem TEXT NOT NULL,
                    fingerprint TEXT NOT NULL,
                    sealed_private_key BLOB NOT NULL,
                    imported_at INTEGER NOT NULL,
                    activated_at INTEGER,
                    retired_at INTEGER,
                    revoked_at INTEGER,
                    position INTEGER NOT NULL
                );
                CREATE UNIQUE INDEX one_active_key_per_bundle ON signing_keys (bundle_id) WHERE state = 'active';
                CREATE TABLE api_clients (
                    client_id TEXT PRIMARY KEY,
                    name TEXT NOT NULL UNIQUE,
                    bundle_ids TEXT NOT NULL,
                    secret_hash TEXT NOT NULL UNIQUE,
                    created_at INTEGER NOT NULL,
                    revoked_at INTEGER
                );
                CREATE TABLE audit_log (
                    seq INTEGER PRIMARY KEY,
                    recorded_at INTEGER NOT NULL,
                    kind TEXT NOT NULL,
                    body TEXT NOT NULL,
                    previous_hash TEXT NOT NULL,
                    hash TEXT NOT NULL
                );
                CREATE TABLE issued_signatures (
                    nonce TEXT PRIMARY KEY,
                    audit_seq INTEGER NOT NULL,
                    issued_at INTEGER NOT NULL,
                    client TEXT NOT NULL,
                    bundle_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    offer_id TEXT NOT NULL,
                    app_account_token TEXT,
                    key_id TEXT NOT NULL,
                    format TEXT NOT NULL
                );
                CREATE INDEX issued_by_customer ON issued_signatures (app_account_token, bundle_id, offer_id);
                """)
        }
        migrator.registerMigration("v2") { db in
            try Self.migrateAuditCheckpoints(db)
        }
        migrator.registerMigration("v3") { db in
            try Self.migrateAppleHistory(db)
        }
        // Registry rows carry a MAC under the master key (RegistryRowAuthenticator). A store
        // with no key or client yet is authenticated from the start; an older one waits for
        // `offer-signer store authenticate`.
        migrator.registerMigration("v4") { db in
            try db.execute(sql: """
                ALTER TABLE signing_keys ADD COLUMN registry_mac TEXT;
                ALTER TABLE api_clients ADD COLUMN registry_mac TEXT;
                """)
            try db.execute(
                sql: """
                    INSERT INTO meta (name, value) SELECT ?, ?
                    WHERE NOT EXISTS (SELECT 1 FROM signing_keys) AND NOT EXISTS (SELECT 1 FROM api_clients)
                    """,
                arguments: [RegistryRowsMarker.name, RegistryRowsMarker.value])
        }
        // The scheduled notification catch-up's watermark per app and environment.
        migrator.registerMigration("v5-notification-recovery") { db in
            try db.execute(sql: NotificationRecoverySchema.createTable)
        }
        // Redemptions recorded `unplaced` until a fetched history places them, and issuances that
        // keep the customer's original transaction and environment.
        migrator.registerMigration("v6-redemption-placement") { db in
            for statement in AppleHistorySchema.unplacedRedemptionStatements { try db.execute(sql: statement) }
        }
        // The dashboard's windows (/admin): the ledger and notifications by time, notifications by app.
        migrator.registerMigration("v7-dashboard") { db in
            for statement in DashboardSchema.indexes { try db.execute(sql: statement) }
        }
        // The registry manifest (RegistryManifest): written by the CLI with every registry
        // change; a store with rows and none waits for `offer-signer store authenticate`.
        migrator.registerMigration("v8-registry-manifest") { db in
            try db.execute(sql: """
                ALTER TABLE registry ADD COLUMN manifest_version INTEGER;
                ALTER TABLE registry ADD COLUMN manifest_mac TEXT;
                """)
        }
        // The daily roll-up of issuances (IssuanceRollUp), filled from the ledger; the ledger's
        // covering time index goes (the roll-up answers the dashboard's windows).
        migrator.registerMigration("v9-issuance-days") { db in
            for statement in IssuanceRollUp.statements { try db.execute(sql: statement) }
        }
        // The unplaced-redemption sweep's attempts and back-off (RedemptionPlacementSchedule), and
        // whether an issuance's environment was only declared (IssuanceEnvironmentSchema).
        migrator.registerMigration("v10-redemption-placement-attempts") { db in
            for statement in RedemptionPlacementSchema.statements + IssuanceEnvironmentSchema.statements { try db.execute(sql: statement) }
        }
        return migrator
    }
}
