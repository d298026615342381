import AppStoreServerAPI
import Foundation
import Hummingbird
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import X509

/// `POST /v1/apple/notifications`: App Store Server Notifications V2 (`{"signedPayload": "…"}`).
///
/// Rules:
/// - Any `Content-Type` is accepted: Apple documents the JSON body it posts (`responseBodyV2`,
///   https://developer.apple.com/documentation/appstoreservernotifications/responsebodyv2) and
///   not the header; Apple is silent on it, so the service does not require one.
/// - Apple sends no credentials, so authenticity comes from the payload alone: its x5c chain to
///   a trusted root, Apple's marker OIDs and its ES256 signature, then every JWS inside it. The
///   signature is checked before the app it names is looked up: an unverified payload gets
///   `notification_unverified` whatever it names, so the configuration cannot be probed.
/// - The app it names must be one of this service's (a key's bundle or an `apps` entry of the
///   catalog); its environment must be one the app accepts (`apps.<bundle>.environments`); a
///   Production notification must name the app's `appAppleID`, checked in Production only as
///   Apple's `SignedDataVerifier` does (`_verify_notification` in
///   `appstoreserverlibrary/signed_data_verifier.py` of Apple's App Store Server Library for
///   Python). Anything else is refused (4xx) and nothing is stored.
/// - Idempotent by `notificationUUID`: Apple retries until it gets a 200, and a repeat is
///   answered 200 without a second write.
/// - A valid notification of any type is answered 200, once its content is durably stored
///   (its transaction, renewal info and any redemption); a store failure is a 503, so Apple
///   sends it again.
struct AppleNotificationController: Sendable {
    let store: any OfferSignerStore
    let keyRing: KeyRingHolder
    let catalog: OfferCatalog?
    let trustedRoots: [Certificate]
    let chainCache: AppleChainValidationCache
    let appleHistory: AppStoreServerAPIClient?
    let metrics: ServerMetrics
    let storeTimeout: Duration
    /// Apple's payloads are a few KiB per JWS, three JWS at most.
    let maximumBodyBytes: Int

    func receive(_ request: Request, context: some RequestContext) async throws -> Response {
        var type = "unknown"
        do {
            let (notification, receivedAt) = try await verify(request, type: &type)
            let (known, knownIsComplete) = try await storedTransactions(placing: notification)
            let update = AppleHistoryConversion.update(notification, receivedAt: receivedAt, known: known, knownIsComplete: knownIsComplete)
            let result = try await StoreDeadline.run("storing a notification", timeout: storeTimeout) { [store] in
                try await store.recordAppleHistory(update, at: Date())
            }
            if let original = update.notification?.originalTransactionID { appleHistory?.invalidate(originalTransactionID: original) }
            let outcome: String
            switch result {
            case .duplicateNotification:
                outcome = "duplicate"
            case .recorded(let redemptions):
                outcome = "recorded"
                for redemption in redemptions {
                    metrics.offerRedeemed(bundleID: redemption.candidate.bundleID, offerID: redemption.candidate.offerID, matched: redemption.isMatched)
                    context.logger.notice(
                        "offer redeemed",
                        metadata: [
                            "bundle_id": "\(redemption.candidate.bundleID)", "offer_id": "\(redemption.candidate.offerID)",
                            "transaction_id": "\(redemption.candidate.transactionID)", "matched": "\(redemption.isMatched)",
                        ])
                }
            }
            metrics.appleNotification(type: type, outcome: outcome)
            context.logger.info(
                "App Store Server Notification", metadata: ["type": "\(notification.notificationType)", "uuid": "\(notification.notificationUUID)", "outcome": "\(outcome)"])
            var writer = JSONObjectWriter()
            writer.field("status", outcome)
            writer.field("notificationUUID", notification.notificationUUID)
            return Response.json(writer.finish())
        } catch let problem as APIProblem {
            metrics.appleNotification(type: type, outcome: problem.code)
            throw problem
        } catch {
            metrics.appleNotification(type: type, outcome: "store_unavailable")
            throw error
        }
    }

