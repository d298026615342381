import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing
import X509

/// App Store Server Notifications V2 on the real server (loopback, real SQLite store), signed by
/// the Apple-like test chain: verified, stored once, deciding offers, and tracking redemptions.
@Suite("App Store Server Notifications V2", .serialized)
struct AppleNotificationTests {
    static let bundleID = "com.example.app"
    static let appAppleID: Int64 = 1_234_567_890
    static let token = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    let chain: TestAppleChain
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
    }

    static func catalog(port: Int) -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production"], "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production"}}},
         "offers": [
          {"offerID": "wb_apple", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
          {"offerID": "wb_client", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "win-back", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
          {"offerID": "wb_other_group", "bundleID": "com.example.app", "productIDs": ["pro.annual"], "subscriptionGroupID": "G2",
           "kind": "win-back", "historySource": "apple", "rules": {"minPaidMonths": 1, "lapsedMonths": {"min": 1}}},
          {"offerID": "loyal_no_refunds", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3, "excludeRefunded": true}}
        ]}
        """#
    }

    func subscriber() -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "400000001",
            appAccountToken: Self.token, periodStarts: SubscriptionFixture.monthlyStarts(count: 6, activeAt: now))
    }

    /// A notification body as Apple sends it, its payload signed by `signer`, the items inside by `itemSigner`.
    func body(
        _ type: String, subtype: String? = nil, uuid: String = UUID().uuidString, bundleID: String = Self.bundleID, environment: String = "Production",
        appAppleID: Int64? = Self.appAppleID, transaction: [String: Any]? = nil, renewalInfo: [String: Any]? = nil,
        signer: TestAppleChain? = nil, itemSigner: TestAppleChain? = nil
    ) throws -> String {
        var data: [String: Any] = ["bundleId": bundleID, "environment": environment, "bundleVersion": "1.0"]
        if let appAppleID { data["appAppleId"] = appAppleID }
        if let transaction { data["signedTransactionInfo"] = try (itemSigner ?? chain).signJWS(transaction) }
        if let renewalInfo { data["signedRenewalInfo"] = try (itemSigner ?? chain).signJWS(renewalInfo) }
        var payload: [String: Any] = [
            "notificationType": type, "notificationUUID": uuid, "data": data, "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
        ]
        if let subtype { payload["subtype"] = subtype }
        return #"{"signedPayload":"\#(try (signer ?? chain).signJWS(payload))"}"#
    }

    func renewal(_ customer: SubscriptionFixture) -> [String: Any] {
        [
            "originalTransactionId": customer.originalTransactionID, "productId": customer.productID, "autoRenewProductId": customer.productID,
            "autoRenewStatus": 1, "environment": customer.environment, "signedDate": TestAppleChain.milliseconds(now),
        ]
    }

    /// SUBSCRIBED (INITIAL_BUY) for the customer's first period, then DID_RENEW for each later
    /// one, as Apple sends them; each must be answered 200.
    func postEveryPeriod(of customer: SubscriptionFixture, to client: any TestClientProtocol) async throws {
        for index in customer.periodStarts.indices {
            let answer = try await client.postJSON(
                "/v1/apple/notifications",
                try body(index == 0 ? "SUBSCRIBED" : "DID_RENEW", subtype: index == 0 ? "INITIAL_BUY" : nil, transaction: customer.transactionPayload(index)))
            #expect(answer.status == .ok, "\(answer.text)")
        }
    }

    func withServer(
        cacheTTL: Duration? = nil, _ body: @escaping @Sendable (TestServer, FakeAppStoreServerAPI, String, any TestClientProtocol) async throws -> Void
    ) async throws {
        let server = try await TestServer(bundles: [Self.bundleID])
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        // Apple's API knows nobody: any decision the service takes comes from the notifications.
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let secret = try await server.createClient(name: "backend")
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { port in
            var running = server
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(Self.catalog(port: port).utf8), trustedRootPEMs: [root])
            // Generous: the whole suite shares two cores, and these tests are not about the budget.
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            if let cacheTTL { eligibility.appStoreServerAPI.cacheTTL = cacheTTL }
            running.configuration.eligibility = eligibility
            let configured = running
            try await configured.live { client in try await body(configured, fake, secret, client) }
        }
    }

    @Test("Notifications from the first purchase on decide historySource apple without Apple's API: the omission attack fails")
    func notificationsDecide() async throws {
        let customer = subscriber()
        try await withServer { server, fake, secret, client in
            for index in customer.periodStarts.indices {
                let type = index == 0 ? "SUBSCRIBED" : "DID_RENEW"
                let answer = try await client.postJSON(
                    "/v1/apple/notifications",
                    try body(type, subtype: index == 0 ? "INITIAL_BUY" : nil, uuid: "uuid-\(index)", transaction: customer.transactionPayload(index), renewalInfo: renewal(customer)))
                #expect(answer.status == .ok, "\(answer.text)")
                #expect(answer.json["status"] as? String == "recorded")
            }
            // Apple retries a notification it thinks we missed: answered 200, written once.
            let repeated = try await client.postJSON(
                "/v1/apple/notifications", try body("DID_RENEW", uuid: "uuid-5", transaction: customer.transactionPayload(5), renewalInfo: renewal(customer)))
            #expect(repeated.status == .ok)
            #expect(repeated.json["status"] as? String == "duplicate")
            #expect(try StoreCount.count(server.storePath, "apple_notifications") == 6)
            #expect(try StoreCount.count(server.storePath, "apple_transactions") == 6)

            // The tampered app sends its first three months only.
            let signed = try customer.signedTransactions(chain).prefix(3)
            let evidence = #"{"signedTransactions":[\#(signed.map { "\"\($0)\"" }.joined(separator: ","))],"signedRenewalInfos":[]}"#
            let answer = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.transactionID(3))","offerIDs":["wb_apple","wb_client"],"evidence":\#(evidence)}"#,
                bearer: secret)
            #expect(answer.status == .ok, "\(answer.text)")
            let decisions = try #require(answer.json["decisions"] as? [[String: Any]])
            let byOffer = Dictionary(uniqueKeysWithValues: decisions.map { ($0["offerID"] as? String ?? "", $0) })
            #expect(byOffer["wb_client"]?["eligible"] as? Bool == true, "the app's own word is fooled: \(answer.text)")
            #expect(byOffer["wb_apple"]?["reasons"] as? [String] == ["currently_subscribed"], "\(answer.text)")
            #expect(byOffer["wb_apple"]?["historySource"] as? String == "apple")
            #expect(fake.arrivals == 0, "the complete stored history decided; Apple's API was not asked")

            let refused = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)"}"#,
                bearer: secret)
            expectProblem(refused, .forbidden, "not_eligible")
            let decided = try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "eligibility.decided" }
            let last = try #require(decided.last)
            let audit = try #require(try JSONSerialization.jsonObject(with: Data(last.body.utf8)) as? [String: Any])
            #expect(audit["historySource"] as? String == "apple")
            #expect(audit["appleHistoryVia"] as? String == "store")
        }
    }

    @Test("A REFUND notification makes 'refunded' apply to the next decision, with no evidence from the app")
    func refundApplies() async throws {
        let customer = subscriber()
        try await withServer { _, fake, secret, client in
            try await postEveryPeriod(of: customer, to: client)
            let question = #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","offerIDs":["loyal_no_refunds"]}"#
            let before = try await client.postJSON("/v1/offers/eligibility", question, bearer: secret)
            #expect((before.json["decisions"] as? [[String: Any]])?.first?["eligible"] as? Bool == true, "\(before.text)")

            // Apple refunds the latest renewal.
            var refunded = customer.transactionPayload(5)
            refunded["revocationDate"] = TestAppleChain.milliseconds(now)
            refunded["revocationReason"] = 0
            refunded["signedDate"] = TestAppleChain.milliseconds(now)
            #expect(try await client.postJSON("/v1/apple/notifications", try body("REFUND", transaction: refunded)).status == .ok)

            let after = try await client.postJSON("/v1/offers/eligibility", question, bearer: secret)
            let decision = try #require((after.json["decisions"] as? [[String: Any]])?.first)
            #expect(decision["eligible"] as? Bool == false, "\(after.text)")
            #expect((decision["reasons"] as? [String])?.contains("refunded") == true, "\(after.text)")
            #expect(fake.arrivals == 0)
        }
    }

    @Test("A stored history without the offer's subscription group does not decide it: Apple's API is asked")
    func storedHistoryOfAnotherGroup() async throws {
        let customer = subscriber()
        try await withServer { _, fake, secret, client in
            try await postEveryPeriod(of: customer, to: client)
            // The app names its G1 subscription to ask about a G2 offer: the stored G1 history
            // would show no G2 history at all.
            let decision = try await client.postJSON(
                "/v1/offers/eligibility",
                #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","offerIDs":["wb_other_group"]}"#, bearer: secret)
            #expect(decision.status == .ok, "\(decision.text)")
            #expect(!fake.requests.isEmpty, "Apple's API was asked")
            #expect((decision.json["decisions"] as? [[String: Any]])?.first?["reasons"] as? [String] == ["history_unavailable"], "\(decision.text)")
        }
    }

    @Test("A history Apple answered for one subscription group (productType AUTO_RENEWABLE, subscriptionGroupIdentifier) is that group's complete history: the next decision for the group is the store's; another group's asks Apple")
    func groupFilteredHistoryIsCompleteForItsGroup() async throws {
        let g1 = subscriber()
        // The same customer's G2 subscription (lapsed) and a consumable: outside the G1 filter.
        let g2 = SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.annual", subscriptionGroupID: "G2", originalTransactionID: "400000002",
            appAccountToken: Self.token, periodStarts: SubscriptionFixture.monthlyStarts(count: 2, activeAt: now.addingTimeInterval(-200 * 86_400)))
        let consumable: [String: Any] = [
            "transactionId": "400000009", "originalTransactionId": "400000009", "productId": "coins.100", "bundleId": Self.bundleID,
            "purchaseDate": TestAppleChain.milliseconds(now.addingTimeInterval(-86_400)), "type": "Consumable", "inAppOwnershipType": "PURCHASED",
            "environment": "Production", "appAccountToken": Self.token, "signedDate": TestAppleChain.milliseconds(now), "transactionReason": "PURCHASE",
        ]
        var customer = try g1.customer(chain, now: now)
        let other = try g2.customer(chain, now: now)
        customer.transactionIDs.formUnion(other.transactionIDs.union(["400000009"]))
        customer.signedTransactions = other.signedTransactions + [try chain.signJWS(consumable)] + customer.signedTransactions
        customer.statuses += other.statuses
        let apple = customer
        // The client's own cache off: what does not reach Apple was answered by the store.
        try await withServer(cacheTTL: .zero) { server, fake, secret, client in
            fake.add(apple)
            func decide(_ offerID: String) async throws -> [String: Any] {
                let answer = try await client.postJSON(
                    "/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(g1.originalTransactionID)","offerIDs":["\#(offerID)"]}"#,
                    bearer: secret)
                #expect(answer.status == .ok, "\(answer.text)")
                return try #require((answer.json["decisions"] as? [[String: Any]])?.first, "\(answer.text)")
            }
            let first = try await decide("wb_apple")
            #expect(first["reasons"] as? [String] == ["currently_subscribed"], "\(first)")
            let historyPages = fake.requests.filter { $0.endpoint == .history }
            #expect(!historyPages.isEmpty && historyPages.allSatisfy { $0.query?.contains("subscriptionGroupIdentifier=G1") == true })
            // The filtered answer is written in the background: the G1 subscription becomes complete…
            let deadline = ContinuousClock.now + .seconds(20)
            var version = try await server.store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: g1.originalTransactionID)
            while version?.isComplete != true && ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(50))
                version = try await server.store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: g1.originalTransactionID)
            }
            #expect(version?.isComplete == true, "the G1 subscription is stored complete")
            // …and nothing outside the filter is: not the G2 subscription (only its renewal info came,
            // from the statuses), not the consumable.
            let g2Version = try await server.store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: g2.originalTransactionID)
            #expect(g2Version?.isComplete != true)
            let consumableVersion = try await server.store.appleHistoryVersion(bundleID: Self.bundleID, environment: "Production", transactionID: "400000009")
            #expect(consumableVersion?.isComplete != true)

            // The same group again: decided on the stored history, Apple is not asked.
            let asked = fake.requests.count
            let second = try await decide("wb_apple")
            #expect(second["reasons"] as? [String] == ["currently_subscribed"], "\(second)")
            #expect(fake.requests.count == asked, "\(fake.requests.dropFirst(asked).map(\.query))")

            // Another group: the stored G1 history does not stand for it; Apple is asked for G2.
            let third = try await decide("wb_other_group")
            #expect(third["historySource"] as? String == "apple", "\(third)")
            let later = fake.requests.dropFirst(asked).filter { $0.endpoint == .history }
            #expect(!later.isEmpty && later.allSatisfy { $0.query?.contains("subscriptionGroupIdentifier=G2") == true }, "\(later.map(\.query))")
        }
    }

    /// A complete history of a subscription whose last month ended two days ago, written to the
    /// store at `heardAt` (as if its last notification came then), each transaction with its JWS
    /// signed by the test chain (a stored history is verified again from its JWS when read).
    func storeLapsedHistory(in server: TestServer, heardAt: Date) async throws {
        var history = VerifiedHistory(bundleID: Self.bundleID, environment: .production, asOf: heardAt)
        let lastEnd = now.addingTimeInterval(-2 * 86_400)
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production)
        for month in 0..<4 {
            let start = Calendar(identifier: .gregorian).date(byAdding: .month, value: month - 4, to: lastEnd)!
            let end = Calendar(identifier: .gregorian).date(byAdding: .month, value: month - 3, to: lastEnd)!
            let jws = try chain.signJWS([
                "transactionId": "50000000\(month)", "originalTransactionId": "500000000", "productId": "pro.monthly", "subscriptionGroupIdentifier": "G1",
                "purchaseDate": TestAppleChain.milliseconds(start), "originalPurchaseDate": TestAppleChain.milliseconds(lastEnd.addingTimeInterval(-4 * 31 * 86_400)),
                "expiresDate": TestAppleChain.milliseconds(end), "price": 9_990, "currency": "USD", "storefront": "USA", "environment": "Production",
                "bundleId": Self.bundleID, "appAccountToken": Self.token, "signedDate": TestAppleChain.milliseconds(start),
                "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "transactionReason": month == 0 ? "PURCHASE" : "RENEWAL",
            ] as [String: Any])
            guard case .success(let transaction) = await verifier.verifyTransaction(jws, now: now) else {
                Issue.record("the test chain's transaction did not verify")
                return
            }
            history.record(transaction, jws: jws)
        }
        _ = try await server.store.recordAppleHistories([AppleHistoryConversion.update(history)], at: heardAt)
    }

    @Test("A stored history that heard nothing since its last period ended may have missed a renewal: Apple's API is asked")
    func staleStoredHistoryAsksApple() async throws {
        try await withServer { server, fake, secret, client in
            // Last heard of three days ago, before the period that ended two days ago: a DID_RENEW or
            // EXPIRED notification went missing.
            try await storeLapsedHistory(in: server, heardAt: now.addingTimeInterval(-3 * 86_400))
            let decision = try await client.postJSON(
                "/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","transactionID":"500000000","offerIDs":["wb_apple"]}"#, bearer: secret)
            #expect(decision.status == .ok, "\(decision.text)")
            #expect(!fake.requests.isEmpty, "Apple's API was asked")
            let decisions = try #require(decision.json["decisions"] as? [[String: Any]])
            #expect(decisions.first?["reasons"] as? [String] == ["history_unavailable"], "Apple does not know the customer: \(decision.text)")
        }
        try await withServer { server, fake, secret, client in
            // Heard of after that end (the EXPIRED notification came): the store decides.
            try await storeLapsedHistory(in: server, heardAt: now.addingTimeInterval(-86_400))
            let decision = try await client.postJSON(
                "/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","transactionID":"500000000","offerIDs":["wb_apple"]}"#, bearer: secret)
            #expect(decision.status == .ok, "\(decision.text)")
            #expect(fake.arrivals == 0, "the store decided")
            let decisions = try #require(decision.json["decisions"] as? [[String: Any]])
            #expect(decisions.first?["eligible"] as? Bool == false && decisions.first?["reasons"] as? [String] == ["lapsed_too_recently"], "\(decision.text)")
        }
    }

    @Test("A history seen only from the middle (no first purchase, never fetched) is not complete: Apple's API is asked")
    func incompleteHistoryAsksApple() async throws {
        let customer = subscriber()
        try await withServer { server, fake, secret, client in
            let answer = try await client.postJSON(
                "/v1/apple/notifications", try body("DID_RENEW", transaction: customer.transactionPayload(5), renewalInfo: renewal(customer)))
            #expect(answer.status == .ok, "\(answer.text)")
            let decision = try await client.postJSON(
                "/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","offerIDs":["wb_apple"]}"#,
                bearer: secret)
            #expect(decision.status == .ok, "\(decision.text)")
            let decisions = try #require(decision.json["decisions"] as? [[String: Any]])
            #expect(decisions.first?["reasons"] as? [String] == ["history_unavailable"], "Apple does not know the customer: \(decision.text)")
            #expect(!fake.requests.isEmpty)
        }
    }

    @Test("Forged and malformed notifications are refused (4xx), and nothing is stored")
    func refusals() async throws {
        let customer = subscriber()
        let stranger = try TestAppleChain()
        try await withServer { server, _, _, client in
            let transaction = customer.transactionPayload(0)
            let cases: [(String, String, HTTPResponse.Status, String)] = [
                ("payload signed by an untrusted chain", try body("SUBSCRIBED", transaction: transaction, signer: stranger), .badRequest, "notification_unverified"),
                ("transaction inside signed by an untrusted chain", try body("SUBSCRIBED", transaction: transaction, itemSigner: stranger), .badRequest, "notification_unverified"),
                ("a transaction of another app inside", try body("SUBSCRIBED", transaction: transaction.merging(["bundleId": "com.example.other"]) { $1 }), .badRequest, "notification_unverified"),
                ("an app transaction signed by an untrusted chain", try signedBody(rescindConsent(appTransactionSigner: stranger)), .badRequest, "notification_unverified"),
                ("not JSON", "signedPayload=abc", .badRequest, "malformed_json"),
                ("no signedPayload", #"{"payload":"x"}"#, .badRequest, "missing_field"),
                ("not a JWS", #"{"signedPayload":"a.b"}"#, .badRequest, "notification_unverified"),
            ]
            for (name, text, status, code) in cases {
                let answer = try await client.postJSON("/v1/apple/notifications", text)
                #expect(answer.status == status, "\(name): \(answer.text)")
                #expect(answer.json["code"] as? String == code, "\(name): \(answer.text)")
            }
            for table in AppleHistorySchema.tables {
                #expect(try StoreCount.count(server.storePath, table) == 0, "\(table) stays empty")
            }
            #expect(try await server.store.auditHead().count == 2, "only the key import and the client creation are audited")
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"outcome="notification_unverified""#), "refusals are counted")
        }
    }

    @Test("Verified notifications for another app, App Apple ID or environment are answered 200 ignored, counted, and not stored")
    func notServedIsIgnored() async throws {
        let customer = subscriber()
        try await withServer { server, _, _, client in
            let transaction = customer.transactionPayload(0)
            let cases: [(String, String, String)] = [
                ("another app", try body("SUBSCRIBED", bundleID: "com.example.other"), "ignored_app"),
                ("another app, again (logged once)", try body("SUBSCRIBED", bundleID: "com.example.other"), "ignored_app"),
                ("another App Apple ID", try body("SUBSCRIBED", appAppleID: 999, transaction: transaction), "ignored_app_apple_id"),
                ("no App Apple ID in Production", try body("SUBSCRIBED", appAppleID: nil, transaction: transaction), "ignored_app_apple_id"),
                ("Sandbox, which the app does not accept", try body("SUBSCRIBED", environment: "Sandbox", appAppleID: nil), "ignored_environment"),
            ]
            for (name, text, _) in cases {
                let answer = try await client.postJSON("/v1/apple/notifications", text)
                #expect(answer.status == .ok, "\(name): \(answer.text)")
                #expect(answer.json["status"] as? String == "ignored", "\(name): \(answer.text)")
            }
            for table in AppleHistorySchema.tables {
                #expect(try StoreCount.count(server.storePath, table) == 0, "\(table) stays empty")
            }
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"apple_notifications_total{type="SUBSCRIBED",outcome="ignored_app"} 2"#), "\(metrics.split(separator: "\n").filter { $0.contains("apple_notifications") })")
            #expect(metrics.contains(#"apple_notifications_total{type="SUBSCRIBED",outcome="ignored_app_apple_id"} 2"#))
            #expect(metrics.contains(#"apple_notifications_total{type="SUBSCRIBED",outcome="ignored_environment"} 1"#))
        }
    }

    /// Apple's `signedRescindConsentNotification.json` (app-store-server-library-python,
    /// tests/resources/models), for this app, with a signed AppTransaction inside.
    func rescindConsent(uuid: String = "002e14d5-51f5-4503-b5a8-c3a1af68eb20", appTransactionSigner: TestAppleChain? = nil) throws -> [String: Any] {
        let appTransaction: [String: Any] = [
            "receiptType": "Production", "appAppleId": Self.appAppleID, "bundleId": Self.bundleID, "applicationVersion": "1.2.3",
            "originalPurchaseDate": TestAppleChain.milliseconds(now), "signedDate": TestAppleChain.milliseconds(now), "appTransactionId": "71134",
        ]
        return [
            "notificationType": "RESCIND_CONSENT", "notificationUUID": uuid, "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
            "appData": [
                "appAppleId": Self.appAppleID, "bundleId": Self.bundleID, "environment": "Production",
                "signedAppTransactionInfo": try (appTransactionSigner ?? chain).signJWS(appTransaction),
            ] as [String: Any],
        ]
    }

    /// A notification body signed by the test chain, its payload as given.
    func signedBody(_ payload: [String: Any], signer: TestAppleChain? = nil) throws -> String {
        #"{"signedPayload":"\#(try (signer ?? chain).signJWS(payload))"}"#
    }

    @Test("Every payload shape of Apple's model (appData, summary, externalPurchaseToken) is verified, answered 200 and stored once")
    func everyPayloadShape() async throws {
        try await withServer { server, _, _, client in
            // Shaped as Apple's test resources (tests/resources/models/signedSummaryNotification.json,
            // signedExternalPurchaseTokenNotification.json), for this app.
            let summary: [String: Any] = [
                "notificationType": "RENEWAL_EXTENSION", "subtype": "SUMMARY", "notificationUUID": "uuid-summary", "version": "2.0",
                "signedDate": TestAppleChain.milliseconds(now),
                "summary": [
                    "environment": "Production", "appAppleId": Self.appAppleID, "bundleId": Self.bundleID, "productId": "pro.monthly",
                    "requestIdentifier": "efb27071-45a4-4aca-9854-2a1e9146f265", "storefrontCountryCodes": ["CAN", "USA", "MEX"],
                    "succeededCount": 5, "failedCount": 2,
                ] as [String: Any],
            ]
            let externalPurchase: [String: Any] = [
                "notificationType": "EXTERNAL_PURCHASE_TOKEN", "subtype": "UNREPORTED", "notificationUUID": "uuid-external", "version": "2.0",
                "signedDate": TestAppleChain.milliseconds(now),
                "externalPurchaseToken": [
                    "externalPurchaseId": "b2158121-7af9-49d4-9561-1f588205523e", "tokenCreationDate": TestAppleChain.milliseconds(now),
                    "appAppleId": Self.appAppleID, "bundleId": Self.bundleID,
                ] as [String: Any],
            ]
            let payloads: [(String, [String: Any])] = [
                ("appData (RESCIND_CONSENT)", try rescindConsent(uuid: "uuid-rescind")), ("summary", summary), ("externalPurchaseToken", externalPurchase),
                ("a type Apple adds later", try rescindConsent(uuid: "uuid-future").merging(["notificationType": "SOMETHING_NEW"]) { $1 }),
            ]
            for (name, payload) in payloads {
                let answer = try await client.postJSON("/v1/apple/notifications", try signedBody(payload))
                #expect(answer.status == .ok, "\(name): \(answer.text)")
                #expect(answer.json["status"] as? String == "recorded", "\(name): \(answer.text)")
                let again = try await client.postJSON("/v1/apple/notifications", try signedBody(payload))
                #expect(again.json["status"] as? String == "duplicate", "\(name): \(again.text)")
            }
            #expect(try StoreCount.count(server.storePath, "apple_notifications") == payloads.count)
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"apple_notifications_total{type="RESCIND_CONSENT",outcome="recorded"} 1"#))
        }
    }

    @Test("A test notification (no transaction) is answered 200 and recorded")
    func testNotification() async throws {
        try await withServer { server, _, _, client in
            let answer = try await client.postJSON("/v1/apple/notifications", try body("TEST"))
            #expect(answer.status == .ok, "\(answer.text)")
            #expect(try StoreCount.count(server.storePath, "apple_notifications") == 1)
        }
    }

    @Test("EXTERNAL_PURCHASE_TOKEN (no data, no environment field) is answered 200: its environment comes from the token's ID, as in Apple's library")
    func externalPurchaseToken() async throws {
        try await withServer { server, _, _, client in
            func body(externalPurchaseID: String) throws -> String {
                let payload: [String: Any] = [
                    "notificationType": "EXTERNAL_PURCHASE_TOKEN", "subtype": "UNREPORTED", "notificationUUID": UUID().uuidString, "version": "2.0",
                    "signedDate": TestAppleChain.milliseconds(now),
                    "externalPurchaseToken": [
                        "externalPurchaseId": externalPurchaseID, "tokenCreationDate": TestAppleChain.milliseconds(now),
                        "appAppleId": Self.appAppleID, "bundleId": Self.bundleID,
                    ] as [String: Any],
                ]
                return #"{"signedPayload":"\#(try chain.signJWS(payload))"}"#
            }
            let production = try await client.postJSON("/v1/apple/notifications", try body(externalPurchaseID: "b2b1c8d4-0000-4000-8000-000000000001"))
            #expect(production.status == .ok, "\(production.text)")
            #expect(try StoreCount.count(server.storePath, "apple_notifications") == 1)
        }
    }

    @Test("An offer redeemed on an active subscription starts at its renewal and still matches its signature; a pay-as-you-go offer's next period is no new redemption")
    func redemptionAtRenewal() async throws {
        try await withServer { server, _, secret, client in
            let customer = subscriber()
            try await postEveryPeriod(of: customer, to: client)
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"promo_50","appAccountToken":"\#(Self.token)"}"#, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")

            // OFFER_REDEEMED for the active period: the offer is pending in the renewal info, the
            // transaction carries none yet.
            var pending = renewal(customer)
            pending["offerType"] = 2
            pending["offerIdentifier"] = "promo_50"
            let redeemed = try await client.postJSON(
                "/v1/apple/notifications", try body("OFFER_REDEEMED", transaction: customer.transactionPayload(5), renewalInfo: pending))
            #expect(redeemed.status == .ok, "\(redeemed.text)")

            // The renewal, about 20 days later, is the first period under the offer; the one after it
            // renews under the same offer (pay-as-you-go).
            let last = customer.periodStarts.count - 1
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(secondsFromGMT: 0)!
            var start = customer.expiry(last)
            func renewalUnderOffer(_ transactionID: String, from start: Date) -> [String: Any] {
                var transaction = customer.transactionPayload(last)
                transaction["transactionId"] = transactionID
                transaction["purchaseDate"] = TestAppleChain.milliseconds(start)
                transaction["expiresDate"] = TestAppleChain.milliseconds(calendar.date(byAdding: .month, value: 1, to: start)!)
                transaction["transactionReason"] = "RENEWAL"
                transaction["offerType"] = 2
                transaction["offerIdentifier"] = "promo_50"
                transaction["offerDiscountType"] = "PAY_AS_YOU_GO"
                return transaction
            }
            for (index, transactionID) in ["400000001006", "400000001007"].enumerated() {
                let answer = try await client.postJSON("/v1/apple/notifications", try body("DID_RENEW", transaction: renewalUnderOffer(transactionID, from: start)))
                #expect(answer.status == .ok, "period \(index): \(answer.text)")
                start = calendar.date(byAdding: .month, value: 1, to: start)!
            }

            let audited = try await server.store.auditRecords(after: 0, limit: 200).filter { $0.kind == "offer.redeemed" }
            #expect(audited.count == 1, "\(audited.map(\.body))")
            let first = try #require(audited.first)
            let record = try #require(try JSONSerialization.jsonObject(with: Data(first.body.utf8)) as? [String: Any])
            #expect(record["transactionID"] as? String == "400000001006")
            #expect(record["matched"] as? Bool == true)
            let rows = OfferReport.rows(issuances: try await server.store.offerIssuances(since: nil), redemptions: try await server.store.offerRedemptions(since: nil))
            let row = try #require(rows.first { $0.offerID == "promo_50" })
            #expect(row.matched.count == 1)
            #expect(row.unmatched == 0, "a later period of the offer is not a redemption without a signature")

            // A period of the offer whose previous period never arrived (a lost notification): it may
            // continue the redemption above, or be a new one; with no signature of its own it is
            // recorded unplaced (never dropped, never "without a signature") until Apple's history
            // places it (this fake Apple knows nobody, so it stays unplaced).
            start = calendar.date(byAdding: .month, value: 1, to: start)!
            let afterGap = try await client.postJSON(
                "/v1/apple/notifications", try body("DID_RENEW", transaction: renewalUnderOffer("400000001009", from: start)))
            #expect(afterGap.status == .ok, "\(afterGap.text)")
            let afterGapRecords = try await server.store.auditRecords(after: 0, limit: 300).filter { $0.kind == "offer.redeemed" }
            #expect(afterGapRecords.count == 2)
            #expect(afterGapRecords.last?.body.contains(#""unplaced":true"#) == true)
            let rowAfterGap = try #require(
                OfferReport.rows(issuances: try await server.store.offerIssuances(since: nil), redemptions: try await server.store.offerRedemptions(since: nil))
                    .first { $0.offerID == "promo_50" })
            #expect(rowAfterGap.unplaced == 1 && rowAfterGap.unmatched == 0 && rowAfterGap.matched.count == 1)
        }
    }

    @Test("An offer's first period whose previous period never arrived still matches its signature: the missing period is taken to be as long as this one")
    func redemptionAfterLostPeriod() async throws {
        try await withServer { server, _, secret, client in
            var calendar = Calendar(identifier: .gregorian)
            calendar.timeZone = TimeZone(secondsFromGMT: 0)!
            // Three periods heard of, the last ended about four weeks ago; the next one's notification
            // was lost; the one after it, under the offer, begins in two days.
            let lastStart = now.addingTimeInterval(-58 * 86400)
            let customer = SubscriptionFixture(
                bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: "400000002",
                appAccountToken: Self.token, periodStarts: [-2, -1, 0].map { calendar.date(byAdding: .month, value: $0, to: lastStart)! })
            try await postEveryPeriod(of: customer, to: client)
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"promo_once","appAccountToken":"\#(Self.token)"}"#, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")

            let begins = now.addingTimeInterval(2 * 86400)
            var transaction = customer.transactionPayload(2)
            transaction["transactionId"] = "400000002004"
            transaction["purchaseDate"] = TestAppleChain.milliseconds(begins)
            transaction["expiresDate"] = TestAppleChain.milliseconds(calendar.date(byAdding: .month, value: 1, to: begins)!)
            transaction["transactionReason"] = "RENEWAL"
            transaction["offerType"] = 2
            transaction["offerIdentifier"] = "promo_once"
            transaction["offerDiscountType"] = "PAY_UP_FRONT"
            let answer = try await client.postJSON("/v1/apple/notifications", try body("DID_RENEW", transaction: transaction))
            #expect(answer.status == .ok, "\(answer.text)")

            let audited = try await server.store.auditRecords(after: 0, limit: 200).filter { $0.kind == "offer.redeemed" }
            #expect(audited.count == 1, "\(audited.map(\.body))")
            let first = try #require(audited.first)
            let record = try #require(try JSONSerialization.jsonObject(with: Data(first.body.utf8)) as? [String: Any])
            #expect(record["transactionID"] as? String == "400000002004")
            #expect(record["matched"] as? Bool == true, "\(first.body)")
        }
    }

    @Test("A redeemed offer is matched to the signature that enabled it: audited, counted in metrics (an unmatched one with a token as a possible leak) and in the report")
    func redemption() async throws {
        try await withServer { server, _, secret, client in
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"promo_50","appAccountToken":"\#(Self.token)","formats":["legacy","jws"]}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            var transaction = subscriber().transactionPayload(5)
            transaction["transactionId"] = "400000001900"
            transaction["purchaseDate"] = TestAppleChain.milliseconds(Date().addingTimeInterval(5))
            transaction["offerType"] = 2
            transaction["offerIdentifier"] = "promo_50"
            transaction["appAccountToken"] = Self.token.uppercased()
            let answer = try await client.postJSON("/v1/apple/notifications", try body("OFFER_REDEEMED", subtype: "UPGRADE", transaction: transaction))
            #expect(answer.status == .ok, "\(answer.text)")

            // Someone else's signature (or a leaked key): a redemption no issuance of ours matches.
            var foreign = transaction
            foreign["transactionId"] = "400000001901"
            foreign["appAccountToken"] = "11111111-2222-3333-4444-555555555555"
            #expect(try await client.postJSON("/v1/apple/notifications", try body("OFFER_REDEEMED", transaction: foreign)).status == .ok)

            let redeemed = try await server.store.auditRecords(after: 0, limit: 100).filter { $0.kind == "offer.redeemed" }
            #expect(redeemed.count == 2)
            let first = try #require(try JSONSerialization.jsonObject(with: Data(redeemed[0].body.utf8)) as? [String: Any])
            #expect(first["matched"] as? Bool == true)
            #expect(first["appAccountToken"] as? String == Self.token)
            #expect(first["source"] as? String == "notification")

            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"offer_issuances_total{bundle_id="com.example.app",offer_id="promo_50"} 1"#), "\(metrics.split(separator: "\n").filter { $0.contains("offer_") })")
            #expect(metrics.contains(#"offer_redemptions_total{bundle_id="com.example.app",offer_id="promo_50",matched="true"} 1"#))
            #expect(metrics.contains(#"offer_redemptions_total{bundle_id="com.example.app",offer_id="promo_50",matched="false"} 1"#))
            // The alert on a possible key leak counts the unmatched one that carries a token.
            #expect(
                metrics.contains(#"offer_signer_redemptions_without_signature_total{bundle_id="com.example.app",offer_id="promo_50",app_account_token="present"} 1"#))
            #expect(!metrics.contains(#"app_account_token="absent""#))
            // When a notification was last stored, for the alert on a gap.
            let stored = try #require(
                metrics.split(separator: "\n").first { $0.hasPrefix(#"offer_signer_apple_notification_last_received_timestamp_seconds{bundle_id="com.example.app",environment=""#) },
                "\(metrics)")
            let storedAt = try #require(Double(stored.split(separator: " ").last ?? ""))
            #expect(abs(storedAt - Date().timeIntervalSince1970) < 120, "\(stored)")

            let rows = OfferReport.rows(issuances: try await server.store.offerIssuances(since: nil), redemptions: try await server.store.offerRedemptions(since: nil))
            let row = try #require(rows.first { $0.offerID == "promo_50" })
            #expect(row.issued == 1, "two formats, one issuance")
            #expect(row.matched.count == 1)
            #expect(row.conversion == 1)
            #expect(row.unmatched == 1)
            #expect((row.medianSeconds ?? -1) >= 0 && (row.medianSeconds ?? 99) < 60)
            #expect(OfferReport.table(rows).contains("leaked"))
            #expect(try await server.store.verifiedChain().isIntact)
        }
    }
}

/// Row counts of the test server's SQLite file, through a second connection.
enum StoreCount {
    static func count(_ path: String, _ table: String) throws -> Int {
        try DatabaseQueue(path: path).read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(table)") ?? -1 }
    }
}

extension TestServer {
    var storePath: String { directory.appendingPathComponent("store.sqlite").path }
}
