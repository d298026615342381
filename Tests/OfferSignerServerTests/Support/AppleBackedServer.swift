import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HummingbirdTesting
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing
import X509

extension StoreFixture {
    /// A quiet server on a free loopback port, with the test operator token, no rate limits and
    /// `storeTimeout`.
    static func serverConfiguration(masterKey: MasterKey, storeTimeout: Duration) -> ServerConfiguration {
        var configuration = ServerConfiguration(masterKey: masterKey, logger: quietLogger)
        configuration.operatorToken = TestServer.operatorToken
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.clientRateLimit = .unlimited
        configuration.appAccountTokenRateLimit = .unlimited
        configuration.storeTimeout = storeTimeout
        return configuration
    }

    /// Runs a live server on this fixture's store that decides offers on Apple's history: one
    /// development key (`keyID`) for the app `AppleHistorySourceTests.catalog` configures, one API
    /// client, no rate limits, and that catalog pointed at a fake App Store Server API that knows
    /// the key, prepared by `prepare` before it starts (customers, delays); Apple's test `chain`
    /// is the trusted root. `body` gets the server's port, the client's secret and the fake.
    func withAppleBackedServer(
        keyID: String, chain: TestAppleChain, storeTimeout: Duration,
        prepare: (FakeAppStoreServerAPI) throws -> Void,
        _ body: @escaping @Sendable (_ port: Int, _ secret: String, _ fake: FakeAppStoreServerAPI) async throws -> Void
    ) async throws {
        let bundleID = AppleHistorySourceTests.bundleID
        let masterKey = MasterKey.generate().key
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: keyID)
        _ = try await KeyRegistry.importKey(
            key, bundleID: bundleID, issuerID: TestServer.issuerID, development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
        let secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
        let fake = FakeAppStoreServerAPI(bundleID: bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        try prepare(fake)
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { applePort in
            var configuration = StoreFixture.serverConfiguration(masterKey: masterKey, storeTimeout: storeTimeout)
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleHistorySourceTests.catalog(port: applePort).utf8), trustedRootPEMs: [root])
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            configuration.eligibility = eligibility
            let application = try await buildApplication(configuration: configuration, store: store)
            try await application.test(.live) { client in
                try await body(try #require(client.port), secret, fake)
            }
        }
    }
}
