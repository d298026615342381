import Synchronization
import Testing

@testable import OfferSignerServer

/// Eligibility-checked signing is serialised per customer, never across customers, and a lock
/// is released however its holder ends.
@Suite struct CustomerSigningLocksTests {
    struct Expected: Error {}

    /// How many holders are inside at once, and the most seen.
    final class Occupancy: Sendable {
        private let counts = Mutex((inside: 0, most: 0))
        func enter() { counts.withLock { $0.inside += 1; $0.most = max($0.most, $0.inside) } }
        func leave() { counts.withLock { $0.inside -= 1 } }
        var most: Int { counts.withLock { $0.most } }
    }

    @Test func oneHolderAtATimePerCustomer() async throws {
        let locks = CustomerSigningLocks()
        let key = CustomerSigningLocks.key(bundleID: "com.example.app", appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        let occupancy = Occupancy()
        await withThrowingTaskGroup(of: Void.self) { group in
            for round in 0..<64 {
                group.addTask {
                    try await locks.withLock(key) {
                        occupancy.enter()
                        // Suspend inside the lock, as a ledger read and a commit do.
                        await Task.yield()
                        try await Task.sleep(for: .milliseconds(1))
                        occupancy.leave()
                        if round.isMultiple(of: 5) { throw Expected() }
                    }
                }
            }
            var failures = 0
            while let result = await group.nextResult() {
                if case .failure = result { failures += 1 }
            }
            #expect(failures == 13)
        }
        #expect(occupancy.most == 1)
        #expect(locks.heldCount == 0, "a lock stayed held after its holders ended")
    }

    @Test func otherCustomersDoNotWait() async throws {
        let locks = CustomerSigningLocks()
        let first = CustomerSigningLocks.key(bundleID: "com.example.app", appAccountToken: "a")
        let second = CustomerSigningLocks.key(bundleID: "com.example.app", appAccountToken: "b")
        let otherApp = CustomerSigningLocks.key(bundleID: "com.example.other", appAccountToken: "a")
        // While the first customer's lock is held, the others are taken and released.
        try await locks.withLock(first) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { await locks.withLock(second) {} }
                group.addTask { await locks.withLock(otherApp) {} }
                // Guards against a hang only: the two above finish at once unless they wait for `first`.
                group.addTask {
                    try await Task.sleep(for: .seconds(60))
                    Issue.record("another customer waited for the first one's lock")
                }
                try await group.next()
                try await group.next()
                group.cancelAll()
            }
            #expect(locks.heldCount == 1)
        }
        #expect(locks.heldCount == 0)
    }
}
