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

/// The embedded default store: one SQLite file in WAL mode with `synchronous = FULL`, so a
/// committed transaction survives a crash or power loss.
public final class SQLiteStore: OfferSignerStore {
    /// The file path.
    public let path: String
    let pool: DatabasePool
    /// The size, in pages, of the write-ahead log at which `performMaintenance` makes SQLite
    /// start it over.
    let walRestartPages: Int
    let busyTimeoutMilliseconds: Int
    let walRestartRequested = Atomic<Bool>(false)
    /// The database file and write-ahead log the writer has open, as `prepareForServing` found
    /// them at `path`; nil before (see `checkServingFilesInPlace`).
    let servingFiles = Mutex<ServingFiles?>(nil)
    /// The locks of `withExclusiveLock` (see SQLiteStore+Coordination.swift).
    let exclusiveLocks = InProcessLocks()
    /// Every customer's ledger issuances this process has read or committed (see `LedgerCache`).
    let ledgerCache = LedgerCache()
    /// The open lock file that makes this store the only one serving its file (see
    /// `claimServing`); nil until `prepareForServing`.
    let servingClaim = Mutex<Int32?>(nil)
    /// The log's size and how much of it was copied, as the last maintenance pass saw them.
    let lastLogPosition = Mutex<LogPosition?>(nil)

    /// Opens (creating if needed) the store at `path` and applies schema migrations.
    /// `walRestartPages`: while serving, the write-ahead log is started over once it holds this
    /// many pages (default 32,768: 128 MiB with 4 KiB pages), so it stays bounded under load. Each
    /// restart holds commits, for 1–3 ms at full load on the development VM (up to about 20 ms
    /// while a reader is on the log), so it should not come round more than every few seconds.
    public init(path: String, busyTimeout: TimeInterval = 5, walRestartPages: Int = 32768) throws(StoreError) {
        self.path = path
        self.walRestartPages = max(1, walRestartPages)
        self.busyTimeoutMilliseconds = Int(busyTimeout * 1000)
        let directory = (path as NSString).deletingLastPathComponent
        if !directory.isEmpty && !FileManager.default.fileExists(atPath: directory) {
            throw StoreError(.unavailable, "cannot open store '\(path)': directory '\(directory)' does not exist")
        }
        var configuration = Configuration()
        configuration.busyMode = .timeout(busyTimeout)
        configuration.label = "offer-signer"
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
            // Durable commits: in WAL mode FULL syncs the log on every commit. Set on the writer
            // connection after opening: GRDB's pool sets NORMAL (no sync on commit) when it turns
            // WAL on, which runs after `prepareDatabase`.
            try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
            try Self.migrator.migrate(pool)
        } catch {
            throw StoreError(.unavailable, "cannot open store '\(path)': \(Self.describe(error))")
        }
    }

    deinit {
        servingClaim.withLock { claim in
            if let descriptor = claim { POSIXFile.close(descriptor) }
        }
    }

    /// The writer connection's `PRAGMA synchronous` (2 is FULL: every commit is synced).
    func writerSynchronousMode() async throws -> Int {
        try await pool.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    static func describe(_ error: any Error) -> String {
        if let databaseError = error as? DatabaseError {
            return databaseError.message ?? "\(databaseError.resultCode)"
        }
        return "\(error)"
    }


    // MARK: - Master key

    /// Binds the store to a master key on first use; afterwards refuses any other key.
    public func bindMasterKey(_ masterKey: MasterKey) async throws {
        let check = masterKey.checkValue
        let auditKey = AuditSigningKey.derived(from: masterKey)
        let sealed = auditKey.sealed(with: masterKey)
        try await write { db in
            if let stored = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = 'master_key_check'") {
                guard stored == check else {
                    throw StoreError(.masterKeyMismatch, "the master key does not match the one this store's keys were sealed with")
                }
            } else {
                try db.execute(sql: "INSERT INTO meta (name, value) VALUES ('master_key_check', ?)", arguments: [check])
                // A new store gets its audit-signing key (derived) with its master key; an older
                // or tampered one is left to `auditSigningKey`, which refuses.
                try Self.storeDerivedAuditKeyIfFresh(db, key: auditKey, sealed: sealed, refuse: false)
            }
        }
    }

    // MARK: - Helpers

    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return try await pool.write(body)
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.unavailable, "store write failed: \(Self.describe(error))")
        }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return try await pool.read(body)
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.unavailable, "store read failed: \(Self.describe(error))")
        }
    }

    /// A short read (a few indexed rows) run on the calling thread: GRDB's synchronous read
    /// takes a reader connection and runs `body` right here, where the asynchronous one moves to
    /// the reader's dispatch queue and back (two thread switches, which cost more than the read).
    /// Only for reads bounded by an index; a walk of a table uses `read`.
    func pointRead<T: Sendable>(_ body: (Database) throws -> T) throws -> T {
        do {
            return try pool.read(body)
        } catch let error as StoreError {
            throw error
        } catch {
            throw StoreError(.unavailable, "store read failed: \(Self.describe(error))")
        }
    }

    static func millis(_ date: Date?) -> Int64? { date?.unixMilliseconds }
    static func date(_ millis: Int64?) -> Date? { millis.map { Date(timeIntervalSince1970: Double($0) / 1000) } }
    static func date(_ millis: Int64) -> Date { Date(timeIntervalSince1970: Double(millis) / 1000) }

    // MARK: - OfferSignerStore

    public func ping() async throws {
        _ = try await read { db in try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") }
    }
}

