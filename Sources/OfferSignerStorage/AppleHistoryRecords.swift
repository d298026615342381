import Foundation
import OfferSignerCore

/// One Apple-signed item of a customer's history as stored: the JWS exactly as Apple sent it
/// and its verified, decoded content (JSON the server wrote after verifying the JWS).
///
/// Rule: the store keeps one item per key (a transaction by `transactionId`, a renewal info by
/// `originalTransactionId`, per app and environment); a later statement (greater or equal
/// `signedDate`) replaces an earlier one, an older one never replaces a newer one. The same
/// statement again (equal `signedDate`, the same JWS and decoded form) leaves the row as it is,
/// unwritten (a history fetched again rewrites nothing).
public struct AppleSignedItem: Sendable, Equatable {
    public var bundleID: String
    /// `Production` or `Sandbox`.
    public var environment: String
    /// The transaction's `transactionId`; for a renewal info, its `originalTransactionId`.
    public var key: String
    public var originalTransactionID: String
    public var signedDate: Date?
    /// The verified content, as JSON.
    public var decoded: String
    /// The JWS as Apple signed it (kept so the item can be verified again later).
    public var jws: String

    public init(bundleID: String, environment: String, key: String, originalTransactionID: String, signedDate: Date?, decoded: String, jws: String) {
        self.bundleID = bundleID
        self.environment = environment
        self.key = key
        self.originalTransactionID = originalTransactionID
        self.signedDate = signedDate
        self.decoded = decoded
        self.jws = jws
    }
}

/// An App Store Server Notification V2 that was verified and accepted (for idempotency by
/// `notificationUUID`, and for operators: what Apple told us, and when).
public struct AppleNotificationReceipt: Sendable, Equatable {
    public var notificationUUID: String
    public var bundleID: String
    public var environment: String
    public var notificationType: String
    public var subtype: String?
    public var originalTransactionID: String?
    public var signedDate: Date
    public var receivedAt: Date

    public init(
        notificationUUID: String, bundleID: String, environment: String, notificationType: String, subtype: String?,
        originalTransactionID: String?, signedDate: Date, receivedAt: Date
    ) {
        self.notificationUUID = notificationUUID
        self.bundleID = bundleID
        self.environment = environment
        self.notificationType = notificationType
        self.subtype = subtype
        self.originalTransactionID = originalTransactionID
        self.signedDate = signedDate
        self.receivedAt = receivedAt
    }
}

/// A transaction Apple signed that redeemed one of our promotional offers (`offerType` 2 with an
/// `offerIdentifier`), to be matched to the signature that enabled it. Apple: `offerType` 2 is a
/// promotional offer, whose `offerIdentifier` is the offer's identifier
/// (https://developer.apple.com/documentation/appstoreserverapi/offertype,
/// https://developer.apple.com/documentation/appstoreserverapi/offeridentifier; Apple's Python
/// library `appstoreserverlibrary/models/OfferType.py` `PROMOTIONAL_OFFER = 2`). Win-back offers
/// (`offerType` 4) are deliberately not matched: this service never signs them (Apple applies
/// them itself), so a win-back redemption has no signature of ours to find.
public struct RedemptionCandidate: Sendable, Equatable {
    public var transactionID: String
    public var originalTransactionID: String
    public var bundleID: String
    public var environment: String
    public var productID: String
    public var offerID: String
    /// Lowercased; `nil` when the purchase carried none (then no signature can be matched).
    public var appAccountToken: String?
    public var purchaseDate: Date
    /// The earliest a matching signature may have been issued: ``RedemptionMatching/signatureLifetime``
    /// before `purchaseDate`, or, for an offer that began at a renewal (redeemed during the period
    /// before, to start at its end), that long before the previous period began (as known, or as
    /// estimated when its notification never arrived).
    public var signatureWindowStart: Date
    /// The subscription renewed under the offer its previous period already carried (a
    /// pay-as-you-go offer's next period): the same redemption going on, not a new one. Recorded
    /// only when a signature of its own matches (a new redemption of that offer), or, when not
    /// ``isPlaced``, as unplaced, never matched on the estimate: the estimated window reaches back
    /// over the lost previous period, which may be the offer's first, and would take its signature.
    public var continuesRedemption: Bool
    /// Whether the period before the transaction is known, so ``signatureWindowStart`` and
    /// ``continuesRedemption`` are Apple's word, not an estimate. False for a renewal whose
    /// previous period the store has not heard of (a lost or late notification): its window is
    /// estimated, and when no signature matches within it the redemption is recorded
    /// `unplaced` (see ``OfferRedemption/State``) until a fetched history places it.
    public var isPlaced: Bool

