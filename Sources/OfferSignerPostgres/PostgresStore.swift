import Dispatch
import Foundation
import Logging
import NIOCore
import NIOSSL
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO
import Synchronization

/// The store on PostgreSQL: several offer-signer instances share one database.
///
/// Rules (besides those of ``OfferSignerStore``):
/// - The store owns its connection pool (`PostgresClient`) and runs it in a task of its own from
///   ``open(configuration:logger:)`` until ``close()``; nothing else has to run it.
/// - Every operation is bounded by `configuration.operationTimeout` (a schema migration, and the
///   wait for another instance's, by ``migrationTimeout``): an unreachable or hung database fails
///   the call with `StoreError.unavailable`, it never hangs it, and a connection whose operation
///   outlived its bound is closed.
/// - All instances append to one audit chain in one order: a group is hashed onto the head this
///   instance last wrote and committed in one statement that moves the head (`audit_head`) only
///   if it is still that one; when another writer moved it, nothing is written and the group is
///   hashed again in a transaction that locks the head row (`SELECT … FOR UPDATE`) once.
///   `synchronous_commit` stays on: a commit is durable when it returns.
/// - Errors never carry the password, query parameters or row contents (PostgresNIO's own
///   descriptions are replaced by the server's message and SQLSTATE, or the connection problem).
/// - After an outage the store serves again within about two seconds of the database accepting
///   connections, however long the outage lasted: after a minute of failed attempts the pool
///   opens its circuit breaker and retries once a minute, so while operations fail for want of a
///   connection the store probes the database every second on a connection of its own and, once
///   the probe succeeds and the pool still refuses with its breaker open, replaces the pool
///   (see `renewPoolIfStuck`). A pool that is merely slow (a timeout, a cancelled request) is
///   never replaced: that would cut the connections of requests in flight.
public final class PostgresStore: OfferSignerStore {
    public let configuration: PostgresStoreConfiguration
    /// The pool operations run on now (replaced after a long outage, see `renewPoolIfStuck`).
    var client: PostgresClient { pool.withLock { $0.client } }
    private let pool: Mutex<RunningPool>
    private let clientConfiguration: PostgresClient.Configuration
    /// Set when an operation failed for want of a connection, cleared by one that got through.
    private let connectionTrouble = Atomic<Bool>(false)
    /// The audit chain's head (sequence, hash) as this process last wrote it: the next group is
    /// appended on it in one statement (see `appendAudit`).
    let knownAuditHead = Mutex<(Int64, String)?>(nil)
    /// Until when (uptime nanoseconds) appends skip the one-statement attempt (see `appendAudit`).
    let optimisticAppendsPausedUntil = Atomic<UInt64>(0)
    /// Pools replaced after outages (for tests and logs).
    private let renewals = Atomic<Int>(0)
    /// For the one connection of its own that ``open(configuration:logger:)`` checks and
    /// migrates the database through (its errors, a wrong password say, come back at once; the
    /// pool would keep retrying until the timeout).
    let directConfiguration: PostgresConnection.Configuration
    let logger: Logger
    private let renewalTask = Mutex<Task<Void, Never>?>(nil)
    /// Customer locks held at once (see ``withExclusiveLock(_:timeout:_:)``).
    let customerLockPermits: AsyncPermits
    private let closed = Atomic<Bool>(false)

    /// Connects, applies schema migrations (once across instances that start together), and
    /// returns the open store. Throws `StoreError.unavailable` when the database cannot be
    /// reached or its schema is newer than this build knows.
    public static func open(configuration: PostgresStoreConfiguration, logger: Logger = Logger(label: "offer-signer.postgres")) async throws -> PostgresStore {
        if let warning = configuration.weakTLSWarning {
            logger.warning("WARNING: the PostgreSQL connection is not protected: \(warning)", metadata: ["store": "\(configuration.redactedDescription)"])
        }
        let store = try PostgresStore(configuration: configuration, logger: logger)
        do {
            try await store.migrate()
        } catch {
            await store.close()
            throw error
        }
        return store
    }

