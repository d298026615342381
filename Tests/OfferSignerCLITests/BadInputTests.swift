import Foundation
import Testing

/// One refused `sign` invocation. `@KEY` in `arguments` stands for a valid .p8.
struct BadSignCase: Sendable, CustomTestStringConvertible {
    var name: String
    var arguments: [String]
    var mentions: [String]
    var testDescription: String { name }

    static let base = ["sign", "--key-file", "@KEY", "--key-id", "TESTKEY001", "--bundle-id", "com.example.app", "--product-id", "com.example.app.monthly"]
    static let legacy = base + ["--offer-id", "WINBACK50"]
    static let jws = legacy + ["--format", "jws", "--issuer-id", issuerID]
    static let intro = base + ["--format", "intro-eligibility", "--issuer-id", issuerID, "--transaction-id", "2000000123456789", "--allow-introductory-offer", "true"]

    static let all: [BadSignCase] = [
        BadSignCase(name: "appAccountToken not a UUID", arguments: legacy + ["--app-account-token", "customer-42"], mentions: ["appAccountToken", "customer-42", "not a UUID"]),
        BadSignCase(name: "appAccountToken UUID without hyphens", arguments: legacy + ["--app-account-token", "7E3FB20B4CDB47CC936D99D65F608138"], mentions: ["appAccountToken", "not a UUID"]),
        BadSignCase(name: "nonce not a UUID", arguments: legacy + ["--nonce", "12345"], mentions: ["nonce", "12345", "not a UUID"]),
        BadSignCase(name: "timestamp in seconds", arguments: legacy + ["--timestamp", "1760000000"], mentions: ["timestamp", "seconds", "milliseconds"]),
        BadSignCase(name: "timestamp too far in the future", arguments: legacy + ["--timestamp", "99999999999999"], mentions: ["timestamp", "out of range"]),
        BadSignCase(name: "timestamp not a number", arguments: legacy + ["--timestamp", "yesterday"], mentions: ["timestamp"]),
        BadSignCase(name: "empty product ID", arguments: Array(base.dropLast()) + ["", "--offer-id", "WINBACK50"], mentions: ["productID", "empty"]),
        BadSignCase(name: "U+2063 in offer ID", arguments: base + ["--offer-id", "WIN\u{2063}BACK"], mentions: ["offerID", "U+2063"]),
        BadSignCase(name: "zero-width space in bundle ID", arguments: ["sign", "--key-file", "@KEY", "--key-id", "TESTKEY001", "--bundle-id", "com.example\u{200B}.app", "--product-id", "p", "--offer-id", "o"], mentions: ["bundleID", "U+200B"]),
        BadSignCase(name: "trailing space in key ID", arguments: ["sign", "--key-file", "@KEY", "--key-id", "TESTKEY001 ", "--bundle-id", "com.example.app", "--product-id", "p", "--offer-id", "o"], mentions: ["keyID", "whitespace"]),
        BadSignCase(name: "product ID over 255 bytes", arguments: Array(base.dropLast()) + [String(repeating: "p", count: 256), "--offer-id", "o"], mentions: ["productID", "255"]),
        BadSignCase(name: "legacy without --offer-id", arguments: base, mentions: ["--offer-id", "required"]),
        BadSignCase(name: "unknown --format", arguments: legacy + ["--format", "xml"], mentions: ["format", "xml"]),
        BadSignCase(name: "--nonce with jws", arguments: jws + ["--nonce", UUID().uuidString], mentions: ["--nonce", "does not apply", "jws"]),
        BadSignCase(name: "--timestamp with jws", arguments: jws + ["--timestamp", "1760000000123"], mentions: ["--timestamp", "does not apply"]),
        BadSignCase(name: "--app-account-token with jws", arguments: jws + ["--app-account-token", UUID().uuidString], mentions: ["--app-account-token", "does not apply"]),
        BadSignCase(name: "--issuer-id with legacy", arguments: legacy + ["--issuer-id", issuerID], mentions: ["--issuer-id", "does not apply", "legacy"]),
        BadSignCase(name: "--allow-introductory-offer with jws", arguments: jws + ["--allow-introductory-offer", "true"], mentions: ["--allow-introductory-offer", "does not apply"]),
        BadSignCase(name: "--offer-id with intro-eligibility", arguments: intro + ["--offer-id", "WINBACK50"], mentions: ["--offer-id", "does not apply"]),
        BadSignCase(name: "jws without --issuer-id", arguments: legacy + ["--format", "jws"], mentions: ["--issuer-id", "required"]),
        BadSignCase(name: "jws without --offer-id", arguments: base + ["--format", "jws", "--issuer-id", issuerID], mentions: ["--offer-id", "required"]),
        BadSignCase(name: "jws with an empty issuer ID", arguments: legacy + ["--format", "jws", "--issuer-id", ""], mentions: ["issuerID", "empty"]),
        BadSignCase(name: "intro-eligibility without --issuer-id", arguments: base + ["--format", "intro-eligibility", "--transaction-id", "1", "--allow-introductory-offer", "true"], mentions: ["--issuer-id", "required"]),
        BadSignCase(name: "intro-eligibility without --transaction-id", arguments: base + ["--format", "intro-eligibility", "--issuer-id", issuerID, "--allow-introductory-offer", "true"], mentions: ["--transaction-id", "required"]),
        BadSignCase(name: "intro-eligibility without --allow-introductory-offer", arguments: base + ["--format", "intro-eligibility", "--issuer-id", issuerID, "--transaction-id", "1"], mentions: ["--allow-introductory-offer", "required"]),
        BadSignCase(name: "--allow-introductory-offer neither true nor false", arguments: base + ["--format", "intro-eligibility", "--issuer-id", issuerID, "--transaction-id", "1", "--allow-introductory-offer", "yes"], mentions: ["allow-introductory-offer", "yes"]),
        BadSignCase(name: "missing --key-id", arguments: ["sign", "--key-file", "@KEY", "--bundle-id", "b", "--product-id", "p", "--offer-id", "o"], mentions: ["--key-id"]),
        BadSignCase(name: "unknown option", arguments: legacy + ["--expires", "tomorrow"], mentions: ["--expires"]),
    ]
}

