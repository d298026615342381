import Crypto
import Foundation
import SwiftASN1
import X509

/// A stand-in for Apple's App Store signing chain, for tests: root → intermediate (with Apple's
/// intermediate marker OID 1.2.840.113635.100.6.2.1) → leaf (with the leaf marker OID
/// 1.2.840.113635.100.6.11.1), all P-256. It signs JWS exactly like the App Store does:
/// header `{"alg":"ES256","x5c":[leaf, intermediate, root]}` (standard base64 DER), base64url parts,
/// raw r‖s signature. Pass `chain.root` as a trusted root to `AppleSignedDataVerifier`.
///
/// The one copy every test target uses (the test-support target `AppleTestChain`).
public struct TestAppleChain: Sendable {
    public let rootKey: P256.Signing.PrivateKey
    public let root: Certificate
    public let intermediateKey: P256.Signing.PrivateKey
    public let intermediate: Certificate
    public let leafKey: P256.Signing.PrivateKey
    public let leaf: Certificate

    public static let leafMarkerOID: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 11, 1]
    public static let intermediateMarkerOID: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 2, 1]

    /// Default validity: 2020-01-01 ... 2040-01-01.
    public static let defaultNotBefore = Date(timeIntervalSince1970: 1_577_836_800)
    public static let defaultNotAfter = Date(timeIntervalSince1970: 2_208_988_800)

    /// A fresh chain with a new root.
    public init(
        rootName: String = "Test Apple Root CA",
        markerOIDs: Bool = true,
        leafNotBefore: Date = TestAppleChain.defaultNotBefore,
        leafNotAfter: Date = TestAppleChain.defaultNotAfter
    ) throws {
        let rootKey = P256.Signing.PrivateKey()
        let rootDN = try DistinguishedName {
            CommonName(rootName)
            OrganizationName("Offer Signer Tests")
        }
        let root = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(rootKey.publicKey),
            notValidBefore: Self.defaultNotBefore,
            notValidAfter: Self.defaultNotAfter,
            issuer: rootDN,
            subject: rootDN,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: Certificate.PublicKey(rootKey.publicKey))
            },
            issuerPrivateKey: Certificate.PrivateKey(rootKey)
        )
        try self.init(
            rootKey: rootKey, root: root, markerOIDs: markerOIDs,
            leafNotBefore: leafNotBefore, leafNotAfter: leafNotAfter)
    }

    /// A new intermediate and leaf under an existing root (e.g. a trusted root, but without marker OIDs).
    public init(
        rootKey: P256.Signing.PrivateKey,
        root: Certificate,
        markerOIDs: Bool = true,
        leafNotBefore: Date = TestAppleChain.defaultNotBefore,
        leafNotAfter: Date = TestAppleChain.defaultNotAfter
    ) throws {
        let intermediateKey = P256.Signing.PrivateKey()
        let intermediateDN = try DistinguishedName {
            CommonName("Test Apple Worldwide Developer Relations CA")
            OrganizationName("Offer Signer Tests")
        }
        let intermediate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(intermediateKey.publicKey),
            notValidBefore: Self.defaultNotBefore,
            notValidAfter: Self.defaultNotAfter,
            issuer: root.subject,
            subject: intermediateDN,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                // Key identifiers, as Apple's certificates have them (OpenSSL's strict mode, which
                // Apple's libraries use, wants them).
                SubjectKeyIdentifier(hash: Certificate.PublicKey(intermediateKey.publicKey))
                AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: Certificate.PublicKey(rootKey.publicKey)).keyIdentifier)
                if markerOIDs {
                    Certificate.Extension(oid: Self.intermediateMarkerOID, critical: false, value: [0x05, 0x00])
                }
            },
            issuerPrivateKey: Certificate.PrivateKey(rootKey)
        )
        let leafKey = P256.Signing.PrivateKey()
        let leaf = try Self.makeLeaf(
            key: leafKey, issuer: intermediate.subject, issuerKey: intermediateKey, markerOID: markerOIDs,
            notBefore: leafNotBefore, notAfter: leafNotAfter)
        self.rootKey = rootKey
        self.root = root
        self.intermediateKey = intermediateKey
        self.intermediate = intermediate
        self.leafKey = leafKey
        self.leaf = leaf
    }

    private init(copying chain: TestAppleChain, leafKey: P256.Signing.PrivateKey, leaf: Certificate) {
        self.rootKey = chain.rootKey
        self.root = chain.root
        self.intermediateKey = chain.intermediateKey
        self.intermediate = chain.intermediate
        self.leafKey = leafKey
        self.leaf = leaf
    }

    /// The same chain but with a self-signed leaf (same subject, marker OID included): a forgery.
    public func withSelfSignedLeaf() throws -> TestAppleChain {
        let key = P256.Signing.PrivateKey()
        let dn = try DistinguishedName {
            CommonName("Prod ECC Mac App Store and iTunes Store Receipt Signing")
            OrganizationName("Offer Signer Tests")
        }
        let leaf = try Self.makeLeaf(
            key: key, issuer: dn, issuerKey: key, markerOID: true,
            notBefore: Self.defaultNotBefore, notAfter: Self.defaultNotAfter)
        return TestAppleChain(copying: self, leafKey: key, leaf: leaf)
    }

    private static func makeLeaf(
        key: P256.Signing.PrivateKey,
        issuer: DistinguishedName,
        issuerKey: P256.Signing.PrivateKey,
        markerOID: Bool,
        notBefore: Date,
        notAfter: Date
    ) throws -> Certificate {
        let leafDN = try DistinguishedName {
            CommonName("Prod ECC Mac App Store and iTunes Store Receipt Signing")
            OrganizationName("Offer Signer Tests")
        }
        return try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore,
            notValidAfter: notAfter,
            issuer: issuer,
            subject: leafDN,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                AuthorityKeyIdentifier(keyIdentifier: SubjectKeyIdentifier(hash: Certificate.PublicKey(issuerKey.publicKey)).keyIdentifier)
                if markerOID {
                    Certificate.Extension(oid: Self.leafMarkerOID, critical: false, value: [0x05, 0x00])
                }
            },
            issuerPrivateKey: Certificate.PrivateKey(issuerKey)
        )
    }

    /// Standard base64 of a certificate's DER, as in `x5c`.
    public static func base64DER(_ certificate: Certificate) throws -> String {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return Data(serializer.serializedBytes).base64EncodedString()
    }

    /// `x5c` as Apple sends it: leaf, intermediate, root.
    public func x5c() throws -> [String] {
        try [leaf, intermediate, root].map(Self.base64DER)
    }

    /// Signs `payload` (JSON bytes) as a compact JWS, like the App Store.
    public func signJWS(payload: Data, alg: String = "ES256", x5c: [String]? = nil) throws -> String {
        let header: [String: Any] = ["alg": alg, "x5c": try x5c ?? self.x5c()]
        let headerData = try JSONSerialization.data(withJSONObject: header, options: [.sortedKeys])
        let signingInput = Self.base64URL(headerData) + "." + Self.base64URL(payload)
        let signature = try leafKey.signature(for: Data(signingInput.utf8))
        return signingInput + "." + Self.base64URL(signature.rawRepresentation)
    }

    /// Signs a JSON object payload.
    public func signJWS(_ payload: [String: Any], alg: String = "ES256", x5c: [String]? = nil) throws -> String {
        try signJWS(payload: JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys]), alg: alg, x5c: x5c)
    }

    public static func base64URL(_ data: some DataProtocol) -> String {
        Data(data).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// Milliseconds since 1970, as in Apple payloads.
    public static func milliseconds(_ date: Date) -> Int64 {
        Int64((date.timeIntervalSince1970 * 1000).rounded())
    }
}
