/// The byte-level steps shared by the server's hand-written JSON readers
/// (`SignatureRequestPlainReader`, `JSONDuplicateMembers`): a position in a body and the two
/// moves every JSON grammar needs.
protocol JSONByteScanning {
    var bytes: UnsafeRawBufferPointer { get }
    var index: Int { get set }
}

extension JSONByteScanning {
    /// Steps over `byte` if it is next; `false` (and no move) otherwise.
    mutating func take(_ byte: UInt8) -> Bool {
        guard index < bytes.count, bytes[index] == byte else { return false }
        index += 1
        return true
    }

    /// Skips RFC 8259 whitespace: space, tab, line feed, carriage return.
    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }
}
