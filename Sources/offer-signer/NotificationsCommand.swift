import ArgumentParser

/// `offer-signer notifications …`: App Store Server Notifications V2, with Apple's API.
struct NotificationsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "notifications",
        abstract: "Recover missed App Store Server Notifications, and check the set-up with a test notification.",
        subcommands: [NotificationsRecoverCommand.self, NotificationsTestCommand.self]
    )
}
