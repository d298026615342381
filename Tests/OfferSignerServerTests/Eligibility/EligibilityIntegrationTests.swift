import AppleTestChain
import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing
import X509

/// Eligibility then signing over HTTP against a real server, with evidence signed by a test
/// chain shaped like Apple's (passed as the trusted root, as `--apple-root` does).
@Suite("Win-back eligibility over HTTP", .serialized)
struct EligibilityIntegrationTests {
    static let token = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    static let catalog = #"""
    {"offers": [
      {"offerID": "wb1", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
       "kind": "win-back", "rules": {"minPaidMonths": 3, "lapsedMonths": {"min": 1}, "waitBetweenOffersMonths": 12}},
      {"offerID": "goodwill", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"}
    ]}
    """#

    static func monthsAgo(_ months: Int, from now: Date = Date()) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(byAdding: .month, value: -months, to: now)!
    }

    /// Six paid monthly periods that ended `lapsedMonths` ago.
    static func history(
        _ chain: TestAppleChain, lapsedMonths: Int = 2, token: String = token, alter: Bool = false, environment: String = "Production",
        redeemedLast: Bool = false
    ) throws -> [String] {
        try (0..<6).map { index in
            let start = monthsAgo(lapsedMonths + 6 - index)
            let end = monthsAgo(lapsedMonths + 5 - index)
            var payload: [String: Any] = [
                "transactionId": "20000001\(index)", "originalTransactionId": "200000010", "bundleId": "com.example.app",
                "productId": "pro.monthly", "subscriptionGroupIdentifier": "G1",
                "purchaseDate": TestAppleChain.milliseconds(start), "expiresDate": TestAppleChain.milliseconds(end),
                "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "price": 4990, "currency": "USD",
                "storefront": "USA", "environment": environment, "appAccountToken": token,
                "signedDate": TestAppleChain.milliseconds(end),
            ]
            if redeemedLast && index == 5 {
                // The last period was a redemption of wb1 (as the app shows once it redeemed it).
                payload.merge(["offerType": 2, "offerIdentifier": "wb1", "offerDiscountType": "PAY_UP_FRONT"]) { $1 }
            }
            let jws = try chain.signJWS(payload)
            guard alter else { return jws }
            // Change the payload without re-signing (price 0: a "free" period).
            var parts = jws.split(separator: ".").map(String.init)
            var altered = payload
            altered["price"] = 0
            parts[1] = TestAppleChain.base64URL(try JSONSerialization.data(withJSONObject: altered, options: [.sortedKeys]))
            return parts.joined(separator: ".")
        }
    }

    static func evidenceJSON(_ transactions: [String]) -> String {
        "{\"signedTransactions\":[" + transactions.map { "\"\($0)\"" }.joined(separator: ",") + "],\"signedRenewalInfos\":[]}"
    }

    func server(_ chain: TestAppleChain, catalog: String = catalog) async throws -> TestServer {
        try await TestServer { configuration in
            configuration.eligibility = try! EligibilityConfiguration(
                catalogJSON: Data(catalog.utf8), trustedRootPEMs: [try! chain.root.serializeAsPEM().pemString])
        }
    }

    @Test("Eligible customer: decision, then a signature; a retry within 24 h is signed (one attempt); once redeemed, refused with eligibleFrom")
    func eligibleThenWait() async throws {
        let chain = try TestAppleChain()
        let server = try await server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let evidence = Self.evidenceJSON(try Self.history(chain))
        try await server.live { client in
            let decisions = try await client.postJSON("/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#, bearer: secret)
            #expect(decisions.status == .ok, "\(decisions.text)")
            let list = try #require(decisions.json["decisions"] as? [[String: Any]])
            #expect(list.count == 2)
            #expect(list.first { $0["offerID"] as? String == "wb1" }?["eligible"] as? Bool == true, "\(decisions.text)")
            #expect(list.first { $0["offerID"] as? String == "goodwill" }?["eligible"] as? Bool == true)

            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#, bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
            let legacy = try #require(signed.json["legacy"] as? [String: Any])
            let payload = try PromotionalOfferPayload(
                bundleID: "com.example.app", keyID: try #require(legacy["keyID"] as? String), productID: "pro.monthly", offerID: "wb1",
                appAccountToken: Self.token, nonce: try #require(legacy["nonce"] as? String), timestamp: try #require(legacy["timestamp"] as? Int64))
            #expect(PromotionalOfferVerifier(publicKey: server.keys["com.example.app"]!.publicKey).verifyLegacy(payload: payload, signature: try #require(legacy["signature"] as? String)) == .valid)

            // The payment sheet was cancelled: the retry is the same attempt, signed again.
            let retry = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#, bearer: secret)
            #expect(retry.status == .created, "\(retry.text)")

            // Once the app's evidence shows the redemption, the wait runs from its end.
            let redeemed = Self.evidenceJSON(try Self.history(chain, redeemedLast: true))
            let again = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(redeemed)}"#, bearer: secret)
            expectProblem(again, .forbidden, "not_eligible")
            #expect(again.json["reasons"] as? [String] == ["redeemed_too_recently"])
            #expect(again.json["eligibleFrom"] is String)
        }
        #expect(try server.issuedCount() == 2)
        let decisions = try await server.store.auditRecords(after: 0, limit: 100).filter { $0.kind == "eligibility.decided" }
        #expect(decisions.count == 3)
        #expect(decisions.last?.body.contains("\"eligible\":false") == true)
        #expect(decisions.last?.body.contains("redeemed_too_recently") == true)
    }

    @Test("Forged, re-signed by a non-Apple chain, altered or another account's evidence: evidence_unverified and no signature")
    func badEvidence() async throws {
        let chain = try TestAppleChain()
        let server = try await server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let foreign = try TestAppleChain(rootName: "Not Apple")
        let noMarkers = try TestAppleChain(rootKey: chain.rootKey, root: chain.root, markerOIDs: false)
        let cases: [(String, [String])] = [
            ("self-signed leaf", try Self.history(try chain.withSelfSignedLeaf())),
            ("foreign chain", try Self.history(foreign)),
            ("no Apple marker OIDs", try Self.history(noMarkers)),
            ("altered payload", try Self.history(chain, alter: true)),
            ("another account", try Self.history(chain, token: "11111111-2222-3333-4444-555555555555")),
            ("garbage", ["not-a-jws", "a.b.c"]),
        ]
        try await server.live { client in
            for (name, transactions) in cases {
                let response = try await client.postJSON(
                    "/v1/offers/signatures",
                    #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(Self.evidenceJSON(transactions))}"#,
                    bearer: secret)
                expectProblem(response, .forbidden, "not_eligible")
                #expect((response.json["reasons"] as? [String])?.contains("evidence_unverified") == true, "\(name): \(response.text)")
            }
        }
        #expect(try server.issuedCount() == 0)
    }

    @Test("The app's evidence counts only from the environments the app accepts: Sandbox is refused by default, accepted when configured")
    func evidenceEnvironments() async throws {
        let chain = try TestAppleChain()
        let sandbox = Self.evidenceJSON(try Self.history(chain, environment: "Sandbox"))
        let body = #"{"appAccountToken":"\#(Self.token)","offerIDs":["wb1"],"evidence":\#(sandbox)}"#

        // No `apps` entry: the app's customers come from Production only.
        let productionOnly = try await server(chain)
        defer { productionOnly.cleanUp() }
        let secret = try await productionOnly.createClient(name: "backend")
        try await productionOnly.live { client in
            let decisions = try await client.postJSON("/v1/offers/eligibility", body, bearer: secret)
            #expect(decisions.status == .ok, "\(decisions.text)")
            let decision = try #require((decisions.json["decisions"] as? [[String: Any]])?.first)
            #expect(decision["eligible"] as? Bool == false)
            #expect((decision["reasons"] as? [String])?.contains("evidence_unverified") == true, "\(decisions.text)")
            let failures = try #require(decision["evidenceFailures"] as? [[String: Any]])
            #expect(failures.count == 6)
            #expect(failures.allSatisfy { $0["code"] as? String == "environment_mismatch" }, "\(decisions.text)")
            #expect(failures.map { $0["index"] as? Int } == Array(0..<6))
            #expect((failures.first?["message"] as? String)?.contains("apps.com.example.app.environments") == true, "\(decisions.text)")

            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(sandbox)}"#,
                bearer: secret)
            expectProblem(signed, .forbidden, "not_eligible")
        }
        #expect(try productionOnly.issuedCount() == 0)

        // The app accepts Sandbox (TestFlight, sandbox testers): the same evidence decides.
        let withSandbox = Self.catalog.replacingOccurrences(
            of: #"{"offers": ["#, with: #"{"apps": {"com.example.app": {"environments": ["Production", "Sandbox"]}}, "offers": ["#)
        let accepting = try await server(chain, catalog: withSandbox)
        defer { accepting.cleanUp() }
        let secret2 = try await accepting.createClient(name: "backend")
        try await accepting.live { client in
            let decisions = try await client.postJSON("/v1/offers/eligibility", body, bearer: secret2)
            let decision = try #require((decisions.json["decisions"] as? [[String: Any]])?.first, "\(decisions.text)")
            #expect(decision["eligible"] as? Bool == true, "\(decisions.text)")
        }
    }

    @Test("A failure names the item's place in signedTransactions, items that failed before it counted")
    func failureIndices() async throws {
        let chain = try TestAppleChain()
        let server = try await server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let own = try Self.history(chain)
        let another = try Self.history(chain, token: "11111111-2222-3333-4444-555555555555")
        // 0: garbage, 1: the customer's, 2: another account's.
        let evidence = Self.evidenceJSON(["not-a-jws", own[0], another[0]])
        try await server.live { client in
            let decisions = try await client.postJSON(
                "/v1/offers/eligibility", #"{"appAccountToken":"\#(Self.token)","offerIDs":["wb1"],"evidence":\#(evidence)}"#, bearer: secret)
            let decision = try #require((decisions.json["decisions"] as? [[String: Any]])?.first, "\(decisions.text)")
            let failures = try #require(decision["evidenceFailures"] as? [[String: Any]], "\(decisions.text)")
            #expect(failures.map { $0["index"] as? Int } == [0, 2], "\(decisions.text)")
            #expect(failures.map { $0["code"] as? String } == ["malformed_jws", "app_account_token_mismatch"], "\(decisions.text)")
        }
    }

    @Test("Concurrent requests for one customer are one attempt (signatures within 24 h): each is decided under the customer's lock and signed")
    func concurrentRequestsForOneCustomer() async throws {
        let chain = try TestAppleChain()
        let server = try await server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let evidence = Self.evidenceJSON(try Self.history(chain))
        let body = #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#
        let statuses = try await server.live { client -> [HTTPResponse.Status] in
            let port = try #require(client.port)
            return try await withThrowingTaskGroup(of: HTTPResponse.Status.self) { group in
                for _ in 0..<12 {
                    group.addTask {
                        try await TestClient.withClient(host: "127.0.0.1", port: port) { connection in
                            try await connection.post(
                                "/v1/offers/signatures", headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"],
                                body: ByteBuffer(string: body)
                            ).status
                        }
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
        }
        // On the app's evidence, signatures within one signature lifetime are one attempt, which counts
        // (for waitBetweenOffersMonths 12) only once it is over: a payment sheet may be retried.
        #expect(statuses.filter { $0 == .created }.count == 12, "\(statuses)")
        #expect(try server.issuedCount() == 12)
    }

    @Test("Eligibility questions have a per-appAccountToken limit of their own: 429 with Retry-After, signing budget untouched")
    func eligibilityRateLimit() async throws {
        let chain = try TestAppleChain()
        let server = try await TestServer { configuration in
            configuration.eligibility = try! EligibilityConfiguration(
                catalogJSON: Data(Self.catalog.utf8), trustedRootPEMs: [try! chain.root.serializeAsPEM().pemString])
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 0.01, burst: 2)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let evidence = Self.evidenceJSON(try Self.history(chain))
        try await server.live { client in
            let question = #"{"appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#
            #expect(try await client.postJSON("/v1/offers/eligibility", question, bearer: secret).status == .ok)
            #expect(try await client.postJSON("/v1/offers/eligibility", question, bearer: secret).status == .ok)
            let limited = try await client.postJSON("/v1/offers/eligibility", question, bearer: secret)
            expectProblem(limited, .tooManyRequests, "rate_limited")
            // The eligibility limiter's window: 100 s for a whole token at 0.01/s, less the time the
            // machine took since the bucket emptied (96 was seen on a loaded machine). Above 50 it is
            // this limiter's: the client limiter is unlimited here, and the time a loaded machine
            // takes between the requests is seconds, not minutes.
            let retryAfter = Int(limited.headers[.retryAfter] ?? "")
            #expect(retryAfter.map { (51...100).contains($0) } == true, "Retry-After \(limited.headers[.retryAfter] ?? "none")")
            // Another customer is not affected, and this one can still get a signature.
            let other = #"{"appAccountToken":"0ad246b5-54d1-4e1b-88d4-ab934587435f","evidence":{}}"#
            #expect(try await client.postJSON("/v1/offers/eligibility", other, bearer: secret).status == .ok)
            let signed = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(evidence)}"#,
                bearer: secret)
            #expect(signed.status == .created, "\(signed.text)")
        }
    }

    @Test("Offers with rules need evidence; offers without rules sign as before; a subscriber is refused")
    func rulesAndNoRules() async throws {
        let chain = try TestAppleChain()
        let server = try await server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            expectProblem(
                try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)"}"#, bearer: secret),
                .badRequest, "evidence_required")
            expectProblem(
                try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.yearly","offerID":"wb1","evidence":{}}"#, bearer: secret),
                .badRequest, "product_not_in_offer")
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"goodwill"}"#, bearer: secret).status == .created)
            // Active subscriber: the last period ends next month.
            let active = Self.evidenceJSON(try Self.history(chain, lapsedMonths: -1))
            let response = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(Self.token)","evidence":\#(active)}"#, bearer: secret)
            expectProblem(response, .forbidden, "not_eligible")
            #expect((response.json["reasons"] as? [String])?.contains("currently_subscribed") == true, "\(response.text)")
            expectProblem(
                try await client.postJSON("/v1/offers/eligibility", #"{"offerIDs":["nope"],"evidence":{}}"#, bearer: secret),
                .badRequest, "unknown_offer")
            let none = try await client.postJSON("/v1/offers/eligibility", #"{"evidence":{}}"#, bearer: secret)
            let decisions = try #require(none.json["decisions"] as? [[String: Any]])
            #expect((decisions.first { $0["offerID"] as? String == "wb1" }?["reasons"] as? [String])?.contains("no_history") == true)
        }
        #expect(try server.issuedCount() == 1)
    }
}
