import AppStoreServerAPI
import Foundation
import OfferSignerEligibility
import OfferSignerStorage

/// A signing decision on a stored history decoded before, its version read with the customer's
/// lock instead of before it (PostgreSQL: in the lock's own round trip, see
/// `CustomerDecisionLock`), so the lock and every read the decision makes are one round trip.
///
/// Rules: the decision is the one `HistorySourceResolver.askApple` would reach for one offer: the
/// first of the app's environments with a complete stored history decides, with the history
/// decoded at exactly that version (`DecodedHistoryCache`: its items' JWS were verified when it
/// was read whole), if it is current (`StoredHistoryFreshness`) and holds the offer's
/// subscription group. Anything else (no such version, a version not decoded yet, a history not
/// current or without the group) decides nothing under the lock: the caller gives the lock back
/// and asks before the lock as before (`storedHistory`, Apple's API), since Apple is never asked
/// while a customer lock is held. Nothing is committed before that choice.
extension EligibilityService {
    /// The history versions a signing decision on `offer` reads with the customer lock, or nil
    /// when it reads before the lock as before: the offer asks Apple, the app's notifications
    /// keep its stored history, and a history of `transactionID` was decided on before (the
    /// decoded one is likely still current; a first request reads and verifies it whole before
    /// the lock, as before).
    func historyReadWithLock(_ offer: OfferDefinition, bundleID: String, transactionID: String?) -> CustomerLockHistoryRead? {
        guard let transactionID, offer.rules != nil, offer.historySource.asksApple else { return nil }
        let app = configuration.catalog.appSettings(bundleID: bundleID)
        guard app.notificationHistory, decodedHistories.decidedBefore(bundleID: bundleID, transactionID: transactionID) else { return nil }
        return CustomerLockHistoryRead(transactionID: transactionID, environments: app.environments.map(\.rawValue))
    }

    /// Under the customer's lock: Apple's answer from the stored history decoded before, at the
    /// version read with the lock; nil when it does not decide that way (see the rules above).
    func storedAnswerWithLock(_ offer: OfferDefinition, bundleID: String, transactionID: String, now: Date) async throws -> PrefetchedAppleAnswer? {
        let app = configuration.catalog.appSettings(bundleID: bundleID)
        for environment in app.environments {
            let version = try await StoreDeadline.run("stored history read", timeout: storeTimeout) { [store] in
                try await store.appleHistoryVersion(bundleID: app.bundleID, environment: environment.rawValue, transactionID: transactionID)
            }
            guard let version, version.isComplete else { continue }
            guard let decoded = decodedHistories.history(at: version), StoredHistoryFreshness.isCurrent(decoded, updatedAt: version.updatedAt, now: now),
                decoded.transactions.contains(where: { $0.subscriptionGroupID == offer.subscriptionGroupID })
            else { return nil }
            return PrefetchedAppleAnswer(answer: AppleAnswer(lookup: .history(decoded), via: "store"))
        }
        return nil
    }
}

/// A Retention Messaging decision on a stored history decoded before, its version read with the
/// customer's lock instead of before it (PostgreSQL: in the lock's own round trip, with the
/// ledger), as for signing above.
///
/// Rules: the customer (the lock's key) is found in the history decoded last for the request's
/// subscription and environment, which must hold a transaction of that subscription (as before the
/// lock); under the lock that history is used only if the store reports
/// the subscription's history at exactly the version it was decoded at, complete and current
/// (`StoredHistoryFreshness`). Otherwise nothing is decided under the lock: the caller gives it
/// back and reads the history before the lock as before (`RetentionController.history`), which
/// then decides what to lock. Nothing is committed before that choice.
extension EligibilityService {
    /// What a Retention Messaging answer reads with the customer's lock: the history decoded last
    /// for the subscription `originalTransactionID` in `app`'s one environment, the version it was
    /// decoded at, and the versions to read with the lock; nil when the app's notifications do not
    /// keep its history or none was decoded.
    func retentionHistoryReadWithLock(originalTransactionID: String, app: AppStoreAppSettings) -> RetentionHistoryHint? {
        guard app.notificationHistory, app.environments.count == 1, let environment = app.environments.first else { return nil }
        let subscription = AppleSubscriptionKey(bundleID: app.bundleID, environment: environment.rawValue, originalTransactionID: originalTransactionID)
        // The subscription's own history (as `RetentionController.history` requires before the lock).
        guard let (history, updatedAt) = decodedHistories.latest(subscription),
            history.transactions.contains(where: { $0.originalTransactionID == originalTransactionID })
        else { return nil }
        return RetentionHistoryHint(
            subscription: subscription, history: history, decodedAt: updatedAt,
            read: CustomerLockHistoryRead(transactionID: originalTransactionID, environments: [environment.rawValue]))
    }

    /// Under the customer's lock: `hint`'s history, if the store reports its subscription's
    /// history (read with the lock) at exactly the version it was decoded at, complete and
    /// current; nil otherwise (see the rules above). The read is bounded by `timeout`.
    func storedHistoryWithLock(_ hint: RetentionHistoryHint, now: Date, timeout: Duration) async throws -> VerifiedHistory? {
        let subscription = hint.subscription
        let version = try await StoreDeadline.run("stored history read", timeout: timeout) { [store] in
            try await store.appleHistoryVersion(
                bundleID: subscription.bundleID, environment: subscription.environment, transactionID: subscription.originalTransactionID)
        }
        guard let version, version.isComplete, version.subscription == subscription, version.updatedAt == hint.decodedAt,
            StoredHistoryFreshness.isCurrent(hint.history, updatedAt: version.updatedAt, now: now)
        else { return nil }
        return hint.history
    }
}

/// The history a Retention Messaging answer expects to decide on under the customer's lock (see
/// `EligibilityService.retentionHistoryReadWithLock`).
struct RetentionHistoryHint: Sendable {
    let subscription: AppleSubscriptionKey
    let history: VerifiedHistory
    /// The store's version (`updatedAt`) the history was decoded at.
    let decodedAt: Date
    let read: CustomerLockHistoryRead
}

/// The stored history a decision under a customer's lock counted on no longer decides there:
/// the request is decided again the usual way (see `EligibilityService.storedAnswerWithLock` and
/// `storedHistoryWithLock`).
struct StoredHistoryMovedUnderLock: Error {}
