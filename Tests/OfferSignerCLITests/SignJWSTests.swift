import Crypto
import Foundation
import Testing

/// A compact JWS taken apart and checked with the public key, independently of the CLI.
struct DecodedJWS {
    var header: [String: Any]
    var claims: [String: Any]
    var headerText: String
    var claimsText: String

    init(_ compact: String, publicKey: P256.Signing.PublicKey, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let parts = compact.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3, "compact JWS has \(parts.count) segments", sourceLocation: sourceLocation)
        for part in parts {
            #expect(!part.contains("=") && !part.contains("+") && !part.contains("/"), "segment is not unpadded base64url: \(part)", sourceLocation: sourceLocation)
        }
        let headerData = try #require(base64URLDecode(parts[0]), sourceLocation: sourceLocation)
        let claimsData = try #require(base64URLDecode(parts[1]), sourceLocation: sourceLocation)
        let signatureData = try #require(base64URLDecode(parts[2]), sourceLocation: sourceLocation)
        headerText = String(decoding: headerData, as: UTF8.self)
        claimsText = String(decoding: claimsData, as: UTF8.self)
        header = try jsonObject(headerText, sourceLocation: sourceLocation)
        claims = try jsonObject(claimsText, sourceLocation: sourceLocation)
        // ES256: raw r‖s, 64 bytes, over ASCII(header "." claims).
        try #require(signatureData.count == 64, "ES256 signature is \(signatureData.count) bytes", sourceLocation: sourceLocation)
        let signature = try P256.Signing.ECDSASignature(rawRepresentation: signatureData)
        let signingInput = Data("\(parts[0]).\(parts[1])".utf8)
        #expect(publicKey.isValidSignature(signature, for: signingInput), "ES256 signature does not verify", sourceLocation: sourceLocation)
    }
}

let issuerID = "57246542-96fe-1a63-e053-0824d011072a"

