import Foundation
@testable import OfferSignerEligibility
import Testing

/// The rules read as Apple defines its terms (issue 29): redemptions as Apple records them, churn,
/// waits from the subscription's end (or the offer's), pending offers in renewal infos, revocation types, free periods, clock skew, Sandbox time.
@Suite("Eligibility rules on Apple's definitions")
struct AppleReadingTests {
    typealias F = Fixture

    static func evaluate(
        _ offer: OfferDefinition, _ transactions: [VerifiedTransaction], renewals: [VerifiedRenewalInfo] = [],
        ledger: [IssuedOfferRecord] = [], now: Date = F.now, counting: EligibilityEvaluator.RedemptionCounting = .issuedAttempts
    ) -> EligibilityDecision {
        EligibilityEvaluator().evaluate(
            offer, evidence: EligibilityEvidence(transactions: transactions, renewalInfos: renewals), ledger: ledger, now: now, counting: counting)
    }

    static func renewal(autoRenew: Bool? = false, billingRetry: Bool? = false, grace: Date? = nil, environment: AppleEnvironment = .production) -> VerifiedRenewalInfo {
        VerifiedRenewalInfo(
            originalTransactionID: "1000", productID: F.monthly, autoRenewProductID: F.monthly, autoRenewEnabled: autoRenew,
            isInBillingRetryPeriod: billingRetry, gracePeriodExpiresDate: grace, environment: environment,
            expirationIntent: billingRetry == true ? 2 : 1)
    }

    static let lapsed = F.paidMonths(6, endingAt: F.monthsAgo(3))
    static let oncePerYear = OfferRules(waitBetweenOffersMonths: 12, maxRedemptions: 1)

    // MARK: Issuance is not redemption

