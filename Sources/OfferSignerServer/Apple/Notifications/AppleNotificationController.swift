import Foundation
import Hummingbird
import OfferSignerCore

/// `POST /v1/apple/notifications`: App Store Server Notifications V2 (`{"signedPayload": "…"}`).
///
/// Rules (the rest are ``AppleNotificationIntake``'s):
/// - Any `Content-Type` is accepted: Apple documents the JSON body it posts (`responseBodyV2`,
///   https://developer.apple.com/documentation/appstoreservernotifications/responsebodyv2) and
///   not the header; Apple is silent on it, so the service does not require one.
/// - A notification that does not verify is refused (400 `notification_unverified`, the same
///   answer whatever app it names, so the configuration cannot be probed) and nothing is stored;
///   Apple retries any answer but a 200.
/// - A verified notification is answered 200 with `status` `recorded`, `duplicate` or `ignored`
///   (an app or environment this service does not serve), once what it says is durably stored;
///   a store failure is a 503, so Apple sends it again.
struct AppleNotificationController: Sendable {
    let intake: AppleNotificationIntake
    /// Apple's payloads are a few KiB per JWS, three JWS at most.
    let maximumBodyBytes: Int

    /// Handles a notification whose `body` was read already (before the endpoint's gate, see
    /// ``ConcurrencyGate``).
    func receive(body: Data) async throws -> Response {
        let signedPayload = try Self.signedPayload(body)
        switch try await intake.receive(signedPayload: signedPayload) {
        case .failure(let refusal):
            throw APIProblem(.badRequest, code: "notification_unverified", detail: refusal.detail)
        case .success(let receipt):
            var writer = JSONObjectWriter()
            writer.field("status", receipt.status.rawValue)
            writer.field("notificationUUID", receipt.notificationUUID)
            return Response.json(writer.finish())
        }
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
