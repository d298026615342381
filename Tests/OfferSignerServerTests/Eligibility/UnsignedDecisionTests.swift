import AppleTestChain
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import TestChildProcess
import TestPostgres
import SwiftASN1
import Testing
import X509

/// A customer who qualifies for an offer whose request then cannot be signed (here: the app's only
/// key retired, so no active key) gets no signature; the decision, made while the client was
/// allowed, is still audited, and like a refusal (it adds nothing to the ledger the rules count)
/// it is committed after the customer's lock is given back, before its answer. An answer whose
/// decision cannot be audited is 503 `audit_unavailable`, never the decision's own answer.
@Suite("An eligible decision without a signature is audited on its own, after the customer lock", .serialized)
struct UnsignedDecisionTests {
    static let bundleID = "com.example.app"
    static let token = EligibilityIntegrationTests.token

    /// The signing request for `wb1` with the app's evidence of six paid months that ended two
    /// months ago (eligible under `EligibilityIntegrationTests.catalog`).
    static func signingBody(_ chain: TestAppleChain) throws -> String {
        let evidence = EligibilityIntegrationTests.evidenceJSON(try EligibilityIntegrationTests.history(chain))
        return #"{"productID":"pro.monthly","offerID":"wb1","appAccountToken":"\#(token)","evidence":\#(evidence)}"#
    }

