import Foundation
import Logging
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// The group committer's busy-period delay: a commit is held back only after a busy group,
/// and never past a full group, its deadline, or a stop.
///
/// Where a commit must not be held, the delay is two minutes and the bound one: the bound is far
/// above anything a loaded machine needs (the whole suite running beside it has stalled the
/// concurrency pool for tens of seconds), and a wrongly held commit still fails it.
@Suite("Audit group commits: the busy-period delay", .serialized)
struct AuditCommitterTests {
    /// Runs a committer with `commitDelay` on a fresh store for the duration of `body`.
    static func withCommitter(
        commitDelay: Duration, _ body: (AuditCommitter, SQLiteStore) async throws -> Void
    ) async throws {
        let (store, directory) = try AuditServiceLifecycleTests.temporaryStore("committer")
        defer { try? FileManager.default.removeItem(at: directory) }
        let committer = AuditCommitter(
            store: store, batchLimit: 512, commitDelay: commitDelay, metrics: ServerMetrics(), logger: Logger(label: "offer-signer-test"))
        let running = Task { try await committer.run() }
        do {
            try await body(committer, store)
        } catch {
            committer.stop()
            try? await running.value
            throw error
        }
        committer.stop()
        try await running.value
        #expect(try await store.verifyAudit().isIntact)
    }

    static func entries(_ count: Int) -> [AuditAppend] { AuditServiceLifecycleTests.entries(count) }

    static func seconds(since start: ContinuousClock.Instant) -> Double {
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    @Test("Small groups are never held: an idle or lightly loaded service commits each request at once")
    func smallGroupsAreNotHeld() async throws {
        try await Self.withCommitter(commitDelay: Self.longDelay) { committer, _ in
            let start = ContinuousClock.now
            for _ in 0..<5 {
                _ = try await committer.commit(Self.entries(Self.busyBelow))
            }
            #expect(Self.seconds(since: start) < Self.bound, "a group below the busy size held the next commit back")
        }
    }

    static let longDelay = Duration.seconds(120)
    static let bound = 60.0

    /// The largest group that does not count as busy.
    static let busyBelow = AuditCommitter.busyGroupEntries - 1

    @Test("After a busy group, the next commit starts no sooner than the delay after it")
    func afterABusyGroupTheNextIsHeld() async throws {
        try await Self.withCommitter(commitDelay: .milliseconds(400)) { committer, store in
            let start = ContinuousClock.now
            _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
            let records = try await committer.commit(Self.entries(1))
            #expect(Self.seconds(since: start) >= 0.399, "the commit after a busy group was not held back")
            #expect(records.map(\.sequence) == [Int64(AuditCommitter.busyGroupEntries + 1)])
            #expect(try await store.auditHead().count == Int64(AuditCommitter.busyGroupEntries + 1))
        }
    }

    @Test("A held commit goes as soon as a full group is waiting, long before the delay")
    func aFullGroupGoesAtOnce() async throws {
        try await Self.withCommitter(commitDelay: Self.longDelay) { committer, store in
            _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
            let start = ContinuousClock.now
            let perRequest = 4
            try await withThrowingTaskGroup(of: [AuditRecord].self) { group in
                for _ in 0..<(AuditCommitter.fullGroupEntries / perRequest) {
                    group.addTask { try await committer.commit(Self.entries(perRequest)) }
                }
                var committed = 0
                for try await records in group { committed += records.count }
                #expect(committed == AuditCommitter.fullGroupEntries)
            }
            #expect(Self.seconds(since: start) < Self.bound, "a full group waited for the delay")
            #expect(try await store.auditHead().count == Int64(AuditCommitter.busyGroupEntries + AuditCommitter.fullGroupEntries))
        }
    }

    @Test("Stopping while a commit is held commits it at once")
    func stopDrainsAHeldCommit() async throws {
        let (store, directory) = try AuditServiceLifecycleTests.temporaryStore("committer-stop")
        defer { try? FileManager.default.removeItem(at: directory) }
        let committer = AuditCommitter(
            store: store, batchLimit: 512, commitDelay: Self.longDelay, metrics: ServerMetrics(), logger: Logger(label: "offer-signer-test"))
        let running = Task { try await committer.run() }
        _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
        let held = Task { try await committer.commit(Self.entries(1)) }
        try await Task.sleep(for: .milliseconds(200))
        let start = ContinuousClock.now
        committer.stop()
        let records = try await held.value
        try await running.value
        #expect(Self.seconds(since: start) < Self.bound, "stop waited for the commit delay")
        #expect(records.map(\.sequence) == [Int64(AuditCommitter.busyGroupEntries + 1)])
        #expect(try await store.verifyAudit().isIntact)
    }
}
