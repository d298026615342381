import Crypto
import Foundation
import OfferSignerCore

/// A signed statement: "the audit chain held `sequence` records and record `sequence` had hash
/// `headHash`, at `createdAt`".
///
/// Rule: the signature is ES256 (ECDSA P-256 over SHA-256, raw `r ‖ s`, base64url) over
/// ``canonicalBytes``, made with the store's audit-signing key — never an In-App Purchase key.
/// Exported off the machine, checkpoints make a rewritten chain (hashes recomputed after an
/// edit) or a truncated tail detectable up to the last exported checkpoint.
public struct AuditCheckpoint: Sendable, Equatable {
    /// The chain length the checkpoint vouches for (the sequence number of its head record).
    public var sequence: Int64
    /// The hash of record `sequence`.
    public var headHash: String
    /// When it was signed (millisecond precision).
    public var createdAt: Date
    /// Lowercase hex SHA-256 of the audit-signing public key's DER.
    public var keyFingerprint: String
    /// base64url raw `r ‖ s` (64 bytes).
    public var signature: String

    /// Names the format inside the signed bytes, so they can never be confused with anything else.
    public static let format = "offer-signer.audit-checkpoint.v1"

    public init(sequence: Int64, headHash: String, createdAt: Date, keyFingerprint: String, signature: String) {
        self.sequence = sequence
        self.headHash = headHash
        self.createdAt = Date(timeIntervalSince1970: Double(createdAt.unixMilliseconds) / 1000)
        self.keyFingerprint = keyFingerprint
        self.signature = signature
    }

    /// The bytes the signature covers: a compact JSON object with the fields in this order
    /// (`format`, `sequence`, `headHash`, `createdAt` in Unix milliseconds, `keyFingerprint`),
    /// no whitespace.
    public static func canonicalBytes(sequence: Int64, headHash: String, createdAtMillis: Int64, keyFingerprint: String) -> Data {
        var writer = JSONObjectWriter()
        writer.field("format", format)
        writer.field("sequence", sequence)
        writer.field("headHash", headHash)
        writer.field("createdAt", createdAtMillis)
        writer.field("keyFingerprint", keyFingerprint)
        return Data(writer.finish().utf8)
    }

    public var canonicalBytes: Data {
        Self.canonicalBytes(sequence: sequence, headHash: headHash, createdAtMillis: createdAt.unixMilliseconds, keyFingerprint: keyFingerprint)
    }

    /// One line of a checkpoints export.
    public var jsonLine: String {
        var writer = JSONObjectWriter()
        writer.field("type", "checkpoint")
        writer.field("sequence", sequence)
        writer.field("headHash", headHash)
        writer.field("createdAt", createdAt.unixMilliseconds)
        writer.field("keyFingerprint", keyFingerprint)
        writer.field("signature", signature)
        return writer.finish()
    }
}

/// The public half of the audit-signing key: what verifies checkpoints. Safe to print.
public struct AuditSigningPublicKey: Sendable, Equatable {
    public let key: P256.Signing.PublicKey
    /// `-----BEGIN PUBLIC KEY-----` PEM.
    public let pem: String
    /// Lowercase hex SHA-256 of the DER `SubjectPublicKeyInfo`.
    public let fingerprint: String

    public init(_ key: P256.Signing.PublicKey) {
        self.key = key
        pem = key.pemRepresentation
        fingerprint = InAppPurchaseKey.fingerprint(of: key)
    }

    /// Parses a PEM public key.
    public init(pem: String) throws(StoreError) {
        do {
            self.init(try P256.Signing.PublicKey(pemRepresentation: pem))
        } catch {
            throw StoreError(.conflict, "the audit-signing public key is not a P-256 PEM public key")
        }
    }

    public static func == (lhs: AuditSigningPublicKey, rhs: AuditSigningPublicKey) -> Bool { lhs.fingerprint == rhs.fingerprint }

    /// Whether the checkpoint names this key and its signature is valid.
    public func isValidSignature(of checkpoint: AuditCheckpoint) -> Bool {
        guard checkpoint.keyFingerprint == fingerprint,
            let raw = Encoding.decodeBase64URL(checkpoint.signature),
            let signature = try? P256.Signing.ECDSASignature(rawRepresentation: raw)
        else { return false }
        return key.isValidSignature(signature, for: checkpoint.canonicalBytes)
    }

    /// The first line of a checkpoints export.
    public var jsonLine: String {
        var writer = JSONObjectWriter()
        writer.field("type", "audit-signing-key")
        writer.field("format", AuditCheckpoint.format)
        writer.field("fingerprint", fingerprint)
        writer.field("publicKeyPEM", pem)
        return writer.finish()
    }
}

