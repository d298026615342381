import Foundation

/// Finds a JSON object member that appears twice, at any depth, in a request body.
///
/// Rule: a body that names a member twice (`{"productID": "a", "productID": "b"}`) is refused
/// (400 `duplicate_field`), never resolved by picking one. RFC 8259 leaves such objects'
/// meaning to the parser, and `JSONDecoder` keeps one of the values without saying so; a
/// proxy or the app's backend that reads the other value would then see a different request
/// from the one that is signed.
///
/// Names are compared as `JSONDecoder` compares them: after unescaping, as Swift strings
/// (`"a"` and `"\u0061"` are the same member). The scan only looks for duplicates: a body that
/// is not well-formed JSON gives `nil`, and the decoder reports what is wrong with it.
/// It is iterative, so deep nesting cannot exhaust the stack.
enum JSONDuplicateMembers {
    /// The path of the first member that repeats a name already used in the same object
    /// (`productID`, `evidence.signedTransactions`, `items[2].name`), or `nil` when there is none
    /// or the body is not well-formed JSON.
    static func first(in body: Data) -> String? {
        body.withUnsafeBytes { bytes in
            var scanner = Scanner(bytes: bytes)
            return scanner.firstDuplicate()
        }
    }

    /// An open object or array, and where in it the scan is.
    private enum Container {
        /// The names seen so far, the last of them the member whose value is being read.
        case object(names: Set<String>, current: String)
        /// The position of the element being read.
        case array(index: Int)

        /// Whether this is an object, answered without binding a copy of its names (a live copy
        /// would make the next insertion copy the whole set).
        var isObject: Bool {
            if case .object = self { return true }
            return false
        }
    }

    private struct Scanner: JSONByteScanning {
        let bytes: UnsafeRawBufferPointer
        var index = 0
        var stack: [Container] = []

        init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        /// Walks the document once. `nil` on a clean document and on a malformed one.
        mutating func firstDuplicate() -> String? {
            skipWhitespace()
            // Each round reads one value, then finds the next slot of the enclosing containers,
            // closing those that end.
            document: while true {
                guard index < bytes.count else { return nil }
                switch bytes[index] {
                case UInt8(ascii: "{"):
                    index += 1
                    skipWhitespace()
                    if !take(UInt8(ascii: "}")) {
                        stack.append(.object(names: [], current: ""))
                        if let end = member() { return end.duplicate }
                        continue document
                    }
                case UInt8(ascii: "["):
                    index += 1
                    skipWhitespace()
                    if !take(UInt8(ascii: "]")) {
                        stack.append(.array(index: 0))
                        skipWhitespace()
                        continue document
                    }
                case UInt8(ascii: "\""):
                    guard skipString() else { return nil }
                default:
                    guard skipScalar() else { return nil }
                }
                // A value ended.
                nextSlot: while true {
                    skipWhitespace()
                    // The whole document was read (trailing bytes are the decoder's to refuse).
                    guard let isObject = stack.last?.isObject else { return nil }
                    if take(isObject ? UInt8(ascii: "}") : UInt8(ascii: "]")) {
                        stack.removeLast()
                        continue nextSlot
                    }
                    guard take(UInt8(ascii: ",")) else { return nil }
                    skipWhitespace()
                    if isObject {
                        if let end = member() { return end.duplicate }
                    } else if case .array(let position) = stack[stack.count - 1] {
                        stack[stack.count - 1] = .array(index: position + 1)
                    }
                    continue document
                }
            }
        }

        /// Where a scan ended early: at a duplicate (its path), or at a malformed member (nil).
        private struct End {
            var duplicate: String?
        }

        /// Reads `"name" :` inside the object on top of the stack and records the name there;
        /// the scan's end when the name repeats one of that object's or the member is malformed,
        /// nil to go on.
        private mutating func member() -> End? {
            guard let name = string() else { return End(duplicate: nil) }
            skipWhitespace()
            guard take(UInt8(ascii: ":")) else { return End(duplicate: nil) }
            skipWhitespace()
            // Taken off the stack while it changes, so the set is not copied for every member.
            guard case .object(var names, _) = stack.removeLast() else { return End(duplicate: nil) }
            let isNew = names.insert(name).inserted
            stack.append(.object(names: names, current: name))
            return isNew ? nil : End(duplicate: path())
        }

        /// Where the scan is: member names joined by dots, array positions in brackets
        /// (`evidence.signedTransactions`, `items[2].name`, `[0].a`).
        private func path() -> String {
            var path = ""
            for container in stack {
                switch container {
                case .object(_, let current): path += path.isEmpty ? current : ".\(current)"
                case .array(let index): path += "[\(index)]"
                }
            }
            return path
        }

        /// A string's value, unescaped; `nil` when it is not a well-formed JSON string.
        private mutating func string() -> String? {
            guard take(UInt8(ascii: "\"")) else { return nil }
            var utf8: [UInt8] = []
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                switch byte {
                case UInt8(ascii: "\""):
                    return String(validating: utf8, as: UTF8.self)
                case UInt8(ascii: "\\"):
                    guard index < bytes.count else { return nil }
                    let escape = bytes[index]
                    index += 1
                    switch escape {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): utf8.append(escape)
                    case UInt8(ascii: "b"): utf8.append(0x08)
                    case UInt8(ascii: "f"): utf8.append(0x0C)
                    case UInt8(ascii: "n"): utf8.append(0x0A)
                    case UInt8(ascii: "r"): utf8.append(0x0D)
                    case UInt8(ascii: "t"): utf8.append(0x09)
                    case UInt8(ascii: "u"):
                        guard let scalar = unicodeEscape() else { return nil }
                        utf8.append(contentsOf: String(Character(scalar)).utf8)
                    default: return nil
                    }
                case 0x00..<0x20:
                    return nil
                default:
                    utf8.append(byte)
                }
            }
            return nil
        }

        /// The scalar of `XXXX` after `\u` (and of a following `\uXXXX` low surrogate).
        private mutating func unicodeEscape() -> Unicode.Scalar? {
            guard let high = hex4() else { return nil }
            if (0xD800..<0xDC00).contains(high) {
                guard take(UInt8(ascii: "\\")), take(UInt8(ascii: "u")), let low = hex4(), (0xDC00..<0xE000).contains(low) else { return nil }
                return Unicode.Scalar(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))
            }
            return Unicode.Scalar(high)
        }

        private mutating func hex4() -> UInt32? {
            guard index + 4 <= bytes.count else { return nil }
            var value: UInt32 = 0
            for _ in 0..<4 {
                let byte = bytes[index]
                index += 1
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: return nil
                }
                value = value << 4 | UInt32(digit)
            }
            return value
        }

        /// Skips a string value (its content cannot make a duplicate).
        private mutating func skipString() -> Bool {
            guard take(UInt8(ascii: "\"")) else { return false }
            while index < bytes.count {
                let byte = bytes[index]
                index += 1
                if byte == UInt8(ascii: "\"") { return true }
                if byte == UInt8(ascii: "\\") { index += 1 }
            }
            return false
        }

        /// Skips a number, `true`, `false` or `null`: the bytes up to the next delimiter.
        private mutating func skipScalar() -> Bool {
            let start = index
            while index < bytes.count {
                switch bytes[index] {
                case UInt8(ascii: ","), UInt8(ascii: "}"), UInt8(ascii: "]"), 0x20, 0x09, 0x0A, 0x0D:
                    return index > start
                case UInt8(ascii: "{"), UInt8(ascii: "["), UInt8(ascii: "\""), UInt8(ascii: ":"):
                    return false
                default:
                    index += 1
                }
            }
            return index > start
        }
    }
}
