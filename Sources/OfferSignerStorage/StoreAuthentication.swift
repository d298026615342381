import Foundation

/// `offer-signer store authenticate`: the one-time upgrade of a store made by an earlier
/// offer-signer, whose registry rows carry no MACs and whose audit-signing key was generated
/// rather than derived from the master key.
///
/// Rules: the master key must be the store's (its check value); refused (`conflict`) once the
/// store's rows are authenticated. The audit step comes first: unless the stored key is already
/// the derived one (or nothing was ever signed), the chain must verify against the store's
/// checkpoints and the checkpoint file, if any; then the derived key replaces the stored one,
/// the store's checkpoints are signed again with it, the change is audited
/// (`audit.signing-key.derived`), and a checkpoint of the head is signed (and written to the
/// checkpoint file, started afresh since it named the old key). Then every key and client row
/// without a MAC gets its MAC and the marker that lets `serve` start is set, audited
/// (`registry.authenticated`). It vouches for every row it finds: run it on a store you trust.
public enum StoreAuthentication {
    public struct Outcome: Sendable {
        public var registry: RegistryAuthenticationSummary
        /// The audit-signing key before, when it was replaced (nil: it was the derived one already).
        public var previousAuditKeyFingerprint: String?
        public var auditKeyFingerprint: String
        /// Checkpoints signed again with the derived key.
        public var checkpointsSignedAgain: Int
        /// The checkpoint of the head signed after the key was replaced.
        public var checkpoint: AuditCheckpoint?
    }

    public static func run(
        store: any OfferSignerStore, masterKey: MasterKey, checkpointFile: LastCheckpointFile?, actor: String,
        progress: @escaping @Sendable (Int64) -> Void = { _ in }
    ) async throws -> Outcome {
        try await store.bindMasterKey(masterKey)
        let snapshot = try await store.registrySnapshot()
        guard !snapshot.rowsAuthenticated else { throw KeyRegistry.alreadyAuthenticated }
        let authenticator = masterKey.registryRows
        // A store made before MACs has none; one with valid MACs was authenticated, and its
        // marker was removed outside offer-signer: vouching for its other rows would bless them.
        guard !snapshot.keys.contains(where: authenticator.isAuthentic) && !snapshot.clients.contains(where: authenticator.isAuthentic) else {
            throw StoreError(
                .conflict,
                "rows of this store carry valid MACs already: it was authenticated, and its marker was removed outside offer-signer; a row without a valid MAC was not written by offer-signer, so nothing is authenticated")
        }
        let derived = AuditSigningKey.derived(from: masterKey)
        var outcome = Outcome(
            registry: RegistryAuthenticationSummary(keyIDs: [], clientNames: []), previousAuditKeyFingerprint: nil,
            auditKeyFingerprint: derived.publicKey.fingerprint, checkpointsSignedAgain: 0, checkpoint: nil)
        let stored = try await store.auditSigningPublicKey()
        let head = try await store.auditHead().count
        let checkpoints = try await store.checkpoints()
        if stored == derived.publicKey || (head == 0 && checkpoints.isEmpty) {
            _ = try await store.auditSigningKey(masterKey: masterKey)
        } else {
            if stored == nil && !checkpoints.isEmpty {
                throw StoreError(.conflict, "the store has checkpoints but no audit-signing key row to check them with (it was deleted); restore the store from a backup")
            }
            var trusted: AuditCheckpointSet?
            if let checkpointFile, let file = try checkpointFile.read() {
                trusted = AuditCheckpointSet(origin: "the checkpoint file '\(checkpointFile.path)'", publicKey: file.publicKey, checkpoints: file.checkpoints)
            }
            let report = try await store.verifyAudit(trusted: trusted, progressInterval: 100_000, progress: progress)
            guard report.isIntact else {
                throw StoreError(.conflict, "the audit chain does not verify, so its checkpoints are not moved to the derived key:\n\(report.description)")
            }
            let resigned = checkpoints.map { derived.checkpoint(sequence: $0.sequence, headHash: $0.headHash, at: $0.createdAt) }
            let entry = AuditEntry(kind: "audit.signing-key.derived", body: AuditBody.make([
                ("actor", actor), ("previousFingerprint", stored?.fingerprint), ("fingerprint", derived.publicKey.fingerprint),
                ("checkpointsSignedAgain", String(resigned.count)),
            ]))
            try await store.replaceAuditSigningKey(derived, masterKey: masterKey, resigned: resigned, entry: entry)
            // The file beside the master key named the previous key: it starts again from the head.
            if let checkpointFile, FileManager.default.fileExists(atPath: checkpointFile.path) {
                try? FileManager.default.removeItem(atPath: checkpointFile.path)
            }
            outcome.previousAuditKeyFingerprint = stored?.fingerprint
            outcome.checkpointsSignedAgain = resigned.count
            outcome.checkpoint = try await AuditCheckpointing.create(in: store, masterKey: masterKey, checkpointFile: checkpointFile)
        }
        outcome.registry = try await store.authenticateRegistry(authenticator: masterKey.registryRows, actor: actor)
        return outcome
    }
}
