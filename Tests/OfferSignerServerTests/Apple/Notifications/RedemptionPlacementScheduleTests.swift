import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage
import SwiftASN1
import Synchronization
import Testing

@testable import OfferSignerServer

/// The unplaced-redemption sweep on SQLite and PostgreSQL (``RedemptionPlacementSchedule``): rows
/// Apple cannot place back off and stop at the cap, two sweeps at once count once, every due row is reached a page at a time, rows never asked about
/// come first, and rows of a bundle not served or an environment not Apple's are never asked about
/// nor labelled. (Rows that cannot be asked, Apple's errors about this service's configuration,
/// stored attempt counts a writer set: RedemptionPlacementScheduleTests+Writers.swift.)
@Suite("Unplaced redemptions: attempts, back-off, cap and paging", .serialized)
struct RedemptionPlacementScheduleTests {
    static let bundleID = AppleNotificationTests.bundleID
    /// A whole millisecond, so due times compare exactly.
    let start = Date(timeIntervalSince1970: (Date().timeIntervalSince1970).rounded(.down))
    let far = Date().addingTimeInterval(10 * 365 * 86400)

    /// A redemption the store records `unplaced`, in Production, of a subscription Apple does not
    /// know (the fake answers 404 4040010): Apple answers, and it can never be placed.
    static func unplaceable(_ index: Int, environment: String = "Production", bundleID: String = bundleID) -> RedemptionCandidate {
        RedemptionCandidate(
            transactionID: "\(800_000_000 + index)", originalTransactionID: "\(700_000_000 + index)", bundleID: bundleID, environment: environment,
            productID: "pro.monthly", offerID: "winback_1", appAccountToken: nil, purchaseDate: Date(timeIntervalSince1970: 1_790_000_000),
            isPlaced: false)
    }

    /// A clock the test moves.
    final class ManualClock: Sendable {
        private let time: Mutex<Date>
        init(_ time: Date) { self.time = Mutex(time) }
        var now: Date {
            get { time.withLock { $0 } }
            set { time.withLock { $0 = newValue } }
        }
    }

    /// A placer over `store` whose Apple is the fake on `port`, serving only `bundleID`;
    /// `issuerID` empty: no usable credentials (this service's failure, Apple never asked).
    static func placer(
        _ store: any OfferSignerStore, port: Int, key: InAppPurchaseKey, root: String, clock: ManualClock, metrics: ServerMetrics = ServerMetrics(),
        sweepLimit: Int = 2000, sweepPageSize: Int = 500, issuerID: String = TestServer.issuerID
    ) throws -> (RedemptionPlacer, AppStoreServerAPIClient) {
        var eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
        eligibility.appStoreServerAPI.timeBudget = .seconds(30)
        let logger = Logger(label: "placement-test")
        let client = try AppStoreServerAPIClient(configuration: eligibility.appStoreServerAPI, trustedRoots: eligibility.trustedRoots, metrics: .none, logger: logger)
        let placer = RedemptionPlacer(
            store: store, client: client, catalog: eligibility.catalog, servedBundles: { [bundleID] },
            credentials: { AppStoreServerAPICredentials(key: key, issuerID: issuerID, bundleID: $0) }, metrics: metrics, logger: logger,
            retryInterval: .seconds(900), sweepLimit: sweepLimit, sweepPageSize: sweepPageSize, clock: { clock.now })
        return (placer, client)
    }

