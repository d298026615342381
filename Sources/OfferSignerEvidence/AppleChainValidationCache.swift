import Crypto
import Foundation
import Synchronization
import X509

/// Remembers certificate chains (leaf, intermediate) that were found to lead to a trusted root
/// with Apple's marker OIDs, so the same chain is not validated again for every signed item.
///
/// Rules: an entry is keyed by the SHA-256 of the x5c entries exactly as sent (leaf,
/// intermediate, root) and of the trusted roots, and holds the leaf's public key; only the time
/// check depends on when the item was signed, so a hit still requires the signing time to be
/// inside every certificate's validity period (the latest `notBefore` to the earliest `notAfter`
/// of the validated chain); at most `capacity` chains are kept (the oldest is dropped first). A
/// hit skips parsing and validation, never the signature check.
///
/// A chain that failed validation is remembered apart, with its failure, under the same key (at
/// most `failureCapacity`, the oldest dropped first), so a forged chain sent again costs a hash,
/// not a certificate-signature verification; failures that depend on the signing time (a
/// certificate of the chain expired or not yet valid, or a trusted root outside its validity at
/// that time) are not remembered. Only failures are remembered there: a key in it is never
/// trusted.
public final class AppleChainValidationCache: Sendable {
    struct Validity {
        var notBefore: Date
        var notAfter: Date
        var leafKey: P256.Signing.PublicKey
    }

    /// A JOSE header as decoded: the fields the verifier reads.
    struct DecodedHeader: Sendable {
        var alg: String?
        var x5c: [String]?
    }

    private let capacity: Int
    private let failureCapacity: Int
    private let failures = Mutex<(entries: [SHA256Digest: AppleSignedDataVerifier.VerificationFailure], order: [SHA256Digest])>(([:], []))
    private let state = Mutex<(entries: [SHA256Digest: Validity], order: [SHA256Digest])>(([:], []))
    /// Headers decoded before, by their exact base64url text: Apple signs every item with the same
    /// header (algorithm and x5c chain), several kilobytes that would be decoded for each one.
    /// Holds only what decoding that text gives, so a hit changes no check.
    private let headers = Mutex<[String: DecodedHeader]>([:])

    public init(capacity: Int = 64, failureCapacity: Int = 4096) {
        self.capacity = max(1, capacity)
        self.failureCapacity = max(1, failureCapacity)
    }

    /// The failure of a chain that failed before.
    func failure(_ key: SHA256Digest) -> AppleSignedDataVerifier.VerificationFailure? {
        failures.withLock { $0.entries[key] }
    }

    func rememberFailure(_ key: SHA256Digest, _ failure: AppleSignedDataVerifier.VerificationFailure) {
        failures.withLock { failures in
            if failures.entries.updateValue(failure, forKey: key) == nil { failures.order.append(key) }
            if failures.order.count > failureCapacity {
                let excess = failures.order.count - failureCapacity
                for dropped in failures.order.prefix(excess) { failures.entries.removeValue(forKey: dropped) }
                failures.order.removeFirst(excess)
            }
        }
    }

    /// Failed chains remembered (for tests and metrics).
    public var failureCount: Int { failures.withLock { $0.entries.count } }

    static func key(x5c: [String], rootsDigest: [UInt8]) -> SHA256Digest {
        var hasher = SHA256()
        for entry in x5c {
            hasher.update(data: withUnsafeBytes(of: UInt64(entry.utf8.count).bigEndian) { Array($0) })
            hasher.update(data: Array(entry.utf8))
        }
        hasher.update(data: rootsDigest)
        return hasher.finalize()
    }

    /// The leaf's key when the chain was validated before and `time` is inside its validity.
    func leafKey(_ key: SHA256Digest, at time: Date) -> P256.Signing.PublicKey? {
        state.withLock { state in
            guard let validity = state.entries[key], validity.notBefore <= time, time <= validity.notAfter else { return nil }
            return validity.leafKey
        }
    }

    func remember(_ key: SHA256Digest, chain: [Certificate], leafKey: P256.Signing.PublicKey) {
        guard let notBefore = chain.map(\.notValidBefore).max(), let notAfter = chain.map(\.notValidAfter).min() else { return }
        state.withLock { state in
            if state.entries.updateValue(Validity(notBefore: notBefore, notAfter: notAfter, leafKey: leafKey), forKey: key) == nil {
                state.order.append(key)
            }
            while state.order.count > capacity {
                state.entries.removeValue(forKey: state.order.removeFirst())
            }
        }
    }

    /// The header decoded before from exactly `text`.
    func header(_ text: String) -> DecodedHeader? {
        headers.withLock { $0[text] }
    }

    /// Remembers what `text` decodes to; at most `capacity` headers (all forgotten when full).
    func rememberHeader(_ text: String, _ header: DecodedHeader) {
        headers.withLock { headers in
            if headers.count >= capacity { headers.removeAll(keepingCapacity: true) }
            headers[text] = header
        }
    }

    /// Chains remembered (for tests and metrics).
    public var count: Int { state.withLock { $0.entries.count } }
}
