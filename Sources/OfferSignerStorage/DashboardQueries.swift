import Foundation
import GRDB
import OfferSignerCore

/// What the operator's dashboard (`/admin`) reads, the same in both stores: every query is
/// bounded by a time window and served by an index (``DashboardSchema``), so opening a page costs
/// the rows of the window, not the store's whole history.
public enum DashboardSchema {
    /// Milliseconds in a UTC day: the dashboard's charts count per UTC day (`time / dayMilliseconds`).
    public static let dayMilliseconds: Int64 = 86_400_000

    /// The indexes the dashboard's windows need (SQLite "v7-dashboard", PostgreSQL migration 8):
    /// the ledger by time, covering every column the offers chart and clients' last use read (so
    /// a window is read from the index alone, without a visit to each row), notifications by
    /// time, covering what the per-type-per-day counts read, and by app and environment (the
    /// last one received). SQLite "v9-issuance-days" and PostgreSQL 10 drop the ledger's time
    /// index again: the daily roll-up (``IssuanceRollUp``) answers what it served.
    public static let indexes: [String] = [
        "CREATE INDEX issued_by_time ON issued_signatures (issued_at, bundle_id, offer_id, client, product_id, app_account_token)",
        "CREATE INDEX apple_notifications_by_time ON apple_notifications (received_at, bundle_id, environment, notification_type)",
        "CREATE INDEX apple_notifications_by_app ON apple_notifications (bundle_id, environment, received_at)",
    ]

    static let notificationsPerDay = """
        SELECT bundle_id, environment, notification_type, received_at / \(dayMilliseconds) AS day, COUNT(*) AS received
        FROM apple_notifications INDEXED BY apple_notifications_by_time WHERE received_at >= ? GROUP BY bundle_id, environment, notification_type, day
        ORDER BY bundle_id, environment, notification_type, day
        """
    static let lastNotification = "SELECT received_at FROM apple_notifications WHERE bundle_id = ? AND environment = ? ORDER BY received_at DESC LIMIT 1"
}

/// The last intact run of `offer-signer audit verify`, kept in the store's `meta` table (name
/// ``metaName``) for the dashboard. It says when the check last passed; it is not evidence (whoever
/// can write the store can write it): the evidence is running `audit verify` again.
public struct AuditVerificationRecord: Sendable, Equatable {
    public static let metaName = "last_audit_verification"

    public var verifiedAt: Date
    public var recordsChecked: Int64
    public var throughSequence: Int64
    public var headHash: String

    public init(verifiedAt: Date, recordsChecked: Int64, throughSequence: Int64, headHash: String) {
        self.verifiedAt = verifiedAt
        self.recordsChecked = recordsChecked
        self.throughSequence = throughSequence
        self.headHash = headHash
    }

    /// `<verified at, ms>|<records>|<through sequence>|<head hash>`.
    public var metaValue: String { "\(verifiedAt.unixMilliseconds)|\(recordsChecked)|\(throughSequence)|\(headHash)" }

    public init?(metaValue: String) {
        let parts = metaValue.split(separator: "|", omittingEmptySubsequences: false)
        guard parts.count == 4, let at = Int64(parts[0]), let records = Int64(parts[1]), let through = Int64(parts[2]) else { return nil }
        self.init(verifiedAt: Date(timeIntervalSince1970: Double(at) / 1000), recordsChecked: records, throughSequence: through, headHash: String(parts[3]))
    }
}

/// Issuances of one offer on one UTC day (`day`: days since 1970-01-01), counted as
/// `offerIssuances` counts them (one per signing request, whatever its formats).
public struct OfferIssuanceDay: Sendable, Equatable {
    public var bundleID: String
    public var offerID: String
    public var day: Int64
    public var issuances: Int64

    public init(bundleID: String, offerID: String, day: Int64, issuances: Int64) {
        self.bundleID = bundleID
        self.offerID = offerID
        self.day = day
        self.issuances = issuances
    }

