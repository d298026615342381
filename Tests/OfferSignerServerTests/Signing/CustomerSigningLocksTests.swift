import OfferSignerStorage
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
                    // The timeout only bounds a lock never released; 64 holders in turn must not
                    // run into it when the suite beside them holds the machine for a while.
                    try await locks.withLock(key, timeout: .seconds(180)) {
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
        try await locks.withLock(first, timeout: .seconds(30)) {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await locks.withLock(second, timeout: .seconds(30)) {} }
                group.addTask { try await locks.withLock(otherApp, timeout: .seconds(30)) {} }
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

    @Test("A waiter gives up after its timeout, leaves the line, and the lock still passes to the next one")
    func waitIsBounded() async throws {
        let locks = CustomerSigningLocks()
        let key = CustomerSigningLocks.key(bundleID: "com.example.app", appAccountToken: "c")
        let release = AsyncStream.makeStream(of: Void.self)
        let holder = Task {
            try await locks.withLock(key, timeout: .seconds(30)) {
                for await _ in release.stream { break }
            }
        }
        while locks.heldCount == 0 { try await Task.sleep(for: .milliseconds(1)) }
        let start = ContinuousClock.now
        await #expect(throws: CustomerSigningLocks.WaitTimedOut.self) {
            try await locks.withLock(key, timeout: .milliseconds(100)) { Issue.record("got a lock that was held") }
        }
        let waited = ContinuousClock.now - start
        // The holder lets go only after this, so `WaitTimedOut` is the timeout's doing; the upper
        // bound only catches a wait far past it (a machine loaded by the other suites has delayed
        // a 100 ms timer by more than 30 s).
        #expect(waited >= .milliseconds(100) && waited < .seconds(120), "waited \(waited)")
        // A patient waiter behind the one that gave up still gets the lock once it is released.
        let patient = Task { try await locks.withLock(key, timeout: .seconds(120)) { true } }
        try await Task.sleep(for: .milliseconds(20))
        release.continuation.yield()
        try await holder.value
        #expect(try await patient.value)
        #expect(locks.heldCount == 0)
    }
}
