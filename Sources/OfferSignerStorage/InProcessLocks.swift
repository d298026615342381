import Synchronization

/// One holder at a time per key, inside one process, with a bounded wait.
///
/// Rule: `withLock` runs its body while no other `withLock` call for the same key on the same
/// object is running its own; waiters are served in arrival order, each for at most the time it
/// is given (then it throws `WaitTimedOut` and never runs its body). Other keys never wait. The
/// lock is released however the body ends.
public final class InProcessLocks: Sendable {
    private struct Waiter {
        var id: UInt64
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        /// Held keys, each with the waiters in line for it (an empty list: held, no one waiting).
        var queues: [String: [Waiter]] = [:]
        var nextWaiterID: UInt64 = 0
    }

    private let state = Mutex(State())

    public init() {}

    /// Another holder kept the lock for longer than the wait allowed.
    public struct WaitTimedOut: Error, Sendable {}

    /// Runs `body` while holding the lock for `key`, waiting at most `timeout` for it first
    /// (`WaitTimedOut` after that); releases it however `body` ends.
    public func withLock<T>(_ key: String, timeout: Duration, _ body: () async throws -> T) async throws -> T {
        guard await acquire(key, timeout: timeout) else { throw WaitTimedOut() }
        defer { release(key) }
        return try await body()
    }

    /// The number of keys whose lock is held (for tests: nothing stays behind).
    public var heldCount: Int { state.withLock { $0.queues.count } }

    /// True once the lock is held; false when `timeout` passed first (the waiter is gone from the
    /// line then, so a later release never hands it the lock).
    private func acquire(_ key: String, timeout: Duration) async -> Bool {
        var timer: Task<Void, Never>?
        defer { timer?.cancel() }
        return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            let waiterID = state.withLock { state -> UInt64? in
                guard state.queues[key] != nil else {
                    state.queues[key] = []
                    return nil
                }
                state.nextWaiterID += 1
                state.queues[key, default: []].append(Waiter(id: state.nextWaiterID, continuation: continuation))
                return state.nextWaiterID
            }
            guard let waiterID else {
                continuation.resume(returning: true)
                return
            }
            timer = Task { [self] in
                do {
                    try await Task.sleep(for: timeout)
                } catch {
                    return
                }
                giveUp(key, waiterID: waiterID)
            }
        }
    }

    /// Takes a waiter out of the line, if it is still in it, and tells it it did not get the lock.
    private func giveUp(_ key: String, waiterID: UInt64) {
        let waiter = state.withLock { state -> Waiter? in
            guard var queue = state.queues[key], let index = queue.firstIndex(where: { $0.id == waiterID }) else { return nil }
            let waiter = queue.remove(at: index)
            state.queues[key] = queue
            return waiter
        }
        waiter?.continuation.resume(returning: false)
    }

    private func release(_ key: String) {
        let next = state.withLock { state -> Waiter? in
            guard var queue = state.queues[key], !queue.isEmpty else {
                state.queues[key] = nil
                return nil
            }
            let next = queue.removeFirst()
            state.queues[key] = queue
            return next
        }
        next?.continuation.resume(returning: true)
    }
}
