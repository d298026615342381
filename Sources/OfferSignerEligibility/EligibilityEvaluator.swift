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
/// - "Active" means a non-revoked group transaction with `purchaseDate <= now < expiresDate`, or a renewal
///   info whose `gracePeriodExpiresDate` is after `now`. An upgraded transaction (`isUpgraded`) paid for
///   service only until the next transaction of the group began (Apple: the other transaction says
///   what the customer is entitled to); for activity, the lapse and paid months it ends there.
/// - Months are calendar months in UTC on the Gregorian calendar: "N months after D" is D plus N months,
///   clamped to the end of shorter months (Jan 31 + 1 month = Feb 28/29).
public struct EligibilityEvaluator: Sendable {
    private let calendar: Calendar
    private let winBackOfferIDs: Set<String>

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
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        self.calendar = calendar
        self.winBackOfferIDs = winBackOfferIDs
    }

    /// `date` plus `months` calendar months (UTC).
    public func adding(months: Int, to date: Date) -> Date {
        calendar.date(byAdding: .month, value: months, to: date) ?? date
    }

    /// Calendar months from `start` to `end`: whole months, plus the remainder as a fraction of the
    /// month that follows them (so Jan 15 → Mar 1 is 1 + 15/28 months in 2025).
    func months(from start: Date, to end: Date) -> Double {
        guard end > start else { return 0 }
        var whole = calendar.dateComponents([.month], from: start, to: end).month ?? 0
        while whole > 0 && adding(months: whole, to: start) > end { whole -= 1 }
        while adding(months: whole + 1, to: start) <= end { whole += 1 }
        let monthStart = adding(months: whole, to: start)
        let monthEnd = adding(months: whole + 1, to: start)
        let length = monthEnd.timeIntervalSince(monthStart)
        guard length > 0 else { return Double(whole) }
        return Double(whole) + end.timeIntervalSince(monthStart) / length
    }

    /// Decides whether `offer` may be signed for the customer described by `evidence` and `ledger` at `now`.
    ///
    /// - Parameters:
    ///   - ledger: every signature we issued to this customer (any offer; filtered here by offer ID).
    public func evaluate(
        _ offer: OfferDefinition,
        evidence: EligibilityEvidence,
        ledger: [IssuedOfferRecord],
        now: Date
    ) -> EligibilityDecision {
        guard let rules = offer.rules else {
            return EligibilityDecision(offerID: offer.offerID, eligible: true, reasons: [])
        }
        var reasons = Set<EligibilityReason>()
        var waitEnds: [Date] = []

        if !evidence.failures.isEmpty { reasons.insert(.evidenceUnverified) }

        let history = History(offer: offer, evidence: evidence, now: now)

        // Kind precondition.
        switch offer.kind {
        case .winBack:
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if history.isActive {
                reasons.insert(.currentlySubscribed)
            }
        case .retention:
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if !history.isActive {
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
            let paid = history.paidPeriods.reduce(0) { $0 + months(from: $1.start, to: $1.end) }
            if paid < Double(minPaid) { reasons.insert(.paidTooShort) }
        }

        // lapsedMonths
        var lapseLimit: Date?
        if let range = rules.lapsedMonths {
            if !history.hasHistory {
                reasons.insert(.noHistory)
            } else if history.isActive {
                reasons.insert(.currentlySubscribed)
            } else if let lapsedAt = history.lapsedAt {
                if let min = range.min {
                    let end = adding(months: min, to: lapsedAt)
                    if now < end {
                        reasons.insert(.lapsedTooRecently)
                        waitEnds.append(end)
                    }
                }
                if let max = range.max {
                    let limit = adding(months: max, to: lapsedAt)
                    lapseLimit = limit
                    if now > limit { reasons.insert(.lapsedTooLongAgo) }
                }
            }
        }

        // Redemptions of this offer: verified promotional transactions plus our own ledger.
        let redemptionDates = Self.redemptionStarts(in: history.bundleTransactions) {
            $0.offerType == .promotional && $0.offerIdentifier == offer.offerID
        }
        let issuedDates = ledger.filter { $0.offerID == offer.offerID }.map(\.issuedAt)

        // waitBetweenOffersMonths
        if let wait = rules.waitBetweenOffersMonths, wait > 0 {
            var dates = redemptionDates + issuedDates
            if rules.waitScope == .anyWinBack {
                dates += Self.redemptionStarts(in: history.bundleTransactions) {
                    $0.offerType == .winBack || ($0.offerType == .promotional && $0.offerIdentifier.map(winBackOfferIDs.contains) == true)
                }
                dates += ledger.filter { winBackOfferIDs.contains($0.offerID) }.map(\.issuedAt)
            }
            if let last = dates.max() {
                let end = adding(months: wait, to: last)
                if now < end {
                    reasons.insert(.redeemedTooRecently)
                    waitEnds.append(end)
                }
            }
        }

        // maxRedemptions
        if let max = rules.maxRedemptions, Swift.max(redemptionDates.count, issuedDates.count) >= max {
            reasons.insert(.maxRedemptions)
        }

        if rules.excludeRefunded && history.group.contains(where: \.isRevoked) {
            reasons.insert(.refunded)
        }
        if rules.excludeFamilyShared && history.latestGroupTransaction?.isFamilyShared == true {
            reasons.insert(.familyShared)
        }
        if rules.excludeBillingRetry
            && history.renewalInfos.contains(where: {
                $0.isInBillingRetryPeriod == true || ($0.gracePeriodExpiresDate.map { $0 > now } ?? false)
            })
        {
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
    /// When each redemption of an offer began: the purchase date of each transaction that
    /// `isOffer` matches unless it renews the subscription's previous transaction under the same
    /// pay-as-you-go offer (`VerifiedTransaction.continuesPayAsYouGoOffer(of:)`).
    static func redemptionStarts(in transactions: [VerifiedTransaction], where isOffer: (VerifiedTransaction) -> Bool) -> [Date] {
        var starts: [Date] = []
        let chains = Dictionary(grouping: transactions, by: \.originalTransactionID)
        for chain in chains.values {
            var previous: VerifiedTransaction?
            for transaction in chain.sorted(by: { ($0.purchaseDate, $0.transactionID) < ($1.purchaseDate, $1.transactionID) }) {
                let continues = previous.map { previous in isOffer(previous) && transaction.continuesPayAsYouGoOffer(of: previous) } ?? false
                if isOffer(transaction) && !continues { starts.append(transaction.purchaseDate) }
                previous = transaction
            }
        }
        return starts
    }
}

/// The facts about one customer's history that the rules look at.
private struct History {
    /// Verified transactions of the offer's bundle, deduplicated.
    let bundleTransactions: [VerifiedTransaction]
    /// Those in the offer's subscription group.
    let group: [VerifiedTransaction]
    /// Renewal infos of that group.
    let renewalInfos: [VerifiedRenewalInfo]
    let isActive: Bool
    /// When access last ended (only meaningful when not active).
    let lapsedAt: Date?
    /// Paid periods, merged so that overlaps (upgrades, duplicates) count once.
    let paidPeriods: [(start: Date, end: Date)]
    let latestGroupTransaction: VerifiedTransaction?
    /// Storefront of the latest group transaction (or of the latest transaction at all).
    let storefront: String?

    var hasHistory: Bool { !group.isEmpty }

    init(offer: OfferDefinition, evidence: EligibilityEvidence, now: Date) {
        var seen = Set<String>()
        var unique: [VerifiedTransaction] = []
        for transaction in evidence.transactions where transaction.bundleID == offer.bundleID {
            if seen.insert(transaction.transactionID).inserted { unique.append(transaction) }
        }
        bundleTransactions = unique
        let products = Set(offer.productIDs)
        group = unique.filter {
            if let groupID = $0.subscriptionGroupID { return groupID == offer.subscriptionGroupID }
            return products.contains($0.productID)
        }
        let originals = Set(group.map(\.originalTransactionID))
        renewalInfos = evidence.renewalInfos.filter { info in
            if let original = info.originalTransactionID, originals.contains(original) { return true }
            if let product = info.productID, products.contains(product) { return true }
            if let product = info.autoRenewProductID, products.contains(product) { return true }
            return false
        }

        // The end of the service a transaction paid for: its expiry, except for an upgraded one
        // (Apple: look for another transaction for what the customer is entitled to), whose
        // service ended when the next transaction of the group began (at its expiry when none is
        // known: the history may lack the upgrade's transaction).
        let groupStarts = group.map(\.purchaseDate).sorted()
        func serviceEnd(_ transaction: VerifiedTransaction) -> Date? {
            guard let expires = transaction.expiresDate else { return nil }
            guard transaction.isUpgraded == true else { return expires }
            guard let next = groupStarts.first(where: { $0 > transaction.purchaseDate }) else { return expires }
            return min(next, expires)
        }

        let inGrace = renewalInfos.contains { ($0.gracePeriodExpiresDate.map { $0 > now }) ?? false }
        isActive =
            inGrace
            || group.contains { transaction in
                guard !transaction.isRevoked, let expires = serviceEnd(transaction) else { return false }
                return transaction.purchaseDate <= now && now < expires
            }

        // Access ended at expiry, or at revocation when earlier; a past grace period extends it.
        var ends: [Date] = group.compactMap { transaction in
            switch (serviceEnd(transaction), transaction.revocationDate) {
            case let (expires?, revoked?): return min(expires, revoked)
            case let (expires?, nil): return expires
            case let (nil, revoked?): return revoked
            case (nil, nil): return nil
            }
        }
        ends += renewalInfos.compactMap(\.gracePeriodExpiresDate).filter { $0 <= now }
        lapsedAt = ends.filter { $0 <= now }.max()

        // Paid periods, merged so that overlaps (upgrades, duplicates) count once.
        let periods = group
            .filter { !$0.isFreeTrial && !$0.isRevoked && !$0.isFamilyShared }
            .compactMap { transaction -> (start: Date, end: Date)? in
                guard let expires = serviceEnd(transaction), expires > transaction.purchaseDate else { return nil }
                return (transaction.purchaseDate, expires)
            }
            .sorted { $0.start < $1.start }
        var merged: [(start: Date, end: Date)] = []
        for period in periods {
            if let last = merged.last, period.start <= last.end {
                merged[merged.count - 1].end = max(last.end, period.end)
            } else {
                merged.append(period)
            }
        }
        paidPeriods = merged

        func isLater(_ a: VerifiedTransaction, _ b: VerifiedTransaction) -> Bool {
            a.purchaseDate != b.purchaseDate ? a.purchaseDate > b.purchaseDate : a.transactionID > b.transactionID
        }
        latestGroupTransaction = group.max { isLater($1, $0) }
        let latestAny = unique.max { isLater($1, $0) }
        storefront = latestGroupTransaction?.storefront ?? latestAny?.storefront
    }
}
