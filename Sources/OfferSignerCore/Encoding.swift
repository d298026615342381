import Foundation

/// Byte encodings used in signatures: standard Base64 (legacy signatures), unpadded
/// base64url (JWS) and lowercase hex (fingerprints, hashes).
public enum Encoding {
    /// base64url without padding (RFC 7515 §2).
    public static func base64URL(_ bytes: some DataProtocol) -> String {
        var text = Data(bytes).base64EncodedString()
        text = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// Decodes base64url, padded or not. Returns nil for any character outside the
    /// base64url alphabet.
    public static func decodeBase64URL(_ text: some StringProtocol) -> Data? {
        guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "=") }) else {
            return nil
        }
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        standard = standard.replacingOccurrences(of: "=", with: "")
        let remainder = standard.utf8.count % 4
        if remainder == 1 { return nil }
        if remainder > 0 { standard += String(repeating: "=", count: 4 - remainder) }
        return Data(base64Encoded: standard)
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
