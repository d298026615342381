import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import Logging
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// A real server on a real store, attacked by someone who can write to the database but does not
/// hold the master key (a leaked database password, a DBA, a restored backup, an injection
/// elsewhere in a shared database): every attack is plain SQL on the store, as they would do it.
/// Docs/Security.md's threat model names these tests.
@Suite("Attacks by a database writer without the master key", .serialized)
struct DatabaseWriterAttackTests {
    static let token = "6b29fc40-ca47-1067-b31d-00dd010662da"
    static let body = #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)","formats":["legacy"]}"#

    /// A store with one key per bundle and one legitimate client, the server's configuration, and
    /// a checkpoint file in a directory of its own (where a master key file would be).
    struct Target {
        let fixture: StoreFixture
        let masterKey: MasterKey
        let directory: URL
        var configuration: ServerConfiguration
        var keys: [String: InAppPurchaseKey] = [:]
        var secret = ""
        var store: any OfferSignerStore { fixture.store }
        var checkpointFile: LastCheckpointFile { LastCheckpointFile(path: directory.appendingPathComponent("master.key.checkpoint").path) }
        var registryFile: RegistryVersionFile { RegistryVersionFile(path: directory.appendingPathComponent("master.key.registry").path) }

        static func with(_ backend: StoreBackend, bundles: [String] = ["com.example.app"], _ body: (Target) async throws -> Void) async throws {
            try await StoreFixture.with(backend) { fixture in
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-attack-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                defer { try? FileManager.default.removeItem(at: directory) }
                let masterKey = MasterKey.generate().key
                var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
                configuration.host = "127.0.0.1"
                configuration.port = 0
                configuration.registryPollInterval = .milliseconds(50)
                configuration.clientRateLimit = .unlimited
                configuration.appAccountTokenRateLimit = .unlimited
                configuration.storeTimeout = .seconds(60)
                configuration.operatorToken = TestServer.operatorToken
                var target = Target(fixture: fixture, masterKey: masterKey, directory: directory, configuration: configuration)
                target.configuration.checkpointFile = target.checkpointFile
                target.configuration.registryFile = target.registryFile
                for (index, bundle) in bundles.enumerated() {
                    let key = try InAppPurchaseKey.generateForDevelopment(keyID: "APPKEY000\(index)")
                    _ = try await KeyRegistry.importKey(
                        key, bundleID: bundle, issuerID: TestServer.issuerID, development: true, into: fixture.store, masterKey: masterKey, actor: "test", reason: nil)
                    target.keys[bundle] = key
                }
                target.secret = try await APIClientCredentials.create(in: fixture.store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
                try await body(target)
            }
        }

        func live<Value: Sendable>(_ test: @escaping @Sendable (any TestClientProtocol) async throws -> Value) async throws -> Value {
            let application = try await buildApplication(configuration: configuration, store: store)
            return try await application.test(.live, test)
        }

        /// SQL behind the store's back, one statement at a time (valid on both engines).
        func attack(_ statements: String...) async throws {
            for statement in statements { try await fixture.execute(statement) }
        }
    }

    static func sign(_ client: any TestClientProtocol, secret: String, body: String = Self.body) async throws -> TestResponse {
        try await client.postJSON("/v1/offers/signatures", body, bearer: secret)
    }

    /// The value of a metric without labels in `/metrics`, nil when absent.
    static func metric(_ client: any TestClientProtocol, _ name: String) async throws -> Double? {
        let text = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
        for line in text.split(separator: "\n") where line.hasPrefix(name + " ") {
            return Double(line.dropFirst(name.count + 1))
        }
        return nil
    }

    /// Waits until the server's loaded registry left out `count` rows (it reloads within 50 ms
    /// of a version bump here; later on a loaded machine). At most 10 s.
    static func waitForRejectedRows(_ client: any TestClientProtocol, _ count: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if try await metric(client, "offer_signer_registry_rows_rejected") == Double(count) { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("the server did not report \(count) rejected registry rows within 10 s", sourceLocation: sourceLocation)
    }

    /// `GET /readyz?detail` as the operator.
    static func detail(_ client: any TestClientProtocol) async throws -> [String: Any] {
        try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).json
    }

