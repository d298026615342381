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
/// (`registry.authenticated`), with the first registry manifest (``RegistryManifest``). It
/// vouches for every row it finds: run it on a store you trust.
///
/// The chain of an older store with records is verified against the off-machine checkpoints
/// export (`audit checkpoints export`, `--checkpoints-export`), which is required: the store's
/// own checkpoints were signed by a key kept in the same database. Without one, only an explicit
/// `trustExistingChain` (`--trust-existing-chain`) goes on, and says so in the audit log.
///
/// A store whose rows carry MACs but that has no manifest (made before manifests) gets its
/// first manifest over its rows as they are. A store whose manifest does not vouch for its rows
/// (or is older than the registry file's version) gets one only with `acceptRegistryRows`
/// (`--accept-registry-rows`), audited (`registry.manifest.written`).
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
        /// The version of the registry manifest written (nil: none was).
        public var manifestVersion: Int64?
    }

    /// The off-machine checkpoints export the chain must extend, and where it was read from.
    public struct CheckpointsExport: Sendable {
        public var origin: String
        public var file: AuditCheckpointsFile

        public init(origin: String, file: AuditCheckpointsFile) {
            self.origin = origin
            self.file = file
        }
    }

    public static func run(
        store: any OfferSignerStore, masterKey: MasterKey, checkpointFile: LastCheckpointFile?, registryFile: RegistryVersionFile? = nil,
        checkpointsExport: CheckpointsExport? = nil, trustExistingChain: Bool = false, acceptRegistryRows: Bool = false, actor: String,
        progress: @escaping @Sendable (Int64) -> Void = { _ in }
    ) async throws -> Outcome {
        // The registry file is written once the store has changed: one that cannot be stops this
        // before anything changes.
        if let checkpointFile { try registryFile?.checkDistinct(from: checkpointFile) }
        do {
            try registryFile?.checkWritable()
        } catch {
            throw StoreError(error.code, "\(error.message); give --registry-file PATH in a directory this process can write")
        }
        try await store.bindMasterKey(masterKey)
        let snapshot = try await store.registrySnapshot()
        let authenticator = try registryFile?.authenticator(masterKey) ?? masterKey.registryRows
        let upgraded = try await upgradeEvidence(store: store, masterKey: masterKey, authenticator: authenticator)
        if snapshot.rowsAuthenticated {
            return try await writeManifest(
                store: store, snapshot: snapshot, authenticator: authenticator, registryFile: registryFile, acceptRegistryRows: acceptRegistryRows,
                masterKey: masterKey, actor: actor, upgraded: upgraded)
        }
        // A store that was upgraded already and now has rows without MACs and no marker: they
        // were stripped outside offer-signer (and rows may have been added); vouching for them
        // would bless whatever is there.
        if let upgraded, !acceptRegistryRows {
            throw StoreError(.conflict, tamperedMessage("its key and client rows carry no MACs and its marker is gone, but \(upgraded)"))
        }
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
            let chainVouchedBy: String
            if let checkpointsExport {
                trusted = AuditCheckpointSet(
                    origin: checkpointsExport.origin, publicKey: checkpointsExport.file.publicKey, checkpoints: checkpointsExport.file.checkpoints)
                chainVouchedBy = checkpointsExport.origin
            } else if head > 0 && !trustExistingChain {
                throw StoreError(
                    .conflict,
                    "the audit log holds \(head) record(s), and the store's own checkpoints were signed by a key kept in the same database: give --checkpoints-export FILE (the file `offer-signer audit checkpoints export` wrote, kept off this machine) so the chain is verified against it, or --trust-existing-chain to vouch for the chain as the store holds it (recorded in the audit log)")
            } else {
                chainVouchedBy = head > 0 ? "trusted as found (--trust-existing-chain)" : "empty audit log"
                if let checkpointFile, let file = try checkpointFile.read() {
                    trusted = AuditCheckpointSet(origin: "the checkpoint file '\(checkpointFile.path)'", publicKey: file.publicKey, checkpoints: file.checkpoints)
                }
            }
            let report = try await store.verifyAudit(trusted: trusted, progressInterval: 100_000, progress: progress)
            guard report.isIntact else {
                throw StoreError(.conflict, "the audit chain does not verify, so its checkpoints are not moved to the derived key:\n\(report.description)")
            }
            let resigned = checkpoints.map { derived.checkpoint(sequence: $0.sequence, headHash: $0.headHash, at: $0.createdAt) }
            let entry = AuditEntry(kind: "audit.signing-key.derived", body: AuditBody.make([
                ("actor", actor), ("previousFingerprint", stored?.fingerprint), ("fingerprint", derived.publicKey.fingerprint),
                ("checkpointsSignedAgain", String(resigned.count)), ("chainVerifiedAgainst", chainVouchedBy),
            ]))
            // The file is replaced below: one that cannot be stops this before the store changes.
            try checkpointFile?.checkWritable()
            try await store.replaceAuditSigningKey(derived, masterKey: masterKey, resigned: resigned, entry: entry)
            // The file beside the master key named the previous key: it starts again from the head
            // (a file that cannot be removed is replaced by the checkpoint below).
            try? checkpointFile?.remove()
            outcome.previousAuditKeyFingerprint = stored?.fingerprint
            outcome.checkpointsSignedAgain = resigned.count
            outcome.checkpoint = try await AuditCheckpointing.create(in: store, masterKey: masterKey, checkpointFile: checkpointFile)
        }
        outcome.registry = try await store.authenticateRegistry(authenticator: authenticator, actor: actor)
        let written = try await store.registrySnapshot().manifest
        outcome.manifestVersion = written?.version
        if let written { try registryFile?.record(written.version) }
        return outcome
    }

    /// Why the store is known to have been upgraded already (nil: nothing says so): the registry
    /// file records a manifest version above 0, or the audit-signing key is the one derived from
    /// the master key and the audit log is not empty (every store this offer-signer made or
    /// upgraded; `registry.authenticated` and `registry.manifest.written` records come after
    /// the key is derived). On such a store a missing manifest or missing MACs is tampering.
    public static func upgradeEvidence(store: any OfferSignerStore, masterKey: MasterKey, authenticator: RegistryRowAuthenticator) async throws -> String? {
        if authenticator.manifestFloor > 0 {
            return "the registry file records manifest version \(authenticator.manifestFloor)"
        }
        if try await store.auditSigningPublicKey() == AuditSigningKey.derived(from: masterKey).publicKey, try await store.auditHead().count > 0 {
            return "its audit-signing key is the one derived from the master key and its audit log has records (it was made or upgraded by an offer-signer that authenticates registry rows)"
        }
        return nil
    }

    static func tamperedMessage(_ what: String) -> String {
        "the store's registry was tampered with: \(what). Restore the store from a backup, or, after checking every row with `keys list` and `clients list` (revoke what you do not recognise afterwards), give --accept-registry-rows to vouch for the rows as they are"
    }

    /// A store whose rows carry MACs: its first manifest, or (with `acceptRegistryRows`) one
    /// over its rows as they are when the stored one does not vouch for them.
    static func writeManifest(
        store: any OfferSignerStore, snapshot: RegistrySnapshot, authenticator: RegistryRowAuthenticator, registryFile: RegistryVersionFile?,
        acceptRegistryRows: Bool, masterKey: MasterKey, actor: String, upgraded: String?
    ) async throws -> Outcome {
        let problem: String?
        if let manifest = snapshot.manifest {
            problem = RegistryManifest.problem(stored: manifest, entries: snapshot.manifestEntries, authenticator: authenticator)
                ?? (manifest.version < authenticator.manifestFloor
                    ? "its manifest is version \(manifest.version), below version \(authenticator.manifestFloor) in the registry file (it was rolled back)" : nil)
        } else if let upgraded {
            problem = "it has no registry manifest, but \(upgraded)"
        } else {
            problem = nil
        }
        let reason: String
        if snapshot.manifest == nil && problem == nil {
            reason = "first manifest of a store made before registry manifests"
        } else if let problem {
            guard acceptRegistryRows else {
                throw StoreError(
                    .conflict,
                    "the store's registry does not match its manifest: \(problem). Restore the store from a backup, or, after checking every row with `keys list` and `clients list` (revoke what you do not recognise afterwards), give --accept-registry-rows to vouch for the rows as they are")
            }
            reason = "rows accepted as they are (--accept-registry-rows): \(problem)"
        } else {
            throw KeyRegistry.alreadyAuthenticated
        }
        let manifest = try await store.writeRegistryManifest(authenticator: authenticator, actor: actor, reason: reason)
        try registryFile?.record(manifest.version)
        return Outcome(
            registry: RegistryAuthenticationSummary(keyIDs: [], clientNames: []), previousAuditKeyFingerprint: nil,
            auditKeyFingerprint: AuditSigningKey.derived(from: masterKey).publicKey.fingerprint, checkpointsSignedAgain: 0, checkpoint: nil,
            manifestVersion: manifest.version)
    }
}
