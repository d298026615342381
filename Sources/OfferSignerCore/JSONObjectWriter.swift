/// Writes one JSON object with its fields in the order given: signature documents keep
/// StoreKit's field order and JWS segments keep the order Apple's library emits.
/// Strings are escaped per RFC 8259 (quote, backslash, control characters); everything else
/// is written as UTF-8.
public struct JSONObjectWriter: Sendable {
    /// UTF-8 of the object so far. Bytes rather than `String` appends: the signing path writes
    /// three objects per signature, and bytes measured about 4% less server CPU per signature.
    private var bytes: [UInt8]
    private var isEmpty = true

    public init() {
        bytes = []
        bytes.reserveCapacity(256)
        bytes.append(UInt8(ascii: "{"))
    }

    private mutating func key(_ name: String) {
        if !isEmpty { bytes.append(UInt8(ascii: ",")) }
        isEmpty = false
        Self.appendString(name, to: &bytes)
        bytes.append(UInt8(ascii: ":"))
    }

    /// A string field; `nil` writes `null`.
    public mutating func field(_ name: String, _ value: String?) {
        key(name)
        if let value { Self.appendString(value, to: &bytes) } else { bytes.append(contentsOf: "null".utf8) }
    }

    /// An integer field.
    public mutating func field(_ name: String, _ value: Int64) {
        key(name)
        Self.appendDecimal(value, to: &bytes)
    }

    /// Appends the decimal digits of `value` (no `String` made for them).
    static func appendDecimal(_ value: Int64, to out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 20 digits at most, written from the end
        withUnsafeMutableBytes(of: &digits) { buffer in
            var index = buffer.count
            repeat {
                index -= 1
                buffer[index] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            out.append(contentsOf: buffer[index...])
        }
    }

    /// A boolean field.
    public mutating func field(_ name: String, _ value: Bool) {
        key(name)
        bytes.append(contentsOf: (value ? "true" : "false").utf8)
    }

    /// A field whose value is already JSON text.
    public mutating func field(_ name: String, json: String) {
        key(name)
        bytes.append(contentsOf: json.utf8)
    }

    /// The finished object.
    public func finish() -> String {
        var finished = bytes
        finished.append(UInt8(ascii: "}"))
        return String(decoding: finished, as: UTF8.self)
    }

    /// A JSON string literal for `value`.
    public static func quoted(_ value: String) -> String {
        var out: [UInt8] = []
        appendString(value, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `value` as a JSON string literal. Escapes work byte by byte: every byte of a
    /// multi-byte UTF-8 sequence is 0x80 or above, so only ASCII bytes ever need escaping.
    /// Native strings are read as one contiguous buffer (walking `String.UTF8View` by index
    /// cost about 1,300 instructions a field on the signing path).
    private static func appendString(_ value: String, to out: inout [UInt8]) {
        var value = value
        value.withUTF8 { utf8 in appendString(utf8, to: &out) }
    }

    private static func appendString(_ utf8: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        var plain = true
        for byte in utf8 where byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
            plain = false
            break
        }
        if plain {
            out.append(contentsOf: utf8)
            out.append(UInt8(ascii: "\""))
            return
        }
        for byte in utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "\""))
            case UInt8(ascii: "\\"): out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "\\"))
            case UInt8(ascii: "\n"): out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "n"))
            case UInt8(ascii: "\r"): out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "r"))
            case UInt8(ascii: "\t"): out.append(UInt8(ascii: "\\")); out.append(UInt8(ascii: "t"))
            case 0..<0x20:
                out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"), Encoding.hexDigit(byte >> 4), Encoding.hexDigit(byte & 0xF)])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}
