import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// The unplaced-redemption sweep's attempts in PostgreSQL (see ``RedemptionPlacementSchedule``).
///
/// Rule: an attempt's rows are locked (`FOR UPDATE`) in its transaction and must still be due at
/// its time (PostgreSQL checks the condition again on a row another transaction changed while it
/// waited for the lock), so two instances that ask about one subscription at once count one attempt.
extension PostgresStore {
    public func dueUnplacedOfferRedemptions(at time: Date, after cursor: UnplacedRedemptionCursor, limit: Int) async throws -> [UnplacedRedemption] {
        let due = RedemptionPlacementSchema.dueAt
        return try await rows(
            "reading due unplaced redemptions",
            """
            SELECT \(unescaped: Self.redemptionColumns), placement_attempts, \(unescaped: due)
            FROM offer_redemptions
            WHERE \(unescaped: RedemptionPlacementSchema.askable) AND \(unescaped: due) <= \(time.unixMilliseconds)
              AND (\(unescaped: RedemptionPlacementSchema.sweepOrder))
                > (\(cursor.placementAttempts), \(cursor.dueAt), \(cursor.bundleID), \(cursor.environment), \(cursor.transactionID))
            ORDER BY \(unescaped: RedemptionPlacementSchema.sweepOrder) LIMIT \(Int64(limit))
            """
        ).map(Self.unplacedRedemption)
    }

    public func recordRedemptionPlacementAttempt(
        _ subscription: AppleSubscriptionKey, at time: Date, outcome: RedemptionPlacementOutcome, schedule: RedemptionPlacementSchedule
    ) async throws -> [OfferRedemption] {
        let now = time.unixMilliseconds
        return try await transaction("recording a redemption placement attempt") { connection, logger in
            let rows = try await connection.query(
                """
                SELECT \(unescaped: Self.redemptionColumns), placement_attempts, \(unescaped: RedemptionPlacementSchema.dueAt)
                FROM offer_redemptions
                WHERE bundle_id = \(subscription.bundleID) AND environment = \(subscription.environment)
                  AND original_transaction_id = \(subscription.originalTransactionID) AND \(unescaped: RedemptionPlacementSchema.askable)
                  AND \(unescaped: RedemptionPlacementSchema.dueAt) <= \(now)
                ORDER BY transaction_id FOR UPDATE
                """, logger: logger
            ).collect().map(Self.unplacedRedemption)
            var givenUp: [OfferRedemption] = []
            for row in rows {
                let after = schedule.afterAsk(outcome, attempts: row.placementAttempts, recordedAt: row.redemption.recordedAt, at: time)
                if after.givenUp { givenUp.append(row.redemption) }
                let candidate = row.redemption.candidate
                _ = try await connection.query(
                    """
                    UPDATE offer_redemptions SET placement_attempts = \(Int64(after.attempts)), next_placement_at = \(after.nextAt.unixMilliseconds)
                    WHERE bundle_id = \(candidate.bundleID) AND environment = \(candidate.environment) AND transaction_id = \(candidate.transactionID)
                    """, logger: logger
                ).collect()
            }
            return givenUp
        }
    }

    public func givenUpOfferRedemptions(limit: Int) async throws -> [UnplacedRedemption] {
        try await rows(
            "reading given-up unplaced redemptions",
            """
            SELECT \(unescaped: Self.redemptionColumns), placement_attempts, \(unescaped: RedemptionPlacementSchema.dueAt)
            FROM offer_redemptions
            WHERE unplaced = 1 AND placement_attempts >= \(Int64(RedemptionPlacementSchedule.maximumAttempts))
            ORDER BY recorded_at, bundle_id, environment, transaction_id LIMIT \(Int64(limit))
            """
        ).map(Self.unplacedRedemption)
    }

    public func rearmGivenUpOfferRedemptions(bundleID: String?, actor: String, reason: String?, at time: Date) async throws -> Int {
        try await transaction("re-arming given-up unplaced redemptions") { connection, logger in
            let maximum = Int64(RedemptionPlacementSchedule.maximumAttempts)
            let changed: Int
            if let bundleID {
                changed = try await connection.query(
                    """
                    UPDATE offer_redemptions SET placement_attempts = 0, next_placement_at = \(time.unixMilliseconds)
                    WHERE unplaced = 1 AND placement_attempts >= \(maximum) AND bundle_id = \(bundleID) RETURNING 1
                    """, logger: logger
                ).collect().count
            } else {
                changed = try await connection.query(
                    """
                    UPDATE offer_redemptions SET placement_attempts = 0, next_placement_at = \(time.unixMilliseconds)
                    WHERE unplaced = 1 AND placement_attempts >= \(maximum) RETURNING 1
                    """, logger: logger
                ).collect().count
            }
            guard changed > 0 else { return 0 }
            let body = AuditBody.make([("actor", actor), ("bundleID", bundleID), ("redemptions", String(changed)), ("reason", reason)])
            _ = try await Self.appendAudit(connection, logger, [AuditAppend(entry: AuditEntry(kind: "offer.redemptions_rearmed", body: body))], at: time)
            return changed
        }
    }

    /// A row of ``redemptionColumns`` followed by `placement_attempts` and the due time.
    private static func unplacedRedemption(_ row: PostgresRow) throws -> UnplacedRedemption {
        let c = try row.decode(
            (String, String, String, String, String, String, String?, Int64, Int64?, Int64?, String, Int64, Int64, Int64?, Int64, Int64).self)
        let redemption = OfferRedemption(
            candidate: RedemptionCandidate(
                transactionID: c.2, originalTransactionID: c.3, bundleID: c.0, environment: c.1, productID: c.4, offerID: c.5, appAccountToken: c.6,
                purchaseDate: date(c.7)),
            issuanceSequence: c.8, signatureIssuedAt: optionalDate(c.9), source: c.10, recordedAt: date(c.11), isUnplaced: c.12 != 0,
            placedAt: optionalDate(c.13))
        return UnplacedRedemption(redemption: redemption, placementAttempts: RedemptionPlacementSchedule.clampedAttempts(c.14), dueAt: date(c.15))
    }
}
