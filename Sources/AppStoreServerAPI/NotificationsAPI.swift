import Foundation
import NIOHTTP1
import OfferSignerCore
import OfferSignerEligibility

/// Apple's `NotificationHistoryRequest`: the request body of Get Notification History
/// (https://developer.apple.com/documentation/appstoreserverapi/notificationhistoryrequest;
/// appstoreserverlibrary/models/NotificationHistoryRequest.py). `startDate` and `endDate` are
/// required (an `endDate` in the future is taken as now by Apple; "Choose a startDate that's
/// within the past 180 days. In the sandbox environment, choose a startDate that's within the past
/// 30 days."); give `transactionId` or `notificationType`, not both; a `notificationSubtype`
/// needs its `notificationType`.
public struct NotificationHistoryRequest: Sendable, Hashable {
    public var startDate: Date
    public var endDate: Date
    public var notificationType: String?
    public var notificationSubtype: String?
    public var transactionID: String?
    /// Only notifications Apple could not deliver (its `onlyFailures`).
    public var onlyFailures: Bool

    public init(
        startDate: Date, endDate: Date, notificationType: String? = nil, notificationSubtype: String? = nil, transactionID: String? = nil,
        onlyFailures: Bool = false
    ) {
        self.startDate = startDate
        self.endDate = endDate
        self.notificationType = notificationType
        self.notificationSubtype = notificationSubtype
        self.transactionID = transactionID
        self.onlyFailures = onlyFailures
    }

    /// Why Apple would refuse this request, or nil.
    public var problem: String? {
        if endDate <= startDate { return "the end date must be later than the start date" }
        if transactionID != nil && notificationType != nil { return "give a transaction ID or a notification type, not both (Apple's rule)" }
        if notificationSubtype != nil && notificationType == nil { return "a notification subtype needs its notification type (Apple's rule)" }
        return nil
    }

    /// The JSON body Apple expects (dates in milliseconds since 1970; absent fields left out).
    var json: String {
        var writer = JSONObjectWriter()
        writer.field("startDate", Int64((startDate.timeIntervalSince1970 * 1000).rounded(.down)))
        writer.field("endDate", Int64((endDate.timeIntervalSince1970 * 1000).rounded(.down)))
        if let notificationType { writer.field("notificationType", notificationType) }
        if let notificationSubtype { writer.field("notificationSubtype", notificationSubtype) }
        if let transactionID { writer.field("transactionId", transactionID) }
        if onlyFailures { writer.field("onlyFailures", true) }
        return writer.finish()
    }
}

/// Apple's `SendAttemptItem`: one attempt to deliver a notification and its result (e.g.
/// `SUCCESS`, `NO_RESPONSE`, `TIMED_OUT`, `UNSUCCESSFUL_HTTP_RESPONSE_CODE`; an open set,
/// appstoreserverlibrary/models/SendAttemptResult.py).
public struct NotificationSendAttempt: Sendable, Hashable, Decodable {
    public var attemptDate: Date?
    public var sendAttemptResult: String?

    enum CodingKeys: String, CodingKey { case attemptDate, sendAttemptResult }

    public init(attemptDate: Date?, sendAttemptResult: String?) {
        self.attemptDate = attemptDate
        self.sendAttemptResult = sendAttemptResult
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        attemptDate = try container.decodeIfPresent(Double.self, forKey: .attemptDate).map { Date(timeIntervalSince1970: $0 / 1000) }
        sendAttemptResult = try container.decodeIfPresent(String.self, forKey: .sendAttemptResult)
    }
}

/// Apple's `NotificationHistoryResponseItem`: a notification as Apple signed it (not yet
/// verified: hand `signedPayload` to the notification intake) and Apple's attempts to send it.
public struct NotificationHistoryItem: Sendable, Hashable, Decodable {
    public var signedPayload: String
    public var sendAttempts: [NotificationSendAttempt]

    enum CodingKeys: String, CodingKey { case signedPayload, sendAttempts }

