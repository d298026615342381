import Foundation
import GRDB
import GRDBSQLite
import OfferSignerCore
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Serving a SQLite file: the exclusive claim on it, checkpoints run apart from commits, the
/// write-ahead log's restart, and closing.
extension SQLiteStore {
    // MARK: - OfferSignerStore

    /// While serving, commits no longer run WAL checkpoints themselves (a checkpoint copies the
    /// log into the database and syncs it, stalling every request waiting on that commit);
    /// `performMaintenance` runs them passively from a separate connection instead.
    ///
    /// Rule: one store serves a SQLite file at a time. The service keeps what it needs to decide
    /// (the customers' ledgers, see `LedgerCache`) in memory, sound only while no other process
    /// issues signatures into the file; so serving takes an exclusive lock on `PATH.serving` (held
    /// until the store is closed, or by the kernel until the process ends, kill -9 included), and a
    /// second store that would serve the same file is refused. Other commands (`keys`, `audit`)
    /// may still open the file beside the service.
    public func prepareForServing() async throws {
        try claimServing()
        try await write { db in try db.execute(sql: "PRAGMA wal_autocheckpoint = 0") }
        // The writer connection is open, so the log exists (WAL mode) and stays the same file
        // for as long as the service runs: SQLite deletes it only when the last connection closes.
        if let database = FileIdentity(path: path) {
            servingFiles.withLock { $0 = ServingFiles(database: database, log: FileIdentity(path: path + "-wal")) }
        }
    }