/// Key files that are not App Store Connect .p8 keys, made with openssl.
struct BadKeyCase: Sendable, CustomTestStringConvertible {
    var name: String
    var openssl: [String]?  // writes to @OUT; nil: `contents` is the file
    var contents: String = ""
    var mentions: [String]
    var testDescription: String { name }

    static let all: [BadKeyCase] = [
        BadKeyCase(name: "RSA PKCS#8", openssl: ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", "@OUT"], mentions: ["RSA", "P-256"]),
        BadKeyCase(name: "RSA PKCS#1", openssl: ["genrsa", "-traditional", "-out", "@OUT", "1024"], mentions: ["RSA", "P-256"]),
        BadKeyCase(name: "EC P-384", openssl: ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", "@OUT"], mentions: ["P-384", "P-256"]),
        BadKeyCase(name: "Ed25519", openssl: ["genpkey", "-algorithm", "ed25519", "-out", "@OUT"], mentions: ["Ed25519", "P-256"]),
        BadKeyCase(name: "encrypted PKCS#8 P-256", openssl: ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-aes-256-cbc", "-pass", "pass:hunter2", "-out", "@OUT"], mentions: ["encrypted"]),
        BadKeyCase(name: "SEC1 EC PRIVATE KEY", openssl: ["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "@OUT"], mentions: ["SEC1", "PKCS#8", "openssl pkcs8"]),
        BadKeyCase(name: "a public key", openssl: nil, contents: "@PUBLIC", mentions: ["PUBLIC KEY", "PRIVATE KEY"]),
        BadKeyCase(name: "garbage text", openssl: nil, contents: "this is not a key\n", mentions: ["PEM"]),
        BadKeyCase(name: "empty file", openssl: nil, contents: "", mentions: ["PEM"]),
        BadKeyCase(name: "not UTF-8", openssl: nil, contents: "@BINARY", mentions: ["UTF-8"]),
        BadKeyCase(name: "damaged Base64", openssl: nil, contents: "-----BEGIN PRIVATE KEY-----\n@@@@not base64@@@@\n-----END PRIVATE KEY-----\n", mentions: ["Base64"]),
        BadKeyCase(name: "no END line", openssl: nil, contents: "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n", mentions: ["END"]),
        BadKeyCase(name: "truncated DER", openssl: nil, contents: "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n", mentions: ["key"]),
    ]
}

@Suite("bad input: a clear message and a non-zero exit, never a crash")
struct BadInputTests {
    @Test("sign refuses", arguments: BadSignCase.all)
    func signRefuses(_ badCase: BadSignCase) async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let arguments = badCase.arguments.map { $0 == "@KEY" ? keyFile.path : $0 }
            let result = try await run(arguments)
            expectCleanFailure(result, mentions: badCase.mentions)
            #expect(result.stdout.isEmpty, "nothing is signed: \(result.stdout)")
        }
    }

    @Test("a missing key file is named")
    func missingKeyFile() async throws {
        try await withTemporaryDirectory { directory in
            let path = directory.appendingPathComponent("AuthKey_MISSING.p8").path
            let result = try await run(["sign", "--key-file", path, "--key-id", "K", "--bundle-id", "b", "--product-id", "p", "--offer-id", "o"])
            expectCleanFailure(result, mentions: ["does not exist", path])
            #expect(result.stdout.isEmpty)
        }
    }

    @Test("a key file that is a directory, or unreadable, is refused cleanly")
    func unreadableKeyFile() async throws {
        try await withTemporaryDirectory { directory in
            let result = try await run(["sign", "--key-file", directory.path, "--key-id", "K", "--bundle-id", "b", "--product-id", "p", "--offer-id", "o"])
            expectCleanFailure(result, mentions: [directory.path])
        }
    }

    @Test("sign, verify and explain refuse key files that are not .p8 keys", arguments: BadKeyCase.all)
    func badKeyFiles(_ badCase: BadKeyCase) async throws {
        try await withTemporaryDirectory { directory in
            let goodKey = try await generateKey(in: directory)
            let badKey = directory.appendingPathComponent("bad.p8")
            if let arguments = badCase.openssl {
                _ = try await openssl(arguments.map { $0 == "@OUT" ? badKey.path : $0 })
            } else if badCase.contents == "@BINARY" {
                try Data([0x30, 0x82, 0xFF, 0xFE, 0xC3, 0x28]).write(to: badKey)
                try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: badKey.path)
            } else if badCase.contents == "@PUBLIC" {
                _ = try await openssl(["pkey", "-in", goodKey.path, "-pubout", "-out", badKey.path])
            } else {
                try writeFile(badCase.contents, to: badKey)
            }

            let signed = try await run(["sign", "--key-file", badKey.path, "--key-id", "K", "--bundle-id", "b", "--product-id", "p", "--offer-id", "o"])
            expectCleanFailure(signed, mentions: badCase.mentions)
            #expect(signed.stdout.isEmpty)

            let document = try await run(legacySignArguments(keyFile: goodKey, keyID: "TESTKEY001"))
            try expectSuccess(document)
            let verified = try await run(["verify", "--key-file", badKey.path], stdin: Data(document.stdout.utf8))
            expectCleanFailure(verified, exitCode: 2, mentions: badCase.mentions)
            let explained = try await run(["explain", "--key-file", badKey.path], stdin: Data(document.stdout.utf8))
            expectCleanFailure(explained, exitCode: 2, mentions: badCase.mentions)
        }
    }

    @Test("an unknown subcommand or no arguments at all exit non-zero without a crash")
    func usageErrors() async throws {
        expectCleanFailure(try await run(["frobnicate"]), mentions: ["frobnicate"])
        let bare = try await run([])
        #expect(bare.status >= 0)
        expectNoCrashReport(bare)
        #expect((bare.stdout + bare.stderr).contains("USAGE") || (bare.stdout + bare.stderr).contains("Usage"))
    }
}
