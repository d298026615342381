import Crypto
import Foundation

/// An App Store Connect In-App Purchase key: an ECDSA P-256 private key and the key ID
/// App Store Connect shows beside it.
///
/// Rule: only an unencrypted PKCS#8 PEM holding a P-256 key is accepted (what a `.p8`
/// download is); anything else is refused with an ``OfferSignerError`` that says what was
/// found. The private key never appears in `description`, errors or logs.
public struct InAppPurchaseKey: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The key ID App Store Connect assigned (or a development ID for generated keys).
    public let keyID: String
    /// The signing key.
    public let privateKey: P256.Signing.PrivateKey

    /// Wraps an existing private key.
    public init(keyID: String, privateKey: P256.Signing.PrivateKey) throws(OfferSignerError) {
        try OfferFieldValidator.validateIdentifier(keyID, field: "keyID")
        self.keyID = keyID
        self.privateKey = privateKey
    }

    /// Parses the contents of a `.p8` file.
    public init(keyID: String, pemRepresentation: String) throws(OfferSignerError) {
        try self.init(keyID: keyID, privateKey: Self.parsePrivateKey(pem: pemRepresentation))
    }

    /// A fresh random key, for development and tests only: it is not issued by Apple and
    /// StoreKit will reject signatures made with it.
    public static func generateForDevelopment(keyID: String) throws(OfferSignerError) -> InAppPurchaseKey {
        try InAppPurchaseKey(keyID: keyID, privateKey: P256.Signing.PrivateKey())
    }

    /// The public half.
    public var publicKey: P256.Signing.PublicKey { privateKey.publicKey }

    /// The key as a PKCS#8 PEM (label `PRIVATE KEY`), the `.p8` format. Secret.
    public var pkcs8PEMRepresentation: String { privateKey.pemRepresentation }

    /// Lowercase hex SHA-256 of the public key's DER `SubjectPublicKeyInfo`.
    public var publicKeyFingerprint: String { Self.fingerprint(of: publicKey) }

    public var description: String { "InAppPurchaseKey(keyID: \(keyID), publicKeySHA256: \(publicKeyFingerprint))" }
    public var debugDescription: String { description }

    /// Lowercase hex SHA-256 of a public key's DER `SubjectPublicKeyInfo`.
    public static func fingerprint(of publicKey: P256.Signing.PublicKey) -> String {
        Encoding.hex(SHA256.hash(data: publicKey.derRepresentation))
    }

    /// Parses a PKCS#8 PEM private key, refusing anything but an unencrypted P-256 key.
    public static func parsePrivateKey(pem: String) throws(OfferSignerError) -> P256.Signing.PrivateKey {
        let document: PEMDocument
        do {
            document = try PEMDocument(text: pem)
        } catch {
            throw pemFailure(error, expected: "PRIVATE KEY")
        }
        switch document.label {
        case "PRIVATE KEY":
            break
        case "ENCRYPTED PRIVATE KEY":
            throw OfferSignerError(code: .keyEncrypted, message: "the key is an encrypted PKCS#8 key; App Store Connect keys are unencrypted: decrypt it with `openssl pkcs8 -in KEY -out KEY.p8` first")
        case "EC PRIVATE KEY":
            if document.headers.contains(where: { $0.contains("ENCRYPTED") }) {
                throw OfferSignerError(code: .keyEncrypted, message: "the key is an encrypted SEC1 EC key; App Store Connect keys are unencrypted PKCS#8")
            }
            throw OfferSignerError(code: .keyNotPKCS8, message: "found a SEC1 'EC PRIVATE KEY', expected PKCS#8 'PRIVATE KEY' as App Store Connect issues; convert with `openssl pkcs8 -topk8 -nocrypt -in KEY -out KEY.p8`")
        case "RSA PRIVATE KEY":
            throw OfferSignerError(code: .keyUnsupportedAlgorithm, message: "found an RSA private key; In-App Purchase keys are ECDSA P-256")
        default:
            throw OfferSignerError(code: .keyNotPKCS8, message: "found a PEM '\(document.label)' block, expected 'PRIVATE KEY' (a PKCS#8 .p8 from App Store Connect)")
        }
        guard let algorithm = KeyAlgorithmIdentifier(pkcs8: document.der) else {
            throw OfferSignerError(code: .keyMalformed, message: "the PEM 'PRIVATE KEY' block does not hold a PKCS#8 structure")
        }
        try requireP256(algorithm)
        do {
            return try P256.Signing.PrivateKey(derRepresentation: document.der)
        } catch {
            throw OfferSignerError(code: .keyMalformed, message: "the PKCS#8 P-256 key is damaged and cannot be read")
        }
    }

    /// Parses a public key: a SubjectPublicKeyInfo PEM (`-----BEGIN PUBLIC KEY-----`) holding a
    /// P-256 key.
    public static func parsePublicKey(pem: String) throws(OfferSignerError) -> P256.Signing.PublicKey {
        let document: PEMDocument
        do {
            document = try PEMDocument(text: pem)
        } catch {
            throw pemFailure(error, expected: "PUBLIC KEY")
        }
        guard document.label == "PUBLIC KEY" else {
            throw OfferSignerError(code: .keyNotPKCS8, message: "found a PEM '\(document.label)' block, expected 'PUBLIC KEY'")
        }
        guard let algorithm = KeyAlgorithmIdentifier(subjectPublicKeyInfo: document.der) else {
            throw OfferSignerError(code: .keyMalformed, message: "the PEM 'PUBLIC KEY' block does not hold a SubjectPublicKeyInfo structure")
        }
        try requireP256(algorithm)
        do {
            return try P256.Signing.PublicKey(derRepresentation: document.der)
        } catch {
            throw OfferSignerError(code: .keyMalformed, message: "the P-256 public key is damaged and cannot be read")
        }
    }

    /// Reads a verification key from PEM text that holds either a `.p8` private key or a
    /// public key.
    public static func parseVerificationKey(pem: String) throws(OfferSignerError) -> P256.Signing.PublicKey {
        if pem.contains("-----BEGIN PUBLIC KEY-----") {
            return try parsePublicKey(pem: pem)
        }
        return try parsePrivateKey(pem: pem).publicKey
    }

    private static func requireP256(_ algorithm: KeyAlgorithmIdentifier) throws(OfferSignerError) {
        guard algorithm.algorithmOID == KeyAlgorithmIdentifier.ecPublicKey else {
            throw OfferSignerError(code: .keyUnsupportedAlgorithm, message: "found \(algorithm.humanName); In-App Purchase keys are ECDSA P-256")
        }
        guard algorithm.parameterOID == KeyAlgorithmIdentifier.p256 else {
            throw OfferSignerError(code: .keyUnsupportedCurve, message: "found \(algorithm.humanName); In-App Purchase keys are ECDSA P-256 (prime256v1)")
        }
    }

    private static func pemFailure(_ failure: PEMDocument.Failure, expected: String) -> OfferSignerError {
        switch failure {
        case .notPEM:
            return OfferSignerError(code: .keyNotPEM, message: "no '-----BEGIN \(expected)-----' PEM block found; a .p8 from App Store Connect is PEM text")
        case .unterminated(let label):
            return OfferSignerError(code: .keyMalformed, message: "the PEM '\(label)' block has no matching END line")
        case .badBase64(let label):
            return OfferSignerError(code: .keyMalformed, message: "the PEM '\(label)' block is not valid Base64")
        }
    }
}

extension P256.Signing.PublicKey {
    /// Lowercase hex SHA-256 of the DER `SubjectPublicKeyInfo`.
    public var offerSignerFingerprint: String { InAppPurchaseKey.fingerprint(of: self) }
}
