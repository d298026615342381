import Foundation

/// Evaluates an offer's rules against a customer's verified history and our ledger of issued signatures.
///
/// Pure and deterministic: the same inputs (including `now`) always give the same decision.
///
/// - Offers without `rules` are always eligible (no kind precondition, evidence not consulted).
/// - Otherwise every applicable reason is collected (see `EligibilityReason`), not just the first;
///   `evidence_unverified` is added when any submitted JWS failed verification.
/// - History is the verified transactions of the offer's bundle in the offer's subscription group
///   (`subscriptionGroupIdentifier`, or one of the offer's `productIDs` when that is absent), deduplicated by
///   `transactionId`. Renewal infos count when their `originalTransactionId` belongs to that history or
///   their product is one of the offer's products.
/// - Win-back offers require a churned subscription, as Apple defines it ("Supporting win-back offers
///   in your app": "A churned subscription is one that has an `expirationDate` in the past, and a
///   `willAutoRenew` value of `false`"; `eligibleWinBackOfferIds`, App Store Server API: "Subscriptions
///   in a Billing Grace Period or billing retry state aren't eligible for win-back offers"): expired
///   (`currently_subscribed` otherwise), not in billing retry (`isInBillingRetryPeriod`) nor an
///   unexpired grace period (`gracePeriodExpiresDate`) (`billing_retry`), auto-renew off
///   (`autoRenewStatus` 0; `auto_renew_on` otherwise). Neither of the last two is a waiting period, so
///   `eligibleFrom` never points inside a retry or grace period. A history without renewal info (the
///   app's evidence may leave it out; Apple's API and notifications always carry it) is read as
///   auto-renew off: the expiry is then all that is known (Apple is silent on such a history).
/// - "Active" means a group transaction with `purchaseDate <= now < ` the end of its access (its
///   expiry, or its revocation when earlier), or a renewal info whose `gracePeriodExpiresDate` is after
///   `now`. An upgraded transaction (`isUpgraded`) paid for service only until the next transaction of
///   the group began (Apple: the other transaction says what the customer is entitled to).
/// - A refund (`revocationType` `REFUND_FULL`/`REFUND_PRORATED`) and a revocation from Family Sharing
///   (`FAMILY_REVOKE`) both end access at `revocationDate` (Apple's lapse criterion is the time "since
///   the subscriber last had an active subscription"); only a refund is `refunded` or removes paid
///   time, and a prorated one only its `revocationPercentage` (see `VerifiedTransaction.refundedShare`).
/// - Months are measured by `RuleTime`: calendar months in UTC (Jan 31 + 1 month = Feb 28/29), in
///   Sandbox Apple's accelerated renewal rate (a month of a rule is 5 minutes; an observed Sandbox
///   period counts as the nominal duration Apple's table maps it to, see `RuleTime.sandboxNominalMonths`).
/// - Every comparison with "now" allows `rules.clockSkewSeconds` (default 60) in the customer's
///   favour (see `OfferRules.clockSkewSeconds`).
/// - Redemptions are counted as `RedemptionCounting` says.
public struct EligibilityEvaluator: Sendable {
    private let winBackOfferIDs: Set<String>

    /// How a decision counts the customer's redemptions of an offer.
    public enum RedemptionCounting: Sendable, Hashable {
        /// The history is Apple's (its App Store Server API, or a complete stored history kept by
        /// its notifications): the redemptions Apple recorded, transactions with `offerType` 2 and
        /// the offer's `offerIdentifier` (JWSTransactionDecodedPayload `offerType`,
        /// `offerIdentifier`), and a renewal info naming the offer for the next renewal (a pending
        /// redemption, see `redemptions(in:where:)`). Signatures issued and not redeemed do not
        /// count: a cancelled payment sheet or a Retention Messaging page view uses nothing up.
        case applesRecord
        /// The history is the app's evidence, which may leave a redemption out: the larger of the
        /// verified redemptions and our ledger's attempts. Signatures for the same offer within one
        /// signature lifetime (`signatureLifetime`, 24 h) of an attempt's first are that attempt, so a
        /// cancelled payment sheet can be retried: the attempt still open at `now` does not count
        /// toward `maxRedemptions` nor start this offer's wait. The ledger holds no Retention
        /// Messaging issuance (a page view: it never counts by itself).
        case issuedAttempts
    }

