import AppStoreServerAPI
import AppleTestChain
import Crypto
import FakeAppStoreServerAPI
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import TestChildProcess
import Testing
import X509

/// Apple's Retention Messaging requests on the real server (loopback, real SQLite store), signed
/// by the Apple-like test chain; the subscription's history comes from notifications in the store
/// (or from a fake App Store Server API).
@Suite("Retention Messaging", .serialized)
struct RetentionTests {
    static let bundleID = "com.example.app"
    static let appAppleID: Int64 = 1_234_567_890
    static let token = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    static let offerMessage = "5d0e8a2e-1111-4c1e-9a43-0123456789ab"
    static let fallbackMessage = "5d0e8a2e-2222-4c1e-9a43-0123456789ab"
    let chain: TestAppleChain
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
    }

    static func catalog(port: Int, version: String = "v2") -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production"], "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production"},
                  "retention": {"signatureVersion": "\#(version)", "products": {"pro.monthly": {
                      "offers": [{"offerID": "retain_50", "messageIdentifier": "\#(offerMessage)"}],
                      "fallback": {"message": {"messageIdentifier": "\#(fallbackMessage)"}}}}}}},
         "offers": [
          {"offerID": "retain_50", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3, "waitBetweenOffersMonths": 12}}
        ]}
        """#
    }

    func subscriber(months: Int = 6, id: String = "500000001") -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: id,
            appAccountToken: Self.token, periodStarts: SubscriptionFixture.monthlyStarts(count: months, activeAt: now))
    }

    /// A Retention Messaging request body as Apple sends it.
    func request(
        _ originalTransactionID: String, productID: String = "pro.monthly", requestIdentifier: String = UUID().uuidString,
        signedDate: Date? = nil, appAppleID: Int64 = Self.appAppleID, environment: String = "Production", signer: TestAppleChain? = nil
    ) throws -> String {
        let payload: [String: Any] = [
            "originalTransactionId": originalTransactionID, "appAppleId": appAppleID, "productId": productID, "userLocale": "en-US",
            "requestIdentifier": requestIdentifier, "environment": environment, "signedDate": TestAppleChain.milliseconds(signedDate ?? now),
        ]
        return #"{"signedPayload":"\#(try (signer ?? chain).signJWS(payload))"}"#
    }

    /// The subscription's notifications, from its first purchase on (a complete stored history).
    func notify(_ customer: SubscriptionFixture, client: any TestClientProtocol) async throws {
        for index in customer.periodStarts.indices {
            var data: [String: Any] = [
                "bundleId": Self.bundleID, "environment": "Production", "appAppleId": Self.appAppleID,
                "signedTransactionInfo": try chain.signJWS(customer.transactionPayload(index)),
            ]
            data["signedRenewalInfo"] = try chain.signJWS([
                "originalTransactionId": customer.originalTransactionID, "productId": customer.productID, "autoRenewProductId": customer.productID,
                "autoRenewStatus": 1, "environment": "Production", "signedDate": TestAppleChain.milliseconds(customer.periodStarts[index]),
            ])
            var payload: [String: Any] = [
                "notificationType": index == 0 ? "SUBSCRIBED" : "DID_RENEW", "notificationUUID": UUID().uuidString, "data": data, "version": "2.0",
                "signedDate": TestAppleChain.milliseconds(customer.periodStarts[index]),
            ]
            if index == 0 { payload["subtype"] = "INITIAL_BUY" }
            let answer = try await client.postJSON("/v1/apple/notifications", #"{"signedPayload":"\#(try chain.signJWS(payload))"}"#)
            #expect(answer.status == .ok, "\(answer.text)")
        }
    }

    func withServer(
        version: String = "v2", configure: @escaping @Sendable (inout ServerConfiguration) -> Void = { _ in },
        _ body: @escaping @Sendable (TestServer, FakeAppStoreServerAPI, any TestClientProtocol) async throws -> Void
    ) async throws {
        let server = try await TestServer(bundles: [Self.bundleID]) { configuration in
            // Generous unless a test is about the budget: under the whole suite on two loaded
            // cores, 300 ms can pass before a decision and answer the fallback instead.
            configuration.retention.budget = .seconds(30)
            configure(&configuration)
        }
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { port in
            var running = server
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(Self.catalog(port: port, version: version).utf8), trustedRootPEMs: [root])
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            running.configuration.eligibility = eligibility
            let configured = running
            try await configured.live { client in try await body(configured, fake, client) }
        }
    }

    func members(_ response: TestResponse) -> [String] {
        ((try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any]).map { Array($0.keys) } ?? []
    }

    func issuedRecords(_ server: TestServer) async throws -> [[String: Any]] {
        try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "signature.issued" }.map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.body.utf8)) as? [String: Any])
        }
    }

    @Test("An eligible subscriber gets a promotionalOffer whose V2 signature verifies (transactionId is the originalTransactionId); a second page view gets it again (a view is no redemption)")
    func eligibleSubscriberV2() async throws {
        let customer = subscriber()
        try await withServer { server, fake, client in
            try await notify(customer, client: client)
            let requestIdentifier = UUID().uuidString
            let answer = try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID, requestIdentifier: requestIdentifier))
            #expect(answer.status == .ok, "\(answer.text)")
            #expect(members(answer) == ["promotionalOffer"], "exactly one member: \(answer.text)")
            let offer = try #require(answer.json["promotionalOffer"] as? [String: Any])
            #expect(Set(offer.keys) == ["messageIdentifier", "promotionalOfferSignatureV2"])
            #expect(offer["messageIdentifier"] as? String == Self.offerMessage)
            let jws = try #require(offer["promotionalOfferSignatureV2"] as? String)
            let key = try #require(server.keys[Self.bundleID])
            guard case .valid(let header, let claims) = PromotionalOfferVerifier(publicKey: key.publicKey).verifyJWS(jws, audience: .promotionalOffer) else {
                Issue.record("the V2 signature does not verify with the key's public key")
                return
            }
            #expect(header.kid == key.keyID)
            #expect(claims.transactionId == customer.originalTransactionID, "Apple requires the request's originalTransactionId")
            #expect(claims.offerIdentifier == "retain_50")
            #expect(claims.productId == "pro.monthly")
            #expect(claims.bid == Self.bundleID)
            #expect(claims.iss == TestServer.issuerID)
            #expect(claims.nonce == requestIdentifier.lowercased(), "the nonce is the requestIdentifier")
            #expect(fake.arrivals == 0, "the stored history decided; Apple's API was not asked")

            let issued = try await issuedRecords(server)
            #expect(issued.count == 1)
            #expect(issued.first?["originalTransactionID"] as? String == customer.originalTransactionID)
            #expect(issued.first?["retentionRequestIdentifier"] as? String == requestIdentifier.lowercased())
            #expect(issued.first?["appAccountToken"] as? String == Self.token)
            let answered = try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "retention.answered" }
            #expect(answered.count == 1)

            // A request is a page view: the signature answered to it is no redemption (Apple's history
            // has none), so the next view gets the offer again; the once-a-year rule counts Apple's redemptions.
            let again = try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID))
            #expect(again.status == .ok, "\(again.text)")
            #expect(members(again) == ["promotionalOffer"], "\(again.text)")
            #expect(try await issuedRecords(server).count == 2)
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"retention_requests_total{outcome="promotionalOffer"} 2"#))
        }
    }

    /// `retention simulate` for the subscriber's product on the server's store and catalog, with
    /// the server's master key (`checked`) or without.
    func simulate(
        _ customer: SubscriptionFixture, on server: TestServer, checked: Bool, environment: AppleEnvironment = .production
    ) async throws -> RetentionSimulation.Outcome {
        let eligibility = try #require(server.configuration.eligibility)
        return try await RetentionSimulation.simulate(
            store: server.store, catalog: eligibility.catalog, app: eligibility.catalog.appSettings(bundleID: Self.bundleID),
            originalTransactionID: customer.originalTransactionID, productID: customer.productID, environment: environment, now: Date(),
            apple: nil, trustedRoots: eligibility.trustedRoots, masterKey: checked ? server.masterKey : nil)
    }

    @Test("retention simulate decides as the endpoint does, on the stored history and the ledger, and signs nothing")
    func simulation() async throws {
        let customer = subscriber(id: "500000004")
        try await withServer { server, _, client in
            try await notify(customer, client: client)
            let before = try await simulate(customer, on: server, checked: true)
            #expect(before.keyChecked)
            #expect(before.answer == "promotionalOffer" && before.historySource == "store")
            #expect(try await issuedRecords(server).isEmpty, "a simulation signs nothing")
            #expect(try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID)).status == .ok)
            let after = try await simulate(customer, on: server, checked: false)
            // The answered request was a page view, not a redemption: still the offer.
            #expect(after.answer == "promotionalOffer", "\(String(describing: after.decision?.tried))")
            #expect(after.fallbackReason == nil)
        }
    }

    @Test("retention simulate decides as the endpoint: only on stored JWS that verify (not the decoded column), with the key the service would load (no_active_key, issuer_id_missing as the endpoint audits them), and nothing for an environment the app does not accept")
    func simulationAsTheEndpoint() async throws {
        let customer = subscriber(id: "500000014")
        try await withServer { server, _, client in
            try await notify(customer, client: client)
            func simulate(checked: Bool, environment: AppleEnvironment = .production) async throws -> RetentionSimulation.Outcome {
                try await self.simulate(customer, on: server, checked: checked, environment: environment)
            }
            /// The endpoint's answer, once the service's key ring shows `expected` (it reloads every 50 ms).
            func endpoint(until expected: [String]) async throws -> [String] {
                var answer: [String] = []
                let deadline = ContinuousClock.now + .seconds(10)
                repeat {
                    answer = members(try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID)))
                    if answer == expected { break }
                    try await Task.sleep(for: .milliseconds(50))
                } while ContinuousClock.now < deadline
                return answer
            }
            func lastFallbackReason() async throws -> String? {
                let answered = try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "retention.answered" }
                guard let last = answered.last else { return nil }
                let body = try JSONSerialization.jsonObject(with: Data(last.body.utf8)) as? [String: Any]
                return body?["fallbackReason"] as? String
            }
            for checked in [true, false] {
                let outcome = try await simulate(checked: checked)
                #expect(outcome.answer == "promotionalOffer" && outcome.keyChecked == checked)
            }
            // The app accepts Production only: Apple's Sandbox request would be refused (403), so nothing.
            let foreign = try await simulate(checked: true, environment: .sandbox)
            #expect(foreign.answer == "nothing" && foreign.fallbackReason == "retention_request_foreign")

            // The operator retires the key: nothing could sign the offer; the endpoint agrees.
            let key = try #require(server.keys[Self.bundleID])
            _ = try await server.store.transitionKey(
                keyID: key.keyID, to: .retired, actor: "test", reason: nil, force: true, authenticator: server.masterKey.registryRows)
            for checked in [true, false] {
                let unsigned = try await simulate(checked: checked)
                #expect(unsigned.answer == "message", "the plan's fallback: \(unsigned.answer)")
                #expect(unsigned.fallbackReason == "no_active_key" && unsigned.decision?.fallbackReason == "no_active_key")
                #expect(unsigned.historySource == "store")
            }
            #expect(try await endpoint(until: ["message"]) == ["message"])
            #expect(try await lastFallbackReason() == "no_active_key")

            // A new key without an issuer ID (imported, it is the bundle's active key, there being
            // none): a V2 plan cannot be signed; the endpoint agrees.
            let issuerless = try InAppPurchaseKey.generateForDevelopment(keyID: "NOISSUER01")
            let imported = try await KeyRegistry.importKey(
                issuerless, bundleID: Self.bundleID, issuerID: nil, development: true, into: server.store, masterKey: server.masterKey, actor: "test", reason: nil)
            #expect(imported.state == .active)
            for checked in [true, false] {
                #expect(try await simulate(checked: checked).fallbackReason == "issuer_id_missing")
            }
            _ = try await endpoint(until: ["message"])
            try await Task.sleep(for: .milliseconds(200))
            #expect(try await endpoint(until: ["message"]) == ["message"])
            #expect(try await lastFallbackReason() == "issuer_id_missing")

            // A database writer gives that key an issuer ID by SQL (its MAC no longer matches): the
            // service does not believe the row; neither does the simulation with the master key (no
            // key it could load); without it, the row is taken as it is (said: keyChecked false).
            let queue = try DatabaseQueue(path: server.storePath)
            try await queue.write { db in
                try db.execute(sql: "UPDATE signing_keys SET issuer_id = 'forged-issuer' WHERE key_id = 'NOISSUER01'")
            }
            let checkedAfterEdit = try await simulate(checked: true)
            #expect(checkedAfterEdit.answer == "message" && checkedAfterEdit.fallbackReason == "no_active_key" && checkedAfterEdit.keyChecked)
            let unchecked = try await simulate(checked: false)
            #expect(unchecked.answer == "promotionalOffer" && !unchecked.keyChecked)
            #expect(try await endpoint(until: ["message"]) == ["message"], "the service kept the last registry it verified")

            // A database writer deletes the retired key's row: the manifest no longer vouches for
            // the registry, which a starting service refuses, and so does the simulation.
            try await queue.write { db in
                try db.execute(sql: "DELETE FROM signing_keys WHERE key_id = ?", arguments: [key.keyID])
            }
            await #expect(throws: RetentionSimulation.RegistryRefused.self) { _ = try await simulate(checked: true) }

            // A database writer swaps one stored transaction's JWS for one signed by another chain,
            // the decoded column untouched: the stored history is refused, as the endpoint refuses it.
            let forged = try TestAppleChain().signJWS(customer.transactionPayload(5))
            try await queue.write { db in
                try db.execute(sql: "UPDATE apple_transactions SET jws = ? WHERE transaction_id = ?", arguments: [forged, customer.transactionID(5)])
            }
            let tampered = try await simulate(checked: false)
            #expect(tampered.historySource == "none", "decided on a stored history whose JWS does not verify")
            #expect(tampered.fallbackReason == "history_unavailable")
        }
    }

    @Test("With V1 configured, the legacy signature verifies over the legacy payload, with the subscription's appAccountToken")
    func eligibleSubscriberV1() async throws {
        let customer = subscriber()
        try await withServer(version: "v1") { server, _, client in
            try await notify(customer, client: client)
            let answer = try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID))
            #expect(answer.status == .ok, "\(answer.text)")
            #expect(members(answer) == ["promotionalOffer"])
            let offer = try #require(answer.json["promotionalOffer"] as? [String: Any])
            let v1 = try #require(offer["promotionalOfferSignatureV1"] as? [String: Any])
            #expect(Set(v1.keys) == ["encodedSignature", "productId", "nonce", "timestamp", "keyId", "offerIdentifier", "appAccountToken"])
            let key = try #require(server.keys[Self.bundleID])
            let keyID = try #require(v1["keyId"] as? String)
            let productID = try #require(v1["productId"] as? String)
            let offerID = try #require(v1["offerIdentifier"] as? String)
            let tokenText = try #require(v1["appAccountToken"] as? String)
            let nonceText = try #require(v1["nonce"] as? String)
            let nonce = try #require(UUID(uuidString: nonceText))
            let timestamp = try #require((v1["timestamp"] as? NSNumber)?.int64Value)
            let encoded = try #require(v1["encodedSignature"] as? String)
            let payload = try PromotionalOfferPayload(
                bundleID: Self.bundleID, keyID: keyID, productID: productID, offerID: offerID, appAccountToken: UUID(uuidString: tokenText),
                nonce: nonce, timestamp: timestamp)
            #expect(PromotionalOfferVerifier(publicKey: key.publicKey).verifyLegacy(payload: payload, signature: encoded) == .valid)
            #expect(v1["appAccountToken"] as? String == Self.token)
        }
    }

    @Test("An ineligible subscriber (paid too short) gets the fallback, and nothing is signed")
    func ineligibleSubscriber() async throws {
        let customer = subscriber(months: 2, id: "500000002")
        try await withServer { server, _, client in
            try await notify(customer, client: client)
            let answer = try await client.postJSON("/v1/apple/retention", try request(customer.originalTransactionID))
            #expect(answer.status == .ok, "\(answer.text)")
            #expect(members(answer) == ["message"])
            #expect(try await issuedRecords(server).isEmpty)
            let answered = try await server.store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "retention.answered" }
            let record = try #require(answered.first)
            let body = try #require(try JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any])
            let decisions = try #require(body["decisions"] as? [[String: Any]])
            #expect(decisions.first?["reasons"] as? [String] == ["paid_too_short"])
        }
    }

    @Test("Forged, foreign-chain, foreign-app, stale and replayed requests are refused; nothing is signed or audited as issued")
    func refusals() async throws {
        let customer = subscriber(id: "500000003")
        let stranger = try TestAppleChain()
        try await withServer { server, _, client in
            try await notify(customer, client: client)
            let otid = customer.originalTransactionID
            let cases: [(String, String, HTTPResponse.Status, String)] = [
                ("signed by an untrusted chain", try request(otid, signer: stranger), .badRequest, "retention_request_unverified"),
                ("another app", try request(otid, appAppleID: 42), .forbidden, "retention_request_foreign"),
                ("Sandbox, which the app does not accept", try request(otid, environment: "Sandbox"), .forbidden, "retention_request_foreign"),
                ("signed ten minutes ago", try request(otid, signedDate: now.addingTimeInterval(-600)), .badRequest, "retention_request_stale"),
                ("signed ten minutes ahead", try request(otid, signedDate: now.addingTimeInterval(600)), .badRequest, "retention_request_stale"),
                ("not a JWS", #"{"signedPayload":"x.y"}"#, .badRequest, "retention_request_unverified"),
                ("no signedPayload", #"{}"#, .badRequest, "missing_field"),
            ]
            for (name, text, status, code) in cases {
                let answer = try await client.postJSON("/v1/apple/retention", text)
                expectProblem(answer, status, code)
                #expect(answer.status == status, "\(name)")
            }
            #expect(try await issuedRecords(server).isEmpty)

            // The same request twice: answered once, refused the second time.
            let replayed = try request(otid)
            let first = try await client.postJSON("/v1/apple/retention", replayed)
            #expect(first.status == .ok, "\(first.text)")
            #expect(members(first) == ["promotionalOffer"])
            expectProblem(try await client.postJSON("/v1/apple/retention", replayed), .conflict, "retention_request_replayed")
            #expect(try await issuedRecords(server).count == 1)
            #expect(try await server.store.verifiedChain().isIntact)
        }
    }

    @Test("History unreachable (no stored history, Apple slower than the deadline): the fallback, within the deadline")
    func historyUnreachable() async throws {
        try await withServer(configure: { $0.retention.budget = .milliseconds(300) }) { server, fake, client in
            fake.setAnswerDelay(.seconds(600))
            let start = ContinuousClock.now
            let answer = try await client.postJSON("/v1/apple/retention", try request("500000099"))
            let elapsed = ContinuousClock.now - start
            #expect(answer.status == .ok, "\(answer.text)")
            #expect(members(answer) == ["message"])
            // Generous against a loaded machine; without the budget it would wait for Apple's 600 s.
            #expect(elapsed < .seconds(60), "answered after \(elapsed)")
            #expect(try await issuedRecords(server).isEmpty)
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"retention_fallbacks_total{reason="deadline"} 1"#), "\(metrics.split(separator: "\n").filter { $0.contains("retention") })")
        }
    }

    /// Runs `Tests/Interop/apple_oracle.py` (Apple's App Store Server Library for Python) on a batch.
    static func oracle(_ cases: [[String: Any]]) async throws -> [[String: Any]] {
        let python = try await PythonTestEnvironment.shared().python
        let script = URL(fileURLWithPath: PythonTestEnvironment.packageRoot).appendingPathComponent("Tests/Interop/apple_oracle.py")
        let input = try JSONSerialization.data(withJSONObject: cases)
        let result = try await onOwnThread { try ChildProcess.run(python, [script.path], stdin: input, timeout: .seconds(300)) }
        try #require(result.status == 0, "apple_oracle.py exited \(result.status): \(result.stderrText)")
        return try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [[String: Any]])
    }

    /// JSON without null members (the library writes its unset fields as null).
    static func withoutNulls(_ value: Any) -> Any {
        if let object = value as? [String: Any] { return object.compactMapValues { $0 is NSNull ? nil : withoutNulls($0) } }
        if let array = value as? [Any] { return array.map(withoutNulls) }
        return value
    }

    @Test("Apple's Python library reads the requests and notifications our tests sign, and our V2 and V1 answers, as Apple's models")
    func appleLibraryInterop() async throws {
        let customer = subscriber(id: "500000005")
        for version in ["v2", "v1"] {
            try await withServer(version: version) { server, _, client in
                try await notify(customer, client: client)
                let root = try TestAppleChain.base64DER(chain.root)
                let requestIdentifier = UUID().uuidString.lowercased()
                let body = try request(customer.originalTransactionID, requestIdentifier: requestIdentifier)
                let signedPayload = try #require((try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any])?["signedPayload"] as? String)
                let answer = try await client.postJSON("/v1/apple/retention", body)
                #expect(answer.status == .ok, "\(answer.text)")
                let ours = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.readableBytesView)) as? [String: Any])
                var cases: [[String: Any]] = [
                    ["op": "decode-realtime-request", "rootDER": root, "environment": "Production", "bundleId": Self.bundleID, "appAppleId": Self.appAppleID,
                     "signedPayload": signedPayload],
                    ["op": "realtime-response", "body": ours],
                ]
                let offer = try #require(ours["promotionalOffer"] as? [String: Any])
                let key = try #require(server.keys[Self.bundleID])
                if let jws = offer["promotionalOfferSignatureV2"] as? String {
                    cases.append(["op": "jws-verify", "publicKeyPEM": key.publicKey.pemRepresentation, "compactJWS": jws, "audience": "promotional-offer"])
                }
                let results = try await Self.oracle(cases)
                #expect(results[0]["valid"] as? Bool == true, "\(results[0])")
                #expect(results[0]["originalTransactionId"] as? String == customer.originalTransactionID)
                #expect(results[0]["requestIdentifier"] as? String == requestIdentifier)
                #expect(results[0]["environment"] as? String == "Production")
                #expect((results[0]["appAppleId"] as? NSNumber)?.int64Value == Self.appAppleID)
                // Apple's model takes our answer whole: every member is one of its fields, with its type.
                let unstructured = try #require(results[1]["unstructured"])
                #expect(NSDictionary(dictionary: Self.withoutNulls(unstructured) as? [String: Any] ?? [:]).isEqual(to: ours), "\(unstructured) vs \(ours)")
                if version == "v2" {
                    #expect(results[2]["valid"] as? Bool == true, "\(results[2])")
                    #expect((results[2]["claims"] as? [String: Any])?["transactionId"] as? String == customer.originalTransactionID)
                } else {
                    #expect(offer["promotionalOfferSignatureV1"] != nil)
                }
            }
        }
        // A notification our tests sign, read by Apple's verifier.
        let transaction = customer.transactionPayload(0).merging(["offerType": 2, "offerIdentifier": "retain_50"]) { $1 }
        let payload: [String: Any] = [
            "notificationType": "OFFER_REDEEMED", "subtype": "UPGRADE", "notificationUUID": UUID().uuidString.lowercased(), "version": "2.0",
            "signedDate": TestAppleChain.milliseconds(now),
            "data": ["bundleId": Self.bundleID, "environment": "Production", "appAppleId": Self.appAppleID, "signedTransactionInfo": try chain.signJWS(transaction)],
        ]
        let decoded = try await Self.oracle([[
            "op": "decode-notification", "rootDER": try TestAppleChain.base64DER(chain.root), "environment": "Production", "bundleId": Self.bundleID,
            "appAppleId": Self.appAppleID, "signedPayload": try chain.signJWS(payload),
        ]])
        #expect(decoded[0]["valid"] as? Bool == true, "\(decoded[0])")
        #expect(decoded[0]["notificationType"] as? String == "OFFER_REDEEMED")
        #expect(decoded[0]["subtype"] as? String == "UPGRADE")
        #expect(decoded[0]["transactionId"] as? String == customer.transactionID(0))
        #expect((decoded[0]["offerType"] as? NSNumber)?.intValue == 2)
        #expect(decoded[0]["offerIdentifier"] as? String == "retain_50")
    }
}

