import Crypto
import Foundation
import Testing

@Suite("keys generate")
struct KeysGenerateTests {
    @Test("writes a PKCS#8 P-256 PEM with mode 0600 and says it is not issued by Apple")
    func writesPKCS8() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("AuthKey_DEVKEY0001.p8")
            let result = try await run(["keys", "generate", "--key-id", "DEVKEY0001", "--output", path.path])
            try expectSuccess(result)
            expectNoCrashReport(result)
            #expect(result.stderr.contains("NOT issued by Apple"))
            #expect(result.stdout.isEmpty, "the notice goes to stderr; stdout: \(result.stdout)")
            #expect(try posixMode(path) == 0o600)

            let pem = try String(contentsOf: path, encoding: .utf8)
            #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----\n"))
            #expect(pem.trimmingCharacters(in: .whitespacesAndNewlines).hasSuffix("-----END PRIVATE KEY-----"))
            let key = try P256.Signing.PrivateKey(pemRepresentation: pem)

            // openssl agrees it is an unencrypted PKCS#8 P-256 key.
            let text = try await openssl(["pkey", "-in", path.path, "-noout", "-text"])
            #expect(text.contains("prime256v1") || text.contains("P-256"), "\(text)")

            // The printed fingerprint is SHA-256 of the public key's DER SubjectPublicKeyInfo.
            let fingerprint = SHA256.hash(data: key.publicKey.derRepresentation).map { String(format: "%02x", $0) }.joined()
            #expect(result.stderr.contains(fingerprint), "\(result.stderr)")
        }
    }

    @Test("refuses to overwrite without --force; --force replaces the file, again with mode 0600")
    func overwrite() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("key.p8")
            try expectSuccess(try await run(["keys", "generate", "--key-id", "K1", "--output", path.path]))
            let original = try Data(contentsOf: path)

            let refused = try await run(["keys", "generate", "--key-id", "K1", "--output", path.path])
            expectCleanFailure(refused, mentions: ["already exists", "--force"])
            #expect(try Data(contentsOf: path) == original, "the existing key must be left untouched")

            // A world-readable file is replaced by a 0600 one.
            try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: path.path)
            let forced = try await run(["keys", "generate", "--key-id", "K1", "--output", path.path, "--force"])
            try expectSuccess(forced)
            #expect(try Data(contentsOf: path) != original)
            #expect(try posixMode(path) == 0o600)
            _ = try loadPrivateKey(path)
        }
    }

    @Test("refuses a directory that does not exist")
    func missingDirectory() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("no/such/dir/key.p8")
            let result = try await run(["keys", "generate", "--key-id", "K1", "--output", path.path])
            expectCleanFailure(result, mentions: ["cannot create", path.path])
            #expect(!FileManager.default.fileExists(atPath: path.path))
        }
    }

    @Test("refuses an empty or invisible-character key ID")
    func badKeyID() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("key.p8")
            expectCleanFailure(try await run(["keys", "generate", "--key-id", "", "--output", path.path]), mentions: ["keyID", "empty"])
            expectCleanFailure(try await run(["keys", "generate", "--key-id", "K\u{2063}1", "--output", path.path]), mentions: ["U+2063"])
            #expect(!FileManager.default.fileExists(atPath: path.path))
        }
    }
}
