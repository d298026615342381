import ArgumentParser
import Foundation
import Logging
import OfferSignerPostgres
import OfferSignerStorage

/// `offer-signer store …`: whole-store operations.
struct StoreCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "store",
        abstract: "Whole-store operations: copy a store between SQLite and PostgreSQL; authenticate an older store's registry rows.",
        subcommands: [StoreCopyCommand.self, StoreAuthenticateCommand.self]
    )
}

/// `offer-signer store copy --from SOURCE --to TARGET`: copies a whole store, SQLite or
/// PostgreSQL either way, into an empty one.
///
/// Rules: the target must be empty; keys stay sealed as they are (no master key is needed);
/// records, hashes and checkpoints are copied byte for byte; the command verifies the target's
/// chain against its checkpoints at the end and fails unless its head hash is the source's.
struct StoreCopyCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "copy",
        abstract: "Copy a whole store (keys, clients, ledger, audit chain, checkpoints) into an empty store, between SQLite and PostgreSQL either way.",
        discussion: """
            SOURCE and TARGET are each a SQLite file or a PostgreSQL URL. The target must be empty (a new SQLite file \
            is created; a PostgreSQL database must exist and hold no offer-signer data). Stop the service while copying. \
            Progress goes to standard error; at the end both head hashes are printed, and the command fails unless \
            `audit verify` of the target passes with the source's head hash.
            """
    )

    @Option(help: "The store to copy from: a SQLite file or a PostgreSQL URL.")
    var from: String
    @Option(help: "The empty store to copy into: a new SQLite file or a PostgreSQL URL.")
    var to: String
    @Option(help: "PostgreSQL: a password file (mode 600) for --from, when neither its URL nor PGPASSWORD gives one.")
    var fromPasswordFile: String?
    @Option(help: "PostgreSQL: a password file (mode 600) for --to, when neither its URL nor PGPASSWORD gives one.")
    var toPasswordFile: String?

    func run() async throws {
        var logger = Logger(label: "offer-signer.store-copy")
        logger.logLevel = .warning
        if from == to { throw CLIFailure("--from and --to name the same store") }
        let sourceName = try describe(from, passwordFile: fromPasswordFile)
        let targetName = try describe(to, passwordFile: toPasswordFile)
        if !PostgresStoreConfiguration.isPostgresURL(to) && FileManager.default.fileExists(atPath: to) {
            throw CLIFailure("the target '\(to)' exists already; copy into a new file (or an empty PostgreSQL database)")
        }
        let source = try await open(from, passwordFile: fromPasswordFile, mustExist: true, logger: logger)
        let target: any OfferSignerStore
        do {
            target = try await open(to, passwordFile: toPasswordFile, mustExist: false, logger: logger)
        } catch {
            await source.close()
            throw error
        }
        CLI.printNote("copying \(sourceName) to \(targetName)")
        let summary: StoreCopy.Summary
        do {
            summary = try await StoreCopy.copy(from: source, to: target) { line in CLI.printNote(line) }
        } catch let error as StoreError {
            await source.close()
            await target.close()
            throw CLIFailure(error.message)
        }
        await source.close()
        await target.close()
        print("copied \(summary.keys) key(s), \(summary.clients) client(s), \(summary.records) audit record(s), \(summary.ledgerRows) ledger row(s), \(summary.checkpoints) checkpoint(s)")
        print("source head: \(summary.records) \(summary.sourceHead)")
        print("target head: \(summary.report.recordsChecked) \(summary.targetHead)")
        print("target \(summary.report.description)")
    }

    private func describe(_ location: String, passwordFile: String?) throws -> String {
        guard PostgresStoreConfiguration.isPostgresURL(location) else { return "'\(location)'" }
        return try StoreOptions.postgresConfiguration(url: location, passwordFile: passwordFile, poolSize: 4).redactedDescription
    }

    private func open(_ location: String, passwordFile: String?, mustExist: Bool, logger: Logger) async throws -> any OfferSignerStore {
        if PostgresStoreConfiguration.isPostgresURL(location) {
            return try await StoreOptions.open(
                postgres: try StoreOptions.postgresConfiguration(url: location, passwordFile: passwordFile, poolSize: 4), logger: logger)
        }
        if passwordFile != nil { throw ValidationError("a password file applies to a PostgreSQL URL only; '\(location)' is a SQLite file") }
        return try StoreOptions.open(sqlite: location, mustExist: mustExist)
    }
}
