import ArgumentParser
import Foundation
import OfferSignerStorage

/// Shared by `keys activate`, `keys retire` and `keys revoke`.
struct KeyTransitionOptions: ParsableArguments {
    @Argument(help: "The key ID.")
    var keyID: String

    @Option(help: "Refuse unless the key belongs to this bundle ID.")
    var bundleID: String?

    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var registryFile: RegistryFileOptions
    @OptionGroup var actor: ActorOptions

    func transition(to state: SigningKeyState, force: Bool) async throws {
        let masterKey = try masterKey.load()
        let store = try await store.open()
        do {
            try await store.bindMasterKey(masterKey)
            if let bundleID {
                guard let key = try await store.listKeys().first(where: { $0.keyID == keyID }) else {
                    throw StoreError(.notFound, "no key '\(keyID)' in the store")
                }
                guard key.bundleID == bundleID else {
                    throw StoreError(.conflict, "key '\(keyID)' belongs to \(key.bundleID), not \(bundleID); a key signs only for its own app")
                }
            }
            let authenticator = try registryFile.authenticator(masterKey, masterKeyFile: self.masterKey.path)
            let key = try await store.transitionKey(keyID: keyID, to: state, actor: actor.resolvedActor, reason: actor.reason, force: force, authenticator: authenticator)
            await registryFile.recordChange(of: store, masterKey, masterKeyFile: self.masterKey.path)
            print("\(key.keyID) (\(key.bundleID)) is now \(key.state.rawValue); public key SHA-256 \(key.fingerprint)")
        } catch let error as StoreError {
            throw CLIFailure(error.message)
        }
    }
}

/// `offer-signer keys activate ID`.
struct KeysActivateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "activate",
        abstract: "Make a key the signing key of its app; the app's previous active key is retired. Running servers switch within a second."
    )
    @OptionGroup var options: KeyTransitionOptions
    func run() async throws { try await options.transition(to: .active, force: false) }
}

/// `offer-signer keys retire ID`.
struct KeysRetireCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "retire",
        abstract: "Stop signing with a key; it stays listed. Retiring an app's last active key needs --force."
    )
    @OptionGroup var options: KeyTransitionOptions
    @Flag(help: "Retire even the app's only active key (its signing stops).")
    var force = false
    func run() async throws { try await options.transition(to: .retired, force: force) }
}

/// `offer-signer keys revoke ID`.
struct KeysRevokeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "revoke",
        abstract: "Record a key as compromised: it never signs again. Revoking an app's last active key needs --force."
    )
    @OptionGroup var options: KeyTransitionOptions
    @Flag(help: "Revoke even the app's only active key (its signing stops).")
    var force = false
    func run() async throws { try await options.transition(to: .revoked, force: force) }
}
