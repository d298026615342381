import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer store authenticate`: the one-time upgrade of a store made by an earlier
/// offer-signer (see `StoreAuthentication` for its rules).
struct StoreAuthenticateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "authenticate",
        abstract: "Upgrade a store made by an earlier offer-signer (once; serve refuses to start before): MAC its key and client rows under the master key, write the registry manifest, and move its audit checkpoints to the key derived from it.",
        discussion: """
            Lists the rows it authenticates: check them with `keys list` and `clients list` first, since the command vouches \
            for every row without a MAC it finds. A store with audit records needs --checkpoints-export FILE, the off-machine \
            export `audit checkpoints export` wrote, which the chain must extend (or --trust-existing-chain, recorded in the \
            audit log). Checkpoint exports made before name the previous audit-signing key: make a new export afterwards. A \
            store whose rows carry MACs but no registry manifest gets its first manifest. On a store upgraded already (registry \
            file above 0, or derived audit key with records), missing MACs or manifest are tampering: refused without \
            --accept-registry-rows, which lists every row first. Refused once the store is \
            authenticated, unless its registry no longer matches its manifest and --accept-registry-rows vouches for the rows \
            as they are.
            """
    )
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var checkpointFileOptions: CheckpointFileOptions
    @OptionGroup var registryFileOptions: RegistryFileOptions
    @OptionGroup var actor: ActorOptions
    @Option(help: "The off-machine checkpoints export (`offer-signer audit checkpoints export`) the audit chain must extend; required when the audit log is not empty.")
    var checkpointsExport: String?
    @Flag(help: "Vouch for the audit chain as the store holds it, without an export (recorded in the audit log).")
    var trustExistingChain = false
    @Flag(help: "Write a new registry manifest over the key and client rows as they are, when they no longer match the stored one (recorded in the audit log).")
    var acceptRegistryRows = false

    func run() async throws {
        let masterKey = try masterKey.load()
        let checkpointFile = checkpointFileOptions.resolve(masterKeyFile: self.masterKey.path)
        var export: StoreAuthentication.CheckpointsExport?
        if let checkpointsExport {
            let text = try CLI.readText(checkpointsExport, what: "checkpoints export")
            do {
                export = StoreAuthentication.CheckpointsExport(origin: "the checkpoints export '\(checkpointsExport)'", file: try AuditCheckpointsFile(text: text))
            } catch {
                throw CLIFailure("'\(checkpointsExport)' is not a checkpoints export (\(error))")
            }
        }
        let store = try await store.open()
        let outcome: StoreAuthentication.Outcome
        do {
            if acceptRegistryRows {
                // Every row about to be vouched for, before anything is written.
                let snapshot = try await store.registrySnapshot()
                CLI.printNote("--accept-registry-rows vouches for these rows as they are:")
                for key in snapshot.keys {
                    CLI.printNote("  key \(key.keyID) bundle \(key.bundleID) state \(key.state.rawValue) imported \(key.importedAt.formatted(.iso8601))")
                }
                for client in snapshot.clients {
                    CLI.printNote(
                        "  client \(client.clientID) name '\(client.name)' bundles \(client.bundleIDs.isEmpty ? "(all)" : client.bundleIDs.joined(separator: " ")) created \(client.createdAt.formatted(.iso8601)) \(client.revokedAt == nil ? "active" : "revoked")")
                }
            }
            outcome = try await StoreAuthentication.run(
                store: store, masterKey: masterKey, checkpointFile: checkpointFile,
                registryFile: registryFileOptions.resolve(masterKeyFile: self.masterKey.path), checkpointsExport: export,
                trustExistingChain: trustExistingChain, acceptRegistryRows: acceptRegistryRows, actor: actor.resolvedActor,
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
        if let version = outcome.manifestVersion { print("registry manifest version \(version) written") }
        let summary = outcome.registry
        print("authenticated \(summary.keyIDs.count) key row(s)\(summary.keyIDs.isEmpty ? "" : ": " + summary.keyIDs.joined(separator: ", "))")
        print("authenticated \(summary.clientNames.count) client row(s)\(summary.clientNames.isEmpty ? "" : ": " + summary.clientNames.joined(separator: ", "))")
    }
}
