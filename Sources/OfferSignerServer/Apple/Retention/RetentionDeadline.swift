import Foundation
import Synchronization

/// Runs `work` in a task of its own and waits for it until `deadline`: nil when the deadline
/// comes first. The work is not cancelled (a lookup of Apple's history then still fills the
/// caches and the store, and is not held against Apple's host); only the wait ends.
func withDeadline<T: Sendable>(_ deadline: ContinuousClock.Instant, _ work: @escaping @Sendable () async -> T) async -> T? {
    let first = DeadlineRace<T>()
    return await withCheckedContinuation { (continuation: CheckedContinuation<T?, Never>) in
        first.install(continuation)
        Task { first.resume(await work()) }
        Task {
            try? await Task.sleep(until: deadline, clock: .continuous)
            first.resume(nil)
        }
    }
}

/// Resumes a continuation once, with whichever value comes first.
private final class DeadlineRace<T: Sendable>: Sendable {
    private let continuation = Mutex<CheckedContinuation<T?, Never>?>(nil)

    func install(_ continuation: CheckedContinuation<T?, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    func resume(_ value: T?) {
        continuation.withLock { $0.take() }?.resume(returning: value)
    }
}

/// Recently answered `requestIdentifier`s, so a replay is refused at once on this instance (the
/// ledger's unique nonces refuse it on every instance once a signature was issued).
///
/// Rules: an identifier is remembered for `keepFor` (longer than a request stays fresh); at most
/// `capacity` are remembered (the oldest are forgotten first).
final class RecentRequestIdentifiers: Sendable {
    private struct State {
        var seen: [String: Date] = [:]
        var order: [(String, Date)] = []
        var head = 0
    }

    private let state = Mutex(State())
    private let capacity: Int

    init(capacity: Int = 200_000) {
        self.capacity = capacity
    }

    /// Remembers `identifier`; false when it was remembered already.
    func insert(_ identifier: String, now: Date, keepFor: Duration) -> Bool {
        state.withLock { state in
            let horizon = now.addingTimeInterval(-Double(keepFor.components.seconds))
            while state.head < state.order.count, state.order[state.head].1 < horizon || state.order.count - state.head >= capacity {
                state.seen.removeValue(forKey: state.order[state.head].0)
                state.head += 1
            }
            if state.head > 4096 && state.head * 2 > state.order.count {
                state.order.removeFirst(state.head)
                state.head = 0
            }
            guard state.seen[identifier] == nil else { return false }
            state.seen[identifier] = now
            state.order.append((identifier, now))
            return true
        }
    }
}

/// Who answers a Retention Messaging request: its work (with the offer it committed) or the
/// deadline (with the fallback), whichever claims it first; the other then knows it lost.
///
/// Rule: the work registers its queued audit commit before waiting for it, so the deadline
/// withdraws it if the writer has not taken it; a work that lost after its commit landed
/// withdraws the signature itself.
final class RetentionAnswerClaim: Sendable {
    private enum State {
        case open(AuditCommitter.QueuedCommit?)
        case answeredByWork
        case expired
    }

    private let state = Mutex<State>(.open(nil))

    /// Whether neither side has claimed the answer yet.
    var isOpen: Bool {
        state.withLock { if case .open = $0 { return true } else { return false } }
    }

    /// Records the work's queued commit; false when the deadline already claimed the answer.
    func register(_ queued: AuditCommitter.QueuedCommit) -> Bool {
        state.withLock { state in
            guard case .open = state else { return false }
            state = .open(queued)
            return true
        }
    }

    /// The work claims the answer (its commit landed in time); false when the deadline did first.
    func claimAnswer() -> Bool {
        state.withLock { state in
            guard case .open = state else { return false }
            state = .answeredByWork
            return true
        }
    }

    /// The deadline claims the answer: whether it did, and the work's queued commit to withdraw.
    func expire() -> (expired: Bool, queued: AuditCommitter.QueuedCommit?) {
        state.withLock { state in
            guard case .open(let queued) = state else { return (false, nil) }
            state = .expired
            return (true, queued)
        }
    }
}
