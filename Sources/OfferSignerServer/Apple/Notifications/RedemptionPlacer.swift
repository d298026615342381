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
/// - Every `retryInterval`, and once at start, the store's unplaced redemptions (the earliest
///   recorded `sweepLimit`) are asked about again: Apple unreachable, a circuit open, no key
///   with an issuer ID yet. A redemption stays unplaced, reported as such, until Apple answers;
///   none is ever dropped or guessed to be unmatched.
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
    private let pending = Mutex<[AppleSubscriptionKey]>([])
    private let sweepDue = Mutex(true)
    private let wakeUps: AsyncStream<Void>
    private let wakeUp: AsyncStream<Void>.Continuation

    init(
        store: any OfferSignerStore, client: AppStoreServerAPIClient, catalog: OfferCatalog?,
        credentials: @escaping @Sendable (String) -> AppStoreServerAPICredentials?, metrics: ServerMetrics, logger: Logger,
        retryInterval: Duration, budget: Duration = .seconds(30), capacity: Int = 1024, sweepLimit: Int = 500
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
                    while !Task.isCancelled, let key = self.pending.withLock({ $0.first }) {
                        await self.place(key)
                        self.pending.withLock { pending in pending.removeAll { $0 == key } }
                    }
                    if Task.isCancelled { break }
                }
                group.cancelAll()
            }
        }
    }

    /// Queues the subscriptions of the store's unplaced redemptions.
    func sweep() async {
        do {
            let unplaced = try await store.unplacedOfferRedemptions(limit: sweepLimit)
            for redemption in unplaced { submit(redemption) }
        } catch {
            logger.warning("could not read unplaced redemptions; the next sweep reads them again", metadata: ["error": "\(error)"])
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