    /// How long a promotional offer signature can be redeemed: 24 hours from its timestamp (Apple's
    /// App Store Server Library, appstoreserverlibrary/promotional_offer.py, `create_signature`:
    /// "The timestamp keeps the offer active for 24 hours").
    public static let signatureLifetime: TimeInterval = 86_400

    /// An evaluator that knows no other offers: `waitScope: "any-win-back"` then covers this offer and
    /// Apple's own win-back offers only.
    public init() {
        self.init(winBackOfferIDs: [])
    }

    /// An evaluator for which the catalog's `win-back` offers count for `waitScope: "any-win-back"`.
    public init(catalog: OfferCatalog) {
        self.init(winBackOfferIDs: catalog.winBackOfferIDs)
    }

    /// An evaluator for which these offer IDs are win-back offers for `waitScope: "any-win-back"`.
    public init(winBackOfferIDs: Set<String>) {
        self.winBackOfferIDs = winBackOfferIDs
    }

    /// `date` plus `months` calendar months (UTC), as in Production.
    public func adding(months: Int, to date: Date) -> Date {
        RuleTime(environment: .production).adding(months: months, to: date)
    }

    /// Calendar months from `start` to `end`, as in Production (see `RuleTime.months(from:to:)`).
    func months(from start: Date, to end: Date) -> Double {
        RuleTime(environment: .production).months(from: start, to: end)
    }

