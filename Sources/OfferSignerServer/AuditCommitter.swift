import Foundation
import Logging
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Commits audit entries in groups: every request waits until its entry is durably in the
/// store, and all entries that arrive while a transaction is being written go into the next
/// one, so durability costs one fsync per group rather than per signature.
///
/// Rule: `commit` returns only after the entry and its ledger rows are committed; when the
/// write fails it throws, and the caller must not hand out the signature.
final class AuditCommitter: Service, Sendable {
    struct Pending: Sendable {
        var append: AuditAppend
        var continuation: CheckedContinuation<AuditRecord, any Error>
    }

    private struct State: Sendable {
        var pending: [Pending] = []
        var waiter: CheckedContinuation<Void, Never>?
        var stopped = false
    }

    private let state = Mutex(State())
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
        try await withCheckedThrowingContinuation { continuation in
            let (waiter, stopped) = state.withLock { state -> (CheckedContinuation<Void, Never>?, Bool) in
                if state.stopped { return (nil, true) }
                state.pending.append(Pending(append: append, continuation: continuation))
                let waiter = state.waiter
                state.waiter = nil
                return (waiter, false)
            }
            if stopped {
                continuation.resume(throwing: Stopped())
            } else {
                waiter?.resume()
            }
        }
    }

    /// Waits for work; returns nil once stopped and drained.
    private func nextBatch() async -> [Pending]? {
        while true {
            let batch = state.withLock { state -> [Pending]? in
                if !state.pending.isEmpty {
                    let count = min(batchLimit, state.pending.count)
                    let batch = Array(state.pending.prefix(count))
                    state.pending.removeFirst(count)
                    return batch
                }
                return state.stopped ? [] : nil
            }
            if let batch { return batch.isEmpty ? nil : batch }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { state -> Bool in
                        if !state.pending.isEmpty || state.stopped { return true }
                        state.waiter = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                stop()
            }
        }
    }

    /// Stops accepting entries; what is queued is still committed.
    func stop() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            state.stopped = true
            let waiter = state.waiter
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    func run() async throws {
        await withGracefulShutdownHandler {
            while let batch = await nextBatch() {
                await write(batch)
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    private func write(_ batch: [Pending]) async {
        let start = ContinuousClock.now
        do {
            let records = try await store.appendAudit(batch.map(\.append), at: Date())
            metrics.auditCommit(duration: ContinuousClock.now - start, entries: batch.count)
            for (pending, record) in zip(batch, records) { pending.continuation.resume(returning: record) }
        } catch {
            if batch.count > 1 {
                // One bad entry must not sink the others: retry each on its own.
                for pending in batch { await write([pending]) }
                return
            }
            metrics.auditFailure()
            logger.error("audit commit failed", metadata: ["error": "\(error)"])
            batch[0].continuation.resume(throwing: error)
        }
    }
}
