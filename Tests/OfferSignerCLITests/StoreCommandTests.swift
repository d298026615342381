import Crypto
import Foundation
import TestPostgres
import Testing

/// The store engines the CLI store commands run against.
enum CLIStoreBackend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite
    case postgres
    var testDescription: String { rawValue }

    /// PostgreSQL too whenever it is available or CI demands it; when it is left out, the nested
    /// PostgreSQL suite is reported as skipped with the reason.
    static var testedCases: [CLIStoreBackend] { TestPostgres.isEnabled ? allCases : [.sqlite] }
}

/// A store, a master key and development keys in a temporary directory.
struct StoreFixture {
    let directory: URL
    /// The SQLite file (the store for the SQLite backend).
    let store: URL
    let masterKey: URL
    let masterKeyText: String
    /// What `--store` gets: the SQLite path, or the PostgreSQL URL.
    let storeArgument: String
    /// PostgreSQL: the test's own database.
    let database: TestPostgres.Database?
    static let bundleID = "com.example.app"

    init(in directory: URL) throws {
        self.directory = directory
        store = directory.appendingPathComponent("offer-signer.sqlite")
        masterKey = directory.appendingPathComponent("master.key")
        masterKeyText = Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString()
        try writeFile(masterKeyText + "\n", to: masterKey, mode: 0o600)
        storeArgument = store.path
        database = nil
    }

    private init(copying fixture: StoreFixture, database: TestPostgres.Database) {
        directory = fixture.directory
        store = fixture.store
        masterKey = fixture.masterKey
        masterKeyText = fixture.masterKeyText
        storeArgument = database.url
        self.database = database
    }

    /// A fixture on `backend`; a PostgreSQL case is skipped (outside CI) when no PostgreSQL is available.
    static func make(in directory: URL, backend: CLIStoreBackend) async throws -> StoreFixture {
        let fixture = try StoreFixture(in: directory)
        guard backend == .postgres else { return fixture }
        if let reason = TestPostgres.unavailableReason, !TestPostgres.isCI { try Test.cancel("PostgreSQL case skipped: \(reason)") }
        return StoreFixture(copying: fixture, database: try await TestPostgres.database())
    }

    /// Drops the PostgreSQL database, if any.
    func cleanUp() async {
        await database?.drop()
    }

    /// Runs SQL behind the CLI's back (valid on both engines).
    func execute(_ sql: String) async throws {
        if let database {
            try await TestPostgres.execute(sql, database: database.name)
        } else {
            try await sqlite(store, sql)
        }
    }

    /// A new development .p8 (mode 0600) for `keyID`.
    func key(_ keyID: String) async throws -> URL {
        try await generateKey(in: directory, keyID: keyID, name: "AuthKey_\(keyID).p8")
    }

    func importArguments(_ keyID: String, file: URL, bundleID: String = StoreFixture.bundleID, masterKey: URL? = nil) -> [String] {
        [
            "keys", "import", "--store", storeArgument, "--master-key-file", (masterKey ?? self.masterKey).path, "--key-id", keyID,
            "--bundle-id", bundleID, "--issuer-id", issuerID, "--file", file.path, "--actor", "tester",
        ]
    }

