import AppStoreServerAPI
import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage

/// `offer-signer notifications test`: Apple's Request a Test Notification, end to end.
struct NotificationsTestCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "test",
        abstract: "Ask Apple for a test notification, wait until the service has stored it, and print Apple's send attempt result.",
        discussion: """
            Calls Request a Test Notification (POST /inApps/v1/notifications/test), then Get Test Notification Status \
            (GET /inApps/v1/notifications/test/{token}) until Apple has made the notification, and watches the store \
            for its notificationUUID: it arrived when the endpoint (POST /v1/apple/notifications, at the URL set in App \
            Store Connect for this environment) stored it. Prints Apple's sendAttemptResult. Exit 0 when it arrived, \
            1 when it did not within --wait-seconds (with Apple's last result, e.g. NO_RESPONSE, when there is one).
            """
    )

    @OptionGroup var apple: AppleAPIOptions
    @Option(help: "How long to wait for the notification to arrive, in seconds. Default 60.")
    var waitSeconds: Double = 60
    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        guard waitSeconds > 0 else { throw ValidationError("--wait-seconds must be more than 0") }
        let session = try await apple.open(label: "offer-signer.notifications")
        let outcome: Outcome
        do {
            outcome = try await test(session)
            await session.close()
        } catch {
            await session.close()
            throw error
        }
        print(json ? outcome.json : outcome.text, terminator: "")
        guard outcome.arrivedAt != nil else {
            let result = outcome.sendAttemptResult.map { "Apple's last send attempt: \($0)" } ?? "Apple reports no send attempt yet"
            throw CLIFailure(
                "the test notification did not reach the service within \(waitSeconds) s (\(result)); check the App Store Server Notifications URL of \(session.environment.rawValue) in App Store Connect, and that the server answers it")
        }
    }

    struct Outcome {
        var token: String
        var notificationUUID: String?
        var arrivedAt: Date?
        var sendAttemptResult: String?

        var text: String {
            var lines = ["testNotificationToken: \(token)"]
            if let notificationUUID { lines.append("notificationUUID: \(notificationUUID)") }
            lines.append("arrived: \(arrivedAt.map { "yes, stored at \(Date.rfc3339(milliseconds: $0.unixMilliseconds))" } ?? "no")")
            lines.append("sendAttemptResult: \(sendAttemptResult ?? "(none yet)")")
            return lines.joined(separator: "\n") + "\n"
        }

        var json: String {
            var writer = JSONObjectWriter()
            writer.field("testNotificationToken", token)
            writer.field("notificationUUID", notificationUUID)
            writer.field("arrived", arrivedAt != nil)
            writer.field("sendAttemptResult", sendAttemptResult)
            return writer.finish() + "\n"
        }
    }

    private func test(_ session: AppleAPISession) async throws -> Outcome {
        let token: String
        switch await session.client.requestTestNotification(environment: session.environment, app: session.app, credentials: session.credentials) {
        case .success(let value): token = value
        case .failure(let unavailable): throw CLIFailure("Request a Test Notification failed: \(unavailable.description)")
        }
        var outcome = Outcome(token: token)
        let deadline = ContinuousClock.now + .milliseconds(Int64(waitSeconds * 1000))
        // After it arrived, a few seconds more for Apple to record the result of its attempt.
        var resultDeadline: ContinuousClock.Instant?
        while ContinuousClock.now < (resultDeadline ?? deadline) {
            if case .success(let status) = await session.client.testNotificationStatus(
                token: token, environment: session.environment, app: session.app, credentials: session.credentials)
            {
                outcome.sendAttemptResult = status.sendAttempts.last?.sendAttemptResult ?? outcome.sendAttemptResult
                if outcome.notificationUUID == nil, let payload = status.signedPayload { outcome.notificationUUID = Self.notificationUUID(payload) }
            }
            if outcome.arrivedAt == nil, let uuid = outcome.notificationUUID {
                do {
                    outcome.arrivedAt = try await session.store.appleNotificationReceivedAt(notificationUUID: uuid)
                } catch {
                    throw CLIFailure("reading the store failed: \(error)")
                }
                if outcome.arrivedAt != nil { resultDeadline = ContinuousClock.now + .seconds(10) }
            }
            if outcome.arrivedAt != nil && outcome.sendAttemptResult != nil { break }
            try await Task.sleep(for: .milliseconds(500))
        }
        return outcome
    }

    /// The `notificationUUID` of a notification's signed payload (read to find it in the store,
    /// which holds only notifications the endpoint verified).
    static func notificationUUID(_ signedPayload: String) -> String? {
        let parts = signedPayload.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let data = Encoding.decodeBase64URL(parts[1]),
            let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        else { return nil }
        return object["notificationUUID"] as? String
    }
}
