import AppStoreServerAPI
import Foundation
import Logging
import OfferSignerEligibility
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// `serve --notification-recovery-interval`: the scheduled ``NotificationRecovery`` of every
/// catalog app this service has an active key (with an issuer ID) for, in each environment the
/// app accepts.
///
/// Rules:
/// - Every `interval`, per app and environment, under the store's exclusive lock
///   `.notificationRecovery` (a PostgreSQL advisory lock: one instance of a deployment at a time;
///   one that cannot take it within 5 s leaves this round to the holder): read the watermark;
///   when the last round (by any instance) ended less than 0.9 interval ago, do nothing; otherwise ask
///   Get Notification History from the watermark less `overlap` (Apple does not state which date
///   its `startDate`/`endDate` filter uses, the notification's `signedDate` or a send attempt's
///   `attemptDate`, https://developer.apple.com/documentation/appstoreserverapi/notificationhistoryrequest;
///   the overlap covers a lag either way; what is asked twice is stored once, by
///   `notificationUUID`) to now, and move the watermark to now once every page was read and
///   every notification stored. When some failed (did not verify), the watermark moves only to
///   the earliest failed notification's first send attempt (never back), so the next rounds ask
///   for it again (each such round is logged as a warning), and not only within the `overlap`;
///   but a failure first sent more than `failureHoldLimit` (24 h) ago holds it no longer: it is
///   logged once with its `notificationUUID` and counted
///   (`offer_signer_notification_catch_up_abandoned_total`), and `notifications recover` can
///   still fetch it while Apple keeps it.
/// - Without a watermark (the first run), the last `firstLookBack` are asked.
/// - The start is never earlier than Apple's window (180 days in Production, 30 in Sandbox, less
///   a margin: ``NotificationRecovery/earliestStart(_:now:)``); a last-run time more than
///   `futureLastRunTolerance` (60 s: clock skew between instances, and another instance's round
///   that ended while this one waited up to 5 s for the lock) after the round's `now` (a clock
///   step, or a database writer writing `now + interval - ε` again and again) counts as no last
///   run.
/// - Every round that held the lock is counted (`offer_signer_notification_catch_up_rounds_total`,
///   outcome `asked`, `skipped_recent_round`, or `skipped_last_run_ahead` for a last run after the
///   round's `now` within the tolerance); a skipped round is logged at most once an hour per app
///   and environment (a warning when the last run was ahead). What a database writer can still
///   do: rewrite the last-run time before every round (anything from 0.9 interval ago to 60 s
///   ahead) and so skip every round for as long as it keeps writing; that shows as skipped rounds
///   and no `asked` round on any instance.
/// - A failed round (Apple unavailable, a store failure) is logged and counted; the watermark
///   stays, so the next round asks again from there.
final class NotificationCatchUp: Service, Sendable {
    struct Target: Sendable {
        var app: AppStoreAppSettings
        var environment: AppleEnvironment
    }

    private let store: any OfferSignerStore
    private let recovery: NotificationRecovery
    private let client: AppStoreServerAPIClient
    private let targets: [Target]
    private let credentials: @Sendable (String) -> AppStoreServerAPICredentials?
    private let interval: Duration
    private let logger: Logger
    let overlap: Duration = .seconds(600)
    let firstLookBack: Duration = .seconds(86_400)
    let failureHoldLimit: TimeInterval = 86_400
    /// How far in the future a stored last-run time may be and still count (clock skew between
    /// instances; the lock wait of 5 s); later, it counts as absent.
    static let futureLastRunTolerance: TimeInterval = 60
    private let metrics: ServerMetrics?
    /// When a skipped round of each app and environment was last logged.
    private let skipLogged = Mutex<[String: Date]>([:])
    /// How often a skipped round is logged per app and environment, at most.
    static let skipLogInterval: TimeInterval = 3600

