import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Synchronization
import Testing

@Suite("Key rotation under load on a real server", .serialized)
struct KeyRotationUnderLoadTests {
    struct Sample: Sendable {
        var ok: Bool
        var detail: String
        var token: String
        var keyID: String?
        var nonce: String?
        var timestamp: Int64?
        var signature: String?
    }

    enum WorkerResult: Sendable {
        case samples([Sample])
        case activated(atMillis: Int64)
    }

    @Test("Activating a new key while 32 connections sign for ~3 s: no failed request; every signature issued 1 s after the activation uses the new key")
    func rotationUnderLoad() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "load")
        let oldKey = try #require(server.keys["com.example.app"])
        let newKey = try InAppPurchaseKey.generateForDevelopment(keyID: "ROTATED001")
        _ = try await KeyRegistry.importKey(
            newKey, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: server.store, masterKey: server.masterKey,
            actor: "test", reason: "rotation under load")
        let store = server.store
        let results = try await server.live { client -> [WorkerResult] in
            let port = try #require(client.port)
            // Load runs until enough signatures were issued more than 1 s after the activation
            // committed (however long that takes on a busy machine), with a hard stop at 60 s.
            let loadEnd = LoadEnd(hardStop: ContinuousClock.now + .seconds(60))
            // The activation waits for enough signatures with the old key (a fixed second gave
            // too few when the machine was busy).
            let signed = SignedCount()
            return try await withThrowingTaskGroup(of: WorkerResult.self) { group in
                for _ in 0..<32 {
                    group.addTask {
                        let samples = try await TestClient.withClient(host: "127.0.0.1", port: port) { connection -> [Sample] in
                            var samples: [Sample] = []
                            while !loadEnd.reached {
                                let token = UUID().uuidString.lowercased()
                                do {
                                    let response = try await connection.post(
                                        "/v1/offers/signatures",
                                        headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"],
                                        body: ByteBuffer(string: #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)"}"#))
                                    let text = response.body.map { String(buffer: $0) } ?? ""
                                    guard response.status == .created,
                                        let json = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any],
                                        let legacy = json["legacy"] as? [String: Any]
                                    else {
                                        samples.append(Sample(ok: false, detail: "\(response.status): \(text)", token: token))
                                        continue
                                    }
                                    signed.count.add(1, ordering: .relaxed)
                                    samples.append(Sample(
                                        ok: true, detail: "", token: token, keyID: legacy["keyID"] as? String, nonce: legacy["nonce"] as? String,
                                        timestamp: (legacy["timestamp"] as? NSNumber)?.int64Value, signature: legacy["signature"] as? String))
                                } catch {
                                    samples.append(Sample(ok: false, detail: "\(error)", token: token))
                                    return samples
                                }
                            }
                            return samples
                        }
                        return .samples(samples)
                    }
                }
                group.addTask {
                    try await Task.sleep(for: .seconds(1))
                    while signed.count.load(ordering: .relaxed) < 120 && !loadEnd.reached { try await Task.sleep(for: .milliseconds(20)) }
                    _ = try await store.transitionKey(keyID: "ROTATED001", to: .active, actor: "test", reason: "rotation under load", force: false, authenticator: server.masterKey.registryRows)
                    let activatedAt = Date().unixMilliseconds
                    // Every request sent from 1.2 s after the activation on is signed more than
                    // 1 s after it; the 32 in flight then may not be. 120 more answers beyond
                    // those, and at least 2 s of load after the activation (a fixed 2 s gave
                    // too few late signatures when the machine was busy).
                    let minimumEnd = ContinuousClock.now + .seconds(2)
                    try await Task.sleep(for: .milliseconds(1200))
                    let lateFrom = signed.count.load(ordering: .relaxed) + 32
                    while signed.count.load(ordering: .relaxed) < lateFrom + 120 && !loadEnd.reached {
                        try await Task.sleep(for: .milliseconds(20))
                    }
                    loadEnd.set(max(minimumEnd, ContinuousClock.now))
                    return .activated(atMillis: activatedAt)
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
        }
        var samples: [Sample] = []
        var activation: Int64?
        for result in results {
            switch result {
            case .samples(let more): samples += more
            case .activated(let millis): activation = millis
            }
        }
        let activatedAt = try #require(activation)
        let failures = samples.filter { !$0.ok }
        #expect(failures.isEmpty, "\(failures.count) failed requests, e.g. \(failures.prefix(3).map(\.detail))")
        #expect(samples.count > 100, "too little load to mean anything: \(samples.count) requests")

        let publicKeys = [oldKey.keyID: oldKey.publicKey, newKey.keyID: newKey.publicKey]
        var late = 0
        var early = 0
        for sample in samples where sample.ok {
            let keyID = try #require(sample.keyID)
            let timestamp = try #require(sample.timestamp)
            let publicKey = try #require(publicKeys[keyID], "unknown key \(keyID)")
            let payload = try PromotionalOfferPayload(
                bundleID: "com.example.app", keyID: keyID, productID: "pro.monthly", offerID: "WINBACK50",
                appAccountToken: sample.token, nonce: try #require(sample.nonce), timestamp: timestamp)
            #expect(PromotionalOfferVerifier(publicKey: publicKey).verifyLegacy(payload: payload, signature: try #require(sample.signature)) == .valid)
            if timestamp > activatedAt + 1000 {
                late += 1
                #expect(keyID == "ROTATED001", "signed at \(timestamp), \(timestamp - activatedAt) ms after the activation, with \(keyID)")
            } else if keyID == oldKey.keyID {
                early += 1
            }
        }
        // How long the switch took here, for a reader of the log (the bound is the 1 s above).
        let lastOld = samples.filter { $0.ok && $0.keyID == oldKey.keyID }.compactMap(\.timestamp).max().map { $0 - activatedAt }
        print("key rotation under load: the last signature with the old key was \(lastOld.map { "\($0) ms" } ?? "none") after the activation; \(samples.count) requests")
        #expect(late > 50, "\(late) signatures more than 1 s after the activation")
        #expect(early > 50, "\(early) signatures with the old key before the activation")
        // Every signature is in the ledger and the chain is intact.
        #expect(try server.issuedCount() == samples.count)
        #expect(try await server.store.verifyAudit().isIntact)
    }
}

/// When the load of the rotation test stops: a hard stop, moved earlier once the activation
/// is known.
private final class SignedCount: Sendable {
    let count = Atomic<Int>(0)
}

private final class LoadEnd: Sendable {
    private let end: Mutex<ContinuousClock.Instant>

    init(hardStop: ContinuousClock.Instant) {
        end = Mutex(hardStop)
    }

    var reached: Bool { ContinuousClock.now >= end.withLock { $0 } }

    func set(_ instant: ContinuousClock.Instant) {
        end.withLock { $0 = min($0, instant) }
    }
}
