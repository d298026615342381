import Foundation

/// Validation of the fields that go into a signed payload.
///
/// Rules: identifiers are non-empty, at most ``maximumIdentifierBytes`` UTF-8 bytes, without
/// leading or trailing whitespace, and contain no control character (Unicode Cc) and no
/// invisible format character (Unicode Cf, which includes U+2063, the payload separator).
/// UUIDs are the 8-4-4-4-12 hex form in any case. Timestamps are UNIX milliseconds between
/// 2001-09-09 (10^12 ms) and 2100-01-01.
public enum OfferFieldValidator {
    /// The longest identifier accepted, in UTF-8 bytes.
    public static let maximumIdentifierBytes = 255
    /// The smallest accepted timestamp: 10^12 ms (2001-09-09). Anything smaller is almost
    /// certainly seconds.
    public static let minimumTimestamp: Int64 = 1_000_000_000_000
    /// The largest accepted timestamp (exclusive): 2100-01-01T00:00:00Z in ms.
    public static let maximumTimestamp: Int64 = 4_102_444_800_000

    /// Validates an identifier field (bundle ID, key ID, product ID, offer ID, issuer ID,
    /// transaction ID).
    public static func validateIdentifier(_ value: String, field: String) throws(OfferSignerError) {
        if value.isEmpty {
            throw OfferSignerError(code: .fieldEmpty, field: field, message: "\(field) is empty")
        }
        let byteCount = value.utf8.count
        if byteCount > maximumIdentifierBytes {
            throw OfferSignerError(code: .fieldTooLong, field: field, message: "\(field) is \(byteCount) bytes long; at most \(maximumIdentifierBytes) are accepted")
        }
        for scalar in value.unicodeScalars {
            switch scalar.properties.generalCategory {
            case .control, .format, .lineSeparator, .paragraphSeparator:
                let name = scalar.value == 0x2063 ? " (INVISIBLE SEPARATOR, the payload separator)" : ""
                throw OfferSignerError(code: .fieldInvalidCharacter, field: field, message: "\(field) contains the invisible character \(codePoint(scalar))\(name)")
            default:
                continue
            }
        }
        if let first = value.unicodeScalars.first, let last = value.unicodeScalars.last,
            first.properties.isWhitespace || last.properties.isWhitespace
        {
            throw OfferSignerError(code: .fieldInvalidCharacter, field: field, message: "\(field) has leading or trailing whitespace")
        }
    }

    /// Parses an appAccountToken: empty means none; otherwise a UUID in any case.
    public static func parseAppAccountToken(_ value: String) throws(OfferSignerError) -> UUID? {
        if value.isEmpty { return nil }
        guard let uuid = UUID(uuidString: value) else {
            throw OfferSignerError(code: .invalidAppAccountToken, field: "appAccountToken", message: "appAccountToken '\(printable(value))' is not a UUID (8-4-4-4-12 hex digits)")
        }
        return uuid
    }

    /// Parses a nonce: a UUID in any case.
    public static func parseNonce(_ value: String) throws(OfferSignerError) -> UUID {
        guard let uuid = UUID(uuidString: value) else {
            throw OfferSignerError(code: .invalidNonce, field: "nonce", message: "nonce '\(printable(value))' is not a UUID (8-4-4-4-12 hex digits)")
        }
        return uuid
    }

    /// Checks a timestamp is plausible UNIX milliseconds.
    public static func validateTimestamp(_ milliseconds: Int64) throws(OfferSignerError) {
        if milliseconds >= 1_000_000_000 && milliseconds < minimumTimestamp {
            throw OfferSignerError(code: .timestampOutOfRange, field: "timestamp", message: "timestamp \(milliseconds) looks like seconds; StoreKit wants UNIX time in milliseconds (\(milliseconds * 1000))")
        }
        guard milliseconds >= minimumTimestamp && milliseconds < maximumTimestamp else {
            throw OfferSignerError(code: .timestampOutOfRange, field: "timestamp", message: "timestamp \(milliseconds) is out of range; expected UNIX time in milliseconds between \(minimumTimestamp) and \(maximumTimestamp)")
        }
    }

    static func codePoint(_ scalar: Unicode.Scalar) -> String {
        let hex = String(scalar.value, radix: 16, uppercase: true)
        return "U+" + String(repeating: "0", count: max(0, 4 - hex.count)) + hex
    }

    /// The value with invisible characters shown as `U+XXXX`, clipped, for error messages.
    static func printable(_ value: String) -> String {
        var out = ""
        for scalar in value.unicodeScalars.prefix(80) {
            switch scalar.properties.generalCategory {
            case .control, .format, .lineSeparator, .paragraphSeparator: out += "<\(codePoint(scalar))>"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return value.unicodeScalars.count > 80 ? out + "…" : out
    }
}

extension UUID {
    /// The lowercase 8-4-4-4-12 form that goes into signed payloads.
    public var lowercasedString: String { uuidString.lowercased() }
}
