import AppStoreServerAPI
import Foundation
import Logging
import OfferSignerEligibility
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Places redemptions recorded `unplaced` (a renewal-time offer whose previous period the store
/// has not heard of, see ``OfferRedemption``) by asking Apple's Get Transaction History for the
/// subscription, in the background, and storing the answer: the store then matches the
/// redemption again with the period Apple states.
///
/// Why: the transaction under the offer does not tell how long the period before it was (a
/// one-week free offer on an annual product lasts a week; the year it was redeemed in is only in
/// the history), and an estimate that finds no signature proves nothing about a leaked key.
/// Apple: a promotional offer redeemed on an active subscription applies "at the next renewal
/// period" (https://developer.apple.com/documentation/storekit/product/subscriptioninfo/renewalinfo/offer),
/// the transaction's `offerPeriod` is the offer's duration, not the product's
/// (https://developer.apple.com/documentation/appstoreserverapi/offerperiod), and Get Transaction
/// History returns the subscription's transactions
/// (https://developer.apple.com/documentation/appstoreserverapi/get-transaction-history; Apple's
/// Python library `api_client.py` `get_transaction_history`).
///
/// Rules:
/// - A redemption recorded unplaced (by a notification) is handed over (``submit(_:)``, never
///   waits); one subscription (bundle, environment, original transaction) is asked about at a
///   time, each at most once while it waits; at most `capacity` wait (more are left to the sweep:
///   they are in the store).
/// - Every ask about a subscription is an attempt for each of its redemptions still unplaced after
///   it, which backs off exponentially and stops at a cap (``RedemptionPlacementSchedule``: from
///   `retryInterval`, doubling, at most a day apart; 10 attempts).
/// - Every `retryInterval`, and once at start, a sweep pages through the store's unplaced
///   redemptions that are due (oldest due first, `sweepPageSize` rows a page) and asks about each
///   one's subscription once, at most `sweepLimit` subscriptions a sweep (the rest are due at the
///   next sweep); redemptions from notifications handed over meanwhile are asked about between
///   pages. Since every ask pushes its rows' next attempt later, rows that cannot be placed (a
///   customer Apple no longer knows, a row a database writer made up) never hold newer ones back.
/// - A redemption past the cap is no longer asked about: it stays unplaced, reported as such,
///   logged and counted once (`offer_signer_redemption_placements_given_up_total`); a later
///   notification or lookup that states its history still places it. None is ever dropped or
///   guessed to be unmatched.
/// - Apple is asked through the server's one App Store Server API client, so its breaker, its
///   per-app `Retry-After`, its retries and its bound on lookups at once apply, with a budget of
///   `budget` (a background job may give Apple longer than a request's 2 s); only the
///   redemption's environment is asked.
/// - A history Apple answers is stored whole (`AppleHistoryConversion.update(_:)`), as the
///   eligibility lookups store theirs.
final class RedemptionPlacer: Service, Sendable {
    private let store: any OfferSignerStore
    private let client: AppStoreServerAPIClient
    private let catalog: OfferCatalog?
    private let credentials: @Sendable (String) -> AppStoreServerAPICredentials?
    private let metrics: ServerMetrics
    private let logger: Logger
    private let retryInterval: Duration
    private let budget: Duration
    private let capacity: Int
    private let sweepLimit: Int
    private let sweepPageSize: Int
    private let schedule: RedemptionPlacementSchedule
    private let pending = Mutex<[AppleSubscriptionKey]>([])
    private let sweepDue = Mutex(true)
    private let wakeUps: AsyncStream<Void>
    private let wakeUp: AsyncStream<Void>.Continuation

    init(
        store: any OfferSignerStore, client: AppStoreServerAPIClient, catalog: OfferCatalog?,
        credentials: @escaping @Sendable (String) -> AppStoreServerAPICredentials?, metrics: ServerMetrics, logger: Logger,
        retryInterval: Duration, budget: Duration = .seconds(30), capacity: Int = 1024, sweepLimit: Int = 2000, sweepPageSize: Int = 500
    ) {
        self.store = store
        self.client = client
        self.catalog = catalog
        self.credentials = credentials
        self.metrics = metrics
        self.logger = logger
        self.retryInterval = retryInterval
        self.budget = budget
        self.capacity = max(1, capacity)
        self.sweepLimit = max(1, sweepLimit)
        self.sweepPageSize = max(1, sweepPageSize)
        let components = retryInterval.components
        self.schedule = RedemptionPlacementSchedule(firstRetry: Double(components.seconds) + Double(components.attoseconds) / 1e18)
        (wakeUps, wakeUp) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Hands over a redemption recorded unplaced (never waits; others are ignored).
    func submit(_ redemption: OfferRedemption) {
        guard redemption.state == .unplaced else { return }
        let candidate = redemption.candidate
        let key = AppleSubscriptionKey(bundleID: candidate.bundleID, environment: candidate.environment, originalTransactionID: candidate.originalTransactionID)
        let added = pending.withLock { pending -> Bool in
            guard pending.count < capacity, !pending.contains(key) else { return false }
            pending.append(key)
            return true
        }
        if added { wakeUp.yield() }
    }

    func run() async throws {
        wakeUp.yield()
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    while !Task.isCancelled {
                        do { try await Task.sleep(for: self.retryInterval) } catch { return }
                        self.sweepDue.withLock { $0 = true }
                        self.wakeUp.yield()
                    }
                }
                for await _ in self.wakeUps {
                    if self.sweepDue.withLock({ due in defer { due = false }; return due }) { await self.sweep() }
                    await self.placePending()
                    if Task.isCancelled { break }
                }
                group.cancelAll()
            }
        }
    }

    /// Asks about the subscriptions handed over, one at a time.
    private func placePending() async {
        while !Task.isCancelled, let key = pending.withLock({ $0.first }) {
            await attempt(key)
            pending.withLock { pending in pending.removeAll { $0 == key } }
        }
    }

    /// Pages through the unplaced redemptions due now, oldest due first, and asks about each
    /// one's subscription once (at most `sweepLimit` subscriptions); returns how many were asked about.
    @discardableResult
    func sweep(now: Date = Date()) async -> Int {
        var cursor = UnplacedRedemptionCursor.start
        var asked = Set<AppleSubscriptionKey>()
        do {
            while !Task.isCancelled {
                let page = try await store.dueUnplacedOfferRedemptions(at: now, after: cursor, limit: sweepPageSize)
                for row in page {
                    let candidate = row.redemption.candidate
                    let key = AppleSubscriptionKey(bundleID: candidate.bundleID, environment: candidate.environment, originalTransactionID: candidate.originalTransactionID)
                    guard !asked.contains(key) else { continue }
                    guard asked.count < sweepLimit, !Task.isCancelled else { return asked.count }
                    asked.insert(key)
                    await attempt(key, at: now)
                }
                guard page.count == sweepPageSize, let last = page.last else { break }
                cursor = last.cursor
                await placePending()
            }
        } catch {
            logger.warning("could not read unplaced redemptions; the next sweep reads them again", metadata: ["error": "\(error)"])
        }
        return asked.count
    }

    /// Asks about one subscription (``place(_:)``), then records the attempt for its redemptions
    /// still unplaced; those that reach the cap are logged and counted.
    func attempt(_ key: AppleSubscriptionKey, at time: Date = Date()) async {
        await place(key)
        do {
            let givenUp = try await store.recordRedemptionPlacementAttempt(key, at: time, schedule: schedule)
            for redemption in givenUp {
                metrics.redemptionPlacementGivenUp(bundleID: redemption.candidate.bundleID, environment: redemption.candidate.environment)
                logger.warning(
                    "an unplaced redemption is no longer asked about (attempt cap reached); it stays unplaced",
                    metadata: [
                        "bundle_id": "\(redemption.candidate.bundleID)", "environment": "\(redemption.candidate.environment)",
                        "offer_id": "\(redemption.candidate.offerID)", "transaction_id": "\(redemption.candidate.transactionID)",
                        "attempts": "\(RedemptionPlacementSchedule.maximumAttempts)",
                    ])
            }
        } catch {
            logger.warning("could not record a redemption placement attempt; it is asked about again", metadata: ["error": "\(error)"])
        }
    }

    /// Asks Apple for one subscription's history and stores it; returns whether Apple answered.
    @discardableResult
    func place(_ key: AppleSubscriptionKey) async -> Bool {
        guard let environment = AppleEnvironment(rawValue: key.environment) else { return false }
        var app = catalog?.appSettings(bundleID: key.bundleID) ?? AppStoreAppSettings(bundleID: key.bundleID)
        guard app.environments.contains(environment) else {
            metrics.redemptionPlacementLookup(outcome: "environment_not_accepted")
            return false
        }
        app.environments = [environment]
        let lookup = await client.history(
            transactionID: key.originalTransactionID, app: app, credentials: credentials(key.bundleID), now: Date(), budget: budget, reportsFetch: false)
        let history: VerifiedHistory
        switch lookup {
        case .history(let answer) where answer.environment == environment:
            history = answer
        case .history:
            metrics.redemptionPlacementLookup(outcome: "wrong_app")
            return false
        case .unavailable(let unavailable):
            metrics.redemptionPlacementLookup(outcome: unavailable.reason.rawValue)
            logger.info(
                "an unplaced redemption stays unplaced: Apple's history is unavailable; asked again later",
                metadata: ["bundle_id": "\(key.bundleID)", "environment": "\(key.environment)", "reason": "\(unavailable.reason.rawValue)"])
            return false
        }
        do {
            let result = try await store.recordAppleHistory(AppleHistoryConversion.update(history), at: Date())
            metrics.redemptionPlacementLookup(outcome: "history")
            if case .recorded(let redemptions) = result {
                for redemption in redemptions {
                    metrics.offerRedeemed(redemption)
                    logger.notice(
                        redemption.placedAt != nil ? "unplaced redemption placed" : "offer redeemed",
                        metadata: [
                            "bundle_id": "\(redemption.candidate.bundleID)", "offer_id": "\(redemption.candidate.offerID)",
                            "transaction_id": "\(redemption.candidate.transactionID)", "state": "\(redemption.state.rawValue)",
                        ])
                }
            }
            return true
        } catch {
            metrics.redemptionPlacementLookup(outcome: "store_failed")
            logger.warning("could not store the history that places a redemption; asked again later", metadata: ["error": "\(error)"])
            return false
        }
    }
}