    public init(signedPayload: String, sendAttempts: [NotificationSendAttempt]) {
        self.signedPayload = signedPayload
        self.sendAttempts = sendAttempts
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        signedPayload = try container.decode(String.self, forKey: .signedPayload)
        sendAttempts = try container.decodeIfPresent([NotificationSendAttempt].self, forKey: .sendAttempts) ?? []
    }
}

/// One page of Get Notification History (Apple's `NotificationHistoryResponse`: up to 20 items).
public struct NotificationHistoryPage: Sendable, Hashable {
    public var items: [NotificationHistoryItem]
    public var hasMore: Bool
    /// The token for the next page (when `hasMore`).
    public var paginationToken: String?
}

/// Apple's `CheckTestNotificationResponse` (Get Test Notification Status).
public struct TestNotificationStatus: Sendable, Hashable {
    /// The test notification as Apple signed it, when Apple has made it.
    public var signedPayload: String?
    public var sendAttempts: [NotificationSendAttempt]
}

private struct NotificationHistoryResponseBody: Decodable {
    var notificationHistory: [NotificationHistoryItem]?
    var hasMore: Bool?
    var paginationToken: String?
}

private struct SendTestNotificationResponseBody: Decodable {
    var testNotificationToken: String?
}

private struct CheckTestNotificationResponseBody: Decodable {
    var signedPayload: String?
    var sendAttempts: [NotificationSendAttempt]?
}

/// The App Store Server API's notification and account-token endpoints, for operators (the CLI)
/// and the scheduled notification catch-up, not for the signing path.
///
/// Rules: each call asks one environment (the operator's choice); it has `timeout` for all its
/// attempts (retries and `Retry-After` as for history lookups); failures are returned, never
/// thrown, as `HistoryUnavailable` (its reason and Apple's status and error code in the detail).
extension AppStoreServerAPIClient {
    /// One page of Get Notification History: `POST /inApps/v1/notifications/history`, the next
    /// page with the `paginationToken` query parameter
    /// (https://developer.apple.com/documentation/appstoreserverapi/get-notification-history;
    /// api_client.py `get_notification_history`).
    public func notificationHistoryPage(
        _ request: NotificationHistoryRequest, paginationToken: String?, environment: AppleEnvironment, app: AppStoreAppSettings,
        credentials: AppStoreServerAPICredentials, timeout: Duration = .seconds(30)
    ) async -> Result<NotificationHistoryPage, HistoryUnavailable> {
        if let problem = request.problem { return .failure(.init(.rejected, problem)) }
        var path = "/inApps/v1/notifications/history"
        if let paginationToken { path += "?paginationToken=" + Self.queryEscaped(paginationToken) }
        switch await call(
            endpoint: .notificationHistory, method: .POST, baseURL: configuration.baseURL(for: environment, app: app), path: path,
            body: Data(request.json.utf8), credentials: credentials, deadline: .now + timeout)
        {
        case .failure(let failure): return .failure(failure.unavailable)
        case .success(let data):
            guard let body = try? JSONDecoder().decode(NotificationHistoryResponseBody.self, from: data) else {
                return .failure(.init(.malformedResponse, "notification_history answered 200 with a body that is not Apple's NotificationHistoryResponse"))
            }
            let hasMore = body.hasMore ?? false
            if hasMore && (body.paginationToken ?? "").isEmpty {
                return .failure(.init(.malformedResponse, "hasMore is true but there is no paginationToken"))
            }
            return .success(NotificationHistoryPage(items: body.notificationHistory ?? [], hasMore: hasMore, paginationToken: body.paginationToken))
        }
    }

