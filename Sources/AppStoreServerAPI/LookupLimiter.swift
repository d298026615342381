import Synchronization

/// Bounds the lookups asking Apple at once, so this service's own overload is told apart from
/// Apple being slow.
///
/// Rules: at most `limit` holders at a time; waiters are served first come, first served; a
/// waiter whose deadline passes (or whose task is cancelled) leaves the line without a permit.
/// With `limit` no more than the connections per host allow (each lookup makes two calls at
/// once), a call that holds a permit never waits for a connection, so a call that runs out of
/// time is Apple's slowness, and one that never got a permit is ours.
final class LookupLimiter: Sendable {
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

    init(limit: Int) {
        state = Mutex(State(available: max(1, limit)))
    }

    /// Takes a permit, waiting until `deadline` at most. Returns false when none came in time.
    func acquire(until deadline: ContinuousClock.Instant) async -> Bool {
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
    func release() {
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

    /// Lookups waiting for a permit.
    var waiting: Int { state.withLock { $0.waiters.count } }
}
