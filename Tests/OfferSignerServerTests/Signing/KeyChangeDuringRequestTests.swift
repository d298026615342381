import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import TestChildProcess
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A request signs with the key ring as it is when it signs, not as it was when the request
/// began: a request can take seconds (a slow body, a customer lock, Apple's API), and a key
/// activated (or a key retired or revoked) meanwhile must be in force for it too. Likewise its
/// caller, authenticated at the start: an API client revoked meanwhile gets nothing signed,
/// decided or answered.
@Suite("A key activated, or a client revoked, while a request is under way", .serialized)
struct KeyChangeDuringRequestTests {
    @Test("A request whose body is still arriving when a new key is activated is signed with the new key once the ring has it")
    func keyActivatedDuringSlowBody() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let oldKey = try #require(server.keys["com.example.app"])
        let newKey = try InAppPurchaseKey.generateForDevelopment(keyID: "ROTATED002")
        _ = try await KeyRegistry.importKey(
            newKey, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: server.store, masterKey: server.masterKey,
            actor: "test", reason: "key change during a request")
        let store = server.store
        try await server.live { client in
            let port = try #require(client.port)
            let token = UUID().uuidString.lowercased()
            let pending = try await PendingRequest.begin(port: port, secret: secret, token: token)
            defer { close(pending.socket) }
            try await Task.sleep(for: .milliseconds(300))
            _ = try await store.transitionKey(
                keyID: "ROTATED002", to: .active, actor: "test", reason: "key change during a request", force: false,
                authenticator: server.masterKey.registryRows)
            let fresh = try await freshRequestsUntil(port: port, secret: secret) { response in
                (response.json["legacy"] as? [String: Any])?["keyID"] as? String == newKey.keyID
            }
            #expect(fresh, "the server never signed with the activated key")
            // The rest of the body: the request begun before the activation signs now.
            let response = try await pending.finish()
            #expect(response.status == 201, "\(response.body)")
            let legacy = try #require(response.json["legacy"] as? [String: Any], "\(response.body)")
            let keyID = try #require(legacy["keyID"] as? String)
            #expect(keyID == newKey.keyID, "the request begun before the activation was signed with \(keyID), not the key in force when it signed")
            let document = LegacySignatureDocument(
                bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: token, keyID: keyID,
                nonce: try #require(legacy["nonce"] as? String), timestamp: try #require((legacy["timestamp"] as? NSNumber)?.int64Value),
                signature: try #require(legacy["signature"] as? String))
            #expect(SignatureDocument.legacy(document).verify(with: keyID == newKey.keyID ? newKey.publicKey : oldKey.publicKey) == .valid)
        }
    }

