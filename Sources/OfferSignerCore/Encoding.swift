import Foundation

/// Byte encodings used in signatures: standard Base64 (legacy signatures), unpadded
/// base64url (JWS) and lowercase hex (fingerprints, hashes).
public enum Encoding {
    /// base64url without padding (RFC 7515 §2; the alphabet of RFC 4648 §5): every 3 bytes become
    /// 4 characters, a final 1 or 2 bytes become 2 or 3.
    public static func base64URL(_ bytes: some DataProtocol) -> String {
        let count = bytes.count
        guard count > 0 else { return "" }
        let length = count / 3 * 4 + [0, 2, 3][count % 3]
        return String(unsafeUninitializedCapacity: length) { out in
            var index = 0
            var group: UInt32 = 0
            var held = 0
            for byte in bytes {
                group = group << 8 | UInt32(byte)
                held += 1
                if held == 3 {
                    out[index] = base64URLDigit(group >> 18)
                    out[index + 1] = base64URLDigit(group >> 12)
                    out[index + 2] = base64URLDigit(group >> 6)
                    out[index + 3] = base64URLDigit(group)
                    index += 4
                    group = 0
                    held = 0
                }
            }
            if held == 1 {
                out[index] = base64URLDigit(group >> 2)
                out[index + 1] = base64URLDigit(group << 4)
                index += 2
            } else if held == 2 {
                out[index] = base64URLDigit(group >> 10)
                out[index + 1] = base64URLDigit(group >> 4)
                out[index + 2] = base64URLDigit(group << 2)
                index += 3
            }
            return index
        }
    }

    /// The base64url character of the low 6 bits of `value`.
    @inline(__always)
    static func base64URLDigit(_ value: UInt32) -> UInt8 {
        let digit = UInt8(truncatingIfNeeded: value & 63)
        switch digit {
        case 0..<26: return UInt8(ascii: "A") &+ digit
        case 26..<52: return UInt8(ascii: "a") &+ (digit &- 26)
        case 52..<62: return UInt8(ascii: "0") &+ (digit &- 52)
        case 62: return UInt8(ascii: "-")
        default: return UInt8(ascii: "_")
        }
    }

    /// Decodes base64url, padded or not. Returns nil for any character outside the
    /// base64url alphabet.
    ///
    /// Rule: only `A`–`Z`, `a`–`z`, `0`–`9`, `-`, `_` and `=` are accepted, anywhere; every `=`
    /// is dropped; what remains is decoded as standard Base64 after `-` → `+` and `_` → `/`,
    /// padded to a multiple of 4 (a remainder of 1 is refused), by Foundation's decoder.
    public static func decodeBase64URL(_ text: some StringProtocol) -> Data? {
        var standard = [UInt8]()
        standard.reserveCapacity(text.utf8.count + 3)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                standard.append(byte)
            case UInt8(ascii: "-"): standard.append(UInt8(ascii: "+"))
            case UInt8(ascii: "_"): standard.append(UInt8(ascii: "/"))
            case UInt8(ascii: "="): continue
            default: return nil
            }
        }
        let remainder = standard.count % 4
        if remainder == 1 { return nil }
        if remainder > 0 { standard.append(contentsOf: repeatElement(UInt8(ascii: "="), count: 4 - remainder)) }
        return Data(base64Encoded: String(decoding: standard, as: UTF8.self))
    }

    /// Decodes strict standard Base64 (RFC 4648 §4, padded).
    public static func decodeBase64(_ text: some StringProtocol) -> Data? {
        Data(base64Encoded: String(text))
    }

    /// The lowercase hex digit of a nibble (0...15).
    @inlinable
    public static func hexDigit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") &+ nibble : UInt8(ascii: "a") &+ (nibble &- 10)
    }

    /// Lowercase hex, two digits per byte.
    public static func hex(_ bytes: some ContiguousBytes) -> String {
        bytes.withUnsafeBytes { raw in
            String(unsafeUninitializedCapacity: raw.count * 2) { out in
                var index = 0
                for byte in raw {
                    out[index] = hexDigit(byte >> 4)
                    out[index + 1] = hexDigit(byte & 0x0F)
                    index += 2
                }
                return index
            }
        }
    }
}
