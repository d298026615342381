import Foundation

/// A signature format the service can produce for a promotional offer.
public enum SignatureFormat: String, Sendable, Hashable, Codable, CaseIterable {
    /// The original promotional-offer signature: key ID, nonce, timestamp and a Base64 DER ECDSA
    /// signature. Understood by every StoreKit version (`SKPaymentDiscount` and StoreKit 2).
    case legacy
    /// The compact JWS promotional-offer signature (StoreKit's
    /// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)`).
    case jws
}

/// Apple-signed purchase history the app forwards so the service can check eligibility.
///
/// On iOS the strings are the `jwsRepresentation` of StoreKit 2 `VerificationResult<Transaction>`
/// and `VerificationResult<Product.SubscriptionInfo.RenewalInfo>` values. The service verifies them
/// itself; the client only carries them.
public struct PurchaseEvidence: Sendable, Hashable, Codable {
    /// Signed transactions (JWS compact serialization).
    public var signedTransactions: [String]
    /// Signed subscription renewal infos (JWS compact serialization).
    public var signedRenewalInfos: [String]

    public init(signedTransactions: [String] = [], signedRenewalInfos: [String] = []) {
        self.signedTransactions = signedTransactions
        self.signedRenewalInfos = signedRenewalInfos
    }
}

/// The original-format promotional-offer signature, as returned by the service.
public struct LegacyOfferSignature: Sendable, Hashable {
    /// The App Store Connect In-App Purchase key identifier.
    public let keyID: String
    /// The single-use nonce the signature covers.
    public let nonce: UUID
    /// When the signature was made, in UNIX milliseconds (what StoreKit calls `timestamp`).
    public let timestamp: Int64
    /// The signature exactly as the service sent it: standard Base64 of a DER ECDSA signature.
    /// This is what `SKPaymentDiscount` wants.
    public let signature: String
    /// The Base64-decoded signature bytes. This is what StoreKit 2 wants.
    ///
    /// Never pass `Data(signature.utf8)` to StoreKit: that is the bytes of the Base64 text, not the
    /// signature, and the App Store rejects the purchase.
    public let signatureData: Data

    /// Creates a signature value; throws ``OfferSignerClientError/invalidResponse(_:)`` when
    /// `signature` is not valid standard Base64.
    public init(keyID: String, nonce: UUID, timestamp: Int64, signature: String) throws {
        guard let decoded = Data(base64Encoded: signature), !decoded.isEmpty else {
            throw OfferSignerClientError.invalidResponse("legacy.signature is not standard Base64")
        }
        self.keyID = keyID
        self.nonce = nonce
        self.timestamp = timestamp
        self.signature = signature
        self.signatureData = decoded
    }
}

extension LegacyOfferSignature: Codable {
    private enum CodingKeys: String, CodingKey {
        case keyID, nonce, timestamp, signature
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let nonceText = try container.decode(String.self, forKey: .nonce)
        guard let nonce = UUID(uuidString: nonceText) else {
            throw DecodingError.dataCorruptedError(forKey: .nonce, in: container, debugDescription: "not a UUID")
        }
        let signature = try container.decode(String.self, forKey: .signature)
        do {
            try self.init(
                keyID: container.decode(String.self, forKey: .keyID),
                nonce: nonce,
                timestamp: container.decode(Int64.self, forKey: .timestamp),
                signature: signature
            )
        } catch let error as OfferSignerClientError {
            throw DecodingError.dataCorruptedError(
                forKey: .signature, in: container, debugDescription: error.description
            )
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(keyID, forKey: .keyID)
        try container.encode(nonce.uuidString.lowercased(), forKey: .nonce)
        try container.encode(timestamp, forKey: .timestamp)
        try container.encode(signature, forKey: .signature)
    }
}

/// The compact-JWS promotional-offer signature, as returned by the service.
public struct JWSOfferSignature: Sendable, Hashable, Codable {
    /// The App Store Connect In-App Purchase key identifier (also the JWS `kid`).
    public let keyID: String
    /// The JWS compact serialization (`header.payload.signature`).
    public let compactJWS: String

    public init(keyID: String, compactJWS: String) {
        self.keyID = keyID
        self.compactJWS = compactJWS
    }
}

/// A signed promotional offer: mirrors the `201` body of `POST /v1/offers/signatures`.
///
/// A signature is single-use (its nonce) and must not be used after ``expiresAt``: fetch a new one
/// for each purchase attempt. ``purchasePlan(now:capabilities:)`` (and the StoreKit helpers built on
/// it) throw ``OfferSignerClientError/signatureExpired(expiresAt:)`` once it has expired.
public struct SignedPromotionalOffer: Sendable, Hashable {
    public let bundleID: String
    public let productID: String
    public let offerID: String
    /// The app account token the offer was signed for, if any; the StoreKit helpers add
    /// `.appAccountToken(_:)` with it. Only the ``legacy`` signature covers it (as
    /// `applicationUsername`: the App Store refuses a purchase whose token differs). Apple's JWS
    /// claims have no token (`productId`, `offerIdentifier`, optional `transactionId`, `bid`, `iss`,
    /// `aud`, `iat`, `nonce`): with ``jws`` the token is a separate purchase option, not covered by
    /// the signature.
    public let appAccountToken: UUID?
    /// Present when `.legacy` was requested.
    public let legacy: LegacyOfferSignature?
    /// Present when `.jws` was requested.
    public let jws: JWSOfferSignature?
    /// After this instant the signature must not be used.
    public let expiresAt: Date

