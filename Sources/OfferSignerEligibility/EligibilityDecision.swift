import Foundation

/// Why an offer is not eligible. Encoded as the stable snake_case string codes below; decisions list
/// them in the declaration order of this enum.
public enum EligibilityReason: String, Sendable, Codable, Hashable, CaseIterable {
    /// At least one submitted JWS failed verification (offers with rules only); see
    /// `EligibilityDecision.evidenceFailures` for the specific failures.
    case evidenceUnverified = "evidence_unverified"
    /// History source `apple`: Apple's App Store Server API could not answer for this customer
    /// (unreachable, too slow for the time budget, failing, or its answer did not verify), so the
    /// history is unknown and nothing is granted on it.
    case historyUnavailable = "history_unavailable"
    /// Apple's history of the customer carries an `appAccountToken` other than the request's: the
    /// `transactionID` names another account's history.
    case appAccountTokenMismatch = "app_account_token_mismatch"
    /// Rule `environment`: evidence comes from another environment, or there is no evidence.
    case environmentMismatch = "environment_mismatch"
    /// No verified transaction in the subscription group, where the kind or `lapsedMonths` needs one.
    case noHistory = "no_history"
    /// Kind `win-back` or rule `lapsedMonths`: the customer has an active subscription in the group
    /// (including a billing grace period).
    case currentlySubscribed = "currently_subscribed"
    /// Kind `win-back`: the subscription expired but Apple reports that it will renew
    /// (`autoRenewStatus` 1), so it is not churned ("Supporting win-back offers in your app").
    case autoRenewOn = "auto_renew_on"
    /// Kind `retention`: the customer has history in the group but no active subscription.
    case notSubscribed = "not_subscribed"
    /// Rule `minPaidMonths`: not enough paid time in the group.
    case paidTooShort = "paid_too_short"
    /// Rule `lapsedMonths.min`: the subscription ended too recently (sets `eligibleFrom`).
    case lapsedTooRecently = "lapsed_too_recently"
    /// Rule `lapsedMonths.max`: the subscription ended too long ago.
    case lapsedTooLongAgo = "lapsed_too_long_ago"
    /// Rule `waitBetweenOffersMonths`: a redemption (or a signature we issued) is too recent (sets `eligibleFrom`).
    case redeemedTooRecently = "redeemed_too_recently"
    /// Rule `maxRedemptions`: the customer used this offer the maximum number of times.
    case maxRedemptions = "max_redemptions"
    /// Rule `excludeRefunded`: a transaction in the group was refunded or revoked.
    case refunded = "refunded"
    /// Rule `excludeFamilyShared`: the customer's access comes from Family Sharing.
    case familyShared = "family_shared"
    /// Kind `win-back` (always) or rule `excludeBillingRetry`: the subscription is in billing retry or
    /// a grace period, so it is not churned (App Store Server API `eligibleWinBackOfferIds`).
    case billingRetry = "billing_retry"
    /// Rule `storefronts`: the customer's storefront is not allowed.
    case storefrontExcluded = "storefront_excluded"
    /// Rule `deferToAppleWinBack`: Apple reports an eligible win-back offer of its own.
    case appleWinBackAvailable = "apple_win_back_available"

    /// Reasons that resolve by waiting (they can produce `eligibleFrom`).
    public var isWaitingPeriod: Bool { self == .lapsedTooRecently || self == .redeemedTooRecently }
}

/// The outcome of evaluating one offer for one customer.
public struct EligibilityDecision: Sendable, Codable, Hashable {
    /// The offer evaluated.
    public var offerID: String
    /// `true` when `reasons` is empty.
    public var eligible: Bool
    /// Every rule the customer fails, in a deterministic order (see `EligibilityReason`).
    public var reasons: [EligibilityReason]
    /// When every reason is a waiting period (`lapsed_too_recently`, `redeemed_too_recently`): the moment
    /// the last of them ends, assuming the history does not change. `nil` otherwise.
    public var eligibleFrom: Date?
    /// With `evidence_unverified`: the specific failure of each rejected JWS. Empty otherwise.
    public var evidenceFailures: [EvidenceFailure]

    public init(
        offerID: String,
        eligible: Bool,
        reasons: [EligibilityReason],
        eligibleFrom: Date? = nil,
        evidenceFailures: [EvidenceFailure] = []
    ) {
        self.offerID = offerID
        self.eligible = eligible
        self.reasons = reasons
        self.eligibleFrom = eligibleFrom
        self.evidenceFailures = evidenceFailures
    }

    private enum CodingKeys: String, CodingKey { case offerID, eligible, reasons, eligibleFrom, evidenceFailures }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        offerID = try container.decode(String.self, forKey: .offerID)
        eligible = try container.decode(Bool.self, forKey: .eligible)
        reasons = try container.decode([EligibilityReason].self, forKey: .reasons)
        eligibleFrom = try container.decodeIfPresent(Date.self, forKey: .eligibleFrom)
        evidenceFailures = try container.decodeIfPresent([EvidenceFailure].self, forKey: .evidenceFailures) ?? []
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(offerID, forKey: .offerID)
        try container.encode(eligible, forKey: .eligible)
        try container.encode(reasons, forKey: .reasons)
        try container.encodeIfPresent(eligibleFrom, forKey: .eligibleFrom)
        if !evidenceFailures.isEmpty {
            try container.encode(evidenceFailures, forKey: .evidenceFailures)
        }
    }
}
