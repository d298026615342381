import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Writes the histories fetched from Apple's App Store Server API to the store, off the request
/// path: a lookup hands its history over and goes on deciding.
///
/// Rules: at most `capacity` histories wait (when more arrive, the oldest waiting one is dropped
/// and counted: the next lookup of that customer fetches and hands it over again); a history
/// waits at most `gathering` for others to join it (unless `batchLimit` are waiting), then what
/// waits is written together, up to `batchLimit` histories a transaction; each write records the
/// redemptions the history shows (see ``OfferRedemption``); a failed write is logged and
/// counted, never retried (the next fetch carries the same history).
final class AppleHistoryRecorder: Service, Sendable {
    private let store: any OfferSignerStore
    private let metrics: ServerMetrics
    private let logger: Logger
    private let capacity: Int
    private let gathering: Duration
    private let pending = Mutex<[VerifiedHistory]>([])
    /// A customer's history fetched again mostly holds transactions written before.
    let converted = ConvertedTransactionCache()
    private let wakeUps: AsyncStream<Void>
    private let wakeUp: AsyncStream<Void>.Continuation

    /// Most histories written in one transaction.
    static let batchLimit = 64

    /// - Parameter gathering: how long a history waits for others to be written with it (each
    ///   transaction costs a sync of the store, whatever it holds).
    init(store: any OfferSignerStore, metrics: ServerMetrics, logger: Logger, capacity: Int = 1024, gathering: Duration = .milliseconds(20)) {
        self.store = store
        self.metrics = metrics
        self.logger = logger
        self.capacity = max(1, capacity)
        self.gathering = gathering
        (wakeUps, wakeUp) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Hands a fetched history over (never waits).
    func submit(_ history: VerifiedHistory) {
        let dropped = pending.withLock { pending -> Bool in
            pending.append(history)
            guard pending.count > capacity else { return false }
            pending.removeFirst()
            return true
        }
        if dropped { metrics.appleHistoryStored("dropped") }
        wakeUp.yield()
    }

    func run() async throws {
        await withGracefulShutdownHandler {
            for await _ in wakeUps {
                if gathering > .zero && pending.withLock({ $0.count }) < Self.batchLimit {
                    // Ends early when the service stops (the histories waiting are still written).
                    try? await Task.sleep(for: gathering)
                }
                // Whatever is waiting goes in transactions of up to `batchLimit` (one sync each).
                while true {
                    let batch = pending.withLock { pending -> [VerifiedHistory] in
                        let batch = Array(pending.prefix(Self.batchLimit))
                        pending.removeFirst(batch.count)
                        return batch
                    }
                    if batch.isEmpty { break }
                    await record(batch)
                }
            }
        } onGracefulShutdown: { [wakeUp] in
            wakeUp.finish()
        }
    }

    func record(_ histories: [VerifiedHistory]) async {
        do {
            let results = try await store.recordAppleHistories(histories.map { AppleHistoryConversion.update($0, converted: converted) }, at: Date())
            for result in results {
                metrics.appleHistoryStored("recorded")
                if case .recorded(let redemptions) = result {
                    for redemption in redemptions { metrics.offerRedeemed(redemption) }
                }
            }
        } catch {
            for _ in histories { metrics.appleHistoryStored("failed") }
            logger.warning("could not store histories fetched from Apple", metadata: ["count": "\(histories.count)", "error": "\(error)"])
        }
    }
}

/// The decoded form (`AppleSignedItem.decoded`) of transactions already converted for the store,
/// so a history fetched again is not encoded again.
///
/// Rule: an entry is found by the bytes of the transaction's JWS and served only for an equal
/// transaction decoded from that same JWS, so the stored form it returns is what encoding again
/// would give. (Keyed by the transaction alone it would not be: `String` equality is Unicode
/// canonical equivalence, so "caf\u{E9}" and "cafe\u{301}" are equal yet encode differently;
/// one JWS decodes to one set of bytes.) No JWS, no entry. At most `capacity` entries, all
/// forgotten when it is full.
final class ConvertedTransactionCache: Sendable {
    private struct Entry {
        var transaction: VerifiedTransaction
        var decoded: String
    }

    /// A JWS compared and hashed by its UTF-8 bytes (no Unicode normalization on the way).
    private struct JWSBytes: Hashable {
        var jws: String

        static func == (a: JWSBytes, b: JWSBytes) -> Bool { UTF8Bytes.equal(a.jws, b.jws) }

        /// Only the end is hashed: a JWS ends with its signature, different at every signing
        /// (ES256 signs with a fresh random nonce), so that is enough to tell entries apart, and
        /// equality still compares every byte.
        func hash(into hasher: inout Hasher) { UTF8Bytes.hash(jws, lastBytes: 64, into: &hasher) }
    }

    private let entries = Mutex<[JWSBytes: Entry]>([:])
    private let served = Atomic<Int>(0)
    let capacity: Int

    init(capacity: Int = 4096) {
        self.capacity = max(1, capacity)
    }

    /// How many conversions were served from the cache.
    var hits: Int { served.load(ordering: .relaxed) }

    func decoded(_ transaction: VerifiedTransaction, jws: String?) -> String? {
        guard let jws, !jws.isEmpty, let entry = entries.withLock({ $0[JWSBytes(jws: jws)] }), entry.transaction == transaction else { return nil }
        served.add(1, ordering: .relaxed)
        return entry.decoded
    }

    func remember(_ transaction: VerifiedTransaction, jws: String?, decoded: String) {
        guard let jws, !jws.isEmpty else { return }
        let key = JWSBytes(jws: jws)
        entries.withLock { entries in
            if entries.count >= capacity && entries[key] == nil { entries.removeAll(keepingCapacity: true) }
            entries[key] = Entry(transaction: transaction, decoded: decoded)
        }
    }
}
