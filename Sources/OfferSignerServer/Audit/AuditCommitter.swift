import Dispatch
import Foundation
import Logging
import OfferSignerCore
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
/// write fails it throws, and the caller must not hand out the signature. A request whose own
/// entries are refused (a reused nonce) fails alone: the rest of its group is committed without
/// it. A store-wide failure fails the whole group at once.
///
/// Rule: a store-wide failure marks `health` failing (so `/readyz` answers 503), and the next
/// successful commit clears it. While failing with nothing queued, the writer runs the store's
/// write test every `probeInterval`, so the service notices recovery by itself: a load balancer
/// sends no signing traffic to an instance that is not ready.
final class AuditCommitter: Service, Sendable {
    private struct Pending: Sendable {
        var id: UInt64
        var appends: [AuditAppend]
        var waiter: CommitWaiter
        /// Past this instant the entries are not written (see `queue(_:until:)`).
        var deadline: ContinuousClock.Instant?
    }

    private struct State: Sendable {
        var pending: [Pending] = []
        /// The number of entries in `pending`.
        var pendingEntries = 0
        /// The writer thread is parked on `wakeUp`; whoever sets this back to false signals it once.
        var writerParked = false
        /// While parked, the writer is woken once this many entries are pending (1 when idle;
        /// a full group while it holds a busy-period commit back; see `commitDelay`).
        var wakeAtEntries = 1
        var stopped = false
        /// The last id given to a queued request (see `withdraw`).
        var lastID: UInt64 = 0
    }

    private enum NextStep {
        /// Write the batch (possibly empty); answer the expired ones `Withdrawn` unwritten.
        case write([Pending], entries: Int, expired: [Pending])
        /// Park until woken; with a deadline, at most until then.
        case park(until: ContinuousClock.Instant?)
        /// Nothing queued while commits are failing: run the store's write test.
        case probe
        case finish
    }

    private let state = Mutex(State())
    private let wakeUp = DispatchSemaphore(value: 0)
    private let store: any OfferSignerStore
    private let batchLimit: Int
    private let commitDelay: Duration
    private let metrics: ServerMetrics
    private let logger: Logger
    /// Whether commits are getting through (read by `/readyz`).
    let health: AuditCommitHealth
    private let probeInterval: Duration

    /// A group of at least this many entries means the service is busy: the next group commit
    /// may be held back (see `commitDelay`).
    static let busyGroupEntries = 8
    /// A held-back group commit starts as soon as this many entries are pending (or the batch
    /// limit, when lower).
    static let fullGroupEntries = 24

    /// - Parameter commitDelay: while the service is busy (the last group held at least
    ///   `busyGroupEntries` entries), the next group commit starts no sooner than this after the
    ///   previous one started, unless `fullGroupEntries` entries are pending before then. Busy
    ///   periods then commit fewer, larger groups: each commit has a fixed cost (a sync, the log
    ///   pages every group rewrites), so larger groups cost less CPU per signature. A request on
    ///   an idle or lightly loaded service is committed at once. Zero turns it off.
    /// - Parameter probeInterval: while commits are failing and nothing is queued, how often the
    ///   writer runs the store's write test to find out whether the store has recovered.
    init(
        store: any OfferSignerStore, batchLimit: Int, commitDelay: Duration = .zero, metrics: ServerMetrics, logger: Logger,
        health: AuditCommitHealth = AuditCommitHealth(), probeInterval: Duration = .seconds(1)
    ) {
        self.health = health
        self.probeInterval = max(.milliseconds(10), probeInterval)
        self.store = store
        self.batchLimit = max(1, batchLimit)
        self.commitDelay = max(.zero, commitDelay)
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
        let waiter = CommitWaiter()
        enqueue(appends, waiter: waiter)
        return try await waiter.value()
    }

