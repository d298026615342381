import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer store authenticate`: the one-time upgrade of a store made by an earlier
/// offer-signer, whose registry rows carry no MACs and whose audit-signing key was generated
/// rather than derived from the master key.
///
/// Rules: it needs the store's master key (checked against the store's check value) and is
/// refused once the store's rows are authenticated. The audit step comes first: the chain must
/// verify against the store's checkpoints (and the checkpoint file, when there is one); then the
/// derived key replaces the stored one, the store's checkpoints are signed again with it, the
/// change is audited (`audit.signing-key.derived`) and a checkpoint of the head is signed (and
/// written to the checkpoint file). Then every key and client row without a MAC gets its MAC, the
/// marker that lets `serve` start is set, and the rows are audited (`registry.authenticated`).
/// Run it only on a store you trust as it is: it vouches for every row it finds.
struct StoreAuthenticateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "authenticate",
        abstract: "Upgrade a store made by an earlier offer-signer (once; serve refuses to start before): MAC its key and client rows under the master key and move its audit checkpoints to the key derived from it.",
        discussion: """
            Lists the rows it authenticates: check them with `keys list` and `clients list` first, since the command vouches \
            for every row without a MAC it finds. Checkpoint exports made before name the previous audit-signing key: \
            make a new export afterwards. Refused once the store's rows are authenticated.
            """
    )
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var checkpointFileOptions: CheckpointFileOptions
    @OptionGroup var actor: ActorOptions

    func run() async throws {
        let masterKey = try masterKey.load()
        let checkpointFile = checkpointFileOptions.resolve(masterKeyFile: self.masterKey.path)
        let store = try await store.open()
        do {
            try await store.bindMasterKey(masterKey)
            guard try await !store.registrySnapshot().rowsAuthenticated else { throw KeyRegistry.alreadyAuthenticated }
            try await adoptDerivedAuditKey(store, masterKey: masterKey, checkpointFile: checkpointFile)
            let summary = try await store.authenticateRegistry(authenticator: masterKey.registryRows, actor: actor.resolvedActor)
            await store.close()
            print("authenticated \(summary.keyIDs.count) key row(s)\(summary.keyIDs.isEmpty ? "" : ": " + summary.keyIDs.joined(separator: ", "))")
            print("authenticated \(summary.clientNames.count) client row(s)\(summary.clientNames.isEmpty ? "" : ": " + summary.clientNames.joined(separator: ", "))")
        } catch let error as StoreError {
            await store.close()
            throw CLIFailure(error.message)
        } catch {
            await store.close()
            throw error
        }
    }

    private func adoptDerivedAuditKey(_ store: any OfferSignerStore, masterKey: MasterKey, checkpointFile: LastCheckpointFile?) async throws {
        let derived = AuditSigningKey.derived(from: masterKey)
        let stored = try await store.auditSigningPublicKey()
        let head = try await store.auditHead().count
        let checkpoints = try await store.checkpoints()
        if stored == derived.publicKey || (head == 0 && checkpoints.isEmpty) {
            _ = try await store.auditSigningKey(masterKey: masterKey)
            return
        }
        if stored == nil && !checkpoints.isEmpty {
            throw CLIFailure("the store has checkpoints but no audit-signing key row to check them with (it was deleted); restore the store from a backup")
        }
        var trusted: AuditCheckpointSet?
        if let file = try checkpointFile?.read() {
            trusted = AuditCheckpointSet(origin: "the checkpoint file '\(checkpointFile?.path ?? "")'", publicKey: file.publicKey, checkpoints: file.checkpoints)
        }
        let report = try await store.verifyAudit(trusted: trusted, progressInterval: 100_000) { count in CLI.printNote("checked \(count) records…") }
        guard report.isIntact else {
            throw CLIFailure("the audit chain does not verify, so its checkpoints are not moved to the derived key:\n\(report.description)")
        }
        let resigned = checkpoints.map { derived.checkpoint(sequence: $0.sequence, headHash: $0.headHash, at: $0.createdAt) }
        let entry = AuditEntry(kind: "audit.signing-key.derived", body: AuditBody.make([
            ("actor", actor.resolvedActor), ("previousFingerprint", stored?.fingerprint), ("fingerprint", derived.publicKey.fingerprint),
            ("checkpointsSignedAgain", String(resigned.count)),
        ]))
        try await store.replaceAuditSigningKey(derived, masterKey: masterKey, resigned: resigned, entry: entry)
        // The file beside the master key named the previous key: it starts again from the head.
        if let checkpointFile, FileManager.default.fileExists(atPath: checkpointFile.path) {
            try? FileManager.default.removeItem(atPath: checkpointFile.path)
        }
        let checkpoint = try await AuditCheckpointing.create(in: store, masterKey: masterKey, checkpointFile: checkpointFile)
        print("audit-signing key is now the one derived from the master key (SHA-256 \(derived.publicKey.fingerprint)); \(resigned.count) checkpoint(s) signed again, checkpoint of \(checkpoint?.sequence ?? head) records signed")
        CLI.printNote("checkpoint exports made before name the previous key (\(stored?.fingerprint ?? "none")): make a new export with `offer-signer audit checkpoints export`")
    }
}
