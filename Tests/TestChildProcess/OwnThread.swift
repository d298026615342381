import Foundation

/// Runs blocking work (sockets, file locks, child processes, `appendAuditBlocking`) on a thread of
/// its own and returns its result, so the wait never holds one of the few threads of Swift's
/// concurrency pool that a server under test needs for its requests.
public func onOwnThread<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
        Thread { continuation.resume(with: Result { try work() }) }.start()
    }
}
