import Foundation
import OfferSignerStorage
import Synchronization
import Testing

/// The one timer every bounded store call shares (`StoreDeadline`, the PostgreSQL store's
/// operation timeout).
@Suite struct DeadlineWheelTests {
    /// When each expiry ran, by its index.
    final class Fired: Sendable {
        let times = Mutex<[Int: ContinuousClock.Instant]>([:])
        func record(_ index: Int) { times.withLock { $0[index] = ContinuousClock.now } }
        var snapshot: [Int: ContinuousClock.Instant] { times.withLock { $0 } }

        /// Waits (up to 10 s: a loaded machine runs the wheel late, never early) for `count` expiries.
        func wait(for count: Int) async throws {
            let end = ContinuousClock.now + .seconds(10)
            while snapshot.count < count && ContinuousClock.now < end { try await Task.sleep(for: .milliseconds(10)) }
        }
    }

    @Test("An expiry runs once, never before its deadline; a cancelled one never runs; the wheel starts again after it went idle")
    func expiries() async throws {
        let wheel = DeadlineWheel(tick: .milliseconds(5))
        let fired = Fired()
        let start = ContinuousClock.now
        var tickets: [DeadlineWheel.Ticket] = []
        for index in 0..<40 {
            tickets.append(wheel.schedule(after: .milliseconds(20 + index * 5)) { fired.record(index) })
        }
        for index in stride(from: 1, to: 40, by: 2) { wheel.cancel(tickets[index]) }
        try await fired.wait(for: 20)
        try await Task.sleep(for: .milliseconds(100))
        let times = fired.snapshot
        #expect(Set(times.keys) == Set(stride(from: 0, to: 40, by: 2)), "only the deadlines not cancelled ran")
        for (index, time) in times {
            #expect(start.duration(to: time) >= .milliseconds(20 + index * 5), "expiry \(index) ran early")
        }

        // Idle now (nothing pending): a new deadline starts it again.
        let again = Fired()
        _ = wheel.schedule(after: .milliseconds(10)) { again.record(0) }
        try await again.wait(for: 1)
        #expect(again.snapshot.count == 1)
    }

    @Test("A store call that does not answer in time fails with a timeout; the late answer is dropped")
    func boundedCall() async throws {
        let start = ContinuousClock.now
        await #expect(throws: StoreError.self) {
            try await StoreDeadline.run("a test read", timeout: .milliseconds(50)) {
                try? await Task.sleep(for: .seconds(2))
                return 1
            }
        }
        #expect(start.duration(to: .now) < .seconds(1.5), "the caller waited for the operation instead of its deadline")
        let value = try await StoreDeadline.run("a test read", timeout: .seconds(5)) { 7 }
        #expect(value == 7)
    }
}