/// The key that signs audit checkpoints: derived from the master key (HKDF-SHA256, label
/// ``derivationLabel``, to a P-256 private key), so whoever holds the master key holds it and
/// nobody else can make it; the store keeps only its public key (and, for older readers, the
/// private key sealed under the master key).
///
/// Rules: it is never an In-App Purchase key, and the private key never appears in
/// descriptions, logs or errors; it is never created because a store row is missing (see
/// ``checkStored(publicKeyPEM:auditRecords:hasCheckpoints:)``).
public struct AuditSigningKey: Sendable, CustomStringConvertible {
    private let privateKey: P256.Signing.PrivateKey
    public let publicKey: AuditSigningPublicKey

    init(privateKey: P256.Signing.PrivateKey) {
        self.privateKey = privateKey
        publicKey = AuditSigningPublicKey(privateKey.publicKey)
    }

    /// A fresh random key (tests, and stores made before keys were derived).
    public static func generate() -> AuditSigningKey { AuditSigningKey(privateKey: P256.Signing.PrivateKey()) }

    /// The HKDF label the audit-signing key is derived with.
    public static let derivationLabel = "offer-signer audit checkpoint signing key v1"

    /// The audit-signing key of `masterKey`: 32 bytes from HKDF-SHA256 (label
    /// ``derivationLabel``) as the P-256 scalar; in the negligible case that they are not a
    /// valid scalar, the label with " #1", " #2"… is tried.
    public static func derived(from masterKey: MasterKey) -> AuditSigningKey {
        var attempt = 0
        while true {
            let label = attempt == 0 ? derivationLabel : "\(derivationLabel) #\(attempt)"
            if let key = try? P256.Signing.PrivateKey(rawRepresentation: masterKey.derivedBytes(label: label)) {
                return AuditSigningKey(privateKey: key)
            }
            attempt += 1
        }
    }

    /// Decides, from what a store holds, whether this (derived) key may sign its checkpoints;
    /// returns true when the store has no key row yet and one should be written.
    ///
    /// Rules: a stored public key must be this key (else it was replaced, or the store predates
    /// derived keys: `offer-signer store authenticate`); a missing row is written only for a
    /// store with no audit record and no checkpoint. When the audit log is not empty and the row
    /// is gone, it was deleted: signing now would vouch for whatever the chain holds, so this
    /// refuses (`conflict`).
    public func checkStored(publicKeyPEM: String?, auditRecords: Int64, hasCheckpoints: Bool) throws(StoreError) -> Bool {
        if let publicKeyPEM {
            let stored = try AuditSigningPublicKey(pem: publicKeyPEM)
            guard stored == publicKey else {
                throw StoreError(
                    .conflict,
                    "refusing to sign a checkpoint: the store's audit-signing key (\(stored.fingerprint)) is not the one derived from the master key (\(publicKey.fingerprint)); a store made by an earlier offer-signer is upgraded by `offer-signer store authenticate`, otherwise the key row was replaced: run `offer-signer audit verify --checkpoint-file …`")
            }
            return false
        }
        guard auditRecords == 0 && !hasCheckpoints else {
            throw StoreError(
                .conflict,
                "refusing to sign a checkpoint: the audit log holds \(auditRecords) record(s) but the store has no audit-signing key row (it was deleted); nothing will be signed over the chain as it now is: run `offer-signer audit verify --checkpoint-file …`")
        }
        return true
    }

    /// The sealing context (authenticated data) for a key with this fingerprint.
    static func sealContext(fingerprint: String) -> String { "audit-signing-key:\(fingerprint)" }

    /// Seals the private key under the master key.
    public func sealed(with masterKey: MasterKey) -> Data {
        masterKey.seal(privateKey.pemRepresentation, context: Self.sealContext(fingerprint: publicKey.fingerprint))
    }

    /// Opens a sealed key and checks it is the one `publicKeyPEM` names.
    public static func open(sealed: Data, publicKeyPEM: String, masterKey: MasterKey) throws(StoreError) -> AuditSigningKey {
        let publicKey = try AuditSigningPublicKey(pem: publicKeyPEM)
        let pem = try masterKey.open(sealed, context: sealContext(fingerprint: publicKey.fingerprint))
        guard let privateKey = try? P256.Signing.PrivateKey(pemRepresentation: pem) else {
            throw StoreError(.conflict, "the sealed audit-signing key is not a P-256 private key")
        }
        let key = AuditSigningKey(privateKey: privateKey)
        guard key.publicKey == publicKey else {
            throw StoreError(.conflict, "the stored audit-signing public key does not match its sealed private key")
        }
        return key
    }

