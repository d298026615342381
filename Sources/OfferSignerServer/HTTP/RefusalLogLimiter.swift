import Synchronization

/// At most `linesPerSecond` "request refused" log lines for 4xx answers in any one-second window;
/// the next line logged says how many were left out before it (`suppressed_before`).
///
/// Rule: anyone can make the service refuse requests (a 401 costs the caller nothing), and each
/// refusal would otherwise write a log line: a flood must not fill the disk or drown the lines
/// that matter. Refusals are still counted in full by `offer_signer_rejections_total`; 5xx lines
/// are never left out.
final class RefusalLogLimiter: Sendable {
    enum Decision: Equatable {
        /// Log it, saying how many lines were left out since the last one logged.
        case log(suppressedBefore: Int)
        case suppress
    }

    let linesPerSecond: Int
    private let state = Mutex<(windowStart: ContinuousClock.Instant, logged: Int, suppressed: Int)>((.now, 0, 0))

    init(linesPerSecond: Int) {
        self.linesPerSecond = max(1, linesPerSecond)
    }

    func admit(at now: ContinuousClock.Instant = .now) -> Decision {
        state.withLock { state in
            if now - state.windowStart >= .seconds(1) {
                state.windowStart = now
                state.logged = 0
            }
            guard state.logged < linesPerSecond else {
                state.suppressed += 1
                return .suppress
            }
            state.logged += 1
            let suppressed = state.suppressed
            state.suppressed = 0
            return .log(suppressedBefore: suppressed)
        }
    }
}
