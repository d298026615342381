import AppStoreServerAPI
import Foundation
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage

/// One offer's decision and whose word on the customer's history decided it.
struct EligibilityOutcome: Sendable {
    var decision: EligibilityDecision
    /// `nil` for an offer without rules (no history is consulted).
    var source: DecidingHistorySource?
    /// Why Apple could not answer, when it was asked and could not.
    var appleUnavailable: HistoryUnavailable?
    /// Where Apple's word came from when it decided: `api` (the App Store Server API) or `store`
    /// (the stored history that notifications keep current).
    var appleVia: String?
    /// The request's subscription (its `originalTransactionId` and environment), kept on the
    /// issuance so a redemption matches it (see `OfferRedemption`): as Apple's history proved it,
    /// when Apple's history decided and covers the request's `transactionID`; as the app's
    /// verified evidence shows it, when the evidence decided (see
    /// ``HistorySourceResolver/subscription(in:offer:transactionID:appAccountToken:)``).
    var subscription: ProvenSubscription?
}

/// Apple's answer about a customer and where it came from: `api` (the App Store Server API) or
/// `store` (the stored history that notifications keep current).
struct AppleAnswer: Sendable {
    var lookup: HistoryLookup
    var via: String
}

/// Apple's answer asked before a decision (nil: no offer needed Apple).
struct PrefetchedAppleAnswer: Sendable {
    var answer: AppleAnswer?
}

/// Applies each offer's `historySource` (see `HistorySource`).
///
/// Rules:
/// - The request must carry what every offer with rules needs: `evidence` for `client`, a
///   `transactionID` for `apple`, one of them for `apple-then-client` (400 `evidence_required` /
///   `transaction_id_required` otherwise).
/// - Apple is asked at most once per request, and only when an offer needs it; when every offer
///   asked about is of one subscription group, for that group's auto-renewable transactions only
///   (`HistoryFilter.subscriptionGroup`: the evaluator reads the offer's group only). When the app's
///   notifications come here (`apps.<bundle>.notificationHistory`) and the store holds the
///   subscription's complete history, with the subscription group of every offer asked about,
///   that history is Apple's word and the API is not asked.
/// - `apple`: Apple's verified history decides; when Apple cannot answer, the offer is not eligible
///   (`history_unavailable`). `apple-then-client`: the app's evidence decides when Apple could not
///   answer (never when Apple answered that the transaction ID is unknown or invalid: the app chose
///   that ID), or when the request has no `transactionID`.
/// - Apple's history that carries an `appAccountToken` other than the request's belongs to another
///   account: not eligible (`app_account_token_mismatch`). For an end user (user JWT), so does a
///   history that carries none: a stranger's `originalTransactionId` decides nothing for them.
/// - Apple's history counts the redemptions Apple recorded; the app's evidence counts our ledger's
///   attempts too (`EligibilityEvaluator.RedemptionCounting`).
struct HistorySourceResolver: Sendable {
    let service: EligibilityService

    static func checkHandles(_ offers: [OfferDefinition], evidence: PurchaseEvidence?, transactionID: String?) throws(APIProblem) {
        for offer in offers where offer.rules != nil {
            switch offer.historySource {
            case .client where evidence == nil:
                throw APIProblem.badRequest(
                    "evidence_required",
                    "offer '\(offer.offerID)' has eligibility rules: send evidence.signedTransactions and evidence.signedRenewalInfos from StoreKit")
            case .apple where transactionID == nil:
                throw APIProblem.badRequest(
                    "transaction_id_required",
                    "offer '\(offer.offerID)' is decided on Apple's history: send transactionID (any of the customer's, e.g. Transaction.originalID)")
            case .appleThenClient where transactionID == nil && evidence == nil:
                throw APIProblem.badRequest(
                    "transaction_id_required",
                    "offer '\(offer.offerID)' is decided on Apple's history, or the app's evidence when Apple cannot answer: send transactionID (and evidence)")
            default: continue
            }
        }
    }