    private init(configuration: PostgresStoreConfiguration, logger: Logger) throws(StoreError) {
        self.configuration = configuration
        self.logger = logger
        self.customerLockPermits = AsyncPermits(limit: Self.customerLockHolders(poolSize: configuration.poolSize))
        let tls: PostgresClient.Configuration.TLS
        let directTLS: PostgresConnection.Configuration.TLS
        do {
            switch configuration.tlsMode {
            case .disable:
                tls = .disable
                directTLS = .disable
            case .prefer, .require:
                var settings = TLSConfiguration.makeClientConfiguration()
                settings.certificateVerification = .none
                let context = try NIOSSLContext(configuration: settings)
                tls = configuration.tlsMode == .prefer ? .prefer(settings) : .require(settings)
                directTLS = configuration.tlsMode == .prefer ? .prefer(context) : .require(context)
            case .verifyFull:
                var settings = TLSConfiguration.makeClientConfiguration()
                settings.certificateVerification = .fullVerification
                if let root = configuration.rootCertificatePath {
                    guard FileManager.default.isReadableFile(atPath: root) else {
                        throw StoreError(.unavailable, "cannot open store \(configuration.redactedDescription): sslrootcert '\(root)' cannot be read")
                    }
                    settings.trustRoots = .file(root)
                }
                tls = .require(settings)
                directTLS = .require(try NIOSSLContext(configuration: settings))
            }
        } catch {
            throw Self.storeError(error, "cannot open store \(configuration.redactedDescription)")
        }
        let startupParameters = [
            ("application_name", "offer-signer"),
            // Commits are durable when they return, whatever the server's default says.
            ("synchronous_commit", "on"),
            // The audit append's conditional head update and the head lock rely on READ COMMITTED
            // (a re-check after waiting, no serialization failures), whatever the role's default.
            ("default_transaction_isolation", "read committed"),
            // A customer lock is a session lock held on an idle connection while its request
            // decides (and an audit fallback a transaction): the server must not end either for
            // being idle (the lock would vanish unseen). `idle_session_timeout` needs
            // PostgreSQL 14 or later.
            ("idle_in_transaction_session_timeout", "0"),
            ("idle_session_timeout", "0"),
        ]
        var direct = PostgresConnection.Configuration(
            host: configuration.host, port: configuration.port, username: configuration.username, password: configuration.password,
            database: configuration.database, tls: directTLS)
        let timeout = configuration.connectTimeout.components
        direct.options.connectTimeout = .nanoseconds(timeout.seconds * 1_000_000_000 + timeout.attoseconds / 1_000_000_000)
        direct.options.additionalStartupParameters = startupParameters
        self.directConfiguration = direct
        var clientConfiguration = PostgresClient.Configuration(
            host: configuration.host, port: configuration.port, username: configuration.username, password: configuration.password,
            database: configuration.database, tls: tls)
        clientConfiguration.options.maximumConnections = configuration.poolSize
        clientConfiguration.options.minimumConnections = configuration.keepsPoolOpen ? configuration.poolSize : 0
        clientConfiguration.options.connectTimeout = configuration.connectTimeout
        clientConfiguration.options.additionalStartupParameters = startupParameters
        self.clientConfiguration = clientConfiguration
        self.pool = Mutex(RunningPool.start(clientConfiguration, logger: logger))
        renewalTask.withLock { task in
            task = Task { [weak self] in
                while true {
                    do { try await Task.sleep(for: .seconds(1)) } catch { return }
                    guard let store = self, !store.closed.load(ordering: .acquiring) else { return }
                    await store.renewPoolIfStuck()
                }
            }
        }
    }

    /// A pool and the task that runs it.
    private struct RunningPool: Sendable {
        var client: PostgresClient
        var run: Task<Void, Never>

        static func start(_ configuration: PostgresClient.Configuration, logger: Logger) -> RunningPool {
            let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
            return RunningPool(client: client, run: Task { await client.run() })
        }
    }

    /// How many times the pool was replaced after an outage.
    public var poolRenewals: Int { renewals.load(ordering: .relaxed) }

