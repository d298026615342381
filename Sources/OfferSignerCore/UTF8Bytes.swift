import Foundation

/// Strings compared and hashed by their UTF-8 bytes, as SQLite and PostgreSQL compare text and
/// as a JWS is signed: Swift's own `String` equality is Unicode canonical equivalence
/// ("caf\u{E9}" equals "cafe\u{301}"), which is not what a store key or a signed text means.
/// Native strings are compared with `memcmp` and hashed in one call, not byte by byte.
public enum UTF8Bytes {
    /// Whether `a` and `b` are the same bytes.
    public static func equal(_ a: String, _ b: String) -> Bool {
        let (left, right) = (a.utf8, b.utf8)
        guard left.count == right.count else { return false }
        let fast = left.withContiguousStorageIfAvailable { l in
            right.withContiguousStorageIfAvailable { r in
                l.isEmpty || memcmp(l.baseAddress!, r.baseAddress!, l.count) == 0
            }
        }
        if let fast, let fast { return fast }
        return left.elementsEqual(right)
    }

    /// Feeds the bytes of `text` to `hasher` (equal bytes, equal hashes), or only its last
    /// `lastBytes` bytes when given.
    public static func hash(_ text: String, lastBytes: Int = .max, into hasher: inout Hasher) {
        let done: Void? = text.utf8.withContiguousStorageIfAvailable {
            hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: $0.suffix(lastBytes))))
        }
        if done == nil { for byte in text.utf8.suffix(lastBytes) { hasher.combine(byte) } }
    }
}
