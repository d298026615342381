import AppStoreServerAPI
import Foundation
import OfferSignerEligibility

/// Recovers notifications Apple could not deliver: pages through Apple's Get Notification History
/// and hands every notification to the same ``AppleNotificationIntake`` as the endpoint, so each is
/// verified and stored exactly as if it had arrived (idempotent by `notificationUUID`).
///
/// Why: Apple retries a Production notification a few times over three days and sends a Sandbox
/// one once; Get Notification History (180 days back in Production) is the only way to get what
/// was missed (https://developer.apple.com/documentation/appstoreserverapi/get-notification-history).
///
/// Rules: pages are asked one after another, `paginationToken` to `paginationToken`, until
/// `hasMore` is false; a page Apple does not give ends the run with `stoppedBy` set (what was
/// stored before stays stored; a later run asks again); a notification that does not verify is
/// counted `failed` and the run goes on; a store failure ends the run.
public struct NotificationRecovery: Sendable {
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
                    if tally.failures.count < 10 { tally.failures.append(refusal.detail) }
                }
            }
            guard page.hasMore, let next = page.paginationToken, next != token else { return tally }
            token = next
        }
    }
}
