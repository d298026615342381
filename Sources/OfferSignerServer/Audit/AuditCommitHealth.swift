import Foundation
import OfferSignerStorage
import Synchronization

/// Whether audit commits are getting through, as `/readyz` reports it.
///
/// Rule: after a store-wide commit failure (full or read-only disk, store files gone) the state
/// is failing until a commit or a write test succeeds again; a request refused for its own sake
/// (a reused nonce) changes nothing. The summary it keeps is the store's message, which names
/// files and SQLite's error but never a secret; an error of any other kind is not described.
final class AuditCommitHealth: Sendable {
    struct Failure: Sendable, Equatable {
        /// What went wrong, safe to show to anyone who can reach `/readyz`.
        var summary: String
        var since: Date
    }

    private let state = Mutex<Failure?>(nil)

    init() {}

    /// The current failure, nil while commits succeed.
    var failure: Failure? { state.withLock { $0 } }

    var isFailing: Bool { failure != nil }

    /// Records a successful commit or write test; returns the failure it ended, if any.
    @discardableResult
    func recordSuccess() -> Failure? {
        state.withLock { failure in
            defer { failure = nil }
            return failure
        }
    }

    /// Records a store-wide failure; returns true when it starts a failing period or changes
    /// what is wrong (worth a log line; a repeat is not).
    @discardableResult
    func recordFailure(_ error: any Error, at time: Date = Date()) -> Bool {
        let summary = Self.summary(of: error)
        return state.withLock { failure in
            if let current = failure {
                guard current.summary != summary else { return false }
                failure = Failure(summary: summary, since: current.since)
                return true
            }
            failure = Failure(summary: summary, since: time)
            return true
        }
    }

    /// The longest summary kept: enough for SQLite's message and a path.
    static let maximumSummaryLength = 300

    static func summary(of error: any Error) -> String {
        guard let storeError = error as? StoreError else { return "an unexpected error (see the server log)" }
        let message = storeError.message
        return message.count <= maximumSummaryLength ? message : String(message.prefix(maximumSummaryLength)) + "…"
    }
}