    @Test("A request whose body is still arriving when its API client is revoked gets 401 and nothing is signed or recorded")
    func clientRevokedDuringSlowBody() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "leaving")
        let other = try await server.createClient(name: "staying")
        let store = server.store
        try await server.live { client in
            let port = try #require(client.port)
            let pending = try await PendingRequest.begin(port: port, secret: secret, token: UUID().uuidString.lowercased())
            defer { close(pending.socket) }
            try await Task.sleep(for: .milliseconds(300))
            _ = try await store.revokeClient(name: "leaving", actor: "test", authenticator: server.masterKey.registryRows)
            // Fresh requests answered before the server's ring had the revocation are signed.
            let refused = try await freshRequestsUntil(port: port, secret: secret) { $0.status == 401 }
            #expect(refused, "the server never refused the revoked client")
            let issuedBefore = try server.issuedCount()
            let response = try await pending.finish()
            #expect(response.status == 401, "a request begun before the revocation was answered \(response.status): \(response.body)")
            #expect(response.json["code"] as? String == "unauthorized")
            #expect(try server.issuedCount() == issuedBefore, "a signature was recorded for the revoked client")
            // The other client still signs.
            let answer = try await onOwnThread { try RawSocket.request(port: port, method: "POST", path: "/v1/offers/signatures", headers: PendingRequest.headers(other), body: PendingRequest.body(token: UUID().uuidString.lowercased())) }
            #expect(answer.status == 201, "\(answer.body)")
        }
    }

    @Test(
        "A client revoked while its request for an offer under rules, or its eligibility question, waits for Apple's API gets 401: no decision is made, audited or answered",
        arguments: ["/v1/offers/signatures", "/v1/offers/eligibility"])
    func clientRevokedBeforeTheDecision(path: String) async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "leaving")
        let key = try #require(server.keys["com.example.app"])
        let fake = FakeAppStoreServerAPI(bundleID: "com.example.app", keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let store = server.store
        // A current subscriber: decided, Apple's history would refuse a win-back with reasons.
        try await withAppleDecidedOffer(server, fake: fake, originalTransactionID: "300000008") { configured, client, customer in
            let port = try #require(client.port)
            let token = try #require(customer.appAccountToken)
            let body =
                path == "/v1/offers/signatures"
                ? #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(token)","transactionID":"\#(customer.originalTransactionID)"}"#
                : #"{"offerIDs":["wb_apple"],"appAccountToken":"\#(token)","transactionID":"\#(customer.originalTransactionID)"}"#
            // Apple answers after 3 s: once the request's first call has arrived at the fake (not
            // yet answered), the request was authenticated and waits for Apple, before any decision.
            fake.setAnswerDelay(.seconds(3))
            let answer = Task {
                try await onOwnThread { try RawSocket.request(port: port, method: "POST", path: path, headers: PendingRequest.headers(secret), body: body) }
            }
            try #require(try await fake.waitForArrival(within: .seconds(10)) > 0, "the service never asked Apple")
            _ = try await store.revokeClient(name: "leaving", actor: "test", authenticator: server.masterKey.registryRows)
            try await configured.waitForRegistry(client)
            // A call to Apple still unanswered: the decision, which needs every answer, is not made
            // yet (else the revocation came after it, and the test proves less).
            #expect(fake.arrivals > fake.requests.count, "every Apple call was answered before the ring had the revocation")
            let recordsBefore = try await store.auditHead().count
            let response = try await answer.value
            #expect(response.status == 401, "a request begun before the revocation was answered \(response.status): \(response.body)")
            #expect(response.json["code"] as? String == "unauthorized", "\(response.body)")
            #expect(response.json["reasons"] == nil && response.json["decisions"] == nil, "the revoked client was told the decision: \(response.body)")
            #expect(try await store.auditHead().count == recordsBefore, "a decision was audited for the revoked client")
            #expect(try server.issuedCount() == 0)
        }
    }

    @Test("A request whose body is still arriving when a new key is activated asks Apple's API with a token of the new key")
    func appleAskedWithTheKeyActiveWhenAsked() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let newKey = try InAppPurchaseKey.generateForDevelopment(keyID: "ROTATED003")
        _ = try await KeyRegistry.importKey(
            newKey, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: server.store, masterKey: server.masterKey,
            actor: "test", reason: "key change before Apple is asked")
        // Apple knows the new key only: a token of the old key would be refused.
        let fake = FakeAppStoreServerAPI(bundleID: "com.example.app", keyID: newKey.keyID, issuerID: TestServer.issuerID, publicKey: newKey.publicKey)
        let store = server.store
        try await withAppleDecidedOffer(server, fake: fake, originalTransactionID: "300000007") { configured, client, customer in
            let port = try #require(client.port)
            let token = try #require(customer.appAccountToken)
            let pending = try await PendingRequest.begin(
                port: port, secret: secret, token: token,
                body: #"{"productID":"pro.monthly","offerID":"wb_apple","appAccountToken":"\#(token)","transactionID":"\#(customer.originalTransactionID)"}"#)
            defer { close(pending.socket) }
            try await Task.sleep(for: .milliseconds(300))
            #expect(fake.arrivals == 0, "Apple was asked before the body was complete")
            _ = try await store.transitionKey(
                keyID: newKey.keyID, to: .active, actor: "test", reason: "key change before Apple is asked", force: false,
                authenticator: server.masterKey.registryRows)
            try await configured.waitForRegistry(client)
            let response = try await pending.finish()
            // Apple's answer decided: a current subscriber is not offered a win-back.
            #expect(response.status == 403, "\(response.status): \(response.body)")
            #expect(response.json["reasons"] as? [String] == ["currently_subscribed"], "\(response.body)")
            let tokens = fake.requests.map(\.token)
            #expect(!tokens.isEmpty)
            #expect(
                tokens.allSatisfy { $0?.header["kid"] == newKey.keyID && $0?.problems == [] },
                "Apple was asked with \(tokens.map { $0?.header["kid"] ?? "no token" })")
        }
    }
}

