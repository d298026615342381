import Foundation

/// A transaction whose Apple signature has been verified (see `AppleSignedDataVerifier` in
/// OfferSignerEvidence). Field names follow Apple's `JWSTransactionDecodedPayload`; dates were
/// milliseconds since 1970 in the payload.
///
/// Only construct these yourself in tests: eligibility decisions trust every field.
public struct VerifiedTransaction: Sendable, Codable, Hashable {
    /// `transactionId`.
    public var transactionID: String
    /// `originalTransactionId`: identifies the subscription (stays the same across renewals).
    public var originalTransactionID: String
    /// `productId`.
    public var productID: String
    /// `subscriptionGroupIdentifier` (subscriptions only).
    public var subscriptionGroupID: String?
    /// `purchaseDate`: start of the period this transaction pays for.
    public var purchaseDate: Date
    /// `expiresDate`: end of the period (subscriptions only).
    public var expiresDate: Date?
    /// `revocationDate`: set when Apple refunded or revoked the transaction.
    public var revocationDate: Date?
    /// `inAppOwnershipType`.
    public var ownershipType: AppleOwnershipType?
    /// `offerType`.
    public var offerType: AppleOfferType?
    /// `offerIdentifier`: for promotional offers, the offer ID we signed.
    public var offerIdentifier: String?
    /// `offerDiscountType`.
    public var offerDiscountType: AppleOfferDiscountType?
    /// `offerPeriod`: "the duration of the offer", an ISO 8601 duration (e.g. `P3M`), kept as
    /// Apple sends it (Apple's `JWSTransactionDecodedPayload.offerPeriod`,
    /// appstoreserverlibrary/models/JWSTransactionDecodedPayload.py;
    /// https://developer.apple.com/documentation/appstoreserverapi/offerperiod). Absent from those
    /// stored before this field was kept. Apple is silent on which transactions carry it (its
    /// library's test data show it on a `PURCHASE` transaction under an offer,
    /// tests/resources/models/signedTransaction.json, and on renewal info,
    /// signedRenewalInfo.json) and on whether older transactions do.
    public var offerPeriod: String?
    /// `price` in milliunits of `currency`.
    public var price: Int64?
    /// `currency` (ISO 4217).
    public var currency: String?
    /// `storefront`: ISO 3166-1 alpha-3 country code (e.g. `USA`).
    public var storefront: String?
    /// `environment`.
    public var environment: AppleEnvironment
    /// `bundleId`.
    public var bundleID: String
    /// `type`.
    public var type: AppleProductType?
    /// `appAccountToken` (a UUID string the app chose).
    public var appAccountToken: String?
    /// `signedDate`: when the App Store signed this payload.
    public var signedDate: Date?
    /// `isUpgraded`: the customer upgraded to another subscription of the group; the service this
    /// transaction paid for ended when the upgrade's transaction began, not at `expiresDate`.
    public var isUpgraded: Bool?
    /// `transactionReason`: a purchase, or a renewal by the App Store.
    public var transactionReason: AppleTransactionReason?
    /// `revocationReason`: `1` refunded for an issue with the app, `0` for another reason (Apple's
    /// `RevocationReason`, appstoreserverlibrary/models/RevocationReason.py; the field's description,
    /// "The reason that the App Store refunded the transaction or revoked it from Family Sharing",
    /// is `JWSTransactionDecodedPayload.revocationReason`'s, appstoreserverlibrary/models/JWSTransactionDecodedPayload.py).
    public var revocationReason: Int?
    /// `revocationType`: `REFUND_FULL`, `REFUND_PRORATED` or `FAMILY_REVOKE` (Apple's
    /// `RevocationType`, appstoreserverlibrary/models/RevocationType.py).
    public var revocationType: AppleRevocationType?
    /// `revocationPercentage`: the share of the transaction refunded or revoked, in milli-percent
    /// (`0`–`100000`; Apple: "The percentage, in milliunits, of the transaction that the App Store
    /// has refunded or revoked", JWSTransactionDecodedPayload.py).
    public var revocationPercentage: Int?

