import Crypto
import Foundation
import Testing

/// A legacy object signed the wrong way, in-process with swift-crypto.
struct MistakeCase: Sendable, CustomTestStringConvertible {
    var name: String
    /// The code `explain` must name.
    var code: String
    var testDescription: String { "\(name) → \(code)" }

    /// Fields of the object (what is sent to StoreKit).
    var bundleID = "com.example.app"
    var keyID = "TESTKEY001"
    var productID = "com.example.app.monthly"
    var offerID = "WINBACK50"
    var token: String? = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    var nonce = "4f0f8c5e-1b3a-4d8e-9c2b-abcdef012345"
    var timestamp: Int64 = 1_760_000_000_123

    /// Overrides of what was actually signed.
    var signedKeyID: String?
    var signedBundleID: String?
    var signedToken: String?
    var signedNonce: String?
    var signedTimestamp: String?
    var separator = "\u{2063}"
    var encoding: SignatureEncoding = .derBase64

    enum SignatureEncoding: Sendable {
        case derBase64, rawBase64, derBase64URL, rawBase64URL
    }

    static let all: [MistakeCase] = [
        MistakeCase(name: "nonce signed in uppercase", code: "nonce_uppercase", signedNonce: "4F0F8C5E-1B3A-4D8E-9C2B-ABCDEF012345"),
        MistakeCase(name: "appAccountToken signed in uppercase", code: "app_account_token_uppercase", signedToken: "7E3FB20B-4CDB-47CC-936D-99D65F608138"),
        MistakeCase(name: "appAccountToken left out of the signature", code: "app_account_token_not_signed", signedToken: ""),
        MistakeCase(name: "timestamp signed in seconds", code: "timestamp_seconds", signedTimestamp: "1760000000"),
        MistakeCase(name: "object carries seconds, milliseconds were signed", code: "timestamp_seconds_in_object", timestamp: 1_760_000_000, signedTimestamp: "1760000000000"),
        MistakeCase(name: "key ID signed in lowercase", code: "other_key_id", signedKeyID: "testkey001"),
        MistakeCase(name: "bundle ID signed empty", code: "other_bundle_id", signedBundleID: ""),
        MistakeCase(name: "fields joined with commas", code: "wrong_separator", separator: ","),
        MistakeCase(name: "fields joined with U+2064", code: "wrong_separator", separator: "\u{2064}"),
        MistakeCase(name: "raw r‖s instead of DER", code: "raw_signature", encoding: .rawBase64),
        MistakeCase(name: "DER in base64url", code: "base64url_signature", encoding: .derBase64URL),
        MistakeCase(name: "raw r‖s in base64url (JWS style)", code: "raw_base64url_signature", encoding: .rawBase64URL),
    ]

    /// The JSON object, with a signature made the wrong way.
    func document(signedWith key: P256.Signing.PrivateKey) throws -> String {
        let fields = [
            signedBundleID ?? bundleID, signedKeyID ?? keyID, productID, offerID, signedToken ?? token ?? "", signedNonce ?? nonce,
            signedTimestamp ?? String(timestamp),
        ]
        let payload = Data(fields.joined(separator: separator).utf8)
        var signatureText = ""
        // base64url must differ from standard Base64 to be a mistake at all: sign again until it does.
        for _ in 0..<200 {
            let signature = try key.signature(for: payload)
            switch encoding {
            case .derBase64: signatureText = signature.derRepresentation.base64EncodedString()
            case .rawBase64: signatureText = signature.rawRepresentation.base64EncodedString()
            case .derBase64URL: signatureText = base64URLEncode(signature.derRepresentation)
            case .rawBase64URL: signatureText = base64URLEncode(signature.rawRepresentation)
            }
            if encoding == .derBase64 || encoding == .rawBase64 || Data(base64Encoded: signatureText) == nil { break }
        }
        let object: [String: Any] = [
            "format": "legacy", "bundleID": bundleID, "productID": productID, "offerID": offerID,
            "appAccountToken": token.map { $0 as Any } ?? NSNull(), "keyID": keyID, "nonce": nonce, "timestamp": timestamp, "signature": signatureText,
        ]
        return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
    }
}

