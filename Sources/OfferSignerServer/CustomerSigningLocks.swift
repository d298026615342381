import Synchronization

/// One-at-a-time access per customer (bundle ID and appAccountToken) for signing under
/// eligibility rules.
///
/// Rule: a signature whose eligibility depends on our ledger (`waitBetweenOffersMonths`,
/// `maxRedemptions` count the signatures already issued) is decided and committed while no other
/// such request for the same customer is between its ledger read and its commit. Without it,
/// concurrent requests all read the ledger before any of them commits, and all pass: twelve
/// parallel requests got twelve signatures for an offer allowed once a year.
///
/// Waiters are served in arrival order. Other customers, and signing without rules, never wait.
/// The lock is held for one ledger read, one decision commit, the signing and one commit.
final class CustomerSigningLocks: Sendable {
    /// Held keys, each with the continuations waiting for it (an empty list: held, no one waiting).
    private let waiters = Mutex<[String: [CheckedContinuation<Void, Never>]]>([:])

    init() {}

    /// The key for a customer of an app.
    static func key(bundleID: String, appAccountToken: String) -> String { "\(bundleID)\n\(appAccountToken)" }

    /// Runs `body` while holding the lock for `key`, waiting for it first if needed; releases it
    /// however `body` ends.
    func withLock<T>(_ key: String, _ body: () async throws -> T) async rethrows -> T {
        await acquire(key)
        defer { release(key) }
        return try await body()
    }

    /// The number of customers whose lock is held (for tests: nothing stays behind).
    var heldCount: Int { waiters.withLock { $0.count } }

    private func acquire(_ key: String) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let granted = waiters.withLock { waiters -> Bool in
                guard waiters[key] != nil else {
                    waiters[key] = []
                    return true
                }
                waiters[key, default: []].append(continuation)
                return false
            }
            if granted { continuation.resume() }
        }
    }

    private func release(_ key: String) {
        let next = waiters.withLock { waiters -> CheckedContinuation<Void, Never>? in
            guard var queue = waiters[key], !queue.isEmpty else {
                waiters[key] = nil
                return nil
            }
            let next = queue.removeFirst()
            waiters[key] = queue
            return next
        }
        next?.resume()
    }
}
