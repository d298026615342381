import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import Logging
import SwiftASN1
import X509
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import TestPostgres
import Testing

/// The real server on loopback on a fresh store of either backend, with one key, an offers
/// catalog and the Apple-like test chain as Apple's root; requests and notifications signed as
/// Apple signs them.
struct RetentionHarness: Sendable {
    static let bundleID = "com.example.app"
    static let appAppleID: Int64 = 1_234_567_890

    let fixture: StoreFixture
    let chain: TestAppleChain
    let key: InAppPurchaseKey
    /// The server's master key (for registry changes made through `store`).
    let masterKey: MasterKey
    let client: any TestClientProtocol
    let now: Date

    var store: any OfferSignerStore { fixture.store }

    /// Runs `body` against a live server on `backend` (PostgreSQL: a pool of `poolSize`
    /// connections); `catalog` gets the fake App Store Server API's port.
    static func run(
        _ backend: StoreBackend, poolSize: Int = 4, catalog: @escaping @Sendable (Int) -> String,
        configure: @escaping @Sendable (inout ServerConfiguration) -> Void = { _ in },
        _ body: @escaping @Sendable (RetentionHarness) async throws -> Void
    ) async throws {
        let chain = try TestAppleChain()
        try await StoreFixture.with(backend, poolSize: poolSize) { fixture in
            let masterKey = MasterKey.generate().key
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: "RETKEY0001")
            _ = try await KeyRegistry.importKey(
                key, bundleID: bundleID, issuerID: TestServer.issuerID, development: true, into: fixture.store, masterKey: masterKey, actor: "test", reason: nil)
            var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
            configuration.operatorToken = TestServer.operatorToken
            configuration.host = "127.0.0.1"
            configuration.port = 0
            configuration.registryPollInterval = .milliseconds(50)
            configuration.clientRateLimit = .unlimited
            configuration.appAccountTokenRateLimit = .unlimited
            configuration.storeTimeout = .seconds(60)
            // Generous unless a test is about the deadline: two loaded cores can take longer.
            configuration.retention.budget = .seconds(30)
            let fake = FakeAppStoreServerAPI(bundleID: bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
            let root = try chain.root.serializeAsPEM().pemString
            let base = configuration
            try await fake.run { port in
                var eligibility = try EligibilityConfiguration(catalogJSON: Data(catalog(port).utf8), trustedRootPEMs: [root])
                eligibility.appStoreServerAPI.timeBudget = .seconds(30)
                var serving = base
                serving.eligibility = eligibility
                configure(&serving)
                let application = try await buildApplication(configuration: serving, store: fixture.store)
                try await application.test(.live) { client in
                    try await body(RetentionHarness(fixture: fixture, chain: chain, key: key, masterKey: masterKey, client: client, now: Date()))
                }
            }
        }
    }

    func subscriber(months: Int, id: String, token: String, environment: String = "Production") -> SubscriptionFixture {
        SubscriptionFixture(
            bundleID: Self.bundleID, productID: "pro.monthly", subscriptionGroupID: "G1", originalTransactionID: id, environment: environment,
            appAccountToken: token, periodStarts: SubscriptionFixture.monthlyStarts(count: months, activeAt: now))
    }

    /// A Retention Messaging request body as Apple sends it (`appAppleID` nil: the member is left out).
    func request(
        _ originalTransactionID: String, productID: String = "pro.monthly", requestIdentifier: String = UUID().uuidString, userLocale: String? = "en-US",
        appAppleID: Int64? = Self.appAppleID, environment: String = "Production", signer: TestAppleChain? = nil
    ) throws -> String {
        var payload: [String: Any] = [
            "originalTransactionId": originalTransactionID, "productId": productID,
            "requestIdentifier": requestIdentifier, "environment": environment, "signedDate": TestAppleChain.milliseconds(now),
        ]
        if let userLocale { payload["userLocale"] = userLocale }
        if let appAppleID { payload["appAppleId"] = appAppleID }
        return #"{"signedPayload":"\#(try (signer ?? chain).signJWS(payload))"}"#
    }

