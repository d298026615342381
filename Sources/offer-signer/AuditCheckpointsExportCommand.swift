import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer audit checkpoints export`: JSON lines, the audit-signing public key first.
struct AuditCheckpointsExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Write the signed checkpoints as JSON lines; the first line holds the audit-signing public key (PEM) and its fingerprint.",
        discussion: "Store the output off this machine; give it to `offer-signer audit verify --checkpoints FILE`."
    )
    @OptionGroup var store: StoreOptions
    @Option(help: "Write to this file instead of standard output.")
    var output: String?

    func run() async throws {
        let store = try await store.open()
        do {
            guard let key = try await store.auditSigningPublicKey() else {
                throw CLIFailure("the store has no audit-signing key yet (no checkpoint was ever written); run `offer-signer audit checkpoints create` or start the server")
            }
            let checkpoints = try await store.checkpoints()
            let text = AuditCheckpointsFile(publicKey: key, checkpoints: checkpoints).text
            if let output {
                do {
                    try text.write(toFile: output, atomically: true, encoding: .utf8)
                } catch {
                    throw CLIFailure("cannot write '\(output)': \(error.localizedDescription)")
                }
                CLI.printNote("wrote \(checkpoints.count) checkpoint(s) through record \(checkpoints.last?.sequence ?? 0) to \(output), audit-signing key SHA-256 \(key.fingerprint); keep a copy off this machine")
            } else {
                FileHandle.standardOutput.write(Data(text.utf8))
            }
        } catch let error as StoreError {
            throw CLIFailure(error.message)
        }
    }
}
