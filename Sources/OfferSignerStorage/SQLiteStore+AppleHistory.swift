import Foundation
import GRDB
import OfferSignerCore

/// The tables of Apple's history (schema "v3" in SQLite, migration 3 in PostgreSQL): the same
/// statements serve both engines.
public enum AppleHistorySchema {
    public static let statements: [String] = [
        """
        CREATE TABLE apple_notifications (
            notification_uuid TEXT PRIMARY KEY,
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            notification_type TEXT NOT NULL,
            subtype TEXT,
            original_transaction_id TEXT,
            signed_date BIGINT NOT NULL,
            received_at BIGINT NOT NULL
        )
        """,
        """
        CREATE TABLE apple_subscriptions (
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            original_transaction_id TEXT NOT NULL,
            complete INTEGER NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (bundle_id, environment, original_transaction_id)
        )
        """,
        """
        CREATE TABLE apple_transactions (
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            transaction_id TEXT NOT NULL,
            original_transaction_id TEXT NOT NULL,
            signed_date BIGINT,
            decoded TEXT NOT NULL,
            jws TEXT NOT NULL,
            PRIMARY KEY (bundle_id, environment, transaction_id)
        )
        """,
        "CREATE INDEX apple_transactions_by_subscription ON apple_transactions (bundle_id, environment, original_transaction_id)",
        """
        CREATE TABLE apple_renewal_infos (
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            original_transaction_id TEXT NOT NULL,
            signed_date BIGINT,
            decoded TEXT NOT NULL,
            jws TEXT NOT NULL,
            PRIMARY KEY (bundle_id, environment, original_transaction_id)
        )
        """,
        """
        CREATE TABLE offer_redemptions (
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            transaction_id TEXT NOT NULL,
            original_transaction_id TEXT NOT NULL,
            product_id TEXT NOT NULL,
            offer_id TEXT NOT NULL,
            app_account_token TEXT,
            purchase_date BIGINT NOT NULL,
            issuance_seq BIGINT,
            signature_issued_at BIGINT,
            source TEXT NOT NULL,
            recorded_at BIGINT NOT NULL,
            PRIMARY KEY (bundle_id, environment, transaction_id)
        )
        """,
        "CREATE INDEX offer_redemptions_by_issuance ON offer_redemptions (issuance_seq)",
        "CREATE INDEX offer_redemptions_by_date ON offer_redemptions (purchase_date)",
        "CREATE INDEX issued_by_offer ON issued_signatures (bundle_id, offer_id, issued_at)",
    ]

    /// What identifies one issuance in `issued_signatures` (a request for several formats has a
    /// row, and an audit record, per format, all with the same client, customer, product, offer
    /// and time).
    public static let issuanceKey =
        "client || '|' || COALESCE(app_account_token, '') || '|' || product_id || '|' || offer_id || '|' || CAST(issued_at AS TEXT)"

    /// The tables, for emptiness checks.
    public static var tables: [String] { copiedColumns.map(\.table) }

    /// Each table's columns (TEXT or BIGINT/INTEGER, as ``StoreValue``) and its primary key, for
    /// verbatim copies (`offer-signer store copy`), in the order they are copied.
    public static let copiedColumns: [(table: String, columns: [String], key: [String])] = [
        ("apple_notifications", ["notification_uuid", "bundle_id", "environment", "notification_type", "subtype", "original_transaction_id", "signed_date", "received_at"], ["notification_uuid"]),
        ("apple_subscriptions", ["bundle_id", "environment", "original_transaction_id", "complete", "updated_at"], ["bundle_id", "environment", "original_transaction_id"]),
        ("apple_transactions", ["bundle_id", "environment", "transaction_id", "original_transaction_id", "signed_date", "decoded", "jws"], ["bundle_id", "environment", "transaction_id"]),
        ("apple_renewal_infos", ["bundle_id", "environment", "original_transaction_id", "signed_date", "decoded", "jws"], ["bundle_id", "environment", "original_transaction_id"]),
        ("offer_redemptions", [
            "bundle_id", "environment", "transaction_id", "original_transaction_id", "product_id", "offer_id", "app_account_token", "purchase_date",
            "issuance_seq", "signature_issued_at", "source", "recorded_at", "unplaced", "placed_at", "placement_attempts", "next_placement_at",
        ], ["bundle_id", "environment", "transaction_id"]),
        // The scheduled catch-up's watermarks: a copy goes on from where the source was.
        ("notification_recovery", ["bundle_id", "environment", "recovered_until", "updated_at"], ["bundle_id", "environment"]),
    ]

