import Crypto
import Foundation
import OfferSignerCore
import Testing

@Suite("Legacy promotional-offer payload and signature")
struct LegacyPayloadTests {
    let key = try! InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: TestKeyFixtures.p256)

    @Test("The signed string is the seven fields joined by U+2063, token and nonce lowercased, ms timestamp")
    func exactPayload() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "com.example.app", keyID: "ABC123DEFG", productID: "pro.monthly", offerID: "WINBACK50",
            appAccountToken: "6B29FC40-CA47-1067-B31D-00DD010662DA", nonce: "F81D4FAE-7DEC-11D0-A765-00A0C91E6BF6",
            timestamp: 1_700_000_000_123)
        let expected = "com.example.app\u{2063}ABC123DEFG\u{2063}pro.monthly\u{2063}WINBACK50\u{2063}6b29fc40-ca47-1067-b31d-00dd010662da\u{2063}f81d4fae-7dec-11d0-a765-00a0c91e6bf6\u{2063}1700000000123"
        #expect(payload.signedString == expected)
        #expect(payload.signedBytes == Data(expected.utf8))
        #expect(payload.expiresAt == Date(timeIntervalSince1970: 1_700_086_400.123))
    }

    @Test("Without an appAccountToken the field is empty but present")
    func emptyToken() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "b", keyID: "k", productID: "p", offerID: "o", appAccountToken: "",
            nonce: "f81d4fae-7dec-11d0-a765-00a0c91e6bf6", timestamp: 1_700_000_000_000)
        #expect(payload.signedString == "b\u{2063}k\u{2063}p\u{2063}o\u{2063}\u{2063}f81d4fae-7dec-11d0-a765-00a0c91e6bf6\u{2063}1700000000000")
        #expect(payload.appAccountToken == nil)
    }

    @Test("Signatures are DER in standard Base64 and verify with the public key")
    func signAndVerify() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "com.example.app", keyID: key.keyID, productID: "pro.monthly", offerID: "WINBACK50",
            appAccountToken: UUID(), nonce: UUID(), timestamp: Date().unixMilliseconds)
        let signer = PromotionalOfferSigner(key: key)
        let signature = try signer.legacySignature(for: payload)
        let bytes = try #require(Data(base64Encoded: signature))
        #expect(bytes.first == 0x30, "DER SEQUENCE")
        #expect(try P256.Signing.ECDSASignature(derRepresentation: bytes).rawRepresentation.count == 64)
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        #expect(verifier.verifyLegacy(payload: payload, signature: signature) == .valid)

        // Any other payload or key fails.
        let other = try PromotionalOfferPayload(
            bundleID: "com.example.app", keyID: key.keyID, productID: "pro.yearly", offerID: "WINBACK50",
            appAccountToken: payload.appAccountToken, nonce: payload.nonce, timestamp: payload.timestamp)
        #expect(!verifier.verifyLegacy(payload: other, signature: signature).isValid)
        let stranger = PromotionalOfferVerifier(publicKey: P256.Signing.PrivateKey().publicKey)
        #expect(!stranger.verifyLegacy(payload: payload, signature: signature).isValid)
        #expect(!verifier.verifyLegacy(payload: payload, signature: "not base64!").isValid)
    }

    @Test("A payload naming another key ID is refused by the signer")
    func keyIDMismatch() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "b", keyID: "OTHERKEY00", productID: "p", offerID: "o", appAccountToken: nil, nonce: UUID(),
            timestamp: 1_700_000_000_000)
        #expect(throws: OfferSignerError(code: .keyIDMismatch, field: "keyID", message: "payload names key ID 'OTHERKEY00' but the signing key is 'ABC123DEFG'")) {
            try PromotionalOfferSigner(key: key).legacySignature(for: payload)
        }
    }

    @Test("Property: random IDs, tokens in any case or empty, always sign and verify; case never matters", arguments: 0..<4)
    func randomInputs(round: Int) throws {
        var random = SeededGenerator()
        let signer = PromotionalOfferSigner(key: key)
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        for _ in 0..<50 {
            let token = Int.random(in: 0..<4, using: &random) == 0 ? "" : random.uuidInRandomCase()
            let nonce = random.uuidInRandomCase()
            let payload = try PromotionalOfferPayload(
                bundleID: random.identifier(), keyID: key.keyID, productID: random.identifier(maxLength: 100),
                offerID: random.identifier(maxLength: 64), appAccountToken: token, nonce: nonce,
                timestamp: Int64.random(in: OfferFieldValidator.minimumTimestamp..<OfferFieldValidator.maximumTimestamp, using: &random))
            #expect(payload.signedString.contains(nonce.lowercased()), "seed \(random.seed)")
            let signature = try signer.legacySignature(for: payload)
            // The same offer with token and nonce in the opposite case is the same payload.
            let flipped = try PromotionalOfferPayload(
                bundleID: payload.bundleID, keyID: payload.keyID, productID: payload.productID, offerID: payload.offerID,
                appAccountToken: token.uppercased(), nonce: nonce.uppercased(), timestamp: payload.timestamp)
            #expect(flipped.signedString == payload.signedString, "seed \(random.seed)")
            #expect(verifier.verifyLegacy(payload: flipped, signature: signature) == .valid, "seed \(random.seed)")
            #expect(payload.signedString.split(separator: "\u{2063}", omittingEmptySubsequences: false).count == 7)
        }
    }
}

@Suite("Validation of payload fields")
struct FieldValidationTests {
    static let nonce = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"

