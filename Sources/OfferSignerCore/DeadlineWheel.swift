import Synchronization

/// Calls a function when its deadline passes, for many deadlines at once, from one task that runs
/// only while some deadline is pending.
///
/// Rules: an expiry runs at most once, no earlier than its deadline and at most one `tick` later
/// (plus the scheduling delay of a busy machine, after whatever that machine queued before the
/// deadline); a deadline cancelled before it falls due never runs (one cancelled as it falls due
/// may still run, so expiries must be harmless once the work they bound has ended: every
/// caller's is); expiries run outside the wheel's lock, so one may schedule or cancel others.
package final class DeadlineWheel: Sendable {
    package static let shared = DeadlineWheel(tick: .milliseconds(5))

    /// A scheduled deadline, for `cancel`.
    package struct Ticket: Sendable {
        fileprivate let id: UInt64
    }

    private struct Entry {
        var deadline: ContinuousClock.Instant
        var expire: @Sendable () -> Void
    }

    private struct State {
        var entries: [UInt64: Entry] = [:]
        var nextID: UInt64 = 0
        var ticking = false
    }

    private let state = Mutex(State())
    private let tick: Duration

    package init(tick: Duration) {
        self.tick = tick
    }

    package func schedule(after delay: Duration, _ expire: @escaping @Sendable () -> Void) -> Ticket {
        let deadline = ContinuousClock.now.advanced(by: delay)
        let (id, start) = state.withLock { state -> (UInt64, Bool) in
            state.nextID += 1
            state.entries[state.nextID] = Entry(deadline: deadline, expire: expire)
            defer { state.ticking = true }
            return (state.nextID, !state.ticking)
        }
        if start {
            Task.detached { [self] in await self.run() }
        }
        return Ticket(id: id)
    }

    package func cancel(_ ticket: Ticket) {
        _ = state.withLock { $0.entries.removeValue(forKey: ticket.id) }
    }

    /// Expires what is due every `tick`; stops when nothing is pending (under the lock, so a
    /// deadline scheduled at that moment starts a new run).
    private func run() async {
        while true {
            // Expires what was due when the sleep ended, not when this task got a thread again:
            // on a starved machine the answers that came before a deadline were queued before
            // this tick, and must win (as they did with one timer per call, which a starved
            // machine also ran late but in order).
            let wake = ContinuousClock.now.advanced(by: tick)
            try? await Task.sleep(until: wake, clock: .continuous)
            let now = min(wake, ContinuousClock.now)
            let due = state.withLock { state -> [Entry]? in
                if state.entries.isEmpty {
                    state.ticking = false
                    return nil
                }
                var due: [Entry] = []
                for (id, entry) in state.entries where entry.deadline <= now {
                    due.append(entry)
                    state.entries.removeValue(forKey: id)
                }
                return due
            }
            guard let due else { return }
            for entry in due { entry.expire() }
        }
    }
}