extension Row {
    /// Reads a column, turning a value of the wrong type (a store edited by hand) into a
    /// `StoreError` that names the column but never echoes the row (which may hold key material).
    func column<Value: DatabaseValueConvertible>(_ name: String, _ table: String) throws -> Value {
        do {
            return try decode(Value.self, forColumn: name)
        } catch {
            throw StoreError(.unavailable, "\(table).\(name) holds a value of the wrong type (was the store edited by hand?)")
        }
    }
}

extension Task where Success == Never, Failure == Never {
    /// Runs blocking SQLite work off the cooperative thread pool.
    static func detachedMaintenance<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            DispatchQueue.global(qos: .utility).async {
                do {
                    continuation.resume(returning: try work())
                } catch {
                    continuation.resume(throwing: error)
                }
            }
        }
    }
}

/// One execution of a cached INSERT, bound and stepped through SQLite's C API: the audit
/// committer inserts two rows per signature, and `Statement.execute(arguments:)` builds a
/// `StatementArguments` of boxed values for each. Values are bound in parameter order, text
/// copied by SQLite (`SQLITE_TRANSIENT`); `run` steps once, then resets the statement and
/// clears its bindings whatever the outcome, and throws GRDB's `DatabaseError` on failure.
struct DirectInsert {
    let statement: OpaquePointer
    var index: Int32 = 0
    /// The first binding that failed (too big, out of memory), reported by `run`.
    var bindFailure: Int32 = SQLITE_OK

    init(_ statement: Statement) {
        self.statement = statement.sqliteStatement
    }

    mutating func bind(_ value: Int64) {
        index += 1
        record(sqlite3_bind_int64(statement, index, value))
    }

    mutating func bind(_ value: String?) {
        index += 1
        guard let value else {
            record(sqlite3_bind_null(statement, index))
            return
        }
        var text = value
        let (statement, index) = (statement, index)
        record(text.withUTF8 { bytes -> Int32 in
            guard let base = bytes.baseAddress, bytes.count > 0 else { return sqlite3_bind_text(statement, index, "", 0, Self.transient) }
            return base.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
                sqlite3_bind_text64(statement, index, $0, sqlite3_uint64(bytes.count), Self.transient, UInt8(SQLITE_UTF8))
            }
        })
    }

    private mutating func record(_ code: Int32) {
        if code != SQLITE_OK && bindFailure == SQLITE_OK { bindFailure = code }
    }

    /// Steps the statement once; throws the connection's error when a binding failed or the
    /// step did not finish.
    func run(_ db: Database) throws {
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        let connection = db.sqliteConnection
        let code = bindFailure == SQLITE_OK ? sqlite3_step(statement) : bindFailure
        guard code == SQLITE_DONE else {
            let extended = bindFailure == SQLITE_OK ? connection.map { sqlite3_extended_errcode($0) } ?? code : code
            throw DatabaseError(resultCode: ResultCode(rawValue: extended), message: connection.map { String(cString: sqlite3_errmsg($0)) })
        }
    }

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
}
