import Crypto
import Foundation
import OfferSignerCore

/// Operations on the key registry shared by the CLI and the server.
public enum KeyRegistry {
    /// Seals a key under the master key and adds it to the store (see
    /// ``OfferSignerStore/importKey(_:actor:reason:)`` for the state it gets).
    public static func importKey(
        _ key: InAppPurchaseKey, bundleID: String, issuerID: String?, development: Bool, into store: any OfferSignerStore,
        masterKey: MasterKey, actor: String, reason: String?, now: Date = Date()
    ) async throws -> SigningKeyRecord {
        try await store.bindMasterKey(masterKey)
        let record = SigningKeyRecord(
            keyID: key.keyID, bundleID: bundleID, issuerID: issuerID, state: .ready,
            origin: development ? "development" : "app-store-connect", publicKeyPEM: key.publicKey.pemRepresentation,
            fingerprint: key.publicKeyFingerprint, importedAt: now,
            sealedPrivateKey: masterKey.seal(key.pkcs8PEMRepresentation, context: key.keyID))
        return try await store.importKey(record, actor: actor, reason: reason, authenticator: masterKey.registryRows)
    }

    /// Refused by `authenticateRegistry` once the store's rows carry MACs.
    public static let alreadyAuthenticated = StoreError(
        .conflict,
        "the store's registry rows are authenticated already; a row without a valid MAC was not written by offer-signer (see `keys list`, `clients list` and the server log)")

    /// Rule: a key whose row (or whose bundle's active key's row, which activation retires) does
    /// not carry a valid MAC can only be revoked: any other transition would give a row changed
    /// outside offer-signer a valid MAC.
    public static func checkRowsBeforeTransition(
        key: SigningKeyRecord, previousActive: SigningKeyRecord?, to state: SigningKeyState, authenticator: RegistryRowAuthenticator
    ) throws(StoreError) {
        guard state != .revoked else { return }
        var rows = [key]
        if state == .active, let previousActive { rows.append(previousActive) }
        for row in rows where !authenticator.isAuthentic(row) {
            throw StoreError(
                .conflict,
                "the row of key '\(row.keyID)' has no valid MAC under this master key (it was changed outside offer-signer, or the store needs `offer-signer store authenticate`); it can only be revoked")
        }
    }

    /// The audit entry of `store authenticate`.
    public static func authenticationAuditEntry(_ summary: RegistryAuthenticationSummary, actor: String) -> AuditEntry {
        AuditEntry(kind: "registry.authenticated", body: AuditBody.make([
            ("actor", actor), ("keyIDs", summary.keyIDs.joined(separator: " ")), ("clients", summary.clientNames.joined(separator: " ")),
        ]))
    }

    /// RFC 3339 UTC with milliseconds.
    public static func timestamp(_ date: Date?) -> String? { date.map { Date.rfc3339(milliseconds: $0.unixMilliseconds) } }

    /// A key as JSON for `keys list --json`: never the private key.
    public static func json(_ key: SigningKeyRecord) -> String {
        var writer = JSONObjectWriter()
        writer.field("keyID", key.keyID)
        writer.field("bundleID", key.bundleID)
        writer.field("issuerID", key.issuerID)
        writer.field("state", key.state.rawValue)
        writer.field("origin", key.origin)
        writer.field("fingerprint", key.fingerprint)
        writer.field("publicKeyPEM", key.publicKeyPEM)
        writer.field("importedAt", timestamp(key.importedAt))
        writer.field("activatedAt", timestamp(key.activatedAt))
        writer.field("retiredAt", timestamp(key.retiredAt))
        writer.field("revokedAt", timestamp(key.revokedAt))
        return writer.finish()
    }
}

extension StoreError {
    /// Same as ``description``.
    public var localizedMessage: String { message }
}