@Suite("explain")
struct ExplainTests {
    @Test("names the mistake behind a wrongly made signature and exits 1", arguments: MistakeCase.all)
    func namesMistake(_ mistake: MistakeCase) async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let document = try mistake.document(signedWith: try loadPrivateKey(keyFile))

            // It really is wrong: verify refuses it.
            let verified = try await run(["verify", "--key-file", keyFile.path], stdin: Data(document.utf8))
            expectCleanFailure(verified, exitCode: 1)

            let input = directory.appendingPathComponent("offer.json")
            try Data(document.utf8).write(to: input)
            let explained = try await run(["explain", "--key-file", keyFile.path, "--input", input.path])
            #expect(explained.status == 1, "stdout: \(explained.stdout) stderr: \(explained.stderr)")
            expectNoCrashReport(explained)
            #expect(explained.stdout.contains("- \(mistake.code):"), "expected \(mistake.code) in: \(explained.stdout)")
        }
    }

    @Test("a valid object: explain exits 0 and says there is nothing to explain")
    func validObject() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let inProcess = try MistakeCase(name: "none", code: "").document(signedWith: try loadPrivateKey(keyFile))
            let explained = try await run(["explain", "--key-file", keyFile.path], stdin: Data(inProcess.utf8))
            try expectSuccess(explained)
            #expect(explained.stdout.hasPrefix("valid"))

            // And an object printed by `sign`, checked with the public key.
            let signed = try await run(legacySignArguments(keyFile: keyFile))
            try expectSuccess(signed)
            let publicKey = directory.appendingPathComponent("public.pem")
            _ = try await openssl(["pkey", "-in", keyFile.path, "-pubout", "-out", publicKey.path])
            try expectSuccess(try await run(["explain", "--public-key", publicKey.path], stdin: Data(signed.stdout.utf8)))
        }
    }

    @Test("another key: exit 1, unexplained")
    func otherKey() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let otherKey = try await generateKey(in: directory, name: "other.p8")
            let document = try MistakeCase(name: "other key", code: "").document(signedWith: try loadPrivateKey(otherKey))
            let explained = try await run(["explain", "--key-file", keyFile.path], stdin: Data(document.utf8))
            expectCleanFailure(explained, exitCode: 1, mentions: ["matches no known mistake"])
        }
    }

    @Test("--try-key-id names a key ID the signer used instead")
    func candidateKeyID() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let document = try MistakeCase(name: "old key id", code: "", signedKeyID: "OLDKEY0001").document(signedWith: try loadPrivateKey(keyFile))
            let without = try await run(["explain", "--key-file", keyFile.path], stdin: Data(document.utf8))
            #expect(without.status == 1 && !without.stdout.contains("other_key_id"))
            let with = try await run(["explain", "--key-file", keyFile.path, "--try-key-id", "OLDKEY0001"], stdin: Data(document.utf8))
            #expect(with.status == 1)
            #expect(with.stdout.contains("- other_key_id:") && with.stdout.contains("OLDKEY0001"), "\(with.stdout)")
        }
    }

    @Test("unreadable input and JWS objects exit 2 with a message")
    func unreadable() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            expectCleanFailure(try await run(["explain", "--key-file", keyFile.path], stdin: Data("nope".utf8)), exitCode: 2, mentions: ["JSON"])
            let jws = try await run([
                "sign", "--format", "jws", "--key-file", keyFile.path, "--key-id", "TESTKEY001", "--bundle-id", "com.example.app",
                "--product-id", "p", "--offer-id", "o", "--issuer-id", issuerID,
            ])
            try expectSuccess(jws)
            expectCleanFailure(try await run(["explain", "--key-file", keyFile.path], stdin: Data(jws.stdout.utf8)), exitCode: 2, mentions: ["legacy", "verify"])
        }
    }
}
