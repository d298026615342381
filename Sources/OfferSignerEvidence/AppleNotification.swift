import Foundation
import OfferSignerEligibility

/// An App Store Server Notification V2 whose signed payload, and every signed item inside it,
/// verified (Apple's `ResponseBodyV2DecodedPayload`, the fields we use).
public struct VerifiedNotification: Sendable, Hashable {
    /// `notificationType` (e.g. `SUBSCRIBED`, `DID_RENEW`, `OFFER_REDEEMED`, `TEST`).
    public var notificationType: String
    /// `subtype` (e.g. `RESUBSCRIBE`, `INITIAL_BUY`).
    public var subtype: String?
    /// `notificationUUID`: Apple sends the same UUID again when it retries a notification.
    public var notificationUUID: String
    /// `signedDate`.
    public var signedDate: Date
    /// `data.bundleId` (or `summary.bundleId`).
    public var bundleID: String
    /// `data.environment` (or `summary.environment`).
    public var environment: AppleEnvironment
    /// `data.appAppleId` (absent in the sandbox).
    public var appAppleID: Int64?
    /// `data.signedTransactionInfo`, verified, with the JWS as Apple sent it.
    public var transaction: Signed<VerifiedTransaction>?
    /// `data.signedRenewalInfo`, verified, with the JWS as Apple sent it.
    public var renewalInfo: Signed<VerifiedRenewalInfo>?
    /// `appData.signedAppTransactionInfo` (e.g. `RESCIND_CONSENT`), its signature and `bundleId`
    /// verified; kept as Apple sent it (nothing here reads an AppTransaction).
    public var signedAppTransactionInfo: String?

    /// A verified item and the JWS it came from.
    public struct Signed<Value: Sendable & Hashable>: Sendable, Hashable {
        public var value: Value
        public var jws: String
        public init(value: Value, jws: String) {
            self.value = value
            self.jws = jws
        }
    }
}

/// The notification payload's wire form.
struct NotificationPayload: Decodable {
    struct DataField: Decodable {
        var appAppleId: Int64?
        var bundleId: String?
        var environment: String?
        var signedTransactionInfo: String?
        var signedRenewalInfo: String?
    }
    struct Summary: Decodable {
        var appAppleId: Int64?
        var bundleId: String?
        var environment: String?
    }
    var notificationType: String
    var subtype: String?
    var notificationUUID: String
    var signedDate: Double
    var data: DataField?
    /// Apple's `externalPurchaseToken`: it has no `environment`; as in Apple's library, a
    /// Sandbox token's `externalPurchaseId` starts with "SANDBOX".
    struct ExternalPurchaseToken: Decodable {
        var appAppleId: Int64?
        var bundleId: String?
        var externalPurchaseId: String?
    }
    var summary: Summary?
    var externalPurchaseToken: ExternalPurchaseToken?
    /// Apple's `appData` (e.g. `RESCIND_CONSENT`): appAppleId, bundleId, environment and
    /// signedAppTransactionInfo (appstoreserverlibrary/models/AppData.py;
    /// https://developer.apple.com/documentation/appstoreservernotifications/appdata).
    struct AppData: Decodable {
        var appAppleId: Int64?
        var bundleId: String?
        var environment: String?
        var signedAppTransactionInfo: String?
    }
    var appData: AppData?

    /// Where Apple's library reads the app from (signed_data_verifier.py,
    /// verify_and_decode_notification): `data`, else `summary`, else `externalPurchaseToken`, else `appData`.
    var bundleID: String? { data?.bundleId ?? summary?.bundleId ?? externalPurchaseToken?.bundleId ?? appData?.bundleId }
    var environmentName: String? {
        if let environment = data?.environment ?? summary?.environment { return environment }
        if externalPurchaseToken == nil, let environment = appData?.environment { return environment }
        guard let token = externalPurchaseToken else { return nil }
        return token.externalPurchaseId?.hasPrefix("SANDBOX") == true ? AppleEnvironment.sandbox.rawValue : AppleEnvironment.production.rawValue
    }
    var appAppleID: Int64? { data?.appAppleId ?? summary?.appAppleId ?? externalPurchaseToken?.appAppleId ?? appData?.appAppleId }
}

/// Reads the app a notification names before its signature is checked, only to choose the
/// verifier (the one of that app) that then checks everything, the bundle included. Nothing is
/// answered from what it reads: a payload that does not then verify gets the same refusal
/// whatever app it names.
public enum AppleNotificationProbe {
    /// The `bundleId` the payload claims, or nil when the JWS cannot be read.
    public static func claimedBundleID(_ signedPayload: String) -> String? {
        guard signedPayload.utf8.count <= AppleSignedDataVerifier.maximumJWSLength, let parts = Base64URL.compactParts(signedPayload),
            let payload = Base64URL.decode(parts[1]),
            let decoded = try? JSONDecoder().decode(NotificationPayload.self, from: payload)
        else { return nil }
        return decoded.bundleID
    }
}

