import Crypto
import Foundation
import Testing

/// The legacy object's fields, in StoreKit's order.
let legacyFields = ["format", "bundleID", "productID", "offerID", "appAccountToken", "keyID", "nonce", "timestamp", "signature"]

/// `sign` (legacy) arguments for a key file.
func legacySignArguments(
    keyFile: URL, keyID: String = "TESTKEY001", bundleID: String = "com.example.app", productID: String = "com.example.app.monthly",
    offerID: String = "WINBACK50", extra: [String] = []
) -> [String] {
    ["sign", "--key-file", keyFile.path, "--key-id", keyID, "--bundle-id", bundleID, "--product-id", productID, "--offer-id", offerID] + extra
}

@Suite("sign (legacy) and verify")
struct SignLegacyTests {
    @Test("prints exactly the legacy fields, in order, with the token and nonce lowercased and the timestamp an integer")
    func exactOutput() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let token = "7E3FB20B-4CDB-47CC-936D-99D65F608138"
            let nonce = "4F0F8C5E-1B3A-4D8E-9C2B-ABCDEF012345"
            let timestamp: Int64 = 1_760_000_000_123
            let result = try await run(legacySignArguments(keyFile: keyFile, extra: [
                "--app-account-token", token, "--nonce", nonce, "--timestamp", String(timestamp),
            ]))
            try expectSuccess(result)
            let text = result.stdout.trimmingCharacters(in: .newlines)
            #expect(!text.contains("\n"), "one line of JSON")
            #expect(topLevelKeys(ofJSONObject: text) == legacyFields, "field order: \(text)")

            let object = try jsonObject(text)
            #expect(Set(object.keys) == Set(legacyFields))
            #expect(object["format"] as? String == "legacy")
            #expect(object["bundleID"] as? String == "com.example.app")
            #expect(object["productID"] as? String == "com.example.app.monthly")
            #expect(object["offerID"] as? String == "WINBACK50")
            #expect(object["appAccountToken"] as? String == token.lowercased())
            #expect(object["keyID"] as? String == "TESTKEY001")
            #expect(object["nonce"] as? String == nonce.lowercased())
            // A JSON integer in milliseconds, not a string, not a float.
            #expect(text.contains("\"timestamp\":\(timestamp),"), "\(text)")
            #expect((object["timestamp"] as? NSNumber)?.int64Value == timestamp)