    /// Run once a second: while operations fail for want of a connection, when the database
    /// accepts a connection of the store's own but the pool still refuses with its circuit
    /// breaker open, the pool is replaced by a new one (which connects at once) and the old one is
    /// shut down (it has no working connection to cut).
    private func renewPoolIfStuck() async {
        guard connectionTrouble.load(ordering: .acquiring), await databaseAcceptsConnections() else { return }
        do {
            try await pingPool()
            return
        } catch {
            guard Self.isBreakerOpen(error) else { return }
        }
        let old = pool.withLock { pool -> RunningPool? in
            // Under the lock `close()` takes too: a closed store gets no new pool.
            guard !closed.load(ordering: .acquiring) else { return nil }
            let old = pool
            pool = RunningPool.start(clientConfiguration, logger: logger)
            return old
        }
        guard let old else { return }
        old.run.cancel()
        renewals.add(1, ordering: .relaxed)
        connectionTrouble.store(false, ordering: .releasing)
        logger.warning("the database accepts connections again; replaced the connection pool (its circuit breaker was open after a long outage)")
    }

    /// A ping through the pool, with PostgresNIO's own error (to tell an open breaker).
    private func pingPool() async throws {
        let logger = self.logger
        let client = self.client
        let inUse = ConnectionInUse()
        let probe = Task {
            try await client.withConnection { connection in
                try inUse.use(connection)
                let answered = await Result(catchingAsync: { _ = try await connection.query("SELECT 1", logger: logger).collect() })
                await inUse.release()
                try answered.get()
            }
        }
        let deadline = DeadlineWheel.shared.schedule(after: configuration.operationTimeout) {
            probe.cancel()
            inUse.expire()
        }
        defer { DeadlineWheel.shared.cancel(deadline) }
        try await probe.value
    }

    /// PostgresNIO's pool refusing at once because its circuit breaker is open.
    static func isBreakerOpen(_ error: any Error) -> Bool {
        "\(error)".contains("connectionCreationCircuitBreakerTripped")
    }

    /// True when a connection of the store's own (not the pool's) opens and answers.
    private func databaseAcceptsConnections() async -> Bool {
        let logger = self.logger
        let inUse = ConnectionInUse()
        let probe = Task { [directConfiguration] () -> Bool in
            guard let connection = try? await PostgresConnection.connect(configuration: directConfiguration, id: -1, logger: logger) else { return false }
            guard (try? inUse.use(connection)) != nil else {
                try? await connection.close()
                return false
            }
            let answered = (try? await connection.query("SELECT 1", logger: logger).collect()) != nil
            await inUse.release()
            try? await connection.close()
            return answered
        }
        // A probe whose connection stops answering is closed (a query once sent is not given up
        // on cancellation), so neither the renewal loop nor `close()` waits on it.
        let deadline = DeadlineWheel.shared.schedule(after: configuration.connectTimeout + .seconds(1)) {
            probe.cancel()
            inUse.expire()
        }
        defer { DeadlineWheel.shared.cancel(deadline) }
        return await probe.value
    }

    /// Notes whether an operation reached the database (for `renewPoolIfStuck`).
    private func noteOutcome(connected: Bool) {
        if connected {
            if connectionTrouble.load(ordering: .relaxed) { connectionTrouble.store(false, ordering: .releasing) }
        } else {
            connectionTrouble.store(true, ordering: .releasing)
        }
    }

    /// Errors that mean the pool had no working connection (the database unreachable, or the
    /// connection lost, or the pool's breaker open after such failures), as opposed to an answer
    /// from the database, a timeout or a cancelled request.
    static func isConnectionTrouble(_ error: any Error) -> Bool {
        if let error = error as? PSQLError {
            switch error.code {
            case .connectionError, .serverClosedConnection, .uncleanShutdown: return true
            default: return false
            }
        }
        return isBreakerOpen(error)
    }