    /// The per-offer totals of these days, as `offerIssuances(since:)` gives them for the same
    /// window: an issuance's key includes its time, so no issuance is counted on two days.
    public static func totals(_ days: [OfferIssuanceDay]) -> [OfferIssuanceCount] {
        var totals: [String: OfferIssuanceCount] = [:]
        for day in days {
            let key = day.bundleID + "\u{1F}" + day.offerID
            totals[key, default: OfferIssuanceCount(bundleID: day.bundleID, offerID: day.offerID, issuances: 0)].issuances += day.issuances
        }
        return totals.values.sorted { ($0.bundleID, $0.offerID) < ($1.bundleID, $1.offerID) }
    }
}

/// App Store Server Notifications received on one UTC day, per app, environment and type.
public struct AppleNotificationDay: Sendable, Equatable {
    public var bundleID: String
    public var environment: String
    public var notificationType: String
    public var day: Int64
    public var received: Int64

    public init(bundleID: String, environment: String, notificationType: String, day: Int64, received: Int64) {
        self.bundleID = bundleID
        self.environment = environment
        self.notificationType = notificationType
        self.day = day
        self.received = received
    }
}

extension SQLiteStore {
    /// From the roll-up (``IssuanceRollUp``); a first day that starts after midnight from the ledger.
    public func offerIssuancesPerDay(since: Date) async throws -> [OfferIssuanceDay] {
        let (firstDay, whole) = IssuanceRollUp.firstDay(of: since)
        return try await read { db in
            let rows = try Row.fetchAll(db, sql: IssuanceRollUp.perDayStatement, arguments: [firstDay]).map { row in
                OfferIssuanceDay(bundleID: row["bundle_id"], offerID: row["offer_id"], day: row["day"], issuances: row["issuances"])
            }
            let partial = whole
                ? nil
                : try Row.fetchAll(
                    db, sql: IssuanceRollUp.partialDayStatement,
                    arguments: [firstDay, since.unixMilliseconds, (firstDay + 1) * DashboardSchema.dayMilliseconds]
                ).map { row in OfferIssuanceCount(bundleID: row["bundle_id"], offerID: row["offer_id"], issuances: row["issuances"]) }
            return IssuanceRollUp.window(rows, firstDay: firstDay, partial: partial)
        }
    }

    public func appleNotificationsPerDay(since: Date) async throws -> [AppleNotificationDay] {
        try await read { db in
            try Row.fetchAll(db, sql: DashboardSchema.notificationsPerDay, arguments: [since.unixMilliseconds]).map { row in
                AppleNotificationDay(
                    bundleID: row["bundle_id"], environment: row["environment"], notificationType: row["notification_type"], day: row["day"],
                    received: row["received"])
            }
        }
    }

    public func lastAppleNotificationReceived(bundleID: String, environment: String) async throws -> Date? {
        try await read { db in
            try Int64.fetchOne(db, sql: DashboardSchema.lastNotification, arguments: [bundleID, environment])
        }.map { Date(timeIntervalSince1970: Double($0) / 1000) }
    }

    /// From the roll-up's newest time per day (``IssuanceRollUp``): one primary-key range per client.
    public func lastIssuances(clients: [String], since: Date) async throws -> [String: Date] {
        let firstDay = IssuanceRollUp.firstDay(of: since).day
        return try await read { db in
            var last: [String: Date] = [:]
            for client in clients {
                if let time = try Int64.fetchOne(db, sql: IssuanceRollUp.lastIssuanceStatement, arguments: [client, firstDay]), time >= since.unixMilliseconds {
                    last[client] = Date(timeIntervalSince1970: Double(time) / 1000)
                }
            }
            return last
        }
    }

    public func recordAuditVerification(_ record: AuditVerificationRecord) async throws {
        try await write { db in
            try db.execute(
                sql: "INSERT INTO meta (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                arguments: [AuditVerificationRecord.metaName, record.metaValue])
        }
    }

    public func lastAuditVerification() async throws -> AuditVerificationRecord? {
        try await read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = ?", arguments: [AuditVerificationRecord.metaName])
        }.flatMap { AuditVerificationRecord(metaValue: $0) }
    }
}
