import Crypto
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import OfferSignerCore
import TestChildProcess
import Testing

/// Interop with Apple's App Store Server Library for Python (app-store-server-library
/// 3.1.2), used as an independent oracle through `Tests/Interop/apple_oracle.py`.
/// The library comes from the tests' own Python environment (``PythonTestEnvironment``, pinned
/// in `Tests/Interop/requirements.txt`); these tests fail (they do not skip) when it cannot be made.
@Suite("Interop with Apple's App Store Server Library (Python)")
struct AppleLibraryInteropTests {
    static let oracleScript = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Interop/apple_oracle.py")

    /// Runs the oracle on a batch of cases (one Python start-up for the whole batch), with the
    /// interpreter of the tests' Python environment (``python()``), on a thread of its own so
    /// the child never holds one of the concurrency pool's threads.
    static func oracle(_ cases: [[String: Any]], python: String) async throws -> [[String: Any]] {
        let input = try JSONSerialization.data(withJSONObject: cases)
        let result = try await onOwnThread {
            try ChildProcess.run(python, [oracleScript.path], stdin: input, timeout: .seconds(300))
        }
        guard result.status == 0 else {
            throw OracleFailure(message: "apple_oracle.py exited \(result.status): \(result.stderrText)")
        }
        return try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [[String: Any]])
    }

    /// The interpreter with app-store-server-library installed, the environment made if needed.
    static func python() async throws -> String {
        try await PythonTestEnvironment.shared().python
    }

    struct OracleFailure: Error, CustomStringConvertible {
        var message: String
        var description: String { message }
    }

    let key = try! InAppPurchaseKey.generateForDevelopment(keyID: "INTEROP001")

    @Test("Our legacy signatures verify over the exact bytes Apple's library signs, for random inputs")
    func legacyOursVerifyWithApple() async throws {
        let python = try await Self.python()
        var random = SeededGenerator()
        var payloads: [PromotionalOfferPayload] = []
        var cases: [[String: Any]] = []
        let signer = PromotionalOfferSigner(key: key)
        for index in 0..<60 {
            let token = index % 5 == 0 ? "" : random.uuidInRandomCase()
            let nonce = UUID()
            let payload = try PromotionalOfferPayload(
                bundleID: random.identifier(), keyID: key.keyID, productID: random.identifier(), offerID: random.identifier(),
                appAccountToken: OfferFieldValidator.parseAppAccountToken(token), nonce: nonce,
                timestamp: Int64.random(in: 1_600_000_000_000..<2_000_000_000_000, using: &random))
            payloads.append(payload)
            cases.append([
                "op": "legacy-payload", "keyPEM": key.pkcs8PEMRepresentation, "keyID": key.keyID,
                "bundleID": payload.bundleID, "productID": payload.productID, "offerID": payload.offerID,
                "appAccountToken": token, "nonce": nonce.uuidString, "timestamp": payload.timestamp,
                "signature": try signer.legacySignature(for: payload),
            ])
        }
        let results = try await Self.oracle(cases, python: python)
        #expect(results.count == payloads.count)
        for (payload, result) in zip(payloads, results) {
            #expect(result["payloadHex"] as? String == Encoding.hex(payload.signedBytes), "seed \(random.seed): payload bytes differ from Apple's")
            #expect(result["valid"] as? Bool == true, "seed \(random.seed): Apple's payload + our signature did not verify")
        }
    }

    @Test("Signatures made by Apple's library verify with our verifier")
    func legacyTheirsVerifyWithUs() async throws {
        let python = try await Self.python()
        var random = SeededGenerator()
        var cases: [[String: Any]] = []
        var payloads: [PromotionalOfferPayload] = []
        for index in 0..<40 {
            let token = index % 4 == 0 ? "" : random.uuidInRandomCase()
            let nonce = UUID()
            let payload = try PromotionalOfferPayload(
                bundleID: random.identifier(), keyID: key.keyID, productID: random.identifier(), offerID: random.identifier(),
                appAccountToken: OfferFieldValidator.parseAppAccountToken(token), nonce: nonce, timestamp: Date().unixMilliseconds)
            payloads.append(payload)
            cases.append([
                "op": "legacy-sign", "keyPEM": key.pkcs8PEMRepresentation, "keyID": key.keyID, "bundleID": payload.bundleID,
                "productID": payload.productID, "offerID": payload.offerID, "appAccountToken": token,
                "nonce": nonce.uuidString, "timestamp": payload.timestamp,
            ])
        }
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        for (payload, result) in zip(payloads, try await Self.oracle(cases, python: python)) {
            let signature = try #require(result["signature"] as? String)
            #expect(verifier.verifyLegacy(payload: payload, signature: signature) == .valid, "seed \(random.seed)")
            let document = SignatureDocument.legacy(LegacySignatureDocument(payload: payload, signature: signature))
            #expect(document.verify(with: key.publicKey) == .valid)
        }
    }

    @Test("JWS: headers and claims equal Apple's (but nonce and iat); each side verifies the other's")
    func jwsBothWays() async throws {
        let python = try await Self.python()
        var random = SeededGenerator()
        let issuerID = UUID().uuidString.lowercased()
        let publicPEM = key.publicKey.pemRepresentation
        struct Case {
            var audience: OfferJWSAudience
            var bundleID: String
            var productID: String
            var offerID: String?
            var transactionID: String?
            var allow: Bool?
            var claims: OfferJWSClaims
        }
        // Both sides' iat must fall between the making of our claims and the oracle's answer (a
        // busy machine can stretch that to minutes, so no fixed tolerance).
        let madeFrom = Int64(Date().timeIntervalSince1970.rounded(.down))
        var cases: [Case] = []
        for index in 0..<30 {
            let bundleID = random.identifier()
            let productID = random.identifier()
            if index % 3 == 2 {
                let transactionID = String(UInt64.random(in: 1..<UInt64.max, using: &random))
                let allow = Bool.random(using: &random)
                let claims = try OfferJWSClaims.introductoryOfferEligibility(
                    issuerID: issuerID, bundleID: bundleID, productID: productID, allowIntroductoryOffer: allow,
                    transactionID: transactionID, issuedAt: Date(), nonce: UUID())
                cases.append(Case(audience: .introductoryOfferEligibility, bundleID: bundleID, productID: productID, offerID: nil, transactionID: transactionID, allow: allow, claims: claims))
            } else {
                let offerID = random.identifier()
                let transactionID = index % 3 == 0 ? nil : String(UInt64.random(in: 1..<UInt64.max, using: &random))
                let claims = try OfferJWSClaims.promotionalOffer(
                    issuerID: issuerID, bundleID: bundleID, productID: productID, offerID: offerID,
                    transactionID: transactionID, issuedAt: Date(), nonce: UUID())
                cases.append(Case(audience: .promotionalOffer, bundleID: bundleID, productID: productID, offerID: offerID, transactionID: transactionID, allow: nil, claims: claims))
            }
        }
        let signer = PromotionalOfferSigner(key: key)
        var requests: [[String: Any]] = []
        for item in cases {
            var sign: [String: Any] = [
                "op": "jws-sign", "kind": item.audience.rawValue, "keyPEM": key.pkcs8PEMRepresentation, "keyID": key.keyID,
                "issuerID": issuerID, "bundleID": item.bundleID, "productID": item.productID,
            ]
            if let offerID = item.offerID { sign["offerID"] = offerID }
            if let transactionID = item.transactionID { sign["transactionID"] = transactionID }
            if let allow = item.allow { sign["allowIntroductoryOffer"] = allow }
            requests.append(sign)
            requests.append(["op": "jws-verify", "publicKeyPEM": publicPEM, "audience": item.audience.rawValue, "compactJWS": signer.compactJWS(for: item.claims)])
        }
        let results = try await Self.oracle(requests, python: python)
        let window = madeFrom...Int64(Date().timeIntervalSince1970.rounded(.up))
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        for (index, item) in cases.enumerated() {
            // Theirs, verified by us.
            let theirs = try #require(results[2 * index]["compactJWS"] as? String)
            guard case .valid(let theirHeader, let theirClaims) = verifier.verifyJWS(theirs, audience: item.audience) else {
                Issue.record("Apple's JWS did not verify with our verifier: \(verifier.verifyJWS(theirs, audience: item.audience))")
                continue
            }
            // Ours, verified by them (PyJWT), with the same header and claims but nonce and iat.
            let ours = results[2 * index + 1]
            #expect(ours["valid"] as? Bool == true, "PyJWT refused our JWS: \(ours["error"] ?? "")")
            let ourHeader = try #require(ours["header"] as? [String: Any])
            #expect(ourHeader as NSDictionary == ["alg": theirHeader.alg, "kid": theirHeader.kid, "typ": theirHeader.typ as Any] as NSDictionary)
            var ourClaims = try #require(ours["claims"] as? [String: Any])
            #expect((ourClaims["iat"] as? Int).map { window.contains(Int64($0)) } == true, "our iat \(ourClaims["iat"] ?? "") is outside \(window)")
            #expect(window.contains(theirClaims.iat), "Apple's iat \(theirClaims.iat) is outside \(window)")
            #expect((ourClaims["nonce"] as? String).flatMap(UUID.init(uuidString:)) != nil)
            ourClaims["iat"] = nil
            ourClaims["nonce"] = nil
            var expected: [String: Any] = ["iss": theirClaims.iss, "aud": theirClaims.aud, "bid": theirClaims.bid, "productId": theirClaims.productId]
            if let offer = theirClaims.offerIdentifier { expected["offerIdentifier"] = offer }
            if let transaction = theirClaims.transactionId { expected["transactionId"] = transaction }
            if let allow = theirClaims.allowIntroductoryOffer { expected["allowIntroductoryOffer"] = allow }
            #expect(ourClaims as NSDictionary == expected as NSDictionary)
            #expect(theirClaims.nonce == theirClaims.nonce.lowercased())
        }
    }
}
