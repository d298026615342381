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
        // Fast path: printable ASCII without surrounding spaces needs no Unicode tables.
        // Read as one contiguous buffer where the string has one (native strings do): walking
        // `String.UTF8View` by index cost about 800 instructions a field on the signing path.
        let utf8 = value.utf8
        let isPlainASCII = utf8.withContiguousStorageIfAvailable { bytes in
            bytes.allSatisfy { $0 >= 0x20 && $0 < 0x7F } && bytes.first != 0x20 && bytes.last != 0x20
        } ?? (utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F } && utf8.first != 0x20 && utf8.last != 0x20)
        if isPlainASCII {
            return
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
        guard let uuid = UUID.parse(value) else {
            throw OfferSignerError(code: .invalidAppAccountToken, field: "appAccountToken", message: "appAccountToken '\(printable(value))' is not a UUID (8-4-4-4-12 hex digits)")
        }
        return uuid
    }

    /// Parses a nonce: a UUID in any case.
    public static func parseNonce(_ value: String) throws(OfferSignerError) -> UUID {
        guard let uuid = UUID.parse(value) else {
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
    /// The lowercase 8-4-4-4-12 form that goes into signed payloads. (Written by hand: on
    /// Linux `uuidString` goes through `sprintf`, which shows on the signing path.)
    public var lowercasedString: String {
        withUnsafeBytes(of: uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { out in
                var position = 0
                for index in 0..<16 {
                    if index == 4 || index == 6 || index == 8 || index == 10 {
                        out[position] = UInt8(ascii: "-")
                        position += 1
                    }
                    let byte = bytes[index]
                    out[position] = Encoding.hexDigit(byte >> 4)
                    out[position + 1] = Encoding.hexDigit(byte & 0x0F)
                    position += 2
                }
                return position
            }
        }
    }

    /// A time-ordered UUID (version 7, RFC 9562 §5.7): 48 bits of UNIX milliseconds, then 74
    /// random bits. Used for nonces: as unique and unguessable as a random UUID for StoreKit,
    /// and it lets the ledger's unique index on nonces grow at its end instead of at random
    /// places, which keeps audit commits small.
    public static func timeOrdered(at date: Date = Date()) -> UUID {
        var random = SystemRandomNumberGenerator()
        let milliseconds = UInt64(max(0, date.unixMilliseconds))
        let high = random.next() as UInt64
        let low = random.next() as UInt64
        var bytes = [UInt8](repeating: 0, count: 16)
        for index in 0..<6 { bytes[index] = UInt8(truncatingIfNeeded: milliseconds >> (8 * (5 - index))) }
        bytes[6] = 0x70 | UInt8(truncatingIfNeeded: high & 0x0F)
        bytes[7] = UInt8(truncatingIfNeeded: high >> 8)
        bytes[8] = 0x80 | UInt8(truncatingIfNeeded: low & 0x3F)
        for index in 9..<16 { bytes[index] = UInt8(truncatingIfNeeded: low >> (8 * (index - 8))) }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }

    /// Parses the 8-4-4-4-12 form in any case (what `UUID(uuidString:)` accepts), without
    /// `sscanf`.
    public static func parse(_ text: String) -> UUID? {
        let utf8 = Array(text.utf8)
        guard utf8.count == 36 else { return nil }
        var bytes = [UInt8](repeating: 0, count: 16)
        var byteIndex = 0
        var index = 0
        func nibble(_ character: UInt8) -> UInt8? {
            switch character {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return character - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return character - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): return character - UInt8(ascii: "A") + 10
            default: return nil
            }
        }
        while index < 36 {
            if index == 8 || index == 13 || index == 18 || index == 23 {
                guard utf8[index] == UInt8(ascii: "-") else { return nil }
                index += 1
                continue
            }
            guard let high = nibble(utf8[index]), let low = nibble(utf8[index + 1]) else { return nil }
            bytes[byteIndex] = high << 4 | low
            byteIndex += 1
            index += 2
        }
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }
}
