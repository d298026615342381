import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage
import SwiftASN1
import Testing

@testable import OfferSignerServer

/// The unplaced-redemption sweep on SQLite and PostgreSQL (``RedemptionPlacementSchedule``): rows
/// that cannot be placed back off and stop at the cap, every due row is reached a page at a time,
/// and a newer placeable row is placed however many older ones cannot be.
@Suite("Unplaced redemptions: attempts, back-off, cap and paging", .serialized)
struct RedemptionPlacementScheduleTests {
    static let bundleID = AppleNotificationTests.bundleID
    /// A whole millisecond, so due times compare exactly.
    let start = Date(timeIntervalSince1970: (Date().timeIntervalSince1970).rounded(.down))
    let far = Date().addingTimeInterval(10 * 365 * 86400)

    /// A redemption the store records `unplaced`; in Sandbox, which the catalog's app does not
    /// accept, so Apple is never asked about it and it can never be placed.
    static func unplaceable(_ index: Int, environment: String = "Sandbox") -> RedemptionCandidate {
        RedemptionCandidate(
            transactionID: "\(800_000_000 + index)", originalTransactionID: "\(700_000_000 + index)", bundleID: bundleID, environment: environment,
            productID: "pro.monthly", offerID: "winback_1", appAccountToken: nil, purchaseDate: Date(timeIntervalSince1970: 1_790_000_000),
            isPlaced: false)
    }

