import AppStoreServerAPI
import Foundation
import X509
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage

/// What `POST /v1/apple/retention` would answer for a subscription, and why, signing nothing
/// (`offer-signer retention simulate`).
public enum RetentionSimulation {
    public struct Outcome: Sendable {
        /// `promotionalOffer`, `message`, `alternateProduct` or `nothing`.
        public var answer: String
        /// The answer's JSON, with the signature left out (nothing is signed), or nil for nothing.
        public var json: String?
        /// Where the history came from: `store`, `api`, or `none`.
        public var historySource: String
        public var decision: RetentionDecision?
        /// Why no offer is answered, when none is.
        public var fallbackReason: String?
    }

    /// Decides for `originalTransactionID` and `productID` of the app: on the stored, complete
    /// history, else (with `apple`) on Apple's answer, and the customer's ledger.
    ///
    /// As the endpoint: the stored history is decided on only as its stored JWS verify against
    /// `trustedRoots` (``DecodedHistoryCache``: the `decoded` column, which a database writer
    /// could edit, is not believed); and an offer chosen is reported only when the app has an
    /// active key that could sign it (with an issuer ID for a V2 plan), otherwise the fallback with
    /// `no_active_key` or `issuer_id_missing`, the reasons the endpoint audits. (Without the
    /// master key the key row's own authentication is not checked here: a row the service would
    /// refuse to load is still reported as a key that could sign.)
    public static func simulate(
        store: any OfferSignerStore, catalog: OfferCatalog, app: AppStoreAppSettings, originalTransactionID: String, productID: String,
        environment: AppleEnvironment, now: Date, apple: (client: AppStoreServerAPIClient, credentials: AppStoreServerAPICredentials?)?,
        trustedRoots: [Certificate], userLocale: String? = nil
    ) async throws -> Outcome {
        guard let plan = app.retention else {
            return Outcome(answer: "nothing", json: nil, historySource: "none", decision: nil, fallbackReason: "no_retention_plan")
        }
        guard let productPlan = plan.products[productID] else {
            return Outcome(answer: "nothing", json: nil, historySource: "none", decision: nil, fallbackReason: "unknown_product")
        }
        var history: VerifiedHistory?
        var source = "none"
        if app.notificationHistory,
            let stored = try await store.appleHistory(bundleID: app.bundleID, environment: environment.rawValue, transactionID: originalTransactionID),
            stored.isComplete,
            let decoded = await DecodedHistoryCache(capacity: 1).remember(stored, trustedRoots: trustedRoots, chainCache: AppleChainValidationCache(), now: now),
            StoredHistoryFreshness.isCurrent(decoded, updatedAt: stored.updatedAt, now: now),
            // As the endpoint: the history of the subscription asked about, not one a row points to.
            decoded.transactions.contains(where: { $0.originalTransactionID == originalTransactionID })
        {
            history = decoded
            source = "store"
        } else if let apple {
            var asked = app
            asked.environments = [environment]
            if case .history(let fetched) = await apple.client.history(transactionID: originalTransactionID, app: asked, credentials: apple.credentials, now: now) {
                history = fetched
                source = "api"
            }
        }
        guard let history else {
            return fallback(productPlan.fallback, userLocale: userLocale, source: source, decision: nil, reason: "history_unavailable")
        }
        let (customer, _) = RetentionDecider.customerKey(history: history, originalTransactionID: originalTransactionID)
        let ledger = try await EligibilityService.ledger(customer: customer, bundleID: app.bundleID, store: store, timeout: .seconds(30))
        let decision = RetentionDecider.decide(plan: productPlan, catalog: catalog, bundleID: app.bundleID, history: history, ledger: ledger, now: now)
        guard let choice = decision.offer else {
            return fallback(productPlan.fallback, userLocale: userLocale, source: source, decision: decision, reason: decision.fallbackReason ?? "not_eligible")
        }
        // The key the endpoint would sign with (`RetentionController.issue`): the app's active one.
        let active = try await store.listKeys().first { $0.bundleID == app.bundleID && $0.state == .active }
        let unsignable: String? =
            if active == nil { "no_active_key" } else if plan.signatureVersion == .v2, active?.issuerID == nil { "issuer_id_missing" } else { nil }
        if let unsignable {
            var withoutOffer = decision
            withoutOffer.offer = nil
            withoutOffer.fallbackReason = unsignable
            return fallback(productPlan.fallback, userLocale: userLocale, source: source, decision: withoutOffer, reason: unsignable)
        }
        var offer = JSONObjectWriter()
        offer.field("messageIdentifier", choice.message.identifier(for: userLocale))
        offer.field(plan.signatureVersion == .v2 ? "promotionalOfferSignatureV2" : "promotionalOfferSignatureV1", "(signed by the service; not made here)")
        var writer = JSONObjectWriter()
        writer.field("promotionalOffer", json: offer.finish())
        return Outcome(answer: "promotionalOffer", json: writer.finish(), historySource: source, decision: decision, fallbackReason: nil)
    }

    private static func fallback(_ fallback: RetentionFallback?, userLocale: String?, source: String, decision: RetentionDecision?, reason: String) -> Outcome {
        let json = RetentionDecider.fallbackJSON(fallback, userLocale: userLocale)
        let answer = switch fallback {
        case .message?: "message"
        case .alternateProduct?: "alternateProduct"
        case nil: "nothing"
        }
        return Outcome(answer: answer, json: json, historySource: source, decision: decision, fallbackReason: reason)
    }
}
