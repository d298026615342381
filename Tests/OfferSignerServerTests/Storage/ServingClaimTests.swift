import Foundation
import OfferSignerServer
import OfferSignerStorage
import Testing

/// One store serves a SQLite file at a time: what the service keeps in memory (the customers'
/// ledgers) is sound only while no other process issues signatures into the file.
@Suite("Serving a SQLite store")
struct ServingClaimTests {
    /// A fresh directory for a store, removed afterwards.
    private func withDirectory(_ body: (URL) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-serving-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        try await body(directory)
    }

    @Test("A second store that would serve the same SQLite file is refused, naming the process that serves it; once the first is closed it may serve")
    func secondServingStoreIsRefused() async throws {
        try await withDirectory { directory in
            let path = directory.appendingPathComponent("store.sqlite").path

            let first = try SQLiteStore(path: path)
            try await first.prepareForServing()
            try await first.prepareForServing()  // idempotent

            let second = try SQLiteStore(path: path)
            await #expect {
                try await second.prepareForServing()
            } throws: { error in
                guard let error = error as? StoreError else { return false }
                return error.code == .conflict && error.message.contains("already being served by process \(getpid())")
                    && error.message.contains("PostgreSQL")
            }
            // Opening the file beside the service (what `keys` and `audit` do) is still allowed.
            _ = try await second.auditHead()

            // Nor through a symbolic link to the same file.
            let link = directory.appendingPathComponent("link.sqlite").path
            try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: path)
            await #expect {
                try await SQLiteStore(path: link).prepareForServing()
            } throws: { error in
                (error as? StoreError)?.code == .conflict
            }

            await first.close()
            // The lock goes with the last descriptor of its open file. A child process that another
            // test of this process spawns at that moment holds a copy until its exec closes it
            // (O_CLOEXEC), for a moment: asked again, for up to 2 s, before that counts as held.
            let deadline = ContinuousClock.now + .seconds(2)
            while true {
                do {
                    try await second.prepareForServing()
                    break
                } catch let error as StoreError where error.code == .conflict && ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
            await second.close()
        }
    }

    @Test("A server on a SQLite file that another store serves does not start")
    func serverDoesNotStartOnAServedFile() async throws {
        try await withDirectory { directory in
            let path = directory.appendingPathComponent("store.sqlite").path
            let serving = try SQLiteStore(path: path)
            try await serving.prepareForServing()

            let masterKey = MasterKey.generate().key
            await #expect {
                _ = try await buildApplication(configuration: ServerConfiguration(masterKey: masterKey), store: try SQLiteStore(path: path))
            } throws: { error in
                (error as? StoreError)?.code == .conflict
            }
            await serving.close()
        }
    }
}
