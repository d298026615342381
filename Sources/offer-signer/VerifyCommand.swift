import ArgumentParser
import Crypto
import Foundation
import OfferSignerCore

/// `offer-signer verify`: checks a signed object. Exit 0 valid, 1 invalid, 2 unreadable input.
struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Verify a signed object printed by `sign`, or a response of the service (each signature in it). Exit 0 when valid, 1 when not, 2 when the input cannot be read."
    )

    @OptionGroup var key: VerificationKeyOptions

    @Option(help: "Read the JSON object from this file instead of standard input.")
    var input: String?

    func run() throws {
        let documents: [SignatureDocument]
        let publicKey: P256.Signing.PublicKey
        do {
            publicKey = try key.load()
            documents = try SignatureDocument.decodeAll(json: CLI.readInput(input))
        } catch {
            CLI.printError("\(error)")
            throw ExitCode(2)
        }
        var allValid = true
        for document in documents {
            let label = documents.count > 1 ? "\(document.format.rawValue): " : ""
            switch document.verify(with: publicKey) {
            case .valid:
                print("\(label)valid: signature verifies with key \(publicKey.offerSignerFingerprint.prefix(16))…")
            case .invalid(let reason):
                print("\(label)invalid: \(reason)")
                allValid = false
            }
        }
        if !allValid { throw ExitCode(1) }
    }
}
