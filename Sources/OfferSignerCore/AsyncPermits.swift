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
    public func acquire(until deadline: ContinuousClock.Instant) async -> Bool {
        let id: Int? = state.withLock { state in
            if state.available > 0 && state.waiters.isEmpty {
                state.available -= 1
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return true }
        let timer = Task { [weak self] in
            try? await Task.sleep(until: deadline, clock: .continuous)
            self?.leave(id)
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let resumeNow: Bool = state.withLock { state in
                    // The deadline may have passed (or the task been cancelled) before we queued.
                    if ContinuousClock.now >= deadline || Task.isCancelled { return true }
                    state.waiters.append(Waiter(id: id, continuation: continuation))
                    return false
                }
                if resumeNow { continuation.resume(returning: false) }
            }
        } onCancel: {
            leave(id)
        }
    }

    /// Gives a permit back (to the first waiter, if any).
    public func release() {
        let next: CheckedContinuation<Bool, Never>? = state.withLock { state in
            if !state.waiters.isEmpty { return state.waiters.removeFirst().continuation }
            state.available += 1
            return nil
        }
        next?.resume(returning: true)
    }

    private func leave(_ id: Int) {
        let waiter: CheckedContinuation<Bool, Never>? = state.withLock { state in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index).continuation
        }
        waiter?.resume(returning: false)
    }

    /// Tasks waiting for a permit.
    public var waiting: Int { state.withLock { $0.waiters.count } }
}
