import Foundation
import HTTPTypes
import HummingbirdTesting
import Logging
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Synchronization
import TestChildProcess
import Testing

/// `/readyz` as an attacker uses it: anyone may call it, as often as they like.
@Suite("Attacks on /readyz: a flood costs the store nothing, and callers learn the status alone", .serialized)
struct ReadinessTests {
    @Test("A /readyz flood (32 callers, 3 s) while signing: not one 503 on signing, on SQLite and PostgreSQL", arguments: StoreBackend.testedCases)
    func readyzFloodDuringSigning(_ backend: StoreBackend) async throws {
        try await StoreFixture.with(backend, poolSize: 4) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            _ = try await KeyRegistry.importKey(
                try InAppPurchaseKey.generateForDevelopment(keyID: "READYKEY01"), bundleID: "com.example.app", issuerID: TestServer.issuerID,
                development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
            let secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
            var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
            configuration.host = "127.0.0.1"
            configuration.port = 0
            configuration.clientRateLimit = .unlimited
            configuration.appAccountTokenRateLimit = .unlimited
            configuration.operatorToken = TestServer.operatorToken
            // The flood must take nothing from the store; that is checked directly below (the
            // store's last check is the one made at start-up, before and after the flood). So a
            // long store timeout only keeps a stall of the loaded machine running the suite (a
            // slow fsync of another test's database) from failing a commit.
            configuration.storeTimeout = .seconds(30)
            configuration.readinessInterval = .seconds(3600)
            let application = try await buildApplication(configuration: configuration, store: store)
            try await application.test(.live) { client in
                let port = try #require(client.port)
                func storeCheckedAt() async throws -> String? {
                    let detailed = try await client.execute(
                        uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
                    return detailed.json["storeCheckedAt"] as? String
                }
                let checkedBefore = try await storeCheckedAt()
                #expect(checkedBefore != nil, "the store was checked at start-up")
                var signingStatuses: [Int] = []
                // A machine so loaded that the server answers no more than 100 /readyz in 3 s
                // measures the machine, not the flood: measured again, up to three times.
                // `clients` connections on threads of their own, each sending `request` until
                // `deadline`: the statuses answered.
                func repeating(
                    _ clients: Int, until deadline: ContinuousClock.Instant, _ request: @escaping @Sendable () throws -> Int
                ) -> [Task<[Int], any Error>] {
                    (0..<clients).map { _ in
                        Task {
                            try await onOwnThread { () -> [Int] in
                                var statuses: [Int] = []
                                while ContinuousClock.now < deadline { statuses.append(try request()) }
                                return statuses
                            }
                        }
                    }
                }
                for attempt in 1...3 {
                    let deadline = ContinuousClock.now + .seconds(3)
                    let flooders = repeating(32, until: deadline) {
                        try RawSocket.request(port: port, method: "GET", path: "/readyz").status
                    }
                    let signers = repeating(4, until: deadline) {
                        try RawSocket.request(
                            port: port, method: "POST", path: "/v1/offers/signatures",
                            headers: ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"],
                            body: #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(UUID().uuidString)"}"#
                        ).status
                    }
                    var readyStatuses: [Int] = []
                    for flooder in flooders { readyStatuses += try await flooder.value }
                    for signer in signers { signingStatuses += try await signer.value }
                    if readyStatuses.count <= 100 && attempt < 3 { continue }
                    #expect(!signingStatuses.isEmpty)
                    #expect(signingStatuses.allSatisfy { $0 == 201 }, "signing during the flood: \(Dictionary(grouping: signingStatuses, by: { $0 }).mapValues(\.count))")
                    // Every flooder was answered, each time ready (after three starved tries,
                    // fewer than a hundred answers still show that none of them checked the store).
                    #expect(readyStatuses.count >= 32 && readyStatuses.allSatisfy { $0 == 200 }, "\(Dictionary(grouping: readyStatuses, by: { $0 }).mapValues(\.count))")
                    break
                }
                #expect(try await storeCheckedAt() == checkedBefore, "a /readyz request checked the store")
            }
        }
    }

    @Test("Unauthenticated /readyz says ready or not, nothing more; ?detail needs the operator token")
    func readyzDetailNeedsOperatorToken() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            let anonymous = try await client.execute(uri: "/readyz", method: .get)
            #expect(anonymous.status == .ok)
            #expect(anonymous.text == #"{"status":"ready"}"#)
            expectProblem(try await client.execute(uri: "/readyz?detail", method: .get), .unauthorized, "unauthorized")
            expectProblem(
                try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer not-the-operator-token-at-all-0000"]),
                .unauthorized, "unauthorized")
            let detailed = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            #expect(detailed.status == .ok)
            #expect(detailed.json["registryVersion"] is Int && detailed.json["apps"] as? Int == 1 && detailed.json["storeCheckedAt"] is String, "\(detailed.text)")
            // Not ready (the only key retired): the caller learns that, not which app.
            _ = try await server.store.transitionKey(keyID: "TESTKEY000", to: .retired, actor: "test", reason: nil, force: true, authenticator: server.masterKey.registryRows)
            try await server.waitForRegistry(client, orNotReady: true)
            let notReady = try await client.execute(uri: "/readyz", method: .get)
            expectProblem(notReady, .serviceUnavailable, "not_ready")
            #expect(!notReady.text.contains("com.example.app"), "\(notReady.text)")
            let operatorView = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            expectProblem(operatorView, .serviceUnavailable, "not_ready")
            #expect(operatorView.text.contains("com.example.app has no usable active key"), "\(operatorView.text)")
        }
    }

    @Test("Without an operator token configured, the detailed form is refused; an operator token under 32 characters is refused")
    func noOperatorToken() async throws {
        let server = try await TestServer { $0.operatorToken = nil }
        defer { server.cleanUp() }
        try await server.live { client in
            #expect(try await client.execute(uri: "/readyz", method: .get).status == .ok)
            expectProblem(
                try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]),
                .unauthorized, "unauthorized")
        }
        #expect(throws: ServerConfigurationError.self) { try OperatorToken("short") }
    }
}
