import Foundation

/// The payload of a legacy promotional-offer signature, as StoreKit rebuilds it to check
/// the signature.
///
/// Rule: the signed string is `bundleID, keyID, productID, offerID, appAccountToken, nonce,
/// timestamp` joined by U+2063 INVISIBLE SEPARATOR, with the appAccountToken (empty when
/// absent) and the nonce in lowercase and the timestamp in UNIX milliseconds — exactly what
/// Apple's App Store Server Library signs.
public struct PromotionalOfferPayload: Sendable, Hashable {
    /// The separator between fields: U+2063 INVISIBLE SEPARATOR.
    public static let separator = "\u{2063}"
    /// How long StoreKit accepts a signature after its timestamp: 24 hours, in ms.
    public static let validityMilliseconds: Int64 = 24 * 60 * 60 * 1000

    public let bundleID: String
    public let keyID: String
    public let productID: String
    public let offerID: String
    public let appAccountToken: UUID?
    public let nonce: UUID
    /// UNIX time in milliseconds.
    public let timestamp: Int64

    /// Builds a payload, validating every field (see ``OfferFieldValidator``).
    public init(
        bundleID: String, keyID: String, productID: String, offerID: String,
        appAccountToken: UUID?, nonce: UUID, timestamp: Int64
    ) throws(OfferSignerError) {
        try OfferFieldValidator.validateIdentifier(bundleID, field: "bundleID")
        try OfferFieldValidator.validateIdentifier(keyID, field: "keyID")
        try OfferFieldValidator.validateIdentifier(productID, field: "productID")
        try OfferFieldValidator.validateIdentifier(offerID, field: "offerID")
        try OfferFieldValidator.validateTimestamp(timestamp)
        self.bundleID = bundleID
        self.keyID = keyID
        self.productID = productID
        self.offerID = offerID
        self.appAccountToken = appAccountToken
        self.nonce = nonce
        self.timestamp = timestamp
    }

    /// Builds a payload from the textual form (token and nonce as strings in any case).
    public init(
        bundleID: String, keyID: String, productID: String, offerID: String,
        appAccountToken: String, nonce: String, timestamp: Int64
    ) throws(OfferSignerError) {
        try self.init(
            bundleID: bundleID, keyID: keyID, productID: productID, offerID: offerID,
            appAccountToken: OfferFieldValidator.parseAppAccountToken(appAccountToken),
            nonce: OfferFieldValidator.parseNonce(nonce), timestamp: timestamp)
    }

    /// The exact string that is signed.
    public var signedString: String {
        Self.join([bundleID, keyID, productID, offerID, appAccountToken?.lowercasedString ?? "", nonce.lowercasedString, String(timestamp)])
    }

    /// The exact bytes that are signed: ``signedString`` in UTF-8.
    public var signedBytes: Data { Data(signedString.utf8) }

    /// When StoreKit stops accepting the signature: 24 hours after ``timestamp``.
    public var expiresAt: Date { Date(timeIntervalSince1970: Double(timestamp + Self.validityMilliseconds) / 1000) }

    static func join(_ fields: [String], separator: String = PromotionalOfferPayload.separator) -> String {
        fields.joined(separator: separator)
    }
}

extension Date {
    /// UNIX time in whole milliseconds.
    public var unixMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }

    /// RFC 3339 in UTC with exactly three fractional digits, computed from whole milliseconds
    /// so that a timestamp and the time printed for it never disagree by rounding.
    public static func rfc3339(milliseconds: Int64) -> String {
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        let fraction = milliseconds - seconds * 1000
        let whole = Date(timeIntervalSince1970: Double(seconds)).formatted(Date.ISO8601FormatStyle(timeZone: TimeZone(identifier: "UTC")!))
        let digits = String(fraction)
        return String(whole.dropLast()) + "." + String(repeating: "0", count: 3 - digits.count) + digits + "Z"
    }
}