    public init(
        transactionID: String,
        originalTransactionID: String,
        productID: String,
        subscriptionGroupID: String? = nil,
        purchaseDate: Date,
        expiresDate: Date? = nil,
        revocationDate: Date? = nil,
        ownershipType: AppleOwnershipType? = .purchased,
        offerType: AppleOfferType? = nil,
        offerIdentifier: String? = nil,
        offerDiscountType: AppleOfferDiscountType? = nil,
        offerPeriod: String? = nil,
        price: Int64? = nil,
        currency: String? = nil,
        storefront: String? = nil,
        environment: AppleEnvironment,
        bundleID: String,
        type: AppleProductType? = .autoRenewableSubscription,
        appAccountToken: String? = nil,
        signedDate: Date? = nil,
        isUpgraded: Bool? = nil,
        transactionReason: AppleTransactionReason? = nil,
        revocationReason: Int? = nil,
        revocationType: AppleRevocationType? = nil,
        revocationPercentage: Int? = nil
    ) {
        self.revocationReason = revocationReason
        self.revocationType = revocationType
        self.revocationPercentage = revocationPercentage
        self.transactionID = transactionID
        self.originalTransactionID = originalTransactionID
        self.productID = productID
        self.subscriptionGroupID = subscriptionGroupID
        self.purchaseDate = purchaseDate
        self.expiresDate = expiresDate
        self.revocationDate = revocationDate
        self.ownershipType = ownershipType
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.offerDiscountType = offerDiscountType
        self.offerPeriod = offerPeriod
        self.price = price
        self.currency = currency
        self.storefront = storefront
        self.environment = environment
        self.bundleID = bundleID
        self.type = type
        self.appAccountToken = appAccountToken
        self.signedDate = signedDate
        self.isUpgraded = isUpgraded
        self.transactionReason = transactionReason
    }

    /// Whether this period renews `previous` under the same pay-as-you-go offer, and so continues
    /// the redemption that began with `first` (that redemption's first period) rather than
    /// starting another, when `periodsBefore` periods of that redemption (`first` included) came
    /// before it: `previous` was under the same offer (`offerType` and `offerIdentifier`) for the
    /// same product (a change of product at renewal ends the old offer), both are pay as you go,
    /// this one is not a purchase (`transactionReason` `PURCHASE`: bought again), it follows
    /// `previous` (``follows(_:)``), or, as a renewal (`RENEWAL`), began later within Apple's
    /// longest billing retry (``billingRetryLimit``: an offer goes on when a failed renewal is
    /// recovered), and the offer still has a period left for it (``isWithinOffer(begunBy:periodsBefore:)``).
    /// An offer over several billing periods is one redemption; the same offer redeemed again,
    /// after a lapse, paid up front, or accepted again for the renewal after its last period, is
    /// another. Callers walk a subscription's periods with ``payAsYouGoContinuations(_:)``, the
    /// one rule for the eligibility rules' count and for redemption tracking. Apple's fields:
    /// `offerType`, `offerIdentifier`, `offerDiscountType` `PAY_AS_YOU_GO` (a discounted price for
    /// each billing period of the offer), `offerPeriod` and `transactionReason`
    /// (https://developer.apple.com/documentation/appstoreserverapi/jwstransactiondecodedpayload,
    /// https://developer.apple.com/documentation/appstoreserverapi/offerdiscounttype; Apple's Python
    /// library `appstoreserverlibrary/models/OfferDiscountType.py` and
    /// `appstoreserverlibrary/models/JWSTransactionDecodedPayload.py`). Apple does not say in so
    /// many words that the periods of one pay-as-you-go offer are one redemption, nor whether an
    /// offer's run goes on across a billing retry: both are this rule's reading of its fields.
    /// `runBefore`: the run's periods before this one, `first` first (see
    /// ``isWithinOffer(begunBy:periodsBefore:runBefore:)``); empty reads `first` alone.
    public func continuesPayAsYouGoOffer(
        of previous: VerifiedTransaction, begunBy first: VerifiedTransaction, periodsBefore: Int, runBefore: [VerifiedTransaction] = []
    ) -> Bool {
        guard transactionReason != .purchase, previous.productID == productID, previous.offerType == offerType,
            previous.offerIdentifier == offerIdentifier,
            previous.offerDiscountType == .payAsYouGo, offerDiscountType == .payAsYouGo
        else { return false }
        guard follows(previous) || (transactionReason == .renewal && followsAfterBillingRetry(previous)) else { return false }
        return isWithinOffer(begunBy: first, periodsBefore: periodsBefore, runBefore: runBefore)
    }

