import Foundation
import OfferSignerStorage
import Synchronization
import Testing

@testable import OfferSignerServer

@Suite("DedicatedThreadExecutor: the registry poll's own thread")
struct DedicatedThreadExecutorTests {
    @Test("A task that prefers it runs every step on its thread: after its sleeps and after a SQLite read resumed from GRDB's queue")
    func runsOnItsThread() async throws {
        let executor = DedicatedThreadExecutor(name: "executor-test-1")
        defer { executor.shutdown() }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("dedicated-executor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store = try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path)
        let onThread = try await withTaskExecutorPreference(executor) { () async throws -> [Bool] in
            var onThread = [executor.isCurrentThread]
            let start = ContinuousClock.now
            try await executor.sleep(for: .milliseconds(50))
            #expect(ContinuousClock.now - start >= .milliseconds(50))
            onThread.append(executor.isCurrentThread)
            _ = try await store.registryChangeMark()
            onThread.append(executor.isCurrentThread)
            try await executor.sleep(for: .milliseconds(1))
            onThread.append(executor.isCurrentThread)
            return onThread
        }
        #expect(onThread == [true, true, true, true])
        #expect(!executor.isCurrentThread)
    }

    @Test("Sleeps end in deadline order, each no earlier than asked, when several tasks wait at once")
    func severalSleeps() async throws {
        let executor = DedicatedThreadExecutor(name: "executor-test-2")
        defer { executor.shutdown() }
        let order = Finished()
        try await withTaskExecutorPreference(executor) {
            try await withThrowingDiscardingTaskGroup { group in
                for milliseconds in [120, 20, 70] {
                    group.addTask {
                        let start = ContinuousClock.now
                        try await executor.sleep(for: .milliseconds(milliseconds))
                        #expect(ContinuousClock.now - start >= .milliseconds(milliseconds))
                        #expect(executor.isCurrentThread)
                        order.list.withLock { $0.append(milliseconds) }
                    }
                }
            }
        }
        #expect(order.list.withLock { $0 } == [20, 70, 120])
    }

    @Test("A cancelled sleep throws CancellationError at once, whether cancelled before or while it waits")
    func cancellation() async throws {
        let executor = DedicatedThreadExecutor(name: "executor-test-3")
        defer { executor.shutdown() }
        let start = ContinuousClock.now
        let waiting = Task(executorPreference: executor) { try await executor.sleep(for: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(20))
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        let early = Task(executorPreference: executor) {
            withUnsafeCurrentTask { $0?.cancel() }
            try await executor.sleep(for: .seconds(60))
        }
        await #expect(throws: CancellationError.self) { try await early.value }
        #expect(ContinuousClock.now - start < .seconds(30))
    }

    @Test("A sleep cancelled after its timer fired, before it returned, keeps nothing behind")
    func cancellationAfterTheTimerKeepsNothing() async throws {
        let executor = DedicatedThreadExecutor(name: "executor-test-5")
        defer { executor.shutdown() }
        let flags = BlockerFlags()
        // The sleeper queues the blocker right before it sleeps, so the thread runs the blocker
        // as soon as the sleeper has set its timer. The blocker holds the thread past the
        // sleeper's deadline and until the canceller is queued; the thread then fires the timer
        // (the sleeper is queued to resume) and runs the canceller before the sleeper: the
        // cancellation finds no timer, as it fired. Only the thread being descheduled for the
        // whole second between the sleeper's suspension and the blocker could change the order;
        // every wait gives up after 30 s rather than hang.
        let sleeper = Task(executorPreference: executor) {
            Task(executorPreference: executor) {
                flags.blocker.store(1, ordering: .sequentiallyConsistent)
                let start = ContinuousClock.now
                // Blocks the thread on purpose.
                while ContinuousClock.now - start < .milliseconds(1200) || !flags.cancellerQueued.load(ordering: .sequentiallyConsistent) {
                    if ContinuousClock.now - start > .seconds(30) {
                        flags.blocker.store(3, ordering: .sequentiallyConsistent)
                        return
                    }
                    usleep(1_000)
                }
                flags.blocker.store(2, ordering: .sequentiallyConsistent)
            }
            try await executor.sleep(for: .seconds(1))
        }
        let waiting = ContinuousClock.now
        while flags.blocker.load(ordering: .sequentiallyConsistent) == 0, ContinuousClock.now - waiting < .seconds(30) {
            try await Task.sleep(for: .milliseconds(1))
        }
        let started = flags.blocker.load(ordering: .sequentiallyConsistent)
        try #require(started != 0, "the blocker never ran")
        let canceller = Task(executorPreference: executor) { sleeper.cancel() }
        flags.cancellerQueued.store(true, ordering: .sequentiallyConsistent)
        // The canceller runs after the blocker has let the thread go.
        await canceller.value
        let blocked = flags.blocker.load(ordering: .sequentiallyConsistent)
        #expect(blocked == 2, "the blocker gave up waiting for the canceller")
        await #expect(throws: CancellationError.self) { try await sleeper.value }
        #expect(executor.cancelledSleepsKept == 0)
    }

    @Test("After shutdown, pending and later sleeps end with CancellationError, and a task that still prefers it runs to the end (on the global executor)")
    func shutdownStrandsNothing() async throws {
        let executor = DedicatedThreadExecutor(name: "executor-test-4")
        let sleeper = Task(executorPreference: executor) { try await executor.sleep(for: .seconds(60)) }
        try await Task.sleep(for: .milliseconds(20))
        let shutdownAt = ContinuousClock.now
        executor.shutdown()
        await #expect(throws: CancellationError.self) { try await sleeper.value }
        #expect(ContinuousClock.now - shutdownAt < .seconds(30), "the pending 60 s sleep was not ended by shutdown")
        // A sleep begun after shutdown ends at once, so a loop of sleeps stops rather than spins.
        let late = Task(executorPreference: executor) { try await executor.sleep(for: .seconds(60)) }
        await #expect(throws: CancellationError.self) { try await late.value }
        #expect(ContinuousClock.now - shutdownAt < .seconds(30))
        // Whether the thread has ended yet or not, a task that prefers it completes.
        let work = Task(executorPreference: executor) { () async -> Int in
            await Task.yield()
            return 42
        }
        #expect(await work.value == 42)
    }
}

private final class BlockerFlags: Sendable {
    /// 0 not started, 1 holding the thread, 2 done, 3 gave up waiting for the canceller.
    let blocker = Atomic<Int>(0)
    let cancellerQueued = Atomic<Bool>(false)
}

private final class Finished: Sendable {
    let list = Mutex<[Int]>([])
}
