import Foundation
import TestChildProcess
import TestPostgres
import Testing

/// The CLI side of "the master key guards everything": registry changes need it, a store made
/// before registry MACs is upgraded once by `store authenticate` (and `serve` refuses it before),
/// the checkpoint file beside the master key catches deleted checkpoints, and an export is only
/// ever appended to. Docs/Security.md's threat model names these tests.
@Suite("The master key guards the registry and the audit (CLI)")
struct MasterKeyGuardCLITests {
    @Test("audit verify with the checkpoint file beside the master key fails once checkpoints and the audit key are deleted by SQL; no checkpoint is signed", arguments: CLIStoreBackend.testedCases)
    func deletedCheckpointsFailVerify(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let store = fixture.storeArgument
            let masterKey = fixture.masterKey.path
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
            try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", masterKey]))
            #expect(FileManager.default.fileExists(atPath: masterKey + ".checkpoint"), "the checkpoint file beside the master key")
            let intact = try await run(["audit", "verify", "--store", store, "--master-key-file", masterKey])
            try expectSuccess(intact)
            #expect(intact.stdout.hasPrefix("intact: 1 records"), "\(intact.stdout)")

            try await fixture.execute("DELETE FROM audit_checkpoints")
            try await fixture.execute("DELETE FROM audit_signing_key")
            // The store alone is fooled; the file beside the master key is not.
            try expectSuccess(try await run(["audit", "verify", "--store", store]), "the store alone cannot tell")
            expectCleanFailure(try await run(["audit", "verify", "--store", store, "--master-key-file", masterKey]), exitCode: 1, mentions: ["key row was deleted"])
            expectCleanFailure(
                try await run(["audit", "verify", "--store", store, "--checkpoint-file", masterKey + ".checkpoint"]), exitCode: 1, mentions: ["checkpoints were deleted"])
            expectCleanFailure(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", masterKey]), mentions: ["refusing to sign a checkpoint"])
            #expect(try await run(["audit", "checkpoints", "export", "--store", store]).status != 0)
        }
    }

