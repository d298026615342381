import ArgumentParser
import Foundation
import OfferSignerCore

/// `offer-signer explain`: names the mistake behind a legacy signature that does not verify.
struct ExplainCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "explain",
        abstract: "For a legacy object that does not verify, find the known mistake that makes it verify.",
        discussion: """
            Tests: nonce or token casing, seconds instead of milliseconds, another key ID or bundle ID, \
            token present/absent, a separator other than U+2063, raw r‖s instead of DER, base64url instead of Base64. \
            Exit 0 when the signature is valid, 1 when it is not (explained or not), 2 when the input cannot be read.
            """
    )

    @OptionGroup var key: VerificationKeyOptions

    @Option(help: "Read the JSON object from this file instead of standard input.")
    var input: String?

    @Option(name: .customLong("try-key-id"), help: "Another key ID the signer may have used (repeatable).")
    var candidateKeyIDs: [String] = []

    @Option(name: .customLong("try-bundle-id"), help: "Another bundle ID the signer may have used (repeatable).")
    var candidateBundleIDs: [String] = []

    @Option(name: .customLong("try-app-account-token"), help: "An appAccountToken the signer may have used (repeatable).")
    var candidateTokens: [String] = []

    func run() throws {
        let diagnosis: LegacySignatureDiagnosis
        let document: LegacySignatureDocument
        do {
            diagnosis = LegacySignatureDiagnosis(
                publicKey: try key.load(), candidateKeyIDs: candidateKeyIDs,
                candidateBundleIDs: candidateBundleIDs, candidateAppAccountTokens: candidateTokens)
            guard case .legacy(let legacy) = try SignatureDocument.decode(json: CLI.readInput(input)) else {
                throw CLIFailure("explain diagnoses legacy objects (format \"legacy\"); use `verify` for JWS")
            }
            document = legacy
        } catch {
            CLI.printError("\(error)")
            throw ExitCode(2)
        }
        switch diagnosis.diagnose(document) {
        case .valid:
            print("valid: the signature verifies as it is; nothing to explain")
        case .mistakes(let mistakes):
            print("invalid: found the cause")
            for mistake in mistakes { print("- \(mistake.code): \(mistake.explanation)") }
            throw ExitCode(1)
        case .unexplained(let reason):
            print("invalid: \(reason)")
            throw ExitCode(1)
        }
    }
}
