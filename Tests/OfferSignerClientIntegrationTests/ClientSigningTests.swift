import Crypto
import Foundation
import HummingbirdTesting
import OfferSignerClient
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// `signPromotionalOffer` over URLSession against `offer-signer`'s real server on loopback: what
/// the app gets back verifies against the imported key.
@Suite("OfferSignerClient signs against a real server")
struct ClientSigningTests {
    static let token = UUID(uuidString: "6B29FC40-CA47-1067-B31D-00DD010662DA")!

    /// Checks `offer.legacy` against `publicKey` the way StoreKit would rebuild the payload.
    static func expectLegacyVerifies(
        _ offer: SignedPromotionalOffer, key: InAppPurchaseKey, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let legacy = try #require(offer.legacy, sourceLocation: sourceLocation)
        #expect(legacy.keyID == key.keyID, sourceLocation: sourceLocation)
        let payload = try PromotionalOfferPayload(
            bundleID: offer.bundleID, keyID: legacy.keyID, productID: offer.productID, offerID: offer.offerID,
            appAccountToken: offer.appAccountToken, nonce: legacy.nonce, timestamp: legacy.timestamp)
        let verifier = PromotionalOfferVerifier(publicKey: key.publicKey)
        #expect(verifier.verifyLegacy(payload: payload, signature: legacy.signature) == .valid, sourceLocation: sourceLocation)
        let document = LegacySignatureDocument(payload: payload, signature: legacy.signature)
        #expect(SignatureDocument.legacy(document).verify(with: key.publicKey) == .valid, sourceLocation: sourceLocation)
        // The bytes StoreKit 2 gets (`signatureData`) are the DER signature itself.
        let der = try P256.Signing.ECDSASignature(derRepresentation: legacy.signatureData)
        #expect(key.publicKey.isValidSignature(der, for: payload.signedBytes), sourceLocation: sourceLocation)
        // And it is bound to what was asked: another offer ID does not verify.
        let otherOffer = try PromotionalOfferPayload(
            bundleID: offer.bundleID, keyID: legacy.keyID, productID: offer.productID, offerID: offer.offerID + "X",
            appAccountToken: offer.appAccountToken, nonce: legacy.nonce, timestamp: legacy.timestamp)
        #expect(verifier.verifyLegacy(payload: otherOffer, signature: legacy.signature) != .valid, sourceLocation: sourceLocation)
    }