    /// Apple's word on the customer of `transactionID`, when an offer with rules asks Apple (nil
    /// otherwise): the stored history when it decides (see the type's rules), else the App Store
    /// Server API's answer. Asked before any customer lock is taken (see `SigningController`), so
    /// no lock and no pooled store connection is held while Apple answers.
    func askApple(
        _ offers: [OfferDefinition], bundleID: String, transactionID: String?, credentials: AppStoreServerAPICredentials?, now: Date
    ) async throws -> AppleAnswer? {
        let needsApple = transactionID != nil && offers.contains { $0.rules != nil && $0.historySource.asksApple }
        guard needsApple, let transactionID else { return nil }
        let app = service.configuration.catalog.appSettings(bundleID: bundleID)
        // The stored history covers the one subscription `transactionID` belongs to (Apple's API
        // answers with all of the customer's): it decides only when it holds the subscription
        // group of every offer asked about, else a transaction ID of another group would show
        // an empty history for the offer's group.
        let groups = Set(offers.filter { $0.rules != nil && $0.historySource.asksApple }.map(\.subscriptionGroupID))
        if app.notificationHistory, let stored = try await service.storedHistory(transactionID: transactionID, app: app, now: now),
            groups.allSatisfy({ group in stored.transactions.contains { $0.subscriptionGroupID == group } })
        {
            return AppleAnswer(lookup: .history(stored), via: "store")
        }
        guard let client = service.appleHistory else {
            return AppleAnswer(lookup: .unavailable(HistoryUnavailable(.noCredentials, "this service has no App Store Server API client")), via: "api")
        }
        // One subscription group decides: Apple is asked for its auto-renewable transactions only
        // (fewer pages for a customer with many other purchases; see `HistoryFilter`).
        let filter = groups.count == 1 ? groups.first.map(HistoryFilter.subscriptionGroup) : nil
        return AppleAnswer(lookup: await client.history(transactionID: transactionID, app: app, credentials: credentials, now: now, filter: filter), via: "api")
    }

    /// Decides each offer. `prefetched` is Apple's answer asked before (see `askApple`); without
    /// it, Apple is asked here. `strictAccountToken` (end-user principals): a history of Apple's
    /// that carries no appAccountToken at all counts as another account's, since nothing shows it
    /// is the user's (`app_account_token_mismatch`, and nothing of it is disclosed).
    func decide(
        _ offers: [OfferDefinition], bundleID: String, appAccountToken: UUID?, evidence: PurchaseEvidence?, transactionID: String?,
        credentials: AppStoreServerAPICredentials?, ledger: [IssuedOfferRecord], now: Date, prefetched: PrefetchedAppleAnswer? = nil,
        strictAccountToken: Bool = false
    ) async throws -> [EligibilityOutcome] {
        let answer: AppleAnswer?
        if let prefetched {
            answer = prefetched.answer
        } else {
            answer = try await askApple(offers, bundleID: bundleID, transactionID: transactionID, credentials: credentials, now: now)
        }
        let apple = answer?.lookup
        let appleVia = answer?.via ?? "api"
        var clientEvidence: EligibilityEvidence?
        func appEvidence() async throws -> EligibilityEvidence {
            if let clientEvidence { return clientEvidence }
            let verified = try await service.verifiedEvidence(evidence, bundleID: bundleID, appAccountToken: appAccountToken, now: now)
            clientEvidence = verified
            return verified
        }

        var outcomes: [EligibilityOutcome] = []
        for offer in offers {
            guard offer.rules != nil else {
                outcomes.append(EligibilityOutcome(decision: service.evaluator.evaluate(offer, evidence: .empty, ledger: ledger, now: now), source: nil))
                continue
            }
            switch (offer.historySource, apple) {
            case (.client, _), (.appleThenClient, nil):
                let verified = try await appEvidence()
                let decision = service.evaluator.evaluate(offer, evidence: verified, ledger: ledger, now: now)
                outcomes.append(EligibilityOutcome(
                    decision: decision, source: .client,
                    subscription: Self.subscription(in: verified, offer: offer, transactionID: transactionID, appAccountToken: appAccountToken)))
            case (_, .history(let history)?):
                let original = transactionID.flatMap(history.originalTransactionID(of:))
                outcomes.append(EligibilityOutcome(
                    decision: decideOnApple(
                        offer, history: history, appAccountToken: appAccountToken, strictAccountToken: strictAccountToken, ledger: ledger, now: now),
                    source: .apple, appleVia: appleVia, subscription: original.map { ProvenSubscription(originalTransactionID: $0, environment: history.environment.rawValue) }))
            case (.appleThenClient, .unavailable(let unavailable)?) where unavailable.allowsFallback && evidence != nil:
                let verified = try await appEvidence()
                let decision = service.evaluator.evaluate(offer, evidence: verified, ledger: ledger, now: now)
                outcomes.append(EligibilityOutcome(
                    decision: decision, source: .client, appleUnavailable: unavailable,
                    subscription: Self.subscription(in: verified, offer: offer, transactionID: transactionID, appAccountToken: appAccountToken)))
            case (_, .unavailable(let unavailable)?):
                let decision = EligibilityDecision(offerID: offer.offerID, eligible: false, reasons: [.historyUnavailable])
                outcomes.append(EligibilityOutcome(decision: decision, source: DecidingHistorySource.undecided, appleUnavailable: unavailable))
            case (.apple, nil):
                // checkHandles refuses this request before it gets here.
                let decision = EligibilityDecision(offerID: offer.offerID, eligible: false, reasons: [.historyUnavailable])
                outcomes.append(EligibilityOutcome(decision: decision, source: DecidingHistorySource.undecided))
            }
        }
        return outcomes
    }