    /// Whether this period, the one after `periodsBefore` periods of the offer's run begun by
    /// `first`, is still one of the offer's billing periods: its index in the run
    /// (`periodsBefore`, the first period's being 0) is below the offer's period count
    /// (``payAsYouGoBillingPeriods(begunBy:)``); always when that count is unknown.
    ///
    /// Periods are counted, not calendar time: a renewal recovered after a billing retry (up to
    /// ``billingRetryLimit`` late) is still the offer's next period, and renewal dates that drift
    /// from the calendar sum (Jan 31, Feb 28, Mar 28) change nothing.
    public func isWithinOffer(begunBy first: VerifiedTransaction, periodsBefore: Int, runBefore: [VerifiedTransaction] = []) -> Bool {
        guard let count = payAsYouGoBillingPeriods(begunBy: first, runBefore: runBefore) else { return true }
        return periodsBefore < count
    }

    /// How many billing periods the pay-as-you-go offer whose run `first` began lasts, as this
    /// period reads it: `offerPeriod` (``AppleOfferPeriod``, `first`'s, else this period's)
    /// divided by the product's billing period, rounded, at least 1, at most the offer's length
    /// in weeks. The billing period is read from the run's periods as a whole (`runBefore`, else
    /// `first`, and this period; each one's `expiresDate` − `purchaseDate`): the most common
    /// length Apple sells among them, so one period shortened or extended does not change the
    /// count (``AppleOfferPeriod/billingPeriods(run:)``). The division follows
    /// ``AppleOfferPeriod/billingPeriods(firstFrom:to:)`` (after Apple's table: `offerPeriod` is
    /// the single period length times the period count,
    /// https://developer.apple.com/documentation/appstoreserverapi/offerperiod). So a `P2M` offer
    /// on a monthly product is 2 periods, `P1Y` on a monthly product 12, `P3M` on a quarterly
    /// one 1.
    ///
    /// nil (the run never ends: the rule from before `offerPeriod` was read, every renewal under
    /// the same offer continues it) when `offerPeriod` is absent or not a duration of years,
    /// months, weeks and days (``AppleOfferPeriod/init(iso8601:)``), when `first` has no
    /// `expiresDate`, and outside Production (`environment` `Sandbox`, `Xcode`, `LocalTesting`):
    /// there renewals are accelerated (a month renews in minutes, at a rate the tester can set),
    /// while Apple is silent on whether `offerPeriod` is accelerated too; an accelerated period
    /// length divided into a nominal `P2M` would count thousands of periods, so the division
    /// means nothing there. Apple is also silent on transactions from before it added
    /// `offerDiscountType` and `offerPeriod` (they carry neither, so no pay-as-you-go period is
    /// recognised in them at all).
    public func payAsYouGoBillingPeriods(begunBy first: VerifiedTransaction, runBefore: [VerifiedTransaction] = []) -> Int? {
        guard environment == .production, first.environment == .production, first.expiresDate != nil,
            let period = (first.offerPeriod ?? offerPeriod).flatMap(AppleOfferPeriod.init(iso8601:))
        else { return nil }
        let periods = (runBefore.isEmpty ? [first] : runBefore) + [self]
        return period.billingPeriods(run: periods.compactMap { transaction in transaction.expiresDate.map { (transaction.purchaseDate, $0) } })
    }

