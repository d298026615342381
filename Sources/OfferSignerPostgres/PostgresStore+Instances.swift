import Crypto
import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO
import Synchronization

/// What several `serve` instances on one database need from it: advisory locks and registry
/// change notifications (see ``StoreCoordination``).
///
/// Rules: a ``StoreLock`` is a session-level advisory lock (`pg_advisory_lock`) on a pooled
/// connection of its own, taken in one statement (its wait bounded by `lock_timeout`, set for that
/// statement alone) and released with every other lock of the session (`pg_advisory_unlock_all`)
/// when the caller's body has returned; so the lock is released when the body ends, and by the
/// server when the connection or the process dies. A connection never goes back to the pool
/// holding a lock: after a wait that ran out its session's locks are released too (the server
/// keeps a lock granted just as `lock_timeout` fired), and a connection whose lock statement
/// failed otherwise, or whose release failed or did not answer, is closed (a session lock
/// survives a failed statement, and taking it again on the same connection would succeed). The
/// wait is bounded twice: by `lock_timeout` on the server, and by a timer here (for a database
/// that does not answer at all). Keys use the two-integer form, which never meets the one-integer key the migrations
/// lock. Registry changes are announced by a trigger on `registry` (NOTIFY in the transaction
/// that changed it, delivered when it commits) and followed on one pooled connection that
/// LISTENs.
extension PostgresStore {
    /// The channel a registry change is announced on (by the trigger on `registry`).
    static let registryChannel = "offer_signer_registry"

    /// The first key of every offer-signer advisory lock of this kind ("os" + 1, 2 or 3).
    static let customerLockClass: Int32 = 0x6F73_0001
    static let checkpointLockClass: Int32 = 0x6F73_0002
    static let notificationRecoveryLockClass: Int32 = 0x6F73_0003

    /// The two-integer advisory key of a lock: its kind, and 32 bits of the SHA-256 of its name
    /// (two customers that share them only wait for each other; they never get each other's
    /// signatures).
    static func advisoryKey(_ lock: StoreLock) -> (Int32, Int32) {
        switch lock {
        case .auditCheckpointWriter:
            return (checkpointLockClass, 1)
        case .customer, .notificationRecovery:
            let digest = Array(SHA256.hash(data: Data(lock.name.utf8)))
            let bits = UInt32(digest[0]) << 24 | UInt32(digest[1]) << 16 | UInt32(digest[2]) << 8 | UInt32(digest[3])
            let kind = if case .customer = lock { customerLockClass } else { notificationRecoveryLockClass }
            return (kind, Int32(bitPattern: bits))
        }
    }

    /// Rule: a customer lock holds a pooled connection for as long as its body runs (its ledger
    /// and history reads go on that one), and a body that issues needs another for its audit
    /// commit (a decision without a signature is committed after the lock, see
    /// `SigningController.answer`); so at most
    /// ``customerLockHolders(poolSize:)`` customer locks are held at once, and a request beyond
    /// them waits for its turn within the same timeout. (Before, as many concurrent requests as
    /// the pool had connections each held one for its lock and waited for a second: none could
    /// go on until the timeout, and all were refused.)
    ///
    /// A customer lock is taken with the reads its body makes first, in one round trip
    /// (``CustomerDecisionLock``): the customer's ledger always, and the stored-history versions
    /// `readingHistory` names. Each is handed once to the body's first matching read
    /// (``CustomerDecisionReads``); later reads go to the database as before.
    public func withExclusiveLock<T: Sendable>(_ lock: StoreLock, timeout: Duration, _ body: () async throws -> T) async throws -> T {
        try await withExclusiveLock(lock, timeout: timeout, readingHistory: nil, body)
    }

    public func withExclusiveLock<T: Sendable>(
        _ lock: StoreLock, timeout: Duration, readingHistory: CustomerLockHistoryRead?, _ body: () async throws -> T
    ) async throws -> T {
        let start = ContinuousClock.now
        var permitted = false
        if case .customer = lock {
            guard await customerLockPermits.acquire(until: start + timeout) else {
                throw StoreError(.timeout, "the \(lock.kind) lock: \(customerLockPermits.waiting + 1) requests were waiting for one of the store's \(Self.customerLockHolders(poolSize: configuration.poolSize)) lock places for more than \(timeout.millisecondsText)")
            }
            permitted = true
        }
        defer { if permitted { customerLockPermits.release() } }
        let remaining = max(timeout - (ContinuousClock.now - start), .milliseconds(1))
        var decision: CustomerDecisionLock.Reads?
        if case .customer(let bundleID, let customer) = lock {
            decision = CustomerDecisionLock.Reads(bundleID: bundleID, customer: customer, history: readingHistory)
        }
        let held = try await AdvisoryLockHolding.acquire(
            lock, key: Self.advisoryKey(lock), timeout: remaining, reading: decision, client: client, lender: ObjectIdentifier(self), logger: logger)
        defer { held.release() }
        guard case .customer = lock, let loan = held.loan else { return try await body() }
        // The body's reads (the ledger, the stored history) go on the lock's connection.
        return try await Self.$lockConnectionLoan.withValue(loan) { try await body() }
    }