    /// Takes the serving lock (see `prepareForServing`); idempotent. The lock file, not the
    /// database, is locked (`flock`): a descriptor of the database file closed by this process
    /// would drop SQLite's own POSIX locks on it.
    func claimServing() throws(StoreError) {
        try servingClaim.withLock { (claim: inout Int32?) throws(StoreError) in
            guard claim == nil else { return }
            // Named after the file's real path, so a symbolic link to it finds the same lock.
            let resolved = realpath(path, nil).map { pointer -> String in
                defer { free(pointer) }
                return String(cString: pointer)
            }
            let lockPath = (resolved ?? path) + ".serving"
            let descriptor = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            guard descriptor >= 0 else {
                throw StoreError(.unavailable, "cannot serve store '\(path)': cannot open its lock file '\(lockPath)': \(String(cString: strerror(errno)))")
            }
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
                let failure = errno
                var holder = [UInt8](repeating: 0, count: 32)
                let count = POSIXFile.read(descriptor, &holder, holder.count)
                POSIXFile.close(descriptor)
                guard failure == EWOULDBLOCK else {
                    throw StoreError(.unavailable, "cannot serve store '\(path)': cannot lock '\(lockPath)': \(String(cString: strerror(failure)))")
                }
                let pid = count > 0 ? String(decoding: holder[..<count], as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines) : ""
                throw StoreError(
                    .conflict,
                    "store '\(path)' is already being served\(pid.isEmpty ? "" : " by process \(pid)"); one process serves a SQLite store (run several instances on PostgreSQL)")
            }
            let pid = Array("\(getpid())\n".utf8)
            if ftruncate(descriptor, 0) == 0 { _ = pwrite(descriptor, pid, pid.count, 0) }
            claim = descriptor
        }
    }

    /// Gives the serving lock up (see `prepareForServing`).
    public func close() async {
        servingClaim.withLock { claim in
            if let descriptor = claim { POSIXFile.close(descriptor) }
            claim = nil
        }
    }

    /// A file as the kernel knows it: a removed and recreated file, or a copy moved in its
    /// place, has another identity under the same path.
    struct FileIdentity: Equatable, Sendable {
        var device: UInt64
        var inode: UInt64

        init?(path: String) {
            var status = stat()
            guard stat(path, &status) == 0 else { return nil }
            device = UInt64(status.st_dev)
            inode = UInt64(status.st_ino)
        }
    }

    struct ServingFiles: Sendable {
        var database: FileIdentity
        var log: FileIdentity?
    }

    /// Rule: while serving, an audit transaction commits only if the database file and its
    /// write-ahead log at `path` are still the files the writer has open. A removed file (its
    /// directory deleted, say) stays writable through the open descriptor, so without this check
    /// commits would go on succeeding into files nobody can open any more, and every record,
    /// with the signatures it vouches for, would be lost when the process exits. Two `stat`
    /// calls per group commit, against a sync that costs a thousand times more.
    func checkServingFilesInPlace() throws(StoreError) {
        guard let expected = servingFiles.withLock({ $0 }) else { return }
        let databaseInPlace = FileIdentity(path: path) == expected.database
        let logInPlace = expected.log.map { FileIdentity(path: path + "-wal") == $0 } ?? true
        guard databaseInPlace && logInPlace else {
            throw StoreError(
                .unavailable,
                "the store's \(databaseInPlace ? "write-ahead log" : "database file") at '\(path)' was removed or replaced while the service had it open; "
                    + "records written now would be lost: restore the store and restart the service")
        }
    }

    /// What the write test commits and deletes again: as many pages as a group of a few signatures.
    static let writeProbeValue = String(repeating: "0", count: 8 * 1024)

    /// The write test: on the writer connection, in an audit-style transaction (IMMEDIATE, synced
    /// on commit), a value of a few pages is written to `meta` and deleted again. Pages are
    /// written to the log at commit even though the row is gone, so a full or read-only disk fails
    /// it as it fails an audit commit; nothing is left in the store.
    public func checkAuditWritable() throws {
        do {
            try pool.writeWithoutTransaction { db in
                try Self.inAuditTransaction(db) {
                    try checkServingFilesInPlace()
                    try db.execute(sql: "INSERT OR REPLACE INTO meta (name, value) VALUES ('audit_write_probe', ?)", arguments: [Self.writeProbeValue])
                    try db.execute(sql: "DELETE FROM meta WHERE name = 'audit_write_probe'")
                }
            }
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.unavailable, "store write failed: \(Self.describe(error))")
        }
    }

    /// Test support: runs `body` on the writer connection, the one audit commits use (to give it
    /// a fault, such as `PRAGMA max_page_count` for a full store, that another connection cannot).
    func onWriterConnection<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        try await pool.writeWithoutTransaction(body)
    }

    /// A passive WAL checkpoint on a connection of its own: it copies the log into the
    /// database without blocking the writer. Under steady load a passive checkpoint never finds
    /// the log fully copied, so SQLite never starts the log over and the `-wal` file grows
    /// without bound (gigabytes within minutes). So once the log holds `walRestartPages` pages,
    /// the writer is asked to run a RESTART checkpoint before its next audit transaction: it
    /// copies what the passive passes left and the next commit writes the log from its start.
    /// The writer runs it itself because another connection waiting for the write lock would be
    /// starved by back-to-back commits.
    public func performMaintenance() async throws {
        _ = try await catchUpLog()
    }

    /// What one maintenance round did.
    struct LogCatchUp: Sendable {
        /// Passive passes run (1 when no restart was due).
        var passes: Int
        /// Frames the last pass copied.
        var lastPassFrames: Int
        /// Times the database file was synced after a pass that copied frames.
        var databaseSyncs: Int
        /// Whether the writer was asked to start the log over.
        var restartRequested: Bool
    }

    /// The log's size and how much of it was copied, as the last maintenance pass saw them.
    struct LogPosition: Sendable {
        var frames: Int
        var copied: Int

        /// Frames copied since `earlier`: all of them when there is none or the log started
        /// over in between (the counts start over with it).
        func framesCopied(since earlier: LogPosition?) -> Int {
            guard let earlier, earlier.frames <= frames, earlier.copied <= copied else { return copied }
            return copied - earlier.copied
        }
    }

    /// At most this many passive passes in a round that asks for a restart.
    static let catchUpPasses = 8
    /// A round that asks for a restart stops its passes once one copied fewer frames than this:
    /// about two group commits' worth at full load.
    static let catchUpFrames = 64

    /// The maintenance round behind `performMaintenance`.
    ///
    /// Rules:
    /// - Every pass that copied frames is followed by a sync of the database file. Under load a
    ///   passive pass never syncs it itself (SQLite syncs the database only when a checkpoint
    ///   finds the whole log copied, and commits keep adding to it), so without this the pages of
    ///   every pass since the last restart would wait, unwritten, for the RESTART's sync, and
    ///   the writer would spend tens of milliseconds writing them out while every commit waits.
    /// - Before a restart is requested, passive passes repeat (at most `catchUpPasses`) until
    ///   one copies fewer than `catchUpFrames` frames, so the writer's RESTART, which holds every
    ///   commit, has as little as possible left to copy. Each pass copies what was committed
    ///   during the previous one, so the remainder shrinks from pass to pass.
    func catchUpLog() async throws -> LogCatchUp {
        try await Task.detachedMaintenance { [self] in
            // Opening the path would create an empty database where the store was.
            try checkServingFilesInPlace()
            let queue = try DatabaseQueue(path: path)
            return try queue.writeWithoutTransaction { db -> LogCatchUp in
                var catchUp = LogCatchUp(passes: 0, lastPassFrames: 0, databaseSyncs: 0, restartRequested: false)
                // Columns: busy, frames in the log, frames copied into the database so far. What
                // the previous pass (or round) saw tells what this one copied.
                func passiveCheckpoint() throws -> Int {
                    let row = try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(PASSIVE)")
                    let now = LogPosition(frames: row?[1] ?? 0, copied: row?[2] ?? 0)
                    let before = lastLogPosition.withLock { position in
                        let before = position
                        position = now
                        return before
                    }
                    catchUp.passes += 1
                    catchUp.lastPassFrames = now.framesCopied(since: before)
                    if catchUp.lastPassFrames > 0 {
                        try syncDatabaseFile(db)
                        catchUp.databaseSyncs += 1
                    }
                    return now.frames
                }
                guard try passiveCheckpoint() >= walRestartPages else { return catchUp }
                while catchUp.passes < Self.catchUpPasses {
                    _ = try passiveCheckpoint()
                    if catchUp.lastPassFrames < Self.catchUpFrames { break }
                }
                walRestartRequested.store(true, ordering: .relaxed)
                catchUp.restartRequested = true
                return catchUp
            }
        }
    }

    /// Syncs the database file through the SQLite file handle of `db`'s own connection (its VFS
    /// `xSync`, as SQLite's checkpoints do; a sync covers the file's data whoever wrote it).
    ///
    /// Rule: never through a descriptor of our own. POSIX locks belong to the process, and
    /// closing any descriptor of the file drops all of them, including the SHARED lock SQLite's
    /// connections hold in WAL mode. Another process opening and closing the store (`audit
    /// verify`, `keys list`, a backup) would then believe it was the last one, checkpoint and
    /// delete the write-ahead log the service goes on committing into, and every later record
    /// would be lost with the deleted file. SQLite's own handles are safe: it defers closing
    /// descriptors of a file the process still has locks on.
    func syncDatabaseFile(_ db: Database) throws {
        var file: UnsafeMutablePointer<sqlite3_file>?
        let found = sqlite3_file_control(db.sqliteConnection, "main", SQLITE_FCNTL_FILE_POINTER, &file)
        guard found == SQLITE_OK, let file, let sync = file.pointee.pMethods?.pointee.xSync else {
            throw StoreError(.unavailable, "cannot sync the database file '\(path)': SQLite gave no handle for it (code \(found))")
        }
        let synced = sync(file, SQLITE_SYNC_NORMAL)
        guard synced == SQLITE_OK else {
            throw StoreError(.unavailable, "cannot sync the database file '\(path)': SQLite error \(synced)")
        }
    }

    /// On the writer connection, before an audit transaction: the RESTART checkpoint that
    /// maintenance asked for, if any.
    ///
    /// Rule: it never fails the audit transaction and holds commits at most about 20 ms. A
    /// reader still using the log (say `audit verify` on a live store) would otherwise keep the
    /// writer waiting for the whole busy timeout; if one does, the log stays as it is and the
    /// next maintenance asks again.
    func restartLogIfRequested(_ db: Database) {
        guard walRestartRequested.exchange(false, ordering: .relaxed) else { return }
        try? db.execute(sql: "PRAGMA busy_timeout = 20")
        _ = try? Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(RESTART)")
        try? db.execute(sql: "PRAGMA busy_timeout = \(busyTimeoutMilliseconds)")
    }
}

/// The C library's `read` and `close`, named apart from the methods of the types that call them.
enum POSIXFile {
    static func read(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int {
        #if canImport(Glibc)
        Glibc.read(descriptor, buffer, count)
        #else
        Darwin.read(descriptor, buffer, count)
        #endif
    }

    static func close(_ descriptor: Int32) {
        #if canImport(Glibc)
        _ = Glibc.close(descriptor)
        #else
        _ = Darwin.close(descriptor)
        #endif
    }
}
