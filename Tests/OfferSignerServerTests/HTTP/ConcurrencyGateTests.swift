import Foundation
import HTTPTypes
import Synchronization
import Testing

@testable import OfferSignerServer

/// The gate of each Apple endpoint (see `ConcurrencyGate`): beyond its limit a request is
/// refused at once with 503 `overloaded` and `Retry-After`, and a freed place serves again. Over
/// HTTP, slow bodies hold no place (`AppleEndpointFloodTests`), so the places are held here by
/// work that does not finish until the test lets it.
@Suite("Concurrency gate")
struct ConcurrencyGateTests {
    @Test("Two places held: the third request is refused 503 overloaded with Retry-After 1; freed places serve again")
    func refusesBeyondTheLimit() async throws {
        let gate = ConcurrencyGate(limit: 2)
        let state = HeldState()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<2 {
                group.addTask {
                    try await gate.run {
                        state.inside.withLock { $0 += 1 }
                        while !state.released.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(5)) }
                    }
                }
            }
            let deadline = ContinuousClock.now + .seconds(10)
            while state.inside.withLock({ $0 }) < 2, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
            #expect(gate.count == 2)
            await #expect {
                try await gate.run { () }
            } throws: { error in
                guard let problem = error as? APIProblem else { return false }
                return problem.code == "overloaded" && problem.status.code == 503 && problem.headers[.retryAfter] == "1"
            }
            state.released.withLock { $0 = true }
            try await group.waitForAll()
        }
        #expect(gate.count == 0)
        #expect(try await gate.run { 42 } == 42)
    }
}

/// What the holders of the gate's places share with the test.
private final class HeldState: Sendable {
    let inside = Mutex(0)
    let released = Mutex(false)
}
