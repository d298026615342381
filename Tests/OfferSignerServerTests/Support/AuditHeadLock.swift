import Synchronization
import TestPostgres

/// A PostgreSQL test database seen from outside the service, with the audit chain's head row held
/// by another session: every group commit moves the head, so none can end until ``release()``.
/// Also what a test reads of the database meanwhile: the customer locks held and the commits
/// waiting.
final class AuditHeadLock: Sendable {
    private let held: Mutex<TestPostgres.HeldTransaction?>

    private init(held: TestPostgres.HeldTransaction) {
        self.held = Mutex(held)
    }

    /// Runs `body` with the head row locked; released by `body` (``release()``) or, at the
    /// latest, when `body` ends, however it ends.
    static func holding<T>(database: String, _ body: (AuditHeadLock) async throws -> T) async throws -> T {
        let held = try await TestPostgres.holdLock("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE", database: database)
        let lock = AuditHeadLock(held: held)
        do {
            let value = try await body(lock)
            try await lock.release()
            return value
        } catch {
            try? await lock.release()
            throw error
        }
    }

    /// Lets the group commits go on (once; later calls do nothing).
    func release() async throws {
        guard let held = held.withLock({ held in defer { held = nil }; return held }) else { return }
        try await held.release()
    }

    /// The service's customer locks (advisory locks of their class) granted in `database` now.
    static func customerLocks(in database: String) async throws -> Int64? {
        try await TestPostgres.scalar(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = \(0x6F73_0001) AND granted "
                + "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            database: database)
    }

    /// Group commits waiting for the head row (both ways of appending name `audit_head`: the
    /// one-statement append and the locking transaction).
    static func commitsWaiting(in database: String) async throws -> Int64 {
        try await TestPostgres.scalar(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                + "AND wait_event_type = 'Lock' AND query LIKE '%audit_head%'",
            database: database) ?? 0
    }

    /// Whether a request has been answered (or has failed).
    final class Answered: Sendable {
        private let answered = Mutex(false)
        func set() { answered.withLock { $0 = true } }
        var isSet: Bool { answered.withLock { $0 } }
    }

    /// Whether `condition` held within `limit`, looked at every 50 ms.
    static func poll(within limit: Duration, _ condition: () async throws -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            if try await condition() { return true }
            try await Task.sleep(for: .milliseconds(50))
        }
        return false
    }
}
