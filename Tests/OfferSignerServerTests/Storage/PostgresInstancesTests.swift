import AppleTestChain
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerPostgres
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Synchronization
import TestPostgres
import Testing
import X509

/// Two real servers on loopback, each with its own `PostgresStore` (its own connection pool) on
/// one PostgreSQL database: they behave as one service.
@Suite("Several instances on one PostgreSQL database", .serialized, .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct PostgresInstancesTests {
    /// One database, the master key, a key per bundle, and N stores on it (one per instance).
    struct Deployment {
        let database: TestPostgres.Database
        let stores: [PostgresStore]
        let masterKey: MasterKey
        var configuration: ServerConfiguration
        var keys: [String: InAppPurchaseKey] = [:]

        static func make(
            instances: Int, key: InAppPurchaseKey? = nil, operationTimeout: Duration? = nil, configure: (inout ServerConfiguration) -> Void = { _ in }
        ) async throws -> Deployment {
            let database = try await TestPostgres.database()
            var storeConfiguration = database.configuration
            if let operationTimeout { storeConfiguration.operationTimeout = operationTimeout }
            var stores: [PostgresStore] = []
            for _ in 0..<instances { stores.append(try await PostgresStore.open(configuration: storeConfiguration)) }
            let masterKey = MasterKey.generate().key
            // Generous: the full suite on a shared 2-core machine stalls store calls for seconds;
            // the outage tests set their own.
            var configuration = StoreFixture.serverConfiguration(masterKey: masterKey, storeTimeout: .seconds(60))
            configuration.logger.logLevel = .critical
            configure(&configuration)
            var deployment = Deployment(database: database, stores: stores, masterKey: masterKey, configuration: configuration)
            let key = try key ?? InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY000")
            _ = try await KeyRegistry.importKey(
                key, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: stores[0], masterKey: masterKey, actor: "test", reason: nil)
            deployment.keys["com.example.app"] = key
            return deployment
        }

        func close() async {
            for store in stores { await store.close() }
            await database.drop()
        }

        func createClient(name: String) async throws -> String {
            try await APIClientCredentials.create(in: stores[0], name: name, bundleIDs: [], actor: "test", masterKey: masterKey).secret
        }

        /// Runs both servers live and hands `body` their ports.
        func live<Value: Sendable>(_ body: @escaping @Sendable ([Int]) async throws -> Value) async throws -> Value {
            let first = try await buildApplication(configuration: configuration, store: stores[0])
            let second = try await buildApplication(configuration: configuration, store: stores[1])
            return try await first.test(.live) { a in
                try await second.test(.live) { b in
                    try await body([try #require(a.port), try #require(b.port)])
                }
            }
        }
    }

    static func sign(_ port: Int, secret: String, body: String) async throws -> (HTTPResponse.Status, String) {
        try await TestClient.withClient(host: "127.0.0.1", port: port) { connection in
            let response = try await connection.post(
                "/v1/offers/signatures", headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"], body: ByteBuffer(string: body))
            return (response.status, response.body.map { String(buffer: $0) } ?? "")
        }
    }

    @Test("1,500 requests at concurrency 32 over two instances: 1,500 distinct nonces, each in exactly one audit record, and an intact chain")
    func loadOverTwoInstances() async throws {
        let deployment = try await Deployment.make(instances: 2)
        let secret = try await deployment.createClient(name: "load")
        let next = SharedCounter()
        let nonces = try await deployment.live { ports -> [String] in
            try await withThrowingTaskGroup(of: [String].self) { group in
                for worker in 0..<32 {
                    group.addTask {
                        try await TestClient.withClient(host: "127.0.0.1", port: ports[worker % 2]) { connection in
                            var nonces: [String] = []
                            while next.take(below: 1500) {
                                let response = try await connection.post(
                                    "/v1/offers/signatures", headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"],
                                    body: ByteBuffer(string: #"{"productID":"p","offerID":"o","appAccountToken":"\#(UUID().uuidString.lowercased())"}"#))
                                let text = response.body.map { String(buffer: $0) } ?? ""
                                #expect(response.status == .created, "\(text)")
                                let json = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
                                if let nonce = (json?["legacy"] as? [String: Any])?["nonce"] as? String { nonces.append(nonce) }
                            }
                            return nonces
                        }
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
        }
        #expect(nonces.count == 1500)
        #expect(Set(nonces).count == 1500)
        let records = try await deployment.stores[0].auditRecords(after: 0, limit: 10_000)
        var recordsPerNonce: [String: Int] = [:]
        for record in records where record.kind == "signature.issued" {
            let body = try JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any]
            if let nonce = body?["nonce"] as? String { recordsPerNonce[nonce, default: 0] += 1 }
        }
        #expect(nonces.allSatisfy { recordsPerNonce[$0] == 1 }, "every nonce handed out is in exactly one audit record")
        #expect(try await deployment.stores[1].verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
        await deployment.close()
    }
}

extension PostgresInstancesTests {
    /// On the app's evidence, signatures for one customer and offer within 24 h are one attempt
    /// (a cancelled payment sheet may be retried), so parallel requests on fresh evidence are all
    /// signed; what must hold across instances is that a redemption the evidence shows refuses
    /// every one of them, and that every signature handed out is audited once and in the ledger.
    @Test("Twelve parallel requests over two instances: with a redemption in the evidence all twelve 403 and nothing issued; on fresh evidence all twelve 201, each audited once, one attempt in the ledger")
    func eligibilityAcrossInstances() async throws {
        let chain = try TestAppleChain()
        // Store operations may take seconds while the full suite loads the machine: this test is
        // about the rule across instances, not about outages.
        let deployment = try await Deployment.make(instances: 2, operationTimeout: .seconds(30)) { configuration in
            configuration.eligibility = try! EligibilityConfiguration(
                catalogJSON: Data(EligibilityIntegrationTests.catalog.utf8), trustedRootPEMs: [try! chain.root.serializeAsPEM().pemString])
        }
        let secret = try await deployment.createClient(name: "backend")
        func body(_ transactions: [String]) -> String {
            #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(EligibilityIntegrationTests.token)","evidence":\#(EligibilityIntegrationTests.evidenceJSON(transactions))}"#
        }
        let redeemed = body(try EligibilityIntegrationTests.history(chain, redeemedLast: true))
        let fresh = body(try EligibilityIntegrationTests.history(chain))
        let (refused, signed) = try await deployment.live { ports -> ([(HTTPResponse.Status, String)], [(HTTPResponse.Status, String)]) in
            func twelve(_ body: String) async throws -> [(HTTPResponse.Status, String)] {
                try await withThrowingTaskGroup(of: (HTTPResponse.Status, String).self) { group in
                    for index in 0..<12 {
                        group.addTask { try await Self.sign(ports[index % 2], secret: secret, body: body) }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
            }
            return (try await twelve(redeemed), try await twelve(fresh))
        }

        // The evidence shows wb1 redeemed two months ago (waitBetweenOffersMonths 12): every request refused.
        #expect(refused.count == 12)
        for (status, text) in refused {
            #expect(status == .forbidden, "\(text)")
            #expect(text.contains("redeemed_too_recently"), "\(text)")
        }
        let store = deployment.stores[0]

        // Fresh evidence: all twelve signed, each nonce audited exactly once, all in the ledger as one attempt.
        #expect(signed.map(\.0) == Array(repeating: .created, count: 12), "\(signed.map(\.1))")
        let nonces = signed.compactMap { _, text in
            ((try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["legacy"] as? [String: Any])?["nonce"] as? String
        }
        #expect(nonces.count == 12 && Set(nonces).count == 12)
        var recordsPerNonce: [String: Int] = [:]
        for record in try await store.auditRecords(after: 0, limit: 10_000) where record.kind == "signature.issued" {
            let body = try JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any]
            if let nonce = body?["nonce"] as? String { recordsPerNonce[nonce, default: 0] += 1 }
        }
        #expect(recordsPerNonce.count == 12, "only the twelve fresh-evidence signatures were audited: \(recordsPerNonce.count)")
        #expect(nonces.allSatisfy { recordsPerNonce[$0] == 1 }, "every nonce handed out is in exactly one audit record")
        let issued = try await store.issuedSignatures(appAccountToken: EligibilityIntegrationTests.token, bundleID: "com.example.app")
        #expect(Set(issued.map(\.signature.nonce)) == Set(nonces))
        #expect(issued.allSatisfy { $0.signature.offerID == "wb1" })
        // One attempt: every issuance within one signature lifetime (24 h) of the first.
        let times = issued.map(\.signature.issuedAt)
        if let first = times.min(), let last = times.max() {
            #expect(last.timeIntervalSince(first) < EligibilityEvaluator.signatureLifetime)
        }
        await deployment.close()
    }

    @Test("A key activated through instance A signs on instance B, and a revoked client is refused by both, within 10 s; polling hourly, so the notification did it")
    func registryChangesReachEveryInstance() async throws {
        let deployment = try await Deployment.make(instances: 2) { $0.registryPollInterval = .seconds(3600) }
        let secret = try await deployment.createClient(name: "backend")
        let revoked = try await deployment.createClient(name: "leaver")
        let newKey = try InAppPurchaseKey.generateForDevelopment(keyID: "ROTATED001")
        _ = try await KeyRegistry.importKey(
            newKey, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: deployment.stores[0],
            masterKey: deployment.masterKey, actor: "test", reason: "rotation")
        let body = #"{"productID":"p","offerID":"o"}"#
        let stores = deployment.stores
        try await deployment.live { ports in
            // Both instances know both clients (they loaded after the clients were created).
            #expect(try await Self.sign(ports[1], secret: revoked, body: body).0 == .created)

            // Activate through instance A's store; B must sign with the new key within 10 s (a
            // notification takes milliseconds; the bound is for a loaded machine; the hourly poll's
            // first round comes an hour after the start).
            _ = try await stores[0].transitionKey(keyID: "ROTATED001", to: .active, actor: "test", reason: "rotation", force: false, authenticator: deployment.masterKey.registryRows)
            let activated = ContinuousClock.now
            var keyID: String?
            while keyID != "ROTATED001" && ContinuousClock.now - activated < .seconds(15) {
                let (status, text) = try await Self.sign(ports[1], secret: secret, body: body)
                #expect(status == .created, "\(text)")
                keyID = ((try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["legacy"] as? [String: Any])?["keyID"] as? String
                if keyID != "ROTATED001" { try await Task.sleep(for: .milliseconds(20)) }
            }
            let activationTook = ContinuousClock.now - activated
            #expect(keyID == "ROTATED001" && activationTook < .seconds(10), "instance B signed with \(keyID ?? "?") \(activationTook) after the activation")

            // Revoke through A's store; both must refuse it within 10 s.
            _ = try await stores[0].revokeClient(name: "leaver", actor: "test", authenticator: deployment.masterKey.registryRows)
            let revokedAt = ContinuousClock.now
            for port in ports {
                var status = HTTPResponse.Status.created
                while status != .unauthorized && ContinuousClock.now - revokedAt < .seconds(15) {
                    status = try await Self.sign(port, secret: revoked, body: body).0
                    if status != .unauthorized { try await Task.sleep(for: .milliseconds(20)) }
                }
                let took = ContinuousClock.now - revokedAt
                #expect(status == .unauthorized && took < .seconds(10), "port \(port) still accepted the revoked client \(took) after the revocation")
            }
        }
        await deployment.close()
    }
}

extension PostgresInstancesTests {
    struct Outcome: Sendable {
        var status: UInt16
        var nonce: String?
        var started: ContinuousClock.Instant
        var ended: ContinuousClock.Instant
    }

    /// Three seconds, and seventy: after a minute of failed connection attempts PostgresNIO's pool
    /// opens its circuit breaker and retries at most once a minute (without the store's pool
    /// renewal no 201 came in the 6 s after the restart), and the store must not wait for it.
    @Test(
        "PostgreSQL stopped under load: only 503s and no signature while it is down, no request hangs; started again: 201s within 5 s, and every 201 has its audit record",
        .enabled(if: ControlledPostgres.binaries != nil), arguments: [3, 70])
    func databaseOutageUnderLoad(outageSeconds: Int) async throws {
        let cluster = try await ControlledPostgres(binaries: try #require(ControlledPostgres.binaries))
        defer { cluster.remove() }
        let storeConfiguration = try PostgresStoreConfiguration(url: cluster.url, operationTimeout: .seconds(2), connectTimeout: .seconds(1))
        let stores = [try await PostgresStore.open(configuration: storeConfiguration), try await PostgresStore.open(configuration: storeConfiguration)]
        let masterKey = MasterKey.generate().key
        var logger = Logger(label: "offer-signer-test")
        logger.logLevel = .critical
        var configuration = ServerConfiguration(masterKey: masterKey, logger: logger)
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.clientRateLimit = .unlimited
        configuration.appAccountTokenRateLimit = .unlimited
        configuration.storeTimeout = .seconds(1)
        configuration.operatorToken = TestServer.operatorToken
        _ = try await KeyRegistry.importKey(
            try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY000"), bundleID: "com.example.app", issuerID: TestServer.issuerID,
            development: true, into: stores[0], masterKey: masterKey, actor: "test", reason: nil)
        let secret = try await APIClientCredentials.create(in: stores[0], name: "load", bundleIDs: [], actor: "test", masterKey: masterKey).secret
        let first = try await buildApplication(configuration: configuration, store: stores[0])
        let second = try await buildApplication(configuration: configuration, store: stores[1])

        let stop = SharedFlag()
        let (outcomes, stopped, restarted) = try await first.test(.live) { a in
            try await second.test(.live) { b in
                let ports = [try #require(a.port), try #require(b.port)]
                return try await withThrowingTaskGroup(of: [Outcome].self) { group in
                    for worker in 0..<8 {
                        group.addTask {
                            var outcomes: [Outcome] = []
                            while !stop.isSet {
                                let started = ContinuousClock.now
                                let (status, text) = try await Self.sign(ports[worker % 2], secret: secret, body: #"{"productID":"p","offerID":"o"}"#)
                                let json = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
                                outcomes.append(Outcome(
                                    status: UInt16(status.code), nonce: (json?["legacy"] as? [String: Any])?["nonce"] as? String, started: started,
                                    ended: ContinuousClock.now))
                                if status != .created { try await Task.sleep(for: .milliseconds(20)) }
                            }
                            return outcomes
                        }
                    }
                    try await Task.sleep(for: .seconds(1))
                    try await cluster.stopImmediately()
                    let stopped = ContinuousClock.now
                    try await Task.sleep(for: .seconds(outageSeconds))
                    // While it is down, readiness says so.
                    for port in ports {
                        let ready = try await TestClient.withClient(host: "127.0.0.1", port: port) { try await $0.get("/readyz").status }
                        #expect(ready == .serviceUnavailable)
                    }
                    let restartBegan = ContinuousClock.now
                    try await cluster.start()
                    try await Task.sleep(for: .seconds(6))
                    stop.set()
                    let outcomes = try await group.reduce(into: [Outcome]()) { $0 += $1 }
                    return (outcomes, stopped, restartBegan)
                }
            }
        }

        #expect(outcomes.allSatisfy { $0.status == 201 || $0.status == 503 }, "\(Set(outcomes.map(\.status)))")
        let longest = outcomes.map { $0.started.duration(to: $0.ended) }.max() ?? .zero
        // A hang lasts as long as TCP retries (minutes); a stall of the loaded machine running the
        // suite, seconds.
        #expect(longest < .seconds(10), "a request took \(longest)")
        let duringOutage = outcomes.filter { $0.started > stopped && $0.ended < restarted }
        #expect(!duringOutage.isEmpty)
        #expect(duringOutage.allSatisfy { $0.status == 503 && $0.nonce == nil }, "a signature left while the database was down")
        let firstAfter = outcomes.filter { $0.status == 201 && $0.started > restarted }.map(\.ended).min()
        let recovery = firstAfter.map { restarted.duration(to: $0) }
        #expect(recovery != nil && recovery! < .seconds(5), "first 201 \(recovery.map { "\($0)" } ?? "never") after the restart began")
        if outageSeconds > 60 {
            // Past PostgresNIO's minute of retries its breaker is open: the stores replaced their pools.
            #expect(stores.contains { $0.poolRenewals >= 1 }, "no pool was replaced after a \(outageSeconds) s outage")
        }

        let issued = Set(outcomes.compactMap(\.nonce))
        let records = try await stores[1].auditRecords(after: 0, limit: 100_000)
        var audited: [String: Int] = [:]
        for record in records where record.kind == "signature.issued" {
            if let nonce = (try? JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any])?["nonce"] as? String { audited[nonce, default: 0] += 1 }
        }
        #expect(issued.allSatisfy { audited[$0] == 1 }, "every 201 has exactly one audit record")
        #expect(try await stores[1].verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
        for store in stores { await store.close() }
    }
}

/// A counter tasks share: `take(below:)` hands out numbers until the limit.
final class SharedCounter: Sendable {
    private let count = Mutex(0)
    func take(below limit: Int) -> Bool {
        count.withLock { count in
            guard count < limit else { return false }
            count += 1
            return true
        }
    }
}

/// A flag tasks share.
final class SharedFlag: Sendable {
    private let value = Atomic<Bool>(false)
    var isSet: Bool { value.load(ordering: .acquiring) }
    func set() { value.store(true, ordering: .releasing) }
}

extension PostgresInstancesTests {
    @Test("Two instances on one database keep one checkpoint interval between them, not one each")
    func oneCheckpointIntervalForTheDeployment() async throws {
        let deployment = try await Deployment.make(instances: 2) { configuration in
            configuration.checkpointEveryRecords = 1_000_000
            configuration.checkpointEvery = .milliseconds(400)
        }
        let secret = try await deployment.createClient(name: "backend")
        let store = deployment.stores[0]
        let checkpoints = try await deployment.live { ports in
            let end = ContinuousClock.now + .seconds(3)
            var turn = 0
            while ContinuousClock.now < end {
                #expect(try await Self.sign(ports[turn % 2], secret: secret, body: #"{"productID":"p","offerID":"o"}"#).0 == .created)
                turn += 1
                try await Task.sleep(for: .milliseconds(20))
            }
            return try await store.checkpoints()
        }
        // At least one, and (a loaded machine may make fewer) never closer than the interval.
        #expect(checkpoints.count >= 1 && checkpoints.count <= 9, "\(checkpoints.count) checkpoints in 3 s")
        for (earlier, later) in zip(checkpoints, checkpoints.dropFirst()) {
            let gap = later.createdAt.timeIntervalSince(earlier.createdAt)
            #expect(gap >= 0.399, "checkpoints \(earlier.sequence) and \(later.sequence) are \(gap) s apart")
        }
        #expect(try await store.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
        await deployment.close()
    }

    @Test("A read-only database (a failover in progress): 503 and no signature, /readyz 503; writable again: 201 and /readyz 200 within 5 s", .enabled(if: ControlledPostgres.binaries != nil))
    func readOnlyDatabase() async throws {
        let cluster = try await ControlledPostgres(binaries: try #require(ControlledPostgres.binaries))
        defer { cluster.remove() }
        let storeConfiguration = try PostgresStoreConfiguration(url: cluster.url, operationTimeout: .seconds(2), connectTimeout: .seconds(1))
        let store = try await PostgresStore.open(configuration: storeConfiguration)
        let masterKey = MasterKey.generate().key
        var logger = Logger(label: "offer-signer-test")
        logger.logLevel = .critical
        var configuration = ServerConfiguration(masterKey: masterKey, logger: logger)
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.clientRateLimit = .unlimited
        configuration.appAccountTokenRateLimit = .unlimited
        configuration.storeTimeout = .seconds(1)
        configuration.operatorToken = TestServer.operatorToken
        _ = try await KeyRegistry.importKey(
            try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY000"), bundleID: "com.example.app", issuerID: TestServer.issuerID,
            development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
        let secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
        let application = try await buildApplication(configuration: configuration, store: store)
        let body = #"{"productID":"p","offerID":"o"}"#
        let nonce = { @Sendable (text: String) -> String? in
            ((try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])?["legacy"] as? [String: Any])?["nonce"] as? String
        }
        let issued = try await application.test(.live) { client -> [String] in
            let port = try #require(client.port)
            var issued: [String] = []
            let (firstStatus, firstText) = try await Self.sign(port, secret: secret, body: body)
            #expect(firstStatus == .created)
            issued += [nonce(firstText)].compactMap { $0 }
            // Every session, the pool's open ones included, turns read-only (as on a standby).
            try await cluster.sql("ALTER SYSTEM SET default_transaction_read_only = on")
            try await cluster.sql("SELECT pg_reload_conf()")
            try await Task.sleep(for: .milliseconds(300))
            for _ in 0..<5 {
                let (status, text) = try await Self.sign(port, secret: secret, body: body)
                #expect(status == .serviceUnavailable && nonce(text) == nil, "\(text)")
            }
            // The store is checked in the background (every second): within a few.
            var notReady = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            for _ in 0..<50 where notReady.status == .ok {
                try await Task.sleep(for: .milliseconds(100))
                notReady = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            }
            expectProblem(notReady, .serviceUnavailable, "not_ready")
            #expect(notReady.text.contains("read-only"), "\(notReady.text)")
            // Without the operator token: the status alone.
            let anonymous = try await client.execute(uri: "/readyz", method: .get)
            expectProblem(anonymous, .serviceUnavailable, "not_ready")
            #expect(!anonymous.text.contains("read-only") && !anonymous.text.contains("127.0.0.1"), "\(anonymous.text)")
            try await cluster.sql("ALTER SYSTEM RESET default_transaction_read_only")
            try await cluster.sql("SELECT pg_reload_conf()")
            let writable = ContinuousClock.now
            var status = HTTPResponse.Status.serviceUnavailable
            while status != .created && ContinuousClock.now - writable < .seconds(10) {
                let (answer, text) = try await Self.sign(port, secret: secret, body: body)
                status = answer
                if status == .created { issued += [nonce(text)].compactMap { $0 } } else { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(status == .created && ContinuousClock.now - writable < .seconds(5))
            var ready = try await client.execute(uri: "/readyz", method: .get).status
            for _ in 0..<50 where ready != .ok {
                try await Task.sleep(for: .milliseconds(100))
                ready = try await client.execute(uri: "/readyz", method: .get).status
            }
            #expect(ready == .ok)
            return issued
        }
        #expect(issued.count == 2)
        let records = try await store.auditRecords(after: 0, limit: 1000).filter { $0.kind == "signature.issued" }
        for issuedNonce in issued {
            #expect(records.filter { $0.body.contains(issuedNonce) }.count == 1, "every 201 has exactly one audit record")
        }
        #expect(try await store.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
        await store.close()
    }
}
