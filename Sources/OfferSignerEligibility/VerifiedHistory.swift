import Foundation

/// One customer's history in one app as Apple itself stated it: transactions and renewal infos
/// that came from Apple (App Store Server API answers today; App Store Server Notifications can
/// feed the same type later) and whose signatures were verified.
///
/// Rules: transactions are keyed by `transactionID` and renewal infos by `originalTransactionID`,
/// so recording a later statement of the same item replaces it (the one with the later
/// `signedDate` wins) instead of counting it twice; only items of this history's bundle and
/// environment are kept (anything else is refused by `record`).
public struct VerifiedHistory: Sendable, Hashable {
    /// The app.
    public let bundleID: String
    /// The App Store environment every item comes from.
    public let environment: AppleEnvironment
    /// When Apple last stated (part of) this history.
    public private(set) var asOf: Date
    /// The history is what a filtered Get Transaction History answered (`productType`,
    /// `subscriptionGroupIdentifier`): not all of the customer's transactions, so it must not be
    /// taken (stored, cached) as their whole history; only the subscriptions of
    /// ``wholeSubscriptionGroups`` are whole in it (``wholeSubscriptionIDs``).
    public var isFiltered: Bool = false
    /// For a filtered history, the subscription groups whose subscriptions it nevertheless holds
    /// whole: those the filter named with `productType` `AUTO_RENEWABLE` (or no product type), so
    /// that every transaction of their subscriptions matched it (see `HistoryFilter`). Empty for
    /// an unfiltered history (it is whole throughout) and for filters that hold no group whole.
    public var wholeSubscriptionGroups: Set<String> = []
    private var transactionsByID: [String: VerifiedTransaction] = [:]
    private var renewalInfosByOriginalID: [String: VerifiedRenewalInfo] = [:]
    private var signedForms: [String: String] = [:]
    // Kept in order as items are recorded: a history is recorded once and then read on every
    // decision (the stored history's cache), so its readers must not sort it each time.
    private var orderedTransactions: [VerifiedTransaction] = []
    private var orderedRenewalInfos: [VerifiedRenewalInfo] = []
    private var accountTokens: Set<String> = []

    public init(bundleID: String, environment: AppleEnvironment, asOf: Date) {
        self.bundleID = bundleID
        self.environment = environment
        self.asOf = asOf
    }

    /// Adds or replaces a transaction. Returns `false` (and keeps nothing) for another bundle's or
    /// environment's transaction.
    @discardableResult
    public mutating func record(_ transaction: VerifiedTransaction, statedAt: Date? = nil, jws: String? = nil) -> Bool {
        guard transaction.bundleID == bundleID, transaction.environment == environment else { return false }
        if let existing = transactionsByID[transaction.transactionID], Self.isNewer(existing.signedDate, than: transaction.signedDate) {
            return true
        }
        let replaced = transactionsByID.updateValue(transaction, forKey: transaction.transactionID) != nil
        if replaced { orderedTransactions.removeAll { $0.transactionID == transaction.transactionID } }
        orderedTransactions.insert(transaction, at: orderedTransactions.partitioningIndex { Self.precedes(transaction, $0) })
        if replaced {
            accountTokens = Set(orderedTransactions.compactMap(Self.accountToken))
        } else if let token = Self.accountToken(transaction) {
            accountTokens.insert(token)
        }
        signedForms["t:" + transaction.transactionID] = jws
        if let statedAt, statedAt > asOf { asOf = statedAt }
        return true
    }

    /// Adds or replaces a renewal info (by `originalTransactionID`). Returns `false` for another
    /// environment's renewal info or one without `originalTransactionID`.
    @discardableResult
    public mutating func record(_ renewalInfo: VerifiedRenewalInfo, statedAt: Date? = nil, jws: String? = nil) -> Bool {
        guard renewalInfo.environment == environment, let key = renewalInfo.originalTransactionID else { return false }
        if let existing = renewalInfosByOriginalID[key], Self.isNewer(existing.signedDate, than: renewalInfo.signedDate) {
            return true
        }
        if renewalInfosByOriginalID.updateValue(renewalInfo, forKey: key) != nil {
            orderedRenewalInfos.removeAll { $0.originalTransactionID == key }
        }
        orderedRenewalInfos.insert(renewalInfo, at: orderedRenewalInfos.partitioningIndex { key < ($0.originalTransactionID ?? "") })
        signedForms["r:" + key] = jws
        if let statedAt, statedAt > asOf { asOf = statedAt }
        return true
    }