    @Test("audit checkpoints export appends to an existing export, and fails when the store's checkpoints do not extend it", arguments: CLIStoreBackend.testedCases)
    func exportAppends(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let store = fixture.storeArgument
            let masterKey = fixture.masterKey.path
            let export = fixture.directory.appendingPathComponent("checkpoints.jsonl")
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
            try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", masterKey]))
            try expectSuccess(try await run(["audit", "checkpoints", "export", "--store", store, "--output", export.path]))
            let first = try String(contentsOf: export, encoding: .utf8)
            try expectSuccess(try await run(fixture.importArguments("K2", file: try fixture.key("K2"))))
            try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", masterKey]))
            try expectSuccess(try await run(["audit", "checkpoints", "export", "--store", store, "--output", export.path]))
            let second = try String(contentsOf: export, encoding: .utf8)
            #expect(second.hasPrefix(first), "appended, not rewritten")
            #expect(second.split(separator: "\n").count == 3, "\(second)")

            try await fixture.execute("DELETE FROM audit_checkpoints WHERE seq = 1")
            expectCleanFailure(try await run(["audit", "checkpoints", "export", "--store", store, "--output", export.path]), mentions: ["do not extend", "deleted"])
            #expect(try String(contentsOf: export, encoding: .utf8) == second, "left as it was")
        }
    }

    @Test("Registry changes need the master key; a store without registry MACs is refused by serve until store authenticate, which runs once", arguments: CLIStoreBackend.testedCases)
    func upgradeNeedsTheMasterKey(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let store = fixture.storeArgument
            let masterKey = fixture.masterKey.path
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
            expectCleanFailure(try await run(["clients", "create", "--store", store, "--name", "backend"]), mentions: ["--master-key-file"])
            try expectSuccess(try await run(["clients", "create", "--store", store, "--master-key-file", masterKey, "--name", "backend"]))
            // Another master key is refused (its MACs would never verify).
            let other = fixture.directory.appendingPathComponent("other.key")
            try writeFile(Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString() + "\n", to: other, mode: 0o600)
            expectCleanFailure(try await run(["clients", "create", "--store", store, "--master-key-file", other.path, "--name", "intruder"]), mentions: ["master key"])

            // As a store made by an earlier offer-signer: no MACs, no marker.
            try await fixture.execute("UPDATE signing_keys SET registry_mac = NULL")
            try await fixture.execute("UPDATE api_clients SET registry_mac = NULL")
            try await fixture.execute("DELETE FROM meta WHERE name = 'registry_rows_authenticated'")
            expectCleanFailure(
                try await run(["serve", "--store", store, "--master-key-file", masterKey, "--port", "0"]), mentions: ["offer-signer store authenticate"])
            // This store was upgraded already (its registry file, its derived audit key and records):
            // rows stripped of their MACs are tampering, vouched for only with --accept-registry-rows,
            // which lists every row first.
            expectCleanFailure(
                try await run(["store", "authenticate", "--store", store, "--master-key-file", masterKey, "--actor", "tester"]), mentions: ["tampered", "--accept-registry-rows"])
            let upgraded = try await run(["store", "authenticate", "--store", store, "--master-key-file", masterKey, "--actor", "tester", "--accept-registry-rows"])
            try expectSuccess(upgraded)
            #expect(upgraded.stderr.contains("key K1") && upgraded.stderr.contains("name 'backend'"), "\(upgraded.stderr)")
            #expect(upgraded.stdout.contains("authenticated 1 key row(s): K1") && upgraded.stdout.contains("authenticated 1 client row(s): backend"), "\(upgraded.stdout)")
            expectCleanFailure(try await run(["store", "authenticate", "--store", store, "--master-key-file", masterKey]), mentions: ["already"])
            // The manifest's version is kept beside the master key; a registry older than it is a rollback.
            let registryFile = masterKey + ".registry"
            let recorded = try String(contentsOfFile: registryFile, encoding: .utf8)
            #expect(recorded.hasPrefix("offer-signer registry manifest version "), "\(recorded)")
            try expectSuccess(try await run(["clients", "create", "--store", store, "--master-key-file", masterKey, "--name", "second"]))
            #expect(try String(contentsOfFile: registryFile, encoding: .utf8) != recorded, "moved forward")
            try writeFile("offer-signer registry manifest version 1000000\n", to: URL(fileURLWithPath: registryFile), mode: 0o600)
            expectCleanFailure(
                try await run(["clients", "create", "--store", store, "--master-key-file", masterKey, "--name", "third"]), mentions: ["rolled back"])
            expectCleanFailure(try await run(["serve", "--store", store, "--master-key-file", masterKey, "--port", "0"]), mentions: ["rolled back"])
            try FileManager.default.removeItem(atPath: registryFile)
            let audit = try await run(["audit", "export", "--store", store])
            #expect(audit.stdout.contains("registry.authenticated"), "audited")
            try expectSuccess(try await run(["audit", "verify", "--store", store]))
        }
    }

    @Test(
        "serve with the master key from OFFER_SIGNER_MASTER_KEY: a PostgreSQL store needs --checkpoint-file, a file that cannot be written stops it, and a SQLite store keeps it beside the store",
        arguments: CLIStoreBackend.testedCases)
    func serveNeedsACheckpointFile(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let store = fixture.storeArgument
            let environment = ["OFFER_SIGNER_MASTER_KEY": fixture.masterKeyText]
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
            try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", store, "--master-key-file", fixture.masterKey.path]))
            let plainFile = fixture.directory.appendingPathComponent("plain-file")
            try writeFile("x", to: plainFile, mode: 0o600)
            let unwritable = try await run(
                ["serve", "--store", store, "--port", "0", "--checkpoint-file", plainFile.appendingPathComponent("checkpoint").path], environment: environment)
            expectCleanFailure(unwritable, mentions: ["checkpoint file", "cannot be written"])
            #expect(!unwritable.stderr.contains(fixture.masterKeyText), "the message shows the key")
            guard backend == .sqlite else {
                expectCleanFailure(try await run(["serve", "--store", store, "--port", "0"], environment: environment), mentions: ["--checkpoint-file"])
                return
            }
            // SQLite: <store>.checkpoint, said in the log; at start it takes the store's verified checkpoint.
            let beside = store + ".checkpoint"
            let server = try ChildProcess.spawn(
                try CLIExecutable.url().path, ["serve", "--store", store, "--port", "0"], environment: childEnvironment(environment), captureOutput: true)
            let deadline = ContinuousClock.now + .seconds(60)
            while !FileManager.default.fileExists(atPath: beside), server.isRunning, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
            server.terminate()
            let ended = await server.exited(timeout: .seconds(60))
            #expect(FileManager.default.fileExists(atPath: beside), "serve did not write \(beside): \(ended.stderrText.suffix(2000))")
            #expect(ended.stderrText.contains(beside), "the log names the file")
            let verified = try await run(["audit", "verify", "--store", store, "--checkpoint-file", beside])
            try expectSuccess(verified)
        }
    }
}
