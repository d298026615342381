import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer store authenticate`: the one-time upgrade of a store made by an earlier
/// offer-signer (see `StoreAuthentication` for its rules).
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
        let outcome: StoreAuthentication.Outcome
        do {
            outcome = try await StoreAuthentication.run(
                store: store, masterKey: masterKey, checkpointFile: checkpointFile, actor: actor.resolvedActor,
                progress: { count in CLI.printNote("checked \(count) records…") })
        } catch let error as StoreError {
            await store.close()
            throw CLIFailure(error.message)
        }
        await store.close()
        if let previous = outcome.previousAuditKeyFingerprint {
            print("audit-signing key is now the one derived from the master key (SHA-256 \(outcome.auditKeyFingerprint)); \(outcome.checkpointsSignedAgain) checkpoint(s) signed again, checkpoint of \(outcome.checkpoint?.sequence ?? 0) records signed")
            CLI.printNote("checkpoint exports made before name the previous key (\(previous)): start a new export file with `offer-signer audit checkpoints export`")
        }
        let summary = outcome.registry
        print("authenticated \(summary.keyIDs.count) key row(s)\(summary.keyIDs.isEmpty ? "" : ": " + summary.keyIDs.joined(separator: ", "))")
        print("authenticated \(summary.clientNames.count) client row(s)\(summary.clientNames.isEmpty ? "" : ": " + summary.clientNames.joined(separator: ", "))")
    }
}