    /// `keys list --json`, by key ID.
    func keys(sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String: [String: Any]] {
        let result = try await run(["keys", "list", "--store", storeArgument, "--json"])
        try expectSuccess(result, "keys list", sourceLocation: sourceLocation)
        var byID: [String: [String: Any]] = [:]
        for key in try jsonArray(result.stdout, sourceLocation: sourceLocation) {
            byID[try #require(key["keyID"] as? String, sourceLocation: sourceLocation)] = key
        }
        return byID
    }

    func state(_ keyID: String, sourceLocation: SourceLocation = #_sourceLocation) async throws -> String? {
        try await keys(sourceLocation: sourceLocation)[keyID]?["state"] as? String
    }

    /// Everything a reader can see of the store: the key list and the audit log.
    func snapshot() async throws -> String {
        let list = try await run(["keys", "list", "--store", storeArgument, "--json"])
        let audit = try await run(["audit", "export", "--store", storeArgument])
        return list.stdout + "\n" + audit.stdout
    }

    func transition(_ verb: String, _ keyID: String, _ extra: [String] = []) async throws -> (status: Int32, stdout: String, stderr: String) {
        try await run(["keys", verb, keyID, "--store", storeArgument, "--master-key-file", masterKey.path, "--actor", "tester"] + extra)
    }
}

/// Runs `body` with a fixture on `backend` in a fresh temporary directory; removes both afterwards.
func withStoreFixture(_ backend: CLIStoreBackend, _ body: (StoreFixture) async throws -> Void) async throws {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-cli-tests-\(UUID().uuidString)", isDirectory: true)
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    let fixture = try await StoreFixture.make(in: directory, backend: backend)
    do {
        try await body(fixture)
    } catch {
        await fixture.cleanUp()
        throw error
    }
    await fixture.cleanUp()
}

/// Serialized (with the PostgreSQL suite nested in it): each test runs the binary dozens of
/// times, and every run blocks a thread of the concurrency pool until the child exits; run side
/// by side they took both of the machine's pool threads and stalled every async test of the
/// process for minutes.
@Suite("store commands: keys, clients, audit on a real SQLite file and a real PostgreSQL database", .serialized)
struct StoreCommandTests {
    @Test("keys import / list / activate / retire / revoke: the whole lifecycle, with refusals", arguments: CLIStoreBackend.testedCases)
    func keyLifecycle(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let directory = fixture.directory
            let k1 = try await fixture.key("K1")
            let k2 = try await fixture.key("K2")

            // A .p8 readable by others is refused before anything is written: no store appears.
            try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: k1.path)
            let loose = try await run(fixture.importArguments("K1", file: k1))
            expectCleanFailure(loose, mentions: ["chmod 600", k1.path])
            #expect(!FileManager.default.fileExists(atPath: fixture.store.path), "a refused import must not create the store")
            if backend == .postgres {
                #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM pg_tables WHERE tablename = 'signing_keys'", database: fixture.database!.name) == 0, "nor touch the database")
            }
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: k1.path)

            // The first key of an app becomes active.
            let imported = try await run(fixture.importArguments("K1", file: k1))
            try expectSuccess(imported, "keys import K1")
            #expect(imported.stdout.contains("K1") && imported.stdout.contains("active"), "\(imported.stdout)")

            var keys = try await fixture.keys()
            #expect(Array(keys.keys) == ["K1"])
            let k1Entry = try #require(keys["K1"])
            #expect(k1Entry["state"] as? String == "active")
            #expect(k1Entry["bundleID"] as? String == StoreFixture.bundleID)
            #expect(k1Entry["issuerID"] as? String == issuerID)
            let publicKey = try loadPrivateKey(k1).publicKey
            let fingerprint = try #require(k1Entry["fingerprint"] as? String)
            #expect(fingerprint.count == 64 && fingerprint.allSatisfy { $0.isHexDigit && !$0.isUppercase }, "\(fingerprint)")
            #expect(fingerprint == SHA256.hash(data: publicKey.derRepresentation).map { String(format: "%02x", $0) }.joined())
            let publicKeyPEM = try #require(k1Entry["publicKeyPEM"] as? String)
            #expect(publicKeyPEM.hasPrefix("-----BEGIN PUBLIC KEY-----"))
            #expect(try P256.Signing.PublicKey(pemRepresentation: publicKeyPEM).rawRepresentation == publicKey.rawRepresentation)
            let importedAt = try #require(k1Entry["importedAt"] as? String)
            #expect((try? Date(importedAt, strategy: .iso8601)) != nil || (try? Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(importedAt)) != nil, "importedAt '\(importedAt)' is not ISO 8601")

            // The published public key verifies what the .p8 signs.
            let publicKeyFile = directory.appendingPathComponent("K1.pub.pem")
            try writeFile(publicKeyPEM, to: publicKeyFile, mode: 0o644)
            let signed = try await run(legacySignArguments(keyFile: k1, keyID: "K1"))
            try expectSuccess(signed)
            try expectSuccess(try await run(["verify", "--public-key", publicKeyFile.path], stdin: Data(signed.stdout.utf8)))

