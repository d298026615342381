import Synchronization

/// A bounded number of permits for async work (a counting semaphore with deadlines); no I/O.
///
/// Rules: at most `limit` holders at a time; waiters are served first come, first served; a
/// waiter whose deadline passes (or whose task is cancelled) leaves the line without a permit;
/// every permit taken is given back with `release()`.
///
/// Used where a shared pool must keep room: the App Store Server API client bounds the lookups
/// asking Apple at once (so its own overload is told apart from Apple's slowness), the
/// PostgreSQL store the customer locks held at once (each holds a pooled connection).
public final class AsyncPermits: Sendable {
    private struct Waiter {
        var id: Int
        var continuation: CheckedContinuation<Bool, Never>
        var timer: Task<Void, Never>?
    }

    private struct State {
        var available: Int
        var waiters: [Waiter] = []
        var nextID = 0
    }

    private let state: Mutex<State>

    public init(limit: Int) {
        state = Mutex(State(available: max(1, limit)))
    }

    /// Takes a permit, waiting until `deadline` at most. Returns false when none came in time.
    ///
    /// The check for a free permit and the queueing happen in one critical section, so a
    /// `release()` can never slip between them (it would leave a permit free while this waiter
    /// sleeps); the deadline's timer starts only once the waiter is in the queue.
    public func acquire(until deadline: ContinuousClock.Instant) async -> Bool {
        enum Start {
            case taken
            case refused
            case queued(Int)
        }
        let id = state.withLock { state -> Int in
            state.nextID += 1
            return state.nextID
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let start: Start = state.withLock { state in
                    if state.available > 0 && state.waiters.isEmpty {
                        state.available -= 1
                        return .taken
                    }
                    if ContinuousClock.now >= deadline || Task.isCancelled { return .refused }
                    state.waiters.append(Waiter(id: id, continuation: continuation, timer: nil))
                    return .queued(id)
                }
                switch start {
                case .taken: continuation.resume(returning: true)
                case .refused: continuation.resume(returning: false)
                case .queued(let id):
                    let timer = Task { [weak self] in
                        do { try await Task.sleep(until: deadline, clock: .continuous) } catch { return }
                        self?.leave(id)
                    }
                    let stillQueued = state.withLock { state -> Bool in
                        guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return false }
                        state.waiters[index].timer = timer
                        return true
                    }
                    if !stillQueued { timer.cancel() }
                }
            }
        } onCancel: {
            leave(id)
        }
    }

    /// Gives a permit back (to the first waiter, if any).
    public func release() {
        let next: Waiter? = state.withLock { state in
            if !state.waiters.isEmpty { return state.waiters.removeFirst() }
            state.available += 1
            return nil
        }
        next?.timer?.cancel()
        next?.continuation.resume(returning: true)
    }

    private func leave(_ id: Int) {
        let waiter: Waiter? = state.withLock { state in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index)
        }
        waiter?.timer?.cancel()
        waiter?.continuation.resume(returning: false)
    }

    /// Tasks waiting for a permit.
    public var waiting: Int { state.withLock { $0.waiters.count } }
}
