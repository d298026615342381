import Foundation
import Synchronization

/// A circuit breaker per Apple host.
///
/// Rules: after `threshold` consecutive failed lookups the circuit opens and every lookup fails at
/// once for `coolDown`; then exactly one trial lookup goes through (others still fail fast) and its
/// outcome closes the circuit (success) or opens it again for another `coolDown` (failure).
final class CircuitBreaker: Sendable {
    enum Permission: Equatable {
        /// Go ahead (closed, or this caller holds the single trial).
        case allowed
        /// Fail fast; the circuit is open (or a trial is in flight).
        case refused
    }

    private enum State {
        case closed(consecutiveFailures: Int)
        case open(until: ContinuousClock.Instant)
        case trialInFlight
    }

    private let threshold: Int
    private let coolDown: Duration
    private let state = Mutex(State.closed(consecutiveFailures: 0))

    init(threshold: Int, coolDown: Duration) {
        self.threshold = threshold
        self.coolDown = coolDown
    }

    func acquire(now: ContinuousClock.Instant = .now) -> Permission {
        state.withLock { state in
            switch state {
            case .closed: return .allowed
            case .open(let until):
                guard now >= until else { return .refused }
                state = .trialInFlight
                return .allowed
            case .trialInFlight: return .refused
            }
        }
    }

    /// Reports the outcome of an allowed lookup.
    func record(success: Bool, now: ContinuousClock.Instant = .now) {
        state.withLock { state in
            if success {
                state = .closed(consecutiveFailures: 0)
                return
            }
            switch state {
            case .closed(let failures):
                state = failures + 1 >= threshold ? .open(until: now + coolDown) : .closed(consecutiveFailures: failures + 1)
            case .open, .trialInFlight:
                state = .open(until: now + coolDown)
            }
        }
    }

    /// A lookup that was let through but abandoned by its caller (cancelled) says nothing about
    /// the host: a trial goes back to open (the next lookup may try at once), a closed breaker
    /// keeps its count.
    func abandon(now: ContinuousClock.Instant = .now) {
        state.withLock { state in
            if case .trialInFlight = state { state = .open(until: now) }
        }
    }

    var isOpen: Bool {
        state.withLock { if case .closed = $0 { false } else { true } }
    }
}
