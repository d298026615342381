import Crypto
import Foundation
import OfferSignerCore
import Testing

@Suite("Compact-JWS offer signatures")
struct JWSTests {
    let key = try! InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: TestKeyFixtures.p256)

    func decodeSegment(_ segment: Substring) throws -> [String: Any] {
        let data = try #require(Encoding.decodeBase64URL(segment))
        return try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
    }

    @Test("Promotional offer: ES256 header with kid and typ, Apple's claims, raw r‖s base64url signature")
    func promotionalOffer() throws {
        let nonce = UUID()
        let issuedAt = Date(timeIntervalSince1970: 1_750_000_000.9)
        let claims = try OfferJWSClaims.promotionalOffer(
            issuerID: "57246542-96fe-1a63-e053-0824d011072a", bundleID: "com.example.app", productID: "pro.monthly",
            offerID: "WINBACK50", transactionID: "2000000123456789", issuedAt: issuedAt, nonce: nonce)
        let jws = PromotionalOfferSigner(key: key).compactJWS(for: claims)
        let parts = jws.split(separator: ".")
        #expect(parts.count == 3)
        #expect(!jws.contains("=") && !jws.contains("+") && !jws.contains("/"))
        let header = try decodeSegment(parts[0])
        #expect(header as NSDictionary == ["alg": "ES256", "kid": "ABC123DEFG", "typ": "JWT"] as NSDictionary)
        let body = try decodeSegment(parts[1])
        #expect(body as NSDictionary == [
            "iss": "57246542-96fe-1a63-e053-0824d011072a", "iat": 1_750_000_000, "aud": "promotional-offer",
            "bid": "com.example.app", "nonce": nonce.uuidString.lowercased(), "productId": "pro.monthly",
            "offerIdentifier": "WINBACK50", "transactionId": "2000000123456789",
        ] as NSDictionary)
        #expect(body["exp"] == nil)
        #expect(Encoding.decodeBase64URL(parts[2])?.count == 64)

        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        #expect(verifier.verifyJWS(jws, audience: .promotionalOffer) == .valid(header: OfferJWSHeader(keyID: "ABC123DEFG"), claims: claims))
        guard case .invalid = verifier.verifyJWS(jws, audience: .introductoryOfferEligibility) else {
            Issue.record("a promotional-offer JWS must not pass as an intro-eligibility one")
            return
        }
    }

    @Test("Promotional offer without transactionId omits the claim")
    func withoutTransaction() throws {
        let claims = try OfferJWSClaims.promotionalOffer(
            issuerID: "issuer", bundleID: "b", productID: "p", offerID: "o", transactionID: nil, issuedAt: Date(), nonce: UUID())
        let jws = PromotionalOfferSigner(key: key).compactJWS(for: claims)
        let body = try decodeSegment(jws.split(separator: ".")[1])
        #expect(body["transactionId"] == nil)
        #expect(body["offerIdentifier"] as? String == "o")
    }

    @Test("Introductory-offer eligibility carries allowIntroductoryOffer and transactionId")
    func introEligibility() throws {
        let claims = try OfferJWSClaims.introductoryOfferEligibility(
            issuerID: "issuer", bundleID: "b", productID: "p", allowIntroductoryOffer: false, transactionID: "42",
            issuedAt: Date(), nonce: UUID())
        let jws = PromotionalOfferSigner(key: key).compactJWS(for: claims)
        let body = try decodeSegment(jws.split(separator: ".")[1])
        #expect(body["aud"] as? String == "introductory-offer-eligibility")
        #expect(body["allowIntroductoryOffer"] as? Bool == false)
        #expect(body["transactionId"] as? String == "42")
        #expect(body["offerIdentifier"] == nil)
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        guard case .valid = verifier.verifyJWS(jws, audience: .introductoryOfferEligibility) else {
            Issue.record("intro-eligibility JWS should verify")
            return
        }
    }

    @Test("alg none, other algorithms, DER signatures, tampering and truncation are refused")
    func refusals() throws {
        let claims = try OfferJWSClaims.promotionalOffer(
            issuerID: "issuer", bundleID: "b", productID: "p", offerID: "o", transactionID: nil, issuedAt: Date(), nonce: UUID())
        let jws = PromotionalOfferSigner(key: key).compactJWS(for: claims)
        let parts = jws.split(separator: ".").map(String.init)
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        func reason(_ token: String) -> String? {
            if case .invalid(let reason) = verifier.verifyJWS(token, audience: .promotionalOffer) { return reason }
            return nil
        }
        let noneHeader = Encoding.base64URL(Data(#"{"alg":"none","kid":"ABC123DEFG"}"#.utf8))
        #expect(reason("\(noneHeader).\(parts[1]).")?.contains("ES256") == true)
        let hsHeader = Encoding.base64URL(Data(#"{"alg":"HS256","kid":"ABC123DEFG"}"#.utf8))
        #expect(reason("\(hsHeader).\(parts[1]).\(parts[2])")?.contains("ES256") == true)
        // A DER signature where JWS wants raw r‖s.
        let signingInput = Data("\(parts[0]).\(parts[1])".utf8)
        let der = try key.privateKey.signature(for: signingInput).derRepresentation
        #expect(reason("\(parts[0]).\(parts[1]).\(Encoding.base64URL(der))")?.contains("r‖s") == true)
        // Altered claims.
        let forged = try OfferJWSClaims.promotionalOffer(
            issuerID: "issuer", bundleID: "b", productID: "p", offerID: "FREE100", transactionID: nil, issuedAt: Date(), nonce: UUID())
        let forgedBody = Encoding.base64URL(Data(try JSONEncoder().encode(forged)))
        #expect(reason("\(parts[0]).\(forgedBody).\(parts[2])") != nil)
        #expect(reason("\(parts[0]).\(parts[1])") != nil)
        #expect(reason("") != nil)
        #expect(reason("a.b.c") != nil)
        // Another key.
        let stranger = PromotionalOfferVerifier(publicKey: P256.Signing.PrivateKey().publicKey)
        guard case .invalid = stranger.verifyJWS(jws, audience: .promotionalOffer) else {
            Issue.record("a JWS must not verify with another key")
            return
        }
    }

    @Test("JWS fields are validated like legacy ones")
    func validation() {
        #expect(throws: OfferSignerError.self) {
            try OfferJWSClaims.promotionalOffer(issuerID: "", bundleID: "b", productID: "p", offerID: "o", transactionID: nil, issuedAt: Date(), nonce: UUID())
        }
        #expect(throws: OfferSignerError.self) {
            try OfferJWSClaims.introductoryOfferEligibility(issuerID: "i", bundleID: "b", productID: "p\u{2063}", allowIntroductoryOffer: true, transactionID: "1", issuedAt: Date(), nonce: UUID())
        }
    }
}

@Suite("Signature documents (the JSON `sign` prints and `verify` reads)")
struct SignatureDocumentTests {
    let key = try! InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: TestKeyFixtures.p256)

    @Test("A legacy document keeps StoreKit's field order, a JSON-integer timestamp, and round-trips")
    func legacyRoundTrip() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "com.example.app", keyID: key.keyID, productID: "pro.monthly", offerID: "WINBACK50",
            appAccountToken: nil, nonce: UUID(), timestamp: 1_700_000_000_000)
        let document = SignatureDocument.legacy(LegacySignatureDocument(payload: payload, signature: try PromotionalOfferSigner(key: key).legacySignature(for: payload)))
        let json = String(decoding: document.jsonData(), as: UTF8.self)
        #expect(json.hasPrefix(#"{"format":"legacy","bundleID":"com.example.app","productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":null,"keyID":"ABC123DEFG","nonce":""#))
        #expect(json.contains(#""timestamp":1700000000000,"#))
        #expect(try SignatureDocument.decode(json: document.jsonData()) == document)
        #expect(document.verify(with: key.publicKey) == .valid)
    }

    @Test("Malformed documents name the problem", arguments: [
        ("not json", "not valid JSON"),
        (#"{"format":"legacy"}"#, "missing field 'bundleID'"),
        (#"{"format":"carrier-pigeon"}"#, "unknown format"),
        (#"{}"#, "missing field 'format'"),
        (#"{"format":"legacy","bundleID":"b","productID":"p","offerID":"o","keyID":"k","nonce":"n","timestamp":"soon","signature":"s"}"#, "field 'timestamp' has the wrong type"),
    ])
    func malformed(json: String, message: String) {
        do {
            _ = try SignatureDocument.decode(json: Data(json.utf8))
            Issue.record("accepted malformed document")
        } catch {
            #expect(error.code == .documentMalformed)
            #expect(error.message.contains(message), "'\(error.message)' should contain '\(message)'")
        }
    }

    @Test("A JWS document whose fields disagree with its claims does not verify")
    func jwsFieldMismatch() throws {
        let claims = try OfferJWSClaims.promotionalOffer(
            issuerID: "issuer", bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50",
            transactionID: nil, issuedAt: Date(), nonce: UUID())
        let jws = PromotionalOfferSigner(key: key).compactJWS(for: claims)
        let good = SignatureDocument.jws(PromotionalOfferJWSDocument(bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", keyID: "ABC123DEFG", transactionID: nil, compactJWS: jws))
        #expect(good.verify(with: key.publicKey) == .valid)
        let lying = SignatureDocument.jws(PromotionalOfferJWSDocument(bundleID: "com.example.app", productID: "pro.monthly", offerID: "FREE100", keyID: "ABC123DEFG", transactionID: nil, compactJWS: jws))
        #expect(lying.verify(with: key.publicKey) == .invalid(reason: "JWS offerIdentifier is 'WINBACK50' but offerID is 'FREE100'"))
    }

    @Test("A service response decodes into one document per signature, each verifiable")
    func serviceResponse() throws {
        let payload = try PromotionalOfferPayload(
            bundleID: "com.example.app", keyID: key.keyID, productID: "pro.monthly", offerID: "WINBACK50",
            appAccountToken: nil, nonce: UUID(), timestamp: 1_700_000_000_000)
        let signer = PromotionalOfferSigner(key: key)
        let claims = try OfferJWSClaims.promotionalOffer(
            issuerID: "issuer", bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50",
            transactionID: "42", issuedAt: Date(), nonce: UUID())
        let response = """
            {"bundleID":"com.example.app","productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":null,\
            "legacy":{"keyID":"\(key.keyID)","nonce":"\(payload.nonce.lowercasedString)","timestamp":1700000000000,"signature":"\(try signer.legacySignature(for: payload))"},\
            "jws":{"keyID":"\(key.keyID)","compactJWS":"\(signer.compactJWS(for: claims))"},"expiresAt":"2023-11-15T22:13:20.000Z"}
            """
        let documents = try SignatureDocument.decodeAll(json: Data(response.utf8))
        #expect(documents.map(\.format) == [.legacy, .jws])
        for document in documents { #expect(document.verify(with: key.publicKey) == .valid) }
        let tampered = try SignatureDocument.decodeAll(json: Data(response.replacingOccurrences(of: "WINBACK50", with: "FREE100").utf8))
        for document in tampered { #expect(document.verify(with: key.publicKey) != .valid) }
        // A `sign` document still decodes as one.
        let single = SignatureDocument.legacy(LegacySignatureDocument(payload: payload, signature: try signer.legacySignature(for: payload)))
        #expect(try SignatureDocument.decodeAll(json: single.jsonData()) == [single])
    }

    @Test("A service response with formats [intro-eligibility] decodes into its document, verifiable")
    func introEligibilityServiceResponse() throws {
        let claims = try OfferJWSClaims.introductoryOfferEligibility(
            issuerID: "issuer", bundleID: "com.example.app", productID: "pro.monthly", allowIntroductoryOffer: false,
            transactionID: "42", issuedAt: Date(), nonce: UUID())
        let response = """
            {"bundleID":"com.example.app","productID":"pro.monthly","offerID":"introductory","appAccountToken":null,\
            "introEligibility":{"keyID":"\(key.keyID)","compactJWS":"\(PromotionalOfferSigner(key: key).compactJWS(for: claims))",\
            "transactionID":"42","allowIntroductoryOffer":false},"expiresAt":"2023-11-15T22:13:20.000Z"}
            """
        let documents = try SignatureDocument.decodeAll(json: Data(response.utf8))
        #expect(documents.map(\.format) == [.introEligibility])
        for document in documents { #expect(document.verify(with: key.publicKey) == .valid) }
        // The answer's members must say what the claims say.
        let lying = try SignatureDocument.decodeAll(json: Data(response.replacingOccurrences(of: #""allowIntroductoryOffer":false"#, with: #""allowIntroductoryOffer":true"#).utf8))
        for document in lying { #expect(document.verify(with: key.publicKey) != .valid) }
    }

    @Test("RFC 3339 times are computed from whole milliseconds")
    func rfc3339() {
        #expect(Date.rfc3339(milliseconds: 1_795_405_886_734) == "2026-11-23T03:51:26.734Z")
        #expect(Date.rfc3339(milliseconds: 0) == "1970-01-01T00:00:00.000Z")
        #expect(Date.rfc3339(milliseconds: 951_782_400_005) == "2000-02-29T00:00:00.005Z")
        #expect(Date.rfc3339(milliseconds: 4_102_444_799_999) == "2099-12-31T23:59:59.999Z")
        #expect(Date.rfc3339(milliseconds: -1) == "1969-12-31T23:59:59.999Z")
        #expect(Date.rfc3339(milliseconds: 253_402_300_799_999) == "9999-12-31T23:59:59.999Z")
        #expect(Date.rfc3339(milliseconds: 253_402_300_800_000) == "10000-01-01T00:00:00.000Z")
    }

    /// The hand-written form agrees with Foundation's calendar and formatter on random times
    /// from year 1600 to 9999 (Foundation's calendar is Julian before 1582), and UUIDs print as
    /// `uuidString` lowercased.
    @Test("RFC 3339 times and lowercase UUIDs agree with Foundation's own")
    func rfc3339AndUUIDsAgreeWithFoundation() async {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        var random = SeededGenerator()
        for round in 0..<2_000 {
            // Seconds of CPU in a debug build: let other work on the concurrency pool (the
            // servers of other tests) run now and then.
            if round.isMultiple(of: 100) { await Task.yield() }
            let milliseconds = Int64.random(in: -11_676_096_000_000...253_402_300_799_999, using: &random)
            let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
            let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: Date(timeIntervalSince1970: Double(seconds)))
            let expected = String(
                format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", parts.year!, parts.month!, parts.day!, parts.hour!, parts.minute!, parts.second!,
                Int(milliseconds - seconds * 1000))
            #expect(Date.rfc3339(milliseconds: milliseconds) == expected, "seed \(random.seed): \(milliseconds)")
            let uuid = UUID(uuid: (
                UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random),
                UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random),
                UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random),
                UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random),
                UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random), UInt8.random(in: 0...255, using: &random),
                UInt8.random(in: 0...255, using: &random)))
            #expect(uuid.lowercasedString == uuid.uuidString.lowercased())
        }
    }
}
