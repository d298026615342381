import ArgumentParser

/// `offer-signer keys …`: generate development keys and manage the key registry.
struct KeysCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "keys",
        abstract: "Generate development keys and manage the signing keys of a store.",
        subcommands: [
            KeysGenerateCommand.self, KeysImportCommand.self, KeysListCommand.self,
            KeysActivateCommand.self, KeysRetireCommand.self, KeysRevokeCommand.self,
        ]
    )
}
