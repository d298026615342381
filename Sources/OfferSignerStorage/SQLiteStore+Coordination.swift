import Foundation

extension SQLiteStore {
    /// A SQLite file serves one process (several servers on one file are not supported), so a
    /// lock in this process is the whole lock: calls through this store object for the same lock
    /// run one at a time (two servers built on one store object in one process, as tests do,
    /// keep apart too).
    public func withExclusiveLock<T: Sendable>(_ lock: StoreLock, timeout: Duration, _ body: () async throws -> T) async throws -> T {
        do {
            return try await exclusiveLocks.withLock(lock.name, timeout: timeout, body)
        } catch is InProcessLocks.WaitTimedOut {
            throw StoreError(.timeout, "the \(lock.kind) lock was held by another caller for more than \(timeout.millisecondsText)")
        }
    }

    /// Readable, and the file is writable by this process.
    public func checkWritable() async throws {
        try await ping()
        guard FileManager.default.isWritableFile(atPath: path) else {
            throw StoreError(.unavailable, "the store file \(path) is read-only for this process")
        }
    }

    /// SQLite cannot notify another process; a server learns of changes by polling
    /// `registryVersion`. The sequence finishes at once.
    public func registryChanges() -> AsyncThrowingStream<Void, any Error> {
        AsyncThrowingStream { $0.finish() }
    }
}