    /// Columns that hold integers (the others hold text).
    public static let integerColumns: Set<String> = [
        "signed_date", "received_at", "complete", "updated_at", "purchase_date", "issuance_seq", "signature_issued_at", "recorded_at", "unplaced",
        "placed_at", "recovered_until", "placement_attempts", "next_placement_at",
    ]

    /// Redemptions recorded `unplaced` until a fetched history places them (see
    /// ``OfferRedemption``), and issuances that keep the customer's subscription and environment
    /// when known: SQLite "v6-redemption-placement", PostgreSQL migration 7; the same statements
    /// in both.
    public static let unplacedRedemptionStatements: [String] = [
        "ALTER TABLE issued_signatures ADD COLUMN original_transaction_id TEXT",
        "ALTER TABLE issued_signatures ADD COLUMN environment TEXT",
        "ALTER TABLE offer_redemptions ADD COLUMN unplaced BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE offer_redemptions ADD COLUMN placed_at BIGINT",
        "CREATE INDEX offer_redemptions_unplaced ON offer_redemptions (recorded_at) WHERE unplaced = 1",
    ]
}

/// One column's value in a verbatim copy of a table.
public enum StoreValue: Sendable, Equatable {
    case text(String)
    case integer(Int64)
    case null
}

/// Apple's history in SQLite (see ``OfferSignerStore/recordAppleHistory(_:at:)``).
extension SQLiteStore {
    static func migrateAppleHistory(_ db: Database) throws {
        for statement in AppleHistorySchema.statements { try db.execute(sql: statement) }
    }

    public func recordAppleHistories(_ updates: [AppleHistoryUpdate], at time: Date) async throws -> [AppleHistoryUpdateResult] {
        try await write { db in try updates.map { try Self.record($0, at: time, in: db) } }
    }

