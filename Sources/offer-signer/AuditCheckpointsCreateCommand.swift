import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer audit checkpoints create`: signs a checkpoint of the current head now.
struct AuditCheckpointsCreateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Sign a checkpoint of the audit chain now (when it grew since the last one).",
        discussion: "The audit-signing key is derived from the master key; it is never printed. The checkpoint is also written to the checkpoint file (default <master-key-file>.checkpoint), and nothing is signed unless the chain extends the one that file holds."
    )
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var checkpointFileOptions: CheckpointFileOptions

    func run() async throws {
        let masterKey = try masterKey.load()
        let checkpointFile = checkpointFileOptions.resolve(masterKeyFile: self.masterKey.path)
        let store = try await store.open()
        do {
            if let checkpoint = try await AuditCheckpointing.create(in: store, masterKey: masterKey, checkpointFile: checkpointFile) {
                print("checkpoint of \(checkpoint.sequence) records: head \(checkpoint.headHash), signed by audit key SHA-256 \(checkpoint.keyFingerprint)")
            } else {
                let latest = try await store.latestCheckpoint()
                print("no new audit records since the checkpoint of \(latest?.sequence ?? 0) records; nothing to sign")
            }
        } catch let error as StoreError {
            throw CLIFailure(error.message)
        }
    }
}
