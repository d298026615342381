import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer audit checkpoints export`: JSON lines, the audit-signing public key first.
///
/// Rule: an `--output` file that exists already is appended to, never rewritten: it must name
/// the store's audit-signing key, and every checkpoint it holds must be one of the store's (same
/// sequence, same head hash), else the command fails and leaves it as it is (the store's
/// checkpoints no longer extend the export: deleted or rewritten); only the store's newer
/// checkpoints are appended.
struct AuditCheckpointsExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Write the signed checkpoints as JSON lines; the first line holds the audit-signing public key (PEM) and its fingerprint.",
        discussion: """
            Store the output off this machine; give it to `offer-signer audit verify --checkpoints FILE`. An existing \
            --output file is appended to, and the command fails when the store's checkpoints do not extend it.
            """
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
            guard !checkpoints.isEmpty else {
                throw CLIFailure("the store has no checkpoint yet; run `offer-signer audit checkpoints create` or start the server")
            }
            let text = AuditCheckpointsFile(publicKey: key, checkpoints: checkpoints).text
            if let output, FileManager.default.fileExists(atPath: output) {
                try append(checkpoints, key: key, to: output)
            } else if let output {
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

    private func append(_ checkpoints: [AuditCheckpoint], key: AuditSigningPublicKey, to output: String) throws {
        let existingText = try CLI.readText(output, what: "checkpoints export")
        let existing: AuditCheckpointsFile
        do {
            existing = try AuditCheckpointsFile(text: existingText)
        } catch {
            throw CLIFailure("'\(output)' is not a checkpoints export (\(error)); give a new file")
        }
        guard existing.publicKey == key else {
            throw CLIFailure("'\(output)' names audit-signing key \(existing.publicKey.fingerprint), the store \(key.fingerprint): the store's key was replaced (or this is another deployment's export)")
        }
        let stored = Dictionary(checkpoints.map { ($0.sequence, $0.headHash) }, uniquingKeysWith: { first, _ in first })
        for checkpoint in existing.checkpoints where stored[checkpoint.sequence] != checkpoint.headHash {
            throw CLIFailure(
                "the store's checkpoints do not extend '\(output)': its checkpoint of \(checkpoint.sequence) records is \(stored[checkpoint.sequence] == nil ? "missing from the store (deleted)" : "another head hash in the store (rewritten)"); run `offer-signer audit verify --checkpoints \(output)`")
        }
        let last = existing.checkpoints.map(\.sequence).max() ?? 0
        let newer = checkpoints.filter { $0.sequence > last }
        guard !newer.isEmpty else {
            CLI.printNote("'\(output)' already holds every checkpoint through record \(last); nothing appended")
            return
        }
        guard let handle = FileHandle(forWritingAtPath: output) else { throw CLIFailure("cannot open '\(output)' to append") }
        do {
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(((existingText.hasSuffix("\n") ? "" : "\n") + newer.map { $0.jsonLine + "\n" }.joined()).utf8))
            try handle.synchronize()
            try handle.close()
        } catch {
            throw CLIFailure("cannot append to '\(output)': \(error.localizedDescription)")
        }
        CLI.printNote("appended \(newer.count) checkpoint(s) through record \(newer.last?.sequence ?? last) to \(output); keep a copy off this machine")
    }
}