    /// The subscription the app's verified evidence shows for `offer` (its `originalTransactionId`
    /// and `environment`, both from Apple-signed transactions, `JWSTransactionDecodedPayload`:
    /// https://developer.apple.com/documentation/appstoreserverapi/jwstransactiondecodedpayload),
    /// or nil when it shows none or is ambiguous.
    ///
    /// Rule: only verified transactions of the offer's subscription group count (a redemption's
    /// `originalTransactionId` is its group's), a subscription being its `originalTransactionId`
    /// in one environment. When the request carries an appAccountToken, a subscription counts only
    /// when at least one of its transactions in the group carries that token and none carries
    /// another: one whose transactions carry no token could be anyone's, and an issuance that
    /// recorded it could be used up by another account's redemption of it. The subscription the
    /// request's `transactionID` names (as a `transactionId` or `originalTransactionId` in the
    /// group) decides, and none when it does not count; without such a name, the counted
    /// subscriptions must be one. Apple is silent on several subscriptions in one group for one
    /// customer; this service then records none rather than guess.
    static func subscription(
        in evidence: EligibilityEvidence, offer: OfferDefinition, transactionID: String?, appAccountToken: UUID?
    ) -> ProvenSubscription? {
        let inGroup = evidence.transactions.filter { $0.subscriptionGroupID == offer.subscriptionGroupID }
        // Per subscription: whether a transaction carries the request's token, and whether one carries another.
        var tokens: [ProvenSubscription: (customers: Bool, others: Bool)] = [:]
        let customer = appAccountToken?.lowercasedString
        for transaction in inGroup {
            let key = ProvenSubscription(originalTransactionID: transaction.originalTransactionID, environment: transaction.environment.rawValue)
            var seen = tokens[key] ?? (false, false)
            if let customer, let token = transaction.appAccountToken, !token.isEmpty {
                if token.lowercased() == customer { seen.customers = true } else { seen.others = true }
            }
            tokens[key] = seen
        }
        let counts = { (subscription: ProvenSubscription) -> Bool in
            guard customer != nil else { return true }
            guard let seen = tokens[subscription] else { return false }
            return seen.customers && !seen.others
        }
        if let transactionID,
            let named = inGroup.first(where: { $0.transactionID == transactionID || $0.originalTransactionID == transactionID })
        {
            let subscription = ProvenSubscription(originalTransactionID: named.originalTransactionID, environment: named.environment.rawValue)
            return counts(subscription) ? subscription : nil
        }
        let counted = tokens.keys.filter(counts)
        guard counted.count == 1, let only = counted.first else { return nil }
        return only
    }

    private func decideOnApple(
        _ offer: OfferDefinition, history: VerifiedHistory, appAccountToken: UUID?, strictAccountToken: Bool, ledger: [IssuedOfferRecord], now: Date
    ) -> EligibilityDecision {
        if let appAccountToken {
            let customer = appAccountToken.lowercasedString
            if history.appAccountTokens.contains(where: { $0 != customer }) || (strictAccountToken && history.appAccountTokens.isEmpty) {
                return EligibilityDecision(offerID: offer.offerID, eligible: false, reasons: [.appAccountTokenMismatch])
            }
        }
        return service.evaluator.evaluate(offer, evidence: history.evidence, ledger: ledger, now: now, counting: .applesRecord)
    }
}
