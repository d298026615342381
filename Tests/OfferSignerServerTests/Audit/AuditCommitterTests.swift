import Foundation
import GRDB
import Logging
import OfferSignerCore
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// The group committer's busy-period delay: a commit is held back only after a busy group,
/// and never past a full group, its deadline, or a stop.
///
/// Where a commit must not be held, the delay is ten minutes and the bound five: the bound is far
/// above anything a loaded machine needs (the whole suite running beside it has stalled the
/// concurrency pool for tens of seconds), and a wrongly held commit still fails it.
@Suite("Audit group commits: the busy-period delay, on SQLite and PostgreSQL", .serialized)
struct AuditCommitterTests {
    /// Runs a committer with `commitDelay` on a fresh store of `backend` for the duration of `body`.
    static func withCommitter(
        _ backend: StoreBackend, commitDelay: Duration, _ body: (AuditCommitter, StoreFixture) async throws -> Void
    ) async throws {
        try await StoreFixture.with(backend) { fixture in
            let committer = AuditCommitter(
                store: fixture.store, batchLimit: 512, commitDelay: commitDelay, metrics: ServerMetrics(), logger: Logger(label: "offer-signer-test"))
            let running = Task { try await committer.run() }
            // A commit wrongly held for the long delay fails its test at the bound, not ten
            // minutes a commit later: stopping releases whatever the committer holds.
            let watchdog = Task {
                try await Task.sleep(for: .seconds(bound))
                committer.stop()
            }
            defer { watchdog.cancel() }
            do {
                try await body(committer, fixture)
            } catch {
                committer.stop()
                try? await running.value
                throw error
            }
            committer.stop()
            try await running.value
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    static func entries(_ count: Int) -> [AuditAppend] { AuditServiceLifecycleTests.entries(count) }

    static func seconds(since start: ContinuousClock.Instant) -> Double {
        let elapsed = ContinuousClock.now - start
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    @Test("Small groups are never held: an idle or lightly loaded service commits each request at once", arguments: StoreBackend.testedCases)
    func smallGroupsAreNotHeld(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: Self.longDelay) { committer, _ in
            let start = ContinuousClock.now
            for _ in 0..<5 {
                _ = try await committer.commit(Self.entries(Self.busyBelow))
            }
            #expect(Self.seconds(since: start) < Self.bound, "a group below the busy size held the next commit back")
        }
    }

    @Test("Entries queued with a deadline that has passed are never written; the rest of the queue is, and cannot be taken back once written", arguments: StoreBackend.testedCases)
    func expiredEntriesAreNotWritten(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: .zero) { committer, fixture in
            let before = try await fixture.store.auditHead().count
            let late = committer.queue(Self.entries(2), until: ContinuousClock.now - .milliseconds(1))
            let timely = committer.queue(Self.entries(3), until: ContinuousClock.now + .seconds(600))
            await #expect(throws: AuditCommitter.Withdrawn.self) { try await late.value() }
            #expect(try await timely.value().count == 3)
            #expect(!committer.withdraw(timely), "written: nothing to take back")
            #expect(!committer.withdraw(late), "dropped by the writer: nothing to take back")
            #expect(try await fixture.store.auditHead().count == before + 3, "only the timely entries were written")
        }
    }

    static let longDelay = Duration.seconds(600)
    static let bound = 300.0

    /// The largest group that does not count as busy.
    static let busyBelow = AuditCommitter.busyGroupEntries - 1

    @Test("After a busy group, the next commit starts no sooner than the delay after it", arguments: StoreBackend.testedCases)
    func afterABusyGroupTheNextIsHeld(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: .milliseconds(400)) { committer, fixture in
            let store = fixture.store
            let start = ContinuousClock.now
            _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
            let records = try await committer.commit(Self.entries(1))
            #expect(Self.seconds(since: start) >= 0.399, "the commit after a busy group was not held back")
            #expect(records.map(\.sequence) == [Int64(AuditCommitter.busyGroupEntries + 1)])
            #expect(try await store.auditHead().count == Int64(AuditCommitter.busyGroupEntries + 1))
        }
    }

    @Test("A held commit goes as soon as a full group is waiting, long before the delay", arguments: StoreBackend.testedCases)
    func aFullGroupGoesAtOnce(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: Self.longDelay) { committer, fixture in
            let store = fixture.store
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

    @Test("Stopping while a commit is held commits it at once", arguments: StoreBackend.testedCases)
    func stopDrainsAHeldCommit(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
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
            #expect(try await store.verifiedChain().isIntact)
        }
    }

    /// Requests that land in one group: a busy group first, so the next commit is held until a
    /// full group is waiting; `requests` must add up to exactly that.
    static func inOneGroup(_ committer: AuditCommitter, _ requests: [[AuditAppend]]) async throws -> [Result<[AuditRecord], any Error>] {
        #expect(requests.map(\.count).reduce(0, +) == AuditCommitter.fullGroupEntries)
        _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
        return await withTaskGroup(of: (Int, Result<[AuditRecord], any Error>).self) { group in
            for (index, request) in requests.enumerated() {
                group.addTask {
                    do { return (index, .success(try await committer.commit(request))) } catch { return (index, .failure(error)) }
                }
            }
            var results = [Result<[AuditRecord], any Error>?](repeating: nil, count: requests.count)
            for await (index, result) in group { results[index] = result }
            return results.map { $0! }
        }
    }