    @Test("Legacy + JWS with an API key: both verify with the key, expiresAt is timestamp + 24 h, the token round-trips lowercased")
    func legacyAndJWS() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let key = try #require(server.keys["com.example.app"])
        let counter = CallCounter()
        let before = Date()
        let offer = try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter)
            return try await signer.signPromotionalOffer(
                productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token,
                formats: [.legacy, .jws], transactionID: "2000000123")
        }
        #expect(await counter.count == 1)
        #expect(offer.bundleID == "com.example.app")
        #expect(offer.productID == "pro.monthly")
        #expect(offer.offerID == "WINBACK50")
        #expect(offer.appAccountToken == Self.token)
        #expect(offer.applicationUsername == "6b29fc40-ca47-1067-b31d-00dd010662da")
        // What the app would persist carries the token lowercased.
        let stored = String(decoding: try JSONEncoder().encode(offer), as: UTF8.self)
        #expect(stored.contains(#""appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da""#), "\(stored)")

        try Self.expectLegacyVerifies(offer, key: key)
        let legacy = try #require(offer.legacy)
        let jws = try #require(offer.jws)
        #expect(jws.keyID == key.keyID)
        let jwsDocument = PromotionalOfferJWSDocument(
            bundleID: offer.bundleID, productID: offer.productID, offerID: offer.offerID, keyID: jws.keyID,
            transactionID: "2000000123", compactJWS: jws.compactJWS)
        #expect(SignatureDocument.jws(jwsDocument).verify(with: key.publicKey) == .valid)
        // Another key does not verify either signature.
        let stranger = try InAppPurchaseKey.generateForDevelopment(keyID: "STRANGER01")
        #expect(SignatureDocument.jws(jwsDocument).verify(with: stranger.publicKey) != .valid)
        #expect(PromotionalOfferVerifier(publicKey: stranger.publicKey).verifyLegacy(
            payload: try PromotionalOfferPayload(
                bundleID: offer.bundleID, keyID: legacy.keyID, productID: offer.productID, offerID: offer.offerID,
                appAccountToken: offer.appAccountToken, nonce: legacy.nonce, timestamp: legacy.timestamp),
            signature: legacy.signature) != .valid)

        // Timestamp is "now"; expiresAt is 24 h after it (the wire format has millisecond precision).
        #expect(legacy.timestamp >= before.unixMilliseconds - 1_000)
        #expect(legacy.timestamp <= Date().unixMilliseconds + 1_000)
        let expectedExpiry = Double(legacy.timestamp + 86_400_000) / 1000
        #expect(abs(offer.expiresAt.timeIntervalSince1970 - expectedExpiry) < 0.002, "\(offer.expiresAt) vs \(expectedExpiry)")
        #expect(!offer.isExpired())
        #expect(offer.isExpired(at: offer.expiresAt))

        // The ledger holds exactly these two signatures.
        #expect(try server.issuedCount() == 2)
    }

    @Test("Legacy alone; JWS alone; no token; the authorization closure runs once per request; nonces are fresh")
    func formatsAndPerRequestAuthorization() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let key = try #require(server.keys["com.example.app"])
        let counter = CallCounter()
        let offers = try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter)
            let first = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, formats: [.legacy])
            let second = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, formats: [.legacy])
            let anonymous = try await signer.signPromotionalOffer(productID: "pro.yearly", offerID: "GOODWILL", appAccountToken: nil, formats: [.legacy])
            let jwsOnly = try await signer.signPromotionalOffer(
                productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, formats: [.jws],
                bundleID: "com.example.app")
            return [first, second, anonymous, jwsOnly]
        }
        #expect(await counter.count == 4)
        let (first, second, anonymous, jwsOnly) = (offers[0], offers[1], offers[2], offers[3])
        #expect(first.jws == nil && second.jws == nil && anonymous.jws == nil)
        try Self.expectLegacyVerifies(first, key: key)
        try Self.expectLegacyVerifies(second, key: key)
        #expect(try #require(first.legacy).nonce != (try #require(second.legacy).nonce))
        #expect(anonymous.appAccountToken == nil)
        #expect(anonymous.applicationUsername == nil)
        try Self.expectLegacyVerifies(anonymous, key: key)
        #expect(jwsOnly.legacy == nil)
        let jws = try #require(jwsOnly.jws)
        let document = PromotionalOfferJWSDocument(
            bundleID: jwsOnly.bundleID, productID: jwsOnly.productID, offerID: jwsOnly.offerID, keyID: jws.keyID,
            transactionID: nil, compactJWS: jws.compactJWS)
        #expect(SignatureDocument.jws(document).verify(with: key.publicKey) == .valid)
        #expect(try server.issuedCount() == 4)
    }

    @Test("A user JWT: the server's bound token comes back, including when the app sent none")
    func userJWTBinding() async throws {
        let server = try await TestServer {
            $0.userJWT = UserJWT.configuration
            $0.eligibility = UserJWT.catalog
        }
        defer { server.cleanUp() }
        let key = try #require(server.keys["com.example.app"])
        let jwt = try UserJWT.token(appAccountToken: Self.token)
        let counter = CallCounter()
        let (explicit, filledIn) = try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: jwt, counter: counter)
            let explicit = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, formats: [.legacy])
            let filledIn = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: nil, formats: [.legacy])
            return (explicit, filledIn)
        }
        #expect(explicit.appAccountToken == Self.token)
        try Self.expectLegacyVerifies(explicit, key: key)
        // The legacy signature is bound to the user's token, so the purchase must carry it: the offer
        // says which (the StoreKit helpers add `.appAccountToken` from it).
        #expect(filledIn.appAccountToken == Self.token)
        try Self.expectLegacyVerifies(filledIn, key: key)
        #expect(await counter.count == 2)
    }
}
