import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer audit verify`: walks the chain against signed checkpoints.
/// Exit 0 intact, 1 tampered, 2 unreadable input.
struct AuditVerifyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify",
        abstract: "Walk the audit chain, check it against signed checkpoints and name the first bad record. Exit 0 when intact, 1 when not, 2 when the input cannot be read.",
        discussion: """
            Without --checkpoints, the store's own checkpoints are used (they cannot expose an attacker who also \
            controls the store). With --checkpoints FILE (from `audit checkpoints export`, kept off the machine), its \
            public key is trusted as given, and the store's checkpoints and key must agree with it. The checkpoint \
            file beside the master key (--checkpoint-file, default <master-key-file>.checkpoint when --master-key-file \
            or OFFER_SIGNER_MASTER_KEY_FILE is given) is trusted the same way: the store's chain must extend it.
            """
    )
    @OptionGroup var store: StoreOptions
    @Option(help: "A checkpoints export (from `offer-signer audit checkpoints export`) kept off this machine.")
    var checkpoints: String?
    @OptionGroup var checkpointFileOptions: CheckpointFileOptions
    @Option(help: "The master key file, only to find the checkpoint file beside it (<master-key-file>.checkpoint); the key is not read. Env: OFFER_SIGNER_MASTER_KEY_FILE.")
    var masterKeyFile: String?

    func run() async throws {
        let opened: any OfferSignerStore
        var trusted: AuditCheckpointSet?
        do {
            if let checkpoints {
                let text = try CLI.readText(checkpoints, what: "checkpoints file")
                let file: AuditCheckpointsFile
                do {
                    file = try AuditCheckpointsFile(text: text)
                } catch {
                    throw CLIFailure("checkpoints file '\(checkpoints)' \(error)")
                }
                trusted = AuditCheckpointSet(origin: "checkpoints file '\(checkpoints)'", publicKey: file.publicKey, checkpoints: file.checkpoints)
            }
            let beside = checkpointFileOptions.resolve(masterKeyFile: masterKeyFile ?? Environment.value("OFFER_SIGNER_MASTER_KEY_FILE"))
            if let beside {
                let file: AuditCheckpointsFile?
                do {
                    file = try beside.read()
                } catch {
                    throw CLIFailure(error.message)
                }
                if let file {
                    if let existing = trusted {
                        guard existing.publicKey == file.publicKey else {
                            throw CLIFailure("the checkpoint file '\(beside.path)' and \(existing.origin) name different audit-signing keys")
                        }
                        trusted?.checkpoints += file.checkpoints
                        trusted?.origin += " and the checkpoint file '\(beside.path)'"
                    } else {
                        trusted = AuditCheckpointSet(origin: "the checkpoint file '\(beside.path)'", publicKey: file.publicKey, checkpoints: file.checkpoints)
                    }
                } else if checkpointFileOptions.checkpointFile != nil {
                    throw CLIFailure("the checkpoint file '\(beside.path)' does not exist")
                }
            }
            opened = try await store.open()
        } catch let error as CLIFailure {
            CLI.printError(error.message)
            throw ExitCode(2)
        }
        let start = ContinuousClock.now
        let report: AuditVerificationReport
        do {
            report = try await opened.verifyAudit(trusted: trusted, progressInterval: 100_000) { count in
                FileHandle.standardError.write(Data("checked \(count) records…\n".utf8))
            }
        } catch {
            CLI.printError("cannot read the audit log: \(error)")
            throw ExitCode(2)
        }
        let elapsed = ContinuousClock.now - start
        if report.recordsChecked >= 100_000 {
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            CLI.printNote("verified \(report.recordsChecked) records in \(String(format: "%.2f", seconds)) s")
        }
        print(report.description)
        if !report.isIntact { throw ExitCode(1) }
        // For the dashboard's "audit verify last passed" (/admin/keys). A store this command may
        // not write (a read-only replica, a copy) is still verified: only the note is skipped.
        do {
            try await opened.recordAuditVerification(
                AuditVerificationRecord(verifiedAt: Date(), recordsChecked: report.recordsChecked, throughSequence: report.recordsChecked, headHash: report.headHash))
        } catch {
            CLI.printNote("the chain is intact; this run could not be recorded for the dashboard: \(error)")
        }
    }
}
