import Crypto
import Foundation
import OfferSignerCore
import Testing

@Suite("Loading .p8 In-App Purchase keys")
struct KeyParsingTests {
    @Test("A PKCS#8 P-256 key loads, whatever its line endings and trailing whitespace")
    func tolerantParsing() throws {
        let pem = TestKeyFixtures.p256
        let expected = try InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: pem).publicKeyFingerprint
        let variants = [
            pem,
            pem + "\n",
            pem.replacingOccurrences(of: "\n", with: "\r\n") + "\r\n",
            pem.replacingOccurrences(of: "\n", with: "\r"),
            pem + "   \n\n\t ",
            "\u{FEFF}" + pem,
            "  " + pem.replacingOccurrences(of: "\n", with: "  \n"),
        ]
        for variant in variants {
            let key = try InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: variant)
            #expect(key.publicKeyFingerprint == expected)
        }
        let publicKey = try InAppPurchaseKey.parsePublicKey(pem: TestKeyFixtures.p256Public)
        #expect(publicKey.offerSignerFingerprint == expected)
        #expect(try InAppPurchaseKey.parseVerificationKey(pem: TestKeyFixtures.p256Public).offerSignerFingerprint == expected)
        #expect(try InAppPurchaseKey.parseVerificationKey(pem: pem).offerSignerFingerprint == expected)
    }

    @Test("A generated key round-trips through its PKCS#8 PEM")
    func generatedRoundTrip() throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "DEVKEY0001")
        #expect(key.pkcs8PEMRepresentation.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        let reloaded = try InAppPurchaseKey(keyID: "DEVKEY0001", pemRepresentation: key.pkcs8PEMRepresentation)
        #expect(reloaded.publicKeyFingerprint == key.publicKeyFingerprint)
        #expect(key.publicKeyFingerprint.count == 64)
    }

    @Test("Anything but an unencrypted PKCS#8 P-256 key is refused with what was found", arguments: [
        (TestKeyFixtures.rsa, OfferSignerError.Code.keyUnsupportedAlgorithm, "RSA"),
        (TestKeyFixtures.ed25519, .keyUnsupportedAlgorithm, "Ed25519"),
        (TestKeyFixtures.p384, .keyUnsupportedCurve, "P-384"),
        (TestKeyFixtures.secp256k1, .keyUnsupportedCurve, "secp256k1"),
        (TestKeyFixtures.encrypted, .keyEncrypted, "encrypted"),
        (TestKeyFixtures.sec1, .keyNotPKCS8, "SEC1"),
        (TestKeyFixtures.p256Public, .keyNotPKCS8, "PUBLIC KEY"),
        ("hello, I am not a key", .keyNotPEM, "PEM"),
        ("", .keyNotPEM, "PEM"),
        ("-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n", .keyMalformed, "END"),
        ("-----BEGIN PRIVATE KEY-----\n!!!notbase64!!!\n-----END PRIVATE KEY-----\n", .keyMalformed, "Base64"),
        ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", .keyMalformed, "PKCS#8"),
        ("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", .keyNotPKCS8, "CERTIFICATE"),
    ])
    func refusals(pem: String, code: OfferSignerError.Code, mention: String) {
        do {
            _ = try InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: pem)
            Issue.record("accepted a key that must be refused (\(mention))")
        } catch {
            #expect(error.code == code)
            #expect(error.message.contains(mention), "message '\(error.message)' should mention \(mention)")
            #expect(!error.message.contains("MIG"), "errors never echo key material")
        }
    }

    @Test("A truncated PKCS#8 body is refused as damaged")
    func truncatedKey() throws {
        let lines = TestKeyFixtures.p256.split(separator: "\n")
        let damaged = ([lines[0], lines[1].prefix(40)] + [lines.last!]).joined(separator: "\n")
        #expect(throws: OfferSignerError.self) { try InAppPurchaseKey(keyID: "K", pemRepresentation: damaged) }
    }

    @Test("Key descriptions never contain the private key")
    func descriptionHidesSecret() throws {
        let key = try InAppPurchaseKey(keyID: "ABC123DEFG", pemRepresentation: TestKeyFixtures.p256)
        let body = TestKeyFixtures.p256.split(separator: "\n")[1]
        for text in [key.description, key.debugDescription, "\(key)", String(reflecting: key)] {
            #expect(!text.contains(body))
            #expect(!text.contains(key.privateKey.rawRepresentation.base64EncodedString()))
        }
    }
}
