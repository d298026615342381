import Foundation
import OfferSignerEligibility
import Synchronization

/// Looked-up histories, for a short time.
///
/// Rules: an entry is served only before its expiry (`ttl` after it was stored); it is found by the
/// transaction ID it was asked for and by every original transaction ID it covers, for its app and
/// its filter (`HistoryFilter`): a filtered answer never serves a lookup with another filter or
/// none, while an unfiltered one (all of the history) serves a filtered lookup too;
/// `invalidate(originalTransactionID:)` removes every entry covering that ID, and a history looked
/// up before that call (its lookup began at an earlier ``generation``) is not stored for it
/// afterwards (a notification arriving while Apple was being asked makes that answer stale); at
/// most `capacity` entries are kept (expired ones go first, then the soonest to expire).
final class HistoryCache: Sendable {
    private struct Key: Hashable {
        var bundleID: String
        var transactionID: String
        /// The filter's query ("" unfiltered).
        var filter: String = ""
    }

    static func filterKey(_ filter: HistoryFilter?) -> String {
        (filter?.queryItems ?? []).map { $0.0 + "=" + $0.1 }.joined(separator: "&")
    }

    private struct Entry {
        var history: VerifiedHistory
        var expires: ContinuousClock.Instant
        var keys: [Key]
    }

    private struct State {
        var entries: [Int: Entry] = [:]
        var index: [Key: Int] = [:]
        var nextID = 0
        /// Counts invalidations.
        var generation: UInt64 = 0
        /// The generation of each original transaction ID's latest invalidation (recent ones).
        var invalidated: [String: UInt64] = [:]
        /// Invalidations before this generation were forgotten: a lookup older than it is not stored.
        var forgottenBefore: UInt64 = 0
    }

    /// How many invalidations are remembered for lookups still in flight (far more than can
    /// happen within one lookup's time budget).
    static let rememberedInvalidations = 50_000

    private let ttl: Duration
    private let capacity: Int
    private let state = Mutex(State())

    init(ttl: Duration, capacity: Int) {
        self.ttl = ttl
        self.capacity = max(1, capacity)
    }

    func history(bundleID: String, transactionID: String, filter: HistoryFilter? = nil, now: ContinuousClock.Instant = .now) -> VerifiedHistory? {
        let filterKey = Self.filterKey(filter)
        return state.withLock { state in
            // The answer to this filter, else the whole history (a superset).
            for key in Set([filterKey, ""]).sorted(by: >) {
                guard let id = state.index[Key(bundleID: bundleID, transactionID: transactionID, filter: key)], let entry = state.entries[id] else { continue }
                guard now < entry.expires else {
                    Self.remove(id, from: &state)
                    continue
                }
                return entry.history
            }
            return nil
        }
    }

    /// The current generation: take it before asking Apple, and pass it to `store`.
    var generation: UInt64 { state.withLock { $0.generation } }

    /// Stores a history looked up from `generation` on, unless one of the IDs it covers was
    /// invalidated since.
    func store(
        _ history: VerifiedHistory, bundleID: String, transactionID: String, filter: HistoryFilter? = nil, lookedUpAt generation: UInt64,
        now: ContinuousClock.Instant = .now
    ) {
        guard ttl > .zero else { return }
        let filterKey = Self.filterKey(filter)
        let keys = ([transactionID] + history.originalTransactionIDs.sorted()).map { Key(bundleID: bundleID, transactionID: $0, filter: filterKey) }
        state.withLock { state in
            if state.generation != generation,
                generation < state.forgottenBefore || keys.contains(where: { (state.invalidated[$0.transactionID] ?? 0) > generation }) {
                return
            }
            for key in keys { if let old = state.index[key] { Self.remove(old, from: &state) } }
            if state.entries.count >= capacity {
                for (id, entry) in state.entries where entry.expires <= now { Self.remove(id, from: &state) }
            }
            while state.entries.count >= capacity, let soonest = state.entries.min(by: { $0.value.expires < $1.value.expires })?.key {
                Self.remove(soonest, from: &state)
            }
            let id = state.nextID
            state.nextID += 1
            state.entries[id] = Entry(history: history, expires: now + ttl, keys: keys)
            for key in keys { state.index[key] = id }
        }
    }

    func invalidate(originalTransactionID: String) {
        state.withLock { state in
            state.generation += 1
            state.invalidated[originalTransactionID] = state.generation
            if state.invalidated.count > Self.rememberedInvalidations {
                let oldest = state.generation - UInt64(Self.rememberedInvalidations / 2)
                state.invalidated = state.invalidated.filter { $0.value > oldest }
                state.forgottenBefore = oldest + 1
            }
            let ids = Set(state.index.filter { $0.key.transactionID == originalTransactionID }.map(\.value))
            for id in ids { Self.remove(id, from: &state) }
        }
    }

    var count: Int { state.withLock { $0.entries.count } }

    private static func remove(_ id: Int, from state: inout State) {
        guard let entry = state.entries.removeValue(forKey: id) else { return }
        for key in entry.keys where state.index[key] == id { state.index.removeValue(forKey: key) }
    }
}
