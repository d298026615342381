import AppStoreServerAPI
import AppleTestChain
import Crypto
import Foundation
import X509
import SwiftASN1
import HTTPTypes
import HummingbirdTesting
import OfferSignerServer
import TestChildProcess
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Attacks on the work the server does for callers it cannot trust: anyone may call the Apple
/// endpoints, and evidence is whatever the caller sends. Real server on loopback.
@Suite("Attacks: bounded work for unauthenticated and evidence requests", .serialized)
struct AppleEndpointFloodTests {
    @Test("40 clients sending notification bodies slowly hold no place: retention is answered, a fast notification too, signing is untouched, and each slow body is cut at the body deadline")
    func slowBodiesHoldNoPlace() async throws {
        let chain = try TestAppleChain()
        let catalog = #"""
            {"offers": [{"offerID": "wb1", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
                         "kind": "win-back", "rules": {"minPaidMonths": 1}}],
             "apps": {"com.example.app": {"environments": ["Production", "Sandbox"]}}}
            """#
        var server = try await TestServer {
            $0.appleEndpointConcurrency = 32
            $0.appleEndpointBodyDeadline = .seconds(2)
            // Far from the body deadline, so a loaded machine cannot blur which of the two cut the slow bodies.
            $0.idleTimeout = .seconds(120)
        }
        server.configuration.eligibility = try EligibilityConfiguration(
            catalogJSON: Data(catalog.utf8), trustedRootPEMs: [try chain.root.serializeAsPEM().pemString])
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let running = server
        try await running.live { client in
            let port = try #require(client.port)
            // 40 attackers (more than the gate's 32 places) send a notification's head and one byte of its body.
            let held = try await onOwnThread { () -> [Int32] in
                try (0..<40).map { _ in
                    let socket = try RawSocket.connect(port: port, receiveTimeout: .seconds(20))
                    _ = RawSocket.send(socket, "POST /v1/apple/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
                    return socket
                }
            }
            defer { for socket in held { close(socket) } }
            let opened = ContinuousClock.now
            try await Task.sleep(for: .milliseconds(200))
            // Retention goes through its own gate to verification (this request is not Apple's: 400).
            let retention = try await client.postJSON("/v1/apple/retention", #"{"signedPayload":"x.y.z"}"#)
            #expect(retention.status == .badRequest, "\(retention.text)")
            #expect(retention.json["code"] as? String == "retention_request_unverified")
            // So does a notification whose body arrives at once.
            let notification = try await client.postJSON("/v1/apple/notifications", #"{"signedPayload":"x.y.z"}"#)
            #expect(notification.status == .badRequest, "\(notification.text)")
            #expect(notification.json["code"] as? String == "notification_unverified")
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"o"}"#, bearer: secret).status == .created)
            // The slow bodies: every one answered 400 body_incomplete once the 2 s body deadline
            // passed, not closed at the 120 s idle timeout (which answers nothing and counts the
            // connection in offer_signer_connections_timed_out_total).
            let answers = try await onOwnThread { held.map { RawSocket.readToEnd($0) } }
            let elapsed = ContinuousClock.now - opened
            #expect(elapsed < .seconds(60), "the slow bodies were held for \(elapsed)")
            let codes = answers.compactMap { (try? RawSocket.parse($0))?.json["code"] as? String }
            #expect(codes.count == held.count && codes.allSatisfy { $0 == "body_incomplete" }, "\(codes.count) of \(held.count) answered: \(codes)")
            let metrics = try await onOwnThread {
                try RawSocket.request(port: port, method: "GET", path: "/metrics", headers: ["Authorization": "Bearer \(TestServer.operatorSecret)"])
            }
            let timedOut = metrics.body.split(separator: "\n").first { $0.hasPrefix("offer_signer_connections_timed_out_total") }
            #expect((timedOut.flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0) == 0, "cut by the idle deadline: \(timedOut ?? "")")
        }
    }

    @Test("An eligibility question carrying 200 forged transactions over 50 forged chains: refused, at most four chains validated, quickly")
    func forgedEvidenceOverHTTP() async throws {
        let chain = try TestAppleChain()
        let catalog = #"""
            {"offers": [{"offerID": "wb1", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
                         "kind": "win-back", "rules": {"minPaidMonths": 1}}],
             "apps": {"com.example.app": {"environments": ["Production", "Sandbox"]}}}
            """#
        var server = try await TestServer()
        server.configuration.eligibility = try EligibilityConfiguration(
            catalogJSON: Data(catalog.utf8), trustedRootPEMs: [try chain.root.serializeAsPEM().pemString])
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let items = try ForgedItems.make(chain: chain, count: 200, leaves: 50)
        let evidence = #"{"signedTransactions":[\#(items.map { "\"\($0)\"" }.joined(separator: ","))],"signedRenewalInfos":[]}"#
        let running = server
        try await running.live { client in
            let start = ContinuousClock.now
            let answer = try await client.postJSON(
                "/v1/offers/eligibility", #"{"appAccountToken":"\#(UUID().uuidString)","offerIDs":["wb1"],"evidence":\#(evidence)}"#, bearer: secret)
            let elapsed = ContinuousClock.now - start
            #expect(answer.status == .ok, "\(answer.text.prefix(300))")
            let decision = try #require((answer.json["decisions"] as? [[String: Any]])?.first)
            #expect(decision["eligible"] as? Bool == false)
            let failures = try #require(decision["evidenceFailures"] as? [[String: Any]])
            let codes = Dictionary(grouping: failures, by: { $0["code"] as? String ?? "" }).mapValues(\.count)
            #expect(codes == ["untrusted_chain": 16, "too_many_items": 184], "\(codes)")
            #expect(elapsed < .seconds(10), "took \(elapsed)")
        }
    }
}

/// Forged transactions (the same construction as `ForgedEvidenceCostTests`): leaves made by the
/// attacker, claiming the chain's intermediate as issuer.
enum ForgedItems {
    static func make(chain: TestAppleChain, count: Int, leaves: Int) throws -> [String] {
        let intermediate = try TestAppleChain.base64DER(chain.intermediate)
        let root = try TestAppleChain.base64DER(chain.root)
        var items: [String] = []
        var forged: [(P256.Signing.PrivateKey, String)] = []
        for _ in 0..<leaves {
            let attacker = try TestAppleChain(rootKey: .init(), root: chain.root)
            // The attacker's own "intermediate" signed this leaf; only its leaf is sent.
            forged.append((attacker.leafKey, try TestAppleChain.base64DER(attacker.leaf)))
        }
        for index in 0..<count {
            let (key, leaf) = forged[index % leaves]
            let header = try JSONSerialization.data(withJSONObject: ["alg": "ES256", "x5c": [leaf, intermediate, root]], options: [.sortedKeys])
            let payload = try JSONSerialization.data(
                withJSONObject: [
                    "transactionId": "\(900_000_000 + index)", "originalTransactionId": "900000000", "bundleId": "com.example.app",
                    "productId": "pro.monthly", "purchaseDate": 1_700_000_000_000, "signedDate": 1_700_000_000_000,
                    "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "environment": "Production",
                ] as [String: Any], options: [.sortedKeys])
            let input = TestAppleChain.base64URL(header) + "." + TestAppleChain.base64URL(payload)
            items.append(input + "." + TestAppleChain.base64URL(try key.signature(for: Data(input.utf8)).rawRepresentation))
        }
        return items
    }
}
