import Foundation
import OfferSignerCore
import Synchronization

/// A lock that several serving processes on one database take to act as one service.
public enum StoreLock: Sendable, Hashable {
    /// One customer (appAccountToken) of one app: held from the read of the customer's ledger
    /// until what was decided from it that adds to the ledger (an issuance's records) is
    /// committed, so that a rule counting the signatures already issued holds however many
    /// instances serve the customer (a refusal is committed after it is given back, see
    /// `SigningController.answer`).
    case customer(bundleID: String, appAccountToken: String)
    /// The writer of signed audit checkpoints: held while one instance checks whether a
    /// checkpoint is due and signs it, so the deployment keeps one checkpoint per interval.
    case auditCheckpointWriter
    /// The scheduled notification catch-up of one app and environment: held while one instance
    /// reads the watermark, asks Apple's Get Notification History and moves the watermark on, so
    /// the instances of a deployment do not all repeat the work.
    case notificationRecovery(bundleID: String, environment: String)

    /// What the lock is for, without the customer's identifiers (for messages and logs).
    public var kind: String {
        switch self {
        case .customer: "customer"
        case .auditCheckpointWriter: "audit checkpoint writer"
        case .notificationRecovery: "notification recovery"
        }
    }

    /// A stable text naming the lock (the same in every process and version).
    public var name: String {
        switch self {
        case .customer(let bundleID, let appAccountToken): "customer\n\(bundleID)\n\(appAccountToken)"
        case .auditCheckpointWriter: "audit-checkpoint-writer"
        case .notificationRecovery(let bundleID, let environment): "notification-recovery\n\(bundleID)\n\(environment)"
        }
    }
}

/// The stored-history versions a decision under a customer lock reads first: those of
/// `transactionID` in each of `environments`, in the lock's bundle (what
/// ``OfferSignerStore/appleHistoryVersion(bundleID:environment:transactionID:)`` answers). A store
/// may read them in the round trip that takes the lock (PostgreSQL does); the body reads them as
/// usual either way.
public struct CustomerLockHistoryRead: Sendable, Hashable {
    public var transactionID: String
    public var environments: [String]

    public init(transactionID: String, environments: [String]) {
        self.transactionID = transactionID
        self.environments = environments
    }
}

/// What a store does so that several `serve` processes on one database behave as one service.
///
/// Rules every implementation keeps: `withExclusiveLock` runs its body while no other process
/// (and no other call in this process) holds the same lock through the same database, waits for
/// it at most `timeout` and then throws `StoreError` with code `timeout`, and releases it however
/// the body ends, or when the process or its connection dies. `registryChanges` reports key and
/// client changes committed by any process; it is a shortcut, never the only way a server learns
/// of them (servers keep polling `registryVersion`).
public protocol StoreCoordination: Sendable {
    /// Runs `body` while holding `lock` for the whole database.
    ///
    /// The SQLite store serves one process (several servers on one file are not supported), so
    /// its lock is a lock in this process.
    func withExclusiveLock<T: Sendable>(_ lock: StoreLock, timeout: Duration, _ body: () async throws -> T) async throws -> T

    /// ``withExclusiveLock(_:timeout:_:)``, telling the store which stored-history versions the
    /// body will read first (only for a customer lock; ignored otherwise). The store may read them
    /// with the lock, in one round trip; the lock's rules are the same.
    func withExclusiveLock<T: Sendable>(
        _ lock: StoreLock, timeout: Duration, readingHistory: CustomerLockHistoryRead?, _ body: () async throws -> T
    ) async throws -> T

    /// Succeeds when the store can be read and would accept writes now; throws `StoreError`
    /// (`unavailable`) otherwise: unreachable, or read-only (a PostgreSQL standby, or a primary
    /// being failed over). Readiness checks use it, since an instance that cannot write its audit
    /// records cannot sign.
    func checkWritable() async throws

    /// One element per registry change (key or client) committed by any process, for as long as
    /// the caller iterates. The sequence finishes at once when the store has no way to notify
    /// (SQLite: polling covers it); it finishes when the iterating task is cancelled; it throws
    /// when the store can no longer listen (a lost connection), and the caller may ask again.
    func registryChanges() -> AsyncThrowingStream<Void, any Error>
}

/// A store call bounded in time: the caller gets an answer (or `StoreError.timeout`) within the
/// time allowed, whatever the database does.
///
/// Rule: the operation is not abandoned half-way: it keeps running on its own task until the
/// store answers, and only its result is dropped. So a bounded wait may give up on an audit commit
/// that lands later (an audit record for a signature never sent), never the other way round. (The
/// server's audit committer takes back entries it has not started writing when its caller gives
/// up; this rule covers what is already being written.)
public enum StoreDeadline {
    /// Runs `operation`, returning its result, or throwing `StoreError` with code `timeout` when
    /// it has not finished after `timeout`. Cancelling the caller cancels the operation's task.
    public static func run<T: Sendable>(
        _ what: String, timeout: Duration, _ operation: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let race = Race<T>()
        let task = Task {
            do {
                race.finish(with: .success(try await operation()))
            } catch {
                race.finish(with: .failure(error))
            }
        }
        // One shared timer for every bounded call (a timer task per call cost a task, a dispatch
        // timer and its cancellation on every store call of every request).
        let deadline = DeadlineWheel.shared.schedule(after: timeout) {
            race.finish(with: .failure(StoreError(.timeout, "\(what): the store did not answer within \(timeout.millisecondsText)")))
        }
        defer { DeadlineWheel.shared.cancel(deadline) }
        return try await withTaskCancellationHandler {
            try await race.value()
        } onCancel: {
            task.cancel()
            race.finish(with: .failure(CancellationError()))
        }
    }

    /// The first of several results, handed to one waiter.
    private final class Race<T: Sendable>: Sendable {
        private enum State {
            case waiting(CheckedContinuation<T, any Error>?)
            case finished(Result<T, any Error>)
        }

        private let state = Mutex<State>(.waiting(nil))

        func finish(with result: Result<T, any Error>) {
            let waiter = state.withLock { state -> CheckedContinuation<T, any Error>? in
                guard case .waiting(let waiter) = state else { return nil }
                state = .finished(result)
                return waiter
            }
            waiter?.resume(with: result)
        }

        func value() async throws -> T {
            try await withCheckedThrowingContinuation { continuation in
                let finished = state.withLock { state -> Result<T, any Error>? in
                    switch state {
                    case .finished(let result): return result
                    case .waiting: state = .waiting(continuation); return nil
                    }
                }
                if let finished { continuation.resume(with: finished) }
            }
        }
    }
}

extension Duration {
    /// "250 ms", for messages.
    public var millisecondsText: String {
        let (seconds, attoseconds) = components
        return "\(seconds * 1000 + attoseconds / 1_000_000_000_000_000) ms"
    }
}

extension StoreCoordination {
    /// A store that reads nothing with its locks takes the lock alone.
    public func withExclusiveLock<T: Sendable>(
        _ lock: StoreLock, timeout: Duration, readingHistory: CustomerLockHistoryRead?, _ body: () async throws -> T
    ) async throws -> T {
        try await withExclusiveLock(lock, timeout: timeout, body)
    }
}
