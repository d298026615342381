import Logging
import PostgresNIO

/// The statements every request under eligibility rules runs (its customer lock, its history's
/// version), as prepared statements: each connection parses and plans them once,
/// where an unnamed statement is parsed and planned on every request.

/// Sets the transaction's lock timeout (`SET LOCAL lock_timeout`, which takes no parameter).
struct SetLocalLockTimeout: PostgresPreparedStatement {
    static let name = "offer_signer_set_local_lock_timeout_v1"
    static let sql = "SELECT set_config('lock_timeout', $1, true)"
    typealias Row = ()

    /// In milliseconds.
    let milliseconds: Int64

    func makeBindings() -> PostgresBindings {
        var binds = PostgresBindings(capacity: 1)
        binds.append(String(milliseconds))
        return binds
    }

    func decodeRow(_ row: PostgresRow) throws {}
}

/// Waits for the transaction-scoped advisory lock of one key (a customer's).
struct AdvisoryTransactionLock: PostgresPreparedStatement {
    static let name = "offer_signer_advisory_xact_lock_v1"
    static let sql = "SELECT pg_advisory_xact_lock($1, $2)"
    typealias Row = ()

    let key: (Int32, Int32)

    func makeBindings() -> PostgresBindings {
        var binds = PostgresBindings(capacity: 2)
        binds.append(key.0)
        binds.append(key.1)
        return binds
    }

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
    /// here).
    ///
    /// Rule: the connection is closed when the statement could not be sent or prepared (see
    /// `closeAfterFailedPreparedStatement`), not when its execution answers an error or is
    /// cancelled while its rows are read (a lock timeout, a cancelled request): a statement that
    /// was prepared stays prepared, and the connection gets its ROLLBACK as before.
    static func collect<Statement: PostgresPreparedStatement>(
        _ statement: Statement, on connection: PostgresConnection, logger: Logger
    ) async throws -> [Statement.Row] {
        let sequence: AsyncThrowingMapSequence<PostgresRowSequence, Statement.Row>
        do {
            sequence = try await connection.execute(statement, logger: logger)
        } catch {
            await closeAfterFailedPreparedStatement(connection)
            throw error
        }
        var rows: [Statement.Row] = []
        for try await row in sequence { rows.append(row) }
        return rows
    }
}
