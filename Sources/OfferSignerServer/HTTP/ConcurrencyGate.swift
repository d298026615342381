import HTTPTypes
import Synchronization

/// At most `limit` requests inside at once; the one beyond is refused at once, never queued.
///
/// Rule: the unauthenticated Apple endpoints (`/v1/apple/notifications`, `/v1/apple/retention`)
/// verify certificate chains and signatures for anyone who calls, so a flood of them could take
/// every core. Beyond the limit the answer is 503 `overloaded` with `Retry-After: 1`, before the
/// payload is verified (the body is read before the gate, within its own deadline, so a slow body
/// holds no place): Apple retries a notification that was not answered 200 (App Store Server
/// Notifications V2, "Responding to App Store Server Notifications"), and shows its default
/// message when a Retention Messaging request is not answered (Apple's Retention Messaging API
/// documentation); neither loses anything that a later request cannot bring.
final class ConcurrencyGate: Sendable {
    let limit: Int
    private let inside = Mutex(0)

    init(limit: Int) {
        self.limit = max(1, limit)
    }

    func run<T>(_ body: () async throws -> T) async throws -> T {
        let admitted = inside.withLock { count in
            guard count < limit else { return false }
            count += 1
            return true
        }
        guard admitted else {
            throw APIProblem(
                .serviceUnavailable, code: "overloaded", detail: "too many requests to this endpoint at once; retry later",
                headers: [.retryAfter: "1"])
        }
        defer { inside.withLock { $0 -= 1 } }
        return try await body()
    }

    /// Requests inside now.
    var count: Int { inside.withLock { $0 } }
}
