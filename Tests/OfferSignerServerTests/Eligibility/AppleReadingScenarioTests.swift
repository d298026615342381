import AppleTestChain
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing

/// Decisions on Apple's definitions (issue 29), end to end: histories as Apple sends them, App Store
/// Server Notifications V2 signed by the Apple-like test chain through the real endpoint, then
/// `POST /v1/offers/eligibility` or `/v1/offers/signatures` on the real server, on SQLite and
/// PostgreSQL. The server's clock is the real one, so every history is dated from now.
@Suite("Decisions on Apple's definitions, end to end", .serialized)
struct AppleReadingScenarioTests {
    static let bundleID = "com.example.app"
    static let appAppleID: Int64 = 1_234_567_890
    static let product = "pro.monthly"
    let chain: TestAppleChain
    /// Whole seconds, so that every date derived from it survives Apple's milliseconds exactly.
    let now = Date(timeIntervalSince1970: Date().timeIntervalSince1970.rounded(.down))

    init() throws {
        chain = try TestAppleChain()
    }

    static let catalog = #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production", "Sandbox"], "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:9/production", "sandboxURL": "http://127.0.0.1:9/sandbox"}}},
         "offers": [
          {"offerID": "wb_once_client", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "rules": {"maxRedemptions": 1, "waitBetweenOffersMonths": 12}},
          {"offerID": "wb_once_apple", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"maxRedemptions": 1, "waitBetweenOffersMonths": 12}},
          {"offerID": "wb_churn", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1}},
          {"offerID": "wb_lapse", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"lapsedMonths": {"min": 1}}},
          {"offerID": "wb_no_refunds", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"excludeRefunded": true}},
          {"offerID": "wb_paid_2", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 2}},
          {"offerID": "wb_paid_3", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 3}},
          {"offerID": "wb_wait", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"waitBetweenOffersMonths": 2}},
          {"offerID": "wb_wait_offer_end", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"waitBetweenOffersMonths": 2, "waitFrom": "offer-end"}},
          {"offerID": "wb_skew", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"waitBetweenOffersMonths": 1, "waitScope": "any-win-back"}},
          {"offerID": "wb_noskew", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"waitBetweenOffersMonths": 1, "waitScope": "any-win-back", "clockSkewSeconds": 0}},
          {"offerID": "wb_sandbox", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 3, "lapsedMonths": {"min": 2, "max": 12}}},
          {"offerID": "wb_sandbox_late", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"lapsedMonths": {"min": 3}}}
        ]}
        """#

    // MARK: Histories as Apple sends them

    /// One subscriber: a subscription (`original`) of consecutive periods.
    struct Subscriber: Sendable {
        var original: String
        var token = UUID().uuidString.lowercased()
        var environment = "Production"
        /// Each period's start and end, oldest first.
        var periods: [(start: Date, end: Date)]
        /// Fields to add to (or, with `removed`, remove from) each period's transaction.
        var extra: [Int: [String: any Sendable]] = [:]
        static let removed = "<removed>"

        func transactionID(_ index: Int) -> String { index == 0 ? original : "\(original)\(String(format: "%03d", index))" }

        func transaction(_ index: Int) -> [String: Any] {
            var payload: [String: Any] = [
                "transactionId": transactionID(index), "originalTransactionId": original, "productId": AppleReadingScenarioTests.product,
                "subscriptionGroupIdentifier": "G1", "purchaseDate": TestAppleChain.milliseconds(periods[index].start),
                "originalPurchaseDate": TestAppleChain.milliseconds(periods[0].start), "expiresDate": TestAppleChain.milliseconds(periods[index].end),
                "inAppOwnershipType": "PURCHASED", "environment": environment, "bundleId": AppleReadingScenarioTests.bundleID,
                "type": "Auto-Renewable Subscription", "price": 9990, "currency": "USD", "storefront": "USA", "appAccountToken": token,
                "transactionReason": index == 0 ? "PURCHASE" : "RENEWAL", "signedDate": TestAppleChain.milliseconds(periods[index].start),
            ]
            for (key, value) in extra[index] ?? [:] {
                if value as? String == Self.removed { payload.removeValue(forKey: key) } else { payload[key] = value }
            }
            return payload
        }

        /// The renewal info, as Apple states it now.
        func renewalInfo(autoRenew: Bool, billingRetry: Bool = false, grace: Date? = nil, expirationIntent: Int? = nil, at now: Date) -> [String: Any] {
            var info: [String: Any] = [
                "originalTransactionId": original, "productId": AppleReadingScenarioTests.product, "autoRenewProductId": AppleReadingScenarioTests.product,
                "autoRenewStatus": autoRenew ? 1 : 0, "isInBillingRetryPeriod": billingRetry, "environment": environment,
                "signedDate": TestAppleChain.milliseconds(now),
            ]
            if let grace { info["gracePeriodExpiresDate"] = TestAppleChain.milliseconds(grace) }
            if let expirationIntent { info["expirationIntent"] = expirationIntent }
            return info
        }
    }

    static var utc: Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar
    }

    /// `count` calendar months, the last ending at `end`, moved back to a day of the month that
    /// every month has (so that a month added to each start is the next start, on any test day).
    static func months(_ count: Int, endingAt end: Date) -> [(start: Date, end: Date)] {
        var end = end
        while utc.component(.day, from: end) > 28 { end.addTimeInterval(-86_400) }
        return (0..<count).map { index in
            (utc.date(byAdding: .month, value: index - count, to: end)!, utc.date(byAdding: .month, value: index - count + 1, to: end)!)
        }
    }

    func notification(_ type: String, subtype: String? = nil, environment: String = "Production", transaction: [String: Any], renewalInfo: [String: Any]? = nil) throws -> String {
        var data: [String: Any] = ["bundleId": Self.bundleID, "environment": environment, "bundleVersion": "1.0", "appAppleId": Self.appAppleID]
        data["signedTransactionInfo"] = try chain.signJWS(transaction)
        if let renewalInfo { data["signedRenewalInfo"] = try chain.signJWS(renewalInfo) }
        var payload: [String: Any] = [
            "notificationType": type, "notificationUUID": UUID().uuidString, "data": data, "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
        ]
        if let subtype { payload["subtype"] = subtype }
        return #"{"signedPayload":"\#(try chain.signJWS(payload))"}"#
    }

    /// SUBSCRIBED (INITIAL_BUY), DID_RENEW for each later period, then `last` (type, subtype) with the
    /// latest transaction and `renewalInfo`: each answered 200 and recorded.
    func follow(_ subscriber: Subscriber, renewalInfo: [String: Any], last: (String, String?), client: any TestClientProtocol) async throws {
        for index in subscriber.periods.indices {
            let answer = try await client.postJSON(
                "/v1/apple/notifications",
                try notification(
                    index == 0 ? "SUBSCRIBED" : "DID_RENEW", subtype: index == 0 ? "INITIAL_BUY" : nil, environment: subscriber.environment,
                    transaction: subscriber.transaction(index)))
            #expect(answer.status == .ok, "\(answer.text)")
        }
        let final = try await client.postJSON(
            "/v1/apple/notifications",
            try notification(last.0, subtype: last.1, environment: subscriber.environment, transaction: subscriber.transaction(subscriber.periods.count - 1), renewalInfo: renewalInfo))
        #expect(final.status == .ok, "\(final.text)")
    }

    /// The decisions for `offers`, by offer ID, decided on Apple's history of `subscriber`.
    func decide(_ offers: [String], for subscriber: Subscriber, client: any TestClientProtocol, secret: String) async throws -> [String: [String: Any]] {
        let list = offers.map { "\"\($0)\"" }.joined(separator: ",")
        let answer = try await client.postJSON(
            "/v1/offers/eligibility", #"{"appAccountToken":"\#(subscriber.token)","transactionID":"\#(subscriber.original)","offerIDs":[\#(list)]}"#, bearer: secret)
        #expect(answer.status == .ok, "\(answer.text)")
        let decisions = try #require(answer.json["decisions"] as? [[String: Any]], "\(answer.text)")
        for decision in decisions where decision["historySource"] as? String != "apple" {
            Issue.record("not decided on Apple's stored history: \(decision)")
        }
        return Dictionary(uniqueKeysWithValues: decisions.map { ($0["offerID"] as? String ?? "", $0) })
    }

    static func eligibleFrom(_ decision: [String: Any]?) -> Date? {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return (decision?["eligibleFrom"] as? String).flatMap(formatter.date(from:))
    }

    /// The real server on a fresh store of `backend`, with the catalog above and a client's secret.
    func withServer(
        _ backend: StoreBackend, catalog: String = Self.catalog, _ body: @escaping @Sendable (any TestClientProtocol, String, StoreFixture) async throws -> Void
    ) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: "SCENARIO01")
            _ = try await KeyRegistry.importKey(
                key, bundleID: Self.bundleID, issuerID: TestServer.issuerID, development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
            let secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
            var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
            configuration.operatorToken = TestServer.operatorToken
            configuration.host = "127.0.0.1"
            configuration.port = 0
            configuration.registryPollInterval = .milliseconds(50)
            configuration.clientRateLimit = .unlimited
            configuration.appAccountTokenRateLimit = .unlimited
            configuration.storeTimeout = .seconds(60)
            configuration.eligibility = try EligibilityConfiguration(
                catalogJSON: Data(catalog.utf8), trustedRootPEMs: [try chain.root.serializeAsPEM().pemString])
            let application = try await buildApplication(configuration: configuration, store: store)
            try await application.test(.live) { client in try await body(client, secret, fixture) }
        }
    }

    // MARK: Issuance is not redemption

    @Test("Cancel and retry a payment sheet: signed again; on Apple's history only Apple's redemption counts", arguments: StoreBackend.testedCases)
    func cancelAndRetry(backend: StoreBackend) async throws {
        let subscriber = Subscriber(original: "710000001", periods: Self.months(4, endingAt: now.addingTimeInterval(-90 * 86_400)))
        try await withServer(backend) { client, secret, _ in
            try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            // On the app's evidence: the second signature within 24 h is the same attempt.
            let evidence = try subscriber.periods.indices.map { "\"\(try chain.signJWS(subscriber.transaction($0)))\"" }.joined(separator: ",")
            let renewal = try chain.signJWS(subscriber.renewalInfo(autoRenew: false, at: now))
            let clientRequest =
                #"{"productID":"pro.monthly","offerID":"wb_once_client","appAccountToken":"\#(subscriber.token)","evidence":{"signedTransactions":[\#(evidence)],"signedRenewalInfos":["\#(renewal)"]}}"#
            for attempt in 1...2 {
                let signed = try await client.postJSON("/v1/offers/signatures", clientRequest, bearer: secret)
                #expect(signed.status == .created, "attempt \(attempt): \(signed.text)")
            }
            // On Apple's history: signatures that were not redeemed count for nothing.
            let appleRequest = #"{"productID":"pro.monthly","offerID":"wb_once_apple","appAccountToken":"\#(subscriber.token)","transactionID":"\#(subscriber.original)"}"#
            for attempt in 1...2 {
                let signed = try await client.postJSON("/v1/offers/signatures", appleRequest, bearer: secret)
                #expect(signed.status == .created, "attempt \(attempt): \(signed.text)")
            }
            // Apple records the redemption: now it counts.
            var redeemed = subscriber
            redeemed.periods.append((now.addingTimeInterval(-5), Self.utc.date(byAdding: .month, value: 1, to: now)!))
            redeemed.extra[redeemed.periods.count - 1] = [
                "offerType": 2, "offerIdentifier": "wb_once_apple", "offerDiscountType": "PAY_UP_FRONT", "price": 4990, "transactionReason": "PURCHASE",
            ]
            let answer = try await client.postJSON(
                "/v1/apple/notifications",
                try notification("SUBSCRIBED", subtype: "RESUBSCRIBE", transaction: redeemed.transaction(redeemed.periods.count - 1),
                    renewalInfo: redeemed.renewalInfo(autoRenew: true, at: now)))
            #expect(answer.status == .ok, "\(answer.text)")
            expectProblem(try await client.postJSON("/v1/offers/signatures", appleRequest, bearer: secret), .forbidden, "not_eligible")
            let decision = try await decide(["wb_once_apple"], for: subscriber, client: client, secret: secret)["wb_once_apple"]
            #expect((decision?["reasons"] as? [String]).map { $0.contains("max_redemptions") && $0.contains("redeemed_too_recently") } == true, "\(String(describing: decision))")
        }
    }

    @Test(
        "A stored history decided on before: the next signature reads its version with the customer lock (one round trip on PostgreSQL) and decides there; once a notification changed it, the signature is decided again before the lock, on the new history",
        arguments: StoreBackend.testedCases)
    func storedHistoryVersionReadWithTheLock(backend: StoreBackend) async throws {
        let subscriber = Subscriber(original: "710000002", periods: Self.months(4, endingAt: now.addingTimeInterval(-90 * 86_400)))
        try await withServer(backend) { client, secret, _ in
            try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            let request = #"{"productID":"pro.monthly","offerID":"wb_once_apple","appAccountToken":"\#(subscriber.token)","transactionID":"\#(subscriber.original)"}"#
            func withLock() async throws -> String {
                let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
                return metrics.split(separator: "\n").filter { $0.hasPrefix("offer_signer_stored_history_with_lock_total{") }.joined(separator: "; ")
            }
            // The first decision reads and verifies the history before the lock, as before.
            let first = try await client.postJSON("/v1/offers/signatures", request, bearer: secret)
            #expect(first.status == .created, "\(first.text)")
            #expect(try await withLock() == "")
            // Decided on before: its version comes with the lock, and the decoded history decides.
            for attempt in 1...2 {
                let signed = try await client.postJSON("/v1/offers/signatures", request, bearer: secret)
                #expect(signed.status == .created, "attempt \(attempt): \(signed.text)")
            }
            #expect(try await withLock() == #"offer_signer_stored_history_with_lock_total{outcome="decided"} 2"#)
            // Apple records the redemption: the version read with the lock has moved, so the
            // request is decided again before the lock, on the new history, which counts it.
            var redeemed = subscriber
            redeemed.periods.append((now.addingTimeInterval(-5), Self.utc.date(byAdding: .month, value: 1, to: now)!))
            redeemed.extra[redeemed.periods.count - 1] = [
                "offerType": 2, "offerIdentifier": "wb_once_apple", "offerDiscountType": "PAY_UP_FRONT", "price": 4990, "transactionReason": "PURCHASE",
            ]
            let answer = try await client.postJSON(
                "/v1/apple/notifications",
                try notification("SUBSCRIBED", subtype: "RESUBSCRIBE", transaction: redeemed.transaction(redeemed.periods.count - 1),
                    renewalInfo: redeemed.renewalInfo(autoRenew: true, at: now)))
            #expect(answer.status == .ok, "\(answer.text)")
            expectProblem(try await client.postJSON("/v1/offers/signatures", request, bearer: secret), .forbidden, "not_eligible")
            let counts = try await withLock()
            #expect(counts.contains(#"{outcome="decided"} 2"#) && counts.contains(#"{outcome="moved"} 1"#), "\(counts)")
        }
    }

    @Test("The ledger's Retention Messaging client is the one RetentionController records")
    func retentionClientIsThePageViewClient() {
        #expect(RetentionController.client == LedgerIssuance.pageViewClient)
    }

    // MARK: Churn

    @Test("Billing retry: not churned, no eligibleFrom; grace period: still subscribed; auto-renew on after expiry: not churned", arguments: StoreBackend.testedCases)
    func notChurned(backend: StoreBackend) async throws {
        let retrying = Subscriber(original: "720000001", periods: Self.months(4, endingAt: now.addingTimeInterval(-10 * 86_400)))
        let inGrace = Subscriber(original: "720000002", periods: Self.months(4, endingAt: now.addingTimeInterval(-2 * 86_400)))
        let willRenew = Subscriber(original: "720000003", periods: Self.months(4, endingAt: now.addingTimeInterval(-10 * 86_400)))
        let churned = Subscriber(original: "720000004", periods: Self.months(4, endingAt: now.addingTimeInterval(-10 * 86_400)))
        try await withServer(backend) { client, secret, _ in
            try await follow(
                retrying, renewalInfo: retrying.renewalInfo(autoRenew: true, billingRetry: true, expirationIntent: 2, at: now), last: ("DID_FAIL_TO_RENEW", nil), client: client)
            try await follow(
                inGrace, renewalInfo: inGrace.renewalInfo(autoRenew: true, billingRetry: true, grace: now.addingTimeInterval(4 * 86_400), at: now),
                last: ("DID_FAIL_TO_RENEW", "GRACE_PERIOD"), client: client)
            try await follow(willRenew, renewalInfo: willRenew.renewalInfo(autoRenew: true, at: now), last: ("DID_RENEW", nil), client: client)
            try await follow(churned, renewalInfo: churned.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)

            let retry = try await decide(["wb_churn", "wb_lapse"], for: retrying, client: client, secret: secret)
            #expect(retry["wb_churn"]?["reasons"] as? [String] == ["billing_retry"], "\(retry)")
            #expect(retry["wb_lapse"]?["reasons"] as? [String] == ["lapsed_too_recently", "billing_retry"], "\(retry)")
            #expect(retry["wb_lapse"]?["eligibleFrom"] == nil, "eligibleFrom never points inside a billing retry")
            let grace = try await decide(["wb_churn"], for: inGrace, client: client, secret: secret)
            #expect(grace["wb_churn"]?["reasons"] as? [String] == ["currently_subscribed", "billing_retry"], "\(grace)")
            #expect(grace["wb_churn"]?["eligibleFrom"] == nil)
            let renewing = try await decide(["wb_churn"], for: willRenew, client: client, secret: secret)
            #expect(renewing["wb_churn"]?["reasons"] as? [String] == ["auto_renew_on"], "\(renewing)")
            let gone = try await decide(["wb_churn", "wb_lapse"], for: churned, client: client, secret: secret)
            #expect(gone["wb_churn"]?["eligible"] as? Bool == true, "\(gone)")
            #expect(Self.eligibleFrom(gone["wb_lapse"]) == Self.utc.date(byAdding: .month, value: 1, to: churned.periods.last!.end), "\(gone)")
        }
    }

    // MARK: Revocations and paid time

    @Test("A Family Sharing revocation is not a refund; a full refund is; a prorated refund removes only its share", arguments: StoreBackend.testedCases)
    func revocations(backend: StoreBackend) async throws {
        let ended = now.addingTimeInterval(-60 * 86_400)
        var familyShared = Subscriber(original: "730000001", periods: Self.months(3, endingAt: ended))
        for index in familyShared.periods.indices { familyShared.extra[index] = ["inAppOwnershipType": "FAMILY_SHARED"] }
        let family = familyShared
        let refunded = Subscriber(original: "730000002", periods: Self.months(3, endingAt: ended))
        let prorated = Subscriber(original: "730000003", periods: Self.months(3, endingAt: ended))
        try await withServer(backend) { client, secret, _ in
            for subscriber in [family, refunded, prorated] {
                try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            }
            func revoke(_ subscriber: Subscriber, _ index: Int, type: String, notification kind: String, reason: Int, percentage: Int) async throws {
                var transaction = subscriber.transaction(index)
                transaction["revocationDate"] = TestAppleChain.milliseconds(subscriber.periods[index].end.addingTimeInterval(-86_400))
                transaction["revocationReason"] = reason
                transaction["revocationType"] = type
                transaction["revocationPercentage"] = percentage
                transaction["signedDate"] = TestAppleChain.milliseconds(now)
                let answer = try await client.postJSON("/v1/apple/notifications", try notification(kind, transaction: transaction))
                #expect(answer.status == .ok, "\(answer.text)")
            }
            try await revoke(family, 2, type: "FAMILY_REVOKE", notification: "REVOKE", reason: 0, percentage: 100_000)
            try await revoke(refunded, 2, type: "REFUND_FULL", notification: "REFUND", reason: 1, percentage: 100_000)
            try await revoke(prorated, 1, type: "REFUND_PRORATED", notification: "REFUND", reason: 0, percentage: 50_000)
            try await revoke(prorated, 2, type: "REFUND_PRORATED", notification: "REFUND", reason: 0, percentage: 50_000)

            let familyDecision = try await decide(["wb_no_refunds"], for: family, client: client, secret: secret)
            #expect(familyDecision["wb_no_refunds"]?["eligible"] as? Bool == true, "\(familyDecision)")
            let refundDecision = try await decide(["wb_no_refunds"], for: refunded, client: client, secret: secret)
            #expect(refundDecision["wb_no_refunds"]?["reasons"] as? [String] == ["refunded"], "\(refundDecision)")
            // 1 month + half of two months = 2 months paid.
            let proratedDecision = try await decide(["wb_paid_2", "wb_paid_3"], for: prorated, client: client, secret: secret)
            #expect(proratedDecision["wb_paid_2"]?["eligible"] as? Bool == true, "\(proratedDecision)")
            #expect(proratedDecision["wb_paid_3"]?["reasons"] as? [String] == ["paid_too_short"], "\(proratedDecision)")
        }
    }

    @Test("A free promotional month (FREE_TRIAL, no price) is not paid time", arguments: StoreBackend.testedCases)
    func freePromotionalMonth(backend: StoreBackend) async throws {
        var freeMonth = Subscriber(original: "740000001", periods: Self.months(3, endingAt: now.addingTimeInterval(-30 * 86_400)))
        freeMonth.extra[1] = ["offerType": 2, "offerIdentifier": "free_month", "offerDiscountType": "FREE_TRIAL", "price": Subscriber.removed]
        let subscriber = freeMonth
        try await withServer(backend) { client, secret, _ in
            try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            let decisions = try await decide(["wb_paid_2", "wb_paid_3"], for: subscriber, client: client, secret: secret)
            #expect(decisions["wb_paid_2"]?["eligible"] as? Bool == true, "\(decisions)")
            #expect(decisions["wb_paid_3"]?["reasons"] as? [String] == ["paid_too_short"], "\(decisions)")
        }
    }

    // MARK: Time

    @Test("The wait runs from the end of the subscription that followed the redemption; with waitFrom offer-end, from the offer's last discounted period", arguments: StoreBackend.testedCases)
    func waitFromTheSubscriptionsEnd(backend: StoreBackend) async throws {
        // Pay as you go over periods 2 and 3, then period 4 at the full price; one subscriber per offer.
        let customers = [("wb_wait", "750000001"), ("wb_wait_offer_end", "750000002")].map { offerID, original in
            var redeemed = Subscriber(original: original, periods: Self.months(5, endingAt: now.addingTimeInterval(-10 * 86_400)))
            redeemed.extra[2] = ["offerType": 2, "offerIdentifier": offerID, "offerDiscountType": "PAY_AS_YOU_GO", "price": 4990, "transactionReason": "PURCHASE"]
            redeemed.extra[3] = ["offerType": 2, "offerIdentifier": offerID, "offerDiscountType": "PAY_AS_YOU_GO", "price": 4990]
            return (offerID, redeemed)
        }
        try await withServer(backend) { client, secret, _ in
            for (offerID, customer) in customers {
                try await follow(customer, renewalInfo: customer.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
                let decision = try await decide([offerID], for: customer, client: client, secret: secret)[offerID]
                #expect(decision?["reasons"] as? [String] == ["redeemed_too_recently"], "\(offerID): \(String(describing: decision))")
                // The subscription's end (period 4), or the offer's (period 3).
                let from = offerID == "wb_wait" ? customer.periods[4].end : customer.periods[3].end
                #expect(Self.eligibleFrom(decision) == Self.utc.date(byAdding: .month, value: 2, to: from), "\(offerID): \(String(describing: decision))")
            }
        }
    }

    @Test("Jan 31 plus one month, through the endpoint: a month added to the 31st ends on the last day of a shorter month", arguments: StoreBackend.testedCases)
    func monthEndClamping(backend: StoreBackend) async throws {
        // The latest 31st (00:00 UTC) at least a day ago, and the fewest months after it that land,
        // clamped, in a shorter month after tomorrow (today, 2026-11-27: Oct 31 + 1 month = Nov 30).
        var lapse = Self.utc.startOfDay(for: now)
        while Self.utc.component(.day, from: lapse) != 31 || lapse > now.addingTimeInterval(-86_400) { lapse.addTimeInterval(-86_400) }
        var months = 1
        while Self.utc.component(.day, from: Self.utc.date(byAdding: .month, value: months, to: lapse)!) == 31
            || Self.utc.date(byAdding: .month, value: months, to: lapse)! <= now.addingTimeInterval(86_400)
        {
            months += 1
        }
        let expected = Self.utc.date(byAdding: .month, value: months, to: lapse)!
        #expect(Self.utc.component(.day, from: expected) < 31, "clamped to the end of the shorter month")
        let offer = #"{"offerID": "wb_month_end", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "win-back", "historySource": "apple", "rules": {"lapsedMonths": {"min": \#(months)}}},"#
        let catalog = Self.catalog.replacingOccurrences(of: #""offers": ["#, with: #""offers": ["# + offer)
        let subscriber = Subscriber(original: "770000001", periods: [(lapse.addingTimeInterval(-30 * 86_400), lapse)])
        try await withServer(backend, catalog: catalog) { client, secret, _ in
            try await follow(subscriber, renewalInfo: subscriber.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            let decision = try await decide(["wb_month_end"], for: subscriber, client: client, secret: secret)["wb_month_end"]
            #expect(decision?["reasons"] as? [String] == ["lapsed_too_recently"], "\(String(describing: decision))")
            #expect(Self.eligibleFrom(decision) == expected, "\(String(describing: decision))")
        }
    }

    @Test("Sandbox time: 5-minute months reach a win-back offer in minutes; clock skew: a wait ending within 60 s is over", arguments: StoreBackend.testedCases)
    func sandboxTimeAndClockSkew(backend: StoreBackend) async throws {
        let minute: TimeInterval = 60
        // Three Sandbox "months" of 5 minutes, the last ended 12 minutes ago.
        let end = now.addingTimeInterval(-12 * minute)
        let sandbox = Subscriber(original: "760000001", environment: "Sandbox", periods: (0..<3).map { index in
            (end.addingTimeInterval(Double(index - 3) * 5 * minute), end.addingTimeInterval(Double(index - 2) * 5 * minute))
        })
        // A redemption whose one-month (5 minutes) wait ends 30 s from now.
        let offerEnd = now.addingTimeInterval(30 - 5 * minute)
        var skewedHistory = Subscriber(original: "760000002", environment: "Sandbox", periods: (0..<4).map { index in
            (offerEnd.addingTimeInterval(Double(index - 4) * 5 * minute), offerEnd.addingTimeInterval(Double(index - 3) * 5 * minute))
        })
        skewedHistory.extra[3] = ["offerType": 2, "offerIdentifier": "wb_skew", "offerDiscountType": "PAY_UP_FRONT", "price": 4990, "transactionReason": "PURCHASE"]
        let skewed = skewedHistory
        try await withServer(backend) { client, secret, _ in
            try await follow(sandbox, renewalInfo: sandbox.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)
            try await follow(skewed, renewalInfo: skewed.renewalInfo(autoRenew: false, expirationIntent: 1, at: now), last: ("EXPIRED", "VOLUNTARY"), client: client)

            let sandboxDecisions = try await decide(["wb_sandbox", "wb_sandbox_late"], for: sandbox, client: client, secret: secret)
            #expect(sandboxDecisions["wb_sandbox"]?["eligible"] as? Bool == true, "\(sandboxDecisions)")
            #expect(sandboxDecisions["wb_sandbox_late"]?["reasons"] as? [String] == ["lapsed_too_recently"], "\(sandboxDecisions)")
            #expect(Self.eligibleFrom(sandboxDecisions["wb_sandbox_late"]) == end.addingTimeInterval(15 * minute), "\(sandboxDecisions)")

            let skewDecisions = try await decide(["wb_skew", "wb_noskew"], for: skewed, client: client, secret: secret)
            #expect(skewDecisions["wb_skew"]?["eligible"] as? Bool == true, "within the default 60 s: \(skewDecisions)")
            #expect(skewDecisions["wb_noskew"]?["reasons"] as? [String] == ["redeemed_too_recently"], "clockSkewSeconds 0: \(skewDecisions)")
        }
    }

    // MARK: Pay as you go

    @Test("A three-month pay-as-you-go offer (offerPeriod P3M) accepted again for the renewal that ends its run: two redemptions, each matched to its own signature", arguments: StoreBackend.testedCases)
    func payAsYouGoTakenAgain(backend: StoreBackend) async throws {
        // Period 4, the second run's first, begins about ten days from now (on a day every month
        // has); periods 1–3 are the first run (the third is running now), 5 continues the second.
        var second = now.addingTimeInterval(10 * 86_400)
        while Self.utc.component(.day, from: second) > 28 { second.addTimeInterval(-86_400) }
        let anchor = second
        let periods = (0..<6).map { index in
            (start: Self.utc.date(byAdding: .month, value: index - 4, to: anchor)!, end: Self.utc.date(byAdding: .month, value: index - 3, to: anchor)!)
        }
        var subscriber = Subscriber(original: "780000001", periods: periods)
        for index in periods.indices {
            subscriber.extra[index] = ["signedDate": TestAppleChain.milliseconds(min(periods[index].0, now))]
        }
        for index in 1...5 {
            subscriber.extra[index]?.merge(
                ["offerType": 2, "offerIdentifier": "paygo_3m", "offerDiscountType": "PAY_AS_YOU_GO", "offerPeriod": "P3M", "price": 4990]) { $1 }
        }
        let customer = subscriber
        try await withServer(backend) { client, secret, fixture in
            // The first run's signature, issued during period 0 (before the offer's first renewal).
            let firstIssuedAt = periods[0].0.addingTimeInterval(5 * 86_400)
            let first = IssuedSignature(
                nonce: UUID().uuidString.lowercased(), issuedAt: firstIssuedAt, client: "client:backend", bundleID: Self.bundleID, productID: Self.product,
                offerID: "paygo_3m", appAccountToken: customer.token, keyID: "SCENARIO01", format: "jws", environment: "Production")
            let appended = try await fixture.store.appendAudit([AuditAppend(entry: first.auditEntry, signatures: [first])], at: firstIssuedAt)
            let firstSequence = try #require(appended.first?.sequence)
            // The second run's: accepted now, during the first run's last period.
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"paygo_3m","appAccountToken":"\#(customer.token)"}"#, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")

            for index in periods.indices {
                let answer = try await client.postJSON(
                    "/v1/apple/notifications",
                    try notification(index == 0 ? "SUBSCRIBED" : "DID_RENEW", subtype: index == 0 ? "INITIAL_BUY" : nil, transaction: customer.transaction(index)))
                #expect(answer.status == .ok, "period \(index): \(answer.text)")
            }

            let redemptions = try await fixture.store.offerRedemptions(since: nil).filter { $0.candidate.offerID == "paygo_3m" }
                .sorted { $0.candidate.purchaseDate < $1.candidate.purchaseDate }
            #expect(redemptions.map(\.candidate.transactionID) == [customer.transactionID(1), customer.transactionID(4)], "\(redemptions)")
            #expect(redemptions.allSatisfy { $0.state == .matched }, "\(redemptions.map(\.state))")
            #expect(redemptions.first?.issuanceSequence == firstSequence, "the first run, to the first signature")
            let secondRun = try #require(redemptions.last)
            #expect(secondRun.issuanceSequence != firstSequence, "the second run, to its own signature")
            #expect(secondRun.signatureIssuedAt.map { abs($0.timeIntervalSince(now)) < 600 } == true, "the signature issued now")
            let rows = OfferReport.rows(issuances: try await fixture.store.offerIssuances(since: nil), redemptions: try await fixture.store.offerRedemptions(since: nil))
            let row = try #require(rows.first { $0.offerID == "paygo_3m" })
            #expect(row.matched.count == 2 && row.unmatched == 0 && row.unplaced == 0)
        }
    }
}