extension AppleSignedDataVerifier {
    /// Verifies a notification's `signedPayload` like any Apple-signed data (chain, marker OIDs,
    /// ES256), then: its `bundleId` is this verifier's, its environment is accepted (this
    /// verifier's, or Production or Sandbox), `appAppleID` (when given) is the payload's in
    /// Production, and the signed transaction and renewal info inside verify too (same bundle and
    /// environment). Any failure rejects the whole notification.
    public func verifyNotification(_ signedPayload: String, appAppleID: Int64?, now: Date) async -> Result<VerifiedNotification, VerificationFailure> {
        let notification: VerifiedNotification
        switch await verifyNotification(signedPayload, now: now) {
        case .success(let verified): notification = verified
        case .failure(let failure): return .failure(failure)
        }
        if notification.environment == .production {
            guard let appAppleID else {
                return .failure(.init(.bundleIDMismatch, "a Production notification needs the app's appAppleID in the catalog (apps.\(bundleID).appAppleID)"))
            }
            guard notification.appAppleID == appAppleID else {
                return .failure(.init(.bundleIDMismatch, "appAppleId \(notification.appAppleID.map(String.init) ?? "(missing)") is not \(appAppleID)"))
            }
        }
        return .success(notification)
    }

    /// Verifies a notification's `signedPayload` and every signed item inside it, as
    /// ``verifyNotification(_:appAppleID:now:)`` does, but leaves the App Apple ID to the caller
    /// (who decides whether this service serves the app it names).
    ///
    /// Every payload shape of Apple's current model is read (ResponseBodyV2DecodedPayload.py:
    /// `data`, `summary`, `externalPurchaseToken`, `appData`); an `appData`'s
    /// `signedAppTransactionInfo` must verify (chain, marker OIDs, ES256) and name this bundle.
    public func verifyNotification(_ signedPayload: String, now: Date) async -> Result<VerifiedNotification, VerificationFailure> {
        let payloadData: Data
        switch await verifySignedPayload(signedPayload, now: now) {
        case .success(let data): payloadData = data
        case .failure(let failure): return .failure(failure)
        }
        let payload: NotificationPayload
        do {
            payload = try JSONDecoder().decode(NotificationPayload.self, from: payloadData)
        } catch {
            return .failure(.init(.malformedPayload, "notification payload: not Apple's ResponseBodyV2DecodedPayload"))
        }
        guard let bundle = payload.bundleID else {
            return .failure(.init(.malformedPayload, "notification payload names no bundleId"))
        }
        guard bundle == bundleID else {
            return .failure(.init(.bundleIDMismatch, "bundleId '\(bundle)' is not '\(bundleID)'"))
        }
        let environment: AppleEnvironment
        switch checkEnvironmentName(payload.environmentName ?? "") {
        case .success(let value): environment = value
        case .failure(let failure): return .failure(failure)
        }
        let itemVerifier = AppleSignedDataVerifier(trustedRoots: trustedRoots, bundleID: bundleID, environment: environment, chainCache: chainCache)
        var notification = VerifiedNotification(
            notificationType: payload.notificationType, subtype: payload.subtype, notificationUUID: payload.notificationUUID,
            signedDate: date(payload.signedDate), bundleID: bundle, environment: environment, appAppleID: payload.appAppleID)
        if let jws = payload.data?.signedTransactionInfo {
            switch await itemVerifier.verifyTransaction(jws, now: now) {
            case .success(let transaction): notification.transaction = .init(value: transaction, jws: jws)
            case .failure(let failure): return .failure(.init(failure.code, "signedTransactionInfo: \(failure.message)"))
            }
        }
        if let jws = payload.data?.signedRenewalInfo {
            switch await itemVerifier.verifyRenewalInfo(jws, now: now) {
            case .success(let info): notification.renewalInfo = .init(value: info, jws: jws)
            case .failure(let failure): return .failure(.init(failure.code, "signedRenewalInfo: \(failure.message)"))
            }
        }
        if let jws = payload.appData?.signedAppTransactionInfo {
            switch await verifySignedPayload(jws, now: now) {
            case .success(let data):
                struct AppTransactionProbe: Decodable { var bundleId: String? }
                guard let probe = try? JSONDecoder().decode(AppTransactionProbe.self, from: data), probe.bundleId == bundleID else {
                    return .failure(.init(.bundleIDMismatch, "signedAppTransactionInfo: not an AppTransaction of '\(bundleID)'"))
                }
                notification.signedAppTransactionInfo = jws
            case .failure(let failure): return .failure(.init(failure.code, "signedAppTransactionInfo: \(failure.message)"))
            }
        }
        return .success(notification)
    }
}
