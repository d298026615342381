import Foundation
import GRDB
import OfferSignerCore

/// The table of the scheduled notification catch-up's watermarks, the same in both stores: per
/// app and environment, the end of the last period whose notification history was recovered
/// (`recovered_until`, Unix milliseconds) and when that run ended (`updated_at`).
public enum NotificationRecoverySchema {
    public static let createTable = """
        CREATE TABLE notification_recovery (
            bundle_id TEXT NOT NULL,
            environment TEXT NOT NULL,
            recovered_until BIGINT NOT NULL,
            updated_at BIGINT NOT NULL,
            PRIMARY KEY (bundle_id, environment)
        )
        """
}

extension SQLiteStore {
    public func appleNotificationReceivedAt(notificationUUID: String) async throws -> Date? {
        try await read { db in
            try Int64.fetchOne(db, sql: "SELECT received_at FROM apple_notifications WHERE notification_uuid = ?", arguments: [notificationUUID])
        }.map { Date(timeIntervalSince1970: Double($0) / 1000) }
    }

    public func notificationRecoveryWatermark(bundleID: String, environment: String) async throws -> Date? {
        try await read { db in
            try Int64.fetchOne(
                db, sql: "SELECT recovered_until FROM notification_recovery WHERE bundle_id = ? AND environment = ?", arguments: [bundleID, environment])
        }.map { Date(timeIntervalSince1970: Double($0) / 1000) }
    }

    public func notificationRecoveryLastRun(bundleID: String, environment: String) async throws -> Date? {
        try await read { db in
            try Int64.fetchOne(
                db, sql: "SELECT updated_at FROM notification_recovery WHERE bundle_id = ? AND environment = ?", arguments: [bundleID, environment])
        }.map { Date(timeIntervalSince1970: Double($0) / 1000) }
    }

    public func setNotificationRecoveryWatermark(bundleID: String, environment: String, recoveredUntil: Date, at time: Date) async throws {
        try await write { db in
            try db.execute(
                sql: """
                    INSERT INTO notification_recovery (bundle_id, environment, recovered_until, updated_at) VALUES (?, ?, ?, ?)
                    ON CONFLICT (bundle_id, environment) DO UPDATE SET
                        recovered_until = MAX(notification_recovery.recovered_until, excluded.recovered_until), updated_at = excluded.updated_at
                    """, arguments: [bundleID, environment, recoveredUntil.unixMilliseconds, time.unixMilliseconds])
        }
    }
}
