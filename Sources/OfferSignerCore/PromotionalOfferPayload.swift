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
        // Appended into one string of the right capacity (`joined` of an array of seven cost
        // about twice as much on the signing path).
        let separator = Self.separator
        var text = ""
        text.reserveCapacity(bundleID.utf8.count + keyID.utf8.count + productID.utf8.count + offerID.utf8.count + 36 + 36 + 20 + 6 * 3)
        text += bundleID
        text += separator
        text += keyID
        text += separator
        text += productID
        text += separator
        text += offerID
        text += separator
        if let appAccountToken { text += appAccountToken.lowercasedString }
        text += separator
        text += nonce.lowercasedString
        text += separator
        text += String(timestamp)
        return text
    }

    /// The exact bytes that are signed: ``signedString`` in UTF-8.
    public var signedBytes: Data { Data(signedString.utf8) }

    /// When StoreKit stops accepting the signature: 24 hours after ``timestamp``.
    public var expiresAt: Date { Date(timeIntervalSince1970: Double(timestamp + Self.validityMilliseconds) / 1000) }
}

extension Date {
    /// UNIX time in whole milliseconds.
    public var unixMilliseconds: Int64 { Int64((timeIntervalSince1970 * 1000).rounded(.down)) }

    /// RFC 3339 in UTC with exactly three fractional digits, computed from whole milliseconds
    /// so that a timestamp and the time printed for it never disagree by rounding.
    public static func rfc3339(milliseconds: Int64) -> String {
        // Civil date from days since the epoch (Howard Hinnant's algorithm): exact and fast,
        // with no formatter or calendar on the signing path.
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        let fraction = milliseconds - seconds * 1000
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let secondOfDay = seconds - days * 86_400
        let shifted = days + 719_468
        let era = (shifted >= 0 ? shifted : shifted - 146_096) / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        // Written as bytes into a string of its exact length (string interpolation of padded
        // parts cost about 8,000 instructions a response). Years outside 0...9999 are written
        // with as many digits as they need, as before.
        guard (0...9999).contains(year) else {
            func pad(_ value: Int64, _ width: Int) -> String {
                let digits = String(value)
                return digits.count >= width ? digits : String(repeating: "0", count: width - digits.count) + digits
            }
            return "\(pad(year, 4))-\(pad(month, 2))-\(pad(day, 2))T\(pad(secondOfDay / 3600, 2)):\(pad(secondOfDay / 60 % 60, 2)):\(pad(secondOfDay % 60, 2)).\(pad(fraction, 3))Z"
        }
        return String(unsafeUninitializedCapacity: 24) { out in
            var position = 0
            func put(_ value: Int64, _ width: Int) {
                var value = value
                for offset in stride(from: width - 1, through: 0, by: -1) {
                    out[position + offset] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
                position += width
            }
            func put(_ byte: Unicode.Scalar) {
                out[position] = UInt8(ascii: byte)
                position += 1
            }
            put(year, 4); put("-"); put(month, 2); put("-"); put(day, 2); put("T")
            put(secondOfDay / 3600, 2); put(":"); put(secondOfDay / 60 % 60, 2); put(":"); put(secondOfDay % 60, 2); put(".")
            put(fraction, 3); put("Z")
            return position
        }
    }
}