    public init(
        bundleID: String,
        productID: String,
        offerID: String,
        appAccountToken: UUID?,
        legacy: LegacyOfferSignature?,
        jws: JWSOfferSignature?,
        expiresAt: Date
    ) {
        self.bundleID = bundleID
        self.productID = productID
        self.offerID = offerID
        self.appAccountToken = appAccountToken
        self.legacy = legacy
        self.jws = jws
        self.expiresAt = expiresAt
    }

    /// Whether the signature may no longer be used at `now`.
    public func isExpired(at now: Date = Date()) -> Bool {
        now >= expiresAt
    }

    /// For the original StoreKit API: the value to put in `SKMutablePayment.applicationUsername`
    /// (the lowercase app account token), or `nil` when the signature is not bound to one.
    public var applicationUsername: String? {
        appAccountToken.map { $0.uuidString.lowercased() }
    }
}

extension SignedPromotionalOffer: Codable {
    private enum CodingKeys: String, CodingKey {
        case bundleID, productID, offerID, appAccountToken, legacy, jws, expiresAt
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        var token: UUID?
        if let tokenText = try container.decodeIfPresent(String.self, forKey: .appAccountToken) {
            guard let parsed = UUID(uuidString: tokenText) else {
                throw DecodingError.dataCorruptedError(
                    forKey: .appAccountToken, in: container, debugDescription: "not a UUID"
                )
            }
            token = parsed
        }
        let expiresText = try container.decode(String.self, forKey: .expiresAt)
        guard let expiresAt = RFC3339.date(from: expiresText) else {
            throw DecodingError.dataCorruptedError(
                forKey: .expiresAt, in: container, debugDescription: "not an RFC 3339 date-time: \(expiresText)"
            )
        }
        self.init(
            bundleID: try container.decode(String.self, forKey: .bundleID),
            productID: try container.decode(String.self, forKey: .productID),
            offerID: try container.decode(String.self, forKey: .offerID),
            appAccountToken: token,
            legacy: try container.decodeIfPresent(LegacyOfferSignature.self, forKey: .legacy),
            jws: try container.decodeIfPresent(JWSOfferSignature.self, forKey: .jws),
            expiresAt: expiresAt
        )
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(bundleID, forKey: .bundleID)
        try container.encode(productID, forKey: .productID)
        try container.encode(offerID, forKey: .offerID)
        if let appAccountToken {
            try container.encode(appAccountToken.uuidString.lowercased(), forKey: .appAccountToken)
        } else {
            try container.encodeNil(forKey: .appAccountToken)
        }
        try container.encodeIfPresent(legacy, forKey: .legacy)
        try container.encodeIfPresent(jws, forKey: .jws)
        try container.encode(RFC3339.string(from: expiresAt), forKey: .expiresAt)
    }
}

/// The `200` body of `POST /v1/offers/eligibility`.
public struct OfferEligibility: Sendable, Hashable, Codable {
    public let decisions: [OfferEligibilityDecision]

    public init(decisions: [OfferEligibilityDecision]) {
        self.decisions = decisions
    }

    /// The decision for `offerID`, if the service returned one.
    public func decision(for offerID: String) -> OfferEligibilityDecision? {
        decisions.first { $0.offerID == offerID }
    }

    /// The offer IDs the customer is eligible for, in the service's order.
    public var eligibleOfferIDs: [String] {
        decisions.filter(\.eligible).map(\.offerID)
    }
}

// MARK: - Request bodies (wire format)

struct SignatureRequestBody: Encodable, Sendable {
    var productID: String
    var offerID: String
    var appAccountToken: String?
    var bundleID: String?
    /// `legacy`, `jws` or `intro-eligibility`; never empty (the service answers 400 to `[]`).
    var formats: [String]
    var transactionID: String?
    var evidence: PurchaseEvidence?
    /// With `intro-eligibility` only.
    var allowIntroductoryOffer: Bool?
    /// Apple's spelling of the customer's App Store environment, as the app declares it.
    var environment: String?
}

struct EligibilityRequestBody: Encodable, Sendable {
    var bundleID: String?
    var appAccountToken: String?
    var offerIDs: [String]?
    var evidence: PurchaseEvidence?
    var transactionID: String?
}