            // A 0644 .p8 is refused with chmod 600 in the message; the store is unchanged.
            let before = try await fixture.snapshot()
            try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: k2.path)
            expectCleanFailure(try await run(fixture.importArguments("K2", file: k2)), mentions: ["chmod 600"])
            #expect(try await fixture.snapshot() == before)
            try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: k2.path)

            // A wrong master key is refused; the store is unchanged.
            let otherMaster = directory.appendingPathComponent("other-master.key")
            try writeFile(Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString(), to: otherMaster)
            expectCleanFailure(try await run(fixture.importArguments("K2", file: k2, masterKey: otherMaster)), mentions: ["master key"])
            #expect(try await fixture.snapshot() == before)

            // A master key file readable by others, or not 32 bytes, is refused.
            let looseMaster = directory.appendingPathComponent("loose-master.key")
            try writeFile(fixture.masterKeyText, to: looseMaster, mode: 0o644)
            expectCleanFailure(try await run(fixture.importArguments("K2", file: k2, masterKey: looseMaster)), mentions: ["chmod 600"])
            let shortMaster = directory.appendingPathComponent("short-master.key")
            try writeFile(Data(repeating: 7, count: 16).base64EncodedString(), to: shortMaster)
            expectCleanFailure(try await run(fixture.importArguments("K2", file: k2, masterKey: shortMaster)), mentions: ["32 bytes"])
            #expect(try await fixture.snapshot() == before)

            // A second key of the same app waits in 'ready'.
            try expectSuccess(try await run(fixture.importArguments("K2", file: k2)), "keys import K2")
            keys = try await fixture.keys()
            #expect(keys["K1"]?["state"] as? String == "active")
            #expect(keys["K2"]?["state"] as? String == "ready")

            // Importing the same key ID, or the same key under another ID, is refused.
            expectCleanFailure(try await run(fixture.importArguments("K2", file: k2)), mentions: ["K2", "already"])
            expectCleanFailure(try await run(fixture.importArguments("K3", file: k2)), mentions: ["already", "K2"])

            // --bundle-id guards against activating another app's key.
            expectCleanFailure(try await fixture.transition("activate", "K2", ["--bundle-id", "com.other"]), mentions: ["com.other", StoreFixture.bundleID])
            #expect(try await fixture.state("K2") == "ready")

            // Activating K2 retires K1.
            let activated = try await fixture.transition("activate", "K2", ["--bundle-id", StoreFixture.bundleID])
            try expectSuccess(activated)
            #expect(activated.stdout.contains("active"))
            keys = try await fixture.keys()
            #expect(keys["K2"]?["state"] as? String == "active")
            #expect(keys["K1"]?["state"] as? String == "retired")
            #expect(keys["K2"]?["activatedAt"] is String)
            #expect(keys["K1"]?["retiredAt"] is String)
            expectCleanFailure(try await fixture.transition("activate", "K2"), mentions: ["already"])

            // Retiring the only active key needs --force.
            let refused = try await fixture.transition("retire", "K2")
            expectCleanFailure(refused, mentions: ["--force"])
            #expect(try await fixture.state("K2") == "active")
            try expectSuccess(try await fixture.transition("retire", "K2", ["--force"]))
            #expect(try await fixture.state("K2") == "retired")

            // Revoked keys never sign again.
            try expectSuccess(try await fixture.transition("revoke", "K1", ["--reason", "leaked in a CI log"]))
            #expect(try await fixture.state("K1") == "revoked")
            #expect(try await fixture.keys()["K1"]?["revokedAt"] is String)
            expectCleanFailure(try await fixture.transition("activate", "K1"), mentions: ["revoked"])
            expectCleanFailure(try await fixture.transition("retire", "K1"), mentions: ["revoked"])
            expectCleanFailure(try await fixture.transition("revoke", "K1"), mentions: ["already revoked"])
            #expect(try await fixture.state("K1") == "revoked")

            // Unknown key IDs are named.
            expectCleanFailure(try await fixture.transition("activate", "NOPE"), mentions: ["no key 'NOPE'"])
            expectCleanFailure(try await fixture.transition("revoke", "NOPE", ["--bundle-id", StoreFixture.bundleID]), mentions: ["NOPE"])

            // Every change is in an intact audit chain.
            let verified = try await run(["audit", "verify", "--store", fixture.storeArgument])
            try expectSuccess(verified)
            #expect(verified.stdout.contains("intact"))
            let kinds = try await run(["audit", "export", "--store", fixture.storeArgument]).stdout.split(separator: "\n").map { try jsonObject(String($0))["kind"] as? String }
            #expect(kinds == ["key.imported", "key.imported", "key.activated", "key.retired", "key.revoked"])
        }
    }

    @Test("store and master key from the environment; a missing store is named")
    func environmentAndMissingStore() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let key = try await fixture.key("ENVKEY")

            let missing = try await run(["keys", "list", "--store", fixture.store.path])
            expectCleanFailure(missing, mentions: ["does not exist", fixture.store.path])
            #expect(!FileManager.default.fileExists(atPath: fixture.store.path), "list must not create a store")
            expectCleanFailure(try await run(["audit", "verify", "--store", fixture.store.path]), mentions: ["does not exist"])
            expectCleanFailure(try await run(["keys", "list"]), mentions: ["--store", "OFFER_SIGNER_STORE"])
            expectCleanFailure(
                try await run(["keys", "import", "--store", fixture.store.path, "--key-id", "ENVKEY", "--bundle-id", "b", "--file", key.path]),
                mentions: ["--master-key-file"])

            let environment = ["OFFER_SIGNER_STORE": fixture.store.path, "OFFER_SIGNER_MASTER_KEY": fixture.masterKeyText]
            try expectSuccess(try await run(["keys", "import", "--key-id", "ENVKEY", "--bundle-id", "com.example.env", "--file", key.path, "--development"], environment: environment))
            let listed = try await run(["keys", "list", "--json"], environment: environment)
            try expectSuccess(listed)
            let entry = try #require(try jsonArray(listed.stdout).first)
            #expect(entry["keyID"] as? String == "ENVKEY")
            #expect(entry["origin"] as? String == "development")
            let text = try await run(["keys", "list"], environment: environment)
            #expect(text.stdout.contains("not issued by Apple"), "\(text.stdout)")

            expectCleanFailure(try await run(["keys", "list"], environment: ["OFFER_SIGNER_STORE": directory.appendingPathComponent("nope.sqlite").path]), mentions: ["nope.sqlite"])
        }
    }

    @Test("clients create / list / revoke: the secret is printed once and never listed", arguments: CLIStoreBackend.testedCases)
    func clients(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let store = fixture.storeArgument

            let created = try await run(["clients", "create", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "backend", "--bundle-id", "com.example.app", "--json", "--actor", "tester"])
            try expectSuccess(created)
            let text = created.stdout.trimmingCharacters(in: .newlines)
            #expect(Array(topLevelKeys(ofJSONObject: text).prefix(3)) == ["name", "clientID", "secret"], "\(text)")
            let client = try jsonObject(text)
            #expect(client["name"] as? String == "backend")
            let clientID = try #require(client["clientID"] as? String)
            #expect(!clientID.isEmpty)
            let secret = try #require(client["secret"] as? String)
            #expect(secret.hasPrefix("os_") && secret.count >= 32, "\(secret)")
            #expect(client["bundleIDs"] as? [String] == ["com.example.app"])

            let plain = try await run(["clients", "create", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "worker"])
            try expectSuccess(plain)
            let plainSecret = try #require(plain.stdout.split(separator: "\n").map(String.init).first { $0.hasPrefix("os_") }, "\(plain.stdout)")
            #expect(plainSecret != secret)

            // A duplicate name is refused.
            expectCleanFailure(try await run(["clients", "create", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "backend", "--json"]), mentions: ["backend", "exists"])

            let listed = try await run(["clients", "list", "--store", store, "--json"])
            try expectSuccess(listed)
            let clients = try jsonArray(listed.stdout)
            #expect(clients.compactMap { $0["name"] as? String }.sorted() == ["backend", "worker"])
            #expect(clients.allSatisfy { $0["secret"] == nil })
            #expect(clients.first { $0["name"] as? String == "backend" }?["clientID"] as? String == clientID)

            // The secrets appear nowhere but in `create`'s output.
            let everything = await [
                listed.stdout, try run(["clients", "list", "--store", store]).stdout,
                try run(["audit", "export", "--store", store]).stdout, try run(["audit", "tail", "--store", store]).stdout,
                try run(["audit", "tail", "--store", store, "--json"]).stdout,
            ].joined(separator: "\n")
            #expect(!everything.contains(secret))
            #expect(!everything.contains(plainSecret))
            #expect(!everything.contains(String(secret.dropFirst(3))))

            // Revoking.
            let revoked = try await run(["clients", "revoke", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "backend", "--actor", "tester"])
            try expectSuccess(revoked)
            #expect(revoked.stdout.contains(clientID))
            let afterRevoke = try jsonArray(try await run(["clients", "list", "--store", store, "--json"]).stdout)
            #expect(afterRevoke.first { $0["name"] as? String == "backend" }?["revokedAt"] is String)
            #expect(afterRevoke.first { $0["name"] as? String == "worker" }?["revokedAt"] is NSNull)
            #expect(try await run(["clients", "list", "--store", store]).stdout.contains("revoked"))
            expectCleanFailure(try await run(["clients", "revoke", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "nobody"]), mentions: ["nobody"])
            expectCleanFailure(try await run(["clients", "create", "--store", store, "--master-key-file", fixture.masterKey.path, "--name", "backend"]), mentions: ["backend"])

            try expectSuccess(try await run(["audit", "verify", "--store", store]))
        }
    }

    @Test("audit verify: intact, then an edited record and a deleted record are named; tail and export print JSON lines", arguments: CLIStoreBackend.testedCases)
    func auditChain(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))  // 1
            try expectSuccess(try await run(fixture.importArguments("K2", file: try fixture.key("K2"))))  // 2
            try expectSuccess(try await fixture.transition("activate", "K2"))  // 3
            try expectSuccess(try await run(["clients", "create", "--store", fixture.storeArgument, "--master-key-file", fixture.masterKey.path, "--name", "backend"]))  // 4
            try expectSuccess(try await fixture.transition("revoke", "K1"))  // 5
            let store = fixture.storeArgument

            let intact = try await run(["audit", "verify", "--store", store])
            try expectSuccess(intact)
            #expect(intact.stdout.hasPrefix("intact: 5 records"), "\(intact.stdout)")

            // tail --json: one JSON object per line, the last N records in order.
            let tail = try await run(["audit", "tail", "--store", store, "--json", "-n", "3"])
            try expectSuccess(tail)
            let tailLines = tail.stdout.split(separator: "\n").map(String.init)
            #expect(tailLines.count == 3)
            let tailRecords = try tailLines.map { try jsonObject($0) }
            #expect(tailRecords.compactMap { ($0["sequence"] as? NSNumber)?.intValue } == [3, 4, 5])
            for record in tailRecords {
                #expect(record["kind"] is String)
                #expect(record["body"] is [String: Any])
                #expect((record["hash"] as? String)?.count == 64)
                #expect((record["previousHash"] as? String)?.count == 64)
            }
            let textTail = try await run(["audit", "tail", "--store", store])
            try expectSuccess(textTail)
            #expect(textTail.stdout.split(separator: "\n").count == 5)
            #expect(textTail.stdout.contains("#2") && textTail.stdout.contains("key.imported"))

            // export: every record as a JSON line, chained.
            let export = try await run(["audit", "export", "--store", store])
            try expectSuccess(export)
            let records = try export.stdout.split(separator: "\n").map { try jsonObject(String($0)) }
            #expect(records.compactMap { ($0["sequence"] as? NSNumber)?.intValue } == [1, 2, 3, 4, 5])
            #expect(records.first?["previousHash"] as? String == String(repeating: "0", count: 64))
            for (previous, next) in zip(records, records.dropFirst()) {
                #expect(next["previousHash"] as? String == previous["hash"] as? String)
            }
            #expect((records[1]["body"] as? [String: Any])?["keyID"] as? String == "K2")

            // --since filters by time and refuses what is not ISO 8601.
            let future = try await run(["audit", "export", "--store", store, "--since", "2099-01-01T00:00:00Z"])
            try expectSuccess(future)
            #expect(future.stdout.isEmpty)
            let past = try await run(["audit", "export", "--store", store, "--since", "2001-01-01T00:00:00Z"])
            try expectSuccess(past)
            #expect(past.stdout == export.stdout)
            expectCleanFailure(try await run(["audit", "export", "--store", store, "--since", "last tuesday"]), mentions: ["--since", "ISO 8601"])
            expectCleanFailure(try await run(["audit", "export", "--store", store, "--since", "2026-13-45"]), mentions: ["--since"])

            // Edit record 2 behind the CLI's back.
            try await fixture.execute("UPDATE audit_log SET body = replace(body, 'K2', 'KX') WHERE seq = 2")
            let edited = try await run(["audit", "verify", "--store", store])
            expectCleanFailure(edited, exitCode: 1, mentions: ["record 2"])
            #expect(edited.stdout.hasPrefix("broken: record 2"), "\(edited.stdout)")

            // Undo the edit: intact again.
            try await fixture.execute("UPDATE audit_log SET body = replace(body, 'KX', 'K2') WHERE seq = 2")
            try expectSuccess(try await run(["audit", "verify", "--store", store]))

            // Delete a middle record.
            try await fixture.execute("DELETE FROM audit_log WHERE seq = 3")
            let deleted = try await run(["audit", "verify", "--store", store])
            expectCleanFailure(deleted, exitCode: 1, mentions: ["record 3", "missing"])

            // A record forged into the gap (a copy of record 4 as 3) is caught too.
            try await fixture.execute("INSERT INTO audit_log SELECT 3, recorded_at, kind, body, previous_hash, hash FROM audit_log WHERE seq = 4")
            let reordered = try await run(["audit", "verify", "--store", store])
            expectCleanFailure(reordered, exitCode: 1, mentions: ["record 3"])
        }
    }

    @Test("secrets never appear in output: no line of the .p8 and not the master key", arguments: CLIStoreBackend.testedCases)
    func secretsNeverPrinted(backend: CLIStoreBackend) async throws {
        try await withStoreFixture(backend) { fixture in
            let directory = fixture.directory
            let k1 = try await fixture.key("K1")
            let k2 = try await fixture.key("K2")
            var outputs: [String] = []
            func record(_ result: (status: Int32, stdout: String, stderr: String)) throws {
                try expectSuccess(result)
                outputs.append(result.stdout)
                outputs.append(result.stderr)
            }
            try await record(try run(fixture.importArguments("K1", file: k1)))
            try await record(try run(fixture.importArguments("K2", file: k2)))
            try await record(try fixture.transition("activate", "K2"))
            let store = fixture.storeArgument
            for arguments in [
                ["keys", "list", "--store", store], ["keys", "list", "--store", store, "--json"],
                ["audit", "tail", "--store", store], ["audit", "tail", "--store", store, "--json"],
                ["audit", "export", "--store", store], ["audit", "verify", "--store", store],
            ] {
                try await record(try run(arguments))
            }
            // A failed import must not echo the key either.
            let wrongMaster = directory.appendingPathComponent("wrong.key")
            try writeFile(Data(repeating: 1, count: 32).base64EncodedString(), to: wrongMaster)
            let failed = try await run(fixture.importArguments("K3", file: try fixture.key("K3"), masterKey: wrongMaster))
            expectCleanFailure(failed)
            outputs += [failed.stdout, failed.stderr]

            let everything = outputs.joined(separator: "\n")
            #expect(everything.contains("K1") && everything.contains("-----BEGIN PUBLIC KEY-----"), "the checks below saw real output")
            let masterBytes = try #require(Data(base64Encoded: fixture.masterKeyText))
            let secrets = [fixture.masterKeyText, masterBytes.map { String(format: "%02x", $0) }.joined()]
            for secret in secrets {
                #expect(!everything.contains(secret), "the master key appears in output")
            }
            for file in [k1, k2] {
                let pem = try String(contentsOf: file, encoding: .utf8)
                let bodyLines = pem.split(separator: "\n").filter { !$0.hasPrefix("-----") }
                #expect(!bodyLines.isEmpty)
                for line in bodyLines {
                    #expect(!everything.contains(line), "a line of \(file.lastPathComponent) appears in output: \(line)")
                }
                // Nor the DER private scalar in any common encoding.
                let scalar = try loadPrivateKey(file).rawRepresentation
                #expect(!everything.contains(scalar.base64EncodedString()))
                #expect(!everything.lowercased().contains(scalar.map { String(format: "%02x", $0) }.joined()))
            }
            #expect(!everything.contains("PRIVATE KEY"))
        }
    }
}
