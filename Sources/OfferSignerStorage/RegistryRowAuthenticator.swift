import Crypto
import Foundation
import OfferSignerCore

/// Authenticates the rows of the key registry (signing keys and API clients) with HMAC-SHA256
/// under a key derived from the master key (HKDF-SHA256, label
/// `offer-signer registry row MAC v1`; never the master key itself).
///
/// Rules: the MAC covers the row's table and identity (key ID, client ID) and every column that
/// grants or withholds the right to sign: for a key its bundle, issuer, state, origin, public
/// key, fingerprint, sealed private key and its import, activation, retirement and revocation
/// times; for a client its name, bundle IDs, secret hash, creation and revocation times. Each
/// field is length-prefixed (absent ones marked), so no value can be moved to another row or
/// column, or split differently, without the MAC failing. Only the holder of the master key
/// (the CLI, the store upgrade) writes MACs; a serving process only verifies them, when it loads
/// a registry snapshot, never per request. A row restored exactly as it was earlier (with its
/// earlier MAC), or deleted, is not detected by its MAC: the ``RegistryManifest`` (under a key
/// of its own, derived the same way) detects it.
public struct RegistryRowAuthenticator: Sendable {
    private let key: SymmetricKey
    let manifestKey: SymmetricKey
    /// The highest manifest version known outside the database (the ``RegistryVersionFile``):
    /// a change onto a stored manifest older than this is refused. 0: none known.
    public var manifestFloor: Int64 = 0

    /// The HKDF label (info) the MAC key is derived with.
    public static let derivationLabel = "offer-signer registry row MAC v1"

    init(masterKeyMaterial: SymmetricKey) {
        key = HKDF<SHA256>.deriveKey(inputKeyMaterial: masterKeyMaterial, info: Data(Self.derivationLabel.utf8), outputByteCount: 32)
        manifestKey = HKDF<SHA256>.deriveKey(inputKeyMaterial: masterKeyMaterial, info: Data(RegistryManifest.derivationLabel.utf8), outputByteCount: 32)
    }

    /// The MAC of a signing key row (base64).
    public func mac(for key: SigningKeyRecord) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Self.bytes(of: key), using: self.key)).base64EncodedString()
    }

    /// The MAC of an API client row (base64).
    public func mac(for client: APIClientRecord) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Self.bytes(of: client), using: key)).base64EncodedString()
    }

    /// Whether the key row carries a MAC and it verifies (compared in constant time).
    public func isAuthentic(_ record: SigningKeyRecord) -> Bool {
        guard let text = record.registryMAC, let mac = Data(base64Encoded: text) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: Self.bytes(of: record), using: key)
    }

    /// Whether the client row carries a MAC and it verifies (compared in constant time).
    public func isAuthentic(_ record: APIClientRecord) -> Bool {
        guard let text = record.registryMAC, let mac = Data(base64Encoded: text) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: Self.bytes(of: record), using: key)
    }

    /// The record with its MAC set.
    public func authenticated(_ record: SigningKeyRecord) -> SigningKeyRecord {
        var record = record
        record.registryMAC = mac(for: record)
        return record
    }

    /// The record with its MAC set.
    public func authenticated(_ record: APIClientRecord) -> APIClientRecord {
        var record = record
        record.registryMAC = mac(for: record)
        return record
    }

    static func bytes(of key: SigningKeyRecord) -> Data {
        var fields = Fields(table: "signing_keys")
        fields.append(key.keyID)
        fields.append(key.bundleID)
        fields.append(key.issuerID)
        fields.append(key.state.rawValue)
        fields.append(key.origin)
        fields.append(key.publicKeyPEM)
        fields.append(key.fingerprint)
        fields.append(key.sealedPrivateKey)
        fields.append(key.importedAt)
        fields.append(key.activatedAt)
        fields.append(key.retiredAt)
        fields.append(key.revokedAt)
        return fields.data
    }

    static func bytes(of client: APIClientRecord) -> Data {
        var fields = Fields(table: "api_clients")
        fields.append(client.clientID)
        fields.append(client.name)
        // As stored: one space between bundle IDs.
        fields.append(client.bundleIDs.joined(separator: " "))
        fields.append(client.secretHash)
        fields.append(client.createdAt)
        fields.append(client.revokedAt)
        return fields.data
    }

    /// Length-prefixed fields: a 4-byte big-endian length then the bytes; an absent value is
    /// the length 0xFFFFFFFF with no bytes.
    private struct Fields {
        var data = Data()

        init(table: String) {
            append(RegistryRowAuthenticator.derivationLabel)
            append(table)
        }

        mutating func append(_ bytes: Data?) {
            guard let bytes else {
                data.append(contentsOf: [0xFF, 0xFF, 0xFF, 0xFF])
                return
            }
            let count = UInt32(bytes.count)
            data.append(contentsOf: [UInt8(count >> 24), UInt8((count >> 16) & 0xFF), UInt8((count >> 8) & 0xFF), UInt8(count & 0xFF)])
            data.append(bytes)
        }

        mutating func append(_ text: String?) { append(text.map { Data($0.utf8) }) }

        /// Times as stored: Unix milliseconds, decimal.
        mutating func append(_ date: Date?) { append(date.map { String($0.unixMilliseconds) }) }
    }
}

/// What `offer-signer store authenticate` did.
public struct RegistryAuthenticationSummary: Sendable, Equatable {
    /// Key IDs whose rows were given a MAC.
    public var keyIDs: [String]
    /// Names of the clients whose rows were given a MAC.
    public var clientNames: [String]

    public init(keyIDs: [String], clientNames: [String]) {
        self.keyIDs = keyIDs
        self.clientNames = clientNames
    }
}
