import Foundation
import Testing

/// Key commands on a store: every refusal gives a clear error and changes nothing (what
/// StoreCommandTests does not cover already: missing and wrong-type key files for `keys import`,
/// a missing master key file, unknown key IDs for every transition, a loose .p8 on an existing store).
@Suite("key commands refuse cleanly and leave the store unchanged")
struct KeyCommandRefusalTests {
    /// A store holding K1 (active) and K2 (ready).
    static func populated(_ directory: URL) async throws -> StoreFixture {
        let fixture = try StoreFixture(in: directory)
        try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))), "import K1")
        try expectSuccess(try await run(fixture.importArguments("K2", file: try fixture.key("K2"))), "import K2")
        return fixture
    }

    @Test("keys import: a missing .p8, a directory, a loose .p8 and a missing master key file are named; nothing changes")
    func importMissingAndPermissions() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try await Self.populated(directory)
            let before = try await fixture.snapshot()
            let missing = directory.appendingPathComponent("AuthKey_NOPE.p8")
            expectCleanFailure(try await run(fixture.importArguments("K3", file: missing)), mentions: ["does not exist", missing.path])
            expectCleanFailure(try await run(fixture.importArguments("K3", file: directory)), mentions: [directory.path])
            let loose = try await fixture.key("K3")
            try FileManager.default.setAttributes([.posixPermissions: 0o640], ofItemAtPath: loose.path)
            expectCleanFailure(try await run(fixture.importArguments("K3", file: loose)), mentions: ["chmod 600", "group or others"])
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: loose.path)
            let noMaster = directory.appendingPathComponent("no-master.key")
            expectCleanFailure(try await run(fixture.importArguments("K3", file: loose, masterKey: noMaster)), mentions: ["does not exist", noMaster.path])
            #expect(try await fixture.snapshot() == before)
            #expect(try await fixture.keys()["K3"] == nil)
        }
    }

    @Test("keys import: files that are not P-256 .p8 keys are refused, saying what they are; nothing changes", arguments: BadKeyCase.all)
    func importWrongKeyType(_ badCase: BadKeyCase) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try await Self.populated(directory)
            let goodKey = try await generateKey(in: directory)
            let badKey = directory.appendingPathComponent("bad.p8")
            if let arguments = badCase.openssl {
                _ = try await openssl(arguments.map { $0 == "@OUT" ? badKey.path : $0 })
            } else if badCase.contents == "@BINARY" {
                try Data([0x30, 0x82, 0xFF, 0xFE, 0xC3, 0x28]).write(to: badKey)
            } else if badCase.contents == "@PUBLIC" {
                _ = try await openssl(["pkey", "-in", goodKey.path, "-pubout", "-out", badKey.path])
            } else {
                try writeFile(badCase.contents, to: badKey)
            }
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: badKey.path)
            let before = try await fixture.snapshot()
            let result = try await run(fixture.importArguments("K3", file: badKey))
            expectCleanFailure(result, mentions: badCase.mentions)
            #expect(!result.stdout.contains("imported"))
            #expect(try await fixture.snapshot() == before)
        }
    }

    @Test("keys activate / retire / revoke of an unknown key ID name it and change nothing")
    func unknownKeyID() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try await Self.populated(directory)
            let before = try await fixture.snapshot()
            for verb in ["activate", "retire", "revoke"] {
                for extra in [[], ["--force"], ["--bundle-id", StoreFixture.bundleID]] where !(verb == "activate" && extra == ["--force"]) {
                    let result = try await fixture.transition(verb, "NOSUCHKEY", extra)
                    expectCleanFailure(result, mentions: ["NOSUCHKEY"])
                    #expect(!result.stderr.contains("PRIVATE KEY"))
                }
            }
            #expect(try await fixture.snapshot() == before)
            #expect(try await fixture.state("K1") == "active")
            #expect(try await fixture.state("K2") == "ready")
        }
    }
}