    /// Queues entries that must land together and waits at most `timeout` for their commit.
    ///
    /// Rule: entries still queued when the time passes (or the caller is cancelled) are withdrawn
    /// and never written, so a request answered "nothing was issued" leaves no audit record or
    /// ledger row behind (a phantom issuance would count against the customer's next request).
    /// They are queued before the wait starts, so a withdrawal always finds them if the writer has
    /// not. Entries the writer has already taken keep the outcome of that write: past the timeout
    /// this throws, and they may still land (an audit record for a signature never sent, never
    /// the other way round).
    ///
    /// The wait is bounded by the shared deadline wheel finishing the waiter with the timeout
    /// (as `StoreDeadline.run` would, without the task it starts for every call: about 12,000
    /// instructions a signature).
    func commit(_ appends: [AuditAppend], within timeout: Duration) async throws -> [AuditRecord] {
        let waiter = CommitWaiter()
        let id = enqueue(appends, waiter: waiter)
        let deadline = DeadlineWheel.shared.schedule(after: timeout) {
            waiter.finish(.failure(StoreError(.timeout, "audit commit: the store did not answer within \(timeout.millisecondsText)")))
        }
        defer { DeadlineWheel.shared.cancel(deadline) }
        do {
            return try await withTaskCancellationHandler {
                try await waiter.value()
            } onCancel: {
                waiter.finish(.failure(CancellationError()))
            }
        } catch {
            withdraw(id)
            throw error
        }
    }

    /// Entries queued with a deadline (see `queue(_:until:)`): wait for them with `value()`, or
    /// take them back with `withdraw(_:)`.
    struct QueuedCommit: Sendable {
        fileprivate let id: UInt64
        fileprivate let waiter: CommitWaiter

        /// The commit's outcome: the records, or the write's error, or `Withdrawn`.
        func value() async throws -> [AuditRecord] { try await waiter.value() }
    }

    /// Queues entries that must land together and must not be written after `deadline`.
    ///
    /// Rule: the writer never starts writing entries whose deadline has passed: it answers their
    /// waiter `Withdrawn` instead. Entries the writer took before the deadline keep the outcome of
    /// that write, which may complete after it: the caller learns it from `value()` (used by
    /// Retention Messaging, whose answer is worthless to Apple after its time limit).
    func queue(_ appends: [AuditAppend], until deadline: ContinuousClock.Instant) -> QueuedCommit {
        let waiter = CommitWaiter()
        let id = enqueue(appends, waiter: waiter, deadline: deadline)
        return QueuedCommit(id: id, waiter: waiter)
    }

    /// Takes queued entries back if the writer has not taken them yet: true when they were (they
    /// will never be written, and their waiter gets `Withdrawn`); false when they are being
    /// written or done (their outcome comes from `value()`).
    @discardableResult
    func withdraw(_ commit: QueuedCommit) -> Bool {
        withdraw(commit.id)
    }

    /// One entry, committed as `commit(_:within:)` commits several.
    func commit(_ append: AuditAppend, within timeout: Duration) async throws -> AuditRecord {
        try await commit([append], within: timeout)[0]
    }

    /// Takes a request's entries back out of the queue if the writer has not taken them yet; its
    /// waiter gets `Withdrawn`. Does nothing once they are being written or done.
    @discardableResult
    private func withdraw(_ id: UInt64) -> Bool {
        let withdrawn = state.withLock { state -> Pending? in
            guard let index = state.pending.firstIndex(where: { $0.id == id }) else { return nil }
            let pending = state.pending.remove(at: index)
            state.pendingEntries -= pending.appends.count
            return pending
        }
        withdrawn?.waiter.finish(.failure(Withdrawn()))
        return withdrawn != nil
    }

    /// The entries were taken back before the writer reached them: nothing was written.
    struct Withdrawn: Error {}