    /// Decides whether `offer` may be signed for the customer described by `evidence` and `ledger` at `now`.
    ///
    /// - Parameters:
    ///   - ledger: every signature we issued to this customer (any offer; filtered here by offer ID).
    ///   - counting: whose record of redemptions counts (`applesRecord` when `evidence` is Apple's history).
    public func evaluate(
        _ offer: OfferDefinition,
        evidence: EligibilityEvidence,
        ledger: [IssuedOfferRecord],
        now: Date,
        counting: RedemptionCounting = .issuedAttempts
    ) -> EligibilityDecision {
        guard let rules = offer.rules else {
            return EligibilityDecision(offerID: offer.offerID, eligible: true, reasons: [])
        }
        var reasons = Set<EligibilityReason>()
        var waitEnds: [Date] = []

        if !evidence.failures.isEmpty { reasons.insert(.evidenceUnverified) }

        let history = CustomerHistory(offer: offer, evidence: evidence)
        let time = RuleTime(environment: history.environment)
        let skew = TimeInterval(rules.clockSkewSeconds)
        // A date at or before `reached` has come; one after `stillBefore` has not gone.
        let reached = now.addingTimeInterval(skew)
        let stillBefore = now.addingTimeInterval(-skew)
        let lapsed = !history.isActive(startedBy: reached, endingAfter: reached)

        // Kind precondition.
        switch offer.kind {
        case .winBack:
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if !lapsed {
                reasons.insert(.currentlySubscribed)
            }
            if history.hasHistory {
                // In billing retry Apple keeps `autoRenewStatus` 1 (the customer meant to renew): one reason.
                if history.isInBillingRetryOrGrace(after: reached) {
                    reasons.insert(.billingRetry)
                } else if lapsed && history.willAutoRenew {
                    reasons.insert(.autoRenewOn)
                }
            }
        case .retention:
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if !history.isActive(startedBy: reached, endingAfter: stillBefore) {
                reasons.insert(.notSubscribed)
            }
        case .any:
            break
        }

        // environment
        if let environment = rules.environment {
            let environments = evidence.transactions.map(\.environment) + evidence.renewalInfos.map(\.environment)
            if environments.isEmpty || environments.contains(where: { $0 != environment }) {
                reasons.insert(.environmentMismatch)
            }
        }

        // minPaidMonths
        if let minPaid = rules.minPaidMonths, minPaid > 0 {
            let periods = rules.paidTime == .latestRun ? history.paidPeriodsOfLatestRun : history.paidPeriods
            let paid = periods.reduce(0) { $0 + time.months(from: $1.start, to: $1.end) }
            if paid < Double(minPaid) { reasons.insert(.paidTooShort) }
        }

        // lapsedMonths
        var lapseLimit: Date?
        if let range = rules.lapsedMonths {
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if !lapsed {
                reasons.insert(.currentlySubscribed)
            } else if let lapsedAt = history.lapsedAt(asOf: reached) {
                if let min = range.min {
                    let end = time.adding(months: min, to: lapsedAt)
                    if reached < end {
                        reasons.insert(.lapsedTooRecently)
                        waitEnds.append(end)
                    }
                }
                if let max = range.max {
                    let limit = time.adding(months: max, to: lapsedAt)
                    lapseLimit = limit
                    if stillBefore > limit { reasons.insert(.lapsedTooLongAgo) }
                }
            }
        }

        // Redemptions of this offer: Apple's record (a pending one in a renewal info included), and
        // on the app's evidence our ledger's attempts.
        let isThisOffer = { (type: AppleOfferType?, identifier: String?) in type == .promotional && identifier == offer.offerID }
        let redemptions = Self.redemptions(in: history, where: isThisOffer)
        let attempts = counting == .applesRecord ? [] : Self.attempts(ledger.filter { $0.offerID == offer.offerID })
        // The attempt still open may be a payment sheet being retried: it does not count yet.
        let closedAttempts = attempts.filter { $0.start.addingTimeInterval(Self.signatureLifetime) <= now }

        // waitBetweenOffersMonths: from the end of the subscription that followed the last
        // redemption, or of the redemption itself (`waitFrom`), or from the last attempt.
        if let wait = rules.waitBetweenOffersMonths, wait > 0 {
            let waitStart = { (redemption: Redemption) in Self.waitStart(after: redemption, in: history, from: rules.waitFrom, reached: reached) }
            var dates = redemptions.map(waitStart) + closedAttempts.map(\.last)
            if rules.waitScope == .anyWinBack {
                dates += Self.redemptions(in: history) { type, identifier in
                    type == .winBack || (type == .promotional && identifier.map(winBackOfferIDs.contains) == true)
                }.map(waitStart)
                if counting == .issuedAttempts {
                    dates += Self.attempts(ledger.filter { $0.offerID != offer.offerID && winBackOfferIDs.contains($0.offerID) }).map(\.last)
                }
            }
            if let last = dates.max() {
                let end = time.adding(months: wait, to: last)
                if reached < end {
                    reasons.insert(.redeemedTooRecently)
                    waitEnds.append(end)
                }
            }
        }

        // maxRedemptions
        if let max = rules.maxRedemptions, Swift.max(redemptions.count, closedAttempts.count) >= max {
            reasons.insert(.maxRedemptions)
        }

        if rules.excludeRefunded && history.group.contains(where: \.isRefunded) {
            reasons.insert(.refunded)
        }
        if rules.excludeFamilyShared && history.latestGroupTransaction?.isFamilyShared == true {
            reasons.insert(.familyShared)
        }
        // Win-back offers exclude billing retry and grace periods always (above); other kinds when asked.
        if rules.excludeBillingRetry && history.isInBillingRetryOrGrace(after: reached) {
            reasons.insert(.billingRetry)
        }
        if let storefronts = rules.storefronts, !storefronts.permits(history.storefront) {
            reasons.insert(.storefrontExcluded)
        }
        if rules.deferToAppleWinBack && history.renewalInfos.contains(where: { !$0.eligibleWinBackOfferIDs.isEmpty }) {
            reasons.insert(.appleWinBackAvailable)
        }

        let ordered = EligibilityReason.allCases.filter(reasons.contains)
        var eligibleFrom: Date?
        if !ordered.isEmpty && ordered.allSatisfy(\.isWaitingPeriod), let end = waitEnds.max() {
            // Waiting does not help if the lapse window closes first.
            if lapseLimit.map({ end <= $0 }) ?? true { eligibleFrom = end }
        }
        return EligibilityDecision(
            offerID: offer.offerID,
            eligible: ordered.isEmpty,
            reasons: ordered,
            eligibleFrom: eligibleFrom,
            evidenceFailures: reasons.contains(.evidenceUnverified) ? evidence.failures : []
        )
    }
}

extension EligibilityEvaluator {
    /// One redemption of an offer: when its first discounted period began and when its last ended.
    struct Redemption {
        var start: Date
        var end: Date
    }