    private static func record(_ update: AppleHistoryUpdate, at time: Date, in db: Database) throws -> AppleHistoryUpdateResult {
        do {
            let now = time.unixMilliseconds
            if let notification = update.notification {
                try db.cachedStatement(
                    sql: """
                        INSERT INTO apple_notifications (notification_uuid, bundle_id, environment, notification_type, subtype, original_transaction_id, signed_date, received_at)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (notification_uuid) DO NOTHING
                        """).execute(
                    arguments: [
                        notification.notificationUUID, notification.bundleID, notification.environment, notification.notificationType, notification.subtype,
                        notification.originalTransactionID, notification.signedDate.unixMilliseconds, notification.receivedAt.unixMilliseconds,
                    ])
                if db.changesCount == 0 { return .duplicateNotification }
            }
            for subscription in update.subscriptions {
                let complete = update.completeSubscriptions.contains(subscription) ? 1 : 0
                try db.cachedStatement(
                    sql: """
                        INSERT INTO apple_subscriptions (bundle_id, environment, original_transaction_id, complete, updated_at) VALUES (?, ?, ?, ?, ?)
                        ON CONFLICT (bundle_id, environment, original_transaction_id) DO UPDATE SET
                            complete = MAX(apple_subscriptions.complete, excluded.complete),
                            updated_at = MAX(excluded.updated_at, apple_subscriptions.updated_at + 1)
                        """).execute(
                    arguments: [subscription.bundleID, subscription.environment, subscription.originalTransactionID, complete, now])
            }
            for item in update.transactions {
                try db.cachedStatement(
                    sql: """
                        INSERT INTO apple_transactions (bundle_id, environment, transaction_id, original_transaction_id, signed_date, decoded, jws)
                        VALUES (?, ?, ?, ?, ?, ?, ?)
                        ON CONFLICT (bundle_id, environment, transaction_id) DO UPDATE SET
                            original_transaction_id = excluded.original_transaction_id, signed_date = excluded.signed_date,
                            decoded = excluded.decoded, jws = excluded.jws
                        WHERE apple_transactions.signed_date IS NULL OR excluded.signed_date > apple_transactions.signed_date
                            OR (excluded.signed_date = apple_transactions.signed_date
                                AND (excluded.jws IS NOT apple_transactions.jws OR excluded.decoded IS NOT apple_transactions.decoded
                                    OR excluded.original_transaction_id IS NOT apple_transactions.original_transaction_id))
                        """).execute(
                    arguments: [item.bundleID, item.environment, item.key, item.originalTransactionID, item.signedDate?.unixMilliseconds, item.decoded, item.jws])
            }
            for item in update.renewalInfos {
                try db.cachedStatement(
                    sql: """
                        INSERT INTO apple_renewal_infos (bundle_id, environment, original_transaction_id, signed_date, decoded, jws)
                        VALUES (?, ?, ?, ?, ?, ?)
                        ON CONFLICT (bundle_id, environment, original_transaction_id) DO UPDATE SET
                            signed_date = excluded.signed_date, decoded = excluded.decoded, jws = excluded.jws
                        WHERE apple_renewal_infos.signed_date IS NULL OR excluded.signed_date > apple_renewal_infos.signed_date
                            OR (excluded.signed_date = apple_renewal_infos.signed_date
                                AND (excluded.jws IS NOT apple_renewal_infos.jws OR excluded.decoded IS NOT apple_renewal_infos.decoded))
                        """).execute(
                    arguments: [item.bundleID, item.environment, item.key, item.signedDate?.unixMilliseconds, item.decoded, item.jws])
            }
            var redemptions: [OfferRedemption] = []
            for candidate in update.redemptions {
                let seen = try Row.fetchOne(
                    db.cachedStatement(sql: "SELECT unplaced, recorded_at, source FROM offer_redemptions WHERE bundle_id = ? AND environment = ? AND transaction_id = ?"),
                    arguments: [candidate.bundleID, candidate.environment, candidate.transactionID])
                if let seen {
                    // Recorded before: only an unplaced one, now stated placed, changes.
                    guard (seen["unplaced"] as Int64) != 0, candidate.isPlaced else { continue }
                    let issuance = try Self.matchingIssuance(candidate, in: db)
                    var placed = OfferRedemption(
                        candidate: candidate, issuanceSequence: issuance?.0, signatureIssuedAt: issuance.map { Self.date($0.1) }, source: seen["source"],
                        recordedAt: Self.date(seen["recorded_at"] as Int64), placedAt: Self.date(now))
                    let outcome: String
                    if issuance == nil && candidate.continuesRedemption {
                        outcome = "continues"
                        try db.cachedStatement(sql: "DELETE FROM offer_redemptions WHERE bundle_id = ? AND environment = ? AND transaction_id = ?")
                            .execute(arguments: [candidate.bundleID, candidate.environment, candidate.transactionID])
                    } else {
                        outcome = placed.state.rawValue
                        try db.cachedStatement(
                            sql: """
                                UPDATE offer_redemptions SET unplaced = 0, placed_at = ?, issuance_seq = ?, signature_issued_at = ?
                                WHERE bundle_id = ? AND environment = ? AND transaction_id = ?
                                """
                        ).execute(arguments: [now, issuance?.0, issuance?.1, candidate.bundleID, candidate.environment, candidate.transactionID])
                    }
                    placed.source = update.source
                    _ = try Self.appendAudit(db, [AuditAppend(entry: placed.placementAuditEntry(outcome: outcome))], at: time)
                    redemptions.append(placed)
                    continue
                }
                // A pay-as-you-go renewal whose previous period is unknown never matches on its
                // estimate: the window would reach the lost first period's signature.
                let issuance = candidate.continuesRedemption && !candidate.isPlaced ? nil : try Self.matchingIssuance(candidate, in: db)
                let unplaced = issuance == nil && !candidate.isPlaced
                if issuance == nil && candidate.continuesRedemption && !unplaced { continue }
                let redemption = OfferRedemption(
                    candidate: candidate, issuanceSequence: issuance?.0, signatureIssuedAt: issuance.map { Self.date($0.1) }, source: update.source,
                    recordedAt: Self.date(now), isUnplaced: unplaced)
                try db.cachedStatement(
                    sql: """
                        INSERT INTO offer_redemptions (bundle_id, environment, transaction_id, original_transaction_id, product_id, offer_id,
                            app_account_token, purchase_date, issuance_seq, signature_issued_at, source, recorded_at, unplaced)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        """).execute(
                    arguments: [
                        candidate.bundleID, candidate.environment, candidate.transactionID, candidate.originalTransactionID, candidate.productID,
                        candidate.offerID, candidate.appAccountToken, candidate.purchaseDate.unixMilliseconds, issuance?.0, issuance?.1, update.source, now,
                        unplaced ? 1 : 0,
                    ])
                _ = try Self.appendAudit(db, [AuditAppend(entry: redemption.auditEntry)], at: time)
                redemptions.append(redemption)
            }
            return .recorded(redemptions: redemptions)
        }
    }

