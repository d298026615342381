import AppStoreServerAPI
import ArgumentParser
import Foundation
import OfferSignerEligibility

/// `offer-signer transactions set-app-account-token`: Apple's Set App Account Token.
struct TransactionsSetAppAccountTokenCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-app-account-token",
        abstract: "Give a customer's purchases the appAccountToken of their account (for purchases made without one).",
        discussion: """
            Calls Set App Account Token (PUT /inApps/v1/transactions/{originalTransactionId}/appAccountToken with \
            {"appAccountToken": "<UUID>"}): Apple sets the token on the purchase and its later transactions, so \
            offers, eligibility and redemption tracking, which go by appAccountToken, find the customer. For a \
            purchase made outside the app (an offer code, a purchase before the app set tokens) or whose token must \
            change. Exit 0 when Apple accepted it, 1 otherwise (Apple's error code in the message).
            """
    )

    @OptionGroup var apple: AppleAPIOptions
    @Option(help: "The purchase's originalTransactionId.")
    var originalTransactionID: String
    @Option(help: "The customer's appAccountToken (a UUID).")
    var appAccountToken: String

    func run() async throws {
        guard let token = UUID(uuidString: appAccountToken) else {
            throw ValidationError("--app-account-token '\(appAccountToken)' is not a UUID (like 7e3fb20b-4cdb-47cc-936d-99d65f608138)")
        }
        guard AppStoreServerAPIClient.isPathSafe(originalTransactionID) else {
            throw ValidationError("--original-transaction-id must be letters, digits, '-', '_' or '.'")
        }
        let session = try await apple.open(label: "offer-signer.transactions")
        let result = await session.client.setAppAccountToken(
            originalTransactionID: originalTransactionID, appAccountToken: token, environment: session.environment, app: session.app,
            credentials: session.credentials)
        await session.close()
        switch result {
        case .success:
            print("appAccountToken \(token.uuidString.lowercased()) set on \(originalTransactionID) (\(session.environment.rawValue))")
        case .failure(let unavailable):
            throw CLIFailure("Set App Account Token failed: \(unavailable.description)")
        }
    }
}
