import Foundation

/// Which customers an offer is meant for. Checked only for offers that have `rules`.
public enum OfferKind: String, Sendable, Codable, Hashable, CaseIterable {
    /// For lapsed customers: requires verified history in the subscription group (`no_history`
    /// otherwise) and no active subscription in it (`currently_subscribed`).
    case winBack = "win-back"
    /// For current subscribers: requires an active subscription in the group (`not_subscribed`, or
    /// `no_history` when there is no history at all).
    case retention = "retention"
    /// No precondition on the subscription state.
    case any = "any"
}

/// One promotional offer of the catalog (`offers[]` in the catalog JSON, see `OfferCatalog`).
public struct OfferDefinition: Sendable, Encodable, Hashable {
    /// The promotional offer identifier configured in App Store Connect (`offerID`).
    public var offerID: String
    /// The app's bundle ID (`bundleID`).
    public var bundleID: String
    /// The subscription products this offer can be applied to (`productIDs`, non-empty).
    public var productIDs: [String]
    /// The subscription group whose history the rules look at (`subscriptionGroupID`).
    public var subscriptionGroupID: String
    /// `kind`: `win-back`, `retention` or `any`.
    public var kind: OfferKind
    /// Optional free-text description (`description`), ignored by the evaluator.
    public var description: String?
    /// `rules`. `nil` (key absent) means the offer is always signable: no kind precondition, no evidence
    /// needed. An empty object `{}` means "rules present, none configured": the kind precondition
    /// applies and unverified evidence makes the offer ineligible.
    public var rules: OfferRules?
    /// `historySource`: whose word on the customer's history the rules are checked against:
    /// `apple`, `apple-then-client` or `client` (the default). See `HistorySource`.
    public var historySource: HistorySource

    public init(
        offerID: String,
        bundleID: String,
        productIDs: [String],
        subscriptionGroupID: String,
        kind: OfferKind,
        description: String? = nil,
        rules: OfferRules? = nil,
        historySource: HistorySource = .client
    ) {
        self.offerID = offerID
        self.bundleID = bundleID
        self.productIDs = productIDs
        self.subscriptionGroupID = subscriptionGroupID
        self.kind = kind
        self.description = description
        self.rules = rules
        self.historySource = historySource
    }
}

/// The eligibility rules of an offer (`rules` in the catalog JSON). Every field is optional; an absent
/// field does not constrain. All month counts are calendar months in UTC (Gregorian calendar).
public struct OfferRules: Sendable, Encodable, Hashable {
    /// `minPaidMonths`: the customer's paid time in the subscription group must be at least this many
    /// months (`paid_too_short`). Paid periods are the `purchaseDate`..`expiresDate` of group transactions
    /// that are not free trials (introductory `FREE_TRIAL`, or price 0), not refunded/revoked and not
    /// family-shared; overlapping periods are merged. Each merged period counts its calendar months (whole
    /// months plus the remainder as a fraction of the next month), and the counts are summed. A current
    /// period counts in full (it is paid for).
    public var minPaidMonths: Int?
    /// `lapsedMonths`: `{ "min", "max" }` months since the last subscription in the group ended
    /// (expiry, revocation or the end of a grace period). `lapsed_too_recently` (with `eligibleFrom`)
    /// before `min`, `lapsed_too_long_ago` after `max`. Requires a lapsed customer (`currently_subscribed`,
    /// or `no_history` without history).
    public var lapsedMonths: MonthRange?
    /// `waitBetweenOffersMonths`: months that must pass since the customer last redeemed this offer
    /// (or any win-back offer, see `waitScope`) — `redeemed_too_recently` with `eligibleFrom`.
    ///
    /// A redemption is a verified transaction with `offerType` 2 and this `offerIdentifier`. Because a
    /// client can leave transactions out of its evidence, every signature in our ledger for the offer also
    /// counts as a redemption at its issue time.
    public var waitBetweenOffersMonths: Int?
    /// `waitScope`: which redemptions `waitBetweenOffersMonths` looks at. Default `offer`.
    public var waitScope: WaitScope
    /// `maxRedemptions`: at most this many redemptions of this offer per customer (`max_redemptions`).
    /// The count is the larger of verified redemptions and ledger signatures for the offer.
    public var maxRedemptions: Int?
    /// `excludeFamilyShared`: ineligible when the latest group transaction is `FAMILY_SHARED` (`family_shared`).
    public var excludeFamilyShared: Bool
    /// `excludeRefunded`: ineligible when any group transaction was refunded/revoked (`refunded`).
    public var excludeRefunded: Bool
    /// `excludeBillingRetry`: ineligible while a renewal info of the group reports the billing retry period
    /// or an unexpired grace period (`billing_retry`).
    public var excludeBillingRetry: Bool
    /// `storefronts`: allow or deny list of ISO 3166-1 alpha-3 storefronts, matched against the latest
    /// verified transaction's `storefront` (`storefront_excluded`; an unknown storefront fails an allow list).
    public var storefronts: StorefrontRule?
    /// `environment`: every verified item must come from this environment, and there must be at least one
    /// (`environment_mismatch`).
    public var environment: AppleEnvironment?
    /// `deferToAppleWinBack`: ineligible while a renewal info of the group lists Apple win-back offers in
    /// `eligibleWinBackOfferIds` (`apple_win_back_available`), so discounts do not stack.
    public var deferToAppleWinBack: Bool

