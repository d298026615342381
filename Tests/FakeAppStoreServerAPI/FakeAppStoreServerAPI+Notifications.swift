import AppleTestChain
import AsyncHTTPClient
import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import NIOHTTP1
import Synchronization

/// The fake's App Store Server Notifications side, as Apple's
/// (https://developer.apple.com/documentation/appstoreserverapi/get-notification-history,
/// request-a-test-notification, get-test-notification-status, set-app-account-token):
///
/// - `send(_:environment:)` delivers a notification to the environment's notification URL once
///   (as Apple does in Sandbox) and remembers it with the attempt's result (`SUCCESS` for a 200,
///   `UNSUCCESSFUL_HTTP_RESPONSE_CODE` for another status, `NO_RESPONSE` when nothing answered);
///   `retryFailed(environment:)` is one more attempt for each that never succeeded.
/// - Get Notification History (`POST …/inApps/v1/notifications/history`) answers the remembered
///   notifications of that environment sent within `startDate`…`endDate`, of `notificationType`
///   when given, only the never-delivered ones with `onlyFailures`, `pageSize` a page through
///   `paginationToken` / `hasMore`.
/// - Request a Test Notification makes a `TEST` notification signed by the notification signer,
///   sends it, and answers its `testNotificationToken`; Get Test Notification Status answers its
///   `signedPayload` and `sendAttempts` (404 4040008, Apple's `TestNotificationNotFoundError`, for
///   an unknown token).
/// - Set App Account Token (`PUT …/transactions/{originalTransactionId}/appAccountToken`) needs
///   `{"appAccountToken": "<UUID>"}` (else 400 4000183, InvalidAppAccountTokenUUIDError) and an
///   original transaction of a customer of that environment (else 404 4040005).
extension FakeAppStoreServerAPI {
    /// A notification the fake sent (or tried to).
    public struct SentNotification: Sendable, Hashable {
        public var environment: String
        public var signedPayload: String
        public var notificationType: String
        public var sentAt: Date
        /// `(attemptDate, sendAttemptResult)`, oldest first.
        public var attempts: [Attempt]

        public struct Attempt: Sendable, Hashable {
            public var date: Date
            public var result: String
        }

        public var delivered: Bool { attempts.contains { $0.result == "SUCCESS" } }
    }

    /// Where notifications of `environment` ("Production" or "Sandbox") go (the app's App Store
    /// Server Notifications URL in App Store Connect).
    public func setNotificationURL(_ url: String?, environment: String) { state.withLock { $0.notificationURLs[environment] = url } }
    /// The chain that signs the test notifications the fake makes.
    public func setNotificationSigner(_ chain: TestAppleChain) { state.withLock { $0.notificationSigner = chain } }
    public var sentNotifications: [SentNotification] { state.withLock { $0.notifications } }
    /// The appAccountToken Set App Account Token last set per original transaction ID.
    public var appAccountTokens: [String: String] { state.withLock { $0.appAccountTokens } }

    /// Sends a notification (a `signedPayload`) once, and remembers it for Get Notification History.
    @discardableResult
    public func send(_ signedPayload: String, environment: String = "Production", at date: Date = Date()) async -> SentNotification {
        let type = Self.notificationType(signedPayload) ?? "UNKNOWN"
        let index = state.withLock { state -> Int in
            state.notifications.append(.init(environment: environment, signedPayload: signedPayload, notificationType: type, sentAt: date, attempts: []))
            return state.notifications.count - 1
        }
        await attempt(index)
        return state.withLock { $0.notifications[index] }
    }

    /// One more delivery attempt of every notification of `environment` not delivered yet.
    public func retryFailed(environment: String = "Production") async {
        let indices = state.withLock { state in state.notifications.indices.filter { state.notifications[$0].environment == environment && !state.notifications[$0].delivered } }
        for index in indices { await attempt(index) }
    }

