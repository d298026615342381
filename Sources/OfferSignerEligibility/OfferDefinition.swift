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
    /// months (`paid_too_short`). Apple's win-back criterion `customerEligibilityPaidSubscriptionDurationInMonths`
    /// ("How long a customer was a subscriber", App Store Connect API `WinBackOffer.Attributes`).
    ///
    /// Paid periods are the `purchaseDate`..`expiresDate` of group transactions that are not free
    /// (`VerifiedTransaction.isFreePeriod`: any offer with `offerDiscountType` `FREE_TRIAL`, or a
    /// price of 0), not family-shared, less their refunded share (`VerifiedTransaction.refundedShare`:
    /// all of a full refund, `revocationPercentage` of a prorated one); overlapping periods are
    /// merged. Each merged period counts its calendar months (whole months plus the remainder as a
    /// fraction of the next month). Which periods count is `paidTime`.
    public var minPaidMonths: Int?
    /// `paidTime`: which paid time `minPaidMonths` counts. `lifetime` (the default): the sum over
    /// the customer's whole history in the group, as Apple's "How long a customer was a subscriber"
    /// reads most plainly; `latest-run`: only the latest continuous run of the subscription (periods
    /// that follow each other within a day, free periods bridging but not counting). Apple's text
    /// does not say which, so both are offered.
    public var paidTime: PaidTime
    /// `lapsedMonths`: `{ "min", "max" }` months since the last subscription in the group ended
    /// (expiry, refund or the end of a grace period); Apple's `customerEligibilityTimeSinceLastSubscribedInMonths`
    /// ("How long since the subscriber last had an active subscription"). `lapsed_too_recently` (with
    /// `eligibleFrom`) before `min`, `lapsed_too_long_ago` after `max`. Requires a lapsed customer
    /// (`currently_subscribed`, or `no_history` without history).
    public var lapsedMonths: MonthRange?
    /// `waitBetweenOffersMonths`: months that must pass since the customer's last redemption of this
    /// offer (or of any win-back offer, see `waitScope`) before another — `redeemed_too_recently`
    /// with `eligibleFrom`. Apple's `customerEligibilityWaitBetweenOffersInMonths`. From when the
    /// wait runs is `waitFrom`.
    ///
    /// On Apple's history a redemption is a transaction with `offerType` 2 and this
    /// `offerIdentifier`, or a renewal info with them (an offer the customer accepted that applies
    /// at the next renewal: a pending redemption, from `renewalDate`); signatures issued and not
    /// redeemed do not count. On the app's evidence only (which may leave a redemption out), each
    /// signature attempt in our ledger also counts, from its issue time (see
    /// `EligibilityEvaluator.RedemptionCounting`).
    public var waitBetweenOffersMonths: Int?
    /// `waitScope`: which redemptions `waitBetweenOffersMonths` looks at. Default `offer`.
    public var waitScope: WaitScope
    /// `waitFrom`: from when `waitBetweenOffersMonths` runs. Apple is inconsistent: the App Store
    /// Connect API's `WinBackOfferCreateRequest.Data.Attributes` says of
    /// `customerEligibilityWaitBetweenOffersInMonths` "The minimum time between the end of the
    /// customer's subscription and the customer redeeming the same offer again", while
    /// `WinBackOffer.Attributes` carries another sentence for the same attribute (see
    /// Docs/Eligibility.md). The default, `subscription-end`, follows the create request's text:
    /// the wait runs from the end of the customer's subscription that followed the redemption
    /// (the expiry of the continuous run of periods, within a day of each other, that contains the
    /// redemption's start); while that run is still active there is no subscription end yet and
    /// the wait runs from the redemption's end (a win-back offer is not offered then anyway: the
    /// customer is subscribed). `offer-end`: from the end of the redemption's discounted
    /// period(s), the last one of a pay-as-you-go offer over several periods.
    public var waitFrom: WaitFrom
    /// `maxRedemptions`: at most this many redemptions of this offer per customer (`max_redemptions`).
    /// On Apple's history: the redemptions Apple recorded, a pending one in a renewal info included. On the app's evidence only: the larger of
    /// the verified redemptions and our ledger's attempts (signatures for the offer within one
    /// signature lifetime, 24 h, are one attempt; the attempt still open does not count).
    public var maxRedemptions: Int?
    /// `excludeFamilyShared`: ineligible when the latest group transaction is `FAMILY_SHARED` (`family_shared`).
    public var excludeFamilyShared: Bool
    /// `excludeRefunded`: ineligible when any group transaction was refunded (`refunded`). A
    /// revocation from Family Sharing (`revocationType` `FAMILY_REVOKE`) is not a refund.
    public var excludeRefunded: Bool
    /// `excludeBillingRetry`: ineligible while a renewal info of the group reports the billing retry period
    /// or an unexpired grace period (`billing_retry`). No longer needed: win-back offers always
    /// require a churned subscription, which excludes both (see `EligibilityEvaluator`); kept for
    /// catalogs that set it, and still applied to offers of other kinds.
    public var excludeBillingRetry: Bool
    /// `clockSkewSeconds`: the tolerance around "now" in every comparison with a date of the history
    /// (default 60 s, at most 3600): a date within it of now counts as reached in the customer's
    /// favour (an expiry or the end of a wait or grace period is taken as past, a lapse window's end
    /// as not yet past, an active period of a retention offer's subscriber as still running). Apple
    /// is silent on clock skew.
    public var clockSkewSeconds: Int
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
        waitFrom: WaitFrom = .subscriptionEnd,
        maxRedemptions: Int? = nil,
        excludeFamilyShared: Bool = false,
        excludeRefunded: Bool = false,
        excludeBillingRetry: Bool = false,
        storefronts: StorefrontRule? = nil,
        environment: AppleEnvironment? = nil,
        deferToAppleWinBack: Bool = false,
        paidTime: PaidTime = .lifetime,
        clockSkewSeconds: Int = OfferRules.defaultClockSkewSeconds
    ) {
        self.paidTime = paidTime
        self.clockSkewSeconds = clockSkewSeconds
        self.minPaidMonths = minPaidMonths
        self.lapsedMonths = lapsedMonths
        self.waitBetweenOffersMonths = waitBetweenOffersMonths
        self.waitScope = waitScope
        self.waitFrom = waitFrom
        self.maxRedemptions = maxRedemptions
        self.excludeFamilyShared = excludeFamilyShared
        self.excludeRefunded = excludeRefunded
        self.excludeBillingRetry = excludeBillingRetry
        self.storefronts = storefronts
        self.environment = environment
        self.deferToAppleWinBack = deferToAppleWinBack
    }

    /// The default `clockSkewSeconds`.
    public static let defaultClockSkewSeconds = 60

    /// `paidTime` values.
    public enum PaidTime: String, Sendable, Codable, Hashable, CaseIterable {
        /// All paid time in the group, summed.
        case lifetime = "lifetime"
        /// The paid time of the latest continuous run of the subscription.
        case latestRun = "latest-run"
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

    /// `waitFrom` values.
    public enum WaitFrom: String, Sendable, Codable, Hashable, CaseIterable {
        /// From the end of the subscription that followed the redemption (Apple's
        /// `WinBackOfferCreateRequest` text; the default).
        case subscriptionEnd = "subscription-end"
        /// From the end of the redemption's discounted period(s).
        case offerEnd = "offer-end"
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
