import Foundation
import Testing

@testable import OfferSignerServer

/// A request body that names a member twice is refused, whatever the nesting and however the
/// name is spelt; nothing else is mistaken for a duplicate.
@Suite struct JSONDuplicateMembersTests {
    struct Case: Sendable, CustomTestStringConvertible {
        var body: String
        var duplicate: String?
        var testDescription: String { body.debugDescription }
    }

    static let cases: [Case] = [
        // Duplicates, with the path of the second occurrence.
        Case(body: #"{"productID":"a","offerID":"o","productID":"b"}"#, duplicate: "productID"),
        Case(body: #"{"productID":"a","productID":"a"}"#, duplicate: "productID"),
        Case(body: #" { "a" : 1 , "a" : 2 } "#, duplicate: "a"),
        Case(body: #"{"evidence":{"signedTransactions":[],"signedTransactions":["x"]}}"#, duplicate: "evidence.signedTransactions"),
        Case(body: #"{"items":[{"name":1},{"name":2,"name":3}]}"#, duplicate: "items[1].name"),
        Case(body: #"[[],[{"a":{"b":null,"b":true}}]]"#, duplicate: "[1][0].a.b"),
        Case(body: #"{"a":{"x":1},"a":{"y":2}}"#, duplicate: "a"),
        // The same name after unescaping, and under Swift's string equality (as JSONDecoder compares).
        Case(body: #"{"productID":"a","\u0070roductID":"b"}"#, duplicate: "productID"),
        Case(body: #"{"\/":1,"/":2}"#, duplicate: "/"),
        Case(body: #"{"\ud83d\ude00":1,"😀":2}"#, duplicate: "😀"),
        Case(body: "{\"caf\u{E9}\":1,\"cafe\u{301}\":2}", duplicate: "cafe\u{301}"),
        // The first duplicate in document order wins.
        Case(body: #"{"a":{"b":1,"b":2},"a":3}"#, duplicate: "a.b"),
        // Not duplicates.
        Case(body: #"{"productID":"productID","offerID":"productID"}"#, duplicate: nil),
        Case(body: #"{"a":{"a":{"a":1}},"b":{"a":2}}"#, duplicate: nil),
        Case(body: #"[{"a":1},{"a":2},{"a":3}]"#, duplicate: nil),
        Case(body: #"{"a":1,"A":2,"a ":3,"\u0061\u0062":4,"ab ":5}"#, duplicate: nil),
        Case(body: #"{"a":"\"a\":1,\"a\":2","b":["a","a"]}"#, duplicate: nil),
        Case(body: #"{"n":-1.5e+3,"t":true,"f":false,"z":null,"s":"","o":{},"l":[]}"#, duplicate: nil),
        Case(body: #"{}"#, duplicate: nil),
        // Not well-formed: the decoder reports these, the scan stays out of the way.
        Case(body: "", duplicate: nil),
        Case(body: #"{"a":1,"a""#, duplicate: nil),
        Case(body: #"{"a" 1,"a":2}"#, duplicate: nil),
        Case(body: #"{"a":1,,"a":2}"#, duplicate: nil),
        Case(body: #"{"\q":1,"\q":2}"#, duplicate: nil),
        Case(body: #"{"\ud83d":1,"\ud83d":2}"#, duplicate: nil),
        Case(body: #"{"a":[1}"#, duplicate: nil),
    ]

    @Test(arguments: cases)
    func findsTheFirstDuplicate(_ example: Case) {
        #expect(JSONDuplicateMembers.first(in: Data(example.body.utf8)) == example.duplicate)
    }

    @Test func deepNestingAndLongBodiesEndCleanly() {
        let deep = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
        #expect(JSONDuplicateMembers.first(in: Data(deep.utf8)) == nil)
        let unclosed = String(repeating: #"{"a":"#, count: 50_000)
        #expect(JSONDuplicateMembers.first(in: Data(unclosed.utf8)) == nil)
        let nestedDuplicate = String(repeating: #"{"a":"#, count: 10_000) + #"{"b":1,"b":2}"# + String(repeating: "}", count: 10_000)
        #expect(JSONDuplicateMembers.first(in: Data(nestedDuplicate.utf8)) == Array(repeating: "a", count: 10_000).joined(separator: ".") + ".b")
        let wide = "{" + (0..<20_000).map { #""m\#($0)":\#($0)"# }.joined(separator: ",") + #","m19999":0}"#
        #expect(JSONDuplicateMembers.first(in: Data(wide.utf8)) == "m19999")
    }

    /// Random documents, rendered with random whitespace and randomly escaped names: the scan
    /// finds exactly the first duplicate the generator put in, and documents the generator kept
    /// free of duplicates decode with `JSONSerialization`, so they really are JSON.
    @Test func agreesWithGeneratedDocuments() throws {
        var generator = SeededGenerator(seed: 0xD0_0B1E)
        var withDuplicates = 0
        for _ in 0..<3_000 {
            var document = GeneratedDocument(generator: generator)
            document.value(depth: 0, path: "")
            generator = document.generator
            let data = Data(document.text.utf8)
            #expect(
                JSONDuplicateMembers.first(in: data) == document.firstDuplicate,
                "scan of \(document.text.debugDescription)")
            if document.firstDuplicate == nil {
                #expect(throws: Never.self) { try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed]) }
            } else {
                withDuplicates += 1
            }
        }
        #expect(withDuplicates > 300, "only \(withDuplicates) documents had a duplicate: the test no longer exercises the scan")
    }

    /// Writes a random JSON value and notes, in document order, the first member that repeats a
    /// name of its object.
    struct GeneratedDocument {
        var generator: SeededGenerator
        var text = ""
        var firstDuplicate: String?

        private static let names = ["a", "b", "productID", "é", "😀", "a b"]

        private mutating func roll(_ count: Int) -> Int { Int(generator.next() % UInt64(count)) }

        private mutating func whitespace() {
            for _ in 0..<roll(3) { text += [" ", "\n", "\t", "\r"][roll(4)] }
        }

        /// The name as JSON: each character either as itself or as `\u` escapes (a surrogate
        /// pair outside the BMP).
        private mutating func quoted(_ name: String) -> String {
            var out = "\""
            for scalar in name.unicodeScalars {
                if roll(3) == 0 {
                    for unit in String(scalar).utf16 { out += String(format: "\\u%04x", unit) }
                } else {
                    out += String(scalar)
                }
            }
            return out + "\""
        }

        mutating func value(depth: Int, path: String) {
            whitespace()
            // The top is mostly an object (as request bodies are); deep values are leaves.
            let kind = depth == 0 ? (roll(4) == 0 ? 1 : 0) : depth > 3 ? 2 + roll(3) : roll(5)
            switch kind {
            case 0:
                text += "{"
                var seen: Set<String> = []
                let count = roll(5)
                if count == 0 { whitespace() }
                for member in 0..<count {
                    if member > 0 { text += "," }
                    whitespace()
                    let name = Self.names[roll(Self.names.count)]
                    let memberPath = path.isEmpty ? name : "\(path).\(name)"
                    if !seen.insert(name).inserted, firstDuplicate == nil { firstDuplicate = memberPath }
                    text += quoted(name)
                    whitespace()
                    text += ":"
                    value(depth: depth + 1, path: memberPath)
                }
                text += "}"
            case 1:
                text += "["
                let count = roll(3)
                if count == 0 { whitespace() }
                for element in 0..<count {
                    if element > 0 { text += "," }
                    value(depth: depth + 1, path: "\(path)[\(element)]")
                }
                text += "]"
            case 2:
                text += ["0", "-1.5e3", "true", "false", "null"][roll(5)]
            default:
                text += [#""a""#, #""\"a\":1""#, #""{[,]}""#, #""\\""#, #""\u00e9""#][roll(5)]
            }
            whitespace()
        }
    }
}