    /// Walks one subscription's periods (`chain`: transactions of one `originalTransactionId`, in
    /// any order; read by `purchaseDate`, then `transactionID`) and returns, for each period that
    /// continues a pay-as-you-go redemption (``continuesPayAsYouGoOffer(of:begunBy:periodsBefore:)``
    /// with the period before it and the number of the run's periods before it), the first period
    /// of that redemption, by `transactionID`. A period not in the result begins a redemption when
    /// it is under an offer. The one walk both the eligibility count (`EligibilityEvaluator`) and
    /// redemption tracking use; on a chain whose earliest periods are missing, the earliest period
    /// held stands for a redemption's first (and the run's periods are counted from it).
    public static func payAsYouGoContinuations(_ chain: [VerifiedTransaction]) -> [String: VerifiedTransaction] {
        var continuing: [String: VerifiedTransaction] = [:]
        var previous: VerifiedTransaction?
        var first: VerifiedTransaction?
        var periodsInRun = 0
        var run: [VerifiedTransaction] = []
        for transaction in chain.sorted(by: { ($0.purchaseDate, $0.transactionID) < ($1.purchaseDate, $1.transactionID) }) {
            if let previous, let begun = first,
                transaction.continuesPayAsYouGoOffer(of: previous, begunBy: begun, periodsBefore: periodsInRun, runBefore: run)
            {
                continuing[transaction.transactionID] = begun
                periodsInRun += 1
                run.append(transaction)
            } else {
                first = transaction
                periodsInRun = 1
                run = [transaction]
            }
            previous = transaction
        }
        return continuing
    }

    /// Apple retries a failed renewal for up to 60 days: "Billing-related issues trigger the
    /// subscription to enter a billing retry state where the App Store attempts to renew the
    /// subscription for up to 60 days" (Apple's subscription billing documentation; see
    /// https://developer.apple.com/documentation/storekit/reducing-involuntary-subscriber-churn
    /// and `isInBillingRetryPeriod`,
    /// https://developer.apple.com/documentation/appstoreserverapi/isinbillingretryperiod).
    public static let billingRetryLimit: TimeInterval = 60 * 86_400

    /// Whether this period began where `previous` ended: within a day, or within half of
    /// `previous`'s length when that is shorter (Sandbox renews every few minutes).
    public func follows(_ previous: VerifiedTransaction) -> Bool {
        guard let previousEnd = previous.expiresDate else { return false }
        let tolerance = min(86_400, max(0, previousEnd.timeIntervalSince(previous.purchaseDate)) / 2)
        return abs(purchaseDate.timeIntervalSince(previousEnd)) <= tolerance
    }

    /// Whether this period began after `previous` ended, within ``billingRetryLimit``.
    public func followsAfterBillingRetry(_ previous: VerifiedTransaction) -> Bool {
        guard let previousEnd = previous.expiresDate else { return false }
        let gap = purchaseDate.timeIntervalSince(previousEnd)
        return gap >= 0 && gap <= Self.billingRetryLimit
    }

    /// A free period, which is no paid time: any offer (introductory, promotional, offer code,
    /// win-back) whose `offerDiscountType` is `FREE_TRIAL`, or any period with a `price` of 0.
    /// (Apple: `offerDiscountType` "The payment mode you configure for the offer", FREE_TRIAL among
    /// its values, appstoreserverlibrary/models/OfferDiscountType.py; `price` "The price, in
    /// milliunits, of the In-App Purchase", JWSTransactionDecodedPayload.py.)
    public var isFreePeriod: Bool {
        if offerDiscountType == .freeTrial { return true }
        if let price, price == 0 { return true }
        return false
    }

    /// Apple refunded or revoked this transaction (`revocationDate` is set).
    public var isRevoked: Bool { revocationDate != nil }

    /// A revocation from Family Sharing, not a refund: `revocationType` `FAMILY_REVOKE`; or, in a
    /// payload from before Apple added `revocationType`, the revocation of a `FAMILY_SHARED`
    /// transaction (a family member paid nothing, so nothing could be refunded to them; Apple is
    /// silent on such older payloads).
    public var isFamilyRevocation: Bool {
        guard isRevoked else { return false }
        if let revocationType { return revocationType == .familyRevoke }
        return isFamilyShared
    }

    /// Apple refunded this transaction (a revocation that is not from Family Sharing).
    public var isRefunded: Bool { isRevoked && !isFamilyRevocation }

    /// The share of the transaction's paid time that was refunded, 0…1: all of it for
    /// `REFUND_FULL` (or a refund without `revocationType`, from before Apple added it), the
    /// `revocationPercentage` (milli-percent) for `REFUND_PRORATED`, none when not refunded.
    public var refundedShare: Double {
        guard isRefunded else { return 0 }
        guard revocationType == .refundProrated, let revocationPercentage else { return 1 }
        return min(1, max(0, Double(revocationPercentage) / 100_000))
    }

