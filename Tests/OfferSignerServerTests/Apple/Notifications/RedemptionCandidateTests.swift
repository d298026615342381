import AppStoreServerAPI
import Foundation
import OfferSignerEligibility
import OfferSignerStorage
import Testing

@testable import OfferSignerEvidence
@testable import OfferSignerServer

/// Which promotional-offer transactions are redemptions, and where each one's signature may be
/// (the rule of `AppleHistoryConversion.redemption(_:known:)`), for a fetched history and for
/// a notification's transaction placed against what the store holds.
@Suite("Redemption candidates placed by the period before them")
struct RedemptionCandidateTests {
    static let day: TimeInterval = 86400
    static let start = Date(timeIntervalSince1970: 1_790_000_000)

    /// Monthly period `index` (30 days each, from `start`), shifted by `shiftDays`.
    static func period(
        _ index: Int, offer: String? = nil, discount: AppleOfferDiscountType? = .payAsYouGo, reason: AppleTransactionReason? = .renewal,
        shiftDays: Double = 0, productID: String = "pro.monthly", offerPeriod: String? = nil
    ) -> VerifiedTransaction {
        let begin = start.addingTimeInterval(Double(index) * 30 * day + shiftDays * day)
        return VerifiedTransaction(
            transactionID: "50000\(index)", originalTransactionID: "500000", productID: productID, subscriptionGroupID: "G1",
            purchaseDate: begin, expiresDate: begin.addingTimeInterval(30 * day), offerType: offer == nil ? nil : .promotional, offerIdentifier: offer,
            offerDiscountType: offer == nil ? nil : discount, offerPeriod: offer == nil ? nil : offerPeriod, environment: .production,
            bundleID: "com.example.app",
            appAccountToken: "7E3FB20B-4CDB-47CC-936D-99D65F608138", transactionReason: index == 0 ? .purchase : reason)
    }

