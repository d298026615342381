import Foundation
import OfferSignerCore
import Testing

/// base64url written and read byte by byte gives exactly what Foundation's Base64 with the
/// RFC 4648 §5 substitutions gives (the implementation it replaced, kept here as the reference).
@Suite("base64url")
struct EncodingTests {
    /// The earlier encoder: Foundation's Base64, `+/` replaced, padding dropped.
    static func referenceBase64URL(_ bytes: Data) -> String {
        var text = bytes.base64EncodedString()
        text = text.replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }

    /// The earlier decoder: every character checked as a `Character`, substitutions undone,
    /// padding dropped and added back, Foundation's decoder.
    static func referenceDecode(_ text: String) -> Data? {
        guard text.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "=") }) else { return nil }
        var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        standard = standard.replacingOccurrences(of: "=", with: "")
        let remainder = standard.utf8.count % 4
        if remainder == 1 { return nil }
        if remainder > 0 { standard += String(repeating: "=", count: 4 - remainder) }
        return Data(base64Encoded: standard)
    }

    @Test("RFC 4648 §10 test vectors, in the URL alphabet without padding")
    func vectors() {
        let vectors = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE", "foobar": "Zm9vYmFy"]
        for (plain, encoded) in vectors {
            #expect(Encoding.base64URL(Data(plain.utf8)) == encoded)
            #expect(Encoding.decodeBase64URL(encoded) == Data(plain.utf8))
        }
        // Every 6-bit value, both substituted characters among them.
        #expect(Encoding.base64URL(Data([0xFB, 0xFF, 0xBF])) == "-_-_")
        #expect(Encoding.decodeBase64URL("-_-_") == Data([0xFB, 0xFF, 0xBF]))
    }

    @Test("Any bytes, every length from 0 to 300 and some longer: the same text as the reference, and read back")
    func matchesTheReference() {
        var random = SeededGenerator()
        var lengths = Array(0...300)
        lengths += (0..<50).map { _ in Int.random(in: 301...5000, using: &random) }
        for length in lengths {
            let bytes = Data((0..<length).map { _ in UInt8.random(in: 0...255, using: &random) })
            let encoded = Encoding.base64URL(bytes)
            #expect(encoded == Self.referenceBase64URL(bytes), "seed \(random.seed), length \(length)")
            #expect(Encoding.decodeBase64URL(encoded) == bytes, "seed \(random.seed), length \(length)")
            // Not only Data: any DataProtocol (a slice, an array).
            #expect(Encoding.base64URL(Array(bytes)) == encoded)
            #expect(Encoding.base64URL(bytes.dropFirst(0)) == encoded)
        }
    }

    @Test("Any text, well formed or not: decoded exactly as the reference decodes it (nil where it refuses)")
    func decodesAsTheReference() async {
        var random = SeededGenerator()
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        let odd: [Character] = ["=", "+", "/", " ", "\n", "\r\n", ".", "é", "🙂", "\u{0}", "%", "e\u{301}", "Ａ", "٣"]
        for round in 0..<20_000 {
            // Seconds of CPU in a debug build: let other work on the concurrency pool (the
            // servers of other tests) run now and then.
            if round.isMultiple(of: 500) { await Task.yield() }
            let length = Int.random(in: 0...40, using: &random)
            let text = String((0..<length).map { _ -> Character in
                Int.random(in: 0..<10, using: &random) == 0 ? odd.randomElement(using: &random)! : alphabet.randomElement(using: &random)!
            })
            #expect(Encoding.decodeBase64URL(text) == Self.referenceDecode(text), "seed \(random.seed), text \(text.debugDescription)")
            #expect(Encoding.decodeBase64URL(Substring(text)) == Self.referenceDecode(text))
        }
        for text in ["", "=", "A", "AB", "AB=", "AB==", "A=B", "ABC", "ABCD", "ABCDE", "QR", "QS", "QQ", "Zg=", "Zg===", "Z g", "Zm9v\n"] {
            #expect(Encoding.decodeBase64URL(text) == Self.referenceDecode(text), "\(text.debugDescription)")
        }
    }

    @Test("UTF8Bytes: equal bytes are equal with equal hashes; canonically equivalent strings of other bytes are not equal")
    func utf8Bytes() {
        func hash(_ text: String) -> Int {
            var hasher = Hasher()
            UTF8Bytes.hash(text, into: &hasher)
            return hasher.finalize()
        }
        let pairs: [(String, String, Bool)] = [
            ("", "", true), ("a", "a", true), ("caf\u{E9}", "caf\u{E9}", true), ("caf\u{E9}", "cafe\u{301}", false),
            ("abc", "abd", false), ("abc", "abcd", false), ("", "a", false), (String(repeating: "x", count: 5000), String(repeating: "x", count: 5000), true),
        ]
        for (a, b, same) in pairs {
            #expect(UTF8Bytes.equal(a, b) == same, "\(a.debugDescription) \(b.debugDescription)")
            #expect(UTF8Bytes.equal(a, b) == (Array(a.utf8) == Array(b.utf8)))
            if same { #expect(hash(a) == hash(b)) }
        }
        #expect("caf\u{E9}" == "cafe\u{301}", "what Swift's own equality says")
        // A string that is a slice of another: the same bytes, the same answer.
        let whole = "prefix-caf\u{E9}"
        #expect(UTF8Bytes.equal(String(whole.dropFirst(7)), "caf\u{E9}"))
    }
}