    public init(
        transactionID: String, originalTransactionID: String, bundleID: String, environment: String, productID: String, offerID: String,
        appAccountToken: String?, purchaseDate: Date, signatureWindowStart: Date? = nil, continuesRedemption: Bool = false, isPlaced: Bool = true
    ) {
        self.transactionID = transactionID
        self.originalTransactionID = originalTransactionID
        self.bundleID = bundleID
        self.environment = environment
        self.productID = productID
        self.offerID = offerID
        self.appAccountToken = appAccountToken
        self.purchaseDate = purchaseDate
        self.signatureWindowStart = signatureWindowStart ?? purchaseDate.addingTimeInterval(-RedemptionMatching.signatureLifetime)
        self.continuesRedemption = continuesRedemption
        self.isPlaced = isPlaced
    }

    /// The ledger's customer key a matching issuance carries: the appAccountToken, or, for a
    /// purchase without one, `otid:<originalTransactionId>`, the key Retention Messaging signs
    /// under for a subscription whose transactions carry no token (`RetentionDecider.customerKey`).
    public var matchingCustomerKey: String { appAccountToken ?? "otid:" + originalTransactionID }
}

/// A recorded redemption of a promotional offer, and the issuance it was matched to.
///
/// Matching rule (both stores): the latest signing request (its `signature.issued` records, one
/// per format, count once) of the same bundle, product, offer and customer — the same
/// ``RedemptionCandidate/matchingCustomerKey`` (the appAccountToken, or, without one, the key a
/// Retention Messaging signature was issued under) or the same `originalTransactionId` recorded
/// on the issuance — in the same environment when the issuance's environment was proved by Apple's
/// signature (a Sandbox redemption never uses up a Production issuance; one of unknown
/// environment, or of one the signing request only declared, matches either: see
/// ``IssuanceEnvironmentSchema``), issued at or after the candidate's
/// ``RedemptionCandidate/signatureWindowStart`` (normally ``RedemptionMatching/signatureLifetime``
/// before the purchase) and at most ``RedemptionMatching/clockSkew`` after the purchase, that no
/// other redemption was matched to. Among several, one carrying the candidate's customer key comes
/// first, then one of the candidate's environment (then of none, then declared another), then the
/// latest. An issuance is used up when a redemption was matched to it or to another signature of
/// the same request. A request's signatures are consecutive `signature.issued` records, one per
/// format (the audit committer writes a request's entries together, and a request names each
/// format once), so "the same request" is: the next or previous audit sequence, in another format,
/// with the same client, product, offer, millisecond, customer key, `originalTransactionId` and
/// environment. Two requests in one millisecond, of two customers or of one, never use each other
/// up: the latest sequence is matched first, so each redemption takes the newer request's last
/// format and uses up that request's other one. The store cannot tell apart two one-format
/// requests of one customer in different formats whose records are adjacent in one millisecond:
/// they count as one.
/// A transaction is recorded once, however often Apple states it; one that only continues a
/// redemption (``RedemptionCandidate/continuesRedemption``) is not recorded unless it matches.
///
/// Placement rule (both stores): a candidate that is not ``RedemptionCandidate/isPlaced`` and
/// matches no signature within its estimated window is recorded ``State/unplaced`` (never
/// `unmatched`: an estimate proves no leaked key), whether or not it may only continue a
/// redemption. When a later update states the same transaction placed (a fetched history), the
/// stored redemption is matched again with the placed window and becomes matched or unmatched
/// (``placedAt`` set, an `offer.redemption_placed` audit record), or, when it only continues a
/// redemption and no signature of its own matches, is removed (audited the same way, outcome
/// `continues`). A placed state never goes back to unplaced.
public struct OfferRedemption: Sendable, Equatable {
    /// Where a redemption stands.
    public enum State: String, Sendable, Equatable {
        /// Matched to a signature this service issued.
        case matched
        /// Placed, and no signature of ours matched (another signer, a leaked key, or no
        /// appAccountToken to match by).
        case unmatched
        /// The period before it is unknown and no signature matched within the estimated window:
        /// neither matched nor known to be unmatched until a fetched history places it.
        case unplaced
    }

