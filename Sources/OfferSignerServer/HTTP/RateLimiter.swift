import Foundation
import Synchronization

/// Token buckets keyed by a string (client ID, user, appAccountToken).
///
/// Rule: each key may spend `burst` at once and refills at `perSecond`; a refused request
/// learns how many seconds until one token is back (`Retry-After`).
final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }

    enum Decision: Equatable {
        case allowed
        case limited(retryAfterSeconds: Int)
    }

    private let limit: RateLimit
    private let buckets = Mutex<[String: Bucket]>([:])
    private static let maximumKeys = 100_000
    /// The longest `Retry-After` given, in seconds (a year).
    private static let longestRetryAfter = 31_536_000.0

    init(limit: RateLimit) {
        self.limit = limit
    }

    /// Whether `key` could take a token now, without taking it.
    func wouldAllow(_ key: String, now: ContinuousClock.Instant = .now) -> Decision {
        guard !limit.isUnlimited else { return .allowed }
        return buckets.withLock { buckets in
            guard let bucket = buckets[key] else { return .allowed }
            let elapsed = Double((now - bucket.updated).components.seconds) + Double((now - bucket.updated).components.attoseconds) / 1e18
            let tokens = min(limit.burst, bucket.tokens + max(0, elapsed) * limit.perSecond)
            guard tokens < 1 else { return .allowed }
            let wait = ((1 - tokens) / limit.perSecond).rounded(.up)
            return .limited(retryAfterSeconds: wait.isFinite ? max(1, Int(min(wait, Self.longestRetryAfter))) : Int(Self.longestRetryAfter))
        }
    }

    func take(_ key: String, now: ContinuousClock.Instant = .now) -> Decision {
        guard !limit.isUnlimited else { return .allowed }
        return buckets.withLock { buckets in
            var bucket = buckets[key] ?? Bucket(tokens: limit.burst, updated: now)
            let elapsed = Double((now - bucket.updated).components.seconds) + Double((now - bucket.updated).components.attoseconds) / 1e18
            bucket.tokens = min(limit.burst, bucket.tokens + max(0, elapsed) * limit.perSecond)
            bucket.updated = now
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                buckets[key] = bucket
                if buckets.count > Self.maximumKeys { Self.evictFull(&buckets, limit: limit, now: now) }
                return .allowed
            }
            buckets[key] = bucket
            // Bounded, so no rate can make the conversion to Int trap (`RateLimit.problem` refuses
            // such rates at start-up anyway).
            let wait = ((1 - bucket.tokens) / limit.perSecond).rounded(.up)
            return .limited(retryAfterSeconds: wait.isFinite ? max(1, Int(min(wait, Self.longestRetryAfter))) : Int(Self.longestRetryAfter))
        }
    }

    /// Drops buckets that have refilled completely (they are the same as absent ones). If that
    /// is not enough — a flood of distinct keys — the least recently used half goes too, so the
    /// table stays bounded and eviction stays amortised O(1) per request.
    private static func evictFull(_ buckets: inout [String: Bucket], limit: RateLimit, now: ContinuousClock.Instant) {
        buckets = buckets.filter { _, bucket in
            let elapsed = Double((now - bucket.updated).components.seconds)
            return bucket.tokens + elapsed * limit.perSecond < limit.burst
        }
        if buckets.count > maximumKeys / 2 {
            let keep = buckets.sorted { $0.value.updated > $1.value.updated }.prefix(maximumKeys / 2)
            buckets = Dictionary(uniqueKeysWithValues: keep.map { ($0.key, $0.value) })
        }
    }
}
