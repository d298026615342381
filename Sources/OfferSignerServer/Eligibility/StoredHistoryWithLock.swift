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

/// The stored history a decision under a customer's lock counted on no longer decides there:
/// the request is decided again the usual way (see `EligibilityService.storedAnswerWithLock`).
struct StoredHistoryMovedUnderLock: Error {}