    init(
        store: any OfferSignerStore, recovery: NotificationRecovery, client: AppStoreServerAPIClient, targets: [Target],
        credentials: @escaping @Sendable (String) -> AppStoreServerAPICredentials?, interval: Duration, logger: Logger,
        metrics: ServerMetrics? = nil
    ) {
        self.metrics = metrics
        self.store = store
        self.recovery = recovery
        self.client = client
        self.targets = targets
        self.credentials = credentials
        self.interval = interval
        self.logger = logger
    }

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    try await Task.sleep(for: self.interval)
                } catch {
                    break
                }
                for target in self.targets { await self.catchUp(target, now: Date()) }
            }
        }
        try await client.shutdown()
    }

    /// One round for one app and environment (see the type's rules); returns the tally when this
    /// instance asked Apple, nil when it did not.
    @discardableResult
    func catchUp(_ target: Target, now: Date) async -> NotificationRecovery.Tally? {
        let bundleID = target.app.bundleID
        let environment = target.environment.rawValue
        guard let credentials = credentials(bundleID) else {
            logger.warning("notification catch-up: no active key with an issuer ID", metadata: ["bundle_id": "\(bundleID)"])
            return nil
        }
        do {
            return try await store.withExclusiveLock(.notificationRecovery(bundleID: bundleID, environment: environment), timeout: .seconds(5)) {
                let watermark = try await store.notificationRecoveryWatermark(bundleID: bundleID, environment: environment)
                // The last run's time, not the watermark: a watermark held at a failed notification is old.
                // A last run more than `futureLastRunTolerance` in the future counts as none: it must
                // not skip rounds. (Within it: clock skew between instances, or another instance's
                // round that ended after this round's `now` was taken, while this one waited for the lock.)
                let lastRun = try await store.notificationRecoveryLastRun(bundleID: bundleID, environment: environment).flatMap {
                    $0 <= now.addingTimeInterval(Self.futureLastRunTolerance) ? $0 : nil
                }
                if let lastRun, now.timeIntervalSince(lastRun) < Self.seconds(interval) * 0.9 {
                    skipped(bundleID: bundleID, environment: environment, lastRun: lastRun, now: now)
                    return nil
                }
                metrics?.notificationCatchUpRound(bundleID: bundleID, environment: environment, outcome: "asked")
                let wanted = watermark.map { min($0, now).addingTimeInterval(-Self.seconds(overlap)) } ?? now.addingTimeInterval(-Self.seconds(firstLookBack))
                let start = max(wanted, NotificationRecovery.earliestStart(target.environment, now: now))
                let tally = try await recovery.run(
                    NotificationHistoryRequest(startDate: start, endDate: now), environment: target.environment, app: target.app, credentials: credentials)
                let metadata: Logger.Metadata = [
                    "bundle_id": "\(bundleID)", "environment": "\(environment)", "found": "\(tally.found)", "new": "\(tally.new)",
                    "already_stored": "\(tally.alreadyStored)", "failed": "\(tally.failed)",
                ]
                if let stopped = tally.stoppedBy {
                    logger.warning("notification catch-up stopped; the next round asks again", metadata: metadata.merging(["reason": "\(stopped)"]) { $1 })
                    return tally
                }
                // A notification that failed is asked for again next round: not past it.
                // One older than failureHoldLimit no longer holds it: logged once and counted.
                let holdFrom = now.addingTimeInterval(-failureHoldLimit)
                for abandoned in tally.failedNotifications where abandoned.firstAttempt < holdFrom {
                    metrics?.notificationCatchUpAbandoned(bundleID: bundleID, environment: environment)
                    logger.error(
                        "notification catch-up: a notification failing for over 24 hours no longer holds the watermark; fetch it with offer-signer notifications recover once fixed",
                        metadata: metadata.merging(
                            ["notification_uuid": "\(abandoned.notificationUUID ?? "unreadable")", "first_attempt": "\(abandoned.firstAttempt)"]) { $1 })
                }
                let held = tally.failedNotifications.map(\.firstAttempt).filter { $0 >= holdFrom }.min()
                let recoveredUntil = held.map { min($0, now) } ?? now
                try await store.setNotificationRecoveryWatermark(bundleID: bundleID, environment: environment, recoveredUntil: recoveredUntil, at: Date())
                if tally.failed > 0 {
                    logger.warning(
                        "notification catch-up: some notifications did not verify; the watermark stays before them and the next round asks again",
                        metadata: metadata.merging(["failures": "\(tally.failures.joined(separator: "; "))"]) { $1 })
                    return tally
                }
                logger.log(level: tally.new > 0 ? .notice : .debug, "notification catch-up", metadata: metadata)
                return tally
            }
        } catch let error as StoreError where error.code == .timeout {
            logger.debug("notification catch-up: another instance holds the lock", metadata: ["bundle_id": "\(bundleID)"])
            return nil
        } catch {
            logger.warning("notification catch-up failed; the next round asks again", metadata: ["bundle_id": "\(bundleID)", "error": "\(error)"])
            return nil
        }
    }

    /// Counts a skipped round, and logs it unless one of this app and environment was logged
    /// within ``skipLogInterval``.
    private func skipped(bundleID: String, environment: String, lastRun: Date, now: Date) {
        let ahead = lastRun > now
        metrics?.notificationCatchUpRound(bundleID: bundleID, environment: environment, outcome: ahead ? "skipped_last_run_ahead" : "skipped_recent_round")
        let target = bundleID + "\n" + environment
        let logs = skipLogged.withLock { logged -> Bool in
            if let last = logged[target], now.timeIntervalSince(last) < Self.skipLogInterval, last <= now { return false }
            logged[target] = now
            return true
        }
        guard logs else { return }
        logger.log(
            level: ahead ? .warning : .info,
            ahead
                ? "notification catch-up: round skipped, the stored last run is after this round's time (clock skew, or a database writer); logged at most hourly"
                : "notification catch-up: round skipped, another round ran recently (expected with several instances); logged at most hourly",
            metadata: ["bundle_id": "\(bundleID)", "environment": "\(environment)", "last_run": "\(lastRun)", "now": "\(now)"])
    }

    static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