            // Verify independently with the public key: DER ECDSA over the U+2063-joined payload.
            let signatureText = try #require(object["signature"] as? String)
            let der = try #require(Data(base64Encoded: signatureText), "signature is standard Base64")
            let signature = try P256.Signing.ECDSASignature(derRepresentation: der)
            let payload = ["com.example.app", "TESTKEY001", "com.example.app.monthly", "WINBACK50", token.lowercased(), nonce.lowercased(), String(timestamp)]
                .joined(separator: "\u{2063}")
            #expect(try loadPrivateKey(keyFile).publicKey.isValidSignature(signature, for: Data(payload.utf8)))
        }
    }

    @Test("defaults: a fresh lowercase nonce, the current time in milliseconds, appAccountToken null")
    func defaults() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let before = Int64(Date().timeIntervalSince1970 * 1000)
            let result = try await run(legacySignArguments(keyFile: keyFile))
            let after = Int64(Date().timeIntervalSince1970 * 1000)
            try expectSuccess(result)
            let text = result.stdout.trimmingCharacters(in: .newlines)
            #expect(topLevelKeys(ofJSONObject: text) == legacyFields)
            let object = try jsonObject(text)
            #expect(object["appAccountToken"] is NSNull)
            #expect(isLowercaseUUID(try #require(object["nonce"] as? String)))
            let timestamp = try #require((object["timestamp"] as? NSNumber)?.int64Value)
            #expect(timestamp >= before - 1000 && timestamp <= after + 1000, "timestamp \(timestamp) is not now in ms")

            let second = try jsonObject(try await run(legacySignArguments(keyFile: keyFile)).stdout)
            #expect(second["nonce"] as? String != object["nonce"] as? String, "each signature gets a fresh nonce")
        }
    }

    @Test("piping the output into verify --key-file exits 0; --input FILE works too")
    func verifyWithKeyFile() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let signed = try await run(legacySignArguments(keyFile: keyFile, extra: ["--app-account-token", "7E3FB20B-4CDB-47CC-936D-99D65F608138"]))
            try expectSuccess(signed)

            let verified = try await run(["verify", "--key-file", keyFile.path], stdin: Data(signed.stdout.utf8))
            try expectSuccess(verified)
            #expect(verified.stdout.hasPrefix("valid"), "\(verified.stdout)")

            let input = directory.appendingPathComponent("offer.json")
            try Data(signed.stdout.utf8).write(to: input)
            try expectSuccess(try await run(["verify", "--key-file", keyFile.path, "--input", input.path]))

            let missing = try await run(["verify", "--key-file", keyFile.path, "--input", directory.appendingPathComponent("nope.json").path])
            expectCleanFailure(missing, exitCode: 2, mentions: ["nope.json"])
        }
    }

    @Test("verify --public-key with the public PEM (from openssl and from swift-crypto) exits 0")
    func verifyWithPublicKey() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let signed = try await run(legacySignArguments(keyFile: keyFile))
            try expectSuccess(signed)

            let fromOpenSSL = directory.appendingPathComponent("openssl.pub.pem")
            _ = try await openssl(["pkey", "-in", keyFile.path, "-pubout", "-out", fromOpenSSL.path])
            let fromCrypto = directory.appendingPathComponent("crypto.pub.pem")
            try writeFile(try loadPrivateKey(keyFile).publicKey.pemRepresentation, to: fromCrypto, mode: 0o644)

            for publicKey in [fromOpenSSL, fromCrypto] {
                let verified = try await run(["verify", "--public-key", publicKey.path], stdin: Data(signed.stdout.utf8))
                try expectSuccess(verified, publicKey.lastPathComponent)
                #expect(verified.stdout.hasPrefix("valid"))
            }
        }
    }

    @Test("verify with another key exits 1 with a one-line reason")
    func verifyWithOtherKey() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let otherKey = try await generateKey(in: directory, name: "other.p8")
            let signed = try await run(legacySignArguments(keyFile: keyFile))
            try expectSuccess(signed)

            let result = try await run(["verify", "--key-file", otherKey.path], stdin: Data(signed.stdout.utf8))
            expectCleanFailure(result, exitCode: 1, mentions: ["invalid"])
            let lines = result.stdout.split(separator: "\n")
            #expect(lines.count == 1, "one line: \(result.stdout)")
            #expect(lines.first?.hasPrefix("invalid: ") == true)
            #expect(result.stdout.contains("does not match"))
        }
    }

    @Test("a tampered productID, nonce, timestamp or signature exits 1")
    func tampered() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let signed = try await run(legacySignArguments(keyFile: keyFile, extra: ["--timestamp", "1760000000123"]))
            try expectSuccess(signed)
            let original = signed.stdout

            var object = try jsonObject(original)
            let nonce = try #require(object["nonce"] as? String)
            let variants: [(String, String)] = [
                ("productID", original.replacingOccurrences(of: "\"com.example.app.monthly\"", with: "\"com.example.app.yearly\"")),
                ("timestamp", original.replacingOccurrences(of: "1760000000123", with: "1760000000124")),
                ("keyID", original.replacingOccurrences(of: "\"TESTKEY001\"", with: "\"TESTKEY002\"")),
                ("nonce", original.replacingOccurrences(of: nonce, with: UUID().uuidString.lowercased())),
            ]
            for (field, text) in variants {
                #expect(text != original, "tampering \(field) changed nothing")
                let result = try await run(["verify", "--key-file", keyFile.path], stdin: Data(text.utf8))
                expectCleanFailure(result, exitCode: 1, mentions: ["invalid"])
            }

            // A signature over other bytes (still valid DER) and a signature that is not Base64.
            object["signature"] = try loadPrivateKey(keyFile).signature(for: Data("other".utf8)).derRepresentation.base64EncodedString()
            let resigned = String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(resigned.utf8)), exitCode: 1)
            object["signature"] = "!!!not base64!!!"
            let garbled = String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(garbled.utf8)), exitCode: 1, mentions: ["Base64"])
        }
    }

    @Test("malformed JSON, a missing field, a mistyped field, an unknown format: exit 2 with a message")
    func unreadableInput() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let signed = try await run(legacySignArguments(keyFile: keyFile))
            try expectSuccess(signed)
            var object = try jsonObject(signed.stdout)

            let verify = ["verify", "--key-file", keyFile.path]
            expectCleanFailure(try await run(verify, stdin: Data("{not json".utf8)), exitCode: 2, mentions: ["not valid JSON"])
            expectCleanFailure(try await run(verify, stdin: Data()), exitCode: 2, mentions: ["JSON"])
            expectCleanFailure(try await run(verify, stdin: Data("[1,2,3]".utf8)), exitCode: 2)

            object.removeValue(forKey: "signature")
            let missing = String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
            expectCleanFailure(try await run(verify, stdin: Data(missing.utf8)), exitCode: 2, mentions: ["missing field", "signature"])

            object["signature"] = "AAAA"
            object["timestamp"] = "1760000000123"
            let mistyped = String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
            expectCleanFailure(try await run(verify, stdin: Data(mistyped.utf8)), exitCode: 2, mentions: ["timestamp"])

            let unknown = signed.stdout.replacingOccurrences(of: "\"format\":\"legacy\"", with: "\"format\":\"legacy-v2\"")
            expectCleanFailure(try await run(verify, stdin: Data(unknown.utf8)), exitCode: 2, mentions: ["unknown format", "legacy-v2"])

            var noFormat = try jsonObject(signed.stdout)
            noFormat.removeValue(forKey: "format")
            let formatless = String(decoding: try JSONSerialization.data(withJSONObject: noFormat), as: UTF8.self)
            expectCleanFailure(try await run(verify, stdin: Data(formatless.utf8)), exitCode: 2, mentions: ["format"])
        }
    }

    @Test("verify needs exactly one of --key-file and --public-key, and a usable key")
    func verifyKeyOptions() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let signed = try await run(legacySignArguments(keyFile: keyFile))
            try expectSuccess(signed)
            let stdin = Data(signed.stdout.utf8)
            expectCleanFailure(try await run(["verify"], stdin: stdin), mentions: ["--key-file", "--public-key"])
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path, "--public-key", keyFile.path], stdin: stdin), mentions: ["exactly one"])
            expectCleanFailure(try await run(["verify", "--key-file", directory.appendingPathComponent("missing.p8").path], stdin: stdin), exitCode: 2, mentions: ["does not exist"])
            let garbage = directory.appendingPathComponent("garbage.pem")
            try writeFile("hello, world\n", to: garbage)
            expectCleanFailure(try await run(["verify", "--public-key", garbage.path], stdin: stdin), exitCode: 2, mentions: ["PEM"])
        }
    }
}
