import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import Synchronization
import X509

/// Verifies and stores one App Store Server Notification V2 `signedPayload`: what the endpoint
/// (`POST /v1/apple/notifications`) does with a body, and what `notifications recover` and the
/// scheduled catch-up do with each notification of Apple's Get Notification History.
///
/// Rules:
/// - Apple sends no credentials, so authenticity comes from the payload alone: its x5c chain to
///   a trusted root, Apple's marker OIDs and its ES256 signature, then every JWS inside it
///   (`AppleSignedDataVerifier.verifyNotification(_:now:)`). Only what fails that is refused.
/// - Every payload of Apple's current model is accepted: `data`, `summary`,
///   `externalPurchaseToken` and `appData` (e.g. `RESCIND_CONSENT`), any `notificationType`
///   (appstoreserverlibrary/models/ResponseBodyV2DecodedPayload.py, NotificationTypeV2.py).
/// - A verified notification for an app this service does not serve (neither a key's bundle
///   nor an `apps` entry), an environment the app does not accept (`apps.<bundle>.environments`),
///   or, in Production, another App Apple ID than the catalog's (or none in the catalog) is
///   `ignored`: answered 200 so Apple stops retrying it (Apple retries every answer but a 200:
///   https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications),
///   counted (`apple_notifications_total{outcome="ignored_…"}`), logged once per app,
///   environment and reason, and not stored.
/// - A redemption recorded `unplaced` (its previous period unknown) is handed to `onUnplaced`
///   (the server's ``RedemptionPlacer``), after the store's commit and without waiting.
/// - Idempotent by `notificationUUID`: a notification stored before is `duplicate`, not written again.
/// - A store failure is thrown (the endpoint answers 503, so Apple sends it again).
public final class AppleNotificationIntake: Sendable {
    /// What became of a verified notification.
    public enum Status: String, Sendable {
        /// Stored now.
        case recorded
        /// Stored before (same `notificationUUID`).
        case duplicate
        /// Verified, but for an app or environment this service does not serve; not stored.
        case ignored
    }

    public struct Receipt: Sendable, Hashable {
        public var status: Status
        public var notificationUUID: String
        public var notificationType: String
        public var bundleID: String
        public var environment: AppleEnvironment
        /// Why an `ignored` notification was not stored (`app`, `environment`, `app_apple_id`).
        public var ignoredBecause: String?
    }

    /// A notification that did not verify (never stored).
    public struct Refusal: Error, Sendable, Hashable {
        /// Always `notification_unverified` (the endpoint's problem code).
        public var code: String
        public var detail: String
    }

    private let store: any OfferSignerStore
    private let servedBundles: @Sendable () -> Set<String>
    private let catalog: OfferCatalog?
    private let trustedRoots: [Certificate]
    private let chainCache: AppleChainValidationCache
    /// Stored histories verified again from their JWS (see ``DecodedHistoryCache``).
    private let storedHistories = DecodedHistoryCache(capacity: 2_000)
    private let onStored: @Sendable (_ originalTransactionID: String) -> Void
    private let onUnplaced: @Sendable (OfferRedemption) -> Void
    private let metrics: ServerMetrics
    private let logger: Logger
    private let storeTimeout: Duration
    private let loggedIgnored = Mutex<Set<String>>([])

    init(
        store: any OfferSignerStore, servedBundles: @escaping @Sendable () -> Set<String>, catalog: OfferCatalog?, trustedRoots: [Certificate],
        chainCache: AppleChainValidationCache, metrics: ServerMetrics, logger: Logger, storeTimeout: Duration,
        onStored: @escaping @Sendable (String) -> Void = { _ in }, onUnplaced: @escaping @Sendable (OfferRedemption) -> Void = { _ in }
    ) {
        self.store = store
        self.servedBundles = servedBundles
        self.catalog = catalog
        self.trustedRoots = trustedRoots
        self.chainCache = chainCache
        self.metrics = metrics
        self.logger = logger
        self.storeTimeout = storeTimeout
        self.onStored = onStored
        self.onUnplaced = onUnplaced
    }

    /// An intake outside a running server (the CLI's `notifications recover`): the apps served
    /// are the store's keys' bundles (`servedBundles`) and the catalog's.
    public convenience init(
        store: any OfferSignerStore, servedBundles: Set<String>, catalog: OfferCatalog?, trustedRoots: [Certificate], logger: Logger,
        storeTimeout: Duration = .seconds(30)
    ) {
        self.init(
            store: store, servedBundles: { servedBundles }, catalog: catalog, trustedRoots: trustedRoots, chainCache: AppleChainValidationCache(),
            metrics: ServerMetrics(), logger: logger, storeTimeout: storeTimeout)
    }

