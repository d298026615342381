import Logging
import OfferSignerStorage
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

/// A customer's lock and the reads a decision under it makes first, in one round trip: the
/// server-side function `offer_signer_customer_decision` (migration 12) sets the lock timeout for
/// this statement alone, waits for the same session-level advisory lock
/// ``TimedAdvisorySessionLock`` takes (so a wait that runs out fails with 55P03, as before), puts
/// the previous lock timeout back, then returns the customer's ledger (the rows
/// `ledgerIssuances` reads) and, when a transaction ID is given, the history version of each
/// environment named (the row `HistoryVersionLookup` reads; none for an environment the store has
/// no history in).
///
/// Rules: the reads come after the lock is granted, each with a snapshot of its own (a VOLATILE
/// plpgsql function takes one per query under READ COMMITTED), so they see what the previous
/// holder committed before it released the lock. One SQL statement (CTEs after the lock call)
/// could not: its snapshot would be taken before the wait, and a waiter would decide on the
/// ledger as it was before the holder's signature. The ledger query is planned on each call
/// with its values (`EXECUTE … USING`), as the unnamed statement it replaces was: a cached
/// generic plan made on a small table stays a sequential scan (Docs/Performance.md). Each
/// environment's version is read by the very query `HistoryVersionLookup` prepares (its cached
/// plan leads with the transaction's primary key, see `PostgresStoreTests`). The per-query
/// snapshots hold only under READ COMMITTED (under REPEATABLE READ or SERIALIZABLE every query
/// would see the snapshot taken before the wait): every connection asks for it at start-up
/// (`default_transaction_isolation`), and the function refuses to run under any other level
/// (SQLSTATE 0A000) rather than decide on a ledger that misses the previous holder's signature,
/// say behind a pooler that dropped the start-up parameter.
struct CustomerDecisionLock: PostgresPreparedStatement {
    static let name = "offer_signer_customer_decision_v1"
    static let sql = """
        SELECT row_kind, ledger_offer, ledger_issued_at, history_environment, history_original_transaction, history_complete, \
        history_updated_at FROM offer_signer_customer_decision($1, $2, $3, $4, $5, $6, $7, $8, $9)
        """
    /// Kind ("ledger" or "history"), then a ledger row's offer and issue time, or a history's
    /// environment, original transaction ID, completeness and update time.
    typealias Row = (String, String?, Int64?, String?, String?, Int?, Int64?)

    /// The function, created by migration 12 (never edited: a change is a new function and a
    /// new migration).
    static let createFunction = """
        CREATE FUNCTION offer_signer_customer_decision(
            lock_class integer, lock_key integer, lock_wait text, bundle text, customer text, page_view_client text,
            intro_eligibility_format text, history_environments text[], history_transaction text
        ) RETURNS TABLE (
            row_kind text, ledger_offer text, ledger_issued_at bigint, history_environment text, history_original_transaction text,
            history_complete integer, history_updated_at bigint
        ) LANGUAGE plpgsql VOLATILE AS $$
        DECLARE
            previous_lock_timeout text := current_setting('lock_timeout');
            history_environment_name text;
        BEGIN
            IF current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'offer_signer_customer_decision needs READ COMMITTED, this session runs %',
                    current_setting('transaction_isolation') USING ERRCODE = '0A000';
            END IF;
            PERFORM set_config('lock_timeout', lock_wait, true);
            PERFORM pg_advisory_lock(lock_class, lock_key);
            PERFORM set_config('lock_timeout', previous_lock_timeout, true);
            RETURN QUERY EXECUTE
                'SELECT ''ledger''::text, offer_id, issued_at, NULL::text, NULL::text, NULL::integer, NULL::bigint FROM ('
                || 'SELECT DISTINCT offer_id, issued_at FROM issued_signatures WHERE app_account_token = $1 AND bundle_id = $2 '
                || 'AND client <> $3 AND format <> $4) AS ledger ORDER BY issued_at'
                USING customer, bundle, page_view_client, intro_eligibility_format;
            IF history_transaction IS NOT NULL THEN
                FOREACH history_environment_name IN ARRAY history_environments LOOP
                    RETURN QUERY
                        SELECT 'history'::text, NULL::text, NULL::bigint, history_environment_name, s.original_transaction_id, s.complete,
                            s.updated_at
                        FROM apple_subscriptions s
                        WHERE s.bundle_id = bundle AND s.environment = history_environment_name AND s.original_transaction_id = COALESCE(
                            (SELECT t.original_transaction_id FROM apple_transactions t
                             WHERE t.bundle_id = bundle AND t.environment = history_environment_name AND t.transaction_id = history_transaction),
                            history_transaction);
                END LOOP;
            END IF;
        END
        $$
        """

    /// The parameters' types, declared so that the statement binds to this function's exact
    /// signature, never to an overload a database role that may create functions added.
    static let bindingDataTypes: [PostgresDataType] = [.int4, .int4, .text, .text, .text, .text, .text, .textArray, .text]

    /// What to read with the lock: the ledger of the lock's customer, and `history`'s versions.
    struct Reads: Sendable {
        let bundleID: String
        let customer: String
        let history: CustomerLockHistoryRead?
    }

    let key: (Int32, Int32)
    /// In milliseconds.
    let timeoutMilliseconds: Int64
    let bundleID: String
    let customer: String
    let history: CustomerLockHistoryRead?

    func makeBindings() -> PostgresBindings {
        var binds = PostgresBindings(capacity: 9)
        binds.append(key.0)
        binds.append(key.1)
        binds.append(String(timeoutMilliseconds))
        binds.append(bundleID)
        binds.append(customer)
        binds.append(LedgerIssuance.pageViewClient)
        binds.append(LedgerIssuance.introEligibilityFormat)
        binds.append(history?.environments ?? [])
        binds.append(history?.transactionID)
        return binds
    }

    func decodeRow(_ row: PostgresRow) throws -> Row { try row.decode(Row.self) }

    /// What the rows say, for the lock's ``LockConnectionLoan``.
    static func prefetched(_ rows: [Row], reads: Reads) throws -> CustomerDecisionReads {
        let bundleID = reads.bundleID
        let malformed = StoreError(.unavailable, "taking the customer lock failed: its reads answered a row of an unknown shape (was the database edited by hand?)")
        var ledger: [LedgerIssuance] = []
        var versions: [String: StoredAppleHistoryVersion] = [:]
        for (kind, offerID, issuedAt, environment, original, complete, updatedAt) in rows {
            switch kind {
            case "ledger":
                guard let offerID, let issuedAt else { throw malformed }
                ledger.append(LedgerIssuance(offerID: offerID, issuedAt: PostgresStore.date(issuedAt)))
            case "history":
                guard let environment, let original, let complete, let updatedAt else { throw malformed }
                versions[environment] = StoredAppleHistoryVersion(
                    subscription: AppleSubscriptionKey(bundleID: bundleID, environment: environment, originalTransactionID: original),
                    isComplete: complete != 0, updatedAt: PostgresStore.date(updatedAt))
            default:
                throw malformed
            }
        }
        return CustomerDecisionReads(bundleID: bundleID, customer: reads.customer, ledger: ledger, history: reads.history, versions: versions)
    }
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
