import AppStoreServerAPI
import ArgumentParser
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer

/// `offer-signer notifications recover`: what Apple could not deliver, fetched from Get
/// Notification History and stored as the endpoint would have.
struct NotificationsRecoverCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "recover",
        abstract: "Fetch the notifications Apple sent (or failed to send) since a date, and store the ones missing.",
        discussion: """
            Pages through Apple's Get Notification History (POST /inApps/v1/notifications/history) and feeds every \
            notification through the same verification and storage as POST /v1/apple/notifications: stored once per \
            notificationUUID, so running it again, or while the server runs, is safe. --since must be within the past 180 \
            days in Production, 30 days in Sandbox (Apple's NotificationHistoryRequest). Prints found / new / already stored / ignored / failed. Exit 0 when every page was read \
            and every notification verified and was stored, 1 otherwise.
            """
    )

    @OptionGroup var apple: AppleAPIOptions
    @Option(help: "Start of the period (ISO 8601 time, or a date, UTC).")
    var since: String
    @Option(help: "End of the period (default: now).")
    var until: String?
    @Flag(help: "Only the notifications Apple could not deliver (Apple's onlyFailures).")
    var onlyFailures = false
    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        let start = try CLITime.parse(since, option: "--since")
        let end = try until.map { try CLITime.parse($0, option: "--until") } ?? Date()
        let request = NotificationHistoryRequest(startDate: start, endDate: end, onlyFailures: onlyFailures)
        if let problem = request.problem { throw ValidationError("--since/--until: \(problem)") }
        // Apple: "Choose a startDate that's within the past 180 days. In the sandbox environment,
        // choose a startDate that's within the past 30 days." (NotificationHistoryRequest)
        if let environment = AppleEnvironment(rawValue: apple.environment), environment == .production || environment == .sandbox {
            let window = NotificationRecovery.historyWindow(environment)
            if start < Date().addingTimeInterval(-window) {
                throw ValidationError(
                    "--since: Apple's Get Notification History takes a start within the past \(Int(window / 86_400)) days in \(environment.rawValue); \(since) is earlier (NotificationHistoryRequest)")
            }
        }
        let session = try await apple.open(label: "offer-signer.notifications")
        let tally: NotificationRecovery.Tally
        do {
            let intake = AppleNotificationIntake(
                store: session.store, servedBundles: session.servedBundles, catalog: session.configuration.catalog,
                trustedRoots: session.configuration.trustedRoots, logger: Logger(label: "offer-signer.notifications"))
            tally = try await NotificationRecovery(client: session.client, intake: intake).run(
                request, environment: session.environment, app: session.app, credentials: session.credentials)
            await session.close()
        } catch {
            await session.close()
            throw CLIFailure("storing a notification failed: \(error)")
        }
        print(json ? Self.json(tally) : Self.text(tally), terminator: "")
        if !tally.isComplete { throw ExitCode(1) }
    }

    static func text(_ tally: NotificationRecovery.Tally) -> String {
        var lines = [
            "found: \(tally.found)", "new: \(tally.new)", "already stored: \(tally.alreadyStored)", "ignored (not this service's): \(tally.ignored)",
            "failed: \(tally.failed)",
        ]
        lines += tally.failures.map { "  failed: \($0)" }
        if let stopped = tally.stoppedBy { lines.append("stopped after \(tally.pages) page(s): \(stopped)") }
        return lines.joined(separator: "\n") + "\n"
    }

    static func json(_ tally: NotificationRecovery.Tally) -> String {
        var writer = JSONObjectWriter()
        writer.field("found", Int64(tally.found))
        writer.field("new", Int64(tally.new))
        writer.field("alreadyStored", Int64(tally.alreadyStored))
        writer.field("ignored", Int64(tally.ignored))
        writer.field("failed", Int64(tally.failed))
        writer.field("pages", Int64(tally.pages))
        writer.field("failures", json: "[" + tally.failures.map(JSONObjectWriter.quoted).joined(separator: ",") + "]")
        writer.field("stoppedBy", tally.stoppedBy)
        writer.field("complete", tally.isComplete)
        return writer.finish() + "\n"
    }
}
