/// A minimal DER reader: just enough to identify what a PKCS#8 or SPKI structure holds
/// (algorithm and curve) so that a wrong key gets a precise error before swift-crypto sees it.
struct DERReader {
    struct Element {
        var tag: UInt8
        var content: ArraySlice<UInt8>
    }

    private var bytes: ArraySlice<UInt8>

    init<Bytes: Collection>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        self.bytes = ArraySlice(bytes)
    }

    var isAtEnd: Bool { bytes.isEmpty }

    /// Reads the next tag-length-value element.
    mutating func next() -> Element? {
        guard let tag = bytes.popFirst(), let first = bytes.popFirst() else { return nil }
        var length = 0
        if first & 0x80 == 0 {
            length = Int(first)
        } else {
            let count = Int(first & 0x7F)
            guard count > 0, count <= 4, bytes.count >= count else { return nil }
            for _ in 0..<count { length = (length << 8) | Int(bytes.removeFirst()) }
        }
        guard length <= bytes.count else { return nil }
        let content = bytes.prefix(length)
        bytes = bytes.dropFirst(length)
        return Element(tag: tag, content: content)
    }

    static let sequence: UInt8 = 0x30
    static let integer: UInt8 = 0x02
    static let objectIdentifier: UInt8 = 0x06
    static let octetString: UInt8 = 0x04
    static let bitString: UInt8 = 0x03

    /// Dotted-decimal form of an OBJECT IDENTIFIER's content octets.
    static func dottedOID(_ content: ArraySlice<UInt8>) -> String? {
        var arcs: [UInt64] = []
        var value: UInt64 = 0
        for byte in content {
            value = (value << 7) | UInt64(byte & 0x7F)
            if byte & 0x80 == 0 {
                if arcs.isEmpty {
                    let first = min(value / 40, 2)
                    arcs.append(first)
                    arcs.append(value - first * 40)
                } else {
                    arcs.append(value)
                }
                value = 0
            }
        }
        guard !arcs.isEmpty else { return nil }
        return arcs.map(String.init).joined(separator: ".")
    }
}

/// The algorithm named by a PKCS#8 `PrivateKeyInfo` or an X.509 `SubjectPublicKeyInfo`.
struct KeyAlgorithmIdentifier: Equatable {
    var algorithmOID: String
    var parameterOID: String?

    static let ecPublicKey = "1.2.840.10045.2.1"
    static let p256 = "1.2.840.10045.3.1.7"

    /// A human name for what the identifier says the key is.
    var humanName: String {
        switch algorithmOID {
        case Self.ecPublicKey:
            switch parameterOID {
            case Self.p256: return "an EC P-256 key"
            case "1.3.132.0.34": return "an EC P-384 key"
            case "1.3.132.0.35": return "an EC P-521 key"
            case "1.3.132.0.10": return "an EC secp256k1 key"
            case let other?: return "an EC key on curve \(other)"
            case nil: return "an EC key with no named curve"
            }
        case "1.2.840.113549.1.1.1": return "an RSA key"
        case "1.2.840.113549.1.1.10": return "an RSA-PSS key"
        case "1.3.101.112": return "an Ed25519 key"
        case "1.3.101.113": return "an Ed448 key"
        case "1.3.101.110": return "an X25519 key"
        case "1.2.840.10040.4.1": return "a DSA key"
        default: return "a key of algorithm \(algorithmOID)"
        }
    }

    /// Parses the `AlgorithmIdentifier` SEQUENCE content.
    init?(sequenceContent: ArraySlice<UInt8>) {
        var reader = DERReader(sequenceContent)
        guard let oid = reader.next(), oid.tag == DERReader.objectIdentifier,
            let dotted = DERReader.dottedOID(oid.content)
        else { return nil }
        algorithmOID = dotted
        if let parameter = reader.next(), parameter.tag == DERReader.objectIdentifier {
            parameterOID = DERReader.dottedOID(parameter.content)
        } else {
            parameterOID = nil
        }
    }

    /// Reads the algorithm of a PKCS#8 `PrivateKeyInfo` (version, algorithm, key).
    init?(pkcs8 der: [UInt8]) {
        var outer = DERReader(der)
        guard let info = outer.next(), info.tag == DERReader.sequence else { return nil }
        var fields = DERReader(info.content)
        guard let version = fields.next(), version.tag == DERReader.integer,
            let algorithm = fields.next(), algorithm.tag == DERReader.sequence
        else { return nil }
        self.init(sequenceContent: algorithm.content)
    }

    /// Reads the algorithm of an X.509 `SubjectPublicKeyInfo` (algorithm, key bits).
    init?(subjectPublicKeyInfo der: [UInt8]) {
        var outer = DERReader(der)
        guard let info = outer.next(), info.tag == DERReader.sequence else { return nil }
        var fields = DERReader(info.content)
        guard let algorithm = fields.next(), algorithm.tag == DERReader.sequence else { return nil }
        self.init(sequenceContent: algorithm.content)
    }
}