    /// The connection of the customer lock the current task holds, if any (see
    /// ``LockConnectionLoan``).
    @TaskLocal static var lockConnectionLoan: LockConnectionLoan?

    /// Runs a read on the connection of the customer lock the calling task holds on this store,
    /// or, with no such lock, on a pooled connection of its own
    /// (`boundedOnConnection`). Bounded the same way: a read that outlives
    /// `configuration.operationTimeout` closes the connection (which ends the lock; the body,
    /// whose read failed, issues nothing).
    func onLockConnection<T: Sendable>(_ what: String, _ body: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        guard let loan = Self.lockConnectionLoan, loan.lender == ObjectIdentifier(self), loan.borrow() else {
            return try await boundedOnConnection(what, body)
        }
        // A closed connection lost the lock with it (and a query written to a closed PostgresNIO
        // connection is never answered): the body must not go on as if it held it.
        guard !loan.connection.isClosed else {
            loan.giveBack()
            throw StoreError(.unavailable, "\(what) failed: the connection holding the customer's lock was lost")
        }
        let timeout = configuration.operationTimeout
        let inUse = ConnectionInUse()
        let result: Result<T, any Error>
        do {
            try inUse.use(loan.connection)
            let deadline = DeadlineWheel.shared.schedule(after: timeout) { inUse.expire() }
            result = await Result(catchingAsync: { try await body(loan.connection) })
            DeadlineWheel.shared.cancel(deadline)
            await inUse.release()
        } catch {
            result = .failure(error)
        }
        loan.giveBack()
        switch result {
        case .success(let value):
            return value
        case .failure(let error):
            if inUse.hasExpired {
                throw StoreError(.unavailable, "\(what) failed: the database at \(configuration.redactedDescription) did not answer within \(timeout)")
            }
            throw Self.storeError(error, what)
        }
    }

    /// The answer the current customer lock's round trip read for this call, if any (`take`
    /// returns it from the lock's ``CustomerDecisionReads``, at most once); nil outside a lock of
    /// this store or when it read nothing for this call. Throws, as a read on it would, when the
    /// lock's connection was lost: the body must not go on as if it held the lock.
    func prefetchedRead<T>(_ what: String, _ take: (LockConnectionLoan) -> T?) throws -> T? {
        guard let loan = Self.lockConnectionLoan, loan.lender == ObjectIdentifier(self), let value = take(loan) else { return nil }
        guard !loan.connection.isClosed else {
            throw StoreError(.unavailable, "\(what) failed: the connection holding the customer's lock was lost")
        }
        return value
    }

    /// Reachable, not a standby (`pg_is_in_recovery()`), and a new transaction is not read-only
    /// (`default_transaction_read_only`, as set while a primary is being demoted).
    public func checkWritable() async throws {
        let rows = try await rows("checking the store is writable", "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'")
        guard let readOnly = try rows.first?.decode(Bool.self) else {
            throw StoreError(.unavailable, "checking the store is writable failed: no answer")
        }
        if readOnly {
            throw StoreError(.unavailable, "the database is read-only (a standby, or a failover in progress); point the store at the primary")
        }
    }

    public func registryChanges() -> AsyncThrowingStream<Void, any Error> {
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: Void.self, throwing: (any Error).self)
        let task = Task { [client] in
            do {
                try await client.withConnection { connection in
                    try await connection.listen(on: Self.registryChannel) { notifications in
                        // Listening now: a change made while nobody listened is found by the
                        // version check the listener makes on every element.
                        continuation.yield()
                        for try await _ in notifications { continuation.yield() }
                    }
                }
                if Task.isCancelled {
                    continuation.finish()
                } else {
                    continuation.finish(throwing: StoreError(.unavailable, "listening for registry changes stopped: the connection was lost"))
                }
            } catch {
                if Task.isCancelled {
                    continuation.finish()
                } else {
                    continuation.finish(throwing: Self.storeError(error, "listening for registry changes"))
                }
            }
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }
}

