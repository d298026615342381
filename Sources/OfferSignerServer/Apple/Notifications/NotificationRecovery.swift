import AppStoreServerAPI
import Foundation
import OfferSignerEligibility

/// Recovers notifications Apple could not deliver: pages through Apple's Get Notification History
/// and hands every notification to the same ``AppleNotificationIntake`` as the endpoint, so each is
/// verified and stored exactly as if it had arrived (idempotent by `notificationUUID`).
///
/// Why: Apple retries a Production notification "five times, at 1, 12, 24, 48, and 72 hours after
/// the previous attempt" and sends a Sandbox one once
/// (https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications);
/// Get Notification History (a `startDate` within the past 180 days in Production, 30 days in
/// Sandbox, see ``historyWindow(_:)``) is the only way to get what was missed
/// (https://developer.apple.com/documentation/appstoreserverapi/get-notification-history).
///
/// Rules: pages are asked one after another, `paginationToken` to `paginationToken`, until
/// `hasMore` is false; a page Apple does not give ends the run with `stoppedBy` set (what was
/// stored before stays stored; a later run asks again); a notification that does not verify is
/// counted `failed` and the run goes on; a store failure ends the run.
public struct NotificationRecovery: Sendable {
    /// A notification that did not verify or could not be stored.
    public struct FailedNotification: Sendable, Hashable {
        /// Read from the payload without verifying it: for an operator's log line, never trusted.
        public var notificationUUID: String?
        public var firstAttempt: Date
    }

    /// Apple's window for Get Notification History's `startDate`: "Choose a startDate that's
    /// within the past 180 days. In the sandbox environment, choose a startDate that's within the
    /// past 30 days." (https://developer.apple.com/documentation/appstoreserverapi/notificationhistoryrequest).
    public static func historyWindow(_ environment: AppleEnvironment) -> TimeInterval {
        environment == .sandbox ? 30 * 86_400 : 180 * 86_400
    }

    /// Kept inward of Apple's window edge, so a request built now is still inside it when Apple reads it.
    public static let historyWindowMargin: TimeInterval = 3600

    /// The earliest `startDate` this service asks Apple for at `now`.
    public static func earliestStart(_ environment: AppleEnvironment, now: Date) -> Date {
        now.addingTimeInterval(-historyWindow(environment) + historyWindowMargin)
    }

    /// The `notificationUUID` of a compact JWS's payload, unverified (logs only).
    static func unverifiedUUID(_ jws: String) -> String? {
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        var base64 = parts[1].replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        guard let data = Data(base64Encoded: base64), let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any],
            let uuid = object["notificationUUID"] as? String
        else { return nil }
        return String(uuid.filter { $0.isLetter || $0.isNumber || $0 == "-" }.prefix(64))
    }

    /// What a run found and did.
    public struct Tally: Sendable, Hashable {
        /// Notifications Apple listed.
        public var found = 0
        /// Stored by this run.
        public var new = 0
        /// Stored before (by the endpoint or an earlier run).
        public var alreadyStored = 0
        /// Verified, but for an app or environment this service does not serve.
        public var ignored = 0
        /// Did not verify, or could not be stored.
        public var failed = 0
        /// Pages asked.
        public var pages = 0
        /// Why a failed notification failed (the first few).
        public var failures: [String] = []
        /// Why the run stopped before the last page (nil when it read them all).
        public var stoppedBy: String?
        /// The earliest time Apple tried to send a notification that failed here (its first
        /// `sendAttempts` date; the request's `startDate` when Apple gave none): a scheduled
        /// catch-up must not move its watermark past it.
        public var earliestFailure: Date?
        /// Every notification that failed here: its `notificationUUID` as the unverified payload
        /// states it (for logs only; nil when unreadable) and its first send attempt, as above.
        public var failedNotifications: [FailedNotification] = []

        public init() {}

        /// Every page was read and every notification was stored (or is not this service's).
        public var isComplete: Bool { stoppedBy == nil && failed == 0 }
    }

    let client: AppStoreServerAPIClient
    let intake: AppleNotificationIntake
    /// Most pages one run reads (Apple sends up to 20 notifications a page).
    let maximumPages: Int

    public init(client: AppStoreServerAPIClient, intake: AppleNotificationIntake, maximumPages: Int = 10_000) {
        self.client = client
        self.intake = intake
        self.maximumPages = maximumPages
    }

    /// Reads every page of the history `request` selects, in `environment`, and stores what it holds.
    public func run(
        _ request: NotificationHistoryRequest, environment: AppleEnvironment, app: AppStoreAppSettings, credentials: AppStoreServerAPICredentials,
        pageTimeout: Duration = .seconds(30)
    ) async throws -> Tally {
        var tally = Tally()
        var token: String?
        while true {
            guard tally.pages < maximumPages else {
                tally.stoppedBy = "more than \(maximumPages) pages"
                return tally
            }
            let page: NotificationHistoryPage
            switch await client.notificationHistoryPage(
                request, paginationToken: token, environment: environment, app: app, credentials: credentials, timeout: pageTimeout)
            {
            case .success(let value): page = value
            case .failure(let unavailable):
                tally.stoppedBy = "Get Notification History: \(unavailable.description)"
                return tally
            }
            tally.pages += 1
            for item in page.items {
                tally.found += 1
                switch try await intake.receive(signedPayload: item.signedPayload) {
                case .success(let receipt):
                    switch receipt.status {
                    case .recorded: tally.new += 1
                    case .duplicate: tally.alreadyStored += 1
                    case .ignored: tally.ignored += 1
                    }
                case .failure(let refusal):
                    tally.failed += 1
                    let sent = item.sendAttempts.compactMap(\.attemptDate).min() ?? request.startDate
                    tally.earliestFailure = min(tally.earliestFailure ?? sent, sent)
                    tally.failedNotifications.append(FailedNotification(notificationUUID: Self.unverifiedUUID(item.signedPayload), firstAttempt: sent))
                    if tally.failures.count < 10 { tally.failures.append(refusal.detail) }
                }
            }
            guard page.hasMore, let next = page.paginationToken, next != token else { return tally }
            token = next
        }
    }
}
