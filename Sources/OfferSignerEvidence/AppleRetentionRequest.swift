import Foundation
import OfferSignerEligibility

/// A Retention Messaging request (`DecodedRealtimeRequestBody`) whose signature verified.
public struct VerifiedRetentionRequest: Sendable, Hashable {
    /// `originalTransactionId`: the subscription the customer is looking at.
    public var originalTransactionID: String
    /// `appAppleId`.
    public var appAppleID: Int64
    /// `productId`: the subscription's product.
    public var productID: String
    /// `userLocale` (e.g. `en-US`).
    public var userLocale: String?
    /// `requestIdentifier`: a UUID Apple makes per request (lowercased).
    public var requestIdentifier: String
    /// `environment`.
    public var environment: AppleEnvironment
    /// `signedDate`.
    public var signedDate: Date
}

/// The request payload's wire form.
struct RetentionRequestPayload: Decodable {
    var originalTransactionId: String
    var appAppleId: Int64
    var productId: String
    var userLocale: String?
    var requestIdentifier: String
    var environment: String
    var signedDate: Double
}

/// Reads which app a Retention Messaging request names before its signature is checked, only to
/// choose that app's settings; the verification that follows binds it.
public enum AppleRetentionRequestProbe {
    /// The `appAppleId` the payload claims, or nil when the JWS cannot be read.
    public static func claimedAppAppleID(_ signedPayload: String) -> Int64? {
        guard signedPayload.utf8.count <= AppleSignedDataVerifier.maximumJWSLength, let parts = Base64URL.compactParts(signedPayload),
            let payload = Base64URL.decode(parts[1])
        else { return nil }
        struct Probe: Decodable { var appAppleId: Int64? }
        return (try? JSONDecoder().decode(Probe.self, from: payload))?.appAppleId
    }
}

extension AppleSignedDataVerifier {
    /// Verifies a Retention Messaging request's `signedPayload` like any Apple-signed data (chain,
    /// marker OIDs, ES256), then: `appAppleId` is the app's (Apple: "if it doesn't match, don't
    /// respond"), and the environment is accepted (this verifier's, or Production or Sandbox).
    /// The bundle ID is not checked: the request does not carry one.
    public func verifyRetentionRequest(_ signedPayload: String, appAppleID: Int64, now: Date) async -> Result<VerifiedRetentionRequest, VerificationFailure> {
        let data: Data
        switch await verifySignedPayload(signedPayload, now: now) {
        case .success(let payload): data = payload
        case .failure(let failure): return .failure(failure)
        }
        let payload: RetentionRequestPayload
        do {
            payload = try JSONDecoder().decode(RetentionRequestPayload.self, from: data)
        } catch {
            return .failure(.init(.malformedPayload, "retention request payload: not Apple's DecodedRealtimeRequestBody"))
        }
        guard payload.appAppleId == appAppleID else {
            return .failure(.init(.bundleIDMismatch, "appAppleId \(payload.appAppleId) is not \(appAppleID)"))
        }
        guard let requestIdentifier = UUID(uuidString: payload.requestIdentifier) else {
            return .failure(.init(.malformedPayload, "requestIdentifier is not a UUID"))
        }
        let environment: AppleEnvironment
        switch checkEnvironmentName(payload.environment) {
        case .success(let value): environment = value
        case .failure(let failure): return .failure(failure)
        }
        return .success(VerifiedRetentionRequest(
            originalTransactionID: payload.originalTransactionId, appAppleID: payload.appAppleId, productID: payload.productId,
            userLocale: payload.userLocale, requestIdentifier: requestIdentifier.uuidString.lowercased(), environment: environment,
            signedDate: date(payload.signedDate)))
    }
}