    /// How many customer locks may be held at once: the pool less three connections, for the
    /// registry listener, the audit commits the holders wait for, and one more for whatever else
    /// runs meanwhile (the checkpoint writer's second connection, a readiness check, the
    /// recorder), none of which waits for a holder. A holder's reads go on its lock's connection
    /// (see ``LockConnectionLoan``), so it needs no second one.
    static func customerLockHolders(poolSize: Int) -> Int { max(1, poolSize - 3) }

    /// Stops the pool; later calls fail with `StoreError.unavailable`. Idempotent.
    public func close() async {
        // Under the pool's lock, so a renewal in progress either finished its swap (and this
        // stops the new pool) or sees the store closed and makes none.
        let alreadyClosed = pool.withLock { _ in closed.exchange(true, ordering: .acquiringAndReleasing) }
        guard !alreadyClosed else { return }
        let renewal = renewalTask.withLock { $0 }
        renewal?.cancel()
        await renewal?.value
        let running = pool.withLock { $0 }
        running.run.cancel()
        await running.run.value
    }

    deinit {
        renewalTask.withLock { $0?.cancel() }
        pool.withLock { $0.run.cancel() }
    }

    // MARK: - Bounded operations

    /// Runs `operation` and fails it with `StoreError.unavailable` when it takes longer than the
    /// operation timeout (cancelling it) or fails; `what` names the operation in messages.
    ///
    /// `discardLate` receives a value the operation produced after the deadline had answered
    /// (a connection opened too late must still be closed).
    func bounded<T: Sendable>(
        _ what: String, timeout: Duration? = nil, onDeadline: (@Sendable () -> Void)? = nil,
        discardLate: (@Sendable (T) async -> Void)? = nil, _ operation: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        guard !closed.load(ordering: .acquiring) else { throw StoreError(.unavailable, "\(what) failed: the store is closed") }
        let timeout = timeout ?? configuration.operationTimeout
        let race = ResumeOnce<T>()
        let configuration = self.configuration
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                race.install(continuation)
                let work = Task {
                    do {
                        let value = try await operation()
                        if !race.resume(.success(value)) { await discardLate?(value) }
                        self.noteOutcome(connected: true)
                    } catch {
                        if Self.isConnectionTrouble(error) { self.noteOutcome(connected: false) }
                        race.resume(.failure(Self.storeError(error, what)))
                    }
                }
                race.setWork(work)
                race.setTimer(DeadlineWheel.shared.schedule(after: timeout) {
                    if race.resume(.failure(StoreError(.unavailable, "\(what) failed: the database at \(configuration.redactedDescription) did not answer within \(timeout)"))) {
                        work.cancel()
                        onDeadline?()
                    }
                })
            }
        } onCancel: {
            race.cancel()
        }
    }

    /// Runs `body` on one pooled connection, bounded like every operation; when the deadline
    /// passes while `body` is on its connection, that connection is closed.
    ///
    /// Rule: a connection whose operation outlived its deadline is closed, not handed back.
    /// PostgresNIO does not give up a query it has sent when its task is cancelled, so without
    /// this a connection to a database that vanished without a reset (a failover that moved its
    /// address, a dropped NAT entry) would stay taken until TCP gives up, about 15 minutes later,
    /// and a pool of them would keep the service down though the database answers again. Closing
    /// frees the pool's place for a new connection and ends the server's transaction.
    func boundedOnConnection<T: Sendable>(
        _ what: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws -> T {
        let inUse = ConnectionInUse()
        return try await bounded(what, onDeadline: { inUse.expire() }) { [client] in
            try await client.withConnection { connection in
                try inUse.use(connection)
                let result = await Result(catchingAsync: { try await body(connection) })
                await inUse.release()
                return try result.get()
            }
        }
    }

    /// Runs `body` in one transaction on one pooled connection: BEGIN, body, COMMIT; ROLLBACK
    /// when the body throws. Bounded like every operation (see ``boundedOnConnection(_:_:)``).
    func transaction<T: Sendable>(_ what: String, _ body: @escaping @Sendable (PostgresConnection, Logger) async throws -> T) async throws -> T {
        let logger = self.logger
        return try await boundedOnConnection(what) { connection in
            try await connection.run("BEGIN", logger: logger)
            do {
                let value = try await body(connection, logger)
                try await connection.run("COMMIT", logger: logger)
                return value
            } catch {
                // A connection closed on the way (a failed prepared statement, see
                // `PostgresStore.collect`) has no transaction left to end, and a
                // query on it would only wait for the deadline.
                if !connection.isClosed { _ = try? await connection.query("ROLLBACK", logger: logger) }
                throw error
            }
        }
    }

    /// All rows of one query outside a transaction.
    func rows(_ what: String, _ query: PostgresQuery) async throws -> [PostgresRow] {
        let logger = self.logger
        return try await boundedOnConnection(what) { connection in try await connection.query(query, logger: logger).collect() }
    }

    /// A StoreError for anything a PostgreSQL call threw: the server's message and SQLSTATE, or
    /// what went wrong with the connection. Never PostgresNIO's own descriptions (they may hold
    /// the query and its parameters) and never row data.
    static func storeError(_ error: any Error, _ what: String) -> StoreError {
        if let error = error as? StoreError { return error }
        if let error = error as? PSQLError {
            switch error.code {
            case .server:
                let state = error.serverInfo?[.sqlState] ?? "?"
                let message = error.serverInfo?[.message] ?? "no message"
                if state == "25006" {
                    return StoreError(.unavailable, "\(what) failed: the database is read-only (SQLSTATE 25006; after a failover, point the store at the new primary)")
                }
                return StoreError(.unavailable, "\(what) failed: \(message) (SQLSTATE \(state))")
            case .connectionError:
                let cause = error.underlying.map { "\($0)" } ?? "unknown cause"
                return StoreError(.unavailable, "\(what) failed: cannot connect to the database: \(cause)")
            case .serverClosedConnection, .clientClosedConnection, .uncleanShutdown:
                return StoreError(.unavailable, "\(what) failed: the connection to the database was lost")
            case .poolClosed:
                return StoreError(.unavailable, "\(what) failed: the store is closed")
            case .sslUnsupported:
                return StoreError(.unavailable, "\(what) failed: the server does not support TLS (sslmode requires it)")
            case .failedToAddSSLHandler:
                return StoreError(.unavailable, "\(what) failed: TLS could not be set up")
            case .authMechanismRequiresPassword:
                return StoreError(.unavailable, "\(what) failed: the server asks for a password and none was given (URL, PGPASSWORD or --store-password-file)")
            case .unsupportedAuthMechanism, .saslError:
                return StoreError(.unavailable, "\(what) failed: authentication failed (\(error.code))")
            case .queryCancelled:
                return StoreError(.unavailable, "\(what) failed: the query was cancelled")
            default:
                return StoreError(.unavailable, "\(what) failed: \(error.code)")
            }
        }
        if error is PostgresDecodingError {
            return StoreError(.unavailable, "\(what) failed: a column holds a value of an unexpected type (was the database edited by hand?)")
        }
        if error is CancellationError {
            return StoreError(.unavailable, "\(what) failed: cancelled")
        }
        if let error = error as? NIOSSLError {
            return StoreError(.unavailable, "\(what) failed: TLS: \(error)")
        }
        return StoreError(.unavailable, "\(what) failed: \(type(of: error))")
    }

    /// The SQLSTATE of a server error, nil for anything else.
    static func sqlState(_ error: any Error) -> String? {
        guard let error = error as? PSQLError, error.code == .server else { return nil }
        return error.serverInfo?[.sqlState]
    }

    static func constraint(_ error: any Error) -> String? {
        (error as? PSQLError)?.serverInfo?[.constraintName]
    }

    static func date(_ millis: Int64) -> Date { Date(timeIntervalSince1970: Double(millis) / 1000) }
    static func optionalDate(_ millis: Int64?) -> Date? { millis.map { date($0) } }
}

