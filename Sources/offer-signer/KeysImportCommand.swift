import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerStorage

/// `offer-signer keys import`: seals a .p8 into the store.
struct KeysImportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Import an In-App Purchase key (.p8) for an app. It becomes the app's active key if the app has none yet.",
        discussion: "The private key is sealed with AES-256-GCM under the master key; the .p8 must be mode 0600 (or stricter)."
    )

    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var registryFile: RegistryFileOptions
    @OptionGroup var actor: ActorOptions

    @Option(help: "The key ID from App Store Connect.")
    var keyID: String
    @Option(help: "The app's bundle ID.")
    var bundleID: String
    @Option(help: "The issuer ID from App Store Connect (needed for JWS signatures).")
    var issuerID: String?
    @Option(help: "The .p8 file.")
    var file: String
    @Flag(help: "Mark the key as a development key (not issued by Apple).")
    var development = false

    func run() async throws {
        let pem = try SecretFile.read(file, what: "key file")
        let key: InAppPurchaseKey
        do {
            try OfferFieldValidator.validateIdentifier(bundleID, field: "bundleID")
            if let issuerID { try OfferFieldValidator.validateIdentifier(issuerID, field: "issuerID") }
            key = try InAppPurchaseKey(keyID: keyID, pemRepresentation: pem)
        } catch {
            throw CLIFailure("\(file): \(error.message)")
        }
        let masterKey = try self.masterKey.load()
        let store = try await self.store.open(mustExist: false)
        let authenticator = try registryFile.authenticator(masterKey, masterKeyFile: self.masterKey.path)
        let record = try await KeyRegistry.importKey(
            key, bundleID: bundleID, issuerID: issuerID, development: development, into: store, masterKey: masterKey, actor: actor.resolvedActor,
            reason: actor.reason, authenticator: authenticator)
        await registryFile.recordChange(of: store, masterKey, masterKeyFile: self.masterKey.path)
        print("imported \(record.keyID) for \(record.bundleID): \(record.state.rawValue), public key SHA-256 \(record.fingerprint)")
    }
}