    /// Waits until the server has refused at least `count` registry reads for their manifest. At most 10 s.
    static func waitForManifestRefusals(_ client: any TestClientProtocol, atLeast count: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if try await metric(client, "offer_signer_registry_manifest_refusals_total") ?? 0 >= Double(count) { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("the server did not refuse \(count) registry read(s) for their manifest within 10 s", sourceLocation: sourceLocation)
    }

    static func attackerSecret(clientID: String) -> (secret: String, hash: String) {
        let secret = "os_\(clientID)_" + Encoding.base64URL(SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) })
        return (secret, APIClientCredentials.hash(secret))
    }

    @Test("A client inserted by SQL (even with a valid row's MAC copied onto it) gets 401 and no signature; the registry no longer matches its manifest", arguments: StoreBackend.testedCases)
    func insertedClient(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let (secret, hash) = Self.attackerSecret(clientID: "evil0001")
            try await target.live { client in
                #expect(try await Self.sign(client, secret: target.secret).status == .created)
                try await target.attack(
                    "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at) VALUES ('evil0001', 'evil', '', '\(hash)', 0)",
                    "UPDATE registry SET version = version + 1")
                try await Self.waitForManifestRefusals(client, atLeast: 1)
                expectProblem(try await Self.sign(client, secret: secret), .unauthorized, "unauthorized")
                // The MAC of a real row, moved to the attacker's: it binds the row's identity and columns.
                try await target.attack(
                    "UPDATE api_clients SET registry_mac = (SELECT registry_mac FROM api_clients WHERE name = 'backend') WHERE name = 'evil'",
                    "UPDATE registry SET version = version + 1")
                try await Self.waitForManifestRefusals(client, atLeast: 2)
                expectProblem(try await Self.sign(client, secret: secret), .unauthorized, "unauthorized")
                // The legitimate client still signs (the last verified registry serves); /readyz tells operators.
                #expect(try await Self.sign(client, secret: target.secret).status == .created)
                let detail = try await Self.detail(client)
                #expect(detail["registryManifestVerified"] as? Bool == false && (detail["registryManifestProblem"] as? String)?.contains("manifest") == true, "\(detail)")
            }
            let issued = try await target.store.issuedSignatures(appAccountToken: Self.token, bundleID: "com.example.app")
            #expect(issued.count == 2 && issued.allSatisfy { $0.signature.client.contains("backend") }, "only the legitimate client's: \(issued)")
        }
    }

    @Test("A revoked client revived by SQL (revoked_at = NULL) is still refused", arguments: StoreBackend.testedCases)
    func revivedClient(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let leaver = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey).secret
            _ = try await target.store.revokeClient(name: "leaver", actor: "test", authenticator: target.masterKey.registryRows)
            try await target.live { client in
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
                try await target.attack("UPDATE api_clients SET revoked_at = NULL WHERE name = 'leaver'", "UPDATE registry SET version = version + 1")
                try await Self.waitForRejectedRows(client, 1)
                expectProblem(try await Self.sign(client, secret: leaver), .unauthorized, "unauthorized")
                // Widening a client's bundles by SQL is refused the same way (the row no longer verifies).
                try await target.attack("UPDATE api_clients SET bundle_ids = 'com.example.app com.example.other' WHERE name = 'backend'", "UPDATE registry SET version = version + 1")
                try await Self.waitForRejectedRows(client, 2)
                expectProblem(try await Self.sign(client, secret: target.secret), .unauthorized, "unauthorized")
            }
            #expect(try await target.store.issuedSignatures(appAccountToken: Self.token, bundleID: "com.example.app").isEmpty)
        }
    }

    @Test("A key row whose state or bundle was changed by SQL is not used for signing", arguments: StoreBackend.testedCases)
    func tamperedKeyRows(backend: StoreBackend) async throws {
        try await Target.with(backend, bundles: ["com.example.app", "com.example.other"]) { target in
            let ready = try InAppPurchaseKey.generateForDevelopment(keyID: "READYKEY01")
            _ = try await KeyRegistry.importKey(
                ready, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: target.store, masterKey: target.masterKey, actor: "test", reason: nil)
            let appBody = #"{"bundleID":"com.example.app","productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(Self.token)","formats":["legacy"]}"#
            try await target.live { client in
                let before = try await Self.sign(client, secret: target.secret, body: appBody)
                #expect(before.status == .created)
                #expect((before.json["legacy"] as? [String: Any])?["keyID"] as? String == "APPKEY0000")

                // State: the ready key made active by SQL (the active one retired first, for the index).
                try await target.attack(
                    "UPDATE signing_keys SET state = 'retired' WHERE key_id = 'APPKEY0000'",
                    "UPDATE signing_keys SET state = 'active' WHERE key_id = 'READYKEY01'",
                    "UPDATE registry SET version = version + 1")
                try await Self.waitForRejectedRows(client, 2)
                let afterState = try await Self.sign(client, secret: target.secret, body: appBody)
                #expect(afterState.status != .created && afterState.json["legacy"] == nil, "\(afterState.text)")

                // Bundle: the other app's (authentic, active) key moved to this app by SQL.
                try await target.attack(
                    "UPDATE signing_keys SET state = 'revoked' WHERE key_id = 'READYKEY01'",
                    "UPDATE signing_keys SET bundle_id = 'com.example.app' WHERE key_id = 'APPKEY0001'",
                    "UPDATE registry SET version = version + 1")
                try await Self.waitForRejectedRows(client, 3)
                let afterBundle = try await Self.sign(client, secret: target.secret, body: appBody)
                #expect(afterBundle.status != .created && afterBundle.json["legacy"] == nil, "\(afterBundle.text)")
            }
            let issued = try await target.store.issuedSignatures(appAccountToken: Self.token, bundleID: "com.example.app")
            #expect(issued.map(\.signature.keyID) == ["APPKEY0000"], "only the signature before the attack")
            // The CLI refuses to bless a tampered row: only revocation is allowed.
            await #expect(throws: StoreError.self) {
                _ = try await target.store.transitionKey(
                    keyID: "READYKEY01", to: .active, actor: "ops", reason: nil, force: false, authenticator: target.masterKey.registryRows)
            }
        }
    }

    /// Signs `count` requests on a live server, then a checkpoint (as `audit checkpoints create` does).
    static func signAndCheckpoint(_ target: Target, count: Int) async throws -> AuditCheckpoint {
        try await target.live { client async throws -> Void in
            for _ in 0..<count {
                let response = try await Self.sign(client, secret: target.secret)
                #expect(response.status == .created)
            }
        }
        // The server signs one on shutdown; otherwise it is signed here.
        if let made = try await AuditCheckpointing.create(in: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile) { return made }
        return try #require(try await target.store.latestCheckpoint())
    }

    static func trustedFile(_ target: Target) throws -> AuditCheckpointSet {
        let file = try #require(try target.checkpointFile.read())
        return AuditCheckpointSet(origin: "the checkpoint file", publicKey: file.publicKey, checkpoints: file.checkpoints)
    }

    @Test("Checkpoints and the audit key deleted by SQL: after a restart the service refuses to checkpoint, and verify with the checkpoint file fails", arguments: StoreBackend.testedCases)
    func deletedCheckpointsAndKey(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let signed = try await Self.signAndCheckpoint(target, count: 3)
            #expect(signed.keyFingerprint == AuditSigningKey.derived(from: target.masterKey).publicKey.fingerprint, "the key is derived from the master key")
            #expect(try target.checkpointFile.lastCheckpoint() == signed)
            #expect(try await target.store.verifyAudit(trusted: try Self.trustedFile(target), progressInterval: 100_000, progress: { _ in }).isIntact)

            try await target.attack("DELETE FROM audit_checkpoints", "DELETE FROM audit_signing_key")
            try await target.live { client in
                // Signing goes on; checkpointing is refused, counted and reported to operators.
                #expect(try await Self.sign(client, secret: target.secret).status == .created)
                let deadline = ContinuousClock.now + .seconds(10)
                while try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).json["auditCheckpointRefused"] as? Bool != true, ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(20))
                }
                #expect(try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).json["auditCheckpointRefused"] as? Bool == true)
                #expect((try await Self.metric(client, "offer_signer_audit_checkpoint_refusals_total") ?? 0) >= 1)
            }
            // No key row was made, no checkpoint signed over the chain as it is now.
            #expect(try await target.store.auditSigningPublicKey() == nil)
            #expect(try await target.store.checkpoints().isEmpty)
            await #expect(throws: StoreError.self) {
                _ = try await AuditCheckpointing.create(in: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile)
            }
            let report = try await target.store.verifyAudit(trusted: try Self.trustedFile(target), progressInterval: 100_000, progress: { _ in })
            #expect(!report.isIntact, "\(report)")
            #expect(report.checkpointProblems.contains { $0.contains("key row was deleted") }, "\(report)")
        }
    }

    @Test("A rewritten audit record (hashes recomputed, checkpoints and key deleted) fails verify against the checkpoint file; nothing is signed over it", arguments: StoreBackend.testedCases)
    func rewrittenRecord(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            _ = try await Self.signAndCheckpoint(target, count: 3)
            // Record 3 is the first signature: change its offer and recompute every hash after it.
            let records = try await target.store.auditRecords(after: 0, limit: 100)
            var previous = records[1].hash
            for record in records.dropFirst(2) {
                let body = record.sequence == 3 ? record.body.replacingOccurrences(of: "WINBACK50", with: "FREE100") : record.body
                let hash = AuditChain.hash(previousHash: previous, sequence: record.sequence, recordedAt: record.recordedAt, kind: record.kind, body: body)
                try await target.attack(
                    "UPDATE audit_log SET body = '\(body)', previous_hash = '\(previous)', hash = '\(hash)' WHERE seq = \(record.sequence)")
                previous = hash
            }
            if backend == .postgres { try await target.attack("UPDATE audit_head SET hash = '\(previous)' WHERE id = 1") }
            try await target.attack("DELETE FROM audit_checkpoints", "DELETE FROM audit_signing_key")
            // The store alone is fooled; the file beside the master key is not.
            #expect(try await target.store.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
            let report = try await target.store.verifyAudit(trusted: try Self.trustedFile(target), progressInterval: 100_000, progress: { _ in })
            #expect(!report.isIntact, "\(report)")
            #expect(report.suspectRange?.contains(3) == true, "\(report)")
            // Neither the key nor the file lets a checkpoint be signed over the rewritten chain.
            await #expect(throws: StoreError.self) {
                _ = try await AuditCheckpointing.create(in: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile)
            }
            // Even with a key row put back by SQL (the derived public key is no secret), the file refuses.
            let derived = AuditSigningKey.derived(from: target.masterKey).publicKey
            try await target.attack(
                "INSERT INTO audit_signing_key (id, public_key_pem, fingerprint, sealed_private_key, created_at) VALUES (1, '\(derived.pem)', '\(derived.fingerprint)', \(backend == .postgres ? "'\\x00'::bytea" : "x'00'"), 0)")
            await #expect(throws: StoreError.self) {
                _ = try await AuditCheckpointing.create(in: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile)
            }
            #expect(try await target.store.checkpoints().isEmpty)
        }
    }

    /// Makes the target's store look like one written by an earlier offer-signer: a generated
    /// audit-signing key with the checkpoints signed by it, no row MACs, no marker, no checkpoint file.
    static func makeOld(_ target: Target) async throws -> AuditSigningKey {
        _ = try await Self.signAndCheckpoint(target, count: 2)
        let old = AuditSigningKey.generate()
        let resigned = try await target.store.checkpoints().map { old.checkpoint(sequence: $0.sequence, headHash: $0.headHash, at: $0.createdAt) }
        try await target.store.replaceAuditSigningKey(old, masterKey: target.masterKey, resigned: resigned, entry: AuditEntry(kind: "test.older-version", body: "{}"))
        try await target.attack(
            "UPDATE signing_keys SET registry_mac = NULL", "UPDATE api_clients SET registry_mac = NULL",
            "DELETE FROM meta WHERE name = 'registry_rows_authenticated'", "UPDATE registry SET manifest_version = NULL, manifest_mac = NULL")
        try FileManager.default.removeItem(atPath: target.checkpointFile.path)
        try? FileManager.default.removeItem(atPath: target.registryFile.path)
        return old
    }

    @Test("store authenticate upgrades an older store once (row MACs, derived audit key, checkpoints signed again); serve refuses the store before", arguments: StoreBackend.testedCases)
    func upgradeOfAnOlderStore(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let old = try await Self.makeOld(target)
            await #expect(throws: ServerConfigurationError.self) { _ = try await buildApplication(configuration: target.configuration, store: target.store) }

            let outcome = try await StoreAuthentication.run(
                store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, registryFile: target.registryFile,
                checkpointsExport: try await Self.export(of: target, signedBy: old), actor: "ops")
            let recordedVersion = try target.registryFile.read()
            #expect(outcome.manifestVersion != nil && recordedVersion == outcome.manifestVersion)
            let derived = AuditSigningKey.derived(from: target.masterKey).publicKey
            #expect(outcome.previousAuditKeyFingerprint == old.publicKey.fingerprint && outcome.auditKeyFingerprint == derived.fingerprint)
            #expect(outcome.registry.keyIDs == ["APPKEY0000"] && outcome.registry.clientNames == ["backend"])
            #expect(try await target.store.auditSigningPublicKey() == derived)
            let report = try await target.store.verifyAudit(trusted: try Self.trustedFile(target), progressInterval: 100_000, progress: { _ in })
            #expect(report.isIntact && report.checkpointsMatched >= 2, "\(report)")
            let kinds = try await target.store.auditRecords(after: 0, limit: 100).map(\.kind)
            #expect(kinds.contains("audit.signing-key.derived") && kinds.contains("registry.authenticated"), "\(kinds)")
            try await target.live { client async throws -> Void in
                let response = try await Self.sign(client, secret: target.secret)
                #expect(response.status == .created, "\(response.text)")
            }
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
            }
        }
    }

    /// The off-machine export of an older store's checkpoints, as `audit checkpoints export` writes it.
    static func export(of target: Target, signedBy key: AuditSigningKey) async throws -> StoreAuthentication.CheckpointsExport {
        let file = AuditCheckpointsFile(publicKey: key.publicKey, checkpoints: try await target.store.checkpoints())
        return StoreAuthentication.CheckpointsExport(origin: "the checkpoints export", file: try AuditCheckpointsFile(text: file.text))
    }

    @Test("store authenticate refuses to move the checkpoints of a chain that does not verify", arguments: StoreBackend.testedCases)
    func upgradeRefusesATamperedChain(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let old = try await Self.makeOld(target)
            let export = try await Self.export(of: target, signedBy: old)
            try await target.attack("UPDATE audit_log SET body = replace(body, 'WINBACK50', 'FREE100') WHERE seq = 3")
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(
                    store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, checkpointsExport: export, actor: "ops")
            }
            #expect(try await target.store.auditSigningPublicKey() == old.publicKey, "left as it was")
            #expect(try await target.store.registrySnapshot().rowsAuthenticated == false)
        }
    }

    @Test("The authenticated marker deleted by SQL beside an inserted client: the server refuses to start on the unmatched registry; store authenticate refuses to bless it", arguments: StoreBackend.testedCases)
    func deletedMarker(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let (secret, hash) = Self.attackerSecret(clientID: "evil0002")
            try await target.attack(
                "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at) VALUES ('evil0002', 'evil', '', '\(hash)', 0)",
                "DELETE FROM meta WHERE name = 'registry_rows_authenticated'")
            await #expect(throws: StoreError.self) {
                _ = try await StoreAuthentication.run(store: target.store, masterKey: target.masterKey, checkpointFile: target.checkpointFile, actor: "ops")
            }
            #expect(try await target.store.listClients().first { $0.name == "evil" }?.registryMAC == nil, "not blessed")
            _ = secret
            await #expect(throws: ServerConfigurationError.self) { _ = try await buildApplication(configuration: target.configuration, store: target.store) }
        }
    }
}