    /// One notification body as Apple sends it, about transaction `index` of `customer`.
    /// `renewalInfo`: fields added to (or replacing those of) the renewal info.
    func notification(
        _ customer: SubscriptionFixture, index: Int, appAppleID: Int64? = Self.appAppleID, bundleID: String = Self.bundleID, signer: TestAppleChain? = nil,
        renewalInfo extra: [String: any Sendable] = [:]
    ) throws -> String {
        var renewalInfo: [String: Any] = [
            "originalTransactionId": customer.originalTransactionID, "productId": customer.productID, "autoRenewProductId": customer.productID,
            "autoRenewStatus": 1, "environment": customer.environment, "signedDate": TestAppleChain.milliseconds(customer.periodStarts[index]),
        ]
        renewalInfo.merge(extra) { $1 }
        var data: [String: Any] = [
            "bundleId": bundleID, "environment": customer.environment,
            "signedTransactionInfo": try chain.signJWS(customer.transactionPayload(index)),
            "signedRenewalInfo": try chain.signJWS(renewalInfo),
        ]
        if let appAppleID { data["appAppleId"] = appAppleID }
        var payload: [String: Any] = [
            "notificationType": index == 0 ? "SUBSCRIBED" : "DID_RENEW", "notificationUUID": UUID().uuidString, "data": data, "version": "2.0",
            "signedDate": TestAppleChain.milliseconds(customer.periodStarts[index]),
        ]
        if index == 0 { payload["subtype"] = "INITIAL_BUY" }
        return #"{"signedPayload":"\#(try (signer ?? chain).signJWS(payload))"}"#
    }

    /// The subscription's notifications, from its first purchase on (a complete stored history).
    func notify(_ customer: SubscriptionFixture, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for index in customer.periodStarts.indices {
            let answer = try await client.postJSON("/v1/apple/notifications", try notification(customer, index: index))
            #expect(answer.status == .ok, "\(answer.text)", sourceLocation: sourceLocation)
        }
    }

    /// The server's `/metrics` text.
    func metrics() async throws -> String {
        try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
    }

    func post(_ body: String) async throws -> TestResponse {
        try await client.postJSON("/v1/apple/retention", body)
    }

    /// A retention request on a connection of its own (requests may then overlap), timed.
    func postConcurrently(_ body: String) async throws -> TimedAnswer {
        let port = try #require(client.port)
        let start = ContinuousClock.now
        let (status, text) = try await TestClient.withClient(host: "127.0.0.1", port: port) { connection in
            let response = try await connection.post("/v1/apple/retention", headers: [.contentType: "application/json"], body: ByteBuffer(string: body))
            return (response.status, response.body.map { String(buffer: $0) } ?? "")
        }
        return TimedAnswer(status: status, text: text, elapsed: ContinuousClock.now - start)
    }

    /// Audit records of `kind`, their bodies decoded.
    func audited(_ kind: String) async throws -> [[String: Any]] {
        try await store.auditRecords(after: 0, limit: 10_000).filter { $0.kind == kind }.map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.body.utf8)) as? [String: Any])
        }
    }

    static func members(_ response: TestResponse) -> [String] {
        ((try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any]).map { Array($0.keys) } ?? []
    }

    /// Makes audit commits wait: another connection holds the write lock (SQLite: an IMMEDIATE
    /// transaction; PostgreSQL: `LOCK TABLE audit_log IN EXCLUSIVE MODE`, which lets reads through).
    /// Reads, locks and ledger reads go on; commits wait until `release()`.
    func holdAuditWrites() async throws -> AuditWriteHold {
        switch fixture.backend {
        case .sqlite:
            var configuration = GRDB.Configuration()
            configuration.allowsUnsafeTransactions = true  // the transaction outlives the access that opens it
            configuration.busyMode = .timeout(10)
            let queue = try DatabaseQueue(path: try #require(fixture.sqlitePath), configuration: configuration)
            try await queue.writeWithoutTransaction { db in try db.execute(sql: "BEGIN IMMEDIATE TRANSACTION") }
            return AuditWriteHold(release: {
                try await queue.writeWithoutTransaction { db in try db.execute(sql: "COMMIT TRANSACTION") }
                try queue.close()
            })
        case .postgres:
            let held = try await TestPostgres.holdLock("LOCK TABLE audit_log IN EXCLUSIVE MODE", database: try #require(fixture.database).name)
            return AuditWriteHold(release: { try await held.release() })
        }
    }
}

/// Audit writes held back until `release()`.
struct AuditWriteHold: Sendable {
    let release: @Sendable () async throws -> Void
}

/// An answer and how long it took.
struct TimedAnswer: Sendable {
    var status: HTTPResponse.Status
    var text: String
    var elapsed: Duration

    var json: [String: Any] { (try? JSONSerialization.jsonObject(with: Data(text.utf8))) as? [String: Any] ?? [:] }
}
