import ArgumentParser

/// `offer-signer audit checkpoints …`: signed checkpoints of the audit chain.
struct AuditCheckpointsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "checkpoints",
        abstract: "Create and export signed checkpoints (chain length and head hash) of the audit log.",
        discussion: """
            A checkpoint is signed (ES256) by the store's audit-signing key, which is sealed under the master key. \
            Export checkpoints regularly and keep the export off this machine: `audit verify --checkpoints FILE` then \
            detects a chain rewritten with recomputed hashes, or a truncated tail, up to the last exported checkpoint.
            """,
        subcommands: [AuditCheckpointsExportCommand.self, AuditCheckpointsCreateCommand.self]
    )
}
