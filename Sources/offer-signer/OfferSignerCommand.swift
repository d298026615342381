import ArgumentParser

/// `offer-signer`: the ops CLI and the service entry point.
@main
struct OfferSignerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "offer-signer",
        abstract: "Sign Apple StoreKit promotional offers: run the service, mint and verify test signatures, manage keys.",
        subcommands: [
            ServeCommand.self,
            SignCommand.self,
            VerifyCommand.self,
            ExplainCommand.self,
            KeysCommand.self,
            ClientsCommand.self,
            OffersCommand.self,
            RetentionCommand.self,
            NotificationsCommand.self,
            TransactionsCommand.self,
            AuditCommand.self,
            StoreCommand.self,
            EligibilityCommand.self,
        ]
    )
}