    /// Transactions, oldest purchase first (ties by transaction ID).
    public var transactions: [VerifiedTransaction] { orderedTransactions }

    /// Renewal infos, by original transaction ID.
    public var renewalInfos: [VerifiedRenewalInfo] { orderedRenewalInfos }

    /// The JWS a transaction was verified from, when it was recorded with one.
    public func jws(ofTransaction transactionID: String) -> String? { signedForms["t:" + transactionID] }

    /// The JWS a renewal info was verified from, when it was recorded with one.
    public func jws(ofRenewalInfo originalTransactionID: String) -> String? { signedForms["r:" + originalTransactionID] }

    /// Every `originalTransactionID` this history holds (the subscriptions and purchases it covers).
    public var originalTransactionIDs: Set<String> {
        Set(transactionsByID.values.map(\.originalTransactionID)).union(renewalInfosByOriginalID.keys)
    }

    /// The subscriptions (`originalTransactionId`s) this history holds every transaction of: all
    /// of them when it is not filtered; when filtered, those whose transactions are of one of
    /// ``wholeSubscriptionGroups``. That all of such a subscription's transactions matched the
    /// filter rests on our reading that a subscription's `originalTransactionId` stays within its
    /// group (Apple is silent on it; see `HistoryFilter.wholeSubscriptionGroups`).
    public var wholeSubscriptionIDs: Set<String> {
        guard isFiltered else { return originalTransactionIDs }
        let whole = Set(orderedTransactions.filter { $0.subscriptionGroupID.map(wholeSubscriptionGroups.contains) ?? false }.map(\.originalTransactionID))
        // A defence, not a case Apple describes: on a filtered answer every transaction matches
        // all the filters ("the transactions that return match all the filters", Get Transaction
        // History), so every one is of a named group and this set is empty. It is not empty only
        // if the history holds a transaction Apple's filter would not have returned (one without
        // `subscriptionGroupIdentifier`, or recorded into this history from elsewhere); such a
        // subscription is then not taken as whole.
        let outside = Set(orderedTransactions.filter { !($0.subscriptionGroupID.map(wholeSubscriptionGroups.contains) ?? false) }.map(\.originalTransactionID))
        return whole.subtracting(outside)
    }

    /// The `originalTransactionId` of `transactionID` (one of this history's transactions, or an
    /// original transaction ID it holds), nil when the history does not cover it.
    public func originalTransactionID(of transactionID: String) -> String? {
        if let transaction = transactionsByID[transactionID] { return transaction.originalTransactionID }
        return originalTransactionIDs.contains(transactionID) ? transactionID : nil
    }

    /// Whether `transactionID` is one of this history's transactions or original transactions.
    public func covers(transactionID: String) -> Bool {
        transactionsByID[transactionID] != nil || originalTransactionIDs.contains(transactionID)
    }

    /// The `appAccountToken`s (lowercased) Apple recorded on this history's transactions.
    public var appAccountTokens: Set<String> { accountTokens }

    /// This history as evaluator input: every item verified, no failures.
    public var evidence: EligibilityEvidence {
        EligibilityEvidence(transactions: transactions, renewalInfos: renewalInfos, failures: [])
    }

    /// Whether `a` comes before `b`: earlier purchase, then lower transaction ID.
    private static func precedes(_ a: VerifiedTransaction, _ b: VerifiedTransaction) -> Bool {
        (a.purchaseDate, a.transactionID) < (b.purchaseDate, b.transactionID)
    }

    private static func accountToken(_ transaction: VerifiedTransaction) -> String? {
        transaction.appAccountToken.flatMap { $0.isEmpty ? nil : $0.lowercased() }
    }

    private static func isNewer(_ existing: Date?, than candidate: Date?) -> Bool {
        guard let existing else { return false }
        guard let candidate else { return true }
        return existing > candidate
    }
}

extension Array {
    /// The index of the first element for which `belongsAfter` holds, in an array where every
    /// element for which it holds comes after every element for which it does not.
    fileprivate func partitioningIndex(where belongsAfter: (Element) -> Bool) -> Int {
        var low = 0
        var high = count
        while low < high {
            let middle = (low + high) / 2
            if belongsAfter(self[middle]) { high = middle } else { low = middle + 1 }
        }
        return low
    }
}