    /// Queues entries at once (the caller waits on `waiter`); returns their id for `withdraw`.
    @discardableResult
    private func enqueue(_ appends: [AuditAppend], waiter: CommitWaiter, deadline: ContinuousClock.Instant? = nil) -> UInt64 {
        precondition(!appends.isEmpty, "nothing to commit")
        let (id, wake, stopped) = state.withLock { state -> (UInt64, Bool, Bool) in
            state.lastID += 1
            if state.stopped { return (state.lastID, false, true) }
            state.pending.append(Pending(id: state.lastID, appends: appends, waiter: waiter, deadline: deadline))
            state.pendingEntries += appends.count
            let wake = state.writerParked && state.pendingEntries >= state.wakeAtEntries
            if wake { state.writerParked = false }
            return (state.lastID, wake, false)
        }
        if stopped {
            waiter.finish(.failure(Stopped()))
        } else if wake {
            wakeUp.signal()
        }
        return id
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

    /// Names the calling thread for the kernel: on Linux by writing its `comm` in /proc.
    /// Foundation's `Thread.name` does not do it reliably there: set before `start()` it never
    /// reaches the kernel, and set from inside the thread it reaches it only once `start()` has
    /// recorded the new thread's handle, which a thread that runs at once (on a loaded machine)
    /// can beat. The thread then keeps its creator's name (a concurrency-pool worker's), hiding
    /// the audit writer's share of the CPU from operators.
    private static func nameCurrentThread() {
        #if os(Linux)
        guard let comm = FileHandle(forWritingAtPath: "/proc/thread-self/comm") else { return }
        try? comm.write(contentsOf: Data(threadName.utf8))
        try? comm.close()
        #else
        Thread.current.name = threadName
        #endif
    }

    /// The writer thread: takes whatever is queued (up to the batch limit), commits it, answers
    /// the waiters, and parks when there is nothing to do; while busy, it may hold a commit back
    /// for a fuller group (see `commitDelay`). Returns once stopped and drained.
    private func writeUntilStopped() {
        let fullGroup = min(Self.fullGroupEntries, batchLimit)
        var lastStart = ContinuousClock.now
        var lastGroupEntries = 0
        // While commits are failing: when the next write test is due.
        var nextProbe: ContinuousClock.Instant?
        while true {
            if !health.isFailing {
                nextProbe = nil
            } else if nextProbe == nil {
                nextProbe = ContinuousClock.now + probeInterval
            }
            let holdUntil: ContinuousClock.Instant? =
                commitDelay > .zero && lastGroupEntries >= Self.busyGroupEntries ? lastStart + commitDelay : nil
            let step = state.withLock { [nextProbe] state -> NextStep in
                if state.pending.isEmpty {
                    if state.stopped { return .finish }
                    if let nextProbe {
                        if ContinuousClock.now >= nextProbe { return .probe }
                        state.writerParked = true
                        state.wakeAtEntries = 1
                        return .park(until: nextProbe)
                    }
                    state.writerParked = true
                    state.wakeAtEntries = 1
                    return .park(until: nil)
                }
                if let holdUntil, !state.stopped, state.pendingEntries < fullGroup, ContinuousClock.now < holdUntil {
                    state.writerParked = true
                    state.wakeAtEntries = fullGroup
                    return .park(until: holdUntil)
                }
                // Whole requests only; at least one even if it alone is over the limit. Entries
                // past their deadline are dropped, never written.
                var count = 0
                var entries = 0
                var expired: [Pending] = []
                let now = ContinuousClock.now
                for pending in state.pending {
                    if let deadline = pending.deadline, deadline <= now {
                        expired.append(pending)
                        count += 1
                        continue
                    }
                    if entries > 0 && entries + pending.appends.count > batchLimit { break }
                    count += 1
                    entries += pending.appends.count
                }
                var batch = Array(state.pending.prefix(count))
                state.pending.removeFirst(count)
                state.pendingEntries -= entries + expired.reduce(0) { $0 + $1.appends.count }
                if !expired.isEmpty {
                    let expiredIDs = Set(expired.map(\.id))
                    batch.removeAll { expiredIDs.contains($0.id) }
                }
                return .write(batch, entries: entries, expired: expired)
            }
            switch step {
            case .finish:
                return
            case .park(until: nil):
                wakeUp.wait()
            case .park(until: let deadline?):
                let remaining = ContinuousClock.now.duration(to: deadline)
                let nanoseconds = max(0, remaining.components.seconds * 1_000_000_000 + remaining.components.attoseconds / 1_000_000_000)
                _ = wakeUp.wait(timeout: .now() + .nanoseconds(Int(nanoseconds)))
                // Timed out, or woken: either way the writer is no longer parked. A wake-up that
                // raced the timeout leaves the semaphore signalled; the next park then returns at
                // once and the loop looks again, so nothing is lost.
                state.withLock { $0.writerParked = false }
            case .probe:
                probe()
                nextProbe = ContinuousClock.now + probeInterval
            case .write(let batch, let entries, let expired):
                for pending in expired { pending.waiter.finish(.failure(Withdrawn())) }
                guard !batch.isEmpty else { continue }
                lastStart = ContinuousClock.now
                lastGroupEntries = entries
                write(batch)
            }
        }
    }

    /// Runs the store's write test while commits are failing and nothing is queued.
    private func probe() {
        do {
            try store.checkAuditWritable()
            recordRecovery(by: "a write test")
        } catch {
            if health.recordFailure(error) {
                logger.error("audit write test failed: commits are still failing", metadata: ["error": "\(error)"])
            }
        }
    }

    private func recordRecovery(by what: String) {
        guard let ended = health.recordSuccess() else { return }
        let seconds = Int(Date().timeIntervalSince(ended.since).rounded())
        logger.notice("audit commits recovered", metadata: ["by": "\(what)", "failingSeconds": "\(seconds)"])
    }

    private func write(_ batch: [Pending]) {
        let start = ContinuousClock.now
        do {
            let records = try store.appendAuditBlocking(batch.flatMap(\.appends), at: Date())
            metrics.auditCommit(duration: ContinuousClock.now - start, entries: records.count)
            recordRecovery(by: "an audit commit")
            var offset = 0
            for pending in batch {
                let count = pending.appends.count
                pending.waiter.finish(.success(Array(records[offset..<offset + count])))
                offset += count
            }
        } catch {
            if Self.isRequestsOwnFault(error) {
                if batch.count > 1 {
                    // One bad request must not sink the others: retry each on its own.
                    for pending in batch { write([pending]) }
                } else {
                    // The request's own fault says nothing about the store: readiness stays.
                    for pending in batch { pending.waiter.finish(.failure(error)) }
                }
                return
            }
            // A store-wide failure (busy past the timeout, I/O, read-only, full) fails the whole
            // group at once: retrying each request would repeat the failure as many times, each
            // up to the busy timeout, while every later request waits behind the writer.
            for _ in batch { metrics.auditFailure() }
            health.recordFailure(error)
            logger.error("audit commit failed", metadata: ["error": "\(error)", "requests": "\(batch.count)"])
            for pending in batch { pending.waiter.finish(.failure(error)) }
        }
    }

    /// Whether a failed group failed because of one of its requests rather than the store:
    /// a reused nonce is the only such failure the store reports.
    static func isRequestsOwnFault(_ error: any Error) -> Bool {
        (error as? StoreError)?.code == .duplicate
    }
}

/// The outcome of one queued commit, handed to its one waiter whenever it comes (before or after
/// the waiter asks).
final class CommitWaiter: Sendable {
    private enum State {
        case waiting(CheckedContinuation<[AuditRecord], any Error>?)
        case finished(Result<[AuditRecord], any Error>)
    }

    private let state = Mutex<State>(.waiting(nil))

    /// Sets the outcome; later calls are ignored.
    func finish(_ result: Result<[AuditRecord], any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<[AuditRecord], any Error>? in
            guard case .waiting(let waiter) = state else { return nil }
            state = .finished(result)
            return waiter
        }
        waiter?.resume(with: result)
    }

    func value() async throws -> [AuditRecord] {
        try await withCheckedThrowingContinuation { continuation in
            let finished = state.withLock { state -> Result<[AuditRecord], any Error>? in
                switch state {
                case .finished(let result): return result
                case .waiting: state = .waiting(continuation); return nil
                }
            }
            if let finished { continuation.resume(with: finished) }
        }
    }
}
