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
    @Test("Requests held open on the Apple endpoints beyond the limit: the next one gets 503 overloaded with Retry-After; signing is untouched; freed slots serve again")
    func appleEndpointConcurrencyLimit() async throws {
        let server = try await TestServer { $0.appleEndpointConcurrency = 2 }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let port = try #require(client.port)
            // Two attackers send a notification's head and never its body: each holds a place.
            let held = try await onOwnThread { () -> [Int32] in
                try (0..<2).map { _ in
                    let socket = try RawSocket.connect(port: port)
                    _ = RawSocket.send(socket, "POST /v1/apple/notifications HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{")
                    return socket
                }
            }
            defer { for socket in held { close(socket) } }
            var refused: RawSocket.Response?
            for _ in 0..<100 {
                let answer = try await onOwnThread {
                    try RawSocket.request(port: port, method: "POST", path: "/v1/apple/notifications", headers: ["Content-Type": "application/json"], body: "{}")
                }
                if answer.status == 503 { refused = answer; break }
                try await Task.sleep(for: .milliseconds(20))
            }
            let overloaded = try #require(refused, "the third concurrent request was not refused")
            #expect(overloaded.json["code"] as? String == "overloaded")
            #expect(overloaded.headers["retry-after"] == "1")
            // Signing has no such limit and is not slowed by it.
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"o"}"#, bearer: secret).status == .created)
            for socket in held { shutdown(socket, Int32(SHUT_RDWR)) }
            // Freed: the endpoint reads requests again (this one is not Apple's: 400, not 503).
            var status = 0
            for _ in 0..<200 {
                status = Int(try await client.postJSON("/v1/apple/notifications", #"{"signedPayload":"x.y.z"}"#).status.code)
                if status != 503 { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(status == 400)
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