    /// The stored transactions of the subscription a promotional offer's transaction belongs to,
    /// which tell a new redemption from the next period of one; none for other notifications.
    private func storedTransactions(placing notification: VerifiedNotification) async throws -> ([VerifiedTransaction], isComplete: Bool) {
        guard let transaction = notification.transaction?.value, transaction.offerType == .promotional else { return ([], false) }
        let stored = try await StoreDeadline.run("reading a subscription's history", timeout: storeTimeout) { [store] in
            try await store.appleHistory(
                bundleID: notification.bundleID, environment: notification.environment.rawValue, transactionID: transaction.originalTransactionID)
        }
        guard let stored, let history = AppleHistoryConversion.history(stored) else { return ([], false) }
        return (history.transactions, stored.isComplete)
    }

    private func verify(_ request: Request, type: inout String) async throws -> (VerifiedNotification, Date) {
        let body = try await RequestBodyReader.body(request, limit: maximumBodyBytes)
        let signedPayload = try Self.signedPayload(body)
        let now = Date()
        // The signature first: a payload Apple did not sign gets the same answer whatever app it
        // names, so nothing about the configured apps can be probed with forged payloads.
        let probe = AppleSignedDataVerifier(trustedRoots: trustedRoots, bundleID: "", environments: [.production, .sandbox], chainCache: chainCache)
        let bundleID: String
        switch await probe.verifiedNotificationBundleID(signedPayload, now: now) {
        case .success(let value): bundleID = value
        case .failure(let failure):
            throw APIProblem(.badRequest, code: "notification_unverified", detail: "signedPayload is not a notification signed by Apple (\(failure.code.rawValue))")
        }
        let ring = keyRing.ring
        guard ring.configuredBundles.contains(bundleID) || catalog?.apps[bundleID] != nil else {
            throw APIProblem(.forbidden, code: "notification_foreign", detail: "the notification is for an app this service does not serve")
        }
        let app = catalog?.appSettings(bundleID: bundleID) ?? AppStoreAppSettings(bundleID: bundleID)
        let verifier = AppleSignedDataVerifier(trustedRoots: trustedRoots, bundleID: bundleID, environment: nil, chainCache: chainCache)
        let notification: VerifiedNotification
        switch await verifier.verifyNotification(signedPayload, appAppleID: app.appAppleID, now: now) {
        case .success(let verified):
            notification = verified
        case .failure(let failure) where failure.code == .bundleIDMismatch || failure.code == .environmentMismatch:
            throw APIProblem(.forbidden, code: "notification_foreign", detail: "\(failure.code.rawValue): \(failure.message)")
        case .failure(let failure):
            throw APIProblem(.badRequest, code: "notification_unverified", detail: "\(failure.code.rawValue): \(failure.message)")
        }
        type = notification.notificationType
        guard app.environments.contains(notification.environment) else {
            throw APIProblem(
                .forbidden, code: "notification_foreign",
                detail: "environment \(notification.environment.rawValue) is not accepted for \(bundleID) (apps.\(bundleID).environments)")
        }
        return (notification, now)
    }

    /// The body must be `{"signedPayload": "<compact JWS>"}` (other members are ignored, as Apple may add some).
    static func signedPayload(_ body: Data) throws(APIProblem) -> String {
        guard let object = (try? JSONSerialization.jsonObject(with: body)) as? [String: Any] else {
            throw APIProblem.badRequest("malformed_json", "the body is not a JSON object")
        }
        guard let value = object["signedPayload"] else {
            throw APIProblem.badRequest("missing_field", "signedPayload is required")
        }
        guard let text = value as? String, !text.isEmpty else {
            throw APIProblem.badRequest("wrong_type", "signedPayload must be a non-empty string")
        }
        return text
    }
}
