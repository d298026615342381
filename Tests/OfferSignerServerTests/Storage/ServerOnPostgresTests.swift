import Foundation
import HTTPTypes
import HummingbirdTesting
import Logging
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import TestPostgres
import Testing

/// The real server on a PostgreSQL store: signatures are audited there before they leave, and
/// when the database turns read-only (as after a failover) signing answers 503 and issues nothing.
@Suite("The real server on PostgreSQL", .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct ServerOnPostgresTests {
    @Test("A signature verifies, is in the ledger and the audit chain; a read-only database gets 503 audit_unavailable and no signature")
    func signOnPostgres() async throws {
        try await StoreFixture.with(.postgres) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: "PGKEY00001")
            _ = try await KeyRegistry.importKey(key, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
            let secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
            var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
            configuration.operatorToken = TestServer.operatorToken
            configuration.host = "127.0.0.1"
            configuration.port = 0
            configuration.registryPollInterval = .milliseconds(50)
            configuration.clientRateLimit = .unlimited
            configuration.appAccountTokenRateLimit = .unlimited
            let application = try await buildApplication(configuration: configuration, store: store)
            let token = "6b29fc40-ca47-1067-b31d-00dd010662da"
            let database = try #require(fixture.database)
            try await application.test(.live) { client in
                let response = try await client.postJSON(
                    "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)","formats":["legacy"]}"#, bearer: secret)
                #expect(response.status == .created, "\(response.text)")
                let legacy = try #require(response.json["legacy"] as? [String: Any])
                let document = LegacySignatureDocument(
                    bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: token,
                    keyID: try #require(legacy["keyID"] as? String), nonce: try #require(legacy["nonce"] as? String),
                    timestamp: try #require(legacy["timestamp"] as? Int64), signature: try #require(legacy["signature"] as? String))
                #expect(SignatureDocument.legacy(document).verify(with: key.publicKey) == .valid)
                let issued = try await store.issuedSignatures(appAccountToken: token, bundleID: "com.example.app")
                #expect(issued.map(\.signature.nonce) == [document.nonce])

                // Failover leaves a read-only server: new sessions are read-only, existing ones are cut.
                try await TestPostgres.execute("ALTER DATABASE \"\(database.name)\" SET default_transaction_read_only = on")
                try await TestPostgres.execute("SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()")
                for _ in 0..<3 {
                    let refused = try await client.postJSON(
                        "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)","formats":["legacy"]}"#, bearer: secret)
                    expectProblem(refused, .serviceUnavailable, "audit_unavailable")
                }
                #expect(try await store.issuedSignatures(appAccountToken: token, bundleID: "com.example.app").count == 1)
            }
            let report = try await store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 3, "key, client, one signature: \(report)")
        }
    }
}
