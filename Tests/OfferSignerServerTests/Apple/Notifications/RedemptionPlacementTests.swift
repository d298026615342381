import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing

/// A renewal-time offer whose previous period the store never heard of, on the real server
/// (loopback, real SQLite store) with Apple's API faked: a one-week free promotional offer on an
/// annual product, redeemed two months before the renewal it starts at. The offer's own period
/// (a week, Apple's `offerPeriod` `P1W`) says nothing of the year it was redeemed in, so the
/// estimate finds no signature: the redemption is `unplaced` (never "without a signature"),
/// and Apple's history, fetched in the background, places and matches it.
@Suite("Unplaced redemptions placed by Apple's history", .serialized)
struct RedemptionPlacementTests {
    static let bundleID = AppleNotificationTests.bundleID
    static let token = AppleNotificationTests.token
    static let original = "600000001"
    let notifications: AppleNotificationTests
    let chain: TestAppleChain
    let now = Date()
    /// The renewal the offer starts at: two months from now (the offer was redeemed now, during
    /// the annual period before it).
    let renewal: Date
    let calendar: Calendar

    init() throws {
        notifications = try AppleNotificationTests()
        chain = notifications.chain
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        self.calendar = calendar
        renewal = now.addingTimeInterval(60 * 86400)
    }

    /// Transaction `index` of the annual subscription as Apple signs it (JWSTransactionDecodedPayload):
    /// 0 the first purchase two years before the renewal, 1 the annual renewal a year before it,
    /// 2 the renewal under the one-week free promotional offer (`offerType` 2, `offerIdentifier`,
    /// `offerDiscountType` `FREE_TRIAL`, `offerPeriod` `P1W`, price 0).
    func transaction(_ index: Int) -> [String: Any] {
        let start = index == 2 ? renewal : calendar.date(byAdding: .year, value: index - 2, to: renewal)!
        let end = index == 2 ? calendar.date(byAdding: .day, value: 7, to: renewal)! : calendar.date(byAdding: .year, value: 1, to: start)!
        var payload: [String: Any] = [
            "transactionId": index == 0 ? Self.original : "\(Self.original)00\(index)", "originalTransactionId": Self.original,
            "productId": "pro.annual", "subscriptionGroupIdentifier": "G2", "purchaseDate": TestAppleChain.milliseconds(start),
            "originalPurchaseDate": TestAppleChain.milliseconds(calendar.date(byAdding: .year, value: -2, to: renewal)!),
            "expiresDate": TestAppleChain.milliseconds(end), "inAppOwnershipType": "PURCHASED", "environment": "Production",
            "bundleId": Self.bundleID, "type": "Auto-Renewable Subscription", "price": 49990, "currency": "USD", "storefront": "USA",
            "signedDate": TestAppleChain.milliseconds(min(start, now)), "transactionReason": index == 0 ? "PURCHASE" : "RENEWAL",
            "appAccountToken": Self.token,
        ]
        if index == 2 {
            payload["offerType"] = 2
            payload["offerIdentifier"] = "free_week"
            payload["offerDiscountType"] = "FREE_TRIAL"
            payload["offerPeriod"] = "P1W"
            payload["price"] = 0
        }
        return payload
    }

    /// Apple's view of the customer: the three transactions, the offer's period the latest.
    func customer() throws -> FakeAppStoreServerAPI.Customer {
        let signed = try (0..<3).map { try chain.signJWS(transaction($0)) }
        let renewalInfo = try chain.signJWS([
            "originalTransactionId": Self.original, "productId": "pro.annual", "autoRenewProductId": "pro.annual", "autoRenewStatus": 1,
            "environment": "Production", "signedDate": TestAppleChain.milliseconds(now),
        ])
        return FakeAppStoreServerAPI.Customer(
            environment: "Production", transactionIDs: Set((0..<3).map { $0 == 0 ? Self.original : "\(Self.original)00\($0)" }), signedTransactions: signed,
            statuses: [.init(subscriptionGroupIdentifier: "G2", originalTransactionID: Self.original, status: 1, signedTransactionInfo: signed[2], signedRenewalInfo: renewalInfo)])
    }

