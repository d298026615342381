import Foundation
import OfferSignerCore
import Testing

/// The writer behind every response, audit body and JWS segment: exact bytes for the
/// everyday case, RFC 8259 escapes for the rest, and always JSON that parses back to the input.
@Suite struct JSONObjectWriterTests {
    @Test func writesFieldsInOrderWithExactBytes() {
        var inner = JSONObjectWriter()
        inner.field("n", Int64(-42))
        var writer = JSONObjectWriter()
        writer.field("b", "com.example.app")
        writer.field("a", nil as String?)
        writer.field("t", true)
        writer.field("f", false)
        writer.field("i", Int64.max)
        writer.field("o", json: inner.finish())
        writer.field("é", "日本🙂")
        #expect(writer.finish() == #"{"b":"com.example.app","a":null,"t":true,"f":false,"i":9223372036854775807,"o":{"n":-42},"é":"日本🙂"}"#)
        #expect(JSONObjectWriter().finish() == "{}")
    }

    @Test func escapesQuotesBackslashesAndControlCharacters() {
        #expect(JSONObjectWriter.quoted("a\"b\\c") == #""a\"b\\c""#)
        #expect(JSONObjectWriter.quoted("line\nfeed\rreturn\ttab") == #""line\nfeed\rreturn\ttab""#)
        #expect(JSONObjectWriter.quoted("\u{0}\u{1}\u{1F}\u{7F}") == "\"\\u0000\\u0001\\u001f\u{7F}\"")
        var writer = JSONObjectWriter()
        writer.field("k\"ey", "v\u{8}")
        #expect(writer.finish() == #"{"k\"ey":"v\u0008"}"#)
    }

    /// Random strings over an alphabet heavy in characters that need escaping, plus multi-byte
    /// UTF-8: the output always parses, to exactly the keys and values written.
    /// The writer tests eight bytes at a time whether a string needs escapes: every ASCII byte,
    /// at every position of a word and of the tail, next to plain and multi-byte neighbours,
    /// gives the escapes of a plain byte-by-byte reference.
    @Test func escapesEveryASCIIByteAtEveryPositionOfAWord() {
        func reference(_ value: String) -> String {
            var out = "\""
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case "\n": out += "\\n"
                case "\r": out += "\\r"
                case "\t": out += "\\t"
                case "\u{0}"..."\u{1F}": out += String(format: "\\u%04x", scalar.value)
                default: out.unicodeScalars.append(scalar)
                }
            }
            return out + "\""
        }
        var mismatches: [String] = []
        for filler in ["a", "é", "~"] {
            for length in [1, 7, 8, 9, 16, 21] {
                for position in 0..<length {
                    for byte in UInt8(0)...0x7F {
                        var scalars = Array(repeating: filler, count: length)
                        scalars[position] = String(UnicodeScalar(byte))
                        let value = scalars.joined()
                        if JSONObjectWriter.quoted(value) != reference(value) {
                            mismatches.append("byte \(byte) at \(position) of \(length) among '\(filler)'")
                        }
                    }
                }
            }
        }
        #expect(mismatches.isEmpty, "\(mismatches.prefix(10))")
    }

    @Test func randomStringsRoundTripThroughJSONSerialization() throws {
        var random = SeededGenerator()
        let alphabet: [Character] = ["a", "Z", "0", " ", "\"", "\\", "/", "\n", "\r", "\t", "\u{0}", "\u{1}", "\u{1F}", "\u{7F}", "é", "日", "🙂", "\u{2063}"]
        for _ in 0..<2_000 {
            let key = String((0..<Int.random(in: 0...12, using: &random)).map { _ in alphabet.randomElement(using: &random)! })
            let value = String((0..<Int.random(in: 0...40, using: &random)).map { _ in alphabet.randomElement(using: &random)! })
            var writer = JSONObjectWriter()
            writer.field(key, value)
            writer.field(key + "#n", Int64.random(in: Int64.min...Int64.max, using: &random))
            let text = writer.finish()
            let parsed = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            #expect(parsed?[key] as? String == value, "seed \(random.seed): \(text)")
            #expect(parsed?.count == 2, "seed \(random.seed): \(text)")
        }
    }
}