    /// The issuance a candidate matches (audit sequence, issue time), see ``OfferRedemption``.
    private static func matchingIssuance(_ candidate: RedemptionCandidate, in db: Database) throws -> (Int64, Int64)? {
        let customer = candidate.matchingCustomerKey
        let row = try Row.fetchOne(
            db.cachedStatement(
                sql: """
                SELECT s.audit_seq, s.issued_at FROM issued_signatures s
                WHERE s.bundle_id = ? AND s.offer_id = ? AND s.product_id = ? AND s.issued_at BETWEEN ? AND ?
                  AND (s.app_account_token = ? OR s.original_transaction_id = ?)
                  AND (s.environment IS NULL OR s.environment = ? OR s.environment_declared = 1)
                  AND NOT EXISTS (
                    SELECT 1 FROM offer_redemptions r JOIN issued_signatures m
                      ON m.bundle_id = r.bundle_id AND m.offer_id = r.offer_id AND m.issued_at = r.signature_issued_at AND m.audit_seq = r.issuance_seq
                    WHERE r.bundle_id = s.bundle_id AND r.offer_id = s.offer_id AND r.signature_issued_at = s.issued_at
                      AND (m.audit_seq = s.audit_seq
                        OR (ABS(m.audit_seq - s.audit_seq) = 1 AND m.format <> s.format AND m.client = s.client AND m.product_id = s.product_id
                          AND COALESCE(m.app_account_token, '') = COALESCE(s.app_account_token, '')
                          AND COALESCE(m.original_transaction_id, '') = COALESCE(s.original_transaction_id, '')
                          AND COALESCE(m.environment, '') = COALESCE(s.environment, ''))))
                ORDER BY CASE WHEN s.app_account_token = ? THEN 0 ELSE 1 END,
                  CASE WHEN s.environment = ? THEN 0 WHEN s.environment IS NULL THEN 1 ELSE 2 END,
                  s.issued_at DESC, s.audit_seq DESC
                LIMIT 1
                """),
            arguments: [
                candidate.bundleID, candidate.offerID, candidate.productID, candidate.signatureWindowStart.unixMilliseconds,
                candidate.purchaseDate.addingTimeInterval(RedemptionMatching.clockSkew).unixMilliseconds, customer, candidate.originalTransactionID,
                candidate.environment, customer, candidate.environment,
            ])
        return row.map { ($0["audit_seq"], $0["issued_at"]) }
    }

