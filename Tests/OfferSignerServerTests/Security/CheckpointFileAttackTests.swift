import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// The checkpoint file (the last signed audit checkpoint, kept outside the database) against a
/// database writer without the master key who keeps the audit-signing key row: the service
/// refuses to sign a chain that does not extend its file, refuses a forged latest checkpoint row,
/// cannot start without a writable file, and instances with files of their own converge.
/// Docs/Security.md and Docs/Audit.md name these tests (the CLI side: `MasterKeyGuardCLITests`).
@Suite("The checkpoint file against a database writer", .serialized)
struct CheckpointFileAttackTests {
    typealias Target = DatabaseWriterAttackTests.Target

    static func detail(_ client: any TestClientProtocol) async throws -> [String: Any] {
        try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).json
    }

    /// Waits (at most 15 s) until `/readyz?detail` reports the checkpointer's refusal.
    static func waitForRefusal(_ client: any TestClientProtocol, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let deadline = ContinuousClock.now + .seconds(15)
        while try await detail(client)["auditCheckpointRefused"] as? Bool != true, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(try await detail(client)["auditCheckpointRefused"] as? Bool == true, sourceLocation: sourceLocation)
        #expect((try await DatabaseWriterAttackTests.metric(client, "offer_signer_audit_checkpoint_refusals_total") ?? 0) >= 1, sourceLocation: sourceLocation)
    }

    /// Rewrites record 3 (its offer), recomputing every hash after it, as an attacker would.
    static func rewriteRecord3(_ target: Target, backend: StoreBackend) async throws {
        let records = try await target.store.auditRecords(after: 0, limit: 1000)
        var previous = records[1].hash
        for record in records.dropFirst(2) {
            let body = record.sequence == 3 ? record.body.replacingOccurrences(of: "WINBACK50", with: "FREE100") : record.body
            let hash = AuditChain.hash(previousHash: previous, sequence: record.sequence, recordedAt: record.recordedAt, kind: record.kind, body: body)
            try await target.attack("UPDATE audit_log SET body = '\(body)', previous_hash = '\(previous)', hash = '\(hash)' WHERE seq = \(record.sequence)")
            previous = hash
        }
        if backend == .postgres { try await target.attack("UPDATE audit_head SET hash = '\(previous)' WHERE id = 1") }
    }

    @Test(
        "Checkpoints deleted and a record rewritten, the audit key row kept: after a restart nothing is signed over the rewritten chain (refusal in metric and readyz), and verify with the file fails",
        arguments: StoreBackend.testedCases)
    func rewriteKeepingTheKeyRow(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let signed = try await DatabaseWriterAttackTests.signAndCheckpoint(target, count: 3)
            try await Self.rewriteRecord3(target, backend: backend)
            try await target.attack("DELETE FROM audit_checkpoints")
            #expect(try await target.store.auditSigningPublicKey() != nil, "the key row is kept")

            var restarted = target
            restarted.configuration.checkpointEveryRecords = 1
            try await restarted.live { client in
                // Refused from the start (the chain no longer holds the file's checkpoint), and
                // again when a checkpoint falls due; signing goes on.
                try await Self.waitForRefusal(client)
                #expect(try await DatabaseWriterAttackTests.sign(client, secret: target.secret).status == .created)
                try await Task.sleep(for: .milliseconds(1_500))
                #expect(try await Self.detail(client)["auditCheckpointRefused"] as? Bool == true)
            }
            #expect(try await target.store.checkpoints().isEmpty, "no checkpoint was signed over the rewritten chain")
            #expect(try target.checkpointFile.lastCheckpoint() == signed, "the file did not move")
            let report = try await target.store.verifyAudit(trusted: try DatabaseWriterAttackTests.trustedFile(target), progressInterval: 100_000, progress: { _ in })
            #expect(!report.isIntact, "\(report)")
            #expect(report.suspectRange?.contains(3) == true, "\(report)")
        }
    }

    @Test(
        "A forged latest checkpoint row (the derived key's fingerprint, a signature by another key) over a rewritten chain: refused at start and by create(); a new instance's file does not take it",
        arguments: StoreBackend.testedCases)
    func forgedLatestCheckpoint(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            _ = try await DatabaseWriterAttackTests.signAndCheckpoint(target, count: 3)
            try await Self.rewriteRecord3(target, backend: backend)
            let head = try await target.store.auditHead()
            let derived = AuditSigningKey.derived(from: target.masterKey).publicKey
            let other = AuditSigningKey.generate().checkpoint(sequence: head.count, headHash: head.hash)
            try await target.attack(
                "DELETE FROM audit_checkpoints",
                "INSERT INTO audit_checkpoints (seq, head_hash, created_at, key_fingerprint, signature) VALUES (\(head.count), '\(head.hash)', \(other.createdAt.unixMilliseconds), '\(derived.fingerprint)', '\(other.signature)')")
            // A new instance: a file of its own that holds nothing yet.
            var fresh = target
            let file = LastCheckpointFile(path: target.directory.appendingPathComponent("fresh.checkpoint").path)
            fresh.configuration.checkpointFile = file
            fresh.configuration.checkpointEveryRecords = 1
            try await fresh.live { client in
                try await Self.waitForRefusal(client)
                #expect(try await DatabaseWriterAttackTests.sign(client, secret: target.secret).status == .created)
                try await Task.sleep(for: .milliseconds(1_500))
                #expect(try await Self.detail(client)["auditCheckpointRefused"] as? Bool == true)
            }
            #expect(try file.lastCheckpoint() == nil, "the forged checkpoint was not taken into the file")
            #expect(try await target.store.checkpoints().map(\.sequence) == [head.count], "nothing was signed after the forged row")
            await #expect {
                _ = try await AuditCheckpointing.create(in: target.store, masterKey: target.masterKey, checkpointFile: file)
            } throws: { ($0 as? StoreError)?.message.contains("does not carry a valid signature") == true }
        }
    }

    @Test("A checkpoint file that cannot be written stops the application from being built", arguments: StoreBackend.testedCases)
    func unwritableFileStopsTheStart(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            let notADirectory = target.directory.appendingPathComponent("plain-file")
            try Data("x".utf8).write(to: notADirectory)
            var blocked = target
            blocked.configuration.checkpointFile = LastCheckpointFile(path: notADirectory.appendingPathComponent("master.key.checkpoint").path)
            await #expect {
                _ = try await buildApplication(configuration: blocked.configuration, store: target.store)
            } throws: { "\($0)".contains("cannot be written") }
        }
    }

    @Test("Two PostgreSQL instances with checkpoint files of their own both move forward: the second takes the first's checkpoint at start, and each follows the checkpoints the other signs")
    func twoInstancesConverge() async throws {
        guard StoreBackend.testedCases.contains(.postgres) else { return }
        try await Target.with(.postgres) { target in
            _ = try await DatabaseWriterAttackTests.signAndCheckpoint(target, count: 2)
            var first = target
            first.configuration.checkpointEveryRecords = 1
            first.configuration.checkpointFile = LastCheckpointFile(path: target.directory.appendingPathComponent("a.checkpoint").path)
            var second = first
            second.configuration.checkpointFile = LastCheckpointFile(path: target.directory.appendingPathComponent("b.checkpoint").path)
            let fileA = try #require(first.configuration.checkpointFile)
            let fileB = try #require(second.configuration.checkpointFile)

            /// Waits (at most 15 s) until `file` holds a checkpoint beyond `sequence`.
            @Sendable func waitBeyond(_ file: LastCheckpointFile, _ sequence: Int64) async throws -> Int64 {
                let deadline = ContinuousClock.now + .seconds(15)
                while ContinuousClock.now < deadline {
                    if let held = try file.lastCheckpoint(), held.sequence > sequence { return held.sequence }
                    try await Task.sleep(for: .milliseconds(50))
                }
                Issue.record("\(file.path) did not move beyond \(sequence) within 15 s")
                return sequence
            }
            let secret = target.secret
            // Each instance with a store (a pool) of its own, as two servers would have.
            let storeA = try await target.fixture.openAnother(poolSize: 8)
            let storeB = try await target.fixture.openAnother(poolSize: 8)
            defer { Task { await storeA.close(); await storeB.close() } }
            let applicationA = try await buildApplication(configuration: first.configuration, store: storeA)
            let configurationB = second.configuration
            try await applicationA.test(.live) { clientA in
                #expect(try await DatabaseWriterAttackTests.sign(clientA, secret: secret).status == .created)
                let a1 = try await waitBeyond(fileA, 0)
                let applicationB = try await buildApplication(configuration: configurationB, store: storeB)
                try await applicationB.test(.live) { clientB in
                    // At start, B's empty file took the deployment's latest checkpoint.
                    let b0 = try #require(try fileB.lastCheckpoint()).sequence
                    #expect(b0 >= a1)
                    // Whichever instance signs the next checkpoints, both files move forward.
                    #expect(try await DatabaseWriterAttackTests.sign(clientB, secret: secret).status == .created)
                    let b1 = try await waitBeyond(fileB, b0)
                    let a2 = try await waitBeyond(fileA, a1)
                    #expect(try await DatabaseWriterAttackTests.sign(clientA, secret: secret).status == .created)
                    _ = try await waitBeyond(fileA, a2)
                    _ = try await waitBeyond(fileB, b1)
                    #expect(try await Self.detail(clientA)["auditCheckpointRefused"] as? Bool == false)
                    #expect(try await Self.detail(clientB)["auditCheckpointRefused"] as? Bool == false)
                }
            }
            let trusted = try #require(try fileA.read())
            let report = try await target.store.verifyAudit(
                trusted: AuditCheckpointSet(origin: "a.checkpoint", publicKey: trusted.publicKey, checkpoints: trusted.checkpoints), progressInterval: 100_000,
                progress: { _ in })
            #expect(report.isIntact, "\(report)")
        }
    }
}
