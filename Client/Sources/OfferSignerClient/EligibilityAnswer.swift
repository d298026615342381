import Foundation

/// Evidence the service could not use, as it reports it: which item (`source` `signedTransaction`
/// or `signedRenewalInfo`, and its `index` in `signedTransactions` or `signedRenewalInfos`), a
/// stable `code` (e.g. `missing_apple_marker_oid`), and a human-readable `message`.
public struct EvidenceFailure: Sendable, Hashable, Codable {
    public var source: String
    public var index: Int
    public var code: String
    public var message: String

    public init(source: String, index: Int, code: String, message: String) {
        self.source = source
        self.index = index
        self.code = code
        self.message = message
    }
}

/// Whose history decided an offer: the service's `historySource` (`apple`, `client`, or `none`
/// when Apple could not answer and nothing else could decide). An open set: values the service
/// adds later come through as they are.
public struct HistorySource: RawRepresentable, Sendable, Hashable, Codable {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// Apple's App Store Server API answered.
    public static let apple = HistorySource(rawValue: "apple")
    /// The app's signed evidence decided.
    public static let client = HistorySource(rawValue: "client")
    /// Nothing could decide (Apple did not answer, no evidence to fall back on).
    public static let none = HistorySource(rawValue: "none")

    public init(from decoder: any Decoder) throws {
        rawValue = try decoder.singleValueContainer().decode(String.self)
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

/// Why the service refused an offer: the whole answer of a `403 not_eligible` (and of a negative
/// eligibility decision), so that the app can say when the customer may try again.
public struct OfferIneligibility: Sendable, Hashable {
    /// Machine-readable reasons, e.g. `redeemed_too_recently`, `currently_subscribed`.
    public var reasons: [String]
    /// When the waiting period that blocks the offer ends, if the service knows.
    public var eligibleFrom: Date?
    /// Whose history decided.
    public var historySource: HistorySource?
    /// Evidence items the service could not use (from the eligibility endpoint, and from the
    /// signing endpoint where the service reports them).
    public var evidenceFailures: [EvidenceFailure]
    /// The service's human-readable `detail`, if any.
    public var detail: String?

    public init(
        reasons: [String], eligibleFrom: Date? = nil, historySource: HistorySource? = nil,
        evidenceFailures: [EvidenceFailure] = [], detail: String? = nil
    ) {
        self.reasons = reasons
        self.eligibleFrom = eligibleFrom
        self.historySource = historySource
        self.evidenceFailures = evidenceFailures
        self.detail = detail
    }
}

/// The service's decision for one offer: mirrors an element of `decisions` in the `200` body of
/// `POST /v1/offers/eligibility`, every member included.
public struct OfferEligibilityDecision: Sendable, Hashable {
    public let offerID: String
    public let eligible: Bool
    /// Machine-readable reasons (for example why the customer is not eligible).
    public let reasons: [String]
    /// When the customer becomes eligible, if the service knows.
    public let eligibleFrom: Date?
    /// Evidence items the service could not use.
    public let evidenceFailures: [EvidenceFailure]
    /// Whose history decided (absent for offers without rules).
    public let historySource: HistorySource?

    public init(
        offerID: String, eligible: Bool, reasons: [String], eligibleFrom: Date? = nil,
        evidenceFailures: [EvidenceFailure] = [], historySource: HistorySource? = nil
    ) {
        self.offerID = offerID
        self.eligible = eligible
        self.reasons = reasons
        self.eligibleFrom = eligibleFrom
        self.evidenceFailures = evidenceFailures
        self.historySource = historySource
    }

    /// The refusal, when the customer is not eligible.
    public var ineligibility: OfferIneligibility? {
        eligible ? nil : OfferIneligibility(
            reasons: reasons, eligibleFrom: eligibleFrom, historySource: historySource, evidenceFailures: evidenceFailures)
    }
}

extension OfferEligibilityDecision: Codable {
    private enum CodingKeys: String, CodingKey {
        case offerID, eligible, reasons, eligibleFrom, evidenceFailures, historySource
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        var eligibleFrom: Date?
        if let text = try container.decodeIfPresent(String.self, forKey: .eligibleFrom) {
            guard let date = RFC3339.date(from: text) else {
                throw DecodingError.dataCorruptedError(
                    forKey: .eligibleFrom, in: container, debugDescription: "not an RFC 3339 date-time: \(text)"
                )
            }
            eligibleFrom = date
        }
        self.init(
            offerID: try container.decode(String.self, forKey: .offerID),
            eligible: try container.decode(Bool.self, forKey: .eligible),
            reasons: try container.decodeIfPresent([String].self, forKey: .reasons) ?? [],
            eligibleFrom: eligibleFrom,
            evidenceFailures: try container.decodeIfPresent([EvidenceFailure].self, forKey: .evidenceFailures) ?? [],
            historySource: try container.decodeIfPresent(HistorySource.self, forKey: .historySource)
        )
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(offerID, forKey: .offerID)
        try container.encode(eligible, forKey: .eligible)
        try container.encode(reasons, forKey: .reasons)
        try container.encodeIfPresent(eligibleFrom.map(RFC3339.string(from:)), forKey: .eligibleFrom)
        if !evidenceFailures.isEmpty { try container.encode(evidenceFailures, forKey: .evidenceFailures) }
        try container.encodeIfPresent(historySource, forKey: .historySource)
    }
}

extension PurchaseEvidence {
    /// The service's default limits on evidence: at most 1,000 JWS in one request
    /// (`too_much_evidence` above that) inside a request body of at most 1 MiB (`body_too_large`).
    public static let serviceMaximumItems = 1000
    public static let serviceMaximumBytes = 1 << 20
    /// Room left in the body for the request's other members and the JSON around each item.
    static let requestOverheadBytes = 4096

    /// Evidence that stays within the service's limits: every renewal info first (they say whether
    /// the subscription is active now), then transactions in the order given (pass them newest
    /// first), until either `maximumItems` items or `maximumBytes` bytes of JSON would be passed.
    ///
    /// - Returns: The evidence, and whether anything was left out.
    public static func bounded(
        signedTransactions: [String],
        signedRenewalInfos: [String],
        maximumItems: Int = serviceMaximumItems,
        maximumBytes: Int = serviceMaximumBytes
    ) -> (evidence: PurchaseEvidence, truncated: Bool) {
        var budget = maximumBytes - requestOverheadBytes
        var items = 0
        func take(_ candidates: [String]) -> [String] {
            var kept: [String] = []
            for jws in candidates {
                let cost = jws.utf8.count + 3  // quotes and comma
                guard items < maximumItems, cost <= budget else { break }
                kept.append(jws)
                budget -= cost
                items += 1
            }
            return kept
        }
        let renewalInfos = take(signedRenewalInfos)
        let transactions = renewalInfos.count == signedRenewalInfos.count ? take(signedTransactions) : []
        let truncated = renewalInfos.count < signedRenewalInfos.count || transactions.count < signedTransactions.count
        return (PurchaseEvidence(signedTransactions: transactions, signedRenewalInfos: renewalInfos), truncated)
    }
}

/// A signed introductory-offer eligibility: mirrors the `201` body of `POST /v1/offers/signatures`
/// with `formats: ["intro-eligibility"]`. Apply it with StoreKit's
/// `Product.PurchaseOption.introductoryOfferEligibility(compactJWS:)`.
public struct SignedIntroductoryOfferEligibility: Sendable, Hashable {
    public let bundleID: String
    public let productID: String
    /// The customer's transaction the signature is bound to.
    public let transactionID: String
    /// Whether the purchase may (true) or may not (false) carry the introductory offer.
    public let allowIntroductoryOffer: Bool
    /// The In-App Purchase key ID (the JWS `kid`).
    public let keyID: String
    /// The JWS compact serialization.
    public let compactJWS: String
    /// After this instant the signature must not be used.
    public let expiresAt: Date

    public init(
        bundleID: String, productID: String, transactionID: String, allowIntroductoryOffer: Bool, keyID: String,
        compactJWS: String, expiresAt: Date
    ) {
        self.bundleID = bundleID
        self.productID = productID
        self.transactionID = transactionID
        self.allowIntroductoryOffer = allowIntroductoryOffer
        self.keyID = keyID
        self.compactJWS = compactJWS
        self.expiresAt = expiresAt
    }

    /// Whether the signature may no longer be used at `now`.
    public func isExpired(at now: Date = Date()) -> Bool {
        now >= expiresAt
    }
}

extension SignedIntroductoryOfferEligibility: Decodable {
    private enum CodingKeys: String, CodingKey {
        case bundleID, productID, introEligibility, expiresAt
    }

    private enum SignatureKeys: String, CodingKey {
        case keyID, compactJWS, transactionID, allowIntroductoryOffer
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let signature = try container.nestedContainer(keyedBy: SignatureKeys.self, forKey: .introEligibility)
        let expiresText = try container.decode(String.self, forKey: .expiresAt)
        guard let expiresAt = RFC3339.date(from: expiresText) else {
            throw DecodingError.dataCorruptedError(
                forKey: .expiresAt, in: container, debugDescription: "not an RFC 3339 date-time: \(expiresText)")
        }
        self.init(
            bundleID: try container.decode(String.self, forKey: .bundleID),
            productID: try container.decode(String.self, forKey: .productID),
            transactionID: try signature.decode(String.self, forKey: .transactionID),
            allowIntroductoryOffer: try signature.decode(Bool.self, forKey: .allowIntroductoryOffer),
            keyID: try signature.decode(String.self, forKey: .keyID),
            compactJWS: try signature.decode(String.self, forKey: .compactJWS),
            expiresAt: expiresAt
        )
    }
}
