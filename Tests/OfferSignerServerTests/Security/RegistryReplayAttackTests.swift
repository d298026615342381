import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import TestPostgres
import Testing

/// A database writer without the master key who replays rows that were once valid (with their
/// valid earlier MACs), deletes rows, rolls the whole registry back, or plays with the registry
/// version: plain SQL on a real store under a real server, on both stores. Docs/Security.md
/// names these tests (the registry manifest).
@Suite("Attacks by a database writer: replayed, deleted and rolled-back registry rows", .serialized)
struct RegistryReplayAttackTests {
    typealias Target = DatabaseWriterAttackTests.Target
    static let appBody = #"{"bundleID":"com.example.app","productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(DatabaseWriterAttackTests.token)","formats":["legacy"]}"#

    static func sign(_ client: any TestClientProtocol, secret: String, body: String = DatabaseWriterAttackTests.body) async throws -> TestResponse {
        try await DatabaseWriterAttackTests.sign(client, secret: secret, body: body)
    }

    /// The stored manifest's version and MAC, as SQL would read them.
    static func manifest(_ target: Target) async throws -> StoredRegistryManifest {
        try #require(try await target.store.registrySnapshot().manifest)
    }

    static func millis(_ date: Date?) -> String { date.map { String($0.unixMilliseconds) } ?? "NULL" }