    /// The candidates of a fetched history holding `transactions`, by transaction ID.
    static func fromHistory(_ transactions: [VerifiedTransaction]) -> [String: RedemptionCandidate] {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: start)
        for transaction in transactions.reversed() { _ = history.record(transaction, jws: "") }
        let update = AppleHistoryConversion.update(history)
        return Dictionary(uniqueKeysWithValues: update.redemptions.map { ($0.transactionID, $0) })
    }

    static func window(from date: Date) -> Date { date.addingTimeInterval(-day) }

    @Test("An offer that begins at a renewal may have been signed during the period before; its pay-as-you-go periods continue it")
    func renewalStartThenContinuation() throws {
        let found = Self.fromHistory([Self.period(0), Self.period(1), Self.period(2, offer: "promo_50"), Self.period(3, offer: "promo_50")])
        #expect(found.keys.sorted() == ["500002", "500003"])
        let began = try #require(found["500002"])
        #expect(!began.continuesRedemption)
        #expect(began.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        #expect(began.appAccountToken == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        let continued = try #require(found["500003"])
        #expect(continued.continuesRedemption)
        #expect(continued.signatureWindowStart == Self.window(from: continued.purchaseDate))
    }

    @Test("The same offer at a renewal that is not pay as you go is a new redemption, as the eligibility count has it")
    func notPayAsYouGo() throws {
        let found = Self.fromHistory([
            Self.period(0), Self.period(1, offer: "promo_50", discount: AppleOfferDiscountType(rawValue: "PAY_UP_FRONT")),
            Self.period(2, offer: "promo_50", discount: AppleOfferDiscountType(rawValue: "PAY_UP_FRONT")),
        ])
        let again = try #require(found["500002"])
        #expect(!again.continuesRedemption)
        #expect(again.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
    }

    @Test("Purchases are redeemed when bought: a resubscription soon after a lapse, an upgrade, a first purchase")
    func purchases() throws {
        // Resubscribed 20 days after the last period ended, with the offer that period had.
        let resubscribed = try #require(
            Self.fromHistory([Self.period(0), Self.period(1, offer: "promo_50"), Self.period(2, offer: "promo_50", reason: .purchase, shiftDays: 20)])["500002"])
        #expect(!resubscribed.continuesRedemption)
        #expect(resubscribed.signatureWindowStart == Self.window(from: resubscribed.purchaseDate))

        // An immediate upgrade in the middle of a period under the offer, with the same offer ID.
        let upgraded = try #require(
            Self.fromHistory([Self.period(0, offer: "promo_50"), Self.period(1, offer: "promo_50", reason: .purchase, shiftDays: -12, productID: "pro.annual")])["500001"])
        #expect(!upgraded.continuesRedemption)
        #expect(upgraded.signatureWindowStart == Self.window(from: upgraded.purchaseDate))

        let first = try #require(Self.fromHistory([Self.period(0, offer: "promo_50")])["500000"])
        #expect(!first.continuesRedemption)
        #expect(first.signatureWindowStart == Self.window(from: first.purchaseDate))
    }

    @Test("Without a transactionReason, a period that began where the one before ended is a renewal")
    func noReason() throws {
        let found = Self.fromHistory([Self.period(0), Self.period(1, reason: nil), Self.period(2, offer: "promo_50", reason: nil)])
        #expect(try #require(found["500002"]).signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        let afterGap = try #require(Self.fromHistory([Self.period(0), Self.period(2, offer: "promo_50", reason: nil)])["500002"])
        #expect(afterGap.signatureWindowStart == Self.window(from: afterGap.purchaseDate), "no period ended where it began: a purchase")
    }

    @Test("A renewal whose previous period is not known: that period is taken to be as long as this one; a pay-as-you-go one may continue a redemption")
    func previousPeriodMissing() throws {
        // What the store holds for a notification: periods 0 and 1; period 2 never arrived.
        let known = [Self.period(0), Self.period(1)]
        // Period 1 ended 30 days before period 3 began, within a billing retry: the offer was
        // redeemed during it or during the lost period 2, so no earlier than period 1's start.
        let payAsYouGo = try #require(AppleHistoryConversion.redemption(Self.period(3, offer: "promo_50"), known: known))
        #expect(payAsYouGo.continuesRedemption)
        #expect(payAsYouGo.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        let upFront = try #require(
            AppleHistoryConversion.redemption(Self.period(3, offer: "promo_50", discount: AppleOfferDiscountType(rawValue: "PAY_UP_FRONT")), known: known))
        #expect(!upFront.continuesRedemption)
        #expect(upFront.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        #expect(AppleHistoryConversion.redemption(Self.period(3), known: known) == nil)
        // Nothing known within a billing retry: the missing period is taken to be as long as this one.
        let alone = try #require(AppleHistoryConversion.redemption(Self.period(4, offer: "promo_50"), known: [Self.period(0)]))
        #expect(alone.signatureWindowStart == Self.window(from: Self.period(3).purchaseDate))
        // Each is an estimate, not Apple's word: not placed (recorded unplaced when no signature matches).
        #expect([payAsYouGo, upFront, alone].allSatisfy { !$0.isPlaced })
        // A fetched history holding every period places them.
        let whole = Self.fromHistory([Self.period(0), Self.period(1), Self.period(2), Self.period(3, offer: "promo_50")])
        #expect(try #require(whole["500003"]).isPlaced)
    }

    @Test("A filtered answer of Apple's API marks complete only the subscriptions of the groups it holds whole (AUTO_RENEWABLE and that subscriptionGroupIdentifier)")
    func filteredHistoryIsCompleteForItsGroupOnly() {
        var history = VerifiedHistory(bundleID: "com.example.app", environment: .production, asOf: Self.start)
        for transaction in [Self.period(0), Self.period(1)] { _ = history.record(transaction, jws: "") }
        #expect(AppleHistoryConversion.update(history).completeSubscriptions.count == 1)
        history.isFiltered = true
        let update = AppleHistoryConversion.update(history)
        #expect(update.completeSubscriptions.isEmpty, "a filter that holds no group whole")
        #expect(update.subscriptions.count == 1 && update.transactions.count == 2)
        history.wholeSubscriptionGroups = HistoryFilter.subscriptionGroup("G1").wholeSubscriptionGroups
        #expect(AppleHistoryConversion.update(history).completeSubscriptions.map(\.originalTransactionID) == ["500000"])
        history.wholeSubscriptionGroups = HistoryFilter.subscriptionGroup("G2").wholeSubscriptionGroups
        #expect(AppleHistoryConversion.update(history).completeSubscriptions.isEmpty, "the G1 subscription is not whole under a G2 filter")
        #expect(HistoryFilter(productTypes: ["CONSUMABLE"], subscriptionGroupIdentifiers: ["G1"]).wholeSubscriptionGroups.isEmpty)
        #expect(HistoryFilter(productTypes: ["AUTO_RENEWABLE"]).wholeSubscriptionGroups.isEmpty)
        #expect(HistoryFilter(subscriptionGroupIdentifiers: ["G1", "G3"]).wholeSubscriptionGroups == ["G1", "G3"])
    }

    @Test("A one-week free offer on an annual product (offerPeriod P1W, FREE_TRIAL): alone, the estimate is a week; Apple's history places it in the year before")
    func oneWeekFreeOnAnnual() throws {
        let renewal = Self.start.addingTimeInterval(730 * Self.day)
        func annual(_ index: Int) -> VerifiedTransaction {
            let begin = renewal.addingTimeInterval(Double(index - 2) * 365 * Self.day)
            return VerifiedTransaction(
                transactionID: "70000\(index)", originalTransactionID: "700000", productID: "pro.annual", subscriptionGroupID: "G2", purchaseDate: begin,
                expiresDate: begin.addingTimeInterval(365 * Self.day), environment: .production, bundleID: "com.example.app",
                appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138", transactionReason: index == 0 ? .purchase : .renewal)
        }
        let freeWeek = VerifiedTransaction(
            transactionID: "700002", originalTransactionID: "700000", productID: "pro.annual", subscriptionGroupID: "G2", purchaseDate: renewal,
            expiresDate: renewal.addingTimeInterval(7 * Self.day), offerType: .promotional, offerIdentifier: "free_week", offerDiscountType: .freeTrial,
            environment: .production, bundleID: "com.example.app", appAccountToken: "7e3fb20b-4cdb-47cc-936d-99d65f608138", transactionReason: .renewal)
        let estimated = try #require(AppleHistoryConversion.redemption(freeWeek, known: []))
        #expect(!estimated.isPlaced)
        #expect(estimated.signatureWindowStart == Self.window(from: renewal.addingTimeInterval(-7 * Self.day)), "a week: the offer's own period")
        let placed = try #require(Self.fromHistory([annual(0), annual(1), freeWeek])["700002"])
        #expect(placed.isPlaced && !placed.continuesRedemption)
        #expect(placed.signatureWindowStart == Self.window(from: annual(1).purchaseDate), "from the start of the year it was redeemed in")
    }

    @Test("A billing retry: in Apple's whole history (or with BILLING_RECOVERY) the period before the gap places the renewal; otherwise it is unknown")
    func billingRetry() throws {
        // Recovered ten days after the previous period ended, the pay-as-you-go offer going on.
        let recovered = Self.period(2, offer: "promo_50", shiftDays: 10)
        #expect(try #require(Self.fromHistory([Self.period(0), Self.period(1, offer: "promo_50"), recovered])["500002"]).continuesRedemption)
        #expect(try #require(AppleHistoryConversion.redemption(recovered, known: [Self.period(1, offer: "promo_50")], knownWhole: true)).continuesRedemption)
        // The offer began at the recovered renewal.
        let began = try #require(Self.fromHistory([Self.period(0), Self.period(1), recovered])["500002"])
        #expect(!began.continuesRedemption)
        #expect(began.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        // From a notification that is not a billing recovery, the gap may be a lost period: placed
        // by nothing, but its window still reaches back to the start of the period before the gap.
        let unknown = try #require(AppleHistoryConversion.redemption(recovered, known: [Self.period(0), Self.period(1)]))
        #expect(unknown.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
    }

    @Test("DID_RENEW / BILLING_RECOVERY on a subscription the store holds complete: the gap is the retry, so the offer began at this renewal")
    func billingRecoveryNotification() throws {
        // Pay as you go, beginning at a renewal recovered ten days after the last period ended.
        let recovered = Self.period(2, offer: "promo_50", shiftDays: 10)
        func update(subtype: String?, complete: Bool) -> RedemptionCandidate? {
            let notification = VerifiedNotification(
                notificationType: "DID_RENEW", subtype: subtype, notificationUUID: UUID().uuidString, signedDate: Self.start,
                bundleID: "com.example.app", environment: .production, appAppleID: nil,
                transaction: .init(value: recovered, jws: ""), renewalInfo: nil)
            return AppleHistoryConversion.update(
                notification, receivedAt: Self.start, known: [Self.period(0), Self.period(1)], knownIsComplete: complete
            ).redemptions.first
        }
        let placed = try #require(update(subtype: "BILLING_RECOVERY", complete: true))
        #expect(!placed.continuesRedemption, "a new redemption: recorded, matched or not")
        #expect(placed.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
        // Without the subtype, or on a subscription the store does not hold whole, the gap may be a
        // lost period that began the offer: recorded only if a signature matches.
        #expect(try #require(update(subtype: nil, complete: true)).continuesRedemption)
        #expect(try #require(update(subtype: "BILLING_RECOVERY", complete: false)).continuesRedemption)
    }

    @Test("A new product at renewal under the same offer ID begins a new redemption, signed during the period before")
    func crossgradeAtRenewal() throws {
        let found = Self.fromHistory([Self.period(0), Self.period(1, offer: "promo_50"), Self.period(2, offer: "promo_50", productID: "pro.annual")])
        let crossgrade = try #require(found["500002"])
        #expect(!crossgrade.continuesRedemption)
        #expect(crossgrade.signatureWindowStart == Self.window(from: Self.period(1).purchaseDate))
    }

    @Test("One rule with the eligibility count: a purchase never continues an offer; Sandbox's short periods follow only when adjacent")
    func sharedContinuationRule() {
        let previous = Self.period(1, offer: "promo_50")
        #expect(Self.period(2, offer: "promo_50").continuesPayAsYouGoOffer(of: previous, begunBy: previous, periodsBefore: 1))
        #expect(!Self.period(2, offer: "promo_50", reason: .purchase).continuesPayAsYouGoOffer(of: previous, begunBy: previous, periodsBefore: 1))
        #expect(!Self.period(2, offer: "promo_50", reason: nil, shiftDays: 10).continuesPayAsYouGoOffer(of: previous, begunBy: previous, periodsBefore: 1), "a gap without a reason is a lapse")
        #expect(Self.period(2, offer: "promo_50", shiftDays: 10).continuesPayAsYouGoOffer(of: previous, begunBy: previous, periodsBefore: 1), "a renewal after a billing retry")
        #expect(!Self.period(2, offer: "promo_50", shiftDays: 70).continuesPayAsYouGoOffer(of: previous, begunBy: previous, periodsBefore: 1), "longer than any billing retry")

        // Sandbox: five-minute periods; a renewal an hour after the last one heard of does not follow it.
        let sandboxStart = Self.start
        func sandboxPeriod(_ id: String, at offset: TimeInterval) -> VerifiedTransaction {
            VerifiedTransaction(
                transactionID: id, originalTransactionID: "600000", productID: "pro.monthly", purchaseDate: sandboxStart.addingTimeInterval(offset),
                expiresDate: sandboxStart.addingTimeInterval(offset + 300), offerType: .promotional, offerIdentifier: "promo_50",
                offerDiscountType: .payAsYouGo, environment: .sandbox, bundleID: "com.example.app", transactionReason: .renewal)
        }
        #expect(sandboxPeriod("b", at: 300).follows(sandboxPeriod("a", at: 0)))
        #expect(!sandboxPeriod("c", at: 3600).follows(sandboxPeriod("a", at: 0)))
    }

    @Test("A three-month pay-as-you-go offer (offerPeriod P3M) taken again for the renewal that ends its run is a new redemption, placed by the period before it")
    func payAsYouGoTakenAgain() throws {
        // Periods 1–3 are the first run, 4–6 the second: the same offer accepted again during period 3.
        let periods = [Self.period(0)] + (1...6).map { Self.period($0, offer: "promo_50", offerPeriod: "P3M") }
        let found = Self.fromHistory(periods)
        #expect(found.keys.sorted() == (1...6).map { "50000\($0)" })
        #expect(try #require(found["500001"]).continuesRedemption == false)
        #expect(try #require(found["500002"]).continuesRedemption && found["500003"]?.continuesRedemption == true)
        let again = try #require(found["500004"])
        #expect(!again.continuesRedemption, "begins at the end of the first run's three months: a new redemption")
        #expect(again.signatureWindowStart == Self.window(from: Self.period(3).purchaseDate), "signed during the run's last period")
        #expect(try #require(found["500005"]).continuesRedemption && found["500006"]?.continuesRedemption == true)
        // The same from a notification, placed against what the store holds.
        let notified = try #require(AppleHistoryConversion.redemption(periods[4], known: Array(periods[0...3])))
        #expect(notified.isPlaced && !notified.continuesRedemption)
        #expect(notified.signatureWindowStart == Self.window(from: Self.period(3).purchaseDate))
        let third = try #require(AppleHistoryConversion.redemption(periods[3], known: Array(periods[0...2])))
        #expect(third.isPlaced && third.continuesRedemption)
        // Without offerPeriod (older transactions): the rule from before, one redemption throughout.
        let undated = Self.fromHistory([Self.period(0)] + (1...6).map { Self.period($0, offer: "promo_50") })
        #expect((2...6).allSatisfy { undated["50000\($0)"]?.continuesRedemption == true })
    }

    @Test("A pay-as-you-go period whose run's first period the store never heard (held from the middle) is not placed; held complete, it continues")
    func payAsYouGoRunStartUnknown() throws {
        let periods = [Self.period(0)] + (1...6).map { Self.period($0, offer: "promo_50", offerPeriod: "P3M") }
        // The store heard the subscription from period 2 on: the run may have begun at period 1
        // and ended before period 4 (the offer taken again), or at period 2 (period 4 continues it).
        let fromMiddle = try #require(AppleHistoryConversion.redemption(periods[4], known: Array(periods[2...3])))
        #expect(!fromMiddle.isPlaced && fromMiddle.continuesRedemption, "recorded unplaced until Apple's history places it")
        #expect(fromMiddle.signatureWindowStart == Self.window(from: Self.period(3).purchaseDate))
        // Held complete, period 2 is the run's first: period 4 is within its three months.
        let complete = try #require(AppleHistoryConversion.redemption(periods[4], known: Array(periods[2...3]), knownComplete: true))
        #expect(complete.isPlaced && complete.continuesRedemption)
        // Held from the first purchase: period 4 begins a new run.
        let whole = try #require(AppleHistoryConversion.redemption(periods[4], known: Array(periods[0...3]), knownComplete: true))
        #expect(whole.isPlaced && !whole.continuesRedemption)
        // A run that cannot end (no readable offerPeriod, or outside Production: every renewal
        // under the offer continues it) is the run going on, placed, first period known or not.
        let undated = [Self.period(0)] + (1...6).map { Self.period($0, offer: "promo_50") }
        let withoutPeriod = try #require(AppleHistoryConversion.redemption(undated[4], known: Array(undated[2...3])))
        #expect(withoutPeriod.isPlaced && withoutPeriod.continuesRedemption)
        let sandbox = periods.map { period in
            var period = period
            period.environment = .sandbox
            return period
        }
        let inSandbox = try #require(AppleHistoryConversion.redemption(sandbox[4], known: Array(sandbox[2...3])))
        #expect(inSandbox.isPlaced && inSandbox.continuesRedemption)
    }

    @Test("A two-month pay-as-you-go offer (P2M) whose second period was renewed after a 30-day billing retry continues its redemption: periods are counted, not calendar time")
    func payAsYouGoAcrossBillingRetry() throws {
        let periods = [
            Self.period(0), Self.period(1, offer: "promo_50", offerPeriod: "P2M"), Self.period(2, offer: "promo_50", shiftDays: 30, offerPeriod: "P2M"),
            Self.period(3, shiftDays: 30),
        ]
        let found = Self.fromHistory(periods)
        #expect(found.keys.sorted() == ["500001", "500002"])
        #expect(try #require(found["500002"]).continuesRedemption, "the offer's second period, not a new redemption")
        // A third period under the offer is past its two: a new redemption, placed by the period before.
        let third = Self.fromHistory(Array(periods.prefix(3)) + [Self.period(3, offer: "promo_50", shiftDays: 30, offerPeriod: "P2M")])
        #expect(try #require(third["500003"]).continuesRedemption == false)
    }

    @Test("offerPeriod is read as an ISO 8601 duration of years, months, weeks and days; anything else is unknown")
    func offerPeriodParsing() throws {
        #expect(AppleOfferPeriod(iso8601: "P3M") == AppleOfferPeriod(months: 3))
        #expect(AppleOfferPeriod(iso8601: "P1Y") == AppleOfferPeriod(years: 1))
        #expect(AppleOfferPeriod(iso8601: "P2W") == AppleOfferPeriod(weeks: 2))
        #expect(AppleOfferPeriod(iso8601: "P3D") == AppleOfferPeriod(days: 3))
        #expect(AppleOfferPeriod(iso8601: "P1Y2M1W3D") == AppleOfferPeriod(years: 1, months: 2, weeks: 1, days: 3))
        for bad in ["", "P", "3M", "P3", "PM", "P3m", "P1M1Y", "P1M1M", "PT1H", "P1DT12H", "P-1M", "P1.5M", "P 3M", "P3M ", "P9999999D"] {
            #expect(AppleOfferPeriod(iso8601: bad) == nil, "\(bad)")
        }
        var utc = Calendar(identifier: .gregorian)
        utc.timeZone = TimeZone(secondsFromGMT: 0)!
        let january31 = try #require(utc.date(from: DateComponents(year: 2027, month: 1, day: 31, hour: 10)))
        #expect(AppleOfferPeriod(months: 1).end(from: january31) == utc.date(from: DateComponents(year: 2027, month: 2, day: 28, hour: 10)))
        #expect(AppleOfferPeriod(months: 3).end(from: january31) == utc.date(from: DateComponents(year: 2027, month: 4, day: 30, hour: 10)))
        #expect(AppleOfferPeriod(weeks: 1, days: 1).end(from: january31) == utc.date(from: DateComponents(year: 2027, month: 2, day: 8, hour: 10)))
    }
}