    /// A placer over `store` whose Apple is the fake on `port`.
    static func placer(
        _ store: any OfferSignerStore, port: Int, key: InAppPurchaseKey, root: String, metrics: ServerMetrics = ServerMetrics(),
        sweepLimit: Int = 2000, sweepPageSize: Int = 500
    ) throws -> (RedemptionPlacer, AppStoreServerAPIClient) {
        var eligibility = try EligibilityConfiguration(catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
        eligibility.appStoreServerAPI.timeBudget = .seconds(30)
        let logger = Logger(label: "placement-test")
        let client = try AppStoreServerAPIClient(configuration: eligibility.appStoreServerAPI, trustedRoots: eligibility.trustedRoots, metrics: .none, logger: logger)
        let placer = RedemptionPlacer(
            store: store, client: client, catalog: eligibility.catalog,
            credentials: { AppStoreServerAPICredentials(key: key, issuerID: TestServer.issuerID, bundleID: $0) }, metrics: metrics, logger: logger,
            retryInterval: .seconds(900), sweepLimit: sweepLimit, sweepPageSize: sweepPageSize)
        return (placer, client)
    }

    func record(_ candidates: [RedemptionCandidate], in store: any OfferSignerStore, at time: Date) async throws {
        guard case .recorded(let recorded) = try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: candidates, source: "notification"), at: time) else {
            Issue.record("not recorded")
            return
        }
        #expect(recorded.allSatisfy { $0.state == .unplaced })
    }

    @Test("A redemption that cannot be placed is asked about again after 15 min, 30 min, 1 h, … at most a day apart, and no more after the cap: unplaced and counted", arguments: StoreBackend.testedCases)
    func backsOffAndStopsAtTheCap(backend: StoreBackend) async throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let chain = try TestAppleChain()
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        try await StoreFixture.with(backend) { fixture in
            try await fake.run { port in
                let metrics = ServerMetrics()
                let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: try chain.root.serializeAsPEM().pemString, metrics: metrics)
                try await record([Self.unplaceable(1)], in: fixture.store, at: start)
                var now = start
                var waits: [TimeInterval] = []
                for attempt in 1...RedemptionPlacementSchedule.maximumAttempts {
                    #expect(await placer.sweep(now: now) == 1, "attempt \(attempt) is due")
                    let rows = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10)
                    guard attempt < RedemptionPlacementSchedule.maximumAttempts else {
                        #expect(rows.isEmpty, "given up: no longer due, ever")
                        break
                    }
                    let row = try #require(rows.first)
                    #expect(row.placementAttempts == attempt)
                    waits.append(row.dueAt.timeIntervalSince(now))
                    #expect(await placer.sweep(now: row.dueAt.addingTimeInterval(-1)) == 0, "not due before its time")
                    now = row.dueAt
                }
                #expect(waits == [900, 1800, 3600, 7200, 14_400, 28_800, 57_600, 86_400, 86_400])
                #expect(await placer.sweep(now: far) == 0)
                let givenUp = try await fixture.store.givenUpOfferRedemptions(limit: 10)
                #expect(givenUp.map(\.redemption.candidate.transactionID) == ["800000001"])
                #expect(givenUp.first?.placementAttempts == RedemptionPlacementSchedule.maximumAttempts)
                // Still unplaced, reported as such.
                #expect(try await fixture.store.offerRedemptions(since: nil).map(\.state) == [.unplaced])
                #expect(try await fixture.store.unplacedOfferRedemptions(limit: 10).count == 1)
                let exposition = String(decoding: metrics.exposition(), as: UTF8.self)
                let line = exposition.split(separator: "\n").first { $0.hasPrefix("offer_signer_redemption_placements_given_up_total{") }
                #expect(line?.contains(#"environment="Sandbox""#) == true && line?.hasSuffix(" 1") == true, "\(String(describing: line))")
                try await client.shutdown()
            }
        }
    }

    @Test("A sweep pages through every due row, oldest due first, at most sweepLimit subscriptions; the next sweep goes on with the rest", arguments: StoreBackend.testedCases)
    func sweepsEveryPage(backend: StoreBackend) async throws {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let chain = try TestAppleChain()
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        try await StoreFixture.with(backend) { fixture in
            try await fake.run { port in
                let root = try chain.root.serializeAsPEM().pemString
                // 25 subscriptions, recorded a second apart; the second redemption of one subscription is asked about with it.
                for index in 0..<25 { try await record([Self.unplaceable(index)], in: fixture.store, at: start.addingTimeInterval(Double(index))) }
                var sibling = Self.unplaceable(30)
                sibling.originalTransactionID = Self.unplaceable(3).originalTransactionID
                try await record([sibling], in: fixture.store, at: start.addingTimeInterval(40))
                let now = start.addingTimeInterval(60)

                let (bounded, boundedClient) = try Self.placer(fixture.store, port: port, key: key, root: root, sweepLimit: 7, sweepPageSize: 4)
                #expect(await bounded.sweep(now: now) == 7)
                var due = try await fixture.store.dueUnplacedOfferRedemptions(at: now, after: .start, limit: 100)
                #expect(due.map(\.redemption.candidate.transactionID) == (7..<25).map { "\(800_000_000 + $0)" }, "the oldest 7 (and #3's sibling) were asked about")

                let (paging, pagingClient) = try Self.placer(fixture.store, port: port, key: key, root: root, sweepLimit: 100, sweepPageSize: 4)
                #expect(await paging.sweep(now: now) == 18, "five pages")
                due = try await fixture.store.dueUnplacedOfferRedemptions(at: now, after: .start, limit: 100)
                #expect(due.isEmpty)
                let all = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 100)
                #expect(all.count == 26 && all.allSatisfy { $0.placementAttempts == 1 })
                try await boundedClient.shutdown()
                try await pagingClient.shutdown()
            }
        }
    }

    @Test("A newer redemption Apple can place is placed in the same sweep as 520 older ones that cannot be", arguments: StoreBackend.testedCases)
    func newerPlacedDespiteOlderUnplaceable(backend: StoreBackend) async throws {
        let placement = try RedemptionPlacementTests()
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY001")
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        fake.add(try placement.customer())
        try await StoreFixture.with(backend) { fixture in
            try await fake.run { port in
                let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: try placement.chain.root.serializeAsPEM().pemString)
                try await record((0..<520).map { Self.unplaceable($0) }, in: fixture.store, at: start.addingTimeInterval(-86400))
                // The renewal under the one-week free offer, its previous (annual) period unknown to the store.
                let offer = placement.transaction(2)
                let newer = RedemptionCandidate(
                    transactionID: offer["transactionId"] as? String ?? "", originalTransactionID: RedemptionPlacementTests.original, bundleID: Self.bundleID,
                    environment: "Production", productID: "pro.annual", offerID: "free_week", appAccountToken: RedemptionPlacementTests.token,
                    purchaseDate: placement.renewal, signatureWindowStart: placement.renewal.addingTimeInterval(-8 * 86400), isPlaced: false)
                try await record([newer], in: fixture.store, at: start.addingTimeInterval(-3600))

                #expect(await placer.sweep(now: start) == 521)
                let stored = try await fixture.store.offerRedemptions(since: nil)
                let placed = try #require(stored.first { $0.candidate.offerID == "free_week" })
                #expect(placed.state != .unplaced && placed.placedAt != nil, "placed by Apple's history")
                #expect(try await fixture.store.unplacedOfferRedemptions(limit: 1000).count == 520)
                #expect(fake.requests.count >= 1)
                // All backed off: the next sweep at the same time asks nothing.
                #expect(await placer.sweep(now: start) == 0)
                try await client.shutdown()
            }
        }
    }
}
