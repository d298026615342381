import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerPostgres
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import TestPostgres
import Testing

/// `serve --notification-recovery-interval` on two instances of one PostgreSQL database: an
/// outage's notifications are caught up once, by one instance a round.
@Suite("Scheduled notification catch-up", .serialized, .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct NotificationCatchUpTests {
    let chain: TestAppleChain
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
    }

    func notification(_ type: String, uuid: String) throws -> String {
        let data: [String: Any] = ["bundleId": AppleNotificationTests.bundleID, "environment": "Production", "appAppleId": AppleNotificationTests.appAppleID]
        return try chain.signJWS([
            "notificationType": type, "notificationUUID": uuid, "data": data, "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
        ])
    }

    @Test("Two instances, a 1 s interval: the notifications of an outage are stored once each, and the instances share the rounds")
    func twoInstancesCatchUp() async throws {
        let root = try chain.root.serializeAsPEM().pemString
        // The deployment's key, made first: the fake checks the tokens it signs.
        let deploymentKey = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY000")
        let fake = FakeAppStoreServerAPI(
            bundleID: AppleNotificationTests.bundleID, keyID: deploymentKey.keyID, issuerID: TestServer.issuerID, publicKey: deploymentKey.publicKey)
        try await fake.run { port in
            let catalog = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
            let deployment = try await PostgresInstancesTests.Deployment.make(instances: 2, key: deploymentKey) { configuration in
                configuration.eligibility = catalog
                configuration.notificationRecoveryInterval = .seconds(1)
            }
            do {
                try await deployment.live { ports in
                    fake.setNotificationURL("http://127.0.0.1:\(ports[0])/v1/apple/notifications", environment: "Production")
                    for index in 0..<2 { #expect(await fake.send(try notification("DID_RENEW", uuid: "before-\(index)")).delivered) }
                    // The outage: nothing answers at the notification URL.
                    fake.setNotificationURL("http://127.0.0.1:9/v1/apple/notifications", environment: "Production")
                    for index in 0..<4 { #expect(await !fake.send(try notification("REFUND", uuid: "outage-\(index)")).delivered) }

                    let deadline = ContinuousClock.now + .seconds(30)
                    var stored: Int64 = 0
                    while ContinuousClock.now < deadline {
                        stored = try await TestPostgres.scalar("SELECT COUNT(*) FROM apple_notifications", database: deployment.database.name) ?? 0
                        if stored == 6 { break }
                        try await Task.sleep(for: .milliseconds(200))
                    }
                    #expect(stored == 6, "every notification of the outage caught up")

                    // Five more seconds of rounds: both instances tick every second; the watermark
                    // lets one of them ask Apple per interval (uncoordinated, it would be ten rounds).
                    // A loaded machine (the whole suite on two cores) may tick late: watch at least
                    // 5 s and until two rounds were asked (at most 30 s), and compare with the time.
                    fake.clearRequests()
                    let watching = ContinuousClock.now
                    var rounds = 0
                    repeat {
                        try await Task.sleep(for: .milliseconds(500))
                        rounds = fake.requests.filter { $0.endpoint == .notificationHistory && $0.revision == nil }.count
                    } while ContinuousClock.now - watching < .seconds(30) && (ContinuousClock.now - watching < .seconds(5) || rounds < 2)
                    let watched = Double((ContinuousClock.now - watching).components.seconds)
                    #expect(rounds >= 2 && Double(rounds) <= watched + 2, "\(rounds) rounds in \(watched) s")
                    #expect(fake.requests.allSatisfy { $0.token?.problems == [] })
                    #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM apple_notifications", database: deployment.database.name) == 6, "no duplicates")
                    #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM notification_recovery", database: deployment.database.name) == 1)
                }
            } catch {
                await deployment.close()
                throw error
            }
            await deployment.close()
        }
    }
}