    static func signature(nonce: String) -> IssuedSignature {
        IssuedSignature(
            nonce: nonce, issuedAt: Date(), client: "client:backend", bundleID: "com.example.app", productID: "pro.monthly",
            offerID: "WINBACK50", appAccountToken: nil, keyID: "KEY0000001", format: "legacy")
    }

    @Test("A request with a reused nonce fails alone; the rest of its group is committed", arguments: StoreBackend.testedCases)
    func aReusedNonceFailsOnlyItsRequest(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: Self.longDelay) { committer, fixture in
            let store = fixture.store
            let reused = UUID.timeOrdered().lowercasedString
            let first = Self.signature(nonce: reused)
            _ = try await committer.commit([AuditAppend(entry: first.auditEntry, signatures: [first])])
            let again = Self.signature(nonce: reused)
            let requests = (0..<5).map { _ in Self.entries(4) } + [Self.entries(3) + [AuditAppend(entry: again.auditEntry, signatures: [again])]]
            let results = try await Self.inOneGroup(committer, requests)
            for result in results.prefix(5) {
                #expect(throws: Never.self) { try result.get() }
            }
            #expect {
                try results[5].get()
            } throws: { error in
                (error as? StoreError)?.code == .duplicate
            }
            // The reused nonce, the busy group and the five good requests; nothing of the bad one.
            #expect(try await store.auditHead().count == Int64(1 + AuditCommitter.busyGroupEntries + 20))
        }
    }

    @Test("A request that gives up while its entries still wait is withdrawn: nothing of it is ever written", arguments: StoreBackend.testedCases)
    func aRequestGivingUpWhileQueuedIsWithdrawn(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: Self.longDelay) { committer, fixture in
            let store = fixture.store
            // A busy group: the next commit is held for a fuller group (or the ten-minute delay).
            _ = try await committer.commit(Self.entries(AuditCommitter.busyGroupEntries))
            let signature = Self.signature(nonce: UUID.timeOrdered().lowercasedString)
            await #expect {
                try await committer.commit([AuditAppend(entry: signature.auditEntry, signatures: [signature])], within: .milliseconds(200))
            } throws: { error in
                (error as? StoreError)?.code == .timeout
            }
            // A full group goes at once; the withdrawn request is not in it, nor anywhere.
            let after = try await committer.commit(Self.entries(AuditCommitter.fullGroupEntries))
            #expect(after.first?.sequence == Int64(1 + AuditCommitter.busyGroupEntries))
            #expect(try await store.auditHead().count == Int64(AuditCommitter.busyGroupEntries + AuditCommitter.fullGroupEntries))
            let records = try await store.auditRecords(after: 0, limit: 1000)
            #expect(!records.contains { $0.body.contains(signature.nonce) }, "the withdrawn signature has no audit record")
        }
    }

    @Test("A store-wide failure fails every request of the group, and the store goes on afterwards", arguments: StoreBackend.testedCases)
    func aStoreWideFailureFailsTheGroup(backend: StoreBackend) async throws {
        try await Self.withCommitter(backend, commitDelay: Self.longDelay) { committer, fixture in
            let store = fixture.store
            _ = try await committer.commit(Self.entries(1))
            // The store refuses records after the group's first request (the busy group before it
            // and the first request fit). A retry of each request on its own would commit that
            // first request; the group failing as one shows that nothing was retried.
            let lastAccepted = 1 + AuditCommitter.busyGroupEntries + 4
            switch backend {
            case .sqlite:
                try await fixture.execute("""
                    CREATE TRIGGER refuse_group BEFORE INSERT ON audit_log WHEN NEW.seq > \(lastAccepted)
                    BEGIN SELECT RAISE(ABORT, 'simulated disk failure'); END;
                    """)
            case .postgres:
                try await fixture.execute("""
                    CREATE FUNCTION refuse_group() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN IF NEW.seq > \(lastAccepted) THEN RAISE EXCEPTION 'simulated disk failure'; END IF; RETURN NEW; END $$
                    """)
                try await fixture.execute("CREATE TRIGGER refuse_group BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION refuse_group()")
            }
            let results = try await Self.inOneGroup(committer, (0..<6).map { _ in Self.entries(4) })
            for result in results {
                #expect {
                    try result.get()
                } throws: { error in
                    (error as? StoreError)?.code == .unavailable
                }
            }
            #expect(try await store.auditHead().count == Int64(1 + AuditCommitter.busyGroupEntries))
            try await fixture.execute(backend == .sqlite ? "DROP TRIGGER refuse_group" : "DROP TRIGGER refuse_group ON audit_log")
            // A full group, so the commit after the failed (busy) group is not held back.
            let after = try await committer.commit(Self.entries(AuditCommitter.fullGroupEntries))
            #expect(after.first?.sequence == Int64(2 + AuditCommitter.busyGroupEntries))
        }
    }
}
