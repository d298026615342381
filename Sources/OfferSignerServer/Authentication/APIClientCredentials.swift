import Crypto
import Foundation
import OfferSignerCore
import OfferSignerStorage

/// API keys for app backends.
///
/// Rules: a secret is `os_<clientID>_<43 base64url chars>` (256 random bits); only its SHA-256
/// is stored; a presented secret is matched by client ID, then its hash is compared in
/// constant time; revoked clients never authenticate.
public enum APIClientCredentials {
    public static let prefix = "os_"

    /// Creates a client and returns it with its secret (shown once, never stored). The row is
    /// stored with its MAC under `masterKey` (which must be the store's).
    public static func create(
        in store: any OfferSignerStore, name: String, bundleIDs: [String], actor: String, masterKey: MasterKey,
        authenticator: RegistryRowAuthenticator? = nil
    ) async throws -> (client: APIClientRecord, secret: String) {
        try OfferFieldValidator.validateIdentifier(name, field: "name")
        for bundleID in bundleIDs { try OfferFieldValidator.validateIdentifier(bundleID, field: "bundleID") }
        let clientID = Encoding.hex(SymmetricKey(size: .bits128).withUnsafeBytes { Array($0.prefix(6)) })
        let random = SymmetricKey(size: .bits256).withUnsafeBytes { Data($0) }
        let secret = "\(prefix)\(clientID)_\(Encoding.base64URL(random))"
        let client = APIClientRecord(clientID: clientID, name: name, bundleIDs: bundleIDs, secretHash: hash(secret), createdAt: Date())
        try await store.bindMasterKey(masterKey)
        return (try await store.createClient(client, actor: actor, authenticator: authenticator ?? masterKey.registryRows), secret)
    }

    /// Lowercase hex SHA-256 of a secret.
    public static func hash(_ secret: String) -> String {
        Encoding.hex(SHA256.hash(data: Data(secret.utf8)))
    }

    /// The client ID a secret claims to belong to, if it has the API-key shape.
    static func clientID(of secret: Substring) -> Substring? {
        // By UTF-8 bytes (`prefix` and `_` are ASCII): walking the `Character`s cost about
        // 7,000 instructions a request.
        let utf8 = secret.utf8
        guard utf8.starts(with: prefix.utf8) else { return nil }
        let rest = utf8.index(utf8.startIndex, offsetBy: prefix.utf8.count)
        guard let underscore = utf8[rest...].firstIndex(of: UInt8(ascii: "_")) else { return nil }
        return secret[rest..<underscore]
    }

    /// Finds the client a secret belongs to.
    static func authenticate(_ secret: Substring, clients: [String: APIClientRecord]) -> APIClientRecord? {
        guard let clientID = clientID(of: secret), let client = clients[String(clientID)] else { return nil }
        // Both sides are lowercase hex of a SHA-256, the form the store keeps: compare them as
        // they are, in constant time. The presented secret is hashed from its bytes in place.
        var secret = secret
        let digest = secret.withUTF8 { SHA256.hash(data: UnsafeRawBufferPointer($0)) }
        return constantTimeEquals(Array(Encoding.hex(digest).utf8), Array(client.secretHash.utf8)) ? client : nil
    }

    static func constantTimeEquals(_ lhs: [UInt8], _ rhs: [UInt8]) -> Bool {
        guard lhs.count == rhs.count else { return false }
        var difference: UInt8 = 0
        for index in lhs.indices { difference |= lhs[index] ^ rhs[index] }
        return difference == 0
    }
}
