import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import Testing

/// Retention Messaging and notifications as Apple sends and reads them: messages chosen by
/// `userLocale`, switch-plan answers with `billingPlanType`, every answer read by Apple's own
/// `RealtimeResponseBody` model; the endpoints take any `Content-Type`, reveal nothing before the
/// signature verified, and check `appAppleId` in Production only (real server, SQLite and
/// PostgreSQL).
@Suite("Retention Messaging and notifications: Apple's rules", .serialized)
struct RetentionAppleRulesTests {
    static let offerDefault = "aaaaaaaa-0000-4000-8000-000000000001"
    static let offerEnUS = "aaaaaaaa-0000-4000-8000-000000000002"
    static let offerDe = "aaaaaaaa-0000-4000-8000-000000000003"
    static let switchDefault = "bbbbbbbb-0000-4000-8000-000000000001"
    static let switchEnUS = "bbbbbbbb-0000-4000-8000-000000000002"
    static let messageDefault = "cccccccc-0000-4000-8000-000000000001"
    static let messageFr = "cccccccc-0000-4000-8000-000000000002"

    static func catalog(port: Int) -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production", "Sandbox"], "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production", "sandboxURL": "http://127.0.0.1:\#(port)/sandbox"},
                  "subscriptionGroups": {"G1": ["pro.yearly", "pro.basic"]},
                  "retention": {"products": {
                    "pro.monthly": {
                      "offers": [{"offerID": "retain_50", "messageIdentifier": {"default": "\#(offerDefault)", "en-US": "\#(offerEnUS)", "de": "\#(offerDe)"}}],
                      "fallback": {"alternateProduct": {"messageIdentifier": {"default": "\#(switchDefault)", "en_US": "\#(switchEnUS)"},
                                                        "productID": "pro.yearly", "billingPlanType": "MONTHLY"}}},
                    "pro.basic": {"fallback": {"message": {"messageIdentifier": {"default": "\#(messageDefault)", "fr": "\#(messageFr)"}}}}}}}},
         "offers": [
          {"offerID": "retain_50", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3, "waitBetweenOffersMonths": 12}}
        ]}
        """#
    }

    static func messageIdentifier(_ answer: TestResponse) -> String? {
        answer.json.values.compactMap { ($0 as? [String: Any])?["messageIdentifier"] as? String }.first
    }

    @Test("Messages follow userLocale: the locale, else its language, else the default; the answers are read whole by Apple's RealtimeResponseBody", arguments: StoreBackend.testedCases)
    func localesAndApplesModel(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            var answers: [[String: Any]] = []
            // Eligible subscribers: the offer's message in their locale.
            let offers: [(String, String?, String)] = [
                ("700000001", "de-AT", Self.offerDe), ("700000002", "en-US", Self.offerEnUS), ("700000003", "ja-JP", Self.offerDefault),
                ("700000004", nil, Self.offerDefault), ("700000005", "EN_us", Self.offerEnUS),
            ]
            for (id, locale, expected) in offers {
                let customer = h.subscriber(months: 6, id: id, token: "22222222-aaaa-4aaa-8aaa-\(String(repeating: "0", count: 3))\(id)")
                try await h.notify(customer)
                let answer = try await h.post(try h.request(id, userLocale: locale))
                #expect(answer.status == .ok, "\(answer.text)")
                #expect(RetentionHarness.members(answer) == ["promotionalOffer"], "\(answer.text)")
                #expect(Self.messageIdentifier(answer) == expected, "\(locale ?? "no locale"): \(answer.text)")
                answers.append(answer.json)
            }
            // An ineligible one (two months paid): the switch-plan suggestion, with Apple's billingPlanType.
            let short = h.subscriber(months: 2, id: "700000009", token: "22222222-aaaa-4aaa-8aaa-000700000009")
            try await h.notify(short)
            for (locale, expected) in [("en-US", Self.switchEnUS), ("en-GB", Self.switchDefault), ("de", Self.switchDefault)] {
                let answer = try await h.post(try h.request(short.originalTransactionID, userLocale: locale))
                #expect(RetentionHarness.members(answer) == ["alternateProduct"], "\(answer.text)")
                let alternate = try #require(answer.json["alternateProduct"] as? [String: Any])
                #expect(alternate["messageIdentifier"] as? String == expected, "\(locale)")
                #expect(alternate["productId"] as? String == "pro.yearly")
                #expect(alternate["billingPlanType"] as? String == "MONTHLY")
                answers.append(answer.json)
            }
            // A product with a message only.
            for (locale, expected) in [("fr-CA", Self.messageFr), ("it-IT", Self.messageDefault)] {
                let answer = try await h.post(try h.request(short.originalTransactionID, productID: "pro.basic", userLocale: locale))
                #expect(RetentionHarness.members(answer) == ["message"], "\(answer.text)")
                #expect(Self.messageIdentifier(answer) == expected, "\(locale)")
                answers.append(answer.json)
            }
            // A switch-plan suggestion without billingPlanType, as a plan without one answers it.
            let plain = try #require(RetentionDecider.fallbackJSON(.alternateProduct(messageIdentifier: Self.switchDefault, productID: "pro.yearly"), userLocale: "en-US"))
            answers.append(try #require(try JSONSerialization.jsonObject(with: Data(plain.utf8)) as? [String: Any]))
            // Apple's model takes every answer whole: each member one of its fields, with its type.
            let results = try await RetentionTests.oracle(answers.map { ["op": "realtime-response", "body": $0] })
            for (ours, result) in zip(answers, results) {
                let unstructured = try #require(result["unstructured"])
                #expect(
                    NSDictionary(dictionary: RetentionTests.withoutNulls(unstructured) as? [String: Any] ?? [:]).isEqual(to: ours),
                    "Apple's RealtimeResponseBody read \(ours) as \(unstructured)")
            }
        }
    }

    @Test("Any Content-Type is accepted on Apple's endpoints (Apple documents none)", arguments: StoreBackend.testedCases)
    func anyContentType(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 6, id: "710000001", token: "33333333-aaaa-4aaa-8aaa-000710000001")
            for (index, contentType) in ["text/plain; charset=utf-8", "application/x-www-form-urlencoded", nil].enumerated() where index < customer.periodStarts.count {
                var headers: HTTPFields = [:]
                if let contentType { headers[.contentType] = contentType }
                let answer = try await h.client.execute(
                    uri: "/v1/apple/notifications", method: .post, headers: headers, body: ByteBuffer(string: try h.notification(customer, index: index)))
                #expect(answer.status == .ok, "\(contentType ?? "no Content-Type"): \(answer.text)")
            }
            for index in 3..<customer.periodStarts.count {
                #expect(try await h.client.postJSON("/v1/apple/notifications", try h.notification(customer, index: index)).status == .ok)
            }
            for contentType in ["text/plain", "application/octet-stream", nil] {
                var headers: HTTPFields = [:]
                if let contentType { headers[.contentType] = contentType }
                let answer = try await h.client.execute(
                    uri: "/v1/apple/retention", method: .post, headers: headers, body: ByteBuffer(string: try h.request(customer.originalTransactionID)))
                #expect(answer.status == .ok, "\(contentType ?? "no Content-Type"): \(answer.text)")
                #expect(!RetentionHarness.members(answer).isEmpty)
            }
        }
    }

    @Test("A forged payload gets the same answer whatever app it names: nothing about the configuration before the signature verified", arguments: StoreBackend.testedCases)
    func nothingRevealedBeforeVerification(_ backend: StoreBackend) async throws {
        let stranger = try TestAppleChain()
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 2, id: "720000001", token: "44444444-aaaa-4aaa-8aaa-000720000001")
            let forgedRetention = [
                try h.request(customer.originalTransactionID, signer: stranger),
                try h.request(customer.originalTransactionID, appAppleID: 42, signer: stranger),
                try h.request(customer.originalTransactionID, environment: "Sandbox", signer: stranger),
            ]
            var seen: Set<String> = []
            for body in forgedRetention {
                let answer = try await h.post(body)
                expectProblem(answer, .badRequest, "retention_request_unverified")
                seen.insert(answer.json["detail"] as? String ?? "")
            }
            #expect(seen.count == 1, "the answers differ: \(seen)")
            let forgedNotifications = [
                try h.notification(customer, index: 0, signer: stranger),
                try h.notification(customer, index: 0, bundleID: "com.other.app", signer: stranger),
                try h.notification(customer, index: 0, appAppleID: 42, signer: stranger),
            ]
            seen = []
            for body in forgedNotifications {
                let answer = try await h.client.postJSON("/v1/apple/notifications", body)
                expectProblem(answer, .badRequest, "notification_unverified")
                seen.insert(answer.json["detail"] as? String ?? "")
            }
            #expect(seen.count == 1, "the answers differ: \(seen)")
            // Signed by Apple, but the outer bundleId is not the one its signed transaction names
            // (Apple never sends that): it fails verification like any inconsistent payload. One
            // that is Apple's in every part but for an app not served is answered 200 `ignored`
            // (AppleNotificationTests, "Verified notifications for another app…"); a retention
            // request for another app is told so.
            expectProblem(try await h.client.postJSON("/v1/apple/notifications", try h.notification(customer, index: 0, bundleID: "com.other.app")), .badRequest, "notification_unverified")
            expectProblem(try await h.post(try h.request(customer.originalTransactionID, appAppleID: 42)), .forbidden, "retention_request_foreign")
            #expect(try await h.audited("signature.issued").isEmpty)
        }
    }

    @Test("An offer accepted for the next renewal (renewal info offerType 2, offerIdentifier) is a redemption: the next page view gets the fallback", arguments: StoreBackend.testedCases)
    func acceptedOfferInRenewalInfo(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 6, id: "720000001", token: "55555555-aaaa-4aaa-8aaa-000720000001")
            try await h.notify(customer)
            let first = try await h.post(try h.request(customer.originalTransactionID))
            #expect(RetentionHarness.members(first) == ["promotionalOffer"], "\(first.text)")
            // The customer accepted it: Apple's renewal info now carries the offer for the next
            // renewal (JWSRenewalInfoDecodedPayload offerType, offerIdentifier, offerDiscountType,
            // offerPeriod, renewalDate), as Apple sends it with the next notification.
            let last = customer.periodStarts.count - 1
            let accepted = try h.notification(customer, index: last, renewalInfo: [
                "offerType": 2, "offerIdentifier": "retain_50", "offerDiscountType": "PAY_UP_FRONT", "offerPeriod": "P1M",
                "renewalDate": TestAppleChain.milliseconds(customer.expiry(last)), "signedDate": TestAppleChain.milliseconds(h.now),
            ])
            #expect(try await h.client.postJSON("/v1/apple/notifications", accepted).status == .ok)
            let next = try await h.post(try h.request(customer.originalTransactionID))
            #expect(next.status == .ok, "\(next.text)")
            #expect(RetentionHarness.members(next) == ["alternateProduct"], "the fallback, not another offer: \(next.text)")
        }
    }

    @Test(
        "A stored history decided on before: the next page views read its version with the customer lock (one round trip on PostgreSQL) and decide there; once a notification changed it, the page view is decided again before the lock, on the new history",
        arguments: StoreBackend.testedCases)
    func storedHistoryVersionReadWithTheLock(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 6, id: "721000001", token: "55555555-aaaa-4aaa-8aaa-000721000001")
            try await h.notify(customer)
            func withLock() async throws -> String {
                let metrics = try await h.metrics()
                return metrics.split(separator: "\n").filter { $0.hasPrefix("offer_signer_stored_history_with_lock_total{") }.joined(separator: "; ")
            }
            // The first page view reads and verifies the history before the lock.
            let first = try await h.post(try h.request(customer.originalTransactionID))
            #expect(RetentionHarness.members(first) == ["promotionalOffer"], "\(first.text)")
            #expect(try await withLock() == "")
            // Decoded before: its version comes with the lock, and the decoded history decides
            // (a page view is no redemption: the offer again).
            for attempt in 1...2 {
                let again = try await h.post(try h.request(customer.originalTransactionID))
                #expect(RetentionHarness.members(again) == ["promotionalOffer"], "attempt \(attempt): \(again.text)")
            }
            #expect(try await withLock() == #"offer_signer_stored_history_with_lock_total{outcome="decided"} 2"#)
            // Apple's next notification: the offer was accepted for the next renewal. The version
            // read with the lock has moved, so the page view is decided again before the lock, on
            // the new history, which counts the redemption.
            let last = customer.periodStarts.count - 1
            let accepted = try h.notification(customer, index: last, renewalInfo: [
                "offerType": 2, "offerIdentifier": "retain_50", "offerDiscountType": "PAY_UP_FRONT", "offerPeriod": "P1M",
                "renewalDate": TestAppleChain.milliseconds(customer.expiry(last)), "signedDate": TestAppleChain.milliseconds(h.now),
            ])
            #expect(try await h.client.postJSON("/v1/apple/notifications", accepted).status == .ok)
            let next = try await h.post(try h.request(customer.originalTransactionID))
            #expect(RetentionHarness.members(next) == ["alternateProduct"], "the fallback, not another offer: \(next.text)")
            let counts = try await withLock()
            #expect(counts.contains(#"{outcome="decided"} 2"#) && counts.contains(#"{outcome="moved"} 1"#), "\(counts)")
            // Decided on the new history since: with the lock again.
            let later = try await h.post(try h.request(customer.originalTransactionID))
            #expect(RetentionHarness.members(later) == ["alternateProduct"], "\(later.text)")
            #expect(try await withLock().contains(#"{outcome="decided"} 3"#))
        }
    }

    @Test(
        "An eligible subscriber whose offer cannot be signed (the app's key retired) gets the fallback, and the decision is audited with why; nothing is signed",
        arguments: StoreBackend.testedCases)
    func eligibleButUnsigned(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 6, id: "722000001", token: "55555555-aaaa-4aaa-8aaa-000722000001")
            try await h.notify(customer)
            _ = try await h.store.transitionKey(
                keyID: h.key.keyID, to: .retired, actor: "test", reason: nil, force: true, authenticator: h.masterKey.registryRows)
            // The server reads the registry every 50 ms: ask until the retirement is in force.
            var requestIdentifier = UUID().uuidString.lowercased()
            var answer = try await h.post(try h.request(customer.originalTransactionID, requestIdentifier: requestIdentifier))
            let deadline = ContinuousClock.now + .seconds(10)
            while RetentionHarness.members(answer) == ["promotionalOffer"], ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(50))
                requestIdentifier = UUID().uuidString.lowercased()
                answer = try await h.post(try h.request(customer.originalTransactionID, requestIdentifier: requestIdentifier))
            }
            #expect(answer.status == .ok && RetentionHarness.members(answer) == ["alternateProduct"], "\(answer.text)")
            let record = try #require(try await h.audited("retention.answered").first { $0["requestIdentifier"] as? String == requestIdentifier })
            #expect(record["answer"] as? String == "fallback", "\(record)")
            #expect(record["fallbackReason"] as? String == "no_active_key", "\(record)")
            #expect(record["offerID"] == nil, "\(record)")
            let decisions = try #require(record["decisions"] as? [[String: Any]])
            #expect(decisions.first?["eligible"] as? Bool == true, "\(decisions)")
            let issued = try await h.audited("signature.issued").filter { $0["retentionRequestIdentifier"] as? String == requestIdentifier }
            #expect(issued.isEmpty, "\(issued)")
            let metrics = try await h.metrics()
            #expect(metrics.contains(#"retention_fallbacks_total{reason="no_active_key"}"#), "\(metrics.split(separator: "\n").filter { $0.contains("retention_fallbacks") })")
        }
    }

    @Test(
        "A database writer deletes a subscription's transaction rows: its stored history holds none of the subscription's transactions, so no answer is decided on it, before the lock or with it (Apple is asked)",
        arguments: StoreBackend.testedCases)
    func storedHistoryWithoutTheSubscription(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let customer = h.subscriber(months: 6, id: "723000001", token: "55555555-aaaa-4aaa-8aaa-000723000001")
            try await h.notify(customer)
            try await h.fixture.execute("DELETE FROM apple_transactions WHERE original_transaction_id = '723000001'")
            // Twice: the first reads the history before the lock (and keeps it decoded), the
            // second would find it decoded and read its version with the lock.
            for attempt in 1...2 {
                let answer = try await h.post(try h.request(customer.originalTransactionID))
                #expect(answer.status == .ok && RetentionHarness.members(answer) == ["alternateProduct"], "attempt \(attempt): \(answer.text)")
            }
            let metrics = try await h.metrics()
            let fallbacks = metrics.split(separator: "\n").filter { $0.contains("retention_fallbacks_total{") }
            // Apple's API (the fake knows no such customer) has no history either.
            #expect(fallbacks.count == 1 && fallbacks.first?.hasSuffix(#"retention_fallbacks_total{reason="history_unavailable"} 2"#) == true, "\(fallbacks)")
            #expect(try await h.audited("retention.answered").isEmpty, "nothing was decided")
            #expect(!metrics.contains(#"offer_signer_stored_history_with_lock_total{outcome="decided"}"#))
        }
    }

    @Test("appAppleId is checked in Production only, as Apple's SignedDataVerifier does", arguments: StoreBackend.testedCases)
    func appAppleIDInProductionOnly(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:)) { h in
            let sandbox = h.subscriber(months: 2, id: "730000001", token: "55555555-aaaa-4aaa-8aaa-000730000001", environment: "Sandbox")
            // Sandbox notifications naming another appAppleId, or none, are stored.
            let stored = try await h.client.postJSON("/v1/apple/notifications", try h.notification(sandbox, index: 0, appAppleID: 42))
            #expect(stored.status == .ok, "\(stored.text)")
            #expect(try await h.client.postJSON("/v1/apple/notifications", try h.notification(sandbox, index: 1, appAppleID: nil)).status == .ok)
            // Sandbox retention requests too: the one app with a plan answers. In Sandbox a rule's
            // month is 5 minutes (Docs/Eligibility.md, "Sandbox time"), so this subscriber of two
            // real months meets the offer's rules and gets the signed offer itself.
            for appAppleID in [42, nil] as [Int64?] {
                let answer = try await h.post(try h.request(sandbox.originalTransactionID, appAppleID: appAppleID, environment: "Sandbox"))
                #expect(answer.status == .ok, "\(answer.text)")
                #expect(RetentionHarness.members(answer) == ["promotionalOffer"], "\(answer.text)")
            }
            // Production: the appAppleId must be the app's.
            let production = h.subscriber(months: 2, id: "730000002", token: "55555555-aaaa-4aaa-8aaa-000730000002")
            Self.expectIgnored(try await h.client.postJSON("/v1/apple/notifications", try h.notification(production, index: 0, appAppleID: 42)))
            Self.expectIgnored(try await h.client.postJSON("/v1/apple/notifications", try h.notification(production, index: 0, appAppleID: nil)))
            expectProblem(try await h.post(try h.request(production.originalTransactionID, appAppleID: 42)), .forbidden, "retention_request_foreign")
            expectProblem(try await h.post(try h.request(production.originalTransactionID, appAppleID: nil)), .forbidden, "retention_request_foreign")
        }
    }

    /// A verified notification the service does not serve: 200 `ignored`, nothing stored.
    static func expectIgnored(_ answer: TestResponse, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(answer.status == .ok, "\(answer.text)", sourceLocation: sourceLocation)
        #expect(answer.json["status"] as? String == "ignored", "\(answer.text)", sourceLocation: sourceLocation)
    }

    static func productionOnlyCatalog(port: Int) -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production", "sandboxURL": "http://127.0.0.1:\#(port)/sandbox"},
                  "retention": {"products": {"pro.monthly": {"fallback": {"message": {"messageIdentifier": "\#(messageDefault)"}}}}}}},
         "offers": []}
        """#
    }

    @Test("serve --dev accepts Sandbox for an app whose catalog entry names no environments; without it, Production only")
    func developmentModeAcceptsSandbox() async throws {
        for development in [true, false] {
            try await RetentionHarness.run(.sqlite, catalog: Self.productionOnlyCatalog(port:), configure: { $0.developmentMode = development }) { h in
                let sandbox = h.subscriber(months: 1, id: "740000001", token: "66666666-aaaa-4aaa-8aaa-000740000001", environment: "Sandbox")
                let notification = try await h.client.postJSON("/v1/apple/notifications", try h.notification(sandbox, index: 0))
                let retention = try await h.post(try h.request(sandbox.originalTransactionID, environment: "Sandbox"))
                if development {
                    #expect(notification.status == .ok && notification.json["status"] as? String == "recorded", "\(notification.text)")
                    #expect(retention.status == .ok && RetentionHarness.members(retention) == ["message"], "\(retention.text)")
                } else {
                    Self.expectIgnored(notification)
                    expectProblem(retention, .forbidden, "retention_request_foreign")
                }
            }
        }
    }
}