/// Runs `body` against `server`, live, with a catalog whose offer `wb_apple` is decided on
/// Apple's history, asked of `fake`; `fake` holds one current subscriber (six monthly renewals,
/// the last active now) whose original transaction ID is `originalTransactionID`.
private func withAppleDecidedOffer(
    _ server: TestServer, fake: FakeAppStoreServerAPI, originalTransactionID: String,
    _ body: @escaping @Sendable (_ configured: TestServer, _ client: any TestClientProtocol, _ customer: SubscriptionFixture) async throws -> Void
) async throws {
    let chain = try TestAppleChain()
    let now = Date()
    let customer = SubscriptionFixture(
        bundleID: "com.example.app", productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: originalTransactionID,
        appAccountToken: UUID().uuidString.lowercased(), periodStarts: SubscriptionFixture.monthlyStarts(count: 6, activeAt: now))
    fake.add(try customer.customer(chain, now: now))
    let root = try chain.root.serializeAsPEM().pemString
    try await fake.run { applePort in
        var eligibility = try EligibilityConfiguration(
            catalogJSON: Data(AppleHistorySourceTests.catalog(port: applePort).utf8), trustedRootPEMs: [root])
        eligibility.appStoreServerAPI.timeBudget = .seconds(30)
        var running = server
        running.configuration.eligibility = eligibility
        let configured = running
        try await configured.live { client in try await body(configured, client, customer) }
    }
}

/// A signing request sent up to half its body: the server has begun it (authenticated it) and
/// waits for the rest.
private struct PendingRequest {
    let socket: Int32
    let rest: [UInt8]

    static func headers(_ secret: String) -> [String: String] {
        ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"]
    }

    static func body(token: String) -> String {
        #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)"}"#
    }

    static func begin(
        port: Int, secret: String, token: String, body: String? = nil, path: String = "/v1/offers/signatures"
    ) async throws -> PendingRequest {
        let body = body ?? Self.body(token: token)
        let request = RawSocket.requestBytes(port: port, method: "POST", path: path, headers: headers(secret), body: body)
        let split = request.count - body.utf8.count / 2
        let socket = try await onOwnThread { () throws -> Int32 in
            let socket = try RawSocket.connect(port: port)
            RawSocket.send(socket, Array(request.prefix(split)))
            return socket
        }
        return PendingRequest(socket: socket, rest: Array(request.dropFirst(split)))
    }

    /// Sends the rest of the body and reads the answer.
    func finish() async throws -> RawSocket.Response {
        try await onOwnThread { () throws -> RawSocket.Response in
            RawSocket.send(socket, rest)
            return try RawSocket.parse(RawSocket.readToEnd(socket))
        }
    }
}

/// Sends fresh signing requests until one's answer satisfies `done` (the server's ring has the
/// change), for at most 10 s; whether one did.
private func freshRequestsUntil(port: Int, secret: String, _ done: (RawSocket.Response) -> Bool) async throws -> Bool {
    let giveUp = ContinuousClock.now + .seconds(10)
    while ContinuousClock.now < giveUp {
        let response = try await onOwnThread {
            try RawSocket.request(
                port: port, method: "POST", path: "/v1/offers/signatures", headers: PendingRequest.headers(secret),
                body: PendingRequest.body(token: UUID().uuidString.lowercased()))
        }
        if done(response) { return true }
        try await Task.sleep(for: .milliseconds(50))
    }
    return false
}
