import Foundation

enum Base64URL {
    /// Strict base64url decoding (RFC 7515 §2: URL-safe alphabet, no padding, no whitespace).
    /// Works on bytes: no String bridging (Foundation's string replacement costs more than the
    /// signature check on Linux).
    static func decode(_ text: Substring) -> Data? {
        decode(text.utf8)
    }

    static func decode(_ text: some Collection<UInt8>) -> Data? {
        var standard: [UInt8] = []
        standard.reserveCapacity(text.count + 3)
        for byte in text {
            guard isBase64URLByte(byte) else { return nil }
            standard.append(byte == UInt8(ascii: "-") ? UInt8(ascii: "+") : byte == UInt8(ascii: "_") ? UInt8(ascii: "/") : byte)
        }
        guard standard.count % 4 != 1 else { return nil }
        while standard.count % 4 != 0 { standard.append(UInt8(ascii: "=")) }
        return Data(base64Encoded: Data(standard))
    }

    /// The text before a JWS's first `.` (its protected header), found with `memchr`; nil when
    /// there is no `.` or the string is not contiguous UTF-8.
    static func headerPart(_ jws: String) -> Substring? {
        let utf8 = jws.utf8
        let offset = utf8.withContiguousStorageIfAvailable { bytes -> Int? in
            guard let base = bytes.baseAddress, let found = memchr(base, Int32(UInt8(ascii: ".")), bytes.count) else { return nil }
            return base.distance(to: found.assumingMemoryBound(to: UInt8.self))
        }
        guard let offset, let offset else { return nil }
        return Substring(utf8[utf8.startIndex..<utf8.index(utf8.startIndex, offsetBy: offset)])
    }

    /// The three parts of a compact JWS, split on `.` over its bytes (nil unless exactly three).
    static func compactParts(_ jws: String) -> [Substring]? {
        let utf8 = jws.utf8
        let dot = UInt8(ascii: ".")
        // One pass over contiguous bytes (a native string's always are); no index array.
        let offsets = utf8.withContiguousStorageIfAvailable { bytes -> (Int, Int)? in
            var found: [Int] = []
            found.reserveCapacity(2)
            var position = bytes.startIndex
            while let next = bytes[position...].firstIndex(of: dot) {
                guard found.count < 2 else { return nil }
                found.append(next)
                position = next + 1
            }
            return found.count == 2 ? (found[0], found[1]) : nil
        }
        let first: String.UTF8View.Index
        let second: String.UTF8View.Index
        if let offsets {
            guard let (firstOffset, secondOffset) = offsets else { return nil }
            first = utf8.index(utf8.startIndex, offsetBy: firstOffset)
            second = utf8.index(utf8.startIndex, offsetBy: secondOffset)
        } else {
            let dots = utf8.indices.filter { utf8[$0] == dot }
            guard dots.count == 2 else { return nil }
            (first, second) = (dots[0], dots[1])
        }
        return [
            Substring(utf8[utf8.startIndex..<first]), Substring(utf8[utf8.index(after: first)..<second]),
            Substring(utf8[utf8.index(after: second)...]),
        ]
    }

    private static func isBase64URLByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "_"):
            return true
        default:
            return false
        }
    }
}