    /// Runs a live server on `fixture`'s store that decides `EligibilityIntegrationTests.catalog`
    /// on the app's evidence (signed by `chain`'s root, trusted), whose one key for the app is
    /// retired before it starts (the app stays configured, with no active key), and one API
    /// client. `body` gets the test client, the server's port and the client's secret.
    static func withServerWithoutActiveKey(
        _ fixture: StoreFixture, chain: TestAppleChain, storeTimeout: Duration,
        _ body: @escaping @Sendable (_ client: any TestClientProtocol, _ port: Int, _ secret: String) async throws -> Void
    ) async throws {
        let masterKey = MasterKey.generate().key
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "UNSIGNED01")
        _ = try await KeyRegistry.importKey(
            key, bundleID: bundleID, issuerID: TestServer.issuerID, development: true, into: fixture.store, masterKey: masterKey, actor: "test", reason: nil)
        _ = try await fixture.store.transitionKey(
            keyID: key.keyID, to: .retired, actor: "test", reason: nil, force: true, authenticator: masterKey.registryRows)
        let secret = try await APIClientCredentials.create(in: fixture.store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
        var configuration = StoreFixture.serverConfiguration(masterKey: masterKey, storeTimeout: storeTimeout)
        configuration.eligibility = try EligibilityConfiguration(
            catalogJSON: Data(EligibilityIntegrationTests.catalog.utf8), trustedRootPEMs: [try chain.root.serializeAsPEM().pemString])
        let application = try await buildApplication(configuration: configuration, store: fixture.store)
        try await application.test(.live) { client in
            try await body(client, try #require(client.port), secret)
        }
    }

    @Test(
        "Eligible, but the app has no active key: 503 no_active_key, no signature and no ledger row, the eligible decision audited; the customer's next request is decided again the same way",
        arguments: StoreBackend.testedCases)
    func eligibleWithoutActiveKey(_ backend: StoreBackend) async throws {
        let chain = try TestAppleChain()
        let body = try Self.signingBody(chain)
        try await StoreFixture.with(backend) { fixture in
            try await Self.withServerWithoutActiveKey(fixture, chain: chain, storeTimeout: .seconds(60)) { client, _, secret in
                for attempt in 1...2 {
                    let response = try await client.postJSON("/v1/offers/signatures", body, bearer: secret)
                    expectProblem(response, .serviceUnavailable, "no_active_key")
                    let decisions = try await fixture.store.auditRecords(after: 0, limit: 100).filter { $0.kind == "eligibility.decided" }
                    // Committed before its answer was sent, and each time: the first decision
                    // added nothing the second one counts.
                    #expect(decisions.count == attempt, "attempt \(attempt): \(decisions.map(\.body))")
                    #expect(decisions.allSatisfy { $0.body.contains(#""eligible":true"#) && $0.body.contains(Self.token) }, "\(decisions.map(\.body))")
                }
            }
            let kinds = try await fixture.store.auditRecords(after: 0, limit: 100).map(\.kind)
            #expect(!kinds.contains("signature.issued"), "\(kinds)")
            #expect(try await fixture.count("issued_signatures") == 0)
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("SQLite, audit writes held by another connection: the unsignable eligible decision cannot be committed in time, so 503 audit_unavailable, not the decision's answer")
    func auditUnavailableOnSQLite() async throws {
        let chain = try TestAppleChain()
        let body = try Self.signingBody(chain)
        try await StoreFixture.with(.sqlite) { fixture in
            try await Self.withServerWithoutActiveKey(fixture, chain: chain, storeTimeout: .seconds(3)) { client, _, secret in
                var configuration = GRDB.Configuration()
                configuration.allowsUnsafeTransactions = true  // the transaction outlives the access that opens it
                let holder = try DatabaseQueue(path: try #require(fixture.sqlitePath), configuration: configuration)
                try await holder.writeWithoutTransaction { db in try db.execute(sql: "BEGIN IMMEDIATE TRANSACTION") }
                let started = ContinuousClock.now
                let answered: Result<TestResponse, any Error>
                do {
                    answered = .success(try await client.postJSON("/v1/offers/signatures", body, bearer: secret))
                } catch {
                    answered = .failure(error)
                }
                let took = ContinuousClock.now - started
                // Released however the request ended, so the store can be closed.
                try await holder.writeWithoutTransaction { db in try db.execute(sql: "ROLLBACK TRANSACTION") }
                try holder.close()
                let response = try answered.get()
                expectProblem(response, .serviceUnavailable, "audit_unavailable")
                #expect(took >= .milliseconds(2_900), "answered before the commit's time bound: \(took)")
            }
            #expect(try await fixture.count("issued_signatures") == 0)
        }
    }

    @Test(
        "PostgreSQL, the audit chain's head row locked: the unsignable eligible decision's commit waits with no customer lock held and nothing answered; when it cannot be committed in time, 503 audit_unavailable, not the decision's answer",
        .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
    func commitAfterTheLockAndAuditedFirst() async throws {
        let chain = try TestAppleChain()
        let body = try Self.signingBody(chain)
        try await StoreFixture.with(.postgres, poolSize: 6) { fixture in
            let database = try #require(fixture.database)
            // The commit's wait for the head row ends with the store's time bound: long enough for
            // the checks below on a loaded machine, short enough for the test.
            try await Self.withServerWithoutActiveKey(fixture, chain: chain, storeTimeout: .seconds(10)) { _, port, secret in
                try await AuditHeadLock.holding(database: database.name) { _ in
                    let answered = AuditHeadLock.Answered()
                    let started = ContinuousClock.now
                    let request = Task {
                        defer { answered.set() }
                        return try await onOwnThread {
                            try RawSocket.request(
                                port: port, method: "POST", path: "/v1/offers/signatures",
                                headers: ["Authorization": "Bearer \(secret)", "Content-Type": "application/json"], body: body, timeout: .seconds(120))
                        }
                    }
                    let waiting = try await AuditHeadLock.poll(within: .seconds(60)) {
                        try await AuditHeadLock.commitsWaiting(in: database.name) >= 1
                    }
                    #expect(waiting, "the decision's audit commit never reached the database")
                    // Well within the commit's 10 s bound (a lock held through the commit would be
                    // given back only when that bound ends it).
                    let lockGivenBack = try await AuditHeadLock.poll(within: .seconds(5)) {
                        try await AuditHeadLock.customerLocks(in: database.name) == 0
                    }
                    #expect(lockGivenBack, "a customer lock was held while the decision's record waited for its commit")
                    try await Task.sleep(for: .milliseconds(300))
                    let locks = try await AuditHeadLock.customerLocks(in: database.name)
                    #expect(locks == 0, "a customer lock was taken again while the decision's record waited: \(String(describing: locks))")
                    #expect(!answered.isSet, "answered before the decision's record was committed")

                    // The commit cannot end while the head is locked: past the store's bound the
                    // answer is that the audit is unavailable, not the decision's 503 no_active_key.
                    let response = try await request.value
                    #expect(response.status == 503 && response.json["code"] as? String == "audit_unavailable", "\(response.status) \(response.body)")
                    #expect(ContinuousClock.now - started >= .seconds(9), "answered before the commit's time bound: \(ContinuousClock.now - started)")
                }
                let issued = try await TestPostgres.scalar("SELECT COUNT(*) FROM issued_signatures", database: database.name)
                #expect(issued == 0, "a ledger row without a signature: \(String(describing: issued))")
            }
        }
    }
}
