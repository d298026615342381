import Crypto
import Foundation

/// The master key that seals private keys at rest (AES-256-GCM).
///
/// Rules: it is 32 bytes, supplied by a file or the environment and never stored beside the
/// store; each sealed key is bound to its key ID (as authenticated data), so a sealed blob
/// cannot be moved to another key's row.
public struct MasterKey: Sendable {
    private let key: SymmetricKey

    public init(bytes: some ContiguousBytes) throws(StoreError) {
        let count = bytes.withUnsafeBytes { $0.count }
        guard count == 32 else { throw StoreError(.masterKeyMismatch, "the master key must be 32 bytes; got \(count)") }
        key = SymmetricKey(data: bytes)
    }

    /// Reads a master key from text: 32 bytes as Base64 (44 characters) or hex (64), with
    /// surrounding whitespace ignored.
    public init(text: String) throws(StoreError) {
        let trimmed = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if trimmed.count == 64, let bytes = Self.hexBytes(trimmed) {
            try self.init(bytes: bytes)
        } else if let data = Data(base64Encoded: trimmed) {
            try self.init(bytes: data)
        } else {
            throw StoreError(.masterKeyMismatch, "the master key must be 32 bytes written as Base64 or hex")
        }
    }

    /// A new random master key.
    public static func generate() -> (key: MasterKey, base64: String) {
        let bytes = SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) }
        // 32 bytes is always accepted.
        return (try! MasterKey(bytes: bytes), bytes.base64EncodedString())
    }

    /// Seals a secret, bound to `context` (the key ID).
    public func seal(_ secret: String, context: String) -> Data {
        do {
            return try AES.GCM.seal(Data(secret.utf8), using: key, authenticating: Data(context.utf8)).combined!
        } catch {
            preconditionFailure("AES-GCM sealing failed: \(error)")
        }
    }

    /// Opens a sealed secret; fails when the master key or the context differ.
    public func open(_ sealed: Data, context: String) throws(StoreError) -> String {
        do {
            let box = try AES.GCM.SealedBox(combined: sealed)
            return String(decoding: try AES.GCM.open(box, using: key, authenticating: Data(context.utf8)), as: UTF8.self)
        } catch {
            throw StoreError(.masterKeyMismatch, "the sealed private key of '\(context)' cannot be opened with this master key")
        }
    }

    /// The MAC key of registry rows (see ``RegistryRowAuthenticator``), derived with HKDF.
    public var registryRows: RegistryRowAuthenticator { RegistryRowAuthenticator(masterKeyMaterial: key) }

    /// 32 bytes derived from the master key with HKDF-SHA256 and `label` (never the key itself).
    func derivedBytes(label: String) -> Data {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: key, info: Data(label.utf8), outputByteCount: 32).withUnsafeBytes { Data($0) }
    }

    /// A value that identifies the master key without revealing it (HMAC of a fixed label),
    /// stored so a wrong master key is reported at start-up.
    public var checkValue: String {
        Data(HMAC<SHA256>.authenticationCode(for: Data("offer-signer master key check v1".utf8), using: key)).base64EncodedString()
    }

    private static func hexBytes(_ text: String) -> [UInt8]? {
        var bytes: [UInt8] = []
        var index = text.startIndex
        while index < text.endIndex {
            let next = text.index(index, offsetBy: 2)
            guard let byte = UInt8(text[index..<next], radix: 16) else { return nil }
            bytes.append(byte)
            index = next
        }
        return bytes
    }
}