    public init(
        minPaidMonths: Int? = nil,
        lapsedMonths: MonthRange? = nil,
        waitBetweenOffersMonths: Int? = nil,
        waitScope: WaitScope = .offer,
        maxRedemptions: Int? = nil,
        excludeFamilyShared: Bool = false,
        excludeRefunded: Bool = false,
        excludeBillingRetry: Bool = false,
        storefronts: StorefrontRule? = nil,
        environment: AppleEnvironment? = nil,
        deferToAppleWinBack: Bool = false
    ) {
        self.minPaidMonths = minPaidMonths
        self.lapsedMonths = lapsedMonths
        self.waitBetweenOffersMonths = waitBetweenOffersMonths
        self.waitScope = waitScope
        self.maxRedemptions = maxRedemptions
        self.excludeFamilyShared = excludeFamilyShared
        self.excludeRefunded = excludeRefunded
        self.excludeBillingRetry = excludeBillingRetry
        self.storefronts = storefronts
        self.environment = environment
        self.deferToAppleWinBack = deferToAppleWinBack
    }

    /// Inclusive bounds in calendar months (`lapsedMonths`).
    public struct MonthRange: Sendable, Codable, Hashable {
        /// At least this many months.
        public var min: Int?
        /// At most this many months.
        public var max: Int?
        public init(min: Int? = nil, max: Int? = nil) {
            self.min = min
            self.max = max
        }
    }

    /// `waitScope` values.
    public enum WaitScope: String, Sendable, Codable, Hashable, CaseIterable {
        /// Only redemptions of this offer.
        case offer = "offer"
        /// Redemptions of any win-back offer: this offer, catalog offers of kind `win-back` (when the
        /// evaluator knows the catalog), and Apple's own win-back offers (`offerType` 4).
        case anyWinBack = "any-win-back"
    }

    /// `storefronts`: `{"allow": [...]}` or `{"deny": [...]}` (exactly one). Codes are stored uppercased.
    public enum StorefrontRule: Sendable, Hashable, Encodable {
        /// Only these storefronts.
        case allow(Set<String>)
        /// All but these storefronts.
        case deny(Set<String>)

        /// Whether `storefront` passes; `nil` (unknown) passes only a deny list.
        public func permits(_ storefront: String?) -> Bool {
            switch self {
            case .allow(let codes):
                guard let storefront else { return false }
                return codes.contains(storefront.uppercased())
            case .deny(let codes):
                guard let storefront else { return true }
                return !codes.contains(storefront.uppercased())
            }
        }

        private enum CodingKeys: String, CodingKey { case allow, deny }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            switch self {
            case .allow(let codes): try container.encode(codes.sorted(), forKey: .allow)
            case .deny(let codes): try container.encode(codes.sorted(), forKey: .deny)
            }
        }
    }
}
