import Foundation
import Logging
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// How the audit services behave at the edges of their lives.
@Suite struct AuditServiceLifecycleTests {
    static func temporaryStore(_ name: String) throws -> (store: SQLiteStore, directory: URL) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-\(name)-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return (try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path), directory)
    }

    static func entries(_ count: Int) -> [AuditAppend] {
        (0..<count).map { _ in AuditAppend(entry: AuditEntry(kind: "test.entry", body: #"{"n":1}"#)) }
    }

    /// When the service group is cancelled (another service failed, e.g. the HTTP server could
    /// not bind its port), the checkpointer still signs a final checkpoint over the head.
    @Test func finalCheckpointIsWrittenWhenTheGroupIsCancelled() async throws {
        let (store, directory) = try Self.temporaryStore("checkpoint-cancel")
        defer { try? FileManager.default.removeItem(at: directory) }
        let masterKey = MasterKey.generate().key
        try await store.bindMasterKey(masterKey)
        _ = try await store.appendAudit(Self.entries(2), at: Date())
        let checkpointer = AuditCheckpointer(
            store: store, masterKey: masterKey, everyRecords: 1_000_000, every: .seconds(600), logger: Logger(label: "offer-signer-test"))
        let running = Task { try await checkpointer.run() }
        try await Task.sleep(for: .milliseconds(200))
        _ = try await store.appendAudit(Self.entries(3), at: Date())
        running.cancel()
        try await running.value

        let head = try await store.auditHead()
        let latest = try #require(try await store.latestCheckpoint(), "no checkpoint was written")
        #expect(latest.sequence == head.count)
        #expect(latest.headHash == head.hash)
    }
}