    public var candidate: RedemptionCandidate
    /// The audit sequence of the matched `signature.issued` record, `nil` when none matched.
    public var issuanceSequence: Int64?
    /// When the matched signature was issued.
    public var signatureIssuedAt: Date?
    /// `notification` or `history` (an App Store Server API answer).
    public var source: String
    public var recordedAt: Date
    /// Recorded unplaced and not placed yet.
    public var isUnplaced: Bool
    /// When a redemption recorded unplaced was placed (nil for one placed when recorded, or not yet).
    public var placedAt: Date?

    public init(
        candidate: RedemptionCandidate, issuanceSequence: Int64?, signatureIssuedAt: Date?, source: String, recordedAt: Date, isUnplaced: Bool = false,
        placedAt: Date? = nil
    ) {
        self.candidate = candidate
        self.issuanceSequence = issuanceSequence
        self.signatureIssuedAt = signatureIssuedAt
        self.source = source
        self.recordedAt = recordedAt
        self.isUnplaced = isUnplaced && issuanceSequence == nil
        self.placedAt = placedAt
    }

    public var isMatched: Bool { issuanceSequence != nil }

    public var state: State { isMatched ? .matched : (isUnplaced ? .unplaced : .unmatched) }

    /// The `offer.redeemed` audit entry.
    public var auditEntry: AuditEntry {
        var writer = JSONObjectWriter()
        writer.field("redeemedAt", candidate.purchaseDate.unixMilliseconds)
        writer.field("bundleID", candidate.bundleID)
        writer.field("environment", candidate.environment)
        writer.field("productID", candidate.productID)
        writer.field("offerID", candidate.offerID)
        writer.field("appAccountToken", candidate.appAccountToken)
        writer.field("transactionID", candidate.transactionID)
        writer.field("originalTransactionID", candidate.originalTransactionID)
        writer.field("matched", isMatched)
        if isUnplaced { writer.field("unplaced", true) }
        if let issuanceSequence { writer.field("issuanceSequence", issuanceSequence) }
        if let signatureIssuedAt { writer.field("signatureIssuedAt", signatureIssuedAt.unixMilliseconds) }
        writer.field("source", source)
        return AuditEntry(kind: "offer.redeemed", body: writer.finish())
    }

    /// The `offer.redemption_placed` audit entry of a redemption recorded unplaced and placed now:
    /// `outcome` is `matched`, `unmatched`, or `continues` (it only continued a redemption; removed).
    public func placementAuditEntry(outcome: String) -> AuditEntry {
        var writer = JSONObjectWriter()
        writer.field("bundleID", candidate.bundleID)
        writer.field("environment", candidate.environment)
        writer.field("offerID", candidate.offerID)
        writer.field("transactionID", candidate.transactionID)
        writer.field("outcome", outcome)
        if let issuanceSequence { writer.field("issuanceSequence", issuanceSequence) }
        if let signatureIssuedAt { writer.field("signatureIssuedAt", signatureIssuedAt.unixMilliseconds) }
        writer.field("signatureWindowStart", candidate.signatureWindowStart.unixMilliseconds)
        writer.field("source", source)
        return AuditEntry(kind: "offer.redemption_placed", body: writer.finish())
    }
}

/// The matching window of ``OfferRedemption``.
public enum RedemptionMatching {
    /// Apple accepts a promotional offer signature for 24 hours: its timestamp "keeps the payment
    /// discount active for 24 hours"
    /// (https://developer.apple.com/documentation/storekit/skpaymentdiscount/timestamp; Apple's
    /// Python library `appstoreserverlibrary/promotional_offer.py`: "The timestamp keeps the
    /// offer active for 24 hours").
    public static let signatureLifetime: TimeInterval = 24 * 3600
    /// A purchase dated slightly before the signature (clocks differ) still matches.
    public static let clockSkew: TimeInterval = 300
}

