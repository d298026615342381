import Crypto
import Foundation
import OfferSignerEligibility
import Synchronization

/// Apple signed items (transactions and renewal infos) that verified before, so the same JWS met
/// again (the next page of the same history, the same history asked about again, a stored history
/// read again) is neither checked nor decoded again.
///
/// Rules:
/// - An entry is keyed by the SHA-256 of the exact JWS text together with everything its
///   verification depended on: what it was verified as (transaction or renewal info), the bundle
///   ID, the accepted environments, the trusted roots (their DER) and the app's Apple ID (see
///   ``AppleSignedDataVerifier/init(trustedRoots:bundleID:environments:appAppleID:chainCache:verifiedItems:)``).
///   A JWS verified for one app, environment set or set of roots is never served for another; a
///   JWS that differs by one byte is a different key.
/// - Only successes are kept (a failure is never remembered here; failed chains have
///   ``AppleChainValidationCache``), and only those whose verification did not depend on "now":
///   items whose chain was validated at the time the payload states (`signedDate`, or
///   `receiptCreationDate`). That is what Apple's `SignedDataVerifier` does when online checks are
///   off (app-store-server-library-python, `signed_data_verifier.py`, `_decode_signed_object`:
///   `effective_date = time.time() if self._enable_online_checks or signed_date is None else
///   int(signed_date) // 1000`, with `signed_date` the `signedDate` or else the
///   `receiptCreationDate`), so the result of such a
///   verification is a function of the JWS, the roots, the bundle ID and the environments alone,
///   and holds at any later time. An item without a signing time is validated at `now` and is not
///   kept.
/// - At most `capacity` entries: two generations of at most `capacity / 2` each; a hit in the
///   older one moves the entry to the newer one, and when the newer one is full the older one is
///   dropped (the least recently used entries go first, approximately). Each operation costs one
///   dictionary access under a lock.
public final class AppleVerifiedItemCache: Sendable {
    /// What a JWS verified to.
    public enum Item: Sendable, Hashable {
        case transaction(VerifiedTransaction)
        case renewalInfo(VerifiedRenewalInfo)
    }

    /// What the cache has done since it was made.
    public struct Statistics: Sendable, Hashable {
        /// Items served from the cache (no signature checked).
        public var hits = 0
        /// Items verified in full and kept.
        public var stored = 0
        /// Items verified in full and not kept (validated at `now`: no signing time).
        public var notCacheable = 0

        public init(hits: Int = 0, stored: Int = 0, notCacheable: Int = 0) {
            self.hits = hits
            self.stored = stored
            self.notCacheable = notCacheable
        }
    }

    private struct Generations {
        var newer: [SHA256Digest: Item] = [:]
        var older: [SHA256Digest: Item] = [:]
        var statistics = Statistics()
    }

    /// Most entries kept.
    public let capacity: Int
    private let state = Mutex(Generations())

    public init(capacity: Int = 10_000) {
        self.capacity = max(2, capacity)
    }

    public var statistics: Statistics { state.withLock { $0.statistics } }

    /// The key of `jws` verified as `kind` in `scope` (a verifier's digest of what verification
    /// depends on).
    static func key(jws: String, kind: UInt8, scope: [UInt8]) -> SHA256Digest {
        var hasher = SHA256()
        hasher.update(data: scope)
        hasher.update(data: [kind])
        // The string's own bytes, not a copy of them.
        let done: Void? = jws.utf8.withContiguousStorageIfAvailable { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        if done == nil { hasher.update(data: Data(jws.utf8)) }
        return hasher.finalize()
    }

    func item(_ key: SHA256Digest) -> Item? {
        state.withLock { state in
            if let item = state.newer[key] {
                state.statistics.hits += 1
                return item
            }
            guard let item = state.older.removeValue(forKey: key) else { return nil }
            state.statistics.hits += 1
            insert(item, key, into: &state)
            return item
        }
    }

    func remember(_ item: Item, _ key: SHA256Digest) {
        state.withLock { state in
            state.statistics.stored += 1
            insert(item, key, into: &state)
        }
    }

    func noteNotCacheable() {
        state.withLock { $0.statistics.notCacheable += 1 }
    }

    private func insert(_ item: Item, _ key: SHA256Digest, into state: inout Generations) {
        if state.newer.count >= capacity / 2 {
            state.older = state.newer
            state.newer = [:]
            state.newer.reserveCapacity(capacity / 2)
        }
        state.newer[key] = item
    }
}
