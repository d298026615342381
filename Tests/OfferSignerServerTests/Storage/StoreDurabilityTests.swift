import Dispatch
import Foundation
import GRDB
import Synchronization
import TestChildProcess
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

    /// With commits never pausing, passive checkpoints alone never let SQLite start the log
    /// over; maintenance must keep the `-wal` file bounded anyway.
    @Test func writeAheadLogStaysBoundedUnderSteadyWrites() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-wal-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        let restartPages = 256  // 1 MiB
        let store = try SQLiteStore(path: path, walRestartPages: restartPages)
        try await store.prepareForServing()

        // The writer blocks, so it gets a thread of its own (as the service's audit committer
        // does), never a thread of the concurrency pool.
        let stop = Atomic<Bool>(false)
        let written = Atomic<Int>(0)
        // Batches the writer may still commit: topped up after each maintenance pass, so the log
        // grows by a bounded amount between passes however slow a loaded test machine makes them
        // (the service runs maintenance every second whatever the load).
        let allowance = Atomic<Int>(20)
        let failure = Mutex<(any Error)?>(nil)
        let finished = DispatchSemaphore(value: 0)
        Thread {
            let body = String(repeating: "x", count: 600)
            while !stop.load(ordering: .relaxed) {
                if allowance.load(ordering: .relaxed) <= 0 {
                    usleep(1000)
                    continue
                }
                allowance.subtract(1, ordering: .relaxed)
                let batch = (0..<200).map { _ in AuditAppend(entry: AuditEntry(kind: "test.load", body: body)) }
                do {
                    _ = try store.appendAuditBlocking(batch, at: Date())
                } catch {
                    failure.withLock { $0 = error }
                    break
                }
                written.add(batch.count, ordering: .relaxed)
            }
            finished.signal()
        }.start()
        // Until the writer has put at least 64 MiB of record bodies into the log (which, never
        // restarted, would then be larger than that), or a minute has passed.
        let volume = 64 * 1024 * 1024
        let deadline = ContinuousClock.now + .seconds(60)
        var largestWAL = 0
        while written.load(ordering: .relaxed) * 600 < volume && ContinuousClock.now < deadline && failure.withLock({ $0 == nil }) {
            try await Task.sleep(for: .milliseconds(50))
            try await store.performMaintenance()
            allowance.store(20, ordering: .relaxed)
            let size = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int) ?? 0
            largestWAL = max(largestWAL, size)
        }
        stop.store(true, ordering: .relaxed)
        try await onOwnThread { finished.wait() }
        if let error = failure.withLock({ $0 }) { throw error }
        let records = written.load(ordering: .relaxed)
        #expect(records * 600 >= volume, "the writer wrote too little to tell (\(records) records)")
        #expect(largestWAL < 16 * 1024 * 1024, "the WAL reached \(largestWAL) bytes after \(records) records")
        #expect(try await store.verifyAudit().isIntact)
    }

    /// A reader still on the log (an `audit verify` of a live store, say) must not hold audit
    /// commits for the whole busy timeout, nor fail them, when a log restart is due.
    ///
    /// The busy timeout is 30 s, so a writer that waits for the reader takes 30 s (and then
    /// fails); the service's rule is ~20 ms. The bound checked is 10 s: far from both, so a
    /// loaded test machine (slow fsyncs, a busy concurrency pool) cannot make it flaky. Only the
    /// blocking commit is timed, on a thread of its own, as the audit committer runs it.
    @Test func logRestartNeverHoldsCommitsBehindALongReader() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-wal-reader-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        let store = try SQLiteStore(path: path, busyTimeout: 30, walRestartPages: 4)
        try await store.prepareForServing()
        let body = String(repeating: "x", count: 600)
        func batch() -> [AuditAppend] { (0..<50).map { _ in AuditAppend(entry: AuditEntry(kind: "test.load", body: body)) } }
        _ = try await store.appendAudit(batch(), at: Date())

        // A reader with an open snapshot on the log, held for the whole test.
        var readerConfiguration = Configuration()
        readerConfiguration.allowsUnsafeTransactions = true
        let reader = try DatabaseQueue(path: path, configuration: readerConfiguration)
        try await reader.writeWithoutTransaction { db in
            try db.execute(sql: "BEGIN DEFERRED")
            _ = try Int.fetchOne(db, sql: "SELECT count(*) FROM audit_log")
        }
        _ = try await store.appendAudit(batch(), at: Date())
        try await store.performMaintenance()  // the log is over 4 pages: a restart is due

        let appends = batch()
        let (records, elapsed) = try await withCheckedThrowingContinuation { (done: CheckedContinuation<([AuditRecord], Duration), any Error>) in
            Thread {
                let start = ContinuousClock.now
                do {
                    let records = try store.appendAuditBlocking(appends, at: Date())
                    done.resume(returning: (records, ContinuousClock.now - start))
                } catch {
                    done.resume(throwing: error)
                }
            }.start()
        }
        #expect(records.count == 50)
        #expect(elapsed < .seconds(10), "the commit waited \(elapsed) for the reader")

        try await reader.writeWithoutTransaction { db in try db.execute(sql: "COMMIT") }
        #expect(try await store.verifyAudit().isIntact)
    }

    /// A maintenance round that asks the writer to start the log over first repeats its passive
    /// passes until one copies (almost) nothing: the writer's RESTART holds every commit while
    /// it copies what the passes left. A round with no restart due makes one pass, asks nothing.
    /// Every pass that copied frames is followed by a sync of the database file, so the RESTART's
    /// own sync has next to nothing left to write either.
    @Test func maintenanceCatchesUpBeforeAskingForARestart() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-wal-catch-up-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        let store = try SQLiteStore(path: path, walRestartPages: 64)
        try await store.prepareForServing()
        // The schema's migrations may fill more than 64 pages of log (more with every migration):
        // a round now starts it over at the next commit, so the quiet round below starts small.
        try await store.performMaintenance()
        let body = String(repeating: "x", count: 600)
        func batch(_ count: Int) -> [AuditAppend] { (0..<count).map { _ in AuditAppend(entry: AuditEntry(kind: "test.load", body: body)) } }
        func logFrames() throws -> Int {
            let queue = try DatabaseQueue(path: path)
            return try queue.writeWithoutTransaction { db in try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(PASSIVE)")?[1] ?? -1 }
        }

        _ = try await store.appendAudit(batch(1), at: Date())
        let quiet = try await store.catchUpLog()
        #expect(quiet.passes == 1)
        #expect(quiet.lastPassFrames > 0)
        #expect(quiet.databaseSyncs == 1, "the pass copied frames and the database was not synced")
        #expect(!quiet.restartRequested)

        // 400 records of 600 bytes: well over 64 pages of log.
        for _ in 0..<4 { _ = try await store.appendAudit(batch(100), at: Date()) }
        let framesBefore = try logFrames()
        #expect(framesBefore >= 64)
        let due = try await store.catchUpLog()
        #expect(due.restartRequested)
        #expect(due.passes >= 2, "asked for a restart after a single pass")
        #expect(due.passes <= SQLiteStore.catchUpPasses)
        #expect(due.lastPassFrames < SQLiteStore.catchUpFrames, "left \(due.lastPassFrames) frames for the writer")
        // Nothing was committed during the round: the first pass copied the log, synced, and the
        // second found nothing to copy or sync.
        #expect(due.databaseSyncs == 1)

        // The next audit commit starts the log over: the log then holds that commit alone.
        _ = try await store.appendAudit(batch(1), at: Date())
        let framesAfter = try logFrames()
        #expect(framesAfter < framesBefore && framesAfter < 64, "the log still holds \(framesAfter) frames (\(framesBefore) before)")
        let after = try await store.catchUpLog()
        #expect(after.passes == 1)
        #expect(!after.restartRequested)
        let idle = try await store.catchUpLog()
        #expect(idle.lastPassFrames == 0 && idle.databaseSyncs == 0, "synced with nothing copied: \(idle)")
        #expect(try await store.verifyAudit().isIntact)
    }

    /// Another process that opens and closes the store while the service runs (`audit verify`,
    /// `keys list`, a backup) must find it locked. POSIX locks belong to the process, and closing
    /// any descriptor of the file drops all of them: a sync of the database file through a
    /// descriptor of its own would silently give up the SHARED lock that SQLite's connections
    /// hold in WAL mode. The other process, closing last as far as it can tell, would then
    /// checkpoint and delete the write-ahead log that the service goes on committing into, and
    /// every later audit record would be lost with the deleted file.
    @Test func maintenanceKeepsTheStoreLockedForOtherProcesses() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-lock-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        let store = try SQLiteStore(path: path)
        try await store.prepareForServing()
        let baseline = try await store.verifyAudit().recordsChecked
        func batch(_ count: Int) -> [AuditAppend] { (0..<count).map { _ in AuditAppend(entry: AuditEntry(kind: "test.lock", body: "{}")) } }

        _ = try await store.appendAudit(batch(10), at: Date())
        let round = try await store.catchUpLog()
        #expect(round.databaseSyncs == 1, "the round did not sync the database file: \(round)")

        // Another process opens the store, reads it and closes it.
        func countInAnotherProcess() async throws -> String {
            let result = try await ChildProcess.run(
                "/usr/bin/env",
                ["python3", "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); print(c.execute('SELECT count(*) FROM audit_log').fetchone()[0]); c.close()", path],
                timeout: .seconds(60))
            try #require(result.status == 0, "python3 failed: \(result.stderrText)")
            return result.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #expect(try await countInAnotherProcess() == "\(baseline + 10)")
        #expect(FileManager.default.fileExists(atPath: path + "-wal"), "the other process deleted the write-ahead log the service is using")

        // What the service commits afterwards is there for everyone.
        _ = try await store.appendAudit(batch(5), at: Date())
        #expect(try await countInAnotherProcess() == "\(baseline + 15)", "records committed after the other process closed are lost")
        #expect(try await store.verifyAudit().isIntact)
    }
}
