import Foundation
import OfferSignerEligibility

/// A Retention Messaging request (`DecodedRealtimeRequestBody`) whose signature verified.
public struct VerifiedRetentionRequest: Sendable, Hashable {
    /// `originalTransactionId`: the subscription the customer is looking at.
    public var originalTransactionID: String
    /// `appAppleId`. Apple's model (`DecodedRealtimeRequestBody.py`) always has one, but its
    /// verifier compares it in Production only; a Sandbox request without one is still read.
    public var appAppleID: Int64?
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
    var appAppleId: Int64?
    var productId: String
    var userLocale: String?
    var requestIdentifier: String
    var environment: String
    var signedDate: Double
}

extension AppleSignedDataVerifier {
    /// Verifies a Retention Messaging request's `signedPayload` like any Apple-signed data (chain,
    /// marker OIDs, ES256) and checks its environment is accepted (this verifier's, or Production
    /// or Sandbox). Which app it is for is the caller's to check, on the verified payload: the
    /// request carries no bundle ID, and Apple's own verifier compares `appAppleId` only in
    /// Production (`verify_and_decode_realtime_request` in `appstoreserverlibrary/signed_data_verifier.py`
    /// of Apple's App Store Server Library for Python).
    public func verifyRetentionRequest(_ signedPayload: String, now: Date) async -> Result<VerifiedRetentionRequest, VerificationFailure> {
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
