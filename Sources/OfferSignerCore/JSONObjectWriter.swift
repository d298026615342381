/// Writes one JSON object with its fields in the order given: signature documents keep
/// StoreKit's field order and JWS segments keep the order Apple's library emits.
/// Strings are escaped per RFC 8259 (quote, backslash, control characters); everything else
/// is written as UTF-8.
public struct JSONObjectWriter: Sendable {
    private var text = "{"
    private var isEmpty = true

    public init() {}

    private mutating func key(_ name: String) {
        if !isEmpty { text += "," }
        isEmpty = false
        Self.appendString(name, to: &text)
        text += ":"
    }

    /// A string field; `nil` writes `null`.
    public mutating func field(_ name: String, _ value: String?) {
        key(name)
        if let value { Self.appendString(value, to: &text) } else { text += "null" }
    }

    /// An integer field.
    public mutating func field(_ name: String, _ value: Int64) {
        key(name)
        text += String(value)
    }

    /// A boolean field.
    public mutating func field(_ name: String, _ value: Bool) {
        key(name)
        text += value ? "true" : "false"
    }

    /// A field whose value is already JSON text.
    public mutating func field(_ name: String, json: String) {
        key(name)
        text += json
    }

    /// The finished object.
    public func finish() -> String { text + "}" }

    /// A JSON string literal for `value`.
    public static func quoted(_ value: String) -> String {
        var out = ""
        appendString(value, to: &out)
        return out
    }

    private static func appendString(_ value: String, to out: inout String) {
        out += "\""
        var needsEscaping = false
        for byte in value.utf8 where byte < 0x20 || byte == 0x22 || byte == 0x5C {
            needsEscaping = true
            break
        }
        if !needsEscaping {
            out += value
        } else {
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case _ where scalar.value < 0x20:
                    let hex = String(scalar.value, radix: 16)
                    out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                default: out.unicodeScalars.append(scalar)
                }
            }
        }
        out += "\""
    }
}