    static func payload(
        bundleID: String = "com.example.app", keyID: String = "ABC123DEFG", productID: String = "pro.monthly",
        offerID: String = "WINBACK50", token: String = "", nonce: String = nonce, timestamp: Int64 = 1_700_000_000_000
    ) throws(OfferSignerError) -> PromotionalOfferPayload {
        try PromotionalOfferPayload(
            bundleID: bundleID, keyID: keyID, productID: productID, offerID: offerID, appAccountToken: token,
            nonce: nonce, timestamp: timestamp)
    }

    struct BadField: Sendable, CustomTestStringConvertible {
        var field: String
        var code: OfferSignerError.Code
        var bundleID = "com.example.app"
        var keyID = "ABC123DEFG"
        var productID = "pro.monthly"
        var offerID = "WINBACK50"
        var token = ""
        var nonce = FieldValidationTests.nonce
        var timestamp: Int64 = 1_700_000_000_000
        var testDescription: String { "\(field): \(code)" }
    }

    static let badFields: [BadField] = [
        BadField(field: "productID", code: .fieldEmpty, productID: ""),
        BadField(field: "bundleID", code: .fieldTooLong, bundleID: String(repeating: "a", count: 256)),
        BadField(field: "offerID", code: .fieldInvalidCharacter, offerID: "WIN\u{2063}BACK"),
        BadField(field: "offerID", code: .fieldInvalidCharacter, offerID: "WIN\nBACK"),
        BadField(field: "keyID", code: .fieldInvalidCharacter, keyID: "ABC\u{0}"),
        BadField(field: "productID", code: .fieldInvalidCharacter, productID: "pro\u{200B}monthly"),
        BadField(field: "productID", code: .fieldInvalidCharacter, productID: " pro.monthly"),
        BadField(field: "productID", code: .fieldInvalidCharacter, productID: "pro.monthly "),
        BadField(field: "appAccountToken", code: .invalidAppAccountToken, token: "not-a-uuid"),
        BadField(field: "appAccountToken", code: .invalidAppAccountToken, token: "6B29FC40CA471067B31D00DD010662DA"),
        BadField(field: "nonce", code: .invalidNonce, nonce: "nonce"),
        BadField(field: "nonce", code: .invalidNonce, nonce: ""),
        BadField(field: "timestamp", code: .timestampOutOfRange, timestamp: 1_700_000_000),
        BadField(field: "timestamp", code: .timestampOutOfRange, timestamp: -1),
        BadField(field: "timestamp", code: .timestampOutOfRange, timestamp: 0),
        BadField(field: "timestamp", code: .timestampOutOfRange, timestamp: 99_999_999_999_999),
    ]

    @Test("Each bad field gets a specific error naming it", arguments: badFields)
    func badField(_ bad: BadField) {
        do {
            _ = try Self.payload(
                bundleID: bad.bundleID, keyID: bad.keyID, productID: bad.productID, offerID: bad.offerID,
                token: bad.token, nonce: bad.nonce, timestamp: bad.timestamp)
            Issue.record("accepted a bad \(bad.field)")
        } catch {
            #expect(error.code == bad.code)
            #expect(error.field == bad.field)
            #expect(error.message.contains(bad.field))
        }
    }

    @Test("A timestamp in seconds is called out as seconds")
    func secondsMessage() {
        #expect(throws: OfferSignerError.self) { try Self.payload(timestamp: 1_700_000_000) }
        do {
            _ = try Self.payload(timestamp: 1_700_000_000)
        } catch {
            #expect(error.message.contains("seconds"))
        }
    }

    @Test("IDs of the maximum length and non-ASCII IDs are accepted")
    func edges() throws {
        _ = try Self.payload(productID: String(repeating: "p", count: 255))
        _ = try Self.payload(offerID: "offre-été")
        _ = try Self.payload(token: "6b29fc40-ca47-1067-b31d-00dd010662da")
    }
}

@Suite("UUID text forms on the signing path")
struct UUIDTextTests {
    @Test("lowercasedString and parse agree with Foundation for random UUIDs in any case")
    func agreesWithFoundation() {
        var random = SeededGenerator()
        for _ in 0..<2000 {
            let uuid = UUID()
            #expect(uuid.lowercasedString == uuid.uuidString.lowercased())
            let text = random.uuidInRandomCase()
            #expect(UUID.parse(text) == UUID(uuidString: text), "seed \(random.seed)")
        }
        for bad in ["", "6b29fc40ca471067b31d00dd010662da", "6b29fc40-ca47-1067-b31d-00dd010662dz", "6b29fc40-ca47-1067-b31d-00dd010662da0", " 6b29fc40-ca47-1067-b31d-00dd010662d", "6b29fc40+ca47-1067-b31d-00dd010662da"] {
            // (Foundation's sscanf-based parser on Linux accepts "…62dz" as "…620D": ours refuses it.)
            #expect(UUID.parse(bad) == nil)
        }
    }

    @Test("Time-ordered nonces are version-7 UUIDs, unique, and sort by time")
    func timeOrdered() {
        let start = Date(timeIntervalSince1970: 1_795_000_000)
        var previous = ""
        var seen = Set<UUID>()
        for step in 0..<1000 {
            let uuid = UUID.timeOrdered(at: start.addingTimeInterval(Double(step) / 1000))
            let text = uuid.lowercasedString
            #expect(Array(text)[14] == "7")
            #expect("89ab".contains(Array(text)[19]))
            #expect(text.prefix(13) >= previous.prefix(13), "the time part never goes back")
            #expect(UUID.parse(text) == uuid)
            previous = text
            seen.insert(uuid)
        }
        #expect(seen.count == 1000)
        #expect(UUID.timeOrdered(at: start).lowercasedString.hasPrefix("01a1ee56-5e00-7"))
    }
}
