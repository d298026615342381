import Crypto
import Foundation
import OfferSignerCore
import OfferSignerStorage
import Testing

/// A record's hash is the documented format and nothing else (Docs/Audit.md: lowercase hex
/// SHA-256 of `previousHash "\n" sequence "\n" recordedAt "\n" kind "\n" body`), so chains
/// written by any build verify with any other.
@Suite struct AuditHashFormatTests {
    /// The format computed the plain way: one string, then SHA-256 of its UTF-8.
    static func documentedHash(previousHash: String, sequence: Int64, recordedAtMillis: Int64, kind: String, body: String) -> String {
        let text = previousHash + "\n" + String(sequence) + "\n" + String(recordedAtMillis) + "\n" + kind + "\n" + body
        return SHA256.hash(data: Data(text.utf8)).map { String(format: "%02x", $0) }.joined()
    }

    /// Known answers, computed outside Swift (Python's hashlib over the documented text).
    @Test func knownAnswers() {
        #expect(
            AuditChain.hash(
                previousHash: AuditChain.genesisHash, sequence: 1, recordedAt: Date(timeIntervalSince1970: 1_795_319_803.9605), kind: "signature.issued",
                body: #"{"productID":"com.example.monthly","note":"é日本"}"#)
                == "6e24af568cabda9b750040f7165b54b3fd260e653ece51644d08e420ba3543e7")
        #expect(
            AuditVerification.hash(previousHash: String(repeating: "ab", count: 32), sequence: .max, recordedAtMillis: -1, kind: "key.imported", body: "")
                == "9df8a1343c5e50165c7a312ef6b9450c7ff222e74e3dc0e1a82503a0f7454966")
    }

    /// Every digit count and sign of both numbers, empty and non-ASCII kinds and bodies.
    @Test func matchesTheDocumentedFormatForEveryDigitCount() {
        var numbers: [Int64] = [0, 1, 9, 10, 99, 100, .max, .min, -1, -10, 1_795_319_803_960]
        var power: Int64 = 1
        for _ in 0..<18 {
            power *= 10
            numbers += [power - 1, power, -power, -(power - 1)]
        }
        let kinds = ["signature.issued", "", "clé.réglée"]
        let bodies = ["", #"{"a":1}"#, "日本🙂\n\u{0}", String(repeating: "x", count: 1_000)]
        for (index, number) in numbers.enumerated() {
            let kind = kinds[index % kinds.count]
            let body = bodies[index % bodies.count]
            let previous = index.isMultiple(of: 2) ? AuditChain.genesisHash : String(repeating: "f0", count: 32)
            let other = numbers[(index * 7 + 3) % numbers.count]
            #expect(
                AuditVerification.hash(previousHash: previous, sequence: number, recordedAtMillis: other, kind: kind, body: body)
                    == Self.documentedHash(previousHash: previous, sequence: number, recordedAtMillis: other, kind: kind, body: body))
            #expect(
                AuditVerification.hash(previousHash: previous, sequence: other, recordedAtMillis: number, kind: kind, body: body)
                    == Self.documentedHash(previousHash: previous, sequence: other, recordedAtMillis: number, kind: kind, body: body))
        }
    }
}
