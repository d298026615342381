import Foundation
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import TestChildProcess
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A request signs with the key ring as it is when it signs, not as it was when the request
/// began: a request can take seconds (a slow body, a customer lock, Apple's API), and a key
/// activated (or a key retired or revoked) meanwhile must be in force for it too.
@Suite("A key activated while a request is under way signs it", .serialized)
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
            let body = #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)"}"#
            let request = RawSocket.requestBytes(
                port: port, method: "POST", path: "/v1/offers/signatures",
                headers: ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"], body: body)
            // The head and half the body: the server has begun the request.
            let split = request.count - body.utf8.count / 2
            let socket = try await onOwnThread { () throws -> Int32 in
                let socket = try RawSocket.connect(port: port)
                RawSocket.send(socket, Array(request.prefix(split)))
                return socket
            }
            defer { close(socket) }
            try await Task.sleep(for: .milliseconds(300))
            _ = try await store.transitionKey(
                keyID: "ROTATED002", to: .active, actor: "test", reason: "key change during a request", force: false,
                authenticator: server.masterKey.registryRows)
            // Until the server's ring has the new key (fresh requests signed with it), at most 10 s.
            var fresh = ""
            let giveUp = ContinuousClock.now + .seconds(10)
            repeat {
                let response = try await onOwnThread {
                    try RawSocket.request(
                        port: port, method: "POST", path: "/v1/offers/signatures",
                        headers: ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"],
                        body: #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(UUID().uuidString.lowercased())"}"#)
                }
                fresh = (response.json["legacy"] as? [String: Any])?["keyID"] as? String ?? "\(response.status)"
                if fresh != newKey.keyID { try await Task.sleep(for: .milliseconds(50)) }
            } while fresh != newKey.keyID && ContinuousClock.now < giveUp
            #expect(fresh == newKey.keyID, "the server never signed with the activated key")
            // The rest of the body: the request begun before the activation signs now.
            let response = try await onOwnThread { () throws -> RawSocket.Response in
                RawSocket.send(socket, Array(request.dropFirst(split)))
                return try RawSocket.parse(RawSocket.readToEnd(socket))
            }
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
}
