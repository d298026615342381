import Foundation
import OfferSignerCore

/// When the unplaced-redemption sweep asks Apple about a redemption again, and when it stops
/// (see `RedemptionPlacer` in OfferSignerServer, and ``OfferRedemption``).
///
/// Rules (both stores):
/// - Only an ask Apple answered counts: Apple returned the subscription's history, or stated that
///   no accepted environment knows the transaction (error 4040010), or refused the request as made
///   (another 4xx). Each such ask is one attempt for each of the subscription's redemptions still
///   unplaced after it; after attempt `n` the next is due `firstRetry × 2^(n-1)` later, at most
///   ``longestRetry`` (1 day) later: with the default 15-minute retry interval, 15 min, 30 min,
///   1 h, … 16 h, then daily.
/// - An ask Apple did not answer (this service's own failure or a transient one: no credentials,
///   open breaker, rate limited, overloaded, an environment the app does not accept, a network or
///   5xx failure, a history that could not be stored) counts nothing: the next ask is only moved
///   the same step later (the wait after the attempts counted so far, the first wait when none), so
///   a key without an issuer ID or a flapping breaker never gives up a genuine redemption.
/// - An attempt (counted or not) changes only rows still due at its time
///   (`COALESCE(next_placement_at, recorded_at) <= time`): two instances whose sweeps ask about
///   one subscription at once count it once.
/// - After ``maximumAttempts`` (10; about 80 hours with the default interval) the sweep stops
///   asking: the redemption stays `unplaced` (reported as such, never guessed unmatched), is
///   counted (`offer_signer_redemption_placements_given_up_total`), and is still placed if a later
///   notification or history lookup states its subscription's history.
/// - A row that was never asked about is due from when it was recorded; the sweep reads the due
///   rows fewest attempts first, then oldest due (``UnplacedRedemptionCursor``), a page at a time,
///   so rows that were asked about before (made-up ones among them) never hold back a new one.
///
/// Apple is silent on how long its history of a subscription stays available; the cap exists so
/// rows that can never be placed (a customer Apple no longer knows, a row a database writer made
/// up) are not asked about forever.
public struct RedemptionPlacementSchedule: Sendable, Equatable {
    /// After this many attempts a redemption is no longer asked about.
    public static let maximumAttempts = 10
    /// The longest wait between two attempts.
    public static let longestRetry: TimeInterval = 86_400

    /// The wait after the first attempt (the placer's retry interval).
    public var firstRetry: TimeInterval

    public init(firstRetry: TimeInterval) {
        self.firstRetry = max(1, firstRetry)
    }

    /// When the next attempt is due after attempt number `attempts` (1-based) made at `time`; nil
    /// when `attempts` reached ``maximumAttempts`` (given up).
    public func nextAttempt(afterAttempts attempts: Int, at time: Date) -> Date? {
        guard attempts < Self.maximumAttempts else { return nil }
        return time.addingTimeInterval(wait(afterAttempts: attempts))
    }

    /// When the next attempt is due after an ask Apple did not answer, made at `time` with
    /// `attempts` counted so far: the same step as after the last counted attempt (the first wait
    /// when none was counted); nothing is counted.
    public func nextAttempt(uncountedAfter attempts: Int, at time: Date) -> Date {
        time.addingTimeInterval(wait(afterAttempts: attempts))
    }

    private func wait(afterAttempts attempts: Int) -> TimeInterval {
        let doublings = min(max(attempts - 1, 0), 40)
        return min(firstRetry * pow(2, Double(doublings)), Self.longestRetry)
    }
}

/// An unplaced redemption the sweep may ask about, with its attempts so far and when it is due.
public struct UnplacedRedemption: Sendable, Equatable {
    public var redemption: OfferRedemption
    /// Attempts made so far (see ``RedemptionPlacementSchedule``).
    public var placementAttempts: Int
    /// When it is due: the next attempt's time, or when it was recorded if never asked about.
    public var dueAt: Date

    public init(redemption: OfferRedemption, placementAttempts: Int, dueAt: Date) {
        self.redemption = redemption
        self.placementAttempts = placementAttempts
        self.dueAt = dueAt
    }

    /// Where the next page starts (after this row).
    public var cursor: UnplacedRedemptionCursor {
        UnplacedRedemptionCursor(
            placementAttempts: Int64(placementAttempts), dueAt: dueAt.unixMilliseconds, bundleID: redemption.candidate.bundleID, environment: redemption.candidate.environment,
            transactionID: redemption.candidate.transactionID)
    }
}

/// A position in the due rows' order: attempts so far (fewest first), due time (oldest first),
/// then bundle, environment, transaction (the row's key).
public struct UnplacedRedemptionCursor: Sendable, Equatable {
    public var placementAttempts: Int64
    public var dueAt: Int64
    public var bundleID: String
    public var environment: String
    public var transactionID: String

    public init(placementAttempts: Int64, dueAt: Int64, bundleID: String, environment: String, transactionID: String) {
        self.placementAttempts = placementAttempts
        self.dueAt = dueAt
        self.bundleID = bundleID
        self.environment = environment
        self.transactionID = transactionID
    }

    /// Before every row.
    public static let start = UnplacedRedemptionCursor(placementAttempts: Int64.min, dueAt: Int64.min, bundleID: "", environment: "", transactionID: "")
}

/// The columns and index of ``RedemptionPlacementSchedule``: SQLite "v10-redemption-placement-attempts",
/// PostgreSQL migration 11; the same statements in both. (The index is in due order; the sweep's
/// fewest-attempts-first order is a top-N sort of the due rows: every due row is read, a page kept.
/// An index in that order would need a new migration.)
public enum RedemptionPlacementSchema {
    /// When a row is due (never asked: since it was recorded).
    public static let dueAt = "COALESCE(next_placement_at, recorded_at)"
    /// The rows the sweep may still ask about (the index's predicate, repeated word for word in
    /// the sweep's query so both engines use the index).
    public static let askable = "unplaced = 1 AND placement_attempts < \(RedemptionPlacementSchedule.maximumAttempts)"
    /// The sweep's order (and its cursor's columns).
    public static let sweepOrder = "placement_attempts, \(dueAt), bundle_id, environment, transaction_id"

    public static let statements: [String] = [
        "ALTER TABLE offer_redemptions ADD COLUMN placement_attempts BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE offer_redemptions ADD COLUMN next_placement_at BIGINT",
        "CREATE INDEX offer_redemptions_placement_due ON offer_redemptions ((\(dueAt)), bundle_id, environment, transaction_id) WHERE \(askable)",
    ]
}
