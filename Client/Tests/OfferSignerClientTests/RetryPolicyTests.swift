import Foundation
import Testing
@testable import OfferSignerClient
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

@Suite("Retry policy")
struct RetryPolicyTests {
    @Test func exponentialScheduleWithoutJitter() {
        let policy = RetryPolicy(maxAttempts: 6, baseDelay: 0.5, maxDelay: 4, jitter: 0)
        let delays = (1...5).map { policy.delay(beforeRetry: $0, random: 0.7) }
        #expect(delays == [0.5, 1, 2, 4, 4])
    }

    @Test func jitterStaysInsideTheBand() {
        let policy = RetryPolicy(maxAttempts: 4, baseDelay: 1, maxDelay: 30, jitter: 0.5)
        #expect(policy.delay(beforeRetry: 1, random: 0) == 0.5)
        #expect(policy.delay(beforeRetry: 1, random: 0.999_999) < 1.000_001)
        #expect(policy.delay(beforeRetry: 3, random: 0) == 2)
        #expect(policy.delay(beforeRetry: 3, random: 0.5) == 3)
        for _ in 0..<100 {
            let delay = policy.delay(beforeRetry: 2, random: Double.random(in: 0..<1))
            #expect(delay >= 1 && delay < 2)
        }
    }

    @Test func fullJitterAndBounds() {
        let policy = RetryPolicy(maxAttempts: 3, baseDelay: 2, maxDelay: 3, jitter: 1)
        #expect(policy.delay(beforeRetry: 1, random: 0) == 0)
        #expect(policy.delay(beforeRetry: 10, random: 1) == 3)  // capped
        #expect(policy.delay(beforeRetry: 1, random: 5) == 2)  // random clamped
    }

    @Test func retryAfterRaisesButNeverPastCeiling() {
        let policy = RetryPolicy(maxAttempts: 3, baseDelay: 0.5, maxDelay: 8, jitter: 0)
        #expect(policy.delay(beforeRetry: 1, random: 0, retryAfter: 3) == 3)
        #expect(policy.delay(beforeRetry: 1, random: 0, retryAfter: 120) == 8)
        #expect(policy.delay(beforeRetry: 1, random: 0, retryAfter: 0) == 0.5)
    }

    @Test func initClampsValues() {
        let policy = RetryPolicy(maxAttempts: 0, baseDelay: -1, maxDelay: -1, jitter: 7)
        #expect(policy.maxAttempts == 1)
        #expect(policy.baseDelay == 0)
        #expect(policy.maxDelay == 0)
        #expect(policy.jitter == 1)
        #expect(RetryPolicy.none.maxAttempts == 1)
        #expect(RetryPolicy.default.maxAttempts == 3)
    }

    @Test func onlyTransportAnd503AreRetryable() {
        let policy = RetryPolicy.default
        #expect(policy.isRetryable(.transport(underlying: URLError(.timedOut))))
        #expect(policy.isRetryable(.transport(underlying: URLError(.networkConnectionLost))))
        #expect(policy.isRetryable(.transport(underlying: URLError(.cannotConnectToHost))))
        #expect(policy.isRetryable(.server(Problem(status: 503, code: "audit_unavailable"))))

        #expect(!policy.isRetryable(.transport(underlying: URLError(.cancelled))))
        #expect(!policy.isRetryable(.transport(underlying: URLError(.badURL))))
        #expect(!policy.isRetryable(.transport(underlying: CancellationError())))
        #expect(!policy.isRetryable(.server(Problem(status: 500))))
        #expect(!policy.isRetryable(.server(Problem(status: 502))))
        #expect(!policy.isRetryable(.rateLimited(retryAfter: 1)))
        #expect(!policy.isRetryable(.unauthorized))
        #expect(!policy.isRetryable(.notEligible(OfferIneligibility(reasons: []))))
        #expect(!policy.isRetryable(.invalidRequest(Problem(status: 400))))
        #expect(!policy.isRetryable(.forbidden(Problem(status: 403))))
        #expect(!policy.isRetryable(.invalidResponse("x")))
    }
}