    private func attempt(_ index: Int) async {
        let (url, payload) = state.withLock { ($0.notificationURLs[$0.notifications[index].environment], $0.notifications[index].signedPayload) }
        var result = "NO_RESPONSE"
        if let url {
            var request = HTTPClientRequest(url: url)
            request.method = .POST
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: #"{"signedPayload":"\#(payload)"}"#))
            // AsyncHTTPClient retries a refused connection until the deadline, so a URL where
            // nothing listens (an outage) is found by one connect first; a listening endpoint gets
            // a deadline long enough for a loaded test machine.
            if Self.acceptsConnections(url), let response = try? await HTTPClient.shared.execute(request, timeout: .seconds(15)) {
                _ = try? await response.body.collect(upTo: 1 << 20)
                result = response.status.code == 200 ? "SUCCESS" : "UNSUCCESSFUL_HTTP_RESPONSE_CODE"
            }
        }
        state.withLock { $0.notifications[index].attempts.append(.init(date: Date(), result: result)) }
    }

    /// Whether something accepts a TCP connection at `url`'s host and port (IPv4 literal hosts,
    /// as the tests use); a refused loopback connection answers at once.
    static func acceptsConnections(_ url: String) -> Bool {
        guard let components = URLComponents(string: url), let host = components.host, let port = components.port else { return false }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { return true }
        #if canImport(Glibc)
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        #else
        let descriptor = socket(AF_INET, SOCK_STREAM, 0)
        #endif
        guard descriptor >= 0 else { return true }
        defer { close(descriptor) }
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return connected == 0
    }