extension Result where Failure == any Error {
    /// The outcome of an asynchronous `body`, its error included.
    init(catchingAsync body: () async throws -> Success) async {
        do {
            self = .success(try await body())
        } catch {
            self = .failure(error)
        }
    }
}

/// The connection a bounded operation is on, so that its deadline can close it (see
/// ``PostgresStore/boundedOnConnection(_:_:)``).
///
/// Rule: a close starts under the same lock `release` takes, and `release` waits for a close
/// that started, so a connection closed at its deadline is closed before it goes back to the
/// pool, never after another operation took it.
final class ConnectionInUse: Sendable {
    private struct State {
        var connection: PostgresConnection?
        var expired = false
        /// The close the deadline started, if any.
        var closing: EventLoopFuture<Void>?
    }

    private let state = Mutex(State())

    /// Records the connection the operation got; throws when its deadline has already passed
    /// (nothing is sent for an operation its caller gave up on).
    func use(_ connection: PostgresConnection) throws {
        let expired = state.withLock { state -> Bool in
            if !state.expired { state.connection = connection }
            return state.expired
        }
        if expired { throw CancellationError() }
    }

    /// The operation is off its connection (done or failed): a later deadline leaves it alone.
    /// Returns once a close the deadline started has ended, so the pool gets it back closed.
    func release() async {
        let closing = state.withLock { state -> EventLoopFuture<Void>? in
            state.connection = nil
            return state.closing
        }
        if let closing { try? await closing.get() }
    }

