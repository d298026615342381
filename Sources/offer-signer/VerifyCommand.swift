import ArgumentParser
import Crypto
import Foundation
import OfferSignerCore

/// `offer-signer verify`: checks a signed object. Exit 0 valid, 1 invalid, 2 unreadable input.
struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Verify a signed object printed by `sign` (or the service). Exit 0 when valid, 1 when not, 2 when the input cannot be read."
    )

    @OptionGroup var key: VerificationKeyOptions

    @Option(help: "Read the JSON object from this file instead of standard input.")
    var input: String?

    func run() throws {
        let document: SignatureDocument
        let publicKey: P256.Signing.PublicKey
        do {
            publicKey = try key.load()
            document = try SignatureDocument.decode(json: CLI.readInput(input))
        } catch {
            CLI.printError("\(error)")
            throw ExitCode(2)
        }
        switch document.verify(with: publicKey) {
        case .valid:
            print("valid: signature verifies with key \(publicKey.offerSignerFingerprint.prefix(16))…")
        case .invalid(let reason):
            print("invalid: \(reason)")
            throw ExitCode(1)
        }
    }
}
