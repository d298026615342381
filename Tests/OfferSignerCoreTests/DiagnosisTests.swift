import Crypto
import Foundation
import OfferSignerCore
import Testing

@Suite("Explaining a legacy signature that does not verify")
struct DiagnosisTests {
    static let key = try! InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: TestKeyFixtures.p256)
    static let token = "6b29fc40-ca47-1067-b31d-00dd010662da"
    static let nonce = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
    static let timestamp: Int64 = 1_700_000_000_123

    /// The document the app would send, with a signature over whatever `fields` say.
    static func document(
        signedFields fields: [String], separator: String = "\u{2063}", encode: (P256.Signing.ECDSASignature) -> String = { $0.derRepresentation.base64EncodedString() },
        token: String? = DiagnosisTests.token, timestamp: Int64 = DiagnosisTests.timestamp, keyID: String = "ABC123DEFG"
    ) throws -> LegacySignatureDocument {
        // ECDSA is randomised: re-sign until the encoding under test really differs from
        // standard Base64 of DER (a base64url text without '-', '_' or padding would not).
        let isStandardEncoding = try (0..<3).allSatisfy { _ in
            let probe = try key.privateKey.signature(for: Data("probe".utf8))
            return encode(probe) == probe.derRepresentation.base64EncodedString()
        }
        var signature = try key.privateKey.signature(for: Data(fields.joined(separator: separator).utf8))
        while !isStandardEncoding, Data(base64Encoded: encode(signature)) == signature.derRepresentation {
            signature = try key.privateKey.signature(for: Data(fields.joined(separator: separator).utf8))
        }
        return LegacySignatureDocument(
            bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: token,
            keyID: keyID, nonce: nonce, timestamp: timestamp, signature: encode(signature))
    }

    static func fields(
        bundleID: String = "com.example.app", keyID: String = "ABC123DEFG", token: String = token, nonce: String = nonce,
        timestamp: String = String(timestamp)
    ) -> [String] {
        [bundleID, keyID, "pro.monthly", "WINBACK50", token, nonce, timestamp]
    }

    func codes(_ document: LegacySignatureDocument, diagnosis: LegacySignatureDiagnosis = LegacySignatureDiagnosis(publicKey: DiagnosisTests.key.publicKey)) -> [String]? {
        switch diagnosis.diagnose(document) {
        case .valid: return []
        case .mistakes(let mistakes): return mistakes.map(\.code)
        case .unexplained: return nil
        }
    }

    @Test("A correct signature is valid")
    func valid() throws {
        #expect(codes(try Self.document(signedFields: Self.fields())) == [])
    }

    @Test("Each known mistake is named")
    func eachMistake() throws {
        let base64URL: (P256.Signing.ECDSASignature) -> String = { Encoding.base64URL($0.derRepresentation) }
        let raw: (P256.Signing.ECDSASignature) -> String = { $0.rawRepresentation.base64EncodedString() }
        let rawURL: (P256.Signing.ECDSASignature) -> String = { Encoding.base64URL($0.rawRepresentation) }
        #expect(codes(try Self.document(signedFields: Self.fields(nonce: Self.nonce.uppercased()))) == ["nonce_uppercase"])
        #expect(codes(try Self.document(signedFields: Self.fields(token: Self.token.uppercased()))) == ["app_account_token_uppercase"])
        #expect(codes(try Self.document(signedFields: Self.fields(timestamp: String(Self.timestamp / 1000)))) == ["timestamp_seconds"])
        #expect(codes(try Self.document(signedFields: Self.fields(token: ""))) == ["app_account_token_not_signed"])
        #expect(codes(try Self.document(signedFields: Self.fields(), separator: "\u{2064}")) == ["wrong_separator"])
        #expect(codes(try Self.document(signedFields: Self.fields(), separator: "")) == ["wrong_separator"])
        #expect(codes(try Self.document(signedFields: Self.fields(), encode: raw)) == ["raw_signature"])
        #expect(codes(try Self.document(signedFields: Self.fields(), encode: base64URL)) == ["base64url_signature"])
        #expect(codes(try Self.document(signedFields: Self.fields(), encode: rawURL)) == ["raw_base64url_signature"])
        #expect(codes(try Self.document(signedFields: Self.fields(keyID: "abc123defg"))) == ["other_key_id"])
        #expect(codes(try Self.document(signedFields: Self.fields(bundleID: "com.example.App"))) == nil)
        let candidates = LegacySignatureDiagnosis(publicKey: Self.key.publicKey, candidateKeyIDs: ["ZZZ999YYYY"], candidateBundleIDs: ["com.example.app.beta"], candidateAppAccountTokens: [Self.token])
        #expect(codes(try Self.document(signedFields: Self.fields(keyID: "ZZZ999YYYY")), diagnosis: candidates) == ["other_key_id"])
        #expect(codes(try Self.document(signedFields: Self.fields(bundleID: "com.example.app.beta")), diagnosis: candidates) == ["other_bundle_id"])
        #expect(codes(try Self.document(signedFields: Self.fields(), token: nil), diagnosis: candidates) == ["app_account_token_missing"])
    }

    @Test("Two mistakes at once are both named")
    func combinations() throws {
        let raw: (P256.Signing.ECDSASignature) -> String = { $0.rawRepresentation.base64EncodedString() }
        #expect(codes(try Self.document(signedFields: Self.fields(nonce: Self.nonce.uppercased()), encode: raw)) == ["nonce_uppercase", "raw_signature"])
        #expect(codes(try Self.document(signedFields: Self.fields(token: Self.token.uppercased(), nonce: Self.nonce.uppercased()))) == ["nonce_uppercase", "app_account_token_uppercase"])
        #expect(codes(try Self.document(signedFields: Self.fields(timestamp: String(Self.timestamp / 1000)), separator: "|")) == ["timestamp_seconds", "wrong_separator"])
    }

    @Test("A timestamp sent in seconds is flagged even when the signature matches it")
    func secondsInObject() throws {
        let seconds = Self.timestamp / 1000
        let document = try Self.document(signedFields: Self.fields(timestamp: String(seconds)), timestamp: seconds)
        let found = codes(document)
        #expect(found == ["invalid_field"])
    }

    @Test("Another key, or other field values, are unexplained")
    func unexplained() throws {
        let document = try Self.document(signedFields: Self.fields())
        let stranger = LegacySignatureDiagnosis(publicKey: P256.Signing.PrivateKey().publicKey)
        guard case .unexplained(let message) = stranger.diagnose(document) else {
            Issue.record("a signature by another key must be unexplained")
            return
        }
        #expect(message.contains("another key"))
        var otherProduct = Self.fields()
        otherProduct[2] = "pro.yearly"
        #expect(codes(try Self.document(signedFields: otherProduct)) == nil)
        var garbage = document
        garbage.signature = "%%%"
        #expect(codes(garbage) == nil)
    }
}