    @Test("A cancelled payment sheet can be retried: signatures within 24 h are one attempt, the open one does not count")
    func cancelAndRetryOnTheAppsEvidence() {
        let offer = F.offer(rules: Self.oncePerYear)
        // Signed 10 minutes ago, sheet cancelled, asked again: eligible.
        let retry = Self.evaluate(offer, Self.lapsed, ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.now.addingTimeInterval(-600))])
        #expect(retry.reasons == [])
        // Three signatures within a day, asked again 25 h after the first: one attempt, used.
        let first = F.now.addingTimeInterval(-25 * 3600)
        let ledger = [0, 3600, 20 * 3600].map { IssuedOfferRecord(offerID: "wb1", issuedAt: first.addingTimeInterval(Double($0))) }
        #expect(EligibilityEvaluator.attempts(ledger).count == 1)
        let later = Self.evaluate(offer, Self.lapsed, ledger: ledger)
        #expect(later.reasons == [.redeemedTooRecently, .maxRedemptions])
        // The wait runs from the attempt's last signature (its redemption's end is unknown).
        #expect(later.eligibleFrom == nil)
        #expect(Self.evaluate(F.offer(rules: OfferRules(waitBetweenOffersMonths: 12)), Self.lapsed, ledger: ledger).eligibleFrom
            == F.months(12, from: first.addingTimeInterval(20 * 3600)))
        // The open attempt counts once redeemed: the app's evidence shows the redemption.
        let redeemed = F.transaction(
            "promo", start: F.now.addingTimeInterval(-300), end: F.months(1, from: F.now), offerType: .promotional, offerID: "wb1",
            discount: .payUpFront)
        let afterRedeeming = Self.evaluate(
            F.offer(.any, rules: Self.oncePerYear), Self.lapsed + [redeemed], ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.now.addingTimeInterval(-600))])
        #expect(afterRedeeming.reasons == [.redeemedTooRecently, .maxRedemptions])
    }

    @Test("On Apple's history, signatures issued and not redeemed count for nothing; Apple's redemptions do")
    func applesRecordCountsRedemptionsOnly() {
        let offer = F.offer(rules: Self.oncePerYear)
        let ledger = [IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(2)), IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(1))]
        #expect(Self.evaluate(offer, Self.lapsed, ledger: ledger, counting: .applesRecord).reasons == [])
        #expect(Self.evaluate(offer, Self.lapsed, ledger: ledger, counting: .issuedAttempts).reasons == [.redeemedTooRecently, .maxRedemptions])
        let redemption = F.transaction(
            "promo", start: F.monthsAgo(5), end: F.monthsAgo(4), offerType: .promotional, offerID: "wb1", discount: .payUpFront, price: 4_990)
        let decision = Self.evaluate(offer, F.paidMonths(6, endingAt: F.monthsAgo(5)) + [redemption], ledger: ledger, counting: .applesRecord)
        #expect(decision.reasons == [.redeemedTooRecently, .maxRedemptions])
    }

    // MARK: Churn

    @Test("Billing retry: not churned, whatever excludeBillingRetry says, and no eligibleFrom inside the retry")
    func billingRetryIsNotChurn() {
        let expired = F.paidMonths(6, endingAt: F.daysAgo(10))
        // Apple keeps autoRenewStatus 1 during a billing retry: the retry is the reason, not auto-renew.
        let decision = Self.evaluate(F.offer(rules: OfferRules(lapsedMonths: .init(min: 1))), expired, renewals: [Self.renewal(autoRenew: true, billingRetry: true)])
        #expect(decision.reasons == [.lapsedTooRecently, .billingRetry])
        #expect(decision.eligibleFrom == nil)
        // Retry over (the subscription expired for a billing error): churned.
        let over = Self.evaluate(F.offer(rules: OfferRules(lapsedMonths: .init(min: 1))), expired, renewals: [Self.renewal(billingRetry: false)])
        #expect(over.reasons == [.lapsedTooRecently])
        #expect(over.eligibleFrom == F.months(1, from: F.daysAgo(10)))
    }

    @Test("Grace period: still subscribed and not churned")
    func gracePeriodIsNotChurn() {
        let decision = Self.evaluate(
            F.offer(), F.paidMonths(6, endingAt: F.daysAgo(2)), renewals: [Self.renewal(billingRetry: true, grace: F.now.addingTimeInterval(4 * F.day))])
        #expect(decision.reasons == [.currentlySubscribed, .billingRetry])
        #expect(decision.eligibleFrom == nil)
    }

    @Test("Expired with auto-renew still on: not churned (auto_renew_on)")
    func autoRenewOnIsNotChurn() {
        #expect(Self.evaluate(F.offer(), Self.lapsed, renewals: [Self.renewal(autoRenew: true)]).reasons == [.autoRenewOn])
        #expect(Self.evaluate(F.offer(), Self.lapsed, renewals: [Self.renewal(autoRenew: false)]).reasons == [])
        // Not a win-back offer: no churn precondition.
        #expect(Self.evaluate(F.offer(.any, rules: OfferRules()), Self.lapsed, renewals: [Self.renewal(autoRenew: true)]).reasons == [])
    }

    // MARK: Waits and pending redemptions

    @Test("The wait runs from the end of the subscription that followed the redemption (the default), or of the offer's last discounted period (waitFrom offer-end)")
    func waitRunsFromTheSubscriptionsEnd() {
        let start = F.monthsAgo(5)
        // Pay as you go over 3 months, then a month at the full price; the subscription ended a month ago.
        let offerPeriods = (0..<3).map { month in
            var period = F.transaction(
                "p\(month)", start: F.months(month, from: start), end: F.months(month + 1, from: start), offerType: .promotional,
                offerID: "wb1", discount: .payAsYouGo, price: 4_990)
            period.transactionReason = month == 0 ? .purchase : .renewal
            return period
        }
        var fullPrice = F.transaction("p3", start: F.months(3, from: start), end: F.months(4, from: start))
        fullPrice.transactionReason = .renewal
        let history = F.paidMonths(3, endingAt: start) + offerPeriods + [fullPrice]
        let subscriptionEnd = Self.evaluate(F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)), history, counting: .applesRecord)
        #expect(subscriptionEnd.reasons == [.redeemedTooRecently])
        #expect(subscriptionEnd.eligibleFrom == F.months(6, from: F.months(4, from: start)))
        let offerEnd = Self.evaluate(F.offer(rules: OfferRules(waitBetweenOffersMonths: 6, waitFrom: .offerEnd)), history, counting: .applesRecord)
        #expect(offerEnd.reasons == [.redeemedTooRecently])
        #expect(offerEnd.eligibleFrom == F.months(6, from: F.months(3, from: start)))
        #expect(EligibilityEvaluator.redemptions(in: offerPeriods) { $0.offerIdentifier == "wb1" }.count == 1)
        // A subscription still running has no end yet: the wait runs from the offer's end.
        var running = F.transaction("p4", start: F.months(4, from: start), end: F.months(6, from: start))
        running.transactionReason = .renewal
        let active = Self.evaluate(F.offer(.any, rules: OfferRules(waitBetweenOffersMonths: 6)), history + [running], counting: .applesRecord)
        #expect(active.eligibleFrom == F.months(6, from: F.months(3, from: start)))
        // A later run (after a lapse) is another subscription: the wait runs from the end of the redemption's run.
        let later = F.transaction("q0", start: F.months(5, from: start).addingTimeInterval(3 * 86_400), end: F.now.addingTimeInterval(-86_400))
        let resubscribed = Self.evaluate(F.offer(.any, rules: OfferRules(waitBetweenOffersMonths: 6)), history + [later], counting: .applesRecord)
        #expect(resubscribed.eligibleFrom == F.months(6, from: F.months(4, from: start)))
    }

    @Test("An offer the customer accepted for the next renewal (renewal info offerType 2 and its identifier) is a pending redemption")
    func pendingOfferInRenewalInfo() {
        // A subscriber whose period renews in ten days; the renewal info says wb1 applies then.
        let renewal = F.now.addingTimeInterval(10 * 86_400)
        let subscribed = F.paidMonths(6, endingAt: renewal)
        func info(autoRenew: Bool = true, offerType: AppleOfferType? = .promotional, offerID: String? = "wb1") -> VerifiedRenewalInfo {
            VerifiedRenewalInfo(
                originalTransactionID: "1000", productID: F.monthly, autoRenewProductID: F.monthly, autoRenewEnabled: autoRenew,
                environment: .production, offerType: offerType, offerIdentifier: offerID, offerDiscountType: .payUpFront, offerPeriod: "P1M",
                renewalDate: renewal)
        }
        let retention = F.offer(.retention, rules: Self.oncePerYear)
        let pending = Self.evaluate(retention, subscribed, renewals: [info()], counting: .applesRecord)
        #expect(pending.reasons == [.redeemedTooRecently, .maxRedemptions])
        let waitOnly = Self.evaluate(F.offer(.retention, rules: OfferRules(waitBetweenOffersMonths: 12)), subscribed, renewals: [info()], counting: .applesRecord)
        #expect(waitOnly.eligibleFrom == F.months(12, from: renewal))
        // Not this offer, not a promotional offer, or auto-renew off (no renewal): nothing pending.
        #expect(Self.evaluate(retention, subscribed, renewals: [info(offerID: "other")], counting: .applesRecord).reasons == [])
        #expect(Self.evaluate(retention, subscribed, renewals: [info(offerType: .winBack)], counting: .applesRecord).reasons == [])
        #expect(Self.evaluate(retention, subscribed, renewals: [info(autoRenew: false)], counting: .applesRecord).reasons == [])
        // Once the renewal is recorded, the transaction and the renewal info are one redemption.
        var renewed = F.transaction("r1", start: renewal, end: F.months(1, from: renewal), offerType: .promotional, offerID: "wb1", discount: .payUpFront)
        renewed.transactionReason = .renewal
        let twice = F.offer(.retention, rules: OfferRules(maxRedemptions: 2))
        #expect(Self.evaluate(twice, subscribed + [renewed], renewals: [info()], now: renewal.addingTimeInterval(60), counting: .applesRecord).reasons == [])
        // On the app's evidence it counts too (Apple signed it).
        #expect(Self.evaluate(retention, subscribed, renewals: [info()]).reasons == [.redeemedTooRecently, .maxRedemptions])
    }

    // MARK: Revocations

    @Test("A Family Sharing revocation is not a refund")
    func familyRevocationIsNotARefund() {
        var shared = F.paidMonths(6, endingAt: F.monthsAgo(3), ownership: .familyShared)
        shared[5].revocationDate = F.monthsAgo(3).addingTimeInterval(-F.day)
        shared[5].revocationReason = 0
        shared[5].revocationType = .familyRevoke
        #expect(shared[5].isFamilyRevocation && !shared[5].isRefunded)
        #expect(Self.evaluate(F.offer(rules: OfferRules(excludeRefunded: true)), shared).reasons == [])
        // The same revocation as a refund of the customer's own purchase.
        var own = F.paidMonths(6, endingAt: F.monthsAgo(3))
        own[5].revocationDate = F.monthsAgo(3).addingTimeInterval(-F.day)
        own[5].revocationReason = 1
        own[5].revocationType = .refundFull
        #expect(Self.evaluate(F.offer(rules: OfferRules(excludeRefunded: true)), own).reasons == [.refunded])
    }

    @Test("A prorated refund removes only its revocationPercentage of paid time")
    func proratedRefundRemovesItsShare() {
        var periods = F.paidMonths(2, endingAt: F.monthsAgo(3))
        for index in periods.indices {
            periods[index].revocationDate = periods[index].expiresDate
            periods[index].revocationType = .refundProrated
            periods[index].revocationPercentage = 50_000
        }
        #expect(abs(periods[0].refundedShare - 0.5) < 1e-9)
        // Half of two months is one month: enough for minPaidMonths 1, not for 2.
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 1)), periods).reasons == [])
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 2)), periods).reasons == [.paidTooShort])
        // A full refund removes all of it.
        let full = periods.map { period -> VerifiedTransaction in
            var refunded = period
            refunded.revocationType = .refundFull
            refunded.revocationPercentage = 100_000
            return refunded
        }
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 1)), full).reasons == [.paidTooShort])
    }

    // MARK: Paid time

    @Test("A free promotional month (any offer type with FREE_TRIAL, or price 0) is not paid time")
    func freePromotionalMonthIsNotPaid() {
        let freeMonth = F.transaction(
            "free", start: F.monthsAgo(4), end: F.monthsAgo(3), offerType: .promotional, offerID: "free_month", discount: .freeTrial)
        let offerCodeMonth = F.transaction(
            "code", start: F.monthsAgo(5), end: F.monthsAgo(4), offerType: .offerCode, offerID: "code", discount: .payUpFront, price: 0)
        let history = F.paidMonths(2, endingAt: F.monthsAgo(5)) + [offerCodeMonth, freeMonth]
        #expect(freeMonth.isFreePeriod && offerCodeMonth.isFreePeriod)
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 3)), history).reasons == [.paidTooShort])
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 2)), history).reasons == [])
    }

    @Test("paidTime latest-run counts only the latest continuous run; lifetime (the default) sums all")
    func paidTimeScopes() {
        let history = F.paidMonths(6, endingAt: F.monthsAgo(12), idPrefix: "old") + F.paidMonths(2, endingAt: F.monthsAgo(3), idPrefix: "new")
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 3)), history).reasons == [])
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 3, paidTime: .latestRun)), history).reasons == [.paidTooShort])
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 2, paidTime: .latestRun)), history).reasons == [])
    }

    // MARK: Time

    @Test("Jan 31 plus one month is Feb 28 (Feb 29 in a leap year), as Foundation's Calendar adds in UTC")
    func january31PlusOneMonth() {
        let time = RuleTime(environment: .production)
        let jan31 = Date(timeIntervalSince1970: 1_738_281_600)  // 2025-01-31T00:00:00Z
        let feb28 = Date(timeIntervalSince1970: 1_740_700_800)  // 2025-02-28T00:00:00Z
        #expect(time.adding(months: 1, to: jan31) == feb28)
        let jan31Leap = Date(timeIntervalSince1970: 1_706_659_200)  // 2024-01-31T00:00:00Z
        #expect(time.adding(months: 1, to: jan31Leap) == Date(timeIntervalSince1970: 1_709_164_800))  // 2024-02-29
        // Through a rule: lapsed on Jan 31, one month's wait ends on Feb 28.
        let history = [F.transaction("t", start: Date(timeIntervalSince1970: 1_735_603_200), end: jan31)]  // from 2024-12-31
        let decision = Self.evaluate(
            F.offer(rules: OfferRules(lapsedMonths: .init(min: 1))), history, now: Date(timeIntervalSince1970: 1_740_657_600))  // 2025-02-27T12:00Z
        #expect(decision.reasons == [.lapsedTooRecently])
        #expect(decision.eligibleFrom == feb28)
        #expect(Self.evaluate(F.offer(rules: OfferRules(lapsedMonths: .init(min: 1))), history, now: feb28).reasons == [])
    }

    @Test("Clock skew: a wait that ends within clockSkewSeconds of now is over; 0 turns the tolerance off")
    func clockSkew() {
        let redemption = F.transaction(
            "promo", start: F.monthsAgo(7), end: F.monthsAgo(6).addingTimeInterval(30), offerType: .promotional, offerID: "wb1",
            discount: .payUpFront, price: 4_990)
        let history = F.paidMonths(6, endingAt: F.monthsAgo(7)) + [redemption]
        #expect(Self.evaluate(F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)), history).reasons == [])
        let strict = Self.evaluate(F.offer(rules: OfferRules(waitBetweenOffersMonths: 6, clockSkewSeconds: 0)), history)
        #expect(strict.reasons == [.redeemedTooRecently])
        #expect(strict.eligibleFrom == F.now.addingTimeInterval(30))
        // An expiry 30 s ahead of our clock counts as past for a win-back offer, not for a retention offer.
        let ending = F.paidMonths(3, endingAt: F.now.addingTimeInterval(30))
        #expect(Self.evaluate(F.offer(), ending).reasons == [])
        #expect(Self.evaluate(F.offer(.retention), ending).reasons == [])
        #expect(Self.evaluate(F.offer(rules: OfferRules(clockSkewSeconds: 0)), ending).reasons == [.currentlySubscribed])
    }

    @Test("Sandbox time: a month of a rule is 5 minutes, the rate of Apple's sandbox table")
    func sandboxTime() {
        let minute: TimeInterval = 60
        let now = F.now
        // Three 5-minute "months" of Sandbox renewals, ended 12 minutes ago.
        let end = now.addingTimeInterval(-12 * minute)
        let history = (0..<3).map { index in
            F.transaction(
                "s\(index)", start: end.addingTimeInterval(Double(index - 3) * 5 * minute), end: end.addingTimeInterval(Double(index - 2) * 5 * minute),
                environment: .sandbox)
        }
        let offer = F.offer(rules: OfferRules(minPaidMonths: 3, lapsedMonths: .init(min: 2, max: 12)))
        #expect(Self.evaluate(offer, history, now: now).reasons == [])
        let early = Self.evaluate(F.offer(rules: OfferRules(lapsedMonths: .init(min: 3))), history, now: now)
        #expect(early.reasons == [.lapsedTooRecently])
        #expect(early.eligibleFrom == end.addingTimeInterval(15 * minute))
        #expect(RuleTime(environment: .sandbox).adding(months: 12, to: now) == now.addingTimeInterval(3600))
        // The same history in Production is minutes old: far too recent, far too short.
        let production = history.map { transaction -> VerifiedTransaction in
            var copy = transaction
            copy.environment = .production
            return copy
        }
        #expect(Self.evaluate(offer, production, now: now).reasons == [.paidTooShort, .lapsedTooRecently])
    }

    @Test("Sandbox paid time: each observed period counts as its nominal duration in Apple's table (3 minutes is a week, not 0.6 months)")
    func sandboxPeriodsAtTheirNominalDuration() {
        let minute: TimeInterval = 60
        let end = F.now.addingTimeInterval(-12 * minute)
        func periods(_ count: Int, of length: TimeInterval) -> [VerifiedTransaction] {
            (0..<count).map { index in
                F.transaction(
                    "w\(index)", start: end.addingTimeInterval(Double(index - count) * length), end: end.addingTimeInterval(Double(index - count + 1) * length),
                    environment: .sandbox)
            }
        }
        #expect(abs(RuleTime.sandboxNominalMonths(observed: 3 * minute) - 7 / (365.2425 / 12)) < 1e-9)
        #expect(RuleTime.sandboxNominalMonths(observed: 5 * minute + 20) == 1)
        #expect(RuleTime.sandboxNominalMonths(observed: 58 * minute) == 12)
        let threeMonths = F.offer(rules: OfferRules(minPaidMonths: 3))
        // Five weekly periods (15 minutes observed) are about 1.15 months, not 3.
        #expect(Self.evaluate(threeMonths, periods(5, of: 3 * minute)).reasons == [.paidTooShort])
        // Fourteen weeks are about 3.2 months.
        #expect(Self.evaluate(threeMonths, periods(14, of: 3 * minute)).reasons == [])
        // One quarterly period (15 minutes) is 3 months; a yearly one (an hour) is 12.
        #expect(Self.evaluate(threeMonths, periods(1, of: 15 * minute)).reasons == [])
        #expect(Self.evaluate(F.offer(rules: OfferRules(minPaidMonths: 12)), periods(1, of: 60 * minute)).reasons == [])
    }

    // MARK: Catalog

    @Test("The catalog reads paidTime and clockSkewSeconds, and refuses bad values")
    func catalogOptions() throws {
        func catalog(_ rules: String) throws(OfferCatalogError) -> OfferCatalog {
            try OfferCatalog(jsonData: Data("""
                {"offers": [{"offerID": "wb1", "bundleID": "com.example.app", "productIDs": ["p"], "subscriptionGroupID": "1",
                  "kind": "win-back", "rules": \(rules)}]}
                """.utf8))
        }
        let rules = try #require(try catalog(#"{"minPaidMonths": 3, "paidTime": "latest-run", "clockSkewSeconds": 5, "excludeBillingRetry": true}"#).offers[0].rules)
        #expect(rules.paidTime == .latestRun && rules.clockSkewSeconds == 5 && rules.excludeBillingRetry)
        #expect(try catalog("{}").offers[0].rules?.clockSkewSeconds == 60)
        #expect(try catalog("{}").offers[0].rules?.paidTime == .lifetime)
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"minPaidMonths": 3, "paidTime": "recent"}"#) }
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"paidTime": "lifetime"}"#) }
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"clockSkewSeconds": 7200}"#) }
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"clockSkewSeconds": -1}"#) }
        #expect(try catalog(#"{"waitBetweenOffersMonths": 6}"#).offers[0].rules?.waitFrom == .subscriptionEnd)
        #expect(try catalog(#"{"waitBetweenOffersMonths": 6, "waitFrom": "offer-end"}"#).offers[0].rules?.waitFrom == .offerEnd)
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"waitBetweenOffersMonths": 6, "waitFrom": "redemption"}"#) }
        #expect(throws: OfferCatalogError.self) { try catalog(#"{"waitFrom": "offer-end"}"#) }
    }
}
