import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import OfferSignerCore
import OfferSignerStorage
import SwiftASN1
import Testing

@testable import OfferSignerServer

/// The unplaced-redemption sweep against rows a database writer made and against Apple errors
/// about this service's own configuration (SQLite and PostgreSQL): only Apple's statements about
/// the customer's transaction count, rows that cannot be asked never take the sweep's places,
/// stored attempt counts never trap, and row values are escaped in logs.
extension RedemptionPlacementScheduleTests {
    @Test(
        "Only Apple's statements about the transaction count (4040010, 4040001, 4000006, an ID that cannot go in a path); errors about this service's configuration (4040003, 4000002, 403, a 404 without Apple's body) do not",
        arguments: StoreBackend.testedCases)
    func onlyStatementsAboutTheTransactionCount(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let clock = ManualClock(start)
            let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock)
            // Apple's answer (nil: the fake's own 404 4040010), and whether it counts.
            let cases: [(FakeAppStoreServerAPI.Fault?, Bool, String)] = [
                (nil, true, "4040010 TransactionIdNotFoundError"),
                (.status(404, errorCode: 4_040_001), true, "4040001 AccountNotFoundError"),
                (.status(400, errorCode: 4_000_006), true, "4000006 InvalidTransactionIdError"),
                (.status(404, errorCode: 4_040_003), false, "4040003 AppNotFoundError"),
                (.status(400, errorCode: 4_000_002), false, "4000002 InvalidAppIdentifierError"),
                (.status(403), false, "403"),
                (.status(404), false, "404 without Apple's error body"),
            ]
            try await record(cases.indices.map { Self.unplaceable($0) }, in: fixture.store, at: start)
            for (index, (fault, counts, name)) in cases.enumerated() {
                fake.always(.history, fault)
                let candidate = Self.unplaceable(index)
                await placer.attempt(AppleSubscriptionKey(bundleID: Self.bundleID, environment: "Production", originalTransactionID: candidate.originalTransactionID))
                let row = try #require(
                    try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 100).first { $0.redemption.candidate.transactionID == candidate.transactionID })
                #expect(row.placementAttempts == (counts ? 1 : 0), "\(name)")
                #expect(row.dueAt == start.addingTimeInterval(900), "\(name): moved the first step on either way")
            }
            #expect(fake.requests.filter { $0.endpoint == .history }.count == cases.count, "each asked once (4xx are not retried)")
            fake.always(.history, nil)

            // An original transaction ID that cannot be put in a request path: Apple's word would be 4000006; never sent.
            var unsafe = Self.unplaceable(50)
            unsafe.originalTransactionID = "../7000"
            try await record([unsafe], in: fixture.store, at: start)
            let asked = fake.requests.count
            await placer.attempt(AppleSubscriptionKey(bundleID: Self.bundleID, environment: "Production", originalTransactionID: unsafe.originalTransactionID))
            #expect(fake.requests.count == asked, "not sent to Apple")
            let row = try #require(try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 100).first { $0.redemption.candidate.transactionID == unsafe.transactionID })
            #expect(row.placementAttempts == 1)
            try await client.shutdown()
        }
    }

    @Test("The classification: only transaction_not_found and rejected with 4040001 or 4000006 are Apple's answer")
    func answerClassification() {
        #expect(RedemptionPlacer.answer(HistoryUnavailable(.transactionNotFound, "")) == .answered)
        #expect(RedemptionPlacer.answer(HistoryUnavailable(.rejected, "", appleErrorCode: 4_040_001)) == .answered)
        #expect(RedemptionPlacer.answer(HistoryUnavailable(.rejected, "", appleErrorCode: 4_000_006)) == .answered)
        for code in [nil, 4_040_003, 4_000_002, 4_000_005, 4_030_000] as [Int?] {
            #expect(RedemptionPlacer.answer(HistoryUnavailable(.rejected, "", appleErrorCode: code)) == .notAnswered, "\(String(describing: code))")
        }
        for reason in HistoryUnavailable.Reason.allCases where reason != .transactionNotFound {
            #expect(RedemptionPlacer.answer(HistoryUnavailable(reason, "")) == .notAnswered, "\(reason)")
        }
    }

    @Test(
        "1,000 rows that cannot be asked (an environment the served app does not accept) take none of the sweep's places: a genuine row asked before is retried in the next sweep; they move a day on",
        arguments: StoreBackend.testedCases)
    func unaskableRowsDoNotFillTheSweep(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let metrics = ServerMetrics()
            let clock = ManualClock(start)
            // Twice one sweep's limit (kept small so the test is quick; the default is 2,000).
            let (placer, client) = try Self.placer(
                fixture.store, port: port, key: key, root: root, clock: clock, metrics: metrics, sweepLimit: 500)
            let genuine = Self.unplaceable(0)
            try await record([genuine], in: fixture.store, at: start)
            #expect(await placer.sweep() == 1)
            // A writer's rows: never asked about (attempts 0, so first in the sweep's order), due since yesterday, in Sandbox,
            // which the catalog's app does not accept; more than one sweep's 500 subscriptions.
            let unaskable = (1...1000).map { Self.unplaceable($0, environment: "Sandbox") }
            try await record(unaskable, in: fixture.store, at: start.addingTimeInterval(-86_400))
            clock.now = start.addingTimeInterval(900)
            #expect(await placer.sweep() == 1, "only the genuine row is asked about")
            let due = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 2000)
            let row = try #require(due.first { $0.redemption.candidate.transactionID == genuine.transactionID })
            #expect(row.placementAttempts == 2, "retried: its second attempt")
            let moved = due.filter { $0.redemption.candidate.environment == "Sandbox" }
            #expect(moved.count == 1000 && moved.allSatisfy { $0.placementAttempts == 0 && $0.dueAt == clock.now.addingTimeInterval(86_400) }, "moved a day on")
            #expect(fake.requests.allSatisfy { $0.transactionID == genuine.originalTransactionID && $0.environment == "Production" })
            // The next sweep does not read them again: only the genuine row is due before tomorrow.
            clock.now = row.dueAt
            #expect(try await fixture.store.dueUnplacedOfferRedemptions(at: clock.now, after: .start, limit: 2000).map(\.redemption.candidate.transactionID) == [genuine.transactionID])
            #expect(await placer.sweep() == 1)
            #expect(Self.lines(metrics, "redemption_placement_lookups_total").contains { $0.contains(#"outcome="environment_not_accepted""#) })
            try await client.shutdown()
        }
    }

    @Test(
        "Rows that cannot be asked (no credentials, an environment the app does not accept) are never sent to Apple, count nothing, move a day on, and are given up 30 days after they were recorded",
        arguments: StoreBackend.testedCases)
    func unaskableRowsGivenUpAfterMaximumAge(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let metrics = ServerMetrics()
            let clock = ManualClock(start)
            // No issuer ID: no credentials for the Production row; the catalog's app does not accept Sandbox.
            let (placer, client) = try Self.placer(
                fixture.store, port: port, key: key, root: root, clock: clock, metrics: metrics, issuerID: "")
            try await record([Self.unplaceable(1), Self.unplaceable(2, environment: "Sandbox")], in: fixture.store, at: start)
            let days = Int(RedemptionPlacementSchedule.maximumAge / 86_400)
            for day in 0..<days {
                #expect(await placer.sweep() == 0, "day \(day): nothing asked")
                let rows = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10)
                #expect(rows.count == 2 && rows.allSatisfy { $0.placementAttempts == 0 }, "day \(day): nothing counted")
                #expect(rows.allSatisfy { $0.dueAt == clock.now.addingTimeInterval(86_400) }, "day \(day): moved a day on")
                clock.now = clock.now.addingTimeInterval(86_400)
            }
            #expect(try await fixture.store.givenUpOfferRedemptions(limit: 10).isEmpty)
            #expect(await placer.sweep() == 0)
            #expect(try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10).isEmpty, "30 days after recorded: given up")
            #expect(Set(try await fixture.store.givenUpOfferRedemptions(limit: 10).map(\.redemption.candidate.transactionID)) == ["800000001", "800000002"])
            #expect(fake.arrivals == 0, "Apple was never asked")
            let givenUp = Self.lines(metrics, "offer_signer_redemption_placements_given_up_total")
            #expect(givenUp.count == 2 && givenUp.allSatisfy { $0.hasSuffix(" 1") }, "\(givenUp)")
            let lookups = Self.lines(metrics, "redemption_placement_lookups_total")
            #expect(lookups.contains { $0.contains(#"outcome="no_credentials""#) } && lookups.contains { $0.contains(#"outcome="environment_not_accepted""#) }, "\(lookups)")
            try await client.shutdown()
        }
    }

    @Test("A stored attempt count of Int64.min, a negative one or a huge one never traps the sweep: negative rows are not asked about, huge ones read as given up", arguments: StoreBackend.testedCases)
    func storedAttemptCountsNeverTrap(backend: StoreBackend) async throws {
        try await withStoreAndAPI(backend) { fixture, fake, port, key, root in
            let clock = ManualClock(start)
            let (placer, client) = try Self.placer(fixture.store, port: port, key: key, root: root, clock: clock)
            try await record((1...4).map { Self.unplaceable($0) }, in: fixture.store, at: start)
            try await fixture.execute("UPDATE offer_redemptions SET placement_attempts = \(Int64.min) WHERE transaction_id = '800000001'")
            try await fixture.execute("UPDATE offer_redemptions SET placement_attempts = -1 WHERE transaction_id = '800000002'")
            try await fixture.execute("UPDATE offer_redemptions SET placement_attempts = \(Int64.max) WHERE transaction_id = '800000003'")
            #expect(await placer.sweep() == 1, "only the untouched row")
            let due = try await fixture.store.dueUnplacedOfferRedemptions(at: far, after: .start, limit: 10)
            #expect(due.map(\.redemption.candidate.transactionID) == ["800000004"] && due.first?.placementAttempts == 1)
            let givenUp = try await fixture.store.givenUpOfferRedemptions(limit: 10)
            #expect(givenUp.map(\.redemption.candidate.transactionID) == ["800000003"] && givenUp.first?.placementAttempts == RedemptionPlacementSchedule.maximumAttempts)
            // Recording an attempt on them changes nothing (not askable) and never traps.
            for index in 1...3 {
                let original = Self.unplaceable(index).originalTransactionID
                for outcome in [RedemptionPlacementOutcome.answered, .notAnswered, .notAskable] {
                    let changed = try await fixture.store.recordRedemptionPlacementAttempt(
                        AppleSubscriptionKey(bundleID: Self.bundleID, environment: "Production", originalTransactionID: original), at: far, outcome: outcome,
                        schedule: RedemptionPlacementSchedule(firstRetry: 900))
                    #expect(changed.isEmpty)
                }
            }
            try await client.shutdown()
        }
    }

    @Test("The schedule clamps any stored attempt count and never traps on extremes")
    func scheduleClamps() {
        let schedule = RedemptionPlacementSchedule(firstRetry: 900)
        let time = Date(timeIntervalSince1970: 1_800_000_000)
        #expect(RedemptionPlacementSchedule.clampedAttempts(Int64.min) == 0)
        #expect(RedemptionPlacementSchedule.clampedAttempts(-1) == 0)
        #expect(RedemptionPlacementSchedule.clampedAttempts(Int64.max) == RedemptionPlacementSchedule.maximumAttempts)
        #expect(schedule.nextAttempt(uncountedAfter: Int.min, at: time) == time.addingTimeInterval(900))
        #expect(schedule.nextAttempt(uncountedAfter: Int.max, at: time) == time.addingTimeInterval(86_400))
        #expect(schedule.nextAttempt(afterAttempts: Int.min, at: time) == time.addingTimeInterval(900))
        #expect(schedule.nextAttempt(afterAttempts: Int.max, at: time) == nil)
        let fromMin = schedule.afterAsk(.answered, attempts: Int.min, recordedAt: time, at: time)
        #expect(fromMin.attempts == 1 && fromMin.nextAt == time.addingTimeInterval(900) && !fromMin.givenUp)
        let fromMax = schedule.afterAsk(.answered, attempts: Int.max, recordedAt: time, at: time)
        #expect(fromMax.attempts == RedemptionPlacementSchedule.maximumAttempts && fromMax.givenUp)
        let old = schedule.afterAsk(.notAnswered, attempts: 3, recordedAt: time.addingTimeInterval(-RedemptionPlacementSchedule.maximumAge), at: time)
        #expect(old.attempts == RedemptionPlacementSchedule.maximumAttempts && old.givenUp, "not answered 30 days after recorded: given up")
        let young = schedule.afterAsk(.notAskable, attempts: 0, recordedAt: time.addingTimeInterval(-86_400), at: time)
        #expect(young.attempts == 0 && young.nextAt == time.addingTimeInterval(86_400) && !young.givenUp)
        // Not answered: the counted step, or an eighth of the row's age when longer (at most a day).
        let fresh = schedule.afterAsk(.notAnswered, attempts: 0, recordedAt: time, at: time)
        #expect(fresh.attempts == 0 && fresh.nextAt == time.addingTimeInterval(900) && !fresh.givenUp)
        let dayOld = schedule.afterAsk(.notAnswered, attempts: 0, recordedAt: time.addingTimeInterval(-86_400), at: time)
        #expect(dayOld.attempts == 0 && dayOld.nextAt == time.addingTimeInterval(86_400 / 8))
        let weekOld = schedule.afterAsk(.notAnswered, attempts: 0, recordedAt: time.addingTimeInterval(-8 * 86_400), at: time)
        #expect(weekOld.nextAt == time.addingTimeInterval(86_400), "at most a day")
        // Over the 30 days, a row that never draws an answer is asked a few dozen times, not 2,880.
        var asks = 0
        var at = time
        while !schedule.afterAsk(.notAnswered, attempts: 0, recordedAt: time, at: at).givenUp {
            at = schedule.afterAsk(.notAnswered, attempts: 0, recordedAt: time, at: at).nextAt
            asks += 1
        }
        #expect(asks < 80, "\(asks) asks")
    }

    @Test("Row values in warnings are cut and their control characters escaped (no forged log lines)")
    func loggableEscapes() {
        #expect(RedemptionPlacer.loggable("com.example.app", limit: 100) == "com.example.app")
        #expect(RedemptionPlacer.loggable("a\nlevel=critical\u{1B}[31m\r\t\\", limit: 100) == #"a\u{a}level=critical\u{1b}[31m\u{d}\u{9}\\"#)
        #expect(RedemptionPlacer.loggable("x\u{2028}y\u{202E}z\u{0}", limit: 100) == #"x\u{2028}y\u{202e}z\u{0}"#)
        #expect(RedemptionPlacer.loggable(String(repeating: "\n", count: 50), limit: 20) == String(repeating: #"\u{a}"#, count: 20))
    }
}