    @Test("A revoked client's row from before its revocation, restored by SQL with its valid MAC, cannot sign", arguments: StoreBackend.testedCases)
    func replayedClientRow(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let leaver = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey).secret
            let before = try #require(try await target.store.listClients().first { $0.name == "leaver" })
            #expect(target.masterKey.registryRows.isAuthentic(before))
            _ = try await target.store.revokeClient(name: "leaver", actor: "test", authenticator: target.masterKey.registryRows)
            try await target.live { client in
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
                try await target.attack(
                    "UPDATE api_clients SET revoked_at = NULL, registry_mac = '\(before.registryMAC!)' WHERE name = 'leaver'",
                    "UPDATE registry SET version = version + 1")
                try await DatabaseWriterAttackTests.waitForManifestRefusals(client, atLeast: 1)
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
                #expect(try await Self.sign(client, secret: target.secret).status == .created, "the last verified registry keeps serving")
                let detail = try await DatabaseWriterAttackTests.detail(client)
                #expect(detail["registryManifestVerified"] as? Bool == false, "\(detail)")
            }
            // A restart refuses the store outright.
            await #expect(throws: ServerConfigurationError.self) { _ = try await buildApplication(configuration: target.configuration, store: target.store) }
            // The CLI refuses to build on it.
            await #expect(throws: StoreError.self) {
                _ = try await APIClientCredentials.create(in: target.store, name: "another", bundleIDs: [], actor: "ops", masterKey: target.masterKey)
            }
        }
    }

    @Test("A retired key's earlier active row, restored by SQL with its valid MAC, is not used for signing", arguments: StoreBackend.testedCases)
    func replayedActiveKeyRow(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let oldRow = try #require(try await target.store.listKeys().first { $0.keyID == "APPKEY0000" })
            #expect(oldRow.state == .active)
            let newer = try InAppPurchaseKey.generateForDevelopment(keyID: "NEWKEY0001")
            _ = try await KeyRegistry.importKey(
                newer, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: target.store, masterKey: target.masterKey, actor: "test", reason: nil)
            _ = try await target.store.transitionKey(keyID: "NEWKEY0001", to: .active, actor: "test", reason: nil, force: false, authenticator: target.masterKey.registryRows)
            try await target.live { client in
                let before = try await Self.sign(client, secret: target.secret, body: Self.appBody)
                #expect((before.json["legacy"] as? [String: Any])?["keyID"] as? String == "NEWKEY0001", "\(before.text)")
                // The new key stepped aside (its own row breaks), the old active row restored exactly.
                try await target.attack(
                    "UPDATE signing_keys SET state = 'ready' WHERE key_id = 'NEWKEY0001'",
                    "UPDATE signing_keys SET state = 'active', activated_at = \(Self.millis(oldRow.activatedAt)), retired_at = NULL, registry_mac = '\(oldRow.registryMAC!)' WHERE key_id = 'APPKEY0000'",
                    "UPDATE registry SET version = version + 1")
                try await DatabaseWriterAttackTests.waitForManifestRefusals(client, atLeast: 1)
                let after = try await Self.sign(client, secret: target.secret, body: Self.appBody)
                #expect((after.json["legacy"] as? [String: Any])?["keyID"] as? String == "NEWKEY0001", "the last verified registry: \(after.text)")
            }
            let issued = try await target.store.issuedSignatures(appAccountToken: DatabaseWriterAttackTests.token, bundleID: "com.example.app")
            #expect(issued.allSatisfy { $0.signature.keyID == "NEWKEY0001" }, "never the retired key: \(issued.map(\.signature.keyID))")
        }
    }

    @Test("Deleted client and key rows are detected: reported in /readyz?detail, counted, and the last verified registry keeps serving", arguments: StoreBackend.testedCases)
    func deletedRows(backend: StoreBackend) async throws {
        try await Target.with(backend, bundles: ["com.example.app", "com.example.other"]) { target in
            let second = try await APIClientCredentials.create(in: target.store, name: "second", bundleIDs: [], actor: "test", masterKey: target.masterKey).secret
            let otherBody = Self.appBody.replacingOccurrences(of: "com.example.app", with: "com.example.other")
            try await target.live { client in
                #expect(try await Self.sign(client, secret: second, body: Self.appBody).status == .created)
                try await target.attack("DELETE FROM api_clients WHERE name = 'second'", "UPDATE registry SET version = version + 1")
                try await DatabaseWriterAttackTests.waitForManifestRefusals(client, atLeast: 1)
                var detail = try await DatabaseWriterAttackTests.detail(client)
                #expect(detail["registryManifestVerified"] as? Bool == false, "\(detail)")
                #expect((detail["registryManifestProblem"] as? String)?.contains("deleted") == true, "\(detail)")
                #expect(try await Self.sign(client, secret: second, body: Self.appBody).status == .created, "the last verified registry")

                try await target.attack("DELETE FROM signing_keys WHERE key_id = 'APPKEY0001'", "UPDATE registry SET version = version + 1")
                try await DatabaseWriterAttackTests.waitForManifestRefusals(client, atLeast: 2)
                let other = try await Self.sign(client, secret: target.secret, body: otherBody)
                #expect((other.json["legacy"] as? [String: Any])?["keyID"] as? String == "APPKEY0001", "the last verified registry: \(other.text)")
                detail = try await DatabaseWriterAttackTests.detail(client)
                #expect(detail["registryManifestVerified"] as? Bool == false, "\(detail)")
            }
        }
    }

    @Test("A whole-registry rollback (rows and manifest restored from a backup) is refused: by a running server, at restart, and by the CLI", arguments: StoreBackend.testedCases)
    func rollback(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let leaver = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey).secret
            // The backup: every row is as it is now, plus the manifest that vouches for them.
            let backupClient = try #require(try await target.store.listClients().first { $0.name == "leaver" })
            let backupManifest = try await Self.manifest(target)
            _ = try await target.store.revokeClient(name: "leaver", actor: "test", authenticator: target.masterKey.registryRows)
            let restore = [
                "UPDATE api_clients SET revoked_at = NULL, registry_mac = '\(backupClient.registryMAC!)' WHERE name = 'leaver'",
                "UPDATE registry SET manifest_version = \(backupManifest.version), manifest_mac = '\(backupManifest.mac)', version = version + 1",
            ]
            try await target.live { client in
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
                for statement in restore { try await target.attack(statement) }
                try await DatabaseWriterAttackTests.waitForManifestRefusals(client, atLeast: 1)
                let detail = try await DatabaseWriterAttackTests.detail(client)
                #expect((detail["registryManifestProblem"] as? String)?.contains("rolled back") == true, "\(detail)")
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
            }
            // The server recorded the version it verified beside the master key.
            let recorded = try #require(try target.registryFile.read())
            #expect(recorded > backupManifest.version)
            // The restored manifest verifies on its own: only the file says it is old.
            #expect(RegistryManifest.problem(
                stored: backupManifest, entries: try await target.store.registrySnapshot().manifestEntries, authenticator: target.masterKey.registryRows) == nil)
            await #expect(throws: ServerConfigurationError.self) { _ = try await buildApplication(configuration: target.configuration, store: target.store) }
            await #expect(throws: StoreError.self) {
                _ = try await target.store.revokeClient(name: "backend", actor: "ops", authenticator: try target.registryFile.authenticator(target.masterKey))
            }
        }
    }

    @Test("UPDATE registry SET version = 0 does not freeze a running server: a later CLI change is in force within the reload interval", arguments: StoreBackend.testedCases)
    func versionResetToZero(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let leaver = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey).secret
            try await target.live { client in
                #expect(try await Self.sign(client, secret: leaver).status == .created)
                try await target.attack("UPDATE registry SET version = 0")
                try await Task.sleep(for: .milliseconds(200))
                #expect(try await Self.sign(client, secret: leaver).status == .created)
                _ = try await target.store.revokeClient(name: "leaver", actor: "ops", authenticator: target.masterKey.registryRows)
                let deadline = ContinuousClock.now + .seconds(10)
                var status = try await Self.sign(client, secret: leaver).status
                while status != .unauthorized, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(20))
                    status = try await Self.sign(client, secret: leaver).status
                }
                #expect(status == .unauthorized, "the revocation is in force")
                let detail = try await DatabaseWriterAttackTests.detail(client)
                #expect(detail["registryManifestVerified"] as? Bool == true, "\(detail)")
            }
        }
    }

    @Test("PostgreSQL: a bundle_id changed by SQL while keys activate runs is not blessed with a MAC")
    func transitionRace() async throws {
        guard TestPostgres.isEnabled else { try StoreFixture.postgresAvailableOrSkip(); return }
        try await Target.with(.postgres) { target in
            let ready = try InAppPurchaseKey.generateForDevelopment(keyID: "READYKEY01")
            _ = try await KeyRegistry.importKey(
                ready, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: target.store, masterKey: target.masterKey, actor: "test", reason: nil)
            // The attacker's update holds the row while the CLI's transaction starts.
            let held = try await TestPostgres.holdLock(
                "UPDATE signing_keys SET bundle_id = 'com.example.other' WHERE key_id = 'READYKEY01'", database: target.fixture.database!.name)
            let store = target.store
            let authenticator = target.masterKey.registryRows
            let transition = Task {
                try await store.transitionKey(keyID: "READYKEY01", to: .active, actor: "ops", reason: nil, force: false, authenticator: authenticator)
            }
            try await Task.sleep(for: .milliseconds(500))
            try await held.release()
            await #expect(throws: StoreError.self) { _ = try await transition.value }
            let row = try #require(try await target.store.listKeys().first { $0.keyID == "READYKEY01" })
            #expect(row.bundleID == "com.example.other" && row.state == .ready)
            #expect(!target.masterKey.registryRows.isAuthentic(row), "the attacker's bundle carries no valid MAC")
        }
    }

    @Test("A key row tampered by SQL, then transitioned: refused, and nothing is written", arguments: StoreBackend.testedCases)
    func tamperedThenTransitioned(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let ready = try InAppPurchaseKey.generateForDevelopment(keyID: "READYKEY01")
            _ = try await KeyRegistry.importKey(
                ready, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: target.store, masterKey: target.masterKey, actor: "test", reason: nil)
            try await target.attack("UPDATE signing_keys SET bundle_id = 'com.example.other' WHERE key_id = 'READYKEY01'")
            let manifest = try await Self.manifest(target)
            await #expect(throws: StoreError.self) {
                _ = try await target.store.transitionKey(
                    keyID: "READYKEY01", to: .active, actor: "ops", reason: nil, force: false, authenticator: target.masterKey.registryRows)
            }
            let row = try #require(try await target.store.listKeys().first { $0.keyID == "READYKEY01" })
            #expect(row.state == .ready && !target.masterKey.registryRows.isAuthentic(row))
            #expect(try await Self.manifest(target) == manifest, "no manifest written")
        }
    }

    @Test("store authenticate on an older store with audit records: refused without the checkpoints export, refused with one the chain does not extend, done with the right one", arguments: StoreBackend.testedCases)
    func upgradeNeedsTheExport(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let old = try await DatabaseWriterAttackTests.makeOld(target)
            let export = try await DatabaseWriterAttackTests.export(of: target, signedBy: old)
            do {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
                Issue.record("authenticated without the export")
            } catch let error as StoreError {
                #expect(error.message.contains("--checkpoints-export") && error.message.contains("--trust-existing-chain"), "\(error.message)")
            }
            // An export of another chain: the same key, a checkpoint of a different head.
            let last = try #require(export.file.checkpoints.last)
            let foreign = old.checkpoint(sequence: last.sequence, headHash: String(repeating: "0", count: last.headHash.count), at: last.createdAt)
            let wrong = StoreAuthentication.CheckpointsExport(origin: "a foreign export", file: AuditCheckpointsFile(publicKey: old.publicKey, checkpoints: [foreign]))
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(
                    store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, checkpointsExport: wrong, actor: "ops")
            }
            #expect(try await target.store.registrySnapshot().rowsAuthenticated == false, "left as it was")
            let outcome = try await StoreAuthentication.run(
                store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, checkpointsExport: export, actor: "ops")
            #expect(outcome.registry.keyIDs == ["APPKEY0000"] && outcome.manifestVersion != nil)
            let derived = try #require(try await target.store.auditRecords(after: 0, limit: 1000).last { $0.kind == "audit.signing-key.derived" })
            #expect(derived.body.contains("the checkpoints export"), "\(derived.body)")
        }
    }

    @Test("--trust-existing-chain goes on without an export and says so in the audit log", arguments: StoreBackend.testedCases)
    func upgradeTrustingTheChain(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            _ = try await DatabaseWriterAttackTests.makeOld(target)
            _ = try await StoreAuthentication.run(
                store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, trustExistingChain: true, actor: "ops")
            let derived = try #require(try await target.store.auditRecords(after: 0, limit: 1000).last { $0.kind == "audit.signing-key.derived" })
            #expect(derived.body.contains("--trust-existing-chain"), "\(derived.body)")
        }
    }

    @Test("A store whose manifest was removed: serve refuses, store authenticate refuses without --accept-registry-rows and writes a manifest with it, then it serves", arguments: StoreBackend.testedCases)
    func firstManifest(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            try await target.attack("UPDATE registry SET manifest_version = NULL, manifest_mac = NULL")
            await #expect(throws: ServerConfigurationError.self) { _ = try await buildApplication(configuration: target.configuration, store: target.store) }
            // This store was made by this offer-signer (derived audit key, records): a missing
            // manifest is tampering, written only with --accept-registry-rows.
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(
                    store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, registryFile: target.registryFile, actor: "ops")
            }
            let outcome = try await StoreAuthentication.run(
                store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, registryFile: target.registryFile,
                acceptRegistryRows: true, actor: "ops")
            let recordedVersion = try target.registryFile.read()
            #expect(outcome.manifestVersion != nil && recordedVersion == outcome.manifestVersion)
            #expect(try await target.store.auditRecords(after: 0, limit: 1000).contains { $0.kind == "registry.manifest.written" })
            try await target.live { client async throws -> Void in
                #expect(try await Self.sign(client, secret: target.secret).status == .created)
            }
            // Once done, it is refused; an unmatched registry needs --accept-registry-rows.
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
            }
            try await target.attack("DELETE FROM api_clients WHERE name = 'backend'")
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
            }
            _ = try await StoreAuthentication.run(
                store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, acceptRegistryRows: true, actor: "ops")
            #expect(RegistryManifest.problem(
                stored: try await Self.manifest(target), entries: try await target.store.registrySnapshot().manifestEntries,
                authenticator: target.masterKey.registryRows) == nil)
        }
    }

    @Test("H2 A: an old row restored and the manifest deleted: store authenticate refuses without --accept-registry-rows (registry file floor above 0)", arguments: StoreBackend.testedCases)
    func manifestDeletedAfterReplay(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            _ = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey)
            let before = try #require(try await target.store.listClients().first { $0.name == "leaver" })
            _ = try await target.store.revokeClient(name: "leaver", actor: "test", authenticator: target.masterKey.registryRows)
            try await target.registryFile.recordCurrent(of: target.store, masterKey: target.masterKey)
            try await target.attack(
                "UPDATE api_clients SET revoked_at = NULL, registry_mac = '\(before.registryMAC!)' WHERE name = 'leaver'",
                "UPDATE registry SET manifest_version = NULL, manifest_mac = NULL")
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(
                    store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, registryFile: target.registryFile, actor: "ops")
            }
            #expect(try await target.store.registrySnapshot().manifest == nil, "nothing written")
        }
    }

    @Test("H2 B: MACs stripped, marker deleted, an attacker's client inserted: store authenticate refuses without --accept-registry-rows", arguments: StoreBackend.testedCases)
    func macsStrippedAndClientInserted(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            try await target.attack(
                "UPDATE api_clients SET registry_mac = NULL",
                "UPDATE signing_keys SET registry_mac = NULL",
                "DELETE FROM meta WHERE name = '\(RegistryRowsMarker.name)'",
                "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at) VALUES ('attacker-id', 'attacker', '', 'x', 1)")
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
            }
            let snapshot = try await target.store.registrySnapshot()
            #expect(!snapshot.rowsAuthenticated && snapshot.clients.allSatisfy { $0.registryMAC == nil }, "nothing blessed")
        }
    }
}