    /// The subscription `transactionID` belongs to (a transaction ID, or an original transaction
    /// ID the store has no transaction for), with its completeness and version.
    private static func historyVersion(_ db: Database, bundleID: String, environment: String, transactionID: String) throws -> StoredAppleHistoryVersion? {
        let original =
            try String.fetchOne(
                db.cachedStatement(sql: "SELECT original_transaction_id FROM apple_transactions WHERE bundle_id = ? AND environment = ? AND transaction_id = ?"),
                arguments: [bundleID, environment, transactionID])
            ?? transactionID
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT complete, updated_at FROM apple_subscriptions WHERE bundle_id = ? AND environment = ? AND original_transaction_id = ?"),
                arguments: [bundleID, environment, original])
        else { return nil }
        return StoredAppleHistoryVersion(
            subscription: AppleSubscriptionKey(bundleID: bundleID, environment: environment, originalTransactionID: original),
            isComplete: (row["complete"] as Int64) != 0, updatedAt: Date(timeIntervalSince1970: Double(row["updated_at"] as Int64) / 1000))
    }

    public func appleHistoryVersion(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistoryVersion? {
        try pointRead { db in try Self.historyVersion(db, bundleID: bundleID, environment: environment, transactionID: transactionID) }
    }

    public func appleHistory(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistory? {
        try pointRead { db in
            guard let version = try Self.historyVersion(db, bundleID: bundleID, environment: environment, transactionID: transactionID) else { return nil }
            let key = version.subscription
            let original = key.originalTransactionID
            let transactions = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT transaction_id, signed_date, decoded, jws FROM apple_transactions WHERE bundle_id = ? AND environment = ? AND original_transaction_id = ?"),
                arguments: [bundleID, environment, original]
            ).map { row in
                AppleSignedItem(
                    bundleID: bundleID, environment: environment, key: row["transaction_id"], originalTransactionID: original,
                    signedDate: (row["signed_date"] as Int64?).map { Date(timeIntervalSince1970: Double($0) / 1000) }, decoded: row["decoded"], jws: row["jws"])
            }
            let renewalInfos = try Row.fetchAll(
                db.cachedStatement(sql: "SELECT signed_date, decoded, jws FROM apple_renewal_infos WHERE bundle_id = ? AND environment = ? AND original_transaction_id = ?"),
                arguments: [bundleID, environment, original]
            ).map { row in
                AppleSignedItem(
                    bundleID: bundleID, environment: environment, key: original, originalTransactionID: original,
                    signedDate: (row["signed_date"] as Int64?).map { Date(timeIntervalSince1970: Double($0) / 1000) }, decoded: row["decoded"], jws: row["jws"])
            }
            return StoredAppleHistory(
                subscription: key, isComplete: version.isComplete, updatedAt: version.updatedAt, transactions: transactions, renewalInfos: renewalInfos)
        }
    }

    public func offerRedemptions(since: Date?) async throws -> [OfferRedemption] {
        try await read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT * FROM offer_redemptions WHERE purchase_date >= ? ORDER BY purchase_date, transaction_id
                    """, arguments: [since?.unixMilliseconds ?? Int64.min]
            ).map(Self.redemption)
        }
    }

    public func unplacedOfferRedemptions(limit: Int) async throws -> [OfferRedemption] {
        try await read { db in
            try Row.fetchAll(
                db, sql: "SELECT * FROM offer_redemptions WHERE unplaced = 1 ORDER BY recorded_at, transaction_id LIMIT ?", arguments: [limit]
            ).map(Self.redemption)
        }
    }

    static func redemption(_ row: Row) -> OfferRedemption {
        OfferRedemption(
            candidate: RedemptionCandidate(
                transactionID: row["transaction_id"], originalTransactionID: row["original_transaction_id"], bundleID: row["bundle_id"],
                environment: row["environment"], productID: row["product_id"], offerID: row["offer_id"], appAccountToken: row["app_account_token"],
                purchaseDate: date(row["purchase_date"] as Int64)),
            issuanceSequence: row["issuance_seq"], signatureIssuedAt: date(row["signature_issued_at"] as Int64?), source: row["source"],
            recordedAt: date(row["recorded_at"] as Int64), isUnplaced: (row["unplaced"] as Int64) != 0, placedAt: date(row["placed_at"] as Int64?))
    }

    public func offerIssuances(since: Date?) async throws -> [OfferIssuanceCount] {
        try await read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT bundle_id, offer_id, COUNT(DISTINCT \(AppleHistorySchema.issuanceKey)) AS issuances FROM issued_signatures
                    WHERE issued_at >= ? GROUP BY bundle_id, offer_id ORDER BY bundle_id, offer_id
                    """, arguments: [since?.unixMilliseconds ?? Int64.min]
            ).map { row in OfferIssuanceCount(bundleID: row["bundle_id"], offerID: row["offer_id"], issuances: row["issuances"]) }
        }
    }
}