    /// One attempt of our ledger: signatures for one offer issued within `signatureLifetime` of the first.
    struct Attempt {
        var start: Date
        var last: Date
    }

    /// The redemptions of an offer: each transaction that `isOffer` matches begins one, unless it
    /// renews the subscription's previous transaction under the same pay-as-you-go offer while
    /// that offer has billing periods left (`VerifiedTransaction.payAsYouGoContinuations(_:)`, the
    /// walk redemption tracking uses too: periods counted from `offerPeriod`), which extends that
    /// redemption to its own end. A redemption ends with its last discounted period's `expiresDate` (its refund when
    /// earlier; its purchase when it has no expiry).
    static func redemptions(in transactions: [VerifiedTransaction], where isOffer: (VerifiedTransaction) -> Bool) -> [Redemption] {
        func end(_ transaction: VerifiedTransaction) -> Date {
            let expires = transaction.expiresDate ?? transaction.purchaseDate
            guard transaction.isRefunded, let revoked = transaction.revocationDate else { return expires }
            return min(expires, max(revoked, transaction.purchaseDate))
        }
        var redemptions: [Redemption] = []
        let chains = Dictionary(grouping: transactions, by: \.originalTransactionID)
        for chain in chains.values {
            let continuing = VerifiedTransaction.payAsYouGoContinuations(chain)
            var previous: VerifiedTransaction?
            var current: Int?
            for transaction in chain.sorted(by: { ($0.purchaseDate, $0.transactionID) < ($1.purchaseDate, $1.transactionID) }) {
                let continues = previous.map { previous in isOffer(previous) && continuing[transaction.transactionID] != nil } ?? false
                if isOffer(transaction) {
                    if continues, let current {
                        redemptions[current].end = max(redemptions[current].end, end(transaction))
                    } else {
                        redemptions.append(Redemption(start: transaction.purchaseDate, end: end(transaction)))
                        current = redemptions.count - 1
                    }
                } else {
                    current = nil
                }
                previous = transaction
            }
        }
        return redemptions
    }

    /// The redemptions of an offer in a customer's history: those of its transactions (see
    /// `redemptions(in:where:)`), and a pending one for each renewal info of the group whose
    /// `offerType` and `offerIdentifier` name the offer (Apple's JWSRenewalInfoDecodedPayload,
    /// appstoreserverlibrary/models/JWSRenewalInfoDecodedPayload.py: the offer that applies at the
    /// next renewal, e.g. one the customer accepted through Retention Messaging). A pending
    /// redemption starts and, as far as is known, ends at `renewalDate` (the offer's period has not
    /// begun); it is left out when auto-renew is off (the renewal will not happen) and when the
    /// subscription's latest transaction already redeems the offer (the renewal continues that
    /// redemption, or has been recorded), unless that renewal begins a new run of a pay-as-you-go
    /// offer (``renewalBeginsAnotherPayAsYouGoRun(_:latest:chain:)``: the offer accepted again
    /// for the renewal after its last period).
    static func redemptions(in history: CustomerHistory, where isOffer: (AppleOfferType?, String?) -> Bool) -> [Redemption] {
        var redemptions = Self.redemptions(in: history.bundleTransactions) { isOffer($0.offerType, $0.offerIdentifier) }
        for info in history.renewalInfos where isOffer(info.offerType, info.offerIdentifier) && info.autoRenewEnabled != false {
            let chain = history.group.filter { $0.originalTransactionID == info.originalTransactionID }
            let latest = chain.max { ($0.purchaseDate, $0.transactionID) < ($1.purchaseDate, $1.transactionID) }
            if let latest, isOffer(latest.offerType, latest.offerIdentifier), !Self.renewalBeginsAnotherPayAsYouGoRun(info, latest: latest, chain: chain) {
                continue
            }
            guard let renewal = info.renewalDate ?? latest?.expiresDate else { continue }
            redemptions.append(Redemption(start: renewal, end: renewal))
        }
        return redemptions
    }

