import Foundation
import OfferSignerCore
import Synchronization

/// The ledger's issuances per customer (what ``OfferSignerStore/ledgerIssuances(appAccountToken:bundleID:)``
/// returns), kept in memory by the SQLite store so that a rules decision reads no ledger page:
/// in WAL mode every read that follows a commit starts on an emptied page cache and reads its
/// pages again, and audit commits come hundreds of times a second.
///
/// Rules (sound because the SQLite store serves one process, and every ledger row is inserted by
/// that process's audit appends):
/// - an entry is filled from a database read only when no append with a signature for that
///   customer was committed after the read began, and the cache was not cleared meanwhile; an
///   entry already there is never replaced by a read;
/// - a committed append adds its issuances to the customer's entry, as the database returns
///   them: one per (offer, millisecond), in time order;
/// - an append that threw (its outcome is unknown) or a bulk import clears the whole cache;
/// - at most `capacity` customers are tracked; when full, the cache starts over.
final class LedgerCache: Sendable {
    /// Compared and hashed by UTF-8 bytes, as SQLite compares text (Swift's `==` takes
    /// canonically equivalent strings, such as "é" and "e" with a combining accent, as equal).
    struct Customer: Hashable, Sendable {
        var bundleID: String
        var appAccountToken: String

        static func == (a: Customer, b: Customer) -> Bool {
            UTF8Bytes.equal(a.bundleID, b.bundleID) && UTF8Bytes.equal(a.appAccountToken, b.appAccountToken)
        }

        func hash(into hasher: inout Hasher) {
            Self.combine(bundleID, into: &hasher)
            hasher.combine(0xFF as UInt8)  // never in UTF-8: separates the two fields
            Self.combine(appAccountToken, into: &hasher)
        }

        private static func combine(_ text: String, into hasher: inout Hasher) {
            UTF8Bytes.hash(text, into: &hasher)
        }
    }

    /// Taken before a database read, to tell `fill` whether the read may be stale.
    struct Ticket: Sendable {
        fileprivate var generation: UInt64
        fileprivate var appends: UInt64
    }

    private struct State {
        var entries: [Customer: [LedgerIssuance]] = [:]
        /// The append count of each customer's latest committed issuance (since the last clear).
        var lastAppend: [Customer: UInt64] = [:]
        var appends: UInt64 = 0
        var generation: UInt64 = 0

        mutating func clear() {
            entries.removeAll(keepingCapacity: true)
            lastAppend.removeAll(keepingCapacity: true)
            generation &+= 1
        }
    }

    private let state = Mutex(State())
    private let capacity: Int

    init(capacity: Int = 50_000) {
        self.capacity = max(1, capacity)
    }

    /// The customer's issuances, when known.
    func issuances(of customer: Customer) -> [LedgerIssuance]? {
        state.withLock { state in state.entries[customer] }
    }

    /// Take one before reading a customer's issuances from the database, for `fill`.
    func ticket() -> Ticket {
        state.withLock { state in Ticket(generation: state.generation, appends: state.appends) }
    }

    /// Keeps `issuances` (read from the database after `ticket` was taken) unless they may miss a
    /// later commit.
    func fill(_ customer: Customer, _ issuances: [LedgerIssuance], readAfter ticket: Ticket) {
        state.withLock { state in
            guard state.generation == ticket.generation, state.entries[customer] == nil,
                state.lastAppend[customer, default: 0] <= ticket.appends
            else { return }
            if max(state.entries.count, state.lastAppend.count) >= capacity { state.clear(); return }
            state.entries[customer] = issuances
        }
    }

    /// Records the issuances of a committed append.
    func committed(_ batch: [AuditAppend]) {
        state.withLock { state in
            for append in batch {
                for signature in append.signatures {
                    guard let token = signature.appAccountToken else { continue }
                    let customer = Customer(bundleID: signature.bundleID, appAccountToken: token)
                    state.appends &+= 1
                    state.lastAppend[customer] = state.appends
                    // Not a ledger issuance (see `LedgerIssuance.pageViewClient`): nothing to add.
                    guard signature.client != LedgerIssuance.pageViewClient, signature.format != LedgerIssuance.introEligibilityFormat, var issuances = state.entries[customer] else { continue }
                    // The database keeps milliseconds.
                    let issuance = LedgerIssuance(
                        offerID: signature.offerID,
                        issuedAt: Date(timeIntervalSince1970: Double(signature.issuedAt.unixMilliseconds) / 1000))
                    // DISTINCT (offer_id, issued_at), offer IDs compared by bytes as SQLite does.
                    guard !issuances.contains(where: { $0.issuedAt == issuance.issuedAt && UTF8Bytes.equal($0.offerID, issuance.offerID) })
                    else { continue }
                    let index = issuances.lastIndex { $0.issuedAt <= issuance.issuedAt }.map { $0 + 1 } ?? 0
                    issuances.insert(issuance, at: index)
                    state.entries[customer] = issuances
                }
            }
            if max(state.entries.count, state.lastAppend.count) > capacity { state.clear() }
        }
    }

    /// Forgets everything (an append whose outcome is unknown, rows inserted in bulk).
    func clear() {
        state.withLock { $0.clear() }
    }
}