@Suite("sign --format jws / intro-eligibility")
struct SignJWSTests {
    @Test("jws: exact fields in order, header and claims as Apple's library writes them, verify exits 0")
    func promotionalOfferJWS() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory, keyID: "JWSKEY0001")
            let before = Int64(Date().timeIntervalSince1970)
            let result = try await run([
                "sign", "--format", "jws", "--key-file", keyFile.path, "--key-id", "JWSKEY0001", "--bundle-id", "com.example.app",
                "--product-id", "com.example.app.monthly", "--offer-id", "WINBACK50", "--issuer-id", issuerID, "--transaction-id", "2000000123456789",
            ])
            let after = Int64(Date().timeIntervalSince1970)
            try expectSuccess(result)
            let text = result.stdout.trimmingCharacters(in: .newlines)
            #expect(topLevelKeys(ofJSONObject: text) == ["format", "bundleID", "productID", "offerID", "keyID", "transactionID", "compactJWS"], "\(text)")
            let object = try jsonObject(text)
            #expect(object["format"] as? String == "jws")
            #expect(object["bundleID"] as? String == "com.example.app")
            #expect(object["productID"] as? String == "com.example.app.monthly")
            #expect(object["offerID"] as? String == "WINBACK50")
            #expect(object["keyID"] as? String == "JWSKEY0001")
            #expect(object["transactionID"] as? String == "2000000123456789")

            let publicKey = try loadPrivateKey(keyFile).publicKey
            let jws = try DecodedJWS(try #require(object["compactJWS"] as? String), publicKey: publicKey)
            #expect(jws.header["alg"] as? String == "ES256")
            #expect(jws.header["kid"] as? String == "JWSKEY0001")
            #expect(jws.header["typ"] as? String == "JWT")
            #expect(Set(jws.header.keys) == ["alg", "kid", "typ"])

            #expect(jws.claims["aud"] as? String == "promotional-offer")
            #expect(jws.claims["iss"] as? String == issuerID)
            #expect(jws.claims["bid"] as? String == "com.example.app")
            #expect(jws.claims["productId"] as? String == "com.example.app.monthly")
            #expect(jws.claims["offerIdentifier"] as? String == "WINBACK50")
            #expect(jws.claims["transactionId"] as? String == "2000000123456789")
            #expect(jws.claims["allowIntroductoryOffer"] == nil)
            #expect(jws.claims["exp"] == nil, "Apple's offer JWS has no exp")
            let iat = try #require((jws.claims["iat"] as? NSNumber)?.int64Value)
            #expect(iat >= before - 1 && iat <= after + 1, "iat \(iat) is not now in seconds")
            #expect(jws.claimsText.contains("\"iat\":\(iat)"), "iat is a JSON integer: \(jws.claimsText)")
            #expect(isLowercaseUUID(try #require(jws.claims["nonce"] as? String)))

            let verified = try await run(["verify", "--key-file", keyFile.path], stdin: Data(text.utf8))
            try expectSuccess(verified)
            #expect(verified.stdout.hasPrefix("valid"))
        }
    }

    @Test("jws without --transaction-id: transactionID null, no transactionId claim, still verifies")
    func promotionalOfferJWSWithoutTransaction() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory, keyID: "JWSKEY0001")
            let result = try await run([
                "sign", "--format", "jws", "--key-file", keyFile.path, "--key-id", "JWSKEY0001", "--bundle-id", "com.example.app",
                "--product-id", "com.example.app.monthly", "--offer-id", "WINBACK50", "--issuer-id", issuerID,
            ])
            try expectSuccess(result)
            let object = try jsonObject(result.stdout)
            #expect(object["transactionID"] == nil || object["transactionID"] is NSNull)
            let jws = try DecodedJWS(try #require(object["compactJWS"] as? String), publicKey: try loadPrivateKey(keyFile).publicKey)
            #expect(jws.claims["transactionId"] == nil)
            try expectSuccess(try await run(["verify", "--key-file", keyFile.path], stdin: Data(result.stdout.utf8)))
        }
    }

    @Test("jws: a document whose fields disagree with the claims, or another key, fails verify with exit 1")
    func promotionalOfferJWSTampered() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory, keyID: "JWSKEY0001")
            let other = try await generateKey(in: directory, keyID: "JWSKEY0002", name: "other.p8")
            let result = try await run([
                "sign", "--format", "jws", "--key-file", keyFile.path, "--key-id", "JWSKEY0001", "--bundle-id", "com.example.app",
                "--product-id", "com.example.app.monthly", "--offer-id", "WINBACK50", "--issuer-id", issuerID,
            ])
            try expectSuccess(result)
            let tampered = result.stdout.replacingOccurrences(of: "\"offerID\":\"WINBACK50\"", with: "\"offerID\":\"WINBACK90\"")
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(tampered.utf8)), exitCode: 1, mentions: ["offerIdentifier"])
            expectCleanFailure(try await run(["verify", "--key-file", other.path], stdin: Data(result.stdout.utf8)), exitCode: 1, mentions: ["invalid"])
        }
    }

    @Test("intro-eligibility: exact fields, claims with allowIntroductoryOffer true and false, verify exits 0", arguments: [true, false])
    func introductoryOfferEligibility(allow: Bool) async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory, keyID: "JWSKEY0001")
            let before = Int64(Date().timeIntervalSince1970)
            let result = try await run([
                "sign", "--format", "intro-eligibility", "--key-file", keyFile.path, "--key-id", "JWSKEY0001", "--bundle-id", "com.example.app",
                "--product-id", "com.example.app.monthly", "--issuer-id", issuerID, "--transaction-id", "2000000123456789",
                "--allow-introductory-offer", String(allow),
            ])
            let after = Int64(Date().timeIntervalSince1970)
            try expectSuccess(result)
            let text = result.stdout.trimmingCharacters(in: .newlines)
            #expect(topLevelKeys(ofJSONObject: text) == ["format", "bundleID", "productID", "keyID", "transactionID", "allowIntroductoryOffer", "compactJWS"], "\(text)")
            #expect(text.contains("\"allowIntroductoryOffer\":\(allow),"), "a JSON boolean: \(text)")
            let object = try jsonObject(text)
            #expect(object["format"] as? String == "intro-eligibility")
            #expect(object["bundleID"] as? String == "com.example.app")
            #expect(object["productID"] as? String == "com.example.app.monthly")
            #expect(object["keyID"] as? String == "JWSKEY0001")
            #expect(object["transactionID"] as? String == "2000000123456789")
            #expect(object["offerID"] == nil)

            let jws = try DecodedJWS(try #require(object["compactJWS"] as? String), publicKey: try loadPrivateKey(keyFile).publicKey)
            #expect(jws.header["alg"] as? String == "ES256")
            #expect(jws.header["kid"] as? String == "JWSKEY0001")
            #expect(jws.header["typ"] as? String == "JWT")
            #expect(jws.claims["aud"] as? String == "introductory-offer-eligibility")
            #expect(jws.claims["iss"] as? String == issuerID)
            #expect(jws.claims["bid"] as? String == "com.example.app")
            #expect(jws.claims["productId"] as? String == "com.example.app.monthly")
            #expect(jws.claims["transactionId"] as? String == "2000000123456789")
            #expect(jws.claimsText.contains("\"allowIntroductoryOffer\":\(allow)"), "a JSON boolean claim: \(jws.claimsText)")
            #expect(jws.claims["offerIdentifier"] == nil)
            #expect(jws.claims["exp"] == nil)
            let iat = try #require((jws.claims["iat"] as? NSNumber)?.int64Value)
            #expect(iat >= before - 1 && iat <= after + 1, "iat \(iat) is not now in seconds")
            #expect(isLowercaseUUID(try #require(jws.claims["nonce"] as? String)))

            try expectSuccess(try await run(["verify", "--key-file", keyFile.path], stdin: Data(text.utf8)))
            let flipped = text.replacingOccurrences(of: "\"allowIntroductoryOffer\":\(allow)", with: "\"allowIntroductoryOffer\":\(!allow)")
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(flipped.utf8)), exitCode: 1, mentions: ["allowIntroductoryOffer"])
        }
    }
}
