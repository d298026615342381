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

    @Test("A flood of distinct keys keeps working (the table is bounded and evicts)")
    func flood() {
        let limiter = RateLimiter(limit: RateLimit(perSecond: 0.001, burst: 1))
        let start = ContinuousClock.now
        for index in 0..<250_000 {
            _ = limiter.take("token-\(index)", now: start)
        }
        #expect(limiter.take("fresh", now: start) == .allowed)
        #expect(limiter.take("fresh", now: start) != .allowed)
    }
}