    func withServer(
        retryInterval: Duration = .seconds(900), _ body: @escaping @Sendable (TestServer, FakeAppStoreServerAPI, String, any TestClientProtocol) async throws -> Void
    ) async throws {
        let server = try await TestServer(bundles: [Self.bundleID])
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let secret = try await server.createClient(name: "backend")
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { port in
            var running = server
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            running.configuration.eligibility = eligibility
            running.configuration.redemptionPlacementRetryInterval = retryInterval
            let configured = running
            try await configured.live { client in try await body(configured, fake, secret, client) }
        }
    }

    /// Signs the offer now, then Apple's DID_RENEW for the renewal under it (the store holds
    /// nothing of the subscription: its earlier notifications were never heard).
    func signAndRenew(_ client: any TestClientProtocol, secret: String) async throws {
        let signed = try await client.postJSON(
            "/v1/offers/signatures", #"{"productID":"pro.annual","offerID":"free_week","appAccountToken":"\#(Self.token)"}"#, bearer: secret)
        #expect(signed.status == .created, "\(signed.text)")
        let renewed = try await client.postJSON("/v1/apple/notifications", try notifications.body("DID_RENEW", transaction: transaction(2)))
        #expect(renewed.status == .ok, "\(renewed.text)")
    }

    /// The redemption of the offer once it is in `state` (within 45 s: an open circuit breaker
    /// holds lookups for 30 s), else the last seen.
    func redemption(in server: TestServer, becoming state: OfferRedemption.State) async throws -> OfferRedemption? {
        let deadline = ContinuousClock.now + .seconds(45)
        var last: OfferRedemption?
        while ContinuousClock.now < deadline {
            last = try await server.store.offerRedemptions(since: nil).first { $0.candidate.offerID == "free_week" }
            if last?.state == state { return last }
            try await Task.sleep(for: .milliseconds(100))
        }
        return last
    }

    func auditBodies(_ server: TestServer, kind: String) async throws -> [[String: Any]] {
        try await server.store.auditRecords(after: 0, limit: 500).filter { $0.kind == kind }.map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.body.utf8)) as? [String: Any])
        }
    }

    @Test("A one-week free offer on an annual product, its earlier periods never heard: unplaced at first, then placed and matched by Apple's history")
    func oneWeekFreeOnAnnualIsPlaced() async throws {
        try await withServer { server, fake, secret, client in
            fake.add(try customer())
            try await signAndRenew(client, secret: secret)

            let placed = try #require(try await redemption(in: server, becoming: .matched))
            #expect(placed.state == .matched, "placed by the background fetch")
            #expect(placed.placedAt != nil)
            #expect(placed.candidate.transactionID == "\(Self.original)002")
            let redeemed = try await auditBodies(server, kind: "offer.redeemed")
            #expect(redeemed.count == 1)
            #expect(redeemed.first?["unplaced"] as? Bool == true, "recorded unplaced first: the estimate (a week) found no signature")
            #expect(redeemed.first?["matched"] as? Bool == false)
            let placements = try await auditBodies(server, kind: "offer.redemption_placed")
            #expect(placements.count == 1)
            #expect(placements.first?["outcome"] as? String == "matched")
            #expect(placements.first?["transactionID"] as? String == "\(Self.original)002")
            // The placing window starts 24 h before the annual period the offer was redeemed in.
            let windowStart = try #require(placements.first?["signatureWindowStart"] as? Int64)
            #expect(windowStart == TestAppleChain.milliseconds(calendar.date(byAdding: .year, value: -1, to: renewal)!.addingTimeInterval(-86400)))
            #expect(fake.requests.contains { $0.endpoint == .history && $0.transactionID == Self.original })

            // The fetched history is stored: the subscription is complete from now on.
            let stored = try #require(try await server.store.appleHistory(bundleID: Self.bundleID, environment: "Production", transactionID: Self.original))
            #expect(stored.isComplete)
            #expect(stored.transactions.count == 3)

            let rows = OfferReport.rows(issuances: try await server.store.offerIssuances(since: nil), redemptions: try await server.store.offerRedemptions(since: nil))
            let row = try #require(rows.first { $0.offerID == "free_week" })
            #expect(row.matched.count == 1 && row.unplaced == 0 && row.unmatched == 0 && row.redemptions == 1)
            #expect(try await server.store.unplacedOfferRedemptions(limit: 10).isEmpty)
            #expect(try await server.store.verifiedChain().isIntact)

            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"offer_redemptions_total{bundle_id="com.example.app",offer_id="free_week",matched="unplaced"} 1"#))
            #expect(metrics.contains(#"offer_redemptions_placed_total{bundle_id="com.example.app",offer_id="free_week",matched="true"} 1"#))
            #expect(metrics.contains(#"redemption_placement_lookups_total{outcome="history"} 1"#))
        }
    }

    @Test("Apple unreachable: the redemption stays unplaced (reported as its own column, no leaked-key warning); the retry places it once Apple answers")
    func unplacedWhileAppleIsDown() async throws {
        try await withServer(retryInterval: .seconds(1)) { server, fake, secret, client in
            fake.add(try customer())
            fake.always(.history, .status(500))
            try await signAndRenew(client, secret: secret)

            // Attempts fail (waited for, however slow the machine: two failed lookups, so the
            // first one's attempt is recorded before the second is made): it stays unplaced,
            // never "without a signature".
            let failedAttempt = #"redemption_placement_lookups_total{outcome="server_error"}"#
            let attemptDeadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < attemptDeadline {
                let text = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
                let failed = text.split(separator: "\n").first { $0.hasPrefix(failedAttempt + " ") }.flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
                if failed >= 2 { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            let waiting = try #require(try await server.store.offerRedemptions(since: nil).first { $0.candidate.offerID == "free_week" })
            #expect(waiting.state == .unplaced)
            #expect(try await server.store.unplacedOfferRedemptions(limit: 10).map(\.candidate.transactionID) == ["\(Self.original)002"])
            let rows = OfferReport.rows(issuances: try await server.store.offerIssuances(since: nil), redemptions: try await server.store.offerRedemptions(since: nil))
            let row = try #require(rows.first { $0.offerID == "free_week" })
            #expect(row.unplaced == 1 && row.unmatched == 0 && row.matched.isEmpty && row.redemptions == 1)
            let table = OfferReport.table(rows)
            #expect(table.contains("unplaced"))
            #expect(!table.contains("leaked"), "an unplaced redemption never raises the leaked-key warning")
            let json = try #require(try JSONSerialization.jsonObject(with: Data(OfferReport.json(rows).utf8)) as? [[String: Any]])
            let item = try #require(json.first { $0["offerID"] as? String == "free_week" })
            #expect(item["redeemedUnplaced"] as? Int == 1)
            #expect(item["redeemedWithoutSignature"] as? Int == 0)
            #expect(item["redemptions"] as? Int == 1)
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(failedAttempt), "\(metrics.split(separator: "\n").filter { $0.contains("placement") })")

            // Apple answers again: the next sweep places it.
            fake.always(.history, nil)
            let placed = try #require(try await redemption(in: server, becoming: .matched))
            #expect(placed.state == .matched)
            #expect(try await server.store.verifiedChain().isIntact)
        }
    }

    @Test("An offer decided on Apple's history keeps the customer's subscription and environment on its issuance; a Sandbox redemption does not use it up, a Production one without a token matches it")
    func issuanceKeepsSubscriptionAndEnvironment() async throws {
        try await withServer { server, fake, secret, client in
            let customer = notifications.subscriber()
            fake.add(try customer.customer(chain, now: now))
            let signed = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"loyal_no_refunds","appAccountToken":"\#(Self.token)","transactionID":"\#(customer.transactionID(2))"}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            let issued = try await server.store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundleID)
            #expect(issued.map(\.signature.originalTransactionID) == [customer.originalTransactionID])
            #expect(issued.map(\.signature.environment) == ["Production"])
            let record = try #require(try await server.store.auditRecords(after: 0, limit: 100).last { $0.kind == "signature.issued" })
            #expect(record.body.contains(#""originalTransactionID":"\#(customer.originalTransactionID)""#) && record.body.contains(#""environment":"Production""#))

            // Redemptions as a fetched history states them: Sandbox first, then Production without a token.
            let purchase = Date()
            var sandbox = RedemptionCandidate(
                transactionID: "900000001", originalTransactionID: customer.originalTransactionID, bundleID: Self.bundleID, environment: "Sandbox",
                productID: "pro.monthly", offerID: "loyal_no_refunds", appAccountToken: Self.token, purchaseDate: purchase)
            var production = sandbox
            production.transactionID = "900000002"
            production.environment = "Production"
            production.appAccountToken = nil
            sandbox.signatureWindowStart = purchase.addingTimeInterval(-86400)
            guard case .recorded(let redemptions) = try await server.store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [sandbox, production], source: "history"), at: purchase)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.state) == [.unmatched, .matched])
        }
    }
}
