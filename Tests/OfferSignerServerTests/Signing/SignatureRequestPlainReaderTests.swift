import Foundation
import Testing

@testable import OfferSignerServer

/// The plain reader may only ever answer where `JSONDecoder` (the path that decides every
/// error) would have given the same request; it must answer for the shapes clients send.
@Suite struct SignatureRequestPlainReaderTests {
    static let everyday: [String] = [
        #"{"productID":"pro.monthly","offerID":"WINBACK50"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#,
        #"{"appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da","offerID":"WINBACK50","productID":"pro.monthly","formats":["legacy","jws"],"bundleID":"com.example.app","transactionID":"2000000123456789"}"#,
        " {\n  \"productID\" : \"pro.monthly\" ,\r\n\t\"offerID\":\"WINBACK50\", \"formats\" : [ ] }\n",
        #"{"productID":"pro.monthly","offerID":"WINBACK50","formats":[ "jws" , "legacy" ]}"#,
        #"{"productID":"","offerID":" spaced ~ text! "}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":"Sandbox"}"#,
        #"{"environment" : "Production","productID":"pro.monthly","offerID":"WINBACK50"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":"Xcode"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":"LocalTesting"}"#,
    ]

    @Test(arguments: everyday)
    func readsWhatTheDecoderReads(_ body: String) throws {
        let data = Data(body.utf8)
        let plain = try #require(SignatureRequestPlainReader.read(data))
        #expect(plain == (try JSONDecoder().decode(SignatureRequest.self, from: data)))
    }

    /// Bodies the decoder must decide: errors, and valid JSON outside the plain shape.
    static let leftToTheDecoder: [String] = [
        "", " ", "{", "}", "[]", "null", #""text""#, "{}",
        #"{"productID":"pro.monthly"}"#,
        #"{"offerID":"WINBACK50"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50""#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50",}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50"} x"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50"}{}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","productID":"other"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","appAcountToken":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":null}"#,
        #"{"productID":"pro.monthly","offerID":12}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","formats":"legacy"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","formats":["legacy",1]}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","formats":["legacy",]}"#,
        #"{"productID":"pro.monthly","offerID":"WIN\u0042ACK50"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","bundleID":"com.exämple.app"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","evidence":{"signedTransactions":[]}}"#,
        "\u{FEFF}{\"productID\":\"pro.monthly\",\"offerID\":\"WINBACK50\"}",
        "{\"productID\":\"pro.monthly\",\"offerID\":\"WIN\tBACK\"}",
        "{\u{0B}\"productID\":\"pro.monthly\",\"offerID\":\"WINBACK50\"}",
        // An environment Apple does not spell this way: the decoder reads it, the controller refuses it.
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":"sandbox"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":"Sandbox","environment":"Sandbox"}"#,
        #"{"productID":"pro.monthly","offerID":"WINBACK50","environment":null}"#,
    ]

    @Test(arguments: leftToTheDecoder)
    func leavesEverythingElseToTheDecoder(_ body: String) {
        #expect(SignatureRequestPlainReader.read(Data(body.utf8)) == nil)
    }

    /// Random edits of valid bodies: whenever the plain reader answers, the decoder succeeds
    /// with the same request.
    @Test func neverDisagreesWithTheDecoderOnEditedBodies() async throws {
        var generator = SeededGenerator(seed: 0x5EED_0FF3)
        let alphabet = Array(#"{}[]":, \"#.utf8) + [0x09, 0x0A, 0x0D, 0x0B, 0x00, 0x41, 0x61, 0x31, 0x2D, 0x5C, 0x75, 0xC3, 0xA4, 0x6E]
        var answered = 0
        for round in 0..<40_000 {
            // Seconds of CPU in a debug build: let other work on the concurrency pool (the
            // servers of other tests) run now and then.
            if round.isMultiple(of: 500) { await Task.yield() }
            var bytes = Array(Self.everyday[round % Self.everyday.count].utf8)
            for _ in 0..<(1 + Int(generator.next() % 3)) {
                let position = bytes.isEmpty ? 0 : Int(generator.next() % UInt64(bytes.count))
                switch generator.next() % 3 {
                case 0 where !bytes.isEmpty: bytes.remove(at: position)
                case 1: bytes.insert(alphabet[Int(generator.next() % UInt64(alphabet.count))], at: position)
                default: if !bytes.isEmpty { bytes[position] = alphabet[Int(generator.next() % UInt64(alphabet.count))] }
                }
            }
            let data = Data(bytes)
            guard let plain = SignatureRequestPlainReader.read(data) else { continue }
            answered += 1
            let decoded = try? JSONDecoder().decode(SignatureRequest.self, from: data)
            #expect(decoded == plain, "the readers disagree on \(String(decoding: bytes, as: UTF8.self).debugDescription)")
        }
        // Some edits (inside string values, in whitespace) keep the body plain.
        #expect(answered > 1_000, "only \(answered) edited bodies were plain: the test no longer exercises the reader")
    }
}