    /// Request a Test Notification: `POST /inApps/v1/notifications/test`, answered with a
    /// `testNotificationToken`
    /// (https://developer.apple.com/documentation/appstoreserverapi/request-a-test-notification;
    /// api_client.py `request_test_notification`).
    public func requestTestNotification(
        environment: AppleEnvironment, app: AppStoreAppSettings, credentials: AppStoreServerAPICredentials, timeout: Duration = .seconds(30)
    ) async -> Result<String, HistoryUnavailable> {
        switch await call(
            endpoint: .requestTestNotification, method: .POST, baseURL: configuration.baseURL(for: environment, app: app),
            path: "/inApps/v1/notifications/test", body: nil, credentials: credentials, deadline: .now + timeout)
        {
        case .failure(let failure): return .failure(failure.unavailable)
        case .success(let data):
            guard let token = (try? JSONDecoder().decode(SendTestNotificationResponseBody.self, from: data))?.testNotificationToken, !token.isEmpty else {
                return .failure(.init(.malformedResponse, "request_test_notification answered 200 without a testNotificationToken"))
            }
            return .success(token)
        }
    }

    /// Get Test Notification Status: `GET /inApps/v1/notifications/test/{testNotificationToken}`
    /// (https://developer.apple.com/documentation/appstoreserverapi/get-test-notification-status;
    /// api_client.py `get_test_notification_status`).
    public func testNotificationStatus(
        token: String, environment: AppleEnvironment, app: AppStoreAppSettings, credentials: AppStoreServerAPICredentials,
        timeout: Duration = .seconds(30)
    ) async -> Result<TestNotificationStatus, HistoryUnavailable> {
        guard Self.isPathSafe(token) else { return .failure(.init(.rejected, "the test notification token is not a string of letters, digits, '-', '_' or '.'")) }
        switch await call(
            endpoint: .testNotificationStatus, method: .GET, baseURL: configuration.baseURL(for: environment, app: app),
            path: "/inApps/v1/notifications/test/\(token)", body: nil, credentials: credentials, deadline: .now + timeout)
        {
        case .failure(let failure): return .failure(failure.unavailable)
        case .success(let data):
            guard let body = try? JSONDecoder().decode(CheckTestNotificationResponseBody.self, from: data) else {
                return .failure(.init(.malformedResponse, "test_notification_status answered 200 with a body that is not Apple's CheckTestNotificationResponse"))
            }
            return .success(TestNotificationStatus(signedPayload: body.signedPayload, sendAttempts: body.sendAttempts ?? []))
        }
    }

    /// Set App Account Token: `PUT /inApps/v1/transactions/{originalTransactionId}/appAccountToken`
    /// with `{"appAccountToken": "<UUID>"}` (Apple's `UpdateAppAccountTokenRequest`), for a
    /// purchase made outside the app or without a token
    /// (https://developer.apple.com/documentation/appstoreserverapi/set-app-account-token;
    /// api_client.py `set_app_account_token`). Apple answers 200 with no body.
    public func setAppAccountToken(
        originalTransactionID: String, appAccountToken: UUID, environment: AppleEnvironment, app: AppStoreAppSettings,
        credentials: AppStoreServerAPICredentials, timeout: Duration = .seconds(30)
    ) async -> Result<Void, HistoryUnavailable> {
        guard Self.isPathSafe(originalTransactionID) else {
            return .failure(.init(.rejected, "the original transaction ID is not a string of letters, digits, '-', '_' or '.'"))
        }
        var body = JSONObjectWriter()
        body.field("appAccountToken", appAccountToken.uuidString.lowercased())
        switch await call(
            endpoint: .setAppAccountToken, method: .PUT, baseURL: configuration.baseURL(for: environment, app: app),
            path: "/inApps/v1/transactions/\(originalTransactionID)/appAccountToken", body: Data(body.finish().utf8), credentials: credentials,
            deadline: .now + timeout)
        {
        case .failure(.notFound): return .failure(.init(.transactionNotFound, "Apple knows no such original transaction in \(environment.rawValue) (4040010)"))
        case .failure(let failure): return .failure(failure.unavailable)
        case .success: return .success(())
        }
    }
}

extension AppStoreServerAPIClient.CallFailure {
    var unavailable: HistoryUnavailable {
        switch self {
        case .notFound: .init(.transactionNotFound, "Apple answered 404 error 4040010 (TransactionIdNotFoundError)")
        case .unavailable(let unavailable): unavailable
        }
    }
}