    /// Whether the renewal that `info` announces, under the pay-as-you-go offer the subscription's
    /// `latest` period already carries, would not continue that offer's run
    /// (`VerifiedTransaction.payAsYouGoContinuations(_:)` over `chain` and the renewal, read as a
    /// `RENEWAL` at `renewalDate` under the renewal info's `offerType`, `offerIdentifier`,
    /// `offerDiscountType` and `offerPeriod`, of `autoRenewProductId`): its index in the run would
    /// be at or past the offer's period count n (`VerifiedTransaction.payAsYouGoBillingPeriods(begunBy:)`),
    /// so the offer was accepted again. Only when both state `PAY_AS_YOU_GO`; otherwise (Apple
    /// silent, or another payment mode) the latest period's redemption stands for it, as before.
    ///
    /// Why a renewal info naming the offer is, within the run, the run going on: StoreKit's
    /// `RenewalInfo.offer` is "A subscription offer that applies to the transaction at the next
    /// renewal period. This value is populated if a customer redeems a subscription offer that
    /// applies to more than one subscription period."
    /// (https://developer.apple.com/documentation/storekit/product/subscriptioninfo/renewalinfo/offer;
    /// the server's `offerType` / `offerIdentifier` fields of JWSRenewalInfoDecodedPayload are read
    /// as the same statement). Apple is silent on what the renewal info says during the offer's
    /// last discounted period (whether it still names the offer when the next renewal is at the
    /// full price): here, naming it then (next index n) counts as the offer accepted again, a
    /// pending new redemption. Outside Production, or without a readable `offerPeriod`, the run
    /// never ends (see `payAsYouGoBillingPeriods(begunBy:)`) and a renewal info naming the
    /// latest period's offer is always the run going on.
    static func renewalBeginsAnotherPayAsYouGoRun(_ info: VerifiedRenewalInfo, latest: VerifiedTransaction, chain: [VerifiedTransaction]) -> Bool {
        guard latest.offerDiscountType == .payAsYouGo, info.offerDiscountType == .payAsYouGo, let renewal = info.renewalDate ?? latest.expiresDate else {
            return false
        }
        var next = latest
        next.transactionID = latest.transactionID + "+renewal"
        next.productID = info.autoRenewProductID ?? latest.productID
        next.purchaseDate = renewal
        next.expiresDate = nil
        next.revocationDate = nil
        next.transactionReason = .renewal
        next.offerType = info.offerType
        next.offerIdentifier = info.offerIdentifier
        next.offerDiscountType = info.offerDiscountType
        next.offerPeriod = info.offerPeriod ?? latest.offerPeriod
        return VerifiedTransaction.payAsYouGoContinuations(chain + [next])[next.transactionID] == nil
    }

    /// From when `waitBetweenOffersMonths` runs after `redemption` (see `OfferRules.waitFrom`): with
    /// `subscriptionEnd`, the end of the run of the subscription that contains the redemption's
    /// start, once that run has ended by `reached`; otherwise (`offerEnd`, a run still active, a
    /// pending redemption, a redemption outside the offer's group) the redemption's end.
    static func waitStart(after redemption: Redemption, in history: CustomerHistory, from: OfferRules.WaitFrom, reached: Date) -> Date {
        guard from == .subscriptionEnd,
            let run = history.runs.first(where: { $0.start <= redemption.start && redemption.start < $0.end }),
            run.end <= reached
        else { return redemption.end }
        return max(run.end, redemption.end)
    }

    /// When each redemption of an offer began (see `redemptions(in:where:)`).
    static func redemptionStarts(in transactions: [VerifiedTransaction], where isOffer: (VerifiedTransaction) -> Bool) -> [Date] {
        redemptions(in: transactions, where: isOffer).map(\.start)
    }

    /// Our ledger's issuances grouped into attempts, oldest first.
    static func attempts(_ issuances: [IssuedOfferRecord]) -> [Attempt] {
        var attempts: [Attempt] = []
        for issuance in issuances.sorted(by: { $0.issuedAt < $1.issuedAt }) {
            if let last = attempts.last, issuance.issuedAt < last.start.addingTimeInterval(signatureLifetime) {
                attempts[attempts.count - 1].last = issuance.issuedAt
            } else {
                attempts.append(Attempt(start: issuance.issuedAt, last: issuance.issuedAt))
            }
        }
        return attempts
    }
}
