import Foundation

/// The facts about one customer's history in an offer's subscription group that the rules look at
/// (see `EligibilityEvaluator` for the rules they serve).
struct CustomerHistory {
    /// A period of time.
    typealias Period = (start: Date, end: Date)

    /// Verified transactions of the offer's bundle, deduplicated.
    let bundleTransactions: [VerifiedTransaction]
    /// Those in the offer's subscription group.
    let group: [VerifiedTransaction]
    /// Renewal infos of that group.
    let renewalInfos: [VerifiedRenewalInfo]
    /// Paid periods, merged so that overlaps (upgrades, duplicates) count once.
    let paidPeriods: [Period]
    /// The paid periods within the latest continuous run of the subscription.
    let paidPeriodsOfLatestRun: [Period]
    /// The continuous runs of the subscription: its periods, free ones included, merged where they
    /// follow each other within a day; oldest first.
    let runs: [Period]
    let latestGroupTransaction: VerifiedTransaction?
    /// Storefront of the latest group transaction (or of the latest transaction at all).
    let storefront: String?
    /// The environment of the history: the latest group transaction's, else a renewal info's.
    let environment: AppleEnvironment?
    /// When each group transaction's access ended or ends (nil: no expiry, no revocation).
    private let accessEnds: [(transaction: VerifiedTransaction, end: Date?)]

    var hasHistory: Bool { !group.isEmpty }

    init(offer: OfferDefinition, evidence: EligibilityEvidence) {
        var seen = Set<String>()
        var unique: [VerifiedTransaction] = []
        for transaction in evidence.transactions where transaction.bundleID == offer.bundleID {
            if seen.insert(transaction.transactionID).inserted { unique.append(transaction) }
        }
        bundleTransactions = unique
        let products = Set(offer.productIDs)
        let group = unique.filter {
            if let groupID = $0.subscriptionGroupID { return groupID == offer.subscriptionGroupID }
            return products.contains($0.productID)
        }
        self.group = group
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
        // Access ends at the service's end, or at a revocation (refund or Family Sharing) when earlier.
        accessEnds = group.map { transaction in
            switch (serviceEnd(transaction), transaction.revocationDate) {
            case let (expires?, revoked?): return (transaction, min(expires, revoked))
            case let (expires?, nil): return (transaction, expires)
            case let (nil, revoked?): return (transaction, revoked)
            case (nil, nil): return (transaction, nil)
            }
        }

        // Paid periods: not free, not family-shared, less the refunded share (at the period's end).
        // A Sandbox period lasts its nominal duration at Sandbox months (`RuleTime.sandboxNominalMonths`).
        let periods = group
            .filter { !$0.isFreePeriod && !$0.isFamilyShared }
            .compactMap { transaction -> Period? in
                guard let expires = serviceEnd(transaction), expires > transaction.purchaseDate else { return nil }
                var length = expires.timeIntervalSince(transaction.purchaseDate)
                if transaction.environment == .sandbox {
                    let period = transaction.expiresDate.map { $0.timeIntervalSince(transaction.purchaseDate) } ?? length
                    // An upgraded period that ended early keeps its share of the nominal period.
                    length = RuleTime.sandboxNominalMonths(observed: period) * RuleTime.sandboxMonth * (period > 0 ? length / period : 1)
                }
                let kept = length * (1 - transaction.refundedShare)
                guard kept > 0 else { return nil }
                return (transaction.purchaseDate, transaction.purchaseDate.addingTimeInterval(kept))
            }
        paidPeriods = Self.merged(periods, joiningGapsUpTo: 0)

        // The latest run: the subscription's periods, free ones included, that follow each other
        // within a day (a renewal, a free month between paid ones); its paid time only counts.
        let service = group.filter { !$0.isFamilyShared }.compactMap { transaction -> Period? in
            guard let end = serviceEnd(transaction), end > transaction.purchaseDate else { return nil }
            return (transaction.purchaseDate, end)
        }
        runs = Self.merged(service, joiningGapsUpTo: 86_400)
        if let run = runs.last {
            paidPeriodsOfLatestRun = paidPeriods.compactMap { period in
                let start = max(period.start, run.start)
                let end = min(period.end, run.end)
                return end > start ? (start, end) : nil
            }
        } else {
            paidPeriodsOfLatestRun = []
        }

        func isLater(_ a: VerifiedTransaction, _ b: VerifiedTransaction) -> Bool {
            a.purchaseDate != b.purchaseDate ? a.purchaseDate > b.purchaseDate : a.transactionID > b.transactionID
        }
        latestGroupTransaction = group.max { isLater($1, $0) }
        let latestAny = unique.max { isLater($1, $0) }
        storefront = latestGroupTransaction?.storefront ?? latestAny?.storefront
        environment = latestGroupTransaction?.environment ?? renewalInfos.first?.environment
    }

    /// Whether a group transaction that began by `startedBy` gives access after `endingAfter`, or a
    /// grace period runs past `endingAfter` (access continues during it).
    func isActive(startedBy: Date, endingAfter: Date) -> Bool {
        if renewalInfos.contains(where: { ($0.gracePeriodExpiresDate.map { $0 > endingAfter }) ?? false }) { return true }
        return accessEnds.contains { transaction, end in
            guard let end else { return false }
            return transaction.purchaseDate <= startedBy && end > endingAfter
        }
    }

    /// Whether Apple reports the subscription in billing retry (`isInBillingRetryPeriod`) or in a
    /// grace period that runs past `after` (`gracePeriodExpiresDate`; JWSRenewalInfoDecodedPayload).
    func isInBillingRetryOrGrace(after: Date) -> Bool {
        renewalInfos.contains { $0.isInBillingRetryPeriod == true || ($0.gracePeriodExpiresDate.map { $0 > after } ?? false) }
    }

    /// Whether Apple reports that the subscription will renew (`autoRenewStatus` 1).
    var willAutoRenew: Bool {
        renewalInfos.contains { $0.autoRenewEnabled == true }
    }

    /// When access last ended by `asOf`: the latest end of a transaction's access, or of a past grace period.
    func lapsedAt(asOf: Date) -> Date? {
        var ends = accessEnds.compactMap(\.end)
        ends += renewalInfos.compactMap(\.gracePeriodExpiresDate)
        return ends.filter { $0 <= asOf }.max()
    }

    /// `periods` sorted and merged where they overlap or lie at most `gap` seconds apart.
    private static func merged(_ periods: [Period], joiningGapsUpTo gap: TimeInterval) -> [Period] {
        var merged: [Period] = []
        for period in periods.sorted(by: { $0.start < $1.start }) {
            if let last = merged.last, period.start <= last.end.addingTimeInterval(gap) {
                merged[merged.count - 1].end = max(last.end, period.end)
            } else {
                merged.append(period)
            }
        }
        return merged
    }
}