    static func notificationType(_ signedPayload: String) -> String? {
        let parts = signedPayload.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let data = base64URLDecode(parts[1]),
            let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any]
        else { return nil }
        return object["notificationType"] as? String
    }

    func addNotificationRoutes(to router: Router<BasicRequestContext>) {
        router.post("/:environment/inApps/v1/notifications/history") { request, context in
            let body = try await request.body.collect(upTo: 1 << 16)
            let text = String(buffer: body)
            return await self.answer(.notificationHistory, request: request, context: context, requestBody: text) { environment, _, token in
                self.history(environment: environment, body: text, paginationToken: token)
            }
        }
        router.post("/:environment/inApps/v1/notifications/test") { request, context in
            await self.answer(.requestTestNotification, request: request, context: context, requestBody: nil) { environment, _, _ in
                await self.makeTestNotification(environment: environment)
            }
        }
        router.get("/:environment/inApps/v1/notifications/test/:transactionID") { request, context in
            await self.answer(.testNotificationStatus, request: request, context: context, requestBody: nil) { _, token, _ in
                self.testNotificationStatus(token: token)
            }
        }
        router.put("/:environment/inApps/v1/transactions/:transactionID/appAccountToken") { request, context in
            let body = try await request.body.collect(upTo: 1 << 16)
            let text = String(buffer: body)
            return await self.answer(.setAppAccountToken, request: request, context: context, requestBody: text) { environment, originalTransactionID, _ in
                self.setAppAccountToken(environment: environment, originalTransactionID: originalTransactionID, body: text)
            }
        }
    }

    private func history(environment: String, body: String, paginationToken: String?) -> Response {
        guard let request = (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any],
            let start = (request["startDate"] as? NSNumber)?.int64Value, let end = (request["endDate"] as? NSNumber)?.int64Value
        else {
            return Self.json(#"{"errorCode":4000015,"errorMessage":"Invalid start date."}"#, status: .badRequest)
        }
        guard end > start else { return Self.json(#"{"errorCode":4000013,"errorMessage":"Start date after end date."}"#, status: .badRequest) }
        let type = request["notificationType"] as? String
        let onlyFailures = request["onlyFailures"] as? Bool ?? false
        let offset = paginationToken.flatMap { $0.hasPrefix("page-") ? Int($0.dropFirst(5)) : nil } ?? 0
        if paginationToken != nil && offset == 0 {
            return Self.json(#"{"errorCode":4000014,"errorMessage":"Invalid pagination token."}"#, status: .badRequest)
        }
        let matching = state.withLock { $0.notifications }.filter { notification in
            let sent = Int64((notification.sentAt.timeIntervalSince1970 * 1000).rounded(.down))
            return notification.environment == environment && sent >= start && sent <= end && (type == nil || notification.notificationType == type)
                && (!onlyFailures || !notification.delivered)
        }
        let page = Array(matching.dropFirst(offset).prefix(pageSize))
        let next = offset + page.count
        let hasMore = next < matching.count
        let items = page.map { notification in
            let attempts = notification.attempts.map {
                #"{"attemptDate":\#(Int64(($0.date.timeIntervalSince1970 * 1000).rounded(.down))),"sendAttemptResult":"\#($0.result)"}"#
            }
            return #"{"sendAttempts":[\#(attempts.joined(separator: ","))],"signedPayload":"\#(notification.signedPayload)"}"#
        }
        let token = hasMore ? #""paginationToken":"page-\#(next)","# : ""
        return Self.json(#"{\#(token)"hasMore":\#(hasMore),"notificationHistory":[\#(items.joined(separator: ","))]}"#)
    }

    private func makeTestNotification(environment: String) async -> Response {
        guard let signer = state.withLock({ $0.notificationSigner }) else {
            return Self.json(#"{"errorCode":5000000,"errorMessage":"the fake has no notification signer"}"#, status: .internalServerError)
        }
        let now = Date()
        var data: [String: Any] = ["bundleId": bundleID, "environment": environment]
        if environment == "Production" { data["appAppleId"] = appAppleID }
        let payload: [String: Any] = [
            "notificationType": "TEST", "notificationUUID": UUID().uuidString.lowercased(), "version": "2.0",
            "signedDate": TestAppleChain.milliseconds(now), "data": data,
        ]
        guard let signed = try? signer.signJWS(payload) else {
            return Self.json(#"{"errorCode":5000000,"errorMessage":"could not sign"}"#, status: .internalServerError)
        }
        let token = UUID().uuidString.lowercased()
        let index = state.withLock { state -> Int in
            state.notifications.append(.init(environment: environment, signedPayload: signed, notificationType: "TEST", sentAt: now, attempts: []))
            state.testNotifications[token] = state.notifications.count - 1
            return state.notifications.count - 1
        }
        // Apple answers first and sends the notification moments later.
        Task { await self.attempt(index) }
        return Self.json(#"{"testNotificationToken":"\#(token)"}"#)
    }

    private func testNotificationStatus(token: String) -> Response {
        guard let notification = state.withLock({ state in state.testNotifications[token].map { state.notifications[$0] } }) else {
            return Self.json(#"{"errorCode":4040008,"errorMessage":"Test notification not found."}"#, status: .notFound)
        }
        let attempts = notification.attempts.map {
            #"{"attemptDate":\#(Int64(($0.date.timeIntervalSince1970 * 1000).rounded(.down))),"sendAttemptResult":"\#($0.result)"}"#
        }
        return Self.json(#"{"signedPayload":"\#(notification.signedPayload)","sendAttempts":[\#(attempts.joined(separator: ","))]}"#)
    }

    private func setAppAccountToken(environment: String, originalTransactionID: String, body: String) -> Response {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any], let token = object["appAccountToken"] as? String,
            UUID(uuidString: token) != nil
        else {
            return Self.json(#"{"errorCode":4000183,"errorMessage":"Invalid request. The app account token field must be a valid UUID."}"#, status: .badRequest)
        }
        let known = state.withLock { $0.customers.contains { $0.environment == environment && $0.transactionIDs.contains(originalTransactionID) } }
        guard known else {
            return Self.json(#"{"errorCode":4040005,"errorMessage":"Original transaction id not found."}"#, status: .notFound)
        }
        state.withLock { $0.appAccountTokens[originalTransactionID] = token }
        return Response(status: .ok)
    }
}