    /// Signs a checkpoint of a chain whose record `sequence` has hash `headHash`.
    public func checkpoint(sequence: Int64, headHash: String, at time: Date = Date()) -> AuditCheckpoint {
        let millis = time.unixMilliseconds
        let bytes = AuditCheckpoint.canonicalBytes(sequence: sequence, headHash: headHash, createdAtMillis: millis, keyFingerprint: publicKey.fingerprint)
        let signature: P256.Signing.ECDSASignature
        do {
            signature = try privateKey.signature(for: bytes)
        } catch {
            preconditionFailure("ECDSA signing failed")
        }
        return AuditCheckpoint(
            sequence: sequence, headHash: headHash, createdAt: Date(timeIntervalSince1970: Double(millis) / 1000),
            keyFingerprint: publicKey.fingerprint, signature: Encoding.base64URL(signature.rawRepresentation))
    }

    public var description: String { "AuditSigningKey(publicKeySHA256: \(publicKey.fingerprint))" }
}

/// A checkpoints export: JSON lines, the first naming the audit-signing public key, then one
/// checkpoint per line.
public struct AuditCheckpointsFile: Sendable {
    public var publicKey: AuditSigningPublicKey
    public var checkpoints: [AuditCheckpoint]

    public init(publicKey: AuditSigningPublicKey, checkpoints: [AuditCheckpoint]) {
        self.publicKey = publicKey
        self.checkpoints = checkpoints
    }

    /// The file's text.
    public var text: String {
        var lines = [publicKey.jsonLine]
        lines += checkpoints.map(\.jsonLine)
        return lines.joined(separator: "\n") + "\n"
    }

    /// Why a file cannot be read.
    public struct Malformed: Error, Sendable, CustomStringConvertible {
        public var line: Int
        public var reason: String
        public var description: String { "line \(line): \(reason)" }
    }

    /// Parses an export. Blank lines are ignored.
    public init(text: String) throws(Malformed) {
        var key: AuditSigningPublicKey?
        var checkpoints: [AuditCheckpoint] = []
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            let trimmed = line.trimmingCharacters(in: .whitespacesAndNewlines)
            if trimmed.isEmpty { continue }
            guard let object = (try? JSONSerialization.jsonObject(with: Data(trimmed.utf8))) as? [String: Any] else {
                throw Malformed(line: number, reason: "not a JSON object")
            }
            switch object["type"] as? String {
            case "audit-signing-key":
                guard key == nil else { throw Malformed(line: number, reason: "a second audit-signing key") }
                guard let pem = object["publicKeyPEM"] as? String else { throw Malformed(line: number, reason: "publicKeyPEM is missing") }
                let parsed: AuditSigningPublicKey
                do { parsed = try AuditSigningPublicKey(pem: pem) } catch { throw Malformed(line: number, reason: error.message) }
                if let fingerprint = object["fingerprint"] as? String, fingerprint != parsed.fingerprint {
                    throw Malformed(line: number, reason: "fingerprint \(fingerprint) is not the SHA-256 of publicKeyPEM (\(parsed.fingerprint))")
                }
                key = parsed
            case "checkpoint":
                guard key != nil else { throw Malformed(line: number, reason: "a checkpoint before the audit-signing key line") }
                guard let sequence = (object["sequence"] as? NSNumber)?.int64Value, sequence > 0,
                    let headHash = object["headHash"] as? String,
                    let createdAt = (object["createdAt"] as? NSNumber)?.int64Value,
                    let fingerprint = object["keyFingerprint"] as? String,
                    let signature = object["signature"] as? String
                else { throw Malformed(line: number, reason: "a checkpoint needs sequence, headHash, createdAt, keyFingerprint and signature") }
                checkpoints.append(AuditCheckpoint(
                    sequence: sequence, headHash: headHash, createdAt: Date(timeIntervalSince1970: Double(createdAt) / 1000),
                    keyFingerprint: fingerprint, signature: signature))
            default:
                throw Malformed(line: number, reason: "unknown line type (expected \"audit-signing-key\" or \"checkpoint\")")
            }
        }
        guard let key else { throw Malformed(line: 1, reason: "no audit-signing key line; is this a checkpoints export?") }
        self.init(publicKey: key, checkpoints: checkpoints)
    }
}
