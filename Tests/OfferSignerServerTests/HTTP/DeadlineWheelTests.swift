import Foundation
import OfferSignerCore
import OfferSignerStorage
import Synchronization
import Testing

/// The one timer every bounded call shares (`StoreDeadline`, the PostgreSQL store's operation
/// timeout, the audit committer's wait, the App Store Server API client's calls).
@Suite struct DeadlineWheelTests {
    /// When each expiry ran, by its index.
    final class Fired: Sendable {
        let times = Mutex<[Int: ContinuousClock.Instant]>([:])
        func record(_ index: Int) { times.withLock { $0[index] = ContinuousClock.now } }
        var snapshot: [Int: ContinuousClock.Instant] { times.withLock { $0 } }

        /// Waits (up to 60 s: on a loaded machine, with other tests' child processes holding the
        /// concurrency pool's threads, the wheel runs late, never early) for `count` expiries.
        func wait(for count: Int) async throws {
            let end = ContinuousClock.now + .seconds(60)
            while snapshot.count < count && ContinuousClock.now < end { try await Task.sleep(for: .milliseconds(10)) }
        }
    }

    @Test("An expiry runs once, never before its deadline; a cancelled one never runs; a deadline scheduled after the others ran still runs")
    func expiries() async throws {
        let wheel = DeadlineWheel(tick: .milliseconds(5))
        let fired = Fired()
        let start = ContinuousClock.now
        for index in 0..<40 {
            if index % 2 == 0 {
                _ = wheel.schedule(after: .milliseconds(20 + index * 5)) { fired.record(index) }
            } else {
                // Cancelled long before it falls due (a loaded machine may pause this test).
                wheel.cancel(wheel.schedule(after: .seconds(2)) { fired.record(index) })
            }
        }
        try await fired.wait(for: 20)
        try await Task.sleep(for: .milliseconds(2500))
        let times = fired.snapshot
        #expect(Set(times.keys) == Set(stride(from: 0, to: 40, by: 2)), "only the deadlines not cancelled ran")
        for (index, time) in times {
            #expect(start.duration(to: time) >= .milliseconds(20 + index * 5), "expiry \(index) ran early")
        }
        // The schedule calls above came after `start`, so each deadline is no earlier than this.

        // Nothing pending now (the ticking stops then): a new deadline still runs.
        let again = Fired()
        _ = wheel.schedule(after: .milliseconds(10)) { again.record(0) }
        try await again.wait(for: 1)
        #expect(again.snapshot.count == 1)
    }

    @Test("A store call that does not answer in time fails with a timeout; the late answer is dropped")
    func boundedCall() async throws {
        // The operation would take ten minutes; the caller must get its timeout long before
        // (at 50 ms on an idle machine; the bound allows for a loaded one).
        let start = ContinuousClock.now
        let error = await #expect(throws: StoreError.self) {
            try await StoreDeadline.run("a test read", timeout: .milliseconds(50)) {
                try? await Task.sleep(for: .seconds(600))
                return 1
            }
        }
        #expect(error?.code == .timeout)
        #expect(start.duration(to: .now) < .seconds(120), "the caller waited for the operation instead of its deadline")
        let value = try await StoreDeadline.run("a test read", timeout: .seconds(60)) { 7 }
        #expect(value == 7)
    }
}