    /// Verifies `signedPayload` and stores what it says (see the type's rules).
    public func receive(signedPayload: String, now: Date = Date()) async throws -> Result<Receipt, Refusal> {
        guard let claimedBundle = AppleNotificationProbe.claimedBundleID(signedPayload) else {
            metrics.appleNotification(type: "unknown", outcome: "notification_unverified")
            return .failure(Refusal(code: "notification_unverified", detail: "signedPayload is not a compact JWS of a notification payload naming a bundleId"))
        }
        let verifier = AppleSignedDataVerifier(trustedRoots: trustedRoots, bundleID: claimedBundle, environment: nil, chainCache: chainCache)
        let notification: VerifiedNotification
        switch await verifier.verifyNotification(signedPayload, now: now) {
        case .success(let verified): notification = verified
        case .failure(let failure):
            metrics.appleNotification(type: "unknown", outcome: "notification_unverified")
            return .failure(Refusal(code: "notification_unverified", detail: "\(failure.code.rawValue): \(failure.message)"))
        }
        var receipt = Receipt(
            status: .recorded, notificationUUID: notification.notificationUUID, notificationType: notification.notificationType,
            bundleID: notification.bundleID, environment: notification.environment)
        if let (reason, detail) = notServed(notification) {
            receipt.status = .ignored
            receipt.ignoredBecause = reason
            metrics.appleNotification(type: notification.notificationType, outcome: "ignored_\(reason)")
            let key = "\(notification.bundleID)\n\(notification.environment.rawValue)\n\(reason)"
            if loggedIgnored.withLock({ $0.insert(key).inserted }) {
                logger.warning(
                    "verified App Store Server Notifications for an app or environment this service does not serve are answered 200 and not stored (logged once)",
                    metadata: ["bundle_id": "\(notification.bundleID)", "environment": "\(notification.environment.rawValue)", "reason": "\(detail)"])
            }
            return .success(receipt)
        }
        do {
            let (known, knownIsComplete) = try await storedTransactions(placing: notification)
            let update = AppleHistoryConversion.update(notification, receivedAt: now, known: known, knownIsComplete: knownIsComplete)
            let result = try await StoreDeadline.run("storing a notification", timeout: storeTimeout) { [store] in
                try await store.recordAppleHistory(update, at: Date())
            }
            if let original = update.notification?.originalTransactionID { onStored(original) }
            switch result {
            case .duplicateNotification:
                receipt.status = .duplicate
            case .recorded(let redemptions):
                metrics.notificationStored(bundleID: notification.bundleID, environment: notification.environment.rawValue, at: Date())
                for redemption in redemptions {
                    metrics.offerRedeemed(redemption)
                    logger.notice(
                        "offer redeemed",
                        metadata: [
                            "bundle_id": "\(redemption.candidate.bundleID)", "offer_id": "\(redemption.candidate.offerID)",
                            "transaction_id": "\(redemption.candidate.transactionID)", "matched": "\(redemption.isMatched)",
                            "state": "\(redemption.state.rawValue)",
                        ])
                    // Its previous period is unknown: Apple's history places it, in the background.
                    if redemption.state == .unplaced { onUnplaced(redemption) }
                }
            }
        } catch {
            metrics.appleNotification(type: notification.notificationType, outcome: "store_unavailable")
            throw error
        }
        metrics.appleNotification(type: notification.notificationType, outcome: receipt.status.rawValue)
        logger.info(
            "App Store Server Notification",
            metadata: ["type": "\(notification.notificationType)", "uuid": "\(notification.notificationUUID)", "outcome": "\(receipt.status.rawValue)"])
        return .success(receipt)
    }

    /// Why this service does not keep a verified notification (a metric label and a log text), or nil when it does.
    private func notServed(_ notification: VerifiedNotification) -> (String, String)? {
        let bundleID = notification.bundleID
        guard servedBundles().contains(bundleID) || catalog?.apps[bundleID] != nil else {
            return ("app", "no key and no catalog entry for \(bundleID)")
        }
        let app = catalog?.appSettings(bundleID: bundleID) ?? AppStoreAppSettings(bundleID: bundleID)
        guard app.environments.contains(notification.environment) else {
            return ("environment", "environment \(notification.environment.rawValue) is not accepted for \(bundleID) (apps.\(bundleID).environments)")
        }
        if notification.environment == .production {
            guard let expected = app.appAppleID else {
                return ("app_apple_id", "a Production notification needs the app's appAppleID in the catalog (apps.\(bundleID).appAppleID)")
            }
            guard notification.appAppleID == expected else {
                return ("app_apple_id", "appAppleId \(notification.appAppleID.map(String.init) ?? "(missing)") is not apps.\(bundleID).appAppleID \(expected)")
            }
        }
        return nil
    }

    /// The stored transactions of the subscription a promotional offer's transaction belongs to,
    /// which tell a new redemption from the next period of one; none for other notifications.
    private func storedTransactions(placing notification: VerifiedNotification) async throws -> ([VerifiedTransaction], isComplete: Bool) {
        guard let transaction = notification.transaction?.value, transaction.offerType == .promotional else { return ([], false) }
        let stored = try await StoreDeadline.run("reading a subscription's history", timeout: storeTimeout) { [store] in
            try await store.appleHistory(
                bundleID: notification.bundleID, environment: notification.environment.rawValue, transactionID: transaction.originalTransactionID)
        }
        // Verified again from the stored JWS: a stored history that does not verify places
        // nothing (as if the subscription's history were unknown).
        guard let stored, let history = await storedHistories.remember(stored, trustedRoots: trustedRoots, chainCache: chainCache, now: Date()) else {
            return ([], false)
        }
        return (history.transactions, stored.isComplete)
    }
}
