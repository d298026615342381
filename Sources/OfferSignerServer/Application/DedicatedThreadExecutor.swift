import Foundation

/// A task executor with one thread of its own, outside Swift's cooperative pool, and its own
/// timer.
///
/// Rule: work whose timing is a promise (the registry poll: a key activated or a client revoked
/// in the store is in force within a poll interval) runs here, so it never waits in the
/// cooperative pool's queue behind requests. A task that prefers this executor
/// (`withTaskExecutorPreference`) runs every step here, also after an `await` on a store read or
/// a continuation resumed elsewhere. Its pauses use ``sleep(for:)``, fired by this thread:
/// `Task.sleep` wakes through the global executor, that is, it needs a free pool thread.
///
/// ``shutdown()`` ends the thread once its queue is empty; a job enqueued after that runs on the
/// global concurrent executor, so nothing that still prefers this executor is stranded.
final class DedicatedThreadExecutor: TaskExecutor, @unchecked Sendable {
    private struct Timer {
        var id: UInt64
        var deadline: ContinuousClock.Instant
        var continuation: CheckedContinuation<Void, Never>
    }

    // Everything below is guarded by `condition`.
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var timers: [Timer] = []
    /// Sleeps cancelled before their timer was added, or after it fired but before the sleep
    /// returned (for nobody); each sleep takes its ID out as it ends.
    private var cancelledSleeps: Set<UInt64> = []
    private var nextSleep: UInt64 = 0
    private var stopping = false
    private var stopped = false
    private var thread: pthread_t?

    /// Starts the thread, named `name` for `top -H`, `perf` and debuggers (on Linux Foundation
    /// applies a thread's name only from the thread itself, and not always: a name to read, never
    /// to rely on; ``isCurrentThread`` tells).
    init(name: String) {
        let thread = Thread { [self] in
            Thread.current.name = name
            runLoop()
        }
        thread.start()
    }

    /// Whether the caller runs on this executor's thread.
    var isCurrentThread: Bool {
        guard let thread = condition.withLock({ self.thread }) else { return false }
        return pthread_equal(thread, pthread_self()) != 0
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        if stopped {
            condition.unlock()
            globalConcurrentExecutor.enqueue(job)
            return
        }
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Cancelled sleeps whose ID is still kept (0 once every sleep has ended).
    var cancelledSleepsKept: Int { condition.withLock { cancelledSleeps.count } }

    /// Suspends the calling task for `duration`, woken by this executor's thread (the task
    /// resumes on its own executor: this one, when it prefers it). Throws `CancellationError`
    /// at once when the task is cancelled, and when the executor is shut down: a sleep pending at
    /// shutdown ends then, and one begun after it ends at once (a loop of sleeps stops rather
    /// than spins).
    func sleep(for duration: Duration) async throws {
        let deadline = ContinuousClock.now + duration
        let id = condition.withLock {
            nextSleep += 1
            return nextSleep
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                condition.lock()
                if cancelledSleeps.remove(id) != nil || stopped {
                    condition.unlock()
                    continuation.resume()
                    return
                }
                timers.append(Timer(id: id, deadline: deadline, continuation: continuation))
                condition.signal()
                condition.unlock()
            }
        } onCancel: {
            condition.lock()
            if let index = timers.firstIndex(where: { $0.id == id }) {
                let timer = timers.remove(at: index)
                condition.unlock()
                timer.continuation.resume()
            } else {
                cancelledSleeps.insert(id)
                condition.unlock()
            }
        }
        // Once the handler scope has returned, its cancellation handler has ended or never runs;
        // one that ran after the timer fired left the ID behind.
        let stopping = condition.withLock {
            cancelledSleeps.remove(id)
            return self.stopping
        }
        if stopping { throw CancellationError() }
        try Task.checkCancellation()
    }

    /// Lets the thread end once its queue is empty; sleeps still pending end at once (with
    /// `CancellationError`).
    func shutdown() {
        condition.lock()
        stopping = true
        condition.signal()
        condition.unlock()
    }

    private func runLoop() {
        condition.lock()
        thread = pthread_self()
        while true {
            let now = ContinuousClock.now
            var due: [Timer] = []
            timers.removeAll { timer in
                guard timer.deadline <= now || stopping else { return false }
                due.append(timer)
                return true
            }
            if !due.isEmpty || !jobs.isEmpty {
                let batch = jobs
                jobs.removeAll(keepingCapacity: true)
                condition.unlock()
                for timer in due { timer.continuation.resume() }
                for job in batch { job.runSynchronously(on: asUnownedTaskExecutor()) }
                condition.lock()
                continue
            }
            if stopping {
                stopped = true
                condition.unlock()
                return
            }
            if let next = timers.map(\.deadline).min() {
                // At most 100 ms at a time, then the monotonic clock is read again: the wait's
                // deadline is on the wall clock, which NTP or a resumed VM may set back.
                let wait = min(now.duration(to: next), .milliseconds(100))
                let (seconds, attoseconds) = wait.components
                _ = condition.wait(until: Date(timeIntervalSinceNow: Double(seconds) + Double(attoseconds) / 1e18))
            } else {
                condition.wait()
            }
        }
    }
}
