import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HummingbirdTesting
import Logging
import OfferSignerCore
import OfferSignerEligibility
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import TestChildProcess
import Testing

/// Notifications Apple could not deliver (the service down) are recovered from Get Notification
/// History by `offer-signer notifications recover` (a real child process), stored once each.
@Suite("Notification recovery", .serialized)
struct NotificationRecoveryTests {
    static let bundleID = AppleNotificationTests.bundleID
    let chain: TestAppleChain
    let now = Date()

    init() throws {
        chain = try TestAppleChain()
    }

    func notification(_ type: String, uuid: String) throws -> String {
        let data: [String: Any] = ["bundleId": Self.bundleID, "environment": "Production", "appAppleId": AppleNotificationTests.appAppleID]
        return try chain.signJWS([
            "notificationType": type, "notificationUUID": uuid, "data": data, "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
        ])
    }

    /// The files a CLI child needs: master key, catalog (the fake as the app's Production API) and the test root.
    static func cliFiles(server: TestServer, chain: TestAppleChain, port: Int) throws -> [String] {
        let masterKeyFile = server.directory.appendingPathComponent("master.key")
        try Data(server.masterKeyBase64.utf8).write(to: masterKeyFile)
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: masterKeyFile.path)
        let catalog = server.directory.appendingPathComponent("offers.json")
        try Data(AppleNotificationTests.catalog(port: port).utf8).write(to: catalog)
        let root = server.directory.appendingPathComponent("root.pem")
        try Data(try chain.root.serializeAsPEM().pemString.utf8).write(to: root)
        return ["--store", server.storePath, "--master-key-file", masterKeyFile.path, "--offers", catalog.path, "--apple-root", root.path]
    }

    /// Runs the real `offer-signer` on a thread of its own: waiting for the child on one of Swift's
    /// few cooperative threads would starve the fake Apple API and the server it talks to.
    static func offerSigner(_ args: [String]) async throws -> (status: Int32, stdout: String, stderr: String) {
        let environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OFFER_SIGNER_") }
        let executable = try PostgresKillTests.executable()
        return try await withCheckedThrowingContinuation { continuation in
            Thread {
                continuation.resume(
                    with: Result {
                        let result = try ChildProcess.run(executable, args, environment: environment, stdin: nil, currentDirectory: nil, timeout: .seconds(120))
                        return (result.status, result.stdoutText, result.stderrText)
                    })
            }.start()
        }
    }

    @Test("An outage's notifications are recovered by notifications recover: every one stored once, across pages; a second run finds them stored")
    func recoverAfterOutage() async throws {
        let server = try await TestServer(bundles: [Self.bundleID])
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let root = try chain.root.serializeAsPEM().pemString
        try await fake.run { port in
            var running = server
            var eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
            eligibility.appStoreServerAPI.timeBudget = .seconds(30)
            running.configuration.eligibility = eligibility
            let configured = running
            let arguments = try Self.cliFiles(server: configured, chain: chain, port: port)
            try await configured.live { client in
                let endpoint = "http://127.0.0.1:\(try #require(client.port))/v1/apple/notifications"
                fake.setNotificationURL(endpoint, environment: "Production")
                for index in 0..<2 { #expect(await fake.send(try notification("DID_RENEW", uuid: "before-\(index)")).delivered) }
                // The outage: nothing answers at the notification URL.
                fake.setNotificationURL("http://127.0.0.1:9/v1/apple/notifications", environment: "Production")
                for index in 0..<3 { #expect(await !fake.send(try notification("REFUND", uuid: "outage-\(index)")).delivered) }
                // And one the endpoint refuses (another app's key signed it): never stored, by anyone.
                fake.setNotificationURL(endpoint, environment: "Production")
                let stranger = try TestAppleChain()
                let forged = try stranger.signJWS([
                    "notificationType": "REFUND", "notificationUUID": "forged", "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
                    "data": ["bundleId": Self.bundleID, "environment": "Production", "appAppleId": AppleNotificationTests.appAppleID] as [String: Any],
                ])
                #expect(await !fake.send(forged).delivered)
                #expect(try StoreCount.count(configured.storePath, "apple_notifications") == 2)

                let since = ISO8601DateFormatter().string(from: now.addingTimeInterval(-3600))
                let first = try await Self.offerSigner(["notifications", "recover"] + arguments + ["--since", since, "--json"])
                #expect(first.status == 1, "a notification that does not verify is a failure: \(first.stdout) \(first.stderr)")
                let tally = try #require(try JSONSerialization.jsonObject(with: Data(first.stdout.utf8)) as? [String: Any], "\(first.stdout) \(first.stderr)")
                #expect(tally["found"] as? Int == 6, "\(first.stdout)")
                #expect(tally["new"] as? Int == 3)
                #expect(tally["alreadyStored"] as? Int == 2)
                #expect(tally["failed"] as? Int == 1)
                #expect(tally["pages"] as? Int == 3, "the fake pages 2 at a time")
                #expect(try StoreCount.count(configured.storePath, "apple_notifications") == 5)

                let onlyFailures = try await Self.offerSigner(["notifications", "recover"] + arguments + ["--since", since, "--only-failures"])
                #expect(onlyFailures.stdout.contains("found: 4"), "\(onlyFailures.stdout) \(onlyFailures.stderr)")
                #expect(onlyFailures.stdout.contains("new: 0"))
                #expect(onlyFailures.stdout.contains("already stored: 3"))
                #expect(try StoreCount.count(configured.storePath, "apple_notifications") == 5, "idempotent by notificationUUID")

                let history = fake.requests.filter { $0.endpoint == .notificationHistory }
                #expect(history.allSatisfy { $0.token?.problems == [] && $0.answeredStatus == 200 })
                #expect(history.map(\.revision) == [nil, "page-2", "page-4", nil, "page-2"])
                #expect(history.last?.body?.contains(#""onlyFailures":true"#) == true)

                let bad = try await Self.offerSigner(["notifications", "recover"] + arguments + ["--since", "yesterday"])
                #expect(bad.status != 0 && bad.stderr.contains("ISO 8601"))
            }
        }
    }

    @Test("The scheduled catch-up does not move its watermark past a notification that failed: later rounds ask for it again, beyond the 10-minute overlap")
    func catchUpHoldsWatermarkAtFailure() async throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        let root = try chain.root.serializeAsPEM().pemString
        let forger = try TestAppleChain()
        try await StoreFixture.with(.sqlite) { fixture in
            try await fake.run { port in
                let eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
                let logger = Logger(label: "catch-up-test")
                let intake = AppleNotificationIntake(
                    store: fixture.store, servedBundles: [Self.bundleID], catalog: eligibility.catalog, trustedRoots: eligibility.trustedRoots, logger: logger)
                let client = try AppStoreServerAPIClient(configuration: eligibility.appStoreServerAPI, trustedRoots: eligibility.trustedRoots, metrics: .none, logger: logger)
                let target = NotificationCatchUp.Target(app: eligibility.catalog.appSettings(bundleID: Self.bundleID), environment: .production)
                let metrics = ServerMetrics()
                let catchUp = NotificationCatchUp(
                    store: fixture.store, recovery: NotificationRecovery(client: client, intake: intake), client: client, targets: [target],
                    credentials: { AppStoreServerAPICredentials(key: key, issuerID: TestServer.issuerID, bundleID: $0) }, interval: .seconds(3600), logger: logger,
                    metrics: metrics)
                func rounds(_ outcome: String) -> Int {
                    let prefix = #"offer_signer_notification_catch_up_rounds_total{bundle_id="com.example.app",environment="Production",outcome="\#(outcome)"} "#
                    let line = String(decoding: metrics.exposition(), as: UTF8.self).split(separator: "\n").first { $0.hasPrefix(prefix) }
                    return line.flatMap { Int($0.dropFirst(prefix.count)) } ?? 0
                }

                // Nothing answers at the notification URL: Apple tries each once. The middle one
                // does not verify here (signed by a chain this service does not trust).
                _ = await fake.send(try notification("DID_RENEW", uuid: "caught-1"))
                try await Task.sleep(for: .milliseconds(20))
                let failing = await fake.send(try forger.signJWS([
                    "notificationType": "REFUND", "notificationUUID": "forged-1", "version": "2.0", "signedDate": TestAppleChain.milliseconds(now),
                    "data": ["bundleId": Self.bundleID, "environment": "Production", "appAppleId": AppleNotificationTests.appAppleID],
                ]))
                try await Task.sleep(for: .milliseconds(20))
                _ = await fake.send(try notification("DID_RENEW", uuid: "caught-2"))
                let failedAt = try #require(failing.attempts.first?.date)

                // The first round, an hour later: two stored, one failed; the watermark stays at the failure.
                let firstRound = Date().addingTimeInterval(3600)
                let first = try #require(await catchUp.catchUp(target, now: firstRound))
                #expect(first.found == 3 && first.new == 2 && first.failed == 1)
                let held = try #require(try await fixture.store.notificationRecoveryWatermark(bundleID: Self.bundleID, environment: "Production"))
                #expect(abs(held.timeIntervalSince(failedAt)) < 0.002, "held at the failed notification's first attempt, not moved to the round's end")

                // Two hours on: the failed notification is asked for again (it is long past the
                // overlap of the round before), and still holds the watermark.
                let second = try #require(await catchUp.catchUp(target, now: firstRound.addingTimeInterval(7200)))
                #expect(second.found == 3 && second.alreadyStored == 2 && second.failed == 1)
                #expect(try await fixture.store.notificationRecoveryWatermark(bundleID: Self.bundleID, environment: "Production") == held)
                // Held, yet the round counts as run: another round within 0.9 interval of it is skipped.
                #expect(await catchUp.catchUp(target, now: Date()) == nil)

                // Over 24 hours after its first attempt, still failing: it holds the watermark no longer.
                let dayLater = failedAt.addingTimeInterval(86_400 + 3600)
                let third = try #require(await catchUp.catchUp(target, now: dayLater))
                #expect(third.failed == 1 && third.failedNotifications.first?.notificationUUID == "forged-1")
                let moved = try #require(try await fixture.store.notificationRecoveryWatermark(bundleID: Self.bundleID, environment: "Production"))
                #expect(abs(moved.timeIntervalSince(dayLater)) < 0.002, "moved to the round's end")

                // A last run in the future (a database writer) counts as none: the round runs.
                try await fixture.store.setNotificationRecoveryWatermark(
                    bundleID: Self.bundleID, environment: "Production", recoveredUntil: moved, at: Date().addingTimeInterval(10 * 365 * 86_400))
                #expect(await catchUp.catchUp(target, now: dayLater.addingTimeInterval(60)) != nil, "not skipped by a future last run")
                // A database writer that keeps the last run at now + interval - ε: beyond 60 s of
                // clock skew it counts as none, every time; within 60 s it counts (another instance's round).
                let suppressAt = dayLater.addingTimeInterval(7200)
                try await fixture.store.setNotificationRecoveryWatermark(
                    bundleID: Self.bundleID, environment: "Production", recoveredUntil: moved, at: suppressAt.addingTimeInterval(3600 - 1))
                #expect(await catchUp.catchUp(target, now: suppressAt) != nil, "not skipped by a last run just under an interval ahead")
                try await fixture.store.setNotificationRecoveryWatermark(
                    bundleID: Self.bundleID, environment: "Production", recoveredUntil: moved, at: suppressAt.addingTimeInterval(7200 + 30))
                #expect(await catchUp.catchUp(target, now: suppressAt.addingTimeInterval(7200)) == nil, "a last run 30 s ahead (clock skew) counts")
                // A writer who keeps writing the last run within 60 s ahead before every round skips
                // every round while it keeps writing: each skipped round is counted.
                let askedBefore = rounds("asked")
                #expect(rounds("skipped_last_run_ahead") == 1 && rounds("skipped_recent_round") == 1)
                for round in 1...3 {
                    let roundAt = suppressAt.addingTimeInterval(Double(round + 1) * 7200)
                    try await fixture.store.setNotificationRecoveryWatermark(
                        bundleID: Self.bundleID, environment: "Production", recoveredUntil: moved, at: roundAt.addingTimeInterval(59))
                    #expect(await catchUp.catchUp(target, now: roundAt) == nil, "skipped while the writer writes")
                }
                #expect(rounds("skipped_last_run_ahead") == 4 && rounds("asked") == askedBefore, "every skipped round counted; none asked")

                // 200 days on: the start is clamped inside Apple's 180-day window.
                let farLater = dayLater.addingTimeInterval(200 * 86_400)
                _ = await catchUp.catchUp(target, now: farLater)
                let asked = try #require(fake.requests.last { $0.endpoint == .notificationHistory }?.body)
                let object = try #require(try JSONSerialization.jsonObject(with: Data(asked.utf8)) as? [String: Any])
                let startMs = try #require(object["startDate"] as? NSNumber).doubleValue
                let earliest = NotificationRecovery.earliestStart(.production, now: farLater)
                #expect(abs(startMs / 1000 - earliest.timeIntervalSince1970) < 0.002, "startDate within the past 180 days, an hour inward")
                #expect(earliest > farLater.addingTimeInterval(-180 * 86_400))
                #expect(NotificationRecovery.earliestStart(.sandbox, now: farLater) > farLater.addingTimeInterval(-30 * 86_400))
                try await client.shutdown()
            }
        }
    }
}
