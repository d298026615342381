import Foundation

/// Reads the common shape of a signing request without `JSONDecoder`, which was about 7% of
/// the server's CPU per signature.
///
/// Rule: it answers only for bodies it can read exactly as `JSONDecoder` would, and gives up
/// (`nil`) on everything else, so the decoder still decides every unusual or bad body and
/// gives the same error it always did. It accepts a JSON object whose members are among
/// `productID`, `offerID`, `appAccountToken`, `bundleID`, `transactionID` (strings),
/// `formats` (an array of strings) and `environment` (one of Apple's four spellings, read as a
/// static string: nothing allocated), each at most once, with `productID` and `offerID`
/// present, strings of printable ASCII without escapes, and JSON whitespace anywhere JSON
/// allows it. Any other `environment` (the controller refuses it), `evidence`, `null`, escapes,
/// non-ASCII text, numbers, duplicates, unknown members and trailing bytes all go to the decoder.
enum SignatureRequestPlainReader {
    static func read(_ body: Data) -> SignatureRequest? {
        body.withUnsafeBytes { bytes in
            var reader = Cursor(bytes: bytes)
            return reader.request()
        }
    }

    /// The members read so far.
    private struct Members {
        var productID, offerID, appAccountToken, bundleID, transactionID: String?
        var formats: [String]?
        var environment: String?
    }

    private enum Member {
        case string(WritableKeyPath<Members, String?>)
        case formats
        case environment

        init?(_ name: UnsafeRawBufferPointer) {
            switch name.count {
            case 7 where name.elementsEqual("offerID".utf8): self = .string(\.offerID)
            case 7 where name.elementsEqual("formats".utf8): self = .formats
            case 8 where name.elementsEqual("bundleID".utf8): self = .string(\.bundleID)
            case 9 where name.elementsEqual("productID".utf8): self = .string(\.productID)
            case 11 where name.elementsEqual("environment".utf8): self = .environment
            case 13 where name.elementsEqual("transactionID".utf8): self = .string(\.transactionID)
            case 15 where name.elementsEqual("appAccountToken".utf8): self = .string(\.appAccountToken)
            default: return nil
            }
        }
    }

    private struct Cursor: JSONByteScanning {
        let bytes: UnsafeRawBufferPointer
        var index = 0

        init(bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

        mutating func request() -> SignatureRequest? {
            skipWhitespace()
            guard take(UInt8(ascii: "{")) else { return nil }
            var members = Members()
            skipWhitespace()
            if !take(UInt8(ascii: "}")) {
                while true {
                    guard let name = rawString(), let member = Member(name) else { return nil }
                    skipWhitespace()
                    guard take(UInt8(ascii: ":")) else { return nil }
                    skipWhitespace()
                    // A member seen twice goes to the decoder.
                    switch member {
                    case .formats:
                        guard members.formats == nil, let value = stringArray() else { return nil }
                        members.formats = value
                    case .environment:
                        guard members.environment == nil, let name = rawString(), let value = Self.environment(name) else { return nil }
                        members.environment = value
                    case .string(let field):
                        guard members[keyPath: field] == nil, let value = string() else { return nil }
                        members[keyPath: field] = value
                    }
                    skipWhitespace()
                    if take(UInt8(ascii: "}")) { break }
                    guard take(UInt8(ascii: ",")) else { return nil }
                    skipWhitespace()
                }
            }
            skipWhitespace()
            guard index == bytes.count, let productID = members.productID, let offerID = members.offerID else { return nil }
            return SignatureRequest(
                productID: productID, offerID: offerID, appAccountToken: members.appAccountToken, bundleID: members.bundleID,
                formats: members.formats, transactionID: members.transactionID, environment: members.environment)
        }

        /// Apple's spelling of an environment as a string literal (no allocation), or nil.
        static func environment(_ name: UnsafeRawBufferPointer) -> String? {
            switch name.count {
            case 5 where name.elementsEqual("Xcode".utf8): return "Xcode"
            case 7 where name.elementsEqual("Sandbox".utf8): return "Sandbox"
            case 10 where name.elementsEqual("Production".utf8): return "Production"
            case 12 where name.elementsEqual("LocalTesting".utf8): return "LocalTesting"
            default: return nil
            }
        }

        /// `[` strings separated by commas `]`.
        mutating func stringArray() -> [String]? {
            guard take(UInt8(ascii: "[")) else { return nil }
            var values: [String] = []
            skipWhitespace()
            if take(UInt8(ascii: "]")) { return values }
            while true {
                guard let value = string() else { return nil }
                values.append(value)
                skipWhitespace()
                if take(UInt8(ascii: "]")) { return values }
                guard take(UInt8(ascii: ",")) else { return nil }
                skipWhitespace()
            }
        }

        mutating func string() -> String? {
            rawString().map { String(decoding: $0, as: UTF8.self) }
        }

        /// The bytes between the quotes of a string of printable ASCII without escapes.
        mutating func rawString() -> UnsafeRawBufferPointer? {
            guard take(UInt8(ascii: "\"")) else { return nil }
            let start = index
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    let value = UnsafeRawBufferPointer(rebasing: bytes[start..<index])
                    index += 1
                    return value
                }
                // Escapes, control characters and non-ASCII text: the decoder's job.
                guard byte >= 0x20, byte < 0x7F, byte != UInt8(ascii: "\\") else { return nil }
                index += 1
            }
            return nil
        }
    }
}
