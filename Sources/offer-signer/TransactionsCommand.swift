import ArgumentParser

/// `offer-signer transactions …`: a customer's transactions, with Apple's App Store Server API.
struct TransactionsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "transactions",
        abstract: "Change what Apple keeps about a customer's purchases (App Store Server API).",
        subcommands: [TransactionsSetAppAccountTokenCommand.self]
    )
}