    /// The customer has this through Family Sharing rather than their own purchase.
    public var isFamilyShared: Bool { ownershipType == .familyShared }
}

/// Subscription renewal info whose Apple signature has been verified. Field names follow Apple's
/// `JWSRenewalInfoDecodedPayload`, which has no `bundleId` (so it cannot be bound to an app;
/// only its environment is checked).
public struct VerifiedRenewalInfo: Sendable, Codable, Hashable {
    /// `originalTransactionId`: the subscription this renewal info describes.
    public var originalTransactionID: String?
    /// `productId`: the product the customer is currently subscribed to.
    public var productID: String?
    /// `autoRenewProductId`: the product that renews next.
    public var autoRenewProductID: String?
    /// `autoRenewStatus`: `true` when it is `1` (will renew).
    public var autoRenewEnabled: Bool?
    /// `expirationIntent`: why the subscription expired (`1` the customer cancelled, `2` billing
    /// error, `3` no consent to a price increase, `4` product not available, `5` other; Apple's
    /// `ExpirationIntent`, appstoreserverlibrary/models/ExpirationIntent.py).
    public var expirationIntent: Int?
    /// `isInBillingRetryPeriod`.
    public var isInBillingRetryPeriod: Bool?
    /// `gracePeriodExpiresDate`: the end of a billing grace period (access continues until then).
    public var gracePeriodExpiresDate: Date?
    /// `eligibleWinBackOfferIds`: Apple's own win-back offers this customer can redeem right now.
    public var eligibleWinBackOfferIDs: [String]
    /// `environment`.
    public var environment: AppleEnvironment
    /// `signedDate`.
    public var signedDate: Date?
    /// `offerType`: the type of the subscription offer that applies at the next renewal (Apple's
    /// `JWSRenewalInfoDecodedPayload.offerType`; a promotional offer is `2`). Set once the customer
    /// accepted an offer that starts at the renewal (a Retention Messaging offer, for one).
    public var offerType: AppleOfferType?
    /// `offerIdentifier`: that offer's identifier (for a promotional offer, the offer ID we signed).
    public var offerIdentifier: String?
    /// `offerDiscountType`: that offer's payment mode.
    public var offerDiscountType: AppleOfferDiscountType?
    /// `offerPeriod`: that offer's duration, an ISO 8601 duration (e.g. `P3M`); kept as Apple sends it.
    public var offerPeriod: String?
    /// `renewalDate`: when the subscription renews next (Apple: "The UNIX time, in milliseconds,
    /// that the most recent auto-renewable subscription purchase expires").
    public var renewalDate: Date?

    public init(
        originalTransactionID: String?,
        productID: String? = nil,
        autoRenewProductID: String? = nil,
        autoRenewEnabled: Bool? = nil,
        isInBillingRetryPeriod: Bool? = nil,
        gracePeriodExpiresDate: Date? = nil,
        eligibleWinBackOfferIDs: [String] = [],
        environment: AppleEnvironment,
        signedDate: Date? = nil,
        expirationIntent: Int? = nil,
        offerType: AppleOfferType? = nil,
        offerIdentifier: String? = nil,
        offerDiscountType: AppleOfferDiscountType? = nil,
        offerPeriod: String? = nil,
        renewalDate: Date? = nil
    ) {
        self.offerType = offerType
        self.offerIdentifier = offerIdentifier
        self.offerDiscountType = offerDiscountType
        self.offerPeriod = offerPeriod
        self.renewalDate = renewalDate
        self.expirationIntent = expirationIntent
        self.originalTransactionID = originalTransactionID
        self.productID = productID
        self.autoRenewProductID = autoRenewProductID
        self.autoRenewEnabled = autoRenewEnabled
        self.isInBillingRetryPeriod = isInBillingRetryPeriod
        self.gracePeriodExpiresDate = gracePeriodExpiresDate
        self.eligibleWinBackOfferIDs = eligibleWinBackOfferIDs
        self.environment = environment
        self.signedDate = signedDate
    }
}
