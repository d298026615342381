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
    private let pool: DatabasePool
    /// The size, in pages, of the write-ahead log at which `performMaintenance` makes SQLite
    /// start it over.
    let walRestartPages: Int
    private let busyTimeoutMilliseconds: Int
    private let walRestartRequested = Atomic<Bool>(false)
    /// The database file and write-ahead log the writer has open, as `prepareForServing` found
    /// them at `path`; nil before (see `checkServingFilesInPlace`).
    private let servingFiles = Mutex<ServingFiles?>(nil)
    /// The locks of `withExclusiveLock` (see SQLiteStore+Coordination.swift).
    let exclusiveLocks = InProcessLocks()
    /// Every customer's ledger issuances this process has read or committed (see `LedgerCache`).
    let ledgerCache = LedgerCache()
    /// The open lock file that makes this store the only one serving its file (see
    /// `claimServing`); nil until `prepareForServing`.
    private let servingClaim = Mutex<Int32?>(nil)

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

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE registry (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);
                INSERT INTO registry (id, version) VALUES (1, 1);
                CREATE TABLE signing_keys (
                    key_id TEXT PRIMARY KEY,
                    bundle_id TEXT NOT NULL,
                    issuer_id TEXT,
                    state TEXT NOT NULL CHECK (state IN ('ready', 'active', 'retired', 'revoked')),
                    origin TEXT NOT NULL,
                    public_key_pem TEXT NOT NULL,
                    fingerprint TEXT NOT NULL,
                    sealed_private_key BLOB NOT NULL,
                    imported_at INTEGER NOT NULL,
                    activated_at INTEGER,
                    retired_at INTEGER,
                    revoked_at INTEGER,
                    position INTEGER NOT NULL
                );
                CREATE UNIQUE INDEX one_active_key_per_bundle ON signing_keys (bundle_id) WHERE state = 'active';
                CREATE TABLE api_clients (
                    client_id TEXT PRIMARY KEY,
                    name TEXT NOT NULL UNIQUE,
                    bundle_ids TEXT NOT NULL,
                    secret_hash TEXT NOT NULL UNIQUE,
                    created_at INTEGER NOT NULL,
                    revoked_at INTEGER
                );
                CREATE TABLE audit_log (
                    seq INTEGER PRIMARY KEY,
                    recorded_at INTEGER NOT NULL,
                    kind TEXT NOT NULL,
                    body TEXT NOT NULL,
                    previous_hash TEXT NOT NULL,
                    hash TEXT NOT NULL
                );
                CREATE TABLE issued_signatures (
                    nonce TEXT PRIMARY KEY,
                    audit_seq INTEGER NOT NULL,
                    issued_at INTEGER NOT NULL,
                    client TEXT NOT NULL,
                    bundle_id TEXT NOT NULL,
                    product_id TEXT NOT NULL,
                    offer_id TEXT NOT NULL,
                    app_account_token TEXT,
                    key_id TEXT NOT NULL,
                    format TEXT NOT NULL
                );
                CREATE INDEX issued_by_customer ON issued_signatures (app_account_token, bundle_id, offer_id);
                """)
        }
        migrator.registerMigration("v2") { db in
            try Self.migrateAuditCheckpoints(db)
        }
        migrator.registerMigration("v3") { db in
            try Self.migrateAppleHistory(db)
        }
        return migrator
    }

    // MARK: - Master key

    /// Binds the store to a master key on first use; afterwards refuses any other key.
    public func bindMasterKey(_ masterKey: MasterKey) async throws {
        let check = masterKey.checkValue
        try await write { db in
            if let stored = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE name = 'master_key_check'") {
                guard stored == check else {
                    throw StoreError(.masterKeyMismatch, "the master key does not match the one this store's keys were sealed with")
                }
            } else {
                try db.execute(sql: "INSERT INTO meta (name, value) VALUES ('master_key_check', ?)", arguments: [check])
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

    private static func millis(_ date: Date?) -> Int64? { date?.unixMilliseconds }
    private static func date(_ millis: Int64?) -> Date? { millis.map { Date(timeIntervalSince1970: Double($0) / 1000) } }
    private static func date(_ millis: Int64) -> Date { Date(timeIntervalSince1970: Double(millis) / 1000) }

    private static func bumpRegistry(_ db: Database) throws {
        try db.execute(sql: "UPDATE registry SET version = version + 1 WHERE id = 1")
    }

    private static func key(from row: Row) throws -> SigningKeyRecord {
        let table = "signing_keys"
        let stateName: String = try row.column("state", table)
        guard let state = SigningKeyState(rawValue: stateName) else {
            throw StoreError(.unavailable, "signing_keys.state holds an unknown state (was the store edited by hand?)")
        }
        return SigningKeyRecord(
            keyID: try row.column("key_id", table), bundleID: try row.column("bundle_id", table), issuerID: try row.column("issuer_id", table),
            state: state, origin: try row.column("origin", table),
            publicKeyPEM: try row.column("public_key_pem", table), fingerprint: try row.column("fingerprint", table),
            importedAt: date(try row.column("imported_at", table) as Int64), activatedAt: date(try row.column("activated_at", table) as Int64?),
            retiredAt: date(try row.column("retired_at", table) as Int64?), revokedAt: date(try row.column("revoked_at", table) as Int64?),
            sealedPrivateKey: try row.column("sealed_private_key", table))
    }

    private static func client(from row: Row) throws -> APIClientRecord {
        let table = "api_clients"
        let bundles: String = try row.column("bundle_ids", table)
        return APIClientRecord(
            clientID: try row.column("client_id", table), name: try row.column("name", table),
            bundleIDs: bundles.isEmpty ? [] : bundles.split(separator: " ").map(String.init),
            secretHash: try row.column("secret_hash", table), createdAt: date(try row.column("created_at", table) as Int64),
            revokedAt: date(try row.column("revoked_at", table) as Int64?))
    }

    static func record(from row: Row) throws -> AuditRecord {
        let table = "audit_log"
        return AuditRecord(
            sequence: try row.column("seq", table), recordedAt: date(try row.column("recorded_at", table) as Int64),
            kind: try row.column("kind", table), body: try row.column("body", table),
            previousHash: try row.column("previous_hash", table), hash: try row.column("hash", table))
    }

    /// Appends audit entries inside an open write transaction; returns the stored records.
    static func appendAudit(_ db: Database, _ batch: [AuditAppend], at time: Date) throws -> [AuditRecord] {
        let head = try Row.fetchOne(db.cachedStatement(sql: "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1"))
        var sequence: Int64 = head?["seq"] ?? 0
        var previousHash: String = head?["hash"] ?? AuditChain.genesisHash
        let recordedAt = Date(timeIntervalSince1970: Double(time.unixMilliseconds) / 1000)
        var records: [AuditRecord] = []
        records.reserveCapacity(batch.count)
        let insertAudit = try db.cachedStatement(sql: "INSERT INTO audit_log (seq, recorded_at, kind, body, previous_hash, hash) VALUES (?, ?, ?, ?, ?, ?)")
        let insertSignature = try db.cachedStatement(sql: """
            INSERT INTO issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """)
        for append in batch {
            sequence += 1
            let hash = AuditChain.hash(previousHash: previousHash, sequence: sequence, recordedAt: recordedAt, kind: append.entry.kind, body: append.entry.body)
            var row = DirectInsert(insertAudit)
            row.bind(sequence)
            row.bind(recordedAt.unixMilliseconds)
            row.bind(append.entry.kind)
            row.bind(append.entry.body)
            row.bind(previousHash)
            row.bind(hash)
            try row.run(db)
            for signature in append.signatures {
                var row = DirectInsert(insertSignature)
                row.bind(signature.nonce)
                row.bind(sequence)
                row.bind(signature.issuedAt.unixMilliseconds)
                row.bind(signature.client)
                row.bind(signature.bundleID)
                row.bind(signature.productID)
                row.bind(signature.offerID)
                row.bind(signature.appAccountToken)
                row.bind(signature.keyID)
                row.bind(signature.format)
                do {
                    try row.run(db)
                } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_PRIMARYKEY {
                    throw StoreError(.duplicate, "nonce \(signature.nonce) was issued before; nonces are never reused")
                }
            }
            records.append(AuditRecord(sequence: sequence, recordedAt: recordedAt, kind: append.entry.kind, body: append.entry.body, previousHash: previousHash, hash: hash))
            previousHash = hash
        }
        return records
    }

    /// Runs `body` in an IMMEDIATE transaction whose BEGIN and COMMIT are cached statements:
    /// the audit committer runs one per group commit, and GRDB's `write` prepares both anew each
    /// time. Rolls back when `body` or the commit throws.
    static func inAuditTransaction<T>(_ db: Database, _ body: () throws -> T) throws -> T {
        try db.cachedStatement(sql: "BEGIN IMMEDIATE TRANSACTION").execute()
        do {
            let result = try body()
            try db.cachedStatement(sql: "COMMIT TRANSACTION").execute()
            return result
        } catch {
            if db.isInsideTransaction { try? db.rollback() }
            throw error
        }
    }

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
    private func claimServing() throws(StoreError) {
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

    deinit {
        servingClaim.withLock { claim in
            if let descriptor = claim { POSIXFile.close(descriptor) }
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
    private static let writeProbeValue = String(repeating: "0", count: 8 * 1024)

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
    private struct LogPosition: Sendable {
        var frames: Int
        var copied: Int

        /// Frames copied since `earlier`: all of them when there is none or the log started
        /// over in between (the counts start over with it).
        func framesCopied(since earlier: LogPosition?) -> Int {
            guard let earlier, earlier.frames <= frames, earlier.copied <= copied else { return copied }
            return copied - earlier.copied
        }
    }

    private let lastLogPosition = Mutex<LogPosition?>(nil)

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
    private func syncDatabaseFile(_ db: Database) throws {
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
    private func restartLogIfRequested(_ db: Database) {
        guard walRestartRequested.exchange(false, ordering: .relaxed) else { return }
        try? db.execute(sql: "PRAGMA busy_timeout = 20")
        _ = try? Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(RESTART)")
        try? db.execute(sql: "PRAGMA busy_timeout = \(busyTimeoutMilliseconds)")
    }

    public func ping() async throws {
        _ = try await read { db in try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") }
    }

    public func registryVersion() async throws -> Int64 {
        try await read { db in try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") ?? 0 }
    }

    public func registrySnapshot() async throws -> RegistrySnapshot {
        try await read { db in
            RegistrySnapshot(
                version: try Int64.fetchOne(db, sql: "SELECT version FROM registry WHERE id = 1") ?? 0,
                keys: try Row.fetchAll(db, sql: "SELECT * FROM signing_keys ORDER BY position").map { try Self.key(from: $0) },
                clients: try Row.fetchAll(db, sql: "SELECT * FROM api_clients ORDER BY created_at, name").map { try Self.client(from: $0) })
        }
    }

    public func importKey(_ key: SigningKeyRecord, actor: String, reason: String?) async throws -> SigningKeyRecord {
        try await write { db in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM signing_keys WHERE key_id = ?", arguments: [key.keyID]) != nil {
                throw StoreError(.duplicate, "key '\(key.keyID)' is already in the store")
            }
            if let existing = try String.fetchOne(db, sql: "SELECT key_id FROM signing_keys WHERE fingerprint = ?", arguments: [key.fingerprint]) {
                throw StoreError(.duplicate, "this key is already in the store as '\(existing)'")
            }
            let hasActive = try Row.fetchOne(db, sql: "SELECT 1 FROM signing_keys WHERE bundle_id = ? AND state = 'active'", arguments: [key.bundleID]) != nil
            var stored = key
            stored.state = hasActive ? .ready : .active
            stored.activatedAt = hasActive ? nil : key.importedAt
            let position = (try Int64.fetchOne(db, sql: "SELECT MAX(position) FROM signing_keys") ?? 0) + 1
            try db.execute(
                sql: """
                    INSERT INTO signing_keys (key_id, bundle_id, issuer_id, state, origin, public_key_pem, fingerprint, sealed_private_key, imported_at, activated_at, position)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                arguments: [
                    stored.keyID, stored.bundleID, stored.issuerID, stored.state.rawValue, stored.origin, stored.publicKeyPEM,
                    stored.fingerprint, stored.sealedPrivateKey, stored.importedAt.unixMilliseconds, Self.millis(stored.activatedAt), position,
                ])
            try Self.bumpRegistry(db)
            let body = AuditBody.make([
                ("actor", actor), ("reason", reason), ("keyID", stored.keyID), ("bundleID", stored.bundleID),
                ("origin", stored.origin), ("state", stored.state.rawValue), ("fingerprint", stored.fingerprint),
            ])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "key.imported", body: body))], at: key.importedAt)
            return stored
        }
    }

    public func listKeys() async throws -> [SigningKeyRecord] {
        try await read { db in try Row.fetchAll(db, sql: "SELECT * FROM signing_keys ORDER BY position").map { try Self.key(from: $0) } }
    }

    public func transitionKey(keyID: String, to state: SigningKeyState, actor: String, reason: String?, force: Bool) async throws -> SigningKeyRecord {
        try await write { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE key_id = ?", arguments: [keyID]) else {
                throw StoreError(.notFound, "no key '\(keyID)' in the store")
            }
            let key = try Self.key(from: row)
            let now = Date()
            let activeRow = try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE bundle_id = ? AND state = 'active'", arguments: [key.bundleID])
            let previousActive = try activeRow.map { try Self.key(from: $0) }
            var kind: String
            switch state {
            case .active:
                guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is revoked and can never sign again") }
                guard key.state != .active else { throw StoreError(.conflict, "key '\(keyID)' is already the active key of \(key.bundleID)") }
                if let previousActive {
                    try db.execute(sql: "UPDATE signing_keys SET state = 'retired', retired_at = ? WHERE key_id = ?", arguments: [now.unixMilliseconds, previousActive.keyID])
                }
                try db.execute(sql: "UPDATE signing_keys SET state = 'active', activated_at = ?, retired_at = NULL WHERE key_id = ?", arguments: [now.unixMilliseconds, keyID])
                kind = "key.activated"
            case .retired:
                guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is revoked; it cannot be retired") }
                guard key.state != .retired else { throw StoreError(.conflict, "key '\(keyID)' is already retired") }
                if key.state == .active && !force {
                    throw StoreError(.conflict, "key '\(keyID)' is the only active key of \(key.bundleID): retiring it stops all signing for that app; activate another key first, or pass --force")
                }
                try db.execute(sql: "UPDATE signing_keys SET state = 'retired', retired_at = ? WHERE key_id = ?", arguments: [now.unixMilliseconds, keyID])
                kind = "key.retired"
            case .revoked:
                guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is already revoked") }
                if key.state == .active && !force {
                    throw StoreError(.conflict, "key '\(keyID)' is the only active key of \(key.bundleID): revoking it stops all signing for that app; activate another key first, or pass --force")
                }
                try db.execute(sql: "UPDATE signing_keys SET state = 'revoked', revoked_at = ? WHERE key_id = ?", arguments: [now.unixMilliseconds, keyID])
                kind = "key.revoked"
            case .ready:
                throw StoreError(.conflict, "a key cannot be moved back to 'ready'")
            }
            try Self.bumpRegistry(db)
            let newActive = try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE bundle_id = ? AND state = 'active'", arguments: [key.bundleID]).map { try Self.key(from: $0) }
            let body = AuditBody.make([
                ("actor", actor), ("reason", reason), ("keyID", keyID), ("bundleID", key.bundleID),
                ("fromState", key.state.rawValue), ("toState", state.rawValue),
                ("previousActiveKeyID", previousActive?.keyID), ("previousActiveFingerprint", previousActive?.fingerprint),
                ("newActiveKeyID", newActive?.keyID), ("newActiveFingerprint", newActive?.fingerprint),
            ])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: kind, body: body))], at: now)
            return try Self.key(from: try Row.fetchOne(db, sql: "SELECT * FROM signing_keys WHERE key_id = ?", arguments: [keyID])!)
        }
    }

    public func createClient(_ client: APIClientRecord, actor: String) async throws -> APIClientRecord {
        try await write { db in
            if try Row.fetchOne(db, sql: "SELECT 1 FROM api_clients WHERE name = ?", arguments: [client.name]) != nil {
                throw StoreError(.duplicate, "a client named '\(client.name)' exists already")
            }
            try db.execute(
                sql: "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at) VALUES (?, ?, ?, ?, ?)",
                arguments: [client.clientID, client.name, client.bundleIDs.joined(separator: " "), client.secretHash, client.createdAt.unixMilliseconds])
            try Self.bumpRegistry(db)
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", client.name), ("bundleIDs", client.bundleIDs.joined(separator: " "))])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "client.created", body: body))], at: client.createdAt)
            return client
        }
    }

    public func listClients() async throws -> [APIClientRecord] {
        try await read { db in try Row.fetchAll(db, sql: "SELECT * FROM api_clients ORDER BY created_at, name").map { try Self.client(from: $0) } }
    }

    public func revokeClient(name: String, actor: String) async throws -> APIClientRecord {
        try await write { db in
            guard let row = try Row.fetchOne(db, sql: "SELECT * FROM api_clients WHERE name = ?", arguments: [name]) else {
                throw StoreError(.notFound, "no client named '\(name)'")
            }
            var client = try Self.client(from: row)
            guard client.revokedAt == nil else { throw StoreError(.conflict, "client '\(name)' is already revoked") }
            let now = Date()
            try db.execute(sql: "UPDATE api_clients SET revoked_at = ? WHERE client_id = ?", arguments: [now.unixMilliseconds, client.clientID])
            try Self.bumpRegistry(db)
            let body = AuditBody.make([("actor", actor), ("clientID", client.clientID), ("name", name)])
            _ = try Self.appendAudit(db, [AuditAppend(entry: AuditEntry(kind: "client.revoked", body: body))], at: now)
            client.revokedAt = Self.date(now.unixMilliseconds)
            return client
        }
    }

    public func appendAudit(_ batch: [AuditAppend], at time: Date) async throws -> [AuditRecord] {
        try await pool.writeWithoutTransaction { db in self.restartLogIfRequested(db) }
        do {
            let records = try await write { db in try Self.appendAudit(db, batch, at: time) }
            ledgerCache.committed(batch)
            return records
        } catch {
            ledgerCache.clear()
            throw error
        }
    }

    public func appendAuditBlocking(_ batch: [AuditAppend], at time: Date) throws -> [AuditRecord] {
        do {
            let records = try pool.writeWithoutTransaction { db in
                restartLogIfRequested(db)
                return try Self.inAuditTransaction(db) {
                    try checkServingFilesInPlace()
                    return try Self.appendAudit(db, batch, at: time)
                }
            }
            ledgerCache.committed(batch)
            return records
        } catch {
            ledgerCache.clear()
            if let error = error as? StoreError { throw error }
            throw StoreError(.unavailable, "store write failed: \(Self.describe(error))")
        }
    }

    public func auditRecords(after sequence: Int64, limit: Int) async throws -> [AuditRecord] {
        try await read { db in
            try Row.fetchAll(db, sql: "SELECT * FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?", arguments: [sequence, limit]).map { try Self.record(from: $0) }
        }
    }

    public func auditHead() async throws -> (count: Int64, hash: String) {
        let (count, hash) = try await read { db -> (Int64, String) in
            let row = try Row.fetchOne(db, sql: "SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1")
            return (row?["seq"] ?? 0, row?["hash"] ?? AuditChain.genesisHash)
        }
        return (count, hash)
    }

    public func issuedSignatures(appAccountToken: String, bundleID: String) async throws -> [IssuedSignatureRecord] {
        try pointRead { db in
            // A cached statement: compiled once per reader connection, not per request.
            try Row.fetchAll(
                db.cachedStatement(sql: "SELECT * FROM issued_signatures WHERE app_account_token = ? AND bundle_id = ? ORDER BY issued_at"),
                arguments: [appAccountToken, bundleID]
            ).map { row in
                IssuedSignatureRecord(
                    signature: IssuedSignature(
                        nonce: try row.column("nonce", "issued_signatures"), issuedAt: Self.date(try row.column("issued_at", "issued_signatures") as Int64),
                        client: try row.column("client", "issued_signatures"), bundleID: try row.column("bundle_id", "issued_signatures"),
                        productID: try row.column("product_id", "issued_signatures"), offerID: try row.column("offer_id", "issued_signatures"),
                        appAccountToken: try row.column("app_account_token", "issued_signatures"),
                        keyID: try row.column("key_id", "issued_signatures"), format: try row.column("format", "issued_signatures")),
                    auditSequence: try row.column("audit_seq", "issued_signatures"))
            }
        }
    }

    /// From `ledgerCache` once the customer's issuances were read (or none were ever issued here
    /// and read as such); from the database otherwise.
    public func ledgerIssuances(appAccountToken: String, bundleID: String) async throws -> [LedgerIssuance] {
        let customer = LedgerCache.Customer(bundleID: bundleID, appAccountToken: appAccountToken)
        if let cached = ledgerCache.issuances(of: customer) { return cached }
        let ticket = ledgerCache.ticket()
        let issuances = try readLedgerIssuances(appAccountToken: appAccountToken, bundleID: bundleID)
        ledgerCache.fill(customer, issuances, readAfter: ticket)
        return issuances
    }

    private func readLedgerIssuances(appAccountToken: String, bundleID: String) throws -> [LedgerIssuance] {
        try pointRead { db in
            let rows = try Row.fetchCursor(
                db.cachedStatement(
                    sql: "SELECT DISTINCT offer_id, issued_at FROM issued_signatures WHERE app_account_token = ? AND bundle_id = ? ORDER BY issued_at"),
                arguments: [appAccountToken, bundleID])
            var issuances: [LedgerIssuance] = []
            while let row = try rows.next() {
                // By position: the columns are the two selected (a lookup by name costs more than the read).
                let offerID: String
                let issuedAt: Int64
                do {
                    offerID = try row.decode(String.self, atIndex: 0)
                    issuedAt = try row.decode(Int64.self, atIndex: 1)
                } catch {
                    throw StoreError(.unavailable, "issued_signatures holds an offer or a time of the wrong type (was the store edited by hand?)")
                }
                issuances.append(LedgerIssuance(offerID: offerID, issuedAt: Self.date(issuedAt)))
            }
            return issuances
        }
    }

    /// Walks the whole audit chain with a streaming cursor, calling `progress` every
    /// `progressInterval` records. Returns the walker's final state.
    public func verifyAuditChain(progressInterval: Int64 = 100_000, progress: @escaping @Sendable (Int64) -> Void = { _ in }) async throws -> AuditChain.Walker {
        try await read { db in
            var walker = AuditChain.Walker()
            let cursor = try Row.fetchCursor(db, sql: "SELECT seq, recorded_at, kind, body, previous_hash, hash FROM audit_log ORDER BY seq")
            while let row = try cursor.next() {
                guard walker.check(try Self.record(from: row)) else { break }
                if walker.count % progressInterval == 0 { progress(walker.count) }
            }
            return walker
        }
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
    private let statement: OpaquePointer
    private var index: Int32 = 0
    /// The first binding that failed (too big, out of memory), reported by `run`.
    private var bindFailure: Int32 = SQLITE_OK

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

/// The C library's `read` and `close`, named apart from the methods of the types that call them.
private enum POSIXFile {
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