/// One advisory lock held on a pooled connection by a task of its own until `release()`.
///
/// Rule: `acquire` returns only once the lock is held, or throws (`StoreError.timeout` when the
/// wait passed `timeout`); a lock obtained after its caller gave up is released at once.
final class AdvisoryLockHolding: Sendable {
    private let released = AsyncStream.makeStream(of: Void.self)

    private let lent = Mutex<LockConnectionLoan?>(nil)

    /// Lets the holding task unlock and return its connection.
    func release() { released.continuation.finish() }

    /// The connection the lock is held on, for the reads of the body that holds it.
    var loan: LockConnectionLoan? { lent.withLock { $0 } }

    fileprivate func lend(_ loan: LockConnectionLoan) { lent.withLock { $0 = loan } }

    static func acquire(
        _ lock: StoreLock, key: (Int32, Int32), timeout: Duration, reading decision: CustomerDecisionLock.Reads? = nil, client: PostgresClient,
        lender: ObjectIdentifier, logger: Logger
    ) async throws -> AdvisoryLockHolding {
        let holding = AdvisoryLockHolding()
        let race = ResumeOnce<Void>()
        let inUse = ConnectionInUse()
        let milliseconds = max(1, timeout.components.seconds * 1000 + timeout.components.attoseconds / 1_000_000_000_000_000)
        let timeoutError = StoreError(.timeout, "the \(lock.kind) lock was held elsewhere for more than \(timeout.millisecondsText)")
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                race.install(continuation)
                let work = Task {
                    do {
                        try await client.withConnection { connection in
                            // A wait that outlives its deadline closes the connection (see
                            // `PostgresStore.boundedOnConnection`).
                            try inUse.use(connection)
                            let prefetched: CustomerDecisionReads?
                            do {
                                // `collect` reads the statement to its end: `execute` returns at
                                // BindComplete, and a lock_timeout (55P03) would then be lost in the
                                // unread rows, so the caller would go on without the lock.
                                if let decision {
                                    let statement = CustomerDecisionLock(
                                        key: key, timeoutMilliseconds: Int64(milliseconds), bundleID: decision.bundleID, customer: decision.customer,
                                        history: decision.history)
                                    let rows = try await PostgresStore.collect(statement, on: connection, logger: logger)
                                    prefetched = try CustomerDecisionLock.prefetched(rows, reads: decision)
                                } else {
                                    _ = try await PostgresStore.collect(
                                        TimedAdvisorySessionLock(key: key, timeoutMilliseconds: Int64(milliseconds)), on: connection, logger: logger)
                                    prefetched = nil
                                }
                            } catch {
                                // Even a wait that ran out (55P03) may have taken the lock: the
                                // server keeps a lock granted just as the timeout fired, and a
                                // session lock outlives the statement that failed. So the session's
                                // locks are released before the connection goes back to the pool;
                                // after any other failure, or when that release fails, the
                                // connection is closed (which releases whatever it holds) and the
                                // pool opens another.
                                if !connection.isClosed {
                                    if PostgresStore.sqlState(error) == "55P03" {
                                        await Self.unlockAllOrClose(connection, within: max(timeout, .seconds(5)) + .seconds(1), logger: logger)
                                    } else {
                                        try? await connection.close()
                                    }
                                }
                                await inUse.release()
                                throw error
                            }
                            // Held. If the caller gave up meanwhile, `release()` was called already.
                            await inUse.release()
                            let loan = LockConnectionLoan(connection: connection, lender: lender, prefetched: prefetched)
                            holding.lend(loan)
                            race.resume(.success(()))
                            for await _ in holding.released.stream {}
                            // A read still out once the body has returned was abandoned by it (its
                            // deadline passed): rather than wait for it with the lock held, the
                            // connection is closed, which ends the read and the lock.
                            if loan.end() {
                                try? await connection.close()
                                return
                            }
                            // A connection closed meanwhile took the lock with it, and would never
                            // answer the unlock.
                            guard !connection.isClosed else { return }
                            await Self.unlockAllOrClose(connection, within: max(timeout, .seconds(5)) + .seconds(1), logger: logger)
                        }
                    } catch {
                        let failure = PostgresStore.sqlState(error) == "55P03" ? timeoutError : PostgresStore.storeError(error, "taking the \(lock.kind) lock")
                        race.resume(.failure(failure))
                    }
                }
                race.setWork(work)
                race.setTimer(DeadlineWheel.shared.schedule(after: timeout + .milliseconds(50)) {
                    if race.resume(.failure(timeoutError)) {
                        holding.release()
                        work.cancel()
                        // The server ends a lock wait at its lock_timeout, counted from the lock
                        // statement, which went out by now (or its connection is released unused):
                        // a connection still on it a lock timeout and a second later is not
                        // answering, and is closed.
                        _ = DeadlineWheel.shared.schedule(after: timeout + .seconds(1)) { inUse.expire() }
                    }
                })
            }
        } onCancel: {
            holding.release()
            race.cancel()
        }
        return holding
    }
}

