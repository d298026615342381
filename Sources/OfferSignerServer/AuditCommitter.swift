import Dispatch
import Foundation
import Logging
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Commits audit entries in groups: every request waits until its entries are durably in the
/// store, and all entries that arrive while a transaction is being written go into the next
/// one, so durability costs one fsync per group rather than per signature.
///
/// The writing happens on a thread the committer owns, not on the concurrency pool: the
/// committer is the one serial step every signature passes through, so it must not wait in
/// line behind the request work it is holding up. The thread lives exactly as long as `run()`.
///
/// Rule: `commit` returns only after the entries and their ledger rows are committed; when the
/// write fails it throws, and the caller must not hand out the signature.
final class AuditCommitter: Service, Sendable {
    private struct Pending: Sendable {
        var appends: [AuditAppend]
        var continuation: CheckedContinuation<[AuditRecord], any Error>
    }

    private struct State: Sendable {
        var pending: [Pending] = []
        /// The writer thread is parked on `wakeUp`; whoever sets this back to false signals it once.
        var writerParked = false
        var stopped = false
    }

    private let state = Mutex(State())
    private let wakeUp = DispatchSemaphore(value: 0)
    private let store: any OfferSignerStore
    private let batchLimit: Int
    private let metrics: ServerMetrics
    private let logger: Logger

    init(store: any OfferSignerStore, batchLimit: Int, metrics: ServerMetrics, logger: Logger) {
        self.store = store
        self.batchLimit = max(1, batchLimit)
        self.metrics = metrics
        self.logger = logger
    }

    struct Stopped: Error {}

    /// Queues an entry and waits until it is committed.
    func commit(_ append: AuditAppend) async throws -> AuditRecord {
        try await commit([append])[0]
    }

    /// Queues entries that must land together (consecutive, in one transaction) and waits
    /// until they are committed.
    func commit(_ appends: [AuditAppend]) async throws -> [AuditRecord] {
        precondition(!appends.isEmpty, "nothing to commit")
        return try await withCheckedThrowingContinuation { continuation in
            let (wake, stopped) = state.withLock { state -> (Bool, Bool) in
                if state.stopped { return (false, true) }
                state.pending.append(Pending(appends: appends, continuation: continuation))
                let wake = state.writerParked
                state.writerParked = false
                return (wake, false)
            }
            if stopped {
                continuation.resume(throwing: Stopped())
            } else if wake {
                wakeUp.signal()
            }
        }
    }

    /// Stops accepting entries; what is queued is still committed.
    func stop() {
        let wake = state.withLock { state -> Bool in
            state.stopped = true
            let wake = state.writerParked
            state.writerParked = false
            return wake
        }
        if wake { wakeUp.signal() }
    }

    func run() async throws {
        await withGracefulShutdownHandler {
            await withTaskCancellationHandler {
                await withCheckedContinuation { (finished: CheckedContinuation<Void, Never>) in
                    let thread = Thread { [self] in
                        Self.nameCurrentThread()
                        writeUntilStopped()
                        finished.resume()
                    }
                    thread.name = Self.threadName
                    thread.start()
                }
            } onCancel: {
                self.stop()
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    /// The writer thread's name, as `top -H`, `perf` and /proc show it (at most 15 bytes on Linux).
    static let threadName = "audit-committer"

    /// Names the calling thread for the kernel. Foundation's `Thread.name`, set before `start()`,
    /// does not reach the kernel on Linux (only a name set by the running thread itself does):
    /// the thread would show under its creator's name (a Dispatch worker's), hiding the audit
    /// writer's share of the CPU from operators.
    private static func nameCurrentThread() {
        Thread.current.name = threadName
    }

    /// The writer thread: takes whatever is queued (up to the batch limit), commits it, answers
    /// the waiters, and parks when there is nothing to do. Returns once stopped and drained.
    private func writeUntilStopped() {
        while true {
            let batch = state.withLock { state -> [Pending]? in
                if state.pending.isEmpty {
                    if state.stopped { return nil }
                    state.writerParked = true
                    return []
                }
                // Whole requests only; at least one even if it alone is over the limit.
                var count = 0
                var entries = 0
                for pending in state.pending {
                    if count > 0 && entries + pending.appends.count > batchLimit { break }
                    count += 1
                    entries += pending.appends.count
                }
                let batch = Array(state.pending.prefix(count))
                state.pending.removeFirst(count)
                return batch
            }
            guard let batch else { return }
            if batch.isEmpty {
                wakeUp.wait()
                continue
            }
            write(batch)
        }
    }

    private func write(_ batch: [Pending]) {
        let start = ContinuousClock.now
        do {
            let records = try store.appendAuditBlocking(batch.flatMap(\.appends), at: Date())
            metrics.auditCommit(duration: ContinuousClock.now - start, entries: records.count)
            var offset = 0
            for pending in batch {
                let count = pending.appends.count
                pending.continuation.resume(returning: Array(records[offset..<offset + count]))
                offset += count
            }
        } catch {
            if batch.count > 1 {
                // One bad request must not sink the others: retry each on its own.
                for pending in batch { write([pending]) }
                return
            }
            metrics.auditFailure()
            logger.error("audit commit failed", metadata: ["error": "\(error)"])
            batch[0].continuation.resume(throwing: error)
        }
    }
}