/// What one notification, or one fetched history, adds to the store (one transaction).
public struct AppleHistoryUpdate: Sendable, Equatable {
    /// The notification, when the update comes from one (then a repeated `notificationUUID` makes
    /// the whole update a no-op).
    public var notification: AppleNotificationReceipt?
    public var transactions: [AppleSignedItem]
    public var renewalInfos: [AppleSignedItem]
    /// Subscriptions (bundle, environment, originalTransactionId) whose whole history this update
    /// holds: a full App Store Server API history, or a first purchase (SUBSCRIBED, INITIAL_BUY).
    /// From then on, notifications keep the stored history complete.
    public var completeSubscriptions: [AppleSubscriptionKey]
    /// Every subscription the update touches (recorded even when not complete).
    public var subscriptions: [AppleSubscriptionKey]
    public var redemptions: [RedemptionCandidate]
    /// `notification` or `history`.
    public var source: String

    public init(
        notification: AppleNotificationReceipt? = nil, transactions: [AppleSignedItem] = [], renewalInfos: [AppleSignedItem] = [],
        subscriptions: [AppleSubscriptionKey] = [], completeSubscriptions: [AppleSubscriptionKey] = [], redemptions: [RedemptionCandidate] = [],
        source: String
    ) {
        self.notification = notification
        self.transactions = transactions
        self.renewalInfos = renewalInfos
        self.subscriptions = subscriptions
        self.completeSubscriptions = completeSubscriptions
        self.redemptions = redemptions
        self.source = source
    }
}

/// One subscription of one app in one environment.
public struct AppleSubscriptionKey: Sendable, Hashable {
    public var bundleID: String
    public var environment: String
    public var originalTransactionID: String

    public init(bundleID: String, environment: String, originalTransactionID: String) {
        self.bundleID = bundleID
        self.environment = environment
        self.originalTransactionID = originalTransactionID
    }
}

/// The result of ``OfferSignerStore/recordAppleHistory(_:at:)``.
public enum AppleHistoryUpdateResult: Sendable, Equatable {
    /// The notification was recorded before: nothing was written.
    case duplicateNotification
    /// Recorded; with the redemptions that were new (each now has its `offer.redeemed` audit
    /// record) and those recorded unplaced before that this update placed (``OfferRedemption/placedAt``
    /// set; each has its `offer.redemption_placed` record; one that only continued a redemption
    /// was removed and comes back unmatched with ``OfferRedemption/candidate`` `continuesRedemption`).
    case recorded(redemptions: [OfferRedemption])
}

/// A subscription's stored history.
public struct StoredAppleHistory: Sendable, Equatable {
    public var subscription: AppleSubscriptionKey
    /// Whether the store holds the subscription's whole history (see ``AppleHistoryUpdate/completeSubscriptions``).
    public var isComplete: Bool
    /// When the history last changed.
    public var updatedAt: Date
    public var transactions: [AppleSignedItem]
    public var renewalInfos: [AppleSignedItem]

    public init(subscription: AppleSubscriptionKey, isComplete: Bool, updatedAt: Date, transactions: [AppleSignedItem], renewalInfos: [AppleSignedItem]) {
        self.subscription = subscription
        self.isComplete = isComplete
        self.updatedAt = updatedAt
        self.transactions = transactions
        self.renewalInfos = renewalInfos
    }
}

/// A stored history's identity and version (see ``OfferSignerStore/appleHistoryVersion(bundleID:environment:transactionID:)``).
public struct StoredAppleHistoryVersion: Sendable, Equatable {
    public var subscription: AppleSubscriptionKey
    public var isComplete: Bool
    /// When the history last changed: different after every write of it.
    public var updatedAt: Date

    public init(subscription: AppleSubscriptionKey, isComplete: Bool, updatedAt: Date) {
        self.subscription = subscription
        self.isComplete = isComplete
        self.updatedAt = updatedAt
    }
}

/// Issuances of one offer (one per signing request, whatever its number of formats).
public struct OfferIssuanceCount: Sendable, Equatable {
    public var bundleID: String
    public var offerID: String
    public var issuances: Int64

    public init(bundleID: String, offerID: String, issuances: Int64) {
        self.bundleID = bundleID
        self.offerID = offerID
        self.issuances = issuances
    }
}