    /// Whether the deadline passed.
    var hasExpired: Bool { state.withLock { $0.expired } }

    /// The deadline passed: the connection the operation is on, if any, starts closing.
    func expire() {
        state.withLock { state in
            state.expired = true
            guard let connection = state.connection else { return }
            state.connection = nil
            state.closing = connection.close()
        }
    }
}

/// Resumes one continuation exactly once, from whichever of the work, the timer or a
/// cancellation comes first, and cancels the others.
final class ResumeOnce<T: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<T, any Error>?
        /// A result that came before the continuation was installed.
        var early: Result<T, any Error>?
        var done = false
        var work: Task<Void, Never>?
        var timer: DeadlineWheel.Ticket?
    }
    private let state = Mutex(State())

    func install(_ continuation: CheckedContinuation<T, any Error>) {
        let early = state.withLock { state -> Result<T, any Error>? in
            guard let early = state.early else {
                state.continuation = continuation
                return nil
            }
            state.early = nil
            return early
        }
        if let early { continuation.resume(with: early) }
    }

    func setWork(_ task: Task<Void, Never>) {
        let cancelNow = state.withLock { state -> Bool in
            state.work = task
            return state.done
        }
        if cancelNow { task.cancel() }
    }

    /// The deadline of the operation (one shared timer, see `DeadlineWheel`), cancelled once
    /// anything resumes.
    func setTimer(_ ticket: DeadlineWheel.Ticket) {
        let cancelNow = state.withLock { state -> Bool in
            state.timer = ticket
            return state.done
        }
        if cancelNow { DeadlineWheel.shared.cancel(ticket) }
    }

    /// Resumes with `result` unless something else did first; returns whether this call did.
    @discardableResult
    func resume(_ result: Result<T, any Error>) -> Bool {
        let (claimed, continuation, timer) = state.withLock { state -> (Bool, CheckedContinuation<T, any Error>?, DeadlineWheel.Ticket?) in
            guard !state.done else { return (false, nil, nil) }
            state.done = true
            let taken = state.continuation
            state.continuation = nil
            if taken == nil { state.early = result }
            return (true, taken, state.timer)
        }
        guard claimed else { return false }
        if let timer { DeadlineWheel.shared.cancel(timer) }
        continuation?.resume(with: result)
        return true
    }

    func cancel() {
        let work = state.withLock { $0.work }
        if resume(.failure(StoreError(.unavailable, "the store operation was cancelled"))) { work?.cancel() }
    }
}

extension PostgresConnection {
    /// Runs a statement and reads its result to the end, so any error it raises is thrown here.
    /// (An error left unread would leave the transaction aborted, and PostgreSQL answers COMMIT
    /// on an aborted transaction with a rollback, not an error.)
    func run(_ query: PostgresQuery, logger: Logger) async throws {
        _ = try await self.query(query, logger: logger).collect()
    }
}
