import AppStoreServerAPI
import Foundation
import HTTPTypes
import OfferSignerCore
import OfferSignerEligibility

/// What an end user (a user JWT principal) may have signed, beyond the checks every caller gets.
///
/// An API client is a backend the operator trusts with its bundles; a user is anyone signed in to
/// the app, so for users:
/// - only offers in the offers catalog are signed (403 `offer_not_in_catalog`): an offer the
///   catalog does not name (a support goodwill offer of twelve free months, say) has no policy,
///   so no user gets it; a service without a catalog signs nothing for users;
/// - a JWS names a `transactionID` (400 `transaction_id_required`) proven to be the user's (403
///   `transaction_not_owned`). A promotional-offer JWS carries no appAccountToken: the
///   transaction ID is what ties it to one Apple ID. Proof is Apple-signed data carrying the
///   user's appAccountToken: a transaction of the request's verified `evidence` whose
///   `transactionId` or `originalTransactionId` is that ID and whose `appAccountToken` is the
///   user's, or Apple's history of that ID (the stored history or the App Store Server API's
///   answer) whose transactions carry the user's token and no other (a history without any
///   token is nobody's as far as the service can tell, so it proves nothing). Apple's
///   documentation says nothing on binding an offer to an account beyond the optional
///   `transactionId` claim (Apple's `PromotionalOfferV2SignatureCreator` in
///   app-store-server-library); the rule is this service's.
///
/// Refusals say what is missing, never anything about the transaction's owner. Runs before any
/// customer lock (proof may ask Apple).
enum UserSigningPolicy {
    /// 403 `offer_not_in_catalog` unless the catalog names the offer for the bundle.
    static func checkCatalogued(offerID: String, bundleID: String, eligibility: EligibilityService?) throws(APIProblem) {
        guard eligibility?.configuration.catalog.offer(id: offerID, bundleID: bundleID) != nil else {
            throw APIProblem(
                .forbidden, code: "offer_not_in_catalog",
                detail: "end users get only offers of the offers catalog; this offer is not one of them")
        }
    }

    /// Refuses a JWS unless `transactionID` is proven to be the user's (see the type's rules).
    ///
    /// Returns the subscription the proof shows (the proven transaction's `originalTransactionId`
    /// and Apple-signed `environment`) when it is of `subscriptionGroupID` (the offer's group: a
    /// redemption's `originalTransactionId` is its group's), for the issuance to keep, whatever
    /// other appAccountTokens the subscription's other transactions carry: the JWS names
    /// `transactionID`, which ties it to that Apple account (Apple's `transactionId` claim,
    /// `PromotionalOfferV2SignatureCreator`), and one Apple account may hold several of the app's
    /// accounts, so the user may redeem it signed in as another. Matching takes an issuance
    /// carrying the redemption's own token first, so another customer's issuance is never taken
    /// by this subscription (see `OfferRedemption`). Nil when the proof shows no subscription of
    /// the group.
    @discardableResult
    static func checkTransactionOwned(
        transactionID: String?, evidence: PurchaseEvidence?, appAccountToken: UUID, bundleID: String, eligibility: EligibilityService?,
        prefetched: PrefetchedAppleAnswer?, ring: KeyRing, now: Date, subscriptionGroupID: String? = nil
    ) async throws -> ProvenSubscription? {
        guard let transactionID else {
            throw APIProblem.badRequest(
                "transaction_id_required",
                "a JWS for an end user names the user's transaction: send transactionID (for example Transaction.originalID) and the signed transaction as evidence")
        }
        let customer = appAccountToken.lowercasedString
        if let eligibility {
            if let evidence {
                let verified = try await eligibility.verifiedEvidence(evidence, bundleID: bundleID, appAccountToken: appAccountToken, now: now)
                let proving = verified.transactions.filter {
                    ($0.transactionID == transactionID || $0.originalTransactionID == transactionID) && $0.appAccountToken?.lowercased() == customer
                }
                if !proving.isEmpty {
                    let inGroup = proving.first { subscriptionGroupID != nil && $0.subscriptionGroupID == subscriptionGroupID }
                    return inGroup.map { ProvenSubscription(originalTransactionID: $0.originalTransactionID, environment: $0.environment.rawValue) }
                }
            }
            if let history = await appleHistory(
                transactionID: transactionID, bundleID: bundleID, eligibility: eligibility, prefetched: prefetched, ring: ring, now: now),
                !history.appAccountTokens.isEmpty, history.appAccountTokens.allSatisfy({ $0 == customer })
            {
                guard let subscriptionGroupID, let original = history.originalTransactionID(of: transactionID),
                    history.transactions.contains(where: { $0.originalTransactionID == original && $0.subscriptionGroupID == subscriptionGroupID })
                else { return nil }
                return ProvenSubscription(originalTransactionID: original, environment: history.environment.rawValue)
            }
        }
        throw APIProblem(
            .forbidden, code: "transaction_not_owned",
            detail: "transactionID is not shown to be this user's: send the signed transaction (carrying the user's appAccountToken) as evidence")
    }

    /// Apple's history of `transactionID`: the one asked for the decision, else the API's (cached) answer.
    private static func appleHistory(
        transactionID: String, bundleID: String, eligibility: EligibilityService, prefetched: PrefetchedAppleAnswer?, ring: KeyRing, now: Date
    ) async -> VerifiedHistory? {
        if case .history(let history)? = prefetched?.answer?.lookup { return history }
        guard let client = eligibility.appleHistory else { return nil }
        let app = eligibility.configuration.catalog.appSettings(bundleID: bundleID)
        let lookup = await client.history(
            transactionID: transactionID, app: app, credentials: EligibilityService.credentials(bundleID: bundleID, ring: ring), now: now)
        if case .history(let history) = lookup { return history }
        return nil
    }
}

extension Principal {
    /// An end user (user JWT), whom `UserSigningPolicy` applies to.
    var isUser: Bool {
        if case .user = self { return true }
        return false
    }
}

/// Reads `appAccountToken` from a request.
///
/// Rule: absent means none; present, it is a UUID. An empty or whitespace-only string is refused
/// (400 `app_account_token_empty`): it is what a client sends when it meant a token and had none,
/// and signing it would give a signature bound to no one.
enum AppAccountTokenField {
    static func parse(_ text: String?) throws(APIProblem) -> UUID? {
        guard let text else { return nil }
        // A UUID costs one parse, as before; only a refusal looks further.
        let parsed: UUID?
        do {
            parsed = try OfferFieldValidator.parseAppAccountToken(text)
        } catch {
            if text.allSatisfy(\.isWhitespace) { throw Self.empty }
            throw APIProblem.field(error)
        }
        guard let parsed else { throw Self.empty }
        return parsed
    }

    private static var empty: APIProblem {
        APIProblem.badRequest("app_account_token_empty", "appAccountToken is empty; send the customer's UUID or leave the member out")
    }
}
