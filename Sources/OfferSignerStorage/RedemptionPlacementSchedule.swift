import Foundation
import OfferSignerCore

/// When the unplaced-redemption sweep asks Apple about a redemption again, and when it stops
/// (see `RedemptionPlacer` in OfferSignerServer, and ``OfferRedemption``).
///
/// Rules (both stores):
/// - Only an ask Apple answered about the customer's transaction counts: Apple returned the
///   subscription's history, or stated that it does not know the transaction (4040010
///   TransactionIdNotFoundError in every accepted environment, 4040001 AccountNotFoundError), or
///   that the ID is invalid (4000006 InvalidTransactionIdError; also an ID that cannot be put in a
///   request path). Each such ask is one attempt for each of the subscription's redemptions still
///   unplaced after it; after attempt `n` the next is due `firstRetry × 2^(n-1)` later, at most
///   ``longestRetry`` (1 day) later: with the default 15-minute retry interval, 15 min, 30 min,
///   1 h, … 16 h, then daily.
/// - An ask Apple did not answer about the transaction (a transient failure or one about this
///   service's configuration: open breaker, rate limited, overloaded, a network or 5xx failure,
///   401, any other 4xx such as 4040003 AppNotFoundError, a history that could not be stored)
///   counts nothing: the next ask is moved the same step later (the wait after the attempts
///   counted so far, the first wait when none), or an eighth of the redemption's age when that is
///   longer (at most a day), so one that never draws an answer is asked a few dozen times in its
///   ``maximumAge``, not every 15 minutes.
/// - A redemption that cannot be asked about at all (its app does not accept its environment, or
///   has no usable credentials) is not asked about and counts nothing: it is moved
///   ``unaskableRetry`` (1 day) on, so a sweep does not read it again before then.
/// - An attempt (counted or not) changes only rows still due at its time
///   (`COALESCE(next_placement_at, recorded_at) <= time`) and asked about (`placement_attempts`
///   from 0 to below the cap): two instances whose sweeps ask about one subscription at once count
///   it once.
/// - After ``maximumAttempts`` (10; about 80 hours with the default interval) the sweep stops
///   asking: the redemption stays `unplaced` (reported as such, never guessed unmatched), is
///   counted (`offer_signer_redemption_placements_given_up_total`), and is still placed if a later
///   notification or history lookup states its subscription's history. A redemption that was not
///   answered (or could not be asked) at a time ``maximumAge`` (30 days) or more after it was
///   recorded is given up the same way, however few attempts were counted: a wrong configuration
///   or a flapping breaker does not give up a genuine redemption for a month, and rows that can
///   never be asked are not kept forever. (A redemption re-armed more than 30 days after it was
///   recorded is given up again by its first ask Apple does not answer.)
/// - Attempts are read clamped to `0...maximumAttempts` (a database writer can store any 64-bit
///   value; arithmetic on it never traps).
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
    /// How far a redemption that cannot be asked about (environment not accepted, no credentials)
    /// is moved on.
    public static let unaskableRetry: TimeInterval = 86_400
    /// How long after it was recorded a redemption whose ask Apple did not answer (or that could not
    /// be asked) is given up: 30 days.
    public static let maximumAge: TimeInterval = 30 * 86_400

    /// Attempts as stored, clamped to `0...maximumAttempts`.
    public static func clampedAttempts(_ stored: Int64) -> Int {
        Int(min(max(stored, 0), Int64(maximumAttempts)))
    }

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

    /// What one ask does to a redemption with `attempts` counted so far (clamped), recorded at
    /// `recordedAt`, made at `time`: the attempts to store, when the next ask is due, and whether
    /// it is given up now (then due at `time`, no longer asked about).
    public func afterAsk(
        _ outcome: RedemptionPlacementOutcome, attempts stored: Int, recordedAt: Date, at time: Date
    ) -> (attempts: Int, nextAt: Date, givenUp: Bool) {
        let counted = min(max(stored, 0), Self.maximumAttempts)
        switch outcome {
        case .answered:
            let attempts = min(counted + 1, Self.maximumAttempts)
            guard let next = nextAttempt(afterAttempts: attempts, at: time) else { return (attempts, time, true) }
            return (attempts, next, false)
        case .notAnswered, .notAskable:
            if time.timeIntervalSince(recordedAt) >= Self.maximumAge { return (Self.maximumAttempts, time, true) }
            // An ask Apple did not answer backs off with the row's age too (an eighth of it, between
            // the counted step's wait and a day): a row that never draws an answer is not asked
            // every 15 minutes for its 30 days, nor ahead of answered rows that often.
            let byAge = min(max(time.timeIntervalSince(recordedAt) / 8, 0), Self.longestRetry)
            let next = outcome == .notAskable
                ? time.addingTimeInterval(Self.unaskableRetry) : max(nextAttempt(uncountedAfter: counted, at: time), time.addingTimeInterval(byAge))
            return (counted, next, false)
        }
    }

    private func wait(afterAttempts attempts: Int) -> TimeInterval {
        let doublings = min(max(attempts, 1) - 1, 40)
        return min(firstRetry * pow(2, Double(doublings)), Self.longestRetry)
    }
}

/// What came of asking about a subscription's unplaced redemptions (see
/// ``RedemptionPlacementSchedule``).
public enum RedemptionPlacementOutcome: Sendable, Equatable {
    /// Apple answered about the transaction (its history, not found, invalid): one attempt.
    case answered
    /// Asked, but Apple did not answer about the transaction (transient, or about this service's
    /// configuration): nothing counted, moved the same step on.
    case notAnswered
    /// Not asked: the app does not accept the environment or has no credentials; moved a day on.
    case notAskable
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
    /// The index's predicate (its migration's text: never changed), repeated word for word in
    /// ``askable`` so both engines use the index.
    public static let indexPredicate = "unplaced = 1 AND placement_attempts < \(RedemptionPlacementSchedule.maximumAttempts)"
    /// The rows the sweep may still ask about: unplaced, attempts from 0 to below the cap (a
    /// negative count stored by a database writer is never asked about).
    public static let askable = "\(indexPredicate) AND placement_attempts >= 0"
    /// The sweep's order (and its cursor's columns).
    public static let sweepOrder = "placement_attempts, \(dueAt), bundle_id, environment, transaction_id"

    public static let statements: [String] = [
        "ALTER TABLE offer_redemptions ADD COLUMN placement_attempts BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE offer_redemptions ADD COLUMN next_placement_at BIGINT",
        "CREATE INDEX offer_redemptions_placement_due ON offer_redemptions ((\(dueAt)), bundle_id, environment, transaction_id) WHERE \(indexPredicate)",
    ]
}
