import Foundation
import GRDB
import OfferSignerCore

/// The unplaced-redemption sweep's attempts in SQLite (see ``RedemptionPlacementSchedule``).
extension SQLiteStore {
    public func dueUnplacedOfferRedemptions(at time: Date, after cursor: UnplacedRedemptionCursor, limit: Int) async throws -> [UnplacedRedemption] {
        let due = RedemptionPlacementSchema.dueAt
        return try await read { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT *, \(due) AS due_at FROM offer_redemptions
                        WHERE \(RedemptionPlacementSchema.askable) AND \(due) <= ?
                          AND (\(RedemptionPlacementSchema.sweepOrder)) > (?, ?, ?, ?, ?)
                        ORDER BY \(RedemptionPlacementSchema.sweepOrder) LIMIT ?
                        """),
                arguments: [
                    time.unixMilliseconds, cursor.placementAttempts, cursor.dueAt, cursor.bundleID, cursor.environment, cursor.transactionID, limit,
                ]
            ).map(Self.unplacedRedemption)
        }
    }

    public func recordRedemptionPlacementAttempt(
        _ subscription: AppleSubscriptionKey, at time: Date, outcome: RedemptionPlacementOutcome, schedule: RedemptionPlacementSchedule
    ) async throws -> [OfferRedemption] {
        let due = RedemptionPlacementSchema.dueAt
        return try await write { db in
            // Only rows still due: another instance's attempt at the same subscription moved them on.
            let rows = try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT * FROM offer_redemptions
                        WHERE bundle_id = ? AND environment = ? AND original_transaction_id = ? AND \(RedemptionPlacementSchema.askable)
                          AND \(due) <= ?
                        """),
                arguments: [subscription.bundleID, subscription.environment, subscription.originalTransactionID, time.unixMilliseconds])
            var givenUp: [OfferRedemption] = []
            for row in rows {
                let redemption = Self.redemption(row)
                let after = schedule.afterAsk(
                    outcome, attempts: RedemptionPlacementSchedule.clampedAttempts(row["placement_attempts"] as Int64), recordedAt: redemption.recordedAt, at: time)
                if after.givenUp { givenUp.append(redemption) }
                try db.cachedStatement(
                    sql: """
                        UPDATE offer_redemptions SET placement_attempts = ?, next_placement_at = ?
                        WHERE bundle_id = ? AND environment = ? AND transaction_id = ? AND \(RedemptionPlacementSchema.askable) AND \(due) <= ?
                        """
                ).execute(arguments: [
                    after.attempts, after.nextAt.unixMilliseconds, row["bundle_id"] as String, row["environment"] as String, row["transaction_id"] as String,
                    time.unixMilliseconds,
                ])
            }
            return givenUp
        }
    }

    public func givenUpOfferRedemptions(limit: Int) async throws -> [UnplacedRedemption] {
        try await read { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT *, \(RedemptionPlacementSchema.dueAt) AS due_at FROM offer_redemptions
                        WHERE unplaced = 1 AND placement_attempts >= ? ORDER BY recorded_at, bundle_id, environment, transaction_id LIMIT ?
                        """),
                arguments: [RedemptionPlacementSchedule.maximumAttempts, limit]
            ).map(Self.unplacedRedemption)
        }
    }

    public func rearmGivenUpOfferRedemptions(bundleID: String?, actor: String, reason: String?, at time: Date) async throws -> Int {
        try await write { db in
            let givenUp = "unplaced = 1 AND placement_attempts >= \(RedemptionPlacementSchedule.maximumAttempts)"
            if let bundleID {
                try db.execute(
                    sql: "UPDATE offer_redemptions SET placement_attempts = 0, next_placement_at = ? WHERE \(givenUp) AND bundle_id = ?",
                    arguments: [time.unixMilliseconds, bundleID])
            } else {
                try db.execute(sql: "UPDATE offer_redemptions SET placement_attempts = 0, next_placement_at = ? WHERE \(givenUp)", arguments: [time.unixMilliseconds])
            }
            let count = db.changesCount
            guard count > 0 else { return 0 }
            let body = AuditBody.make([("actor", actor), ("bundleID", bundleID), ("redemptions", String(count)), ("reason", reason)])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "offer.redemptions_rearmed", body: body))], at: time)
            return count
        }
    }

    private static func unplacedRedemption(_ row: Row) -> UnplacedRedemption {
        UnplacedRedemption(
            redemption: redemption(row), placementAttempts: RedemptionPlacementSchedule.clampedAttempts(row["placement_attempts"] as Int64), dueAt: date(row["due_at"] as Int64))
    }
}