extension AdvisoryLockHolding {
    /// Releases every advisory lock the connection's session holds; when that fails or does not
    /// answer within `limit`, closes the connection instead. Either way, it never goes back to the
    /// pool holding a lock. (A query written to a connection that closed meanwhile is never
    /// answered by PostgresNIO: the wait is raced against its limit, not left to the query.)
    static func unlockAllOrClose(_ connection: PostgresConnection, within limit: Duration, logger: Logger) async {
        do {
            try await StoreDeadline.run("releasing an advisory lock", timeout: limit) {
                _ = try await PostgresStore.collect(AdvisorySessionUnlockAll(), on: connection, logger: logger)
            }
        } catch {
            if !connection.isClosed { try? await connection.close() }
        }
    }
}

/// The connection a customer lock is held on, lent to the reads of the body that holds the lock,
/// so a decision under the lock takes one pooled connection, not one for the lock and another for
/// each read.
///
/// Rules: a read borrows it only while the lock is held (`borrow()` answers false once `end()`
/// was called, and the read goes to the pool); `end()` says whether a read is still out, and then
/// the holder closes the connection instead of unlocking it, so the unlock never overtakes a read
/// and the connection never returns to the pool with a read on it; only reads of the store that
/// took the lock borrow it.
final class LockConnectionLoan: Sendable {
    let connection: PostgresConnection
    /// The store whose lock this is.
    let lender: ObjectIdentifier

    private struct State {
        var open = true
        var borrowers = 0
        /// What the lock's round trip read, not yet handed to the body.
        var prefetched: CustomerDecisionReads?
    }

    private let state: Mutex<State>

    init(connection: PostgresConnection, lender: ObjectIdentifier, prefetched: CustomerDecisionReads? = nil) {
        self.connection = connection
        self.lender = lender
        self.state = Mutex(State(prefetched: prefetched))
    }

    /// The customer's ledger as the lock's round trip read it, once; nil when it read another's
    /// or it was handed out already.
    func takeLedger(bundleID: String, customer: String) -> [LedgerIssuance]? {
        state.withLock { state in
            guard state.open, let reads = state.prefetched, reads.bundleID == bundleID, reads.customer == customer else { return nil }
            let ledger = reads.ledger
            state.prefetched?.ledger = nil
            return ledger
        }
    }

    /// A history version the lock's round trip read, once: `.some(nil)` when it found none in
    /// that environment, nil when it did not read this one or handed it out already.
    func takeHistoryVersion(bundleID: String, environment: String, transactionID: String) -> StoredAppleHistoryVersion?? {
        state.withLock { state -> StoredAppleHistoryVersion?? in
            guard state.open, let reads = state.prefetched, reads.bundleID == bundleID, let history = reads.history,
                history.transactionID == transactionID, history.environments.contains(environment),
                state.prefetched?.versionsHandedOut.insert(environment).inserted == true
            else { return nil }
            return .some(reads.versions[environment])
        }
    }

    /// True when the caller may use the connection; it must then call `giveBack()`.
    func borrow() -> Bool {
        state.withLock { state in
            guard state.open else { return false }
            state.borrowers += 1
            return true
        }
    }

    func giveBack() {
        state.withLock { $0.borrowers -= 1 }
    }

    /// Lends no more; true when a read that borrowed the connection has not given it back.
    func end() -> Bool {
        state.withLock { state in
            state.open = false
            return state.borrowers > 0
        }
    }
}

/// What a customer lock's round trip read (see ``CustomerDecisionLock``), for the reads of the
/// body that holds the lock.
///
/// Rule: each answer goes to the body's first read of the same key (the lock's customer and
/// bundle; a transaction ID and environment named in `history`) and to no other: a second read
/// of it goes to the database, so a body that reads again after writing sees its write.
struct CustomerDecisionReads: Sendable {
    let bundleID: String
    let customer: String
    var ledger: [LedgerIssuance]?
    let history: CustomerLockHistoryRead?
    /// By environment; an environment of `history` missing here has no stored history.
    let versions: [String: StoredAppleHistoryVersion]
    var versionsHandedOut: Set<String> = []
}
