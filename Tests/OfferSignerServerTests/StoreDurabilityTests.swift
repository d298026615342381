import Foundation
import Testing

@testable import OfferSignerStorage

/// The audit's durability promise rests on SQLite syncing the WAL on every commit
/// (`synchronous = FULL`). GRDB's pool turns WAL on with `synchronous = NORMAL`, which syncs
/// only at checkpoints, so a power cut could lose audit records of signatures already handed out.
@Suite struct StoreDurabilityTests {
    @Test func writerConnectionSyncsEveryCommit() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-durability-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path

        let fresh = try SQLiteStore(path: path)
        #expect(try await fresh.writerSynchronousMode() == 2)
        try await fresh.prepareForServing()
        #expect(try await fresh.writerSynchronousMode() == 2)

        // Reopening an existing store (WAL already on) keeps it too.
        let reopened = try SQLiteStore(path: path)
        #expect(try await reopened.writerSynchronousMode() == 2)
    }
}
