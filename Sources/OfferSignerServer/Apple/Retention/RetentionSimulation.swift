import AppStoreServerAPI
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import X509

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
        /// Whether the app's key was checked as the service loads it (its row authenticated and
        /// the key unsealed with the master key); false when the simulation had no master key.
        public var keyChecked = false
    }

    /// The store's key registry is refused as a running service refuses it (its manifest does
    /// not vouch for its rows): the service would not start on it, so nothing is simulated.
    public struct RegistryRefused: Error, CustomStringConvertible {
        public let description: String
    }

    /// Decides for `originalTransactionID` and `productID` of the app: on the stored, complete
    /// history, else (with `apple`) on Apple's answer, and the customer's ledger.
    ///
    /// As the endpoint: the stored history is decided on only as its stored JWS verify against
    /// `trustedRoots` (``DecodedHistoryCache``: the `decoded` column, which a database writer
    /// could edit, is not believed); and an offer chosen is reported only when the app has an
    /// active key that could sign it (with an issuer ID for a V2 plan), otherwise the fallback with
    /// `no_active_key` or `issuer_id_missing`, the reasons the endpoint audits. With `masterKey`
    /// the key is the one the service would load (the registry's manifest and the key's row
    /// verified, the key unsealed: ``KeyRing``); without it the store's row is taken as it is
    /// (`keyChecked` false): a database writer's edit of the key rows can then make the report
    /// differ from the endpoint's answer either way. An app the endpoint would not answer for in
    /// `environment` (``RetentionController/app(appAppleID:environment:catalog:)`` with the app's
    /// `appAppleID`, which Apple's request names) gets `nothing` with `retention_request_foreign`,
    /// Apple's request being refused with 403 there.
    /// (A running service keeps serving the last registry it verified; this reads the store's now.)
    public static func simulate(
        store: any OfferSignerStore, catalog: OfferCatalog, app: AppStoreAppSettings, originalTransactionID: String, productID: String,
        environment: AppleEnvironment, now: Date, apple: (client: AppStoreServerAPIClient, credentials: AppStoreServerAPICredentials?)?,
        trustedRoots: [Certificate], masterKey: MasterKey?, userLocale: String? = nil
    ) async throws -> Outcome {
        guard let plan = app.retention else {
            return Outcome(answer: "nothing", json: nil, historySource: "none", decision: nil, fallbackReason: "no_retention_plan")
        }
        guard RetentionController.app(appAppleID: app.appAppleID, environment: environment, catalog: catalog)?.app.bundleID == app.bundleID else {
            return Outcome(answer: "nothing", json: nil, historySource: "none", decision: nil, fallbackReason: "retention_request_foreign")
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
        let issuerID: String??
        if let masterKey {
            let snapshot = try await store.registrySnapshot()
            if let problem = RegistryManifest.problem(stored: snapshot.manifest, entries: snapshot.manifestEntries, authenticator: masterKey.registryRows) {
                throw RegistryRefused(description: "the store's key registry is refused, as a starting service would refuse it: \(problem)")
            }
            let ring = KeyRing(snapshot: snapshot, masterKey: masterKey, logger: Logger(label: "offer-signer.retention-simulate"))
            issuerID = ring.activeKeys[app.bundleID].map { $0.issuerID }
        } else {
            issuerID = try await store.listKeys().first { $0.bundleID == app.bundleID && $0.state == .active }.map { $0.issuerID }
        }
        let unsignable: String? =
            switch issuerID {
            case nil: "no_active_key"
            case .some(nil) where plan.signatureVersion == .v2: "issuer_id_missing"
            default: nil
            }
        if let unsignable {
            var withoutOffer = decision
            withoutOffer.offer = nil
            withoutOffer.fallbackReason = unsignable
            var outcome = fallback(productPlan.fallback, userLocale: userLocale, source: source, decision: withoutOffer, reason: unsignable)
            outcome.keyChecked = masterKey != nil
            return outcome
        }
        var offer = JSONObjectWriter()
        offer.field("messageIdentifier", choice.message.identifier(for: userLocale))
        offer.field(plan.signatureVersion == .v2 ? "promotionalOfferSignatureV2" : "promotionalOfferSignatureV1", "(signed by the service; not made here)")
        var writer = JSONObjectWriter()
        writer.field("promotionalOffer", json: offer.finish())
        return Outcome(
            answer: "promotionalOffer", json: writer.finish(), historySource: source, decision: decision, fallbackReason: nil, keyChecked: masterKey != nil)
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
