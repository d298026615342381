import Logging
import PostgresNIO

// The statements every request under eligibility rules runs (its customer lock, its history's
// version), as prepared statements: each connection parses and plans them once, where an unnamed
// statement is parsed and planned on every request. Last, how every prepared statement of the
// store is run (`collect`).

/// Sets the lock timeout for this statement alone (`set_config(…, true)` is undone when the
/// statement's implicit transaction ends), then waits for the session-level advisory lock of one
/// key (a customer's, or the checkpoint writer's): one round trip, no transaction left open. The
/// timeout is set in a subquery behind `OFFSET 0`, which PostgreSQL neither flattens nor
/// reorders, so it is in force before the wait begins.
struct TimedAdvisorySessionLock: PostgresPreparedStatement {
    static let name = "offer_signer_timed_advisory_lock_v1"
    static let sql = """
        SELECT pg_advisory_lock($1, $2) FROM (SELECT set_config('lock_timeout', $3, true) OFFSET 0) AS lock_timeout_set
        """
    typealias Row = ()

    let key: (Int32, Int32)
    /// In milliseconds.
    let timeoutMilliseconds: Int64

    func makeBindings() -> PostgresBindings {
        var binds = PostgresBindings(capacity: 3)
        binds.append(key.0)
        binds.append(key.1)
        binds.append(String(timeoutMilliseconds))
        return binds
    }

    func decodeRow(_ row: PostgresRow) throws {}
}

/// Releases every session-level advisory lock of the session (a pooled connection holds at most
/// the one it was leased for). All of them, not the key's alone: a lock granted just as its
/// `lock_timeout` fired is kept by the server although the statement failed with 55P03, and an
/// unlock of one hold would leave such a second hold behind.
struct AdvisorySessionUnlockAll: PostgresPreparedStatement {
    static let name = "offer_signer_advisory_unlock_all_v1"
    static let sql = "SELECT pg_advisory_unlock_all()"
    typealias Row = ()

    func makeBindings() -> PostgresBindings { PostgresBindings() }

    func decodeRow(_ row: PostgresRow) throws {}
}

/// The subscription a transaction ID belongs to (or the ID itself, when it is an original
/// transaction ID the store has no transaction for): its original transaction ID, whether its
/// history is complete, and when it was last written.
struct HistoryVersionLookup: PostgresPreparedStatement {
    static let name = "offer_signer_history_version_v1"
    static let sql = """
        SELECT s.original_transaction_id, s.complete, s.updated_at FROM apple_subscriptions s \
        WHERE s.bundle_id = $1 AND s.environment = $2 AND s.original_transaction_id = COALESCE(\
        (SELECT t.original_transaction_id FROM apple_transactions t \
        WHERE t.bundle_id = $1 AND t.environment = $2 AND t.transaction_id = $3), $3)
        """
    typealias Row = (String, Int, Int64)

    let bundleID: String
    let environment: String
    let transactionID: String

    func makeBindings() -> PostgresBindings {
        var binds = PostgresBindings(capacity: 3)
        binds.append(bundleID)
        binds.append(environment)
        binds.append(transactionID)
        return binds
    }

    func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }
}

extension PostgresStore {
    /// Runs a prepared statement and reads its rows to the end (so an error it raises is thrown
    /// here, not left in unread rows).
    ///
    /// Rule: a connection never keeps a failed preparation. PostgresNIO remembers a statement
    /// whose first preparation failed (a lock or statement timeout while another session holds a
    /// table, a cancelled backend) and answers every later execution on that connection with the
    /// same error for as long as the connection lives; busy, it would never idle out of the pool.
    /// So when `execute` itself throws (the statement could not be sent or prepared, or, for a
    /// statement without rows, its execution failed: there they cannot be told apart), the
    /// connection is closed and the pool opens a new one. An error or a cancellation that comes
    /// while the rows are read (a lock timeout, a reused nonce, a cancelled request) keeps it: the
    /// statement is prepared, and the connection gets its ROLLBACK.
    static func collect<Statement: PostgresPreparedStatement>(
        _ statement: Statement, on connection: PostgresConnection, logger: Logger
    ) async throws -> [Statement.Row] {
        let sequence: AsyncThrowingMapSequence<PostgresRowSequence, Statement.Row>
        do {
            sequence = try await connection.execute(statement, logger: logger)
        } catch {
            try? await connection.close()
            throw error
        }
        var rows: [Statement.Row] = []
        for try await row in sequence { rows.append(row) }
        return rows
    }
}
