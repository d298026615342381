import Foundation
import OfferSignerCore
import OfferSignerEligibility

/// What to answer one Retention Messaging request, decided from the app's plan, Apple's history of
/// the subscription and the customer's ledger; signs nothing (`offer-signer retention simulate`
/// shows it as it is).
///
/// Rules: the plan's offers for the product are tried in order; the first the customer is
/// eligible for is the answer; when none is (or there is no history), the product's fallback is.
public struct RetentionDecision: Sendable {
    /// The offer to sign and answer, if any.
    public var offer: RetentionOfferChoice?
    /// The decision of each offer tried, in order.
    public var tried: [EligibilityDecision]
    /// Why no offer is answered (`not_eligible`, `no_offers`, `history_unavailable`, …); nil with an offer.
    public var fallbackReason: String?
}

public enum RetentionDecider {
    /// The customer key of a subscription in the ledger: its appAccountToken (lowercased), or
    /// `otid:<originalTransactionId>` when its transactions carry none, so that rules counting
    /// issued signatures hold for it too.
    public static func customerKey(history: VerifiedHistory, originalTransactionID: String) -> (key: String, appAccountToken: UUID?) {
        if let token = appAccountToken(history: history, originalTransactionID: originalTransactionID) {
            return (token.uuidString.lowercased(), token)
        }
        return ("otid:" + originalTransactionID, nil)
    }

    /// The appAccountToken of the subscription's latest transaction that carries one.
    public static func appAccountToken(history: VerifiedHistory, originalTransactionID: String) -> UUID? {
        history.transactions.reversed()
            .first { $0.originalTransactionID == originalTransactionID && ($0.appAccountToken?.isEmpty == false) }
            .flatMap { $0.appAccountToken.flatMap(UUID.init(uuidString:)) }
    }

    public static func decide(
        plan: RetentionProductPlan, catalog: OfferCatalog, bundleID: String, history: VerifiedHistory, ledger: [IssuedOfferRecord], now: Date
    ) -> RetentionDecision {
        guard !plan.offers.isEmpty else { return RetentionDecision(offer: nil, tried: [], fallbackReason: "no_offers") }
        let evaluator = EligibilityEvaluator(catalog: catalog)
        var tried: [EligibilityDecision] = []
        for choice in plan.offers {
            guard let offer = catalog.offer(id: choice.offerID, bundleID: bundleID) else { continue }
            // Apple's history of the subscription: the redemptions Apple recorded count, not our signatures.
            let decision = evaluator.evaluate(offer, evidence: history.evidence, ledger: ledger, now: now, counting: .applesRecord)
            tried.append(decision)
            if decision.eligible { return RetentionDecision(offer: choice, tried: tried, fallbackReason: nil) }
        }
        return RetentionDecision(offer: nil, tried: tried, fallbackReason: "not_eligible")
    }

    /// The `RealtimeResponseBody` of a fallback, in the customer's locale: exactly one member, or
    /// nil for no answer.
    ///
    /// Shapes as Apple's models have them (`appstoreserverlibrary/models/RealtimeResponseBody.py`,
    /// `Message.py`, `AlternateProduct.py` of Apple's App Store Server Library for Python;
    /// https://developer.apple.com/documentation/retentionmessaging/realtimeresponsebody):
    /// `{"message": {"messageIdentifier"}}` or `{"alternateProduct": {"messageIdentifier",
    /// "productId", "billingPlanType"?}}`.
    public static func fallbackJSON(_ fallback: RetentionFallback?, userLocale: String?) -> String? {
        switch fallback {
        case .message(let message)?:
            var body = JSONObjectWriter()
            body.field("messageIdentifier", message.identifier(for: userLocale))
            var writer = JSONObjectWriter()
            writer.field("message", json: body.finish())
            return writer.finish()
        case .alternateProduct(let message, let productID, let billingPlanType)?:
            var alternate = JSONObjectWriter()
            alternate.field("messageIdentifier", message.identifier(for: userLocale))
            alternate.field("productId", productID)
            if let billingPlanType { alternate.field("billingPlanType", billingPlanType.rawValue) }
            var writer = JSONObjectWriter()
            writer.field("alternateProduct", json: alternate.finish())
            return writer.finish()
        case nil:
            return nil
        }
    }
}
