import Crypto
import Foundation
import OfferSignerCore

/// Operations on the key registry shared by the CLI and the server.
public enum KeyRegistry {
    /// Seals a key under the master key and adds it to the store (see
    /// ``OfferSignerStore/importKey(_:actor:reason:)`` for the state it gets).
    public static func importKey(
        _ key: InAppPurchaseKey, bundleID: String, issuerID: String?, development: Bool, into store: any OfferSignerStore,
        masterKey: MasterKey, actor: String, reason: String?, now: Date = Date(), authenticator: RegistryRowAuthenticator? = nil
    ) async throws -> SigningKeyRecord {
        try await store.bindMasterKey(masterKey)
        let record = SigningKeyRecord(
            keyID: key.keyID, bundleID: bundleID, issuerID: issuerID, state: .ready,
            origin: development ? "development" : "app-store-connect", publicKeyPEM: key.publicKey.pemRepresentation,
            fingerprint: key.publicKeyFingerprint, importedAt: now,
            sealedPrivateKey: masterKey.seal(key.pkcs8PEMRepresentation, context: key.keyID))
        return try await store.importKey(record, actor: actor, reason: reason, authenticator: authenticator ?? masterKey.registryRows)
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

    /// A key transition as planned from the rows read (and locked) before it: the key and, on
    /// activation, the bundle's previous active key as they will be written, each with the MAC
    /// of the record as planned, never of a row read back after the update (which a concurrent
    /// writer could have changed).
    public struct PlannedTransition: Sendable {
        public var key: SigningKeyRecord
        public var retired: SigningKeyRecord?
        public var auditKind: String
    }

    /// Rules of `keys activate/retire/revoke`: a revoked key never comes back; retiring or
    /// revoking an app's only active key needs `force`; nothing goes back to `ready`; rows
    /// without a valid MAC can only be revoked (``checkRowsBeforeTransition``).
    public static func planTransition(
        key: SigningKeyRecord, previousActive: SigningKeyRecord?, to state: SigningKeyState, force: Bool, now: Date,
        authenticator: RegistryRowAuthenticator
    ) throws(StoreError) -> PlannedTransition {
        try checkRowsBeforeTransition(key: key, previousActive: previousActive, to: state, authenticator: authenticator)
        let keyID = key.keyID
        let now = Date(timeIntervalSince1970: Double(now.unixMilliseconds) / 1000)
        var updated = key
        var retired: SigningKeyRecord?
        let kind: String
        switch state {
        case .active:
            guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is revoked and can never sign again") }
            guard key.state != .active else { throw StoreError(.conflict, "key '\(keyID)' is already the active key of \(key.bundleID)") }
            if var previous = previousActive {
                previous.state = .retired
                previous.retiredAt = now
                retired = authenticator.authenticated(previous)
            }
            updated.state = .active
            updated.activatedAt = now
            updated.retiredAt = nil
            kind = "key.activated"
        case .retired:
            guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is revoked; it cannot be retired") }
            guard key.state != .retired else { throw StoreError(.conflict, "key '\(keyID)' is already retired") }
            if key.state == .active && !force {
                throw StoreError(.conflict, "key '\(keyID)' is the only active key of \(key.bundleID): retiring it stops all signing for that app; activate another key first, or pass --force")
            }
            updated.state = .retired
            updated.retiredAt = now
            kind = "key.retired"
        case .revoked:
            guard key.state != .revoked else { throw StoreError(.conflict, "key '\(keyID)' is already revoked") }
            if key.state == .active && !force {
                throw StoreError(.conflict, "key '\(keyID)' is the only active key of \(key.bundleID): revoking it stops all signing for that app; activate another key first, or pass --force")
            }
            updated.state = .revoked
            updated.revokedAt = now
            kind = "key.revoked"
        case .ready:
            throw StoreError(.conflict, "a key cannot be moved back to 'ready'")
        }
        return PlannedTransition(key: authenticator.authenticated(updated), retired: retired, auditKind: kind)
    }

    /// The audit entry of a planned transition.
    public static func transitionAuditEntry(
        _ plan: PlannedTransition, from key: SigningKeyRecord, previousActive: SigningKeyRecord?, actor: String, reason: String?
    ) -> AuditEntry {
        let newActive: SigningKeyRecord? = plan.key.state == .active ? plan.key : (plan.key.keyID == previousActive?.keyID ? nil : previousActive)
        let body = AuditBody.make([
            ("actor", actor), ("reason", reason), ("keyID", key.keyID), ("bundleID", key.bundleID),
            ("fromState", key.state.rawValue), ("toState", plan.key.state.rawValue),
            ("previousActiveKeyID", previousActive?.keyID), ("previousActiveFingerprint", previousActive?.fingerprint),
            ("newActiveKeyID", newActive?.keyID), ("newActiveFingerprint", newActive?.fingerprint),
        ])
        return AuditEntry(kind: plan.auditKind, body: body)
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
