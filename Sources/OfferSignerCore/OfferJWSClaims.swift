import Foundation

/// The audience of an offer JWS, which also says what kind of request it signs.
public enum OfferJWSAudience: String, Sendable, Codable, CaseIterable {
    /// A promotional offer (StoreKit's `promotionalOffer(_:compactJWS:)`).
    case promotionalOffer = "promotional-offer"
    /// An introductory-offer eligibility override.
    case introductoryOfferEligibility = "introductory-offer-eligibility"
}

/// The protected header of an offer JWS: `{"alg":"ES256","kid":…,"typ":"JWT"}`.
public struct OfferJWSHeader: Sendable, Codable, Equatable {
    public var alg: String
    public var kid: String
    public var typ: String?

    public init(keyID: String) {
        alg = "ES256"
        kid = keyID
        typ = "JWT"
    }

    /// The header as JSON, keys sorted as PyJWT writes them.
    var json: String {
        var writer = JSONObjectWriter()
        writer.field("alg", alg)
        writer.field("kid", kid)
        if let typ { writer.field("typ", typ) }
        return writer.finish()
    }
}

/// The claims of an offer JWS, as Apple's App Store Server Library creates them.
///
/// Rules: common claims `iss` (issuer ID), `iat` (seconds), `aud`, `bid` (bundle ID) and
/// `nonce` (a fresh lowercase UUID); no `exp`. A promotional offer adds `productId`,
/// `offerIdentifier` and optionally `transactionId`; an introductory-offer eligibility adds
/// `productId`, `allowIntroductoryOffer` and `transactionId` (required).
public struct OfferJWSClaims: Sendable, Codable, Equatable {
    public var iss: String
    public var iat: Int64
    public var aud: String
    public var bid: String
    public var nonce: String
    public var productId: String
    public var offerIdentifier: String?
    public var transactionId: String?
    public var allowIntroductoryOffer: Bool?

    /// Claims for a promotional offer.
    public static func promotionalOffer(
        issuerID: String, bundleID: String, productID: String, offerID: String,
        transactionID: String?, issuedAt: Date, nonce: UUID
    ) throws(OfferSignerError) -> OfferJWSClaims {
        try OfferFieldValidator.validateIdentifier(issuerID, field: "issuerID")
        try OfferFieldValidator.validateIdentifier(bundleID, field: "bundleID")
        try OfferFieldValidator.validateIdentifier(productID, field: "productID")
        try OfferFieldValidator.validateIdentifier(offerID, field: "offerID")
        if let transactionID { try OfferFieldValidator.validateIdentifier(transactionID, field: "transactionID") }
        return OfferJWSClaims(
            iss: issuerID, iat: Int64(issuedAt.timeIntervalSince1970.rounded(.down)), aud: OfferJWSAudience.promotionalOffer.rawValue,
            bid: bundleID, nonce: nonce.lowercasedString, productId: productID, offerIdentifier: offerID,
            transactionId: transactionID, allowIntroductoryOffer: nil)
    }

    /// Claims for an introductory-offer eligibility override.
    public static func introductoryOfferEligibility(
        issuerID: String, bundleID: String, productID: String, allowIntroductoryOffer: Bool,
        transactionID: String, issuedAt: Date, nonce: UUID
    ) throws(OfferSignerError) -> OfferJWSClaims {
        try OfferFieldValidator.validateIdentifier(issuerID, field: "issuerID")
        try OfferFieldValidator.validateIdentifier(bundleID, field: "bundleID")
        try OfferFieldValidator.validateIdentifier(productID, field: "productID")
        try OfferFieldValidator.validateIdentifier(transactionID, field: "transactionID")
        return OfferJWSClaims(
            iss: issuerID, iat: Int64(issuedAt.timeIntervalSince1970.rounded(.down)), aud: OfferJWSAudience.introductoryOfferEligibility.rawValue,
            bid: bundleID, nonce: nonce.lowercasedString, productId: productID, offerIdentifier: nil,
            transactionId: transactionID, allowIntroductoryOffer: allowIntroductoryOffer)
    }

    /// The claims as JSON, in the order Apple's library emits them: feature claims, then
    /// `bid`, `iss`, `aud`, `iat`, `nonce`.
    var json: String {
        var writer = JSONObjectWriter()
        writer.field("productId", productId)
        if let offerIdentifier { writer.field("offerIdentifier", offerIdentifier) }
        if let allowIntroductoryOffer { writer.field("allowIntroductoryOffer", allowIntroductoryOffer) }
        if let transactionId { writer.field("transactionId", transactionId) }
        writer.field("bid", bid)
        writer.field("iss", iss)
        writer.field("aud", aud)
        writer.field("iat", iat)
        writer.field("nonce", nonce)
        return writer.finish()
    }

    /// Checks the claims hold what their audience requires; returns the first problem.
    func problem(expecting audience: OfferJWSAudience) -> String? {
        guard aud == audience.rawValue else { return "aud is '\(aud)', expected '\(audience.rawValue)'" }
        if UUID.parse(nonce) == nil || nonce != nonce.lowercased() { return "nonce '\(nonce)' is not a lowercase UUID" }
        switch audience {
        case .promotionalOffer:
            if offerIdentifier == nil { return "claim offerIdentifier is missing" }
            if allowIntroductoryOffer != nil { return "claim allowIntroductoryOffer does not belong in a promotional-offer JWS" }
        case .introductoryOfferEligibility:
            if allowIntroductoryOffer == nil { return "claim allowIntroductoryOffer is missing" }
            if transactionId == nil { return "claim transactionId is missing" }
            if offerIdentifier != nil { return "claim offerIdentifier does not belong in an introductory-offer-eligibility JWS" }
        }
        return nil
    }
}