    /// A fresh store of `backend` and the fake App Store Server API on loopback (`port`), answering
    /// for `key`; `root` is the PEM of the test chain Apple's items are signed with.
    func withStoreAndAPI(
        _ backend: StoreBackend,
        _ body: @escaping @Sendable (_ fixture: StoreFixture, _ fake: FakeAppStoreServerAPI, _ port: Int, _ key: InAppPurchaseKey, _ root: String) async throws -> Void
    ) async throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let root = try TestAppleChain().root.serializeAsPEM().pemString
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        try await StoreFixture.with(backend) { fixture in
            try await fake.run { port in try await body(fixture, fake, port, key, root) }
        }
    }

    func record(_ candidates: [RedemptionCandidate], in store: any OfferSignerStore, at time: Date) async throws {
        guard case .recorded(let recorded) = try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: candidates, source: "notification"), at: time) else {
            Issue.record("not recorded")
            return
        }
        #expect(recorded.allSatisfy { $0.state == .unplaced })
    }

    /// The exposition's lines of one family.
    static func lines(_ metrics: ServerMetrics, _ family: String) -> [String] {
        String(decoding: metrics.exposition(), as: UTF8.self).split(separator: "\n").map(String.init).filter { $0.hasPrefix(family + "{") }
    }

    @Test("A redemption Apple cannot place is asked about again after 15 min, 30 min, 1 h, … at most a day apart, and no more after the cap: unplaced and counted", arguments: StoreBackend.testedCases)
    func backsOffAndStopsAtTheCap(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let metrics = ServerMetrics()
            let clock = ManualClock(start)
            let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock, metrics: metrics)
            try await record([Self.unplaceable(1)], in: fixture.store, at: start)
            var waits: [TimeInterval] = []
            for attempt in 1...RedemptionPlacementSchedule.maximumAttempts {
                #expect(await placer.sweep() == 1, "attempt \(attempt) is due")
                let rows = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10)
                guard attempt < RedemptionPlacementSchedule.maximumAttempts else {
                    #expect(rows.isEmpty, "given up: no longer due, ever")
                    break
                }
                let row = try #require(rows.first)
                #expect(row.placementAttempts == attempt)
                waits.append(row.dueAt.timeIntervalSince(clock.now))
                clock.now = row.dueAt.addingTimeInterval(-1)
                #expect(await placer.sweep() == 0, "not due before its time")
                clock.now = row.dueAt
            }
            #expect(waits == [900, 1800, 3600, 7200, 14_400, 28_800, 57_600, 86_400, 86_400])
            #expect(fake.requests.filter { $0.endpoint == .history }.count == RedemptionPlacementSchedule.maximumAttempts, "Apple answered every attempt (not found)")
            clock.now = far
            #expect(await placer.sweep() == 0)
            let givenUp = try await fixture.store.givenUpOfferRedemptions(limit: 10)
            #expect(givenUp.map(\.redemption.candidate.transactionID) == ["800000001"])
            #expect(givenUp.first?.placementAttempts == RedemptionPlacementSchedule.maximumAttempts)
            // Still unplaced, reported as such.
            #expect(try await fixture.store.offerRedemptions(since: nil).map(\.state) == [.unplaced])
            #expect(try await fixture.store.unplacedOfferRedemptions(limit: 10).count == 1)
            #expect(
                Self.lines(metrics, "offer_signer_redemption_placements_given_up_total")
                    == [#"offer_signer_redemption_placements_given_up_total{bundle_id="com.example.app",environment="Production"} 1"#])

            // Re-armed (offers retry-unplaced): asked about again from the first step, audited once.
            let auditBefore = try await fixture.store.auditRecords(after: 0, limit: 10_000).count
            #expect(try await fixture.store.rearmGivenUpOfferRedemptions(bundleID: "com.example.other", actor: "ops", reason: nil, at: far) == 0)
            let rearmedAt = Date(timeIntervalSince1970: (far.timeIntervalSince1970 - 86_400).rounded(.down))
            #expect(try await fixture.store.rearmGivenUpOfferRedemptions(bundleID: Self.bundleID, actor: "ops", reason: "fixed", at: rearmedAt) == 1)
            #expect(try await fixture.store.rearmGivenUpOfferRedemptions(bundleID: nil, actor: "ops", reason: nil, at: rearmedAt) == 0, "none left given up")
            let audit = try await fixture.store.auditRecords(after: 0, limit: 10_000)
            #expect(audit.count == auditBefore + 1)
            let record = try #require(audit.last)
            #expect(record.kind == "offer.redemptions_rearmed")
            #expect(record.body.contains(#""actor":"ops""#) && record.body.contains(#""redemptions":"1""#) && record.body.contains(#""reason":"fixed""#), "\(record.body)")
            #expect(try await fixture.store.givenUpOfferRedemptions(limit: 10).isEmpty)
            let rearmed = try #require(try await fixture.store.dueUnplacedOfferRedemptions(at: rearmedAt, after: .start, limit: 10).first)
            #expect(rearmed.placementAttempts == 0 && rearmed.dueAt == rearmedAt)
            #expect(await placer.sweep() == 1, "asked about again")
            #expect(try await fixture.store.dueUnplacedOfferRedemptions(at: far.addingTimeInterval(86_400), after: .start, limit: 10).first?.placementAttempts == 1)
            try await client.shutdown()
        }
    }

    @Test("offers retry-unplaced re-arms given-up redemptions of an app (the CLI on SQLite): prints the count, audited")
    func retryUnplacedCommand() async throws {
        try await StoreFixture.with(.sqlite) { fixture in
            try await record([Self.unplaceable(1), Self.unplaceable(2, bundleID: "com.example.other")], in: fixture.store, at: start)
            let schedule = RedemptionPlacementSchedule(firstRetry: 900)
            var time = start
            for _ in 1...RedemptionPlacementSchedule.maximumAttempts {
                for original in ["700000001", "700000002"] {
                    let bundle = original == "700000001" ? Self.bundleID : "com.example.other"
                    _ = try await fixture.store.recordRedemptionPlacementAttempt(
                        AppleSubscriptionKey(bundleID: bundle, environment: "Production", originalTransactionID: original), at: time, outcome: .answered,
                        schedule: schedule)
                }
                time = time.addingTimeInterval(86_400)
            }
            #expect(try await fixture.store.givenUpOfferRedemptions(limit: 10).count == 2)
            let path = try #require(fixture.sqlitePath)
            let result = try await NotificationRecoveryTests.offerSigner(
                ["offers", "retry-unplaced", "--store", path, "--bundle-id", Self.bundleID, "--actor", "ops", "--reason", "key fixed"])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout.contains("re-armed 1 given-up unplaced redemption of com.example.app"), "\(result.stdout)")
            #expect(try await fixture.store.givenUpOfferRedemptions(limit: 10).map(\.redemption.candidate.bundleID) == ["com.example.other"])
            let record = try #require(try await fixture.store.auditRecords(after: 0, limit: 10_000).last)
            #expect(record.kind == "offer.redemptions_rearmed" && record.body.contains(#""reason":"key fixed""#), "\(record.body)")
            let bad = try await NotificationRecoveryTests.offerSigner(["offers", "retry-unplaced", "--store", path, "--bundle-id", "has space"])
            #expect(bad.status != 0 && bad.stderr.contains("--bundle-id must be a bundle ID"), "\(bad.stderr)")
        }
    }

    @Test("Two instances sweeping the same due rows at once count one attempt per row", arguments: StoreBackend.testedCases)
    func concurrentSweepsCountOnce(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let other = try await fixture.openAnother()
            let clock = ManualClock(start.addingTimeInterval(60))
            try await record((0..<6).map { Self.unplaceable($0) }, in: fixture.store, at: start)
            let (first, firstClient) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock)
            let (second, secondClient) = try Self.placer(other, port: port, key: key, root: root, clock: clock)
            for round in 1...3 {
                async let a = first.sweep()
                async let b = second.sweep()
                let asked = await a + b
                #expect(asked >= 6, "round \(round): every subscription asked by one or both")
                let rows = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10)
                #expect(rows.count == 6 && rows.allSatisfy { $0.placementAttempts == round }, "round \(round): \(rows.map(\.placementAttempts))")
                clock.now = try #require(rows.map(\.dueAt).max())
            }
            try await firstClient.shutdown()
            try await secondClient.shutdown()
            await other.close()
        }
    }

    @Test("Rows of a bundle not served or an environment not Apple's are never asked about, counted or labelled, and do not use up the sweep's limit", arguments: StoreBackend.testedCases)
    func madeUpRowsSkipped(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let metrics = ServerMetrics()
            let clock = ManualClock(start)
            let (placer, client) = try Self.placer(
                fixture.store, port: port, key: key, root: root, clock: clock, metrics: metrics, sweepLimit: 1,
                sweepPageSize: 4)
            // Older than the genuine row, and more than a page of them.
            let madeUp =
                (0..<5).map { Self.unplaceable($0, bundleID: "com.example.unserved-\($0)") }
                + (5..<10).map { Self.unplaceable($0, environment: "Made-Up-\($0)") }
            try await record(madeUp, in: fixture.store, at: start.addingTimeInterval(-86_400))
            try await record([Self.unplaceable(20)], in: fixture.store, at: start)
            for round in 1...(2 * RedemptionPlacementSchedule.maximumAttempts) {
                #expect(await placer.sweep() == (round <= RedemptionPlacementSchedule.maximumAttempts ? 1 : 0), "round \(round)")
                clock.now = clock.now.addingTimeInterval(86_400)
            }
            #expect(fake.requests.filter { $0.endpoint == .history }.count == RedemptionPlacementSchedule.maximumAttempts, "only the genuine row's subscription was asked about")
            #expect(fake.requests.allSatisfy { $0.transactionID == "700000020" }, "\(fake.requests.map(\.transactionID))")
            let left = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 100)
            #expect(left.count == 10 && left.allSatisfy { $0.placementAttempts == 0 && $0.dueAt < start }, "never counted nor moved")
            #expect(try await fixture.store.givenUpOfferRedemptions(limit: 10).map(\.redemption.candidate.transactionID) == ["800000020"])
            let exposition = String(decoding: metrics.exposition(), as: UTF8.self)
            #expect(!exposition.contains("unserved") && !exposition.contains("Made-Up"), "no series from the made-up rows")
            #expect(
                Self.lines(metrics, "offer_signer_redemption_placements_given_up_total")
                    == [#"offer_signer_redemption_placements_given_up_total{bundle_id="com.example.app",environment="Production"} 1"#])
            try await client.shutdown()
        }
    }

    @Test("A sweep pages through every due row, oldest due first, at most sweepLimit subscriptions; the next sweep goes on with the rest", arguments: StoreBackend.testedCases)
    func sweepsEveryPage(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in

            // 25 subscriptions, recorded a second apart; the second redemption of one subscription is asked about with it.
            for index in 0..<25 { try await record([Self.unplaceable(index)], in: fixture.store, at: start.addingTimeInterval(Double(index))) }
            var sibling = Self.unplaceable(30)
            sibling.originalTransactionID = Self.unplaceable(3).originalTransactionID
            try await record([sibling], in: fixture.store, at: start.addingTimeInterval(40))
            let now = start.addingTimeInterval(60)
            let clock = ManualClock(now)

            let (bounded, boundedClient) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock, sweepLimit: 7, sweepPageSize: 4)
            #expect(await bounded.sweep() == 7)
            var due = try await fixture.store.dueUnplacedOfferRedemptions(at: now, after: .start, limit: 100)
            #expect(due.map(\.redemption.candidate.transactionID) == (7..<25).map { "\(800_000_000 + $0)" }, "the oldest 7 (and #3's sibling) were asked about")

            let (paging, pagingClient) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock, sweepLimit: 100, sweepPageSize: 4)
            #expect(await paging.sweep() == 18, "five pages")
            due = try await fixture.store.dueUnplacedOfferRedemptions(at: now, after: .start, limit: 100)
            #expect(due.isEmpty)
            let all = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 100)
            #expect(all.count == 26 && all.allSatisfy { $0.placementAttempts == 1 })
            try await boundedClient.shutdown()
            try await pagingClient.shutdown()
        }
    }

    @Test("A new redemption is asked about before 520 older rows asked about before, and is placed", arguments: StoreBackend.testedCases)
    func newerPlacedDespiteOlderUnplaceable(backend: StoreBackend) async throws {
        let placement = try RedemptionPlacementTests()
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        fake.add(try placement.customer())
        try await StoreFixture.with(backend) { fixture in
            try await fake.run { port in
                let root = try placement.chain.root.serializeAsPEM().pemString
                let clock = ManualClock(start)
                let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock)
                try await record((0..<520).map { Self.unplaceable($0) }, in: fixture.store, at: start.addingTimeInterval(-86400))
                #expect(await placer.sweep() == 520)
                // 16 min on: all 520 are due again (since 1 min ago); the new one was recorded later than that.
                clock.now = start.addingTimeInterval(960)
                // The renewal under the one-week free offer, its previous (annual) period unknown to the store.
                let offer = placement.transaction(2)
                let newer = RedemptionCandidate(
                    transactionID: offer["transactionId"] as? String ?? "", originalTransactionID: RedemptionPlacementTests.original, bundleID: Self.bundleID,
                    environment: "Production", productID: "pro.annual", offerID: "free_week", appAccountToken: RedemptionPlacementTests.token,
                    purchaseDate: placement.renewal, signatureWindowStart: placement.renewal.addingTimeInterval(-8 * 86400), isPlaced: false)
                try await record([newer], in: fixture.store, at: start.addingTimeInterval(959))
                let due = try await fixture.store.dueUnplacedOfferRedemptions(at: clock.now, after: .start, limit: 1000)
                #expect(due.count == 521 && due.first?.redemption.candidate.offerID == "free_week", "never asked: first")

                // A sweep that may ask about one subscription asks about the new one.
                let (one, oneClient) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock, sweepLimit: 1)
                #expect(await one.sweep() == 1)
                let stored = try await fixture.store.offerRedemptions(since: nil)
                let placed = try #require(stored.first { $0.candidate.offerID == "free_week" })
                #expect(placed.state != .unplaced && placed.placedAt != nil, "placed by Apple's history")
                #expect(try await fixture.store.unplacedOfferRedemptions(limit: 1000).count == 520)
                #expect(try await fixture.store.dueUnplacedOfferRedemptions(at: clock.now, after: .start, limit: 1000).count == 520)
                try await client.shutdown()
                try await oneClient.shutdown()
            }
        }
    }
}