/// `audit checkpoints create/export` and `audit verify --checkpoints`, through the real CLI.
@Suite("audit checkpoints through the CLI")
struct AuditCheckpointsCLITests {
    @Test("create and export checkpoints; verify exits 0 intact, 1 on a truncated tail or edit, 2 on unreadable input")
    func checkpointsAndVerify() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try await KeyCommandRefusalTests.populated(directory)
            let store = fixture.store.path
            let exportFile = directory.appendingPathComponent("checkpoints.jsonl")

            // Before any checkpoint there is nothing to export.
            expectCleanFailure(try await run(["audit", "checkpoints", "export", "--store", store]), mentions: ["no checkpoint yet"])

            let created = try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", fixture.masterKey.path])
            try expectSuccess(created, "checkpoints create")
            #expect(created.stdout.contains("checkpoint of 2 records"), "\(created.stdout)")  // the 2 imports
            #expect(!created.stdout.contains("PRIVATE") && !created.stderr.contains("PRIVATE"))
            let again = try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", fixture.masterKey.path])
            try expectSuccess(again)
            #expect(again.stdout.contains("nothing to sign"))
            try expectSuccess(try await fixture.transition("activate", "K2"))  // record 3
            try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", fixture.masterKey.path]))

            let exported = try await run(["audit", "checkpoints", "export", "--store", store, "--output", exportFile.path])
            try expectSuccess(exported)
            let lines = try String(contentsOf: exportFile, encoding: .utf8).split(separator: "\n").map { try jsonObject(String($0)) }
            #expect(lines.count == 3)
            #expect(lines[0]["type"] as? String == "audit-signing-key")
            #expect((lines[0]["publicKeyPEM"] as? String)?.hasPrefix("-----BEGIN PUBLIC KEY-----") == true)
            #expect((lines[0]["fingerprint"] as? String)?.count == 64)
            #expect(lines.dropFirst().compactMap { ($0["sequence"] as? NSNumber)?.intValue } == [2, 3])
            let stdoutExport = try await run(["audit", "checkpoints", "export", "--store", store])
            #expect(stdoutExport.stdout == (try String(contentsOf: exportFile, encoding: .utf8)))

            let intact = try await run(["audit", "verify", "--store", store, "--checkpoints", exportFile.path])
            try expectSuccess(intact)
            #expect(intact.stdout.hasPrefix("intact: 3 records"), "\(intact.stdout)")

            // Unreadable input: exit 2.
            expectCleanFailure(try await run(["audit", "verify", "--store", store, "--checkpoints", directory.appendingPathComponent("nope").path]), exitCode: 2, mentions: ["does not exist"])
            let garbage = directory.appendingPathComponent("garbage.jsonl")
            try writeFile("{\"type\":\"checkpoint\"}\n", to: garbage)
            expectCleanFailure(try await run(["audit", "verify", "--store", store, "--checkpoints", garbage.path]), exitCode: 2, mentions: ["line 1"])
            expectCleanFailure(try await run(["audit", "verify", "--store", directory.appendingPathComponent("none.sqlite").path]), exitCode: 2, mentions: ["does not exist"])

            // The tail cut off, with the store's checkpoints: only the exported copy can tell.
            try await sqlite(fixture.store, "DELETE FROM audit_log WHERE seq = 3; DELETE FROM audit_checkpoints WHERE seq = 3")
            try expectSuccess(try await run(["audit", "verify", "--store", store]), "the store alone cannot tell")
            let truncated = try await run(["audit", "verify", "--store", store, "--checkpoints", exportFile.path])
            expectCleanFailure(truncated, exitCode: 1, mentions: ["record 3", "removed"])
            #expect(truncated.stdout.hasPrefix("broken: record 3"), "\(truncated.stdout)")

            // An edit is named too.
            try await sqlite(fixture.store, "UPDATE audit_log SET body = replace(body, 'K2', 'KX') WHERE seq = 2")
            expectCleanFailure(try await run(["audit", "verify", "--store", store, "--checkpoints", exportFile.path]), exitCode: 1, mentions: ["record 2"])
        }
    }
}
