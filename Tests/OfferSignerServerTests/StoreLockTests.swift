import Foundation
import OfferSignerStorage
import Synchronization
import Testing

/// The store's exclusive locks between two instances of one PostgreSQL store (each with its own
/// pool, as two servers would have): a waiter that runs out of time is refused, and never runs
/// its body without the lock.
@Suite("Store locks between instances")
struct StoreLockTests {
    @Test("A customer lock held by one instance refuses another's wait with a timeout, and is free again once released")
    func lockTimeoutRefusesTheWaiter() async throws {
        try await StoreFixture.with(.postgres) { fixture in
            let other = try await fixture.openAnother()
            let lock = StoreLock.customer(bundleID: "com.example.app", appAccountToken: "6b29fc40-ca47-1067-b31d-00dd010662da")
            let (held, holding) = AsyncStream.makeStream(of: Void.self)
            let (release, releasing) = AsyncStream.makeStream(of: Void.self)
            let holder = Task {
                try await fixture.store.withExclusiveLock(lock, timeout: .seconds(30)) {
                    holding.yield()
                    for await _ in release {}
                }
            }
            for await _ in held { break }

            let bodyRan = Atomic<Bool>(false)
            await #expect {
                try await other.withExclusiveLock(lock, timeout: .milliseconds(300)) { bodyRan.store(true, ordering: .relaxed) }
            } throws: { error in
                (error as? StoreError)?.code == .timeout
            }
            #expect(bodyRan.load(ordering: .relaxed) == false, "the waiter ran its body without the lock")

            releasing.finish()
            try await holder.value
            let ran = try await other.withExclusiveLock(lock, timeout: .seconds(30)) { true }
            #expect(ran)
            await other.close()
        }
    }

    @Test("Three times as many requests as the pool has connections, each holding its customer lock and reading inside it: all go through")
    func customerLocksLeaveConnectionsForTheirBodies() async throws {
        try await StoreFixture.with(.postgres, poolSize: 4) { fixture in
            let store = fixture.store
            let start = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<12 {
                    group.addTask {
                        let token = "00000000-0000-4000-8000-\(String(format: "%012d", index))"
                        try await store.withExclusiveLock(.customer(bundleID: "com.example.app", appAccountToken: token), timeout: .seconds(30)) {
                            // What a signing request does under its lock: read the ledger, then commit.
                            _ = try await store.issuedSignatures(appAccountToken: token, bundleID: "com.example.app")
                            _ = try await store.appendAudit([AuditAppend(entry: AuditEntry(kind: "test.note", body: #"{"n":\#(index)}"#))], at: Date())
                        }
                    }
                }
                try await group.waitForAll()
            }
            #expect(ContinuousClock.now - start < .seconds(30), "no request waited out the lock timeout")
            #expect(try await store.auditHead().count == 12)
        }
    }
}
