import Foundation
@testable import OfferSignerServer
import Testing

@Suite("Token buckets")
struct RateLimiterTests {
    @Test("A key spends its burst, is refused with the seconds until a token is back, and refills")
    func bucket() {
        let limiter = RateLimiter(limit: RateLimit(perSecond: 0.5, burst: 2))
        let start = ContinuousClock.now
        #expect(limiter.take("a", now: start) == .allowed)
        #expect(limiter.take("a", now: start) == .allowed)
        #expect(limiter.take("a", now: start) == .limited(retryAfterSeconds: 2))
        #expect(limiter.take("b", now: start) == .allowed, "keys are independent")
        #expect(limiter.take("a", now: start + .seconds(1)) == .limited(retryAfterSeconds: 1))
        #expect(limiter.take("a", now: start + .seconds(2)) == .allowed)
        #expect(RateLimiter(limit: .unlimited).take("a") == .allowed)
    }

    @Test("Limits that would refuse forever, never limit or overflow Retry-After are refused; the slowest allowed rate still answers")
    func unusableLimits() {
        #expect(RateLimit.unlimited.problem == nil)
        #expect(RateLimit(perSecond: 200, burst: 400).problem == nil)
        #expect(RateLimit(perSecond: RateLimit.minimumPerSecond, burst: 1).problem == nil)
        for (limit, mentions) in [
            (RateLimit(perSecond: 1, burst: 0.5), "burst"), (RateLimit(perSecond: 1, burst: .infinity), "burst"),
            (RateLimit(perSecond: 1, burst: .nan), "burst"), (RateLimit(perSecond: .nan, burst: 10), "rate"),
            (RateLimit(perSecond: .infinity, burst: 10), "rate"), (RateLimit(perSecond: -1, burst: 10), "rate"),
            (RateLimit(perSecond: 1e-30, burst: 10), "rate"),
        ] {
            #expect(limit.problem?.contains(mentions) == true, "\(limit)")
        }
        // The slowest allowed rate: about 11.6 days until the next token.
        let slow = RateLimiter(limit: RateLimit(perSecond: RateLimit.minimumPerSecond, burst: 1))
        #expect(slow.take("a") == .allowed)
        #expect(slow.take("a") == .limited(retryAfterSeconds: 1_000_000))
        // Even a rate the server refuses to start with cannot make Retry-After trap.
        let absurd = RateLimiter(limit: RateLimit(perSecond: 1e-30, burst: 1))
        #expect(absurd.take("a") == .allowed)
        #expect(absurd.take("a") == .limited(retryAfterSeconds: 31_536_000))
    }

    @Test("A flood of distinct keys keeps working (the table is bounded and evicts)")
    func flood() async {
        let limiter = RateLimiter(limit: RateLimit(perSecond: 0.001, burst: 1))
        let start = ContinuousClock.now
        for index in 0..<250_000 {
            // Seconds of CPU in a debug build: let other work on the concurrency pool (the
            // servers of other tests) run now and then.
            if index.isMultiple(of: 5_000) { await Task.yield() }
            _ = limiter.take("token-\(index)", now: start)
        }
        #expect(limiter.take("fresh", now: start) == .allowed)
        #expect(limiter.take("fresh", now: start) != .allowed)
    }
}
