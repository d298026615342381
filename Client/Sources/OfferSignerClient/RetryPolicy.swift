import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Bounded, jittered exponential backoff for transient failures.
///
/// Only two kinds of failure are retried: transport errors (no HTTP response, e.g. the connection
/// dropped or timed out) and `503 Service Unavailable`. Everything else, including `429`, is
/// returned to the caller at once: a 429 carries its own `Retry-After` for the app to honour, and
/// 4xx/other 5xx will not change by asking again.
///
/// The delay before retry *n* (1-based) is `min(maxDelay, baseDelay × 2^(n-1))`, of which the
/// top `jitter` fraction is randomised ("equal jitter" for `jitter = 0.5`): with the defaults the
/// retries wait 0.25–0.5 s, then 0.5–1 s. A 503's `Retry-After` raises the delay (never above
/// `maxDelay`).
public struct RetryPolicy: Sendable, Hashable {
    /// Total attempts including the first; `1` disables retries.
    public var maxAttempts: Int
    /// The un-jittered delay before the first retry, in seconds.
    public var baseDelay: TimeInterval
    /// The ceiling for any single delay, in seconds.
    public var maxDelay: TimeInterval
    /// The fraction (0...1) of each delay that is randomised. `0` is deterministic; `1` is
    /// "full jitter".
    public var jitter: Double

    public init(maxAttempts: Int = 3, baseDelay: TimeInterval = 0.5, maxDelay: TimeInterval = 8, jitter: Double = 0.5) {
        self.maxAttempts = max(1, maxAttempts)
        self.baseDelay = max(0, baseDelay)
        self.maxDelay = max(0, maxDelay)
        self.jitter = min(1, max(0, jitter))
    }

    /// Three attempts, 0.5 s base, 8 s ceiling, half jitter.
    public static let `default` = RetryPolicy()
    /// A single attempt.
    public static let none = RetryPolicy(maxAttempts: 1)

    /// The delay before retry number `retry` (1 = the first retry), given a uniform random
    /// `random` in `0..<1` and an optional server-provided `Retry-After`.
    public func delay(beforeRetry retry: Int, random: Double, retryAfter: TimeInterval? = nil) -> TimeInterval {
        let exponent = Double(max(0, retry - 1))
        let ceiling = min(maxDelay, baseDelay * pow(2, exponent))
        let unit = min(max(random, 0), 1)
        var delay = ceiling * (1 - jitter) + ceiling * jitter * unit
        if let retryAfter {
            delay = max(delay, min(retryAfter, maxDelay))
        }
        return delay
    }

    /// Whether `error` is worth another attempt (transport errors and 503 only).
    public func isRetryable(_ error: OfferSignerClientError) -> Bool {
        switch error {
        case .server(let problem):
            return problem.status == 503
        case .transport(let underlying):
            if underlying is CancellationError { return false }
            if let urlError = underlying as? URLError {
                switch urlError.code {
                case .cancelled, .badURL, .unsupportedURL, .userAuthenticationRequired,
                     .userCancelledAuthentication, .appTransportSecurityRequiresSecureConnection:
                    return false
                default:
                    return true
                }
            }
            return true
        default:
            return false
        }
    }
}
