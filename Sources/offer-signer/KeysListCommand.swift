import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerStorage

/// `offer-signer keys list`: the key registry, without private keys.
struct KeysListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "list",
        abstract: "List keys: key ID, bundle ID, state, SHA-256 fingerprint of the public key, public key PEM, transition times."
    )

    @OptionGroup var store: StoreOptions

    @Flag(help: "Print a JSON array.")
    var json = false

    func run() async throws {
        let keys = try await store.open().listKeys()
        if json {
            print("[" + keys.map(KeyRegistry.json).joined(separator: ",") + "]")
            return
        }
        if keys.isEmpty {
            print("no keys; import one with `offer-signer keys import`")
            return
        }
        for key in keys {
            print("\(key.keyID)  \(key.bundleID)  \(key.state.rawValue)\(key.origin == "development" ? " (development, not issued by Apple)" : "")  sha256:\(key.fingerprint)")
        }
    }
}
