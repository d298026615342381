import Foundation
@testable import OfferSignerEligibility
import Testing

/// Fixtures for customer histories. All dates UTC; `now` is 2025-06-15T00:00:00Z.
enum Fixture {
    static let now = Date(timeIntervalSince1970: 1_749_945_600)
    static let bundleID = "com.example.app"
    static let groupID = "21345678"
    static let monthly = "com.example.app.premium.monthly"
    static let day: TimeInterval = 86_400

    static var utc: Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar
    }

    static func months(_ count: Int, from date: Date) -> Date {
        utc.date(byAdding: .month, value: count, to: date)!
    }

    static func daysAgo(_ days: Double) -> Date { now.addingTimeInterval(-days * day) }
    static func monthsAgo(_ count: Int) -> Date { months(-count, from: now) }

    static func offer(_ kind: OfferKind = .winBack, id: String = "wb1", rules: OfferRules? = OfferRules()) -> OfferDefinition {
        OfferDefinition(
            offerID: id, bundleID: bundleID, productIDs: [monthly], subscriptionGroupID: groupID, kind: kind, rules: rules)
    }

    static func transaction(
        _ id: String,
        original: String = "1000",
        start: Date,
        end: Date,
        revoked: Date? = nil,
        ownership: AppleOwnershipType = .purchased,
        offerType: AppleOfferType? = nil,
        offerID: String? = nil,
        discount: AppleOfferDiscountType? = nil,
        price: Int64 = 9_990,
        storefront: String = "USA",
        environment: AppleEnvironment = .production
    ) -> VerifiedTransaction {
        VerifiedTransaction(
            transactionID: id, originalTransactionID: original, productID: monthly, subscriptionGroupID: groupID,
            purchaseDate: start, expiresDate: end, revocationDate: revoked, ownershipType: ownership,
            offerType: offerType, offerIdentifier: offerID, offerDiscountType: discount, price: price,
            currency: "USD", storefront: storefront, environment: environment, bundleID: bundleID)
    }

    /// The same transaction marked `isUpgraded` (the customer moved to another product of the group).
    static func upgraded(_ transaction: VerifiedTransaction) -> VerifiedTransaction {
        var upgraded = transaction
        upgraded.isUpgraded = true
        return upgraded
    }

    /// `count` consecutive monthly paid periods ending at `end`.
    static func paidMonths(
        _ count: Int, endingAt end: Date, idPrefix: String = "t", storefront: String = "USA",
        ownership: AppleOwnershipType = .purchased, environment: AppleEnvironment = .production
    ) -> [VerifiedTransaction] {
        let start = months(-count, from: end)
        return (0..<count).map { index in
            transaction(
                "\(idPrefix)\(index)", start: months(index, from: start), end: months(index + 1, from: start),
                ownership: ownership, storefront: storefront, environment: environment)
        }
    }

    static func renewal(
        billingRetry: Bool? = nil, grace: Date? = nil, winBackOffers: [String] = [],
        environment: AppleEnvironment = .production
    ) -> VerifiedRenewalInfo {
        VerifiedRenewalInfo(
            originalTransactionID: "1000", productID: monthly, autoRenewProductID: monthly, autoRenewEnabled: false,
            isInBillingRetryPeriod: billingRetry, gracePeriodExpiresDate: grace, eligibleWinBackOfferIDs: winBackOffers,
            environment: environment)
    }
}

struct HistoryCase: Sendable, CustomTestStringConvertible {
    var name: String
    var offer: OfferDefinition
    var transactions: [VerifiedTransaction] = []
    var renewalInfos: [VerifiedRenewalInfo] = []
    var ledger: [IssuedOfferRecord] = []
    var catalogWinBackIDs: Set<String> = []
    var reasons: [EligibilityReason]
    var eligibleFrom: Date? = nil

    var testDescription: String { name }
}

@Suite("Eligibility rules over customer histories")
struct EligibilityEvaluatorTests {
    typealias F = Fixture

    static let lapsedWindow = OfferRules(lapsedMonths: .init(min: 1, max: 12))
    static let redemption2MonthsAgo = F.transaction(
        "promo1", start: F.monthsAgo(2), end: F.monthsAgo(1), offerType: .promotional, offerID: "wb1",
        discount: .payAsYouGo, price: 4_990)
    static let appleWinBack1MonthAgo = F.transaction(
        "applewb", start: F.daysAgo(40), end: F.daysAgo(10), offerType: .winBack, offerID: "apple_wb",
        discount: .payAsYouGo, price: 4_990)

    static let cases: [HistoryCase] = [
        // Kind preconditions.
        HistoryCase(name: "never subscribed (win-back)", offer: F.offer(), reasons: [.noHistory]),
        HistoryCase(
            name: "active now (win-back)", offer: F.offer(),
            transactions: F.paidMonths(6, endingAt: F.now.addingTimeInterval(15 * F.day)),
            reasons: [.currentlySubscribed]),
        HistoryCase(
            name: "retention, active now", offer: F.offer(.retention),
            transactions: F.paidMonths(6, endingAt: F.now.addingTimeInterval(15 * F.day)), reasons: []),
        HistoryCase(
            name: "retention, lapsed", offer: F.offer(.retention),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: [.notSubscribed]),
        HistoryCase(name: "retention, never subscribed", offer: F.offer(.retention), reasons: [.noHistory]),
        HistoryCase(name: "kind any, no history, no rules that need one", offer: F.offer(.any), reasons: []),
        HistoryCase(
            name: "other subscription group does not count as history", offer: F.offer(),
            transactions: F.paidMonths(3, endingAt: F.monthsAgo(3)).map {
                var other = $0
                other.subscriptionGroupID = "99999"
                other.productID = "other.product"
                return other
            },
            reasons: [.noHistory]),

        // lapsedMonths.
        HistoryCase(
            name: "lapsed 2 weeks", offer: F.offer(rules: lapsedWindow),
            transactions: F.paidMonths(6, endingAt: F.daysAgo(14)),
            reasons: [.lapsedTooRecently], eligibleFrom: F.months(1, from: F.daysAgo(14))),
        HistoryCase(
            name: "lapsed 3 months", offer: F.offer(rules: lapsedWindow),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "lapsed 14 months", offer: F.offer(rules: lapsedWindow),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(14)), reasons: [.lapsedTooLongAgo]),
        HistoryCase(
            name: "lapsed exactly 12 months is inside the window", offer: F.offer(rules: lapsedWindow),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(12)), reasons: []),
        HistoryCase(
            name: "lapsedMonths on kind any while active", offer: F.offer(.any, rules: lapsedWindow),
            transactions: F.paidMonths(2, endingAt: F.now.addingTimeInterval(F.day)), reasons: [.currentlySubscribed]),
        HistoryCase(
            name: "lapse counts from the revocation when earlier than expiry",
            offer: F.offer(rules: lapsedWindow),
            transactions: [
                F.transaction("t1", start: F.daysAgo(70), end: F.daysAgo(40)),
                F.transaction("t2", start: F.daysAgo(40), end: F.daysAgo(10), revoked: F.daysAgo(35)),
            ],
            reasons: []),

        // isUpgraded: the service an upgraded transaction paid for ended at the upgrade.
        HistoryCase(
            name: "a yearly period upgraded after a month ends at the upgrade: lapsed, paid 2 months, not 12",
            offer: F.offer(rules: OfferRules(minPaidMonths: 3, lapsedMonths: .init(min: 1))),
            transactions: [
                F.upgraded(F.transaction("year", start: F.monthsAgo(5), end: F.months(7, from: F.now))),
                F.transaction("premium", start: F.monthsAgo(4), end: F.monthsAgo(3)),
            ],
            reasons: [.paidTooShort]),
        HistoryCase(
            name: "an upgraded period whose upgrade is not in the history runs to its expiry",
            offer: F.offer(rules: OfferRules(minPaidMonths: 3, lapsedMonths: .init(min: 1))),
            transactions: [F.upgraded(F.transaction("year", start: F.monthsAgo(5), end: F.months(7, from: F.now)))],
            reasons: [.currentlySubscribed]),
        HistoryCase(
            name: "the same periods without isUpgraded: the yearly period still runs",
            offer: F.offer(rules: OfferRules(minPaidMonths: 3, lapsedMonths: .init(min: 1))),
            transactions: [
                F.transaction("year", start: F.monthsAgo(5), end: F.months(7, from: F.now)),
                F.transaction("premium", start: F.monthsAgo(4), end: F.monthsAgo(3)),
            ],
            reasons: [.currentlySubscribed]),

        // minPaidMonths.
        HistoryCase(
            name: "paid 1 month, needs 3", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: F.paidMonths(1, endingAt: F.monthsAgo(3)), reasons: [.paidTooShort]),
        HistoryCase(
            name: "paid 6 months, needs 3", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "paid exactly 3 months, needs 3", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: F.paidMonths(3, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "paid 2 + 1 months with a gap, needs 3", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: F.paidMonths(2, endingAt: F.monthsAgo(10), idPrefix: "a")
                + F.paidMonths(1, endingAt: F.monthsAgo(3), idPrefix: "b"),
            reasons: []),
        HistoryCase(
            name: "trial only", offer: F.offer(rules: OfferRules(minPaidMonths: 1)),
            transactions: [
                F.transaction(
                    "trial", start: F.monthsAgo(4), end: F.monthsAgo(3), offerType: .introductory, discount: .freeTrial,
                    price: 0)
            ],
            reasons: [.paidTooShort]),
        HistoryCase(
            name: "trial (intro FREE_TRIAL) + 2 paid months, needs 3", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: [
                F.transaction(
                    "trial", start: F.monthsAgo(6), end: F.monthsAgo(5), offerType: .introductory, discount: .freeTrial,
                    price: 9_990)
            ] + F.paidMonths(2, endingAt: F.monthsAgo(3)),
            reasons: [.paidTooShort]),
        HistoryCase(
            name: "price-0 period does not count", offer: F.offer(rules: OfferRules(minPaidMonths: 2)),
            transactions: [
                F.transaction("free", start: F.monthsAgo(5), end: F.monthsAgo(4), price: 0),
                F.transaction("paid", start: F.monthsAgo(4), end: F.monthsAgo(3)),
            ],
            reasons: [.paidTooShort]),
        HistoryCase(
            name: "refunded period does not count as paid", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: [
                F.transaction("t1", start: F.monthsAgo(6), end: F.monthsAgo(5)),
                F.transaction("t2", start: F.monthsAgo(5), end: F.monthsAgo(4), revoked: F.monthsAgo(4)),
                F.transaction("t3", start: F.monthsAgo(4), end: F.monthsAgo(3)),
            ],
            reasons: [.paidTooShort]),
        HistoryCase(
            name: "duplicate and overlapping periods count once", offer: F.offer(rules: OfferRules(minPaidMonths: 3)),
            transactions: F.paidMonths(2, endingAt: F.monthsAgo(3)) + F.paidMonths(2, endingAt: F.monthsAgo(3)),
            reasons: [.paidTooShort]),

        // Exclusions.
        HistoryCase(
            name: "refunded", offer: F.offer(rules: OfferRules(excludeRefunded: true)),
            transactions: F.paidMonths(5, endingAt: F.monthsAgo(4))
                + [F.transaction("r", start: F.monthsAgo(4), end: F.monthsAgo(3), revoked: F.monthsAgo(3))],
            reasons: [.refunded]),
        HistoryCase(
            name: "family-shared", offer: F.offer(rules: OfferRules(excludeFamilyShared: true)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3), ownership: .familyShared),
            reasons: [.familyShared]),
        HistoryCase(
            name: "family-shared earlier, own purchase since", offer: F.offer(rules: OfferRules(excludeFamilyShared: true)),
            transactions: F.paidMonths(3, endingAt: F.monthsAgo(8), idPrefix: "f", ownership: .familyShared)
                + F.paidMonths(3, endingAt: F.monthsAgo(3)),
            reasons: []),
        HistoryCase(
            name: "in billing retry", offer: F.offer(rules: OfferRules(excludeBillingRetry: true)),
            transactions: F.paidMonths(6, endingAt: F.daysAgo(10)),
            renewalInfos: [F.renewal(billingRetry: true)],
            reasons: [.billingRetry]),
        HistoryCase(
            name: "in grace period (still active)", offer: F.offer(rules: OfferRules(excludeBillingRetry: true)),
            transactions: F.paidMonths(6, endingAt: F.daysAgo(3)),
            renewalInfos: [F.renewal(billingRetry: true, grace: F.now.addingTimeInterval(3 * F.day))],
            reasons: [.currentlySubscribed, .billingRetry]),
        HistoryCase(
            name: "grace period over, retry over", offer: F.offer(rules: OfferRules(excludeBillingRetry: true)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            renewalInfos: [F.renewal(billingRetry: false, grace: F.daysAgo(70))],
            reasons: []),

        // Redemptions.
        HistoryCase(
            // Apple: the wait runs from the end of the offer's period (1 month ago), not its start.
            name: "redeemed this offer 2 months ago, for a month", offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(8)) + [redemption2MonthsAgo],
            reasons: [.redeemedTooRecently], eligibleFrom: F.months(5, from: F.now)),
        HistoryCase(
            name: "redeemed this offer 7 months ago", offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(8))
                + [F.transaction("promo0", start: F.monthsAgo(7), end: F.monthsAgo(6), offerType: .promotional, offerID: "wb1")],
            reasons: []),
        HistoryCase(
            name: "signature issued 2 months ago, redemption withheld from evidence",
            offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(2))],
            reasons: [.redeemedTooRecently], eligibleFrom: F.months(4, from: F.now)),
        HistoryCase(
            name: "another offer's signature does not count (scope offer)",
            offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 6)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            ledger: [IssuedOfferRecord(offerID: "other_wb", issuedAt: F.monthsAgo(2))],
            catalogWinBackIDs: ["other_wb"],
            reasons: []),
        HistoryCase(
            name: "another win-back offer's signature counts (scope any-win-back)",
            offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 6, waitScope: .anyWinBack)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            ledger: [IssuedOfferRecord(offerID: "other_wb", issuedAt: F.monthsAgo(2))],
            catalogWinBackIDs: ["other_wb"],
            reasons: [.redeemedTooRecently], eligibleFrom: F.months(4, from: F.now)),
        HistoryCase(
            name: "Apple win-back redeemed (scope any-win-back)",
            offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 3, waitScope: .anyWinBack)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)) + [appleWinBack1MonthAgo],
            reasons: [.redeemedTooRecently], eligibleFrom: F.months(3, from: F.daysAgo(10))),
        HistoryCase(
            name: "Apple win-back redeemed (scope offer)",
            offer: F.offer(rules: OfferRules(waitBetweenOffersMonths: 3)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)) + [appleWinBack1MonthAgo],
            reasons: []),
        HistoryCase(
            name: "maxRedemptions reached", offer: F.offer(rules: OfferRules(maxRedemptions: 1)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(8)) + [redemption2MonthsAgo],
            reasons: [.maxRedemptions]),
        HistoryCase(
            name: "maxRedemptions not reached", offer: F.offer(rules: OfferRules(maxRedemptions: 2)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(8)) + [redemption2MonthsAgo],
            ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(2).addingTimeInterval(-60))],
            reasons: []),
        HistoryCase(
            name: "maxRedemptions counts ledger signatures", offer: F.offer(rules: OfferRules(maxRedemptions: 2)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(8)) + [redemption2MonthsAgo],
            ledger: [
                IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(20)),
                IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(2)),
            ],
            reasons: [.maxRedemptions]),

        // Apple's own win-back offer.
        HistoryCase(
            name: "Apple win-back offer available", offer: F.offer(rules: OfferRules(deferToAppleWinBack: true)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            renewalInfos: [F.renewal(winBackOffers: ["apple_wb"])],
            reasons: [.appleWinBackAvailable]),
        HistoryCase(
            name: "Apple win-back list empty", offer: F.offer(rules: OfferRules(deferToAppleWinBack: true)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)),
            renewalInfos: [F.renewal(winBackOffers: [])],
            reasons: []),

        // Environment and storefront.
        HistoryCase(
            name: "Sandbox evidence, Production rule", offer: F.offer(rules: OfferRules(environment: .production)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3), environment: .sandbox),
            reasons: [.environmentMismatch]),
        HistoryCase(
            name: "Production evidence, Production rule", offer: F.offer(rules: OfferRules(environment: .production)),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "Production rule without any evidence", offer: F.offer(.any, rules: OfferRules(environment: .production)),
            reasons: [.environmentMismatch]),
        HistoryCase(
            name: "storefront allow USA, customer FRA", offer: F.offer(rules: OfferRules(storefronts: .allow(["USA"]))),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3), storefront: "FRA"), reasons: [.storefrontExcluded]),
        HistoryCase(
            name: "storefront allow USA, customer USA", offer: F.offer(rules: OfferRules(storefronts: .allow(["USA"]))),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "storefront deny FRA, customer FRA", offer: F.offer(rules: OfferRules(storefronts: .deny(["FRA"]))),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3), storefront: "FRA"), reasons: [.storefrontExcluded]),
        HistoryCase(
            name: "storefront deny FRA, customer USA", offer: F.offer(rules: OfferRules(storefronts: .deny(["FRA"]))),
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), reasons: []),
        HistoryCase(
            name: "storefront allow list, storefront unknown", offer: F.offer(.any, rules: OfferRules(storefronts: .allow(["USA"]))),
            reasons: [.storefrontExcluded]),

        // Several reasons at once.
        HistoryCase(
            name: "all applicable reasons, in a fixed order",
            offer: F.offer(
                rules: OfferRules(
                    minPaidMonths: 12, lapsedMonths: .init(min: 1), excludeFamilyShared: true, excludeRefunded: true,
                    storefronts: .allow(["USA"]), environment: .production)),
            transactions: F.paidMonths(2, endingAt: F.daysAgo(14), storefront: "FRA", ownership: .familyShared,
                environment: .sandbox)
                + [F.transaction("r", start: F.monthsAgo(8), end: F.monthsAgo(7), revoked: F.monthsAgo(7),
                    environment: .sandbox)],
            // Sandbox history: a month of `lapsedMonths` is 5 minutes (Apple's sandbox renewal
            // rate), so a lapse of 14 days is long enough there.
            reasons: [
                .environmentMismatch, .paidTooShort, .refunded, .familyShared, .storefrontExcluded,
            ]),
        HistoryCase(
            name: "two waiting periods: eligibleFrom is the later end",
            offer: F.offer(rules: OfferRules(lapsedMonths: .init(min: 1), waitBetweenOffersMonths: 6)),
            transactions: F.paidMonths(2, endingAt: F.daysAgo(14)),
            ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(1))],
            reasons: [.lapsedTooRecently, .redeemedTooRecently], eligibleFrom: F.months(5, from: F.now)),
        HistoryCase(
            name: "waiting period that ends after the lapse window closes: no eligibleFrom",
            offer: F.offer(rules: OfferRules(lapsedMonths: .init(min: 1, max: 3), waitBetweenOffersMonths: 12)),
            transactions: F.paidMonths(2, endingAt: F.monthsAgo(2)),
            ledger: [IssuedOfferRecord(offerID: "wb1", issuedAt: F.monthsAgo(1))],
            reasons: [.redeemedTooRecently], eligibleFrom: nil),
    ]

    @Test(arguments: cases)
    func history(_ testCase: HistoryCase) {
        let evaluator = EligibilityEvaluator(winBackOfferIDs: testCase.catalogWinBackIDs)
        let decision = evaluator.evaluate(
            testCase.offer,
            evidence: EligibilityEvidence(transactions: testCase.transactions, renewalInfos: testCase.renewalInfos),
            ledger: testCase.ledger,
            now: Fixture.now)
        #expect(decision.offerID == testCase.offer.offerID)
        #expect(decision.reasons == testCase.reasons)
        #expect(decision.eligible == testCase.reasons.isEmpty)
        #expect(decision.eligibleFrom == testCase.eligibleFrom)
        #expect(decision.evidenceFailures.isEmpty)
    }

    static let failure = EvidenceFailure(
        source: .signedTransaction, index: 0, code: .invalidSignature, message: "ES256 signature does not match")

    @Test func anOfferOverSeveralPeriodsIsOneRedemption() {
        // promo_50 for three months (pay as you go: each renewal under the offer), full price,
        // then promo_50 again: two redemptions, not four.
        let start = Fixture.monthsAgo(12)
        var transactions: [VerifiedTransaction] = []
        for month in 0..<6 {
            let offer = month < 3 || month == 5
            transactions.append(Fixture.transaction(
                "t\(month)", start: Fixture.months(month, from: start), end: Fixture.months(month + 1, from: start),
                offerType: offer ? .promotional : nil, offerID: offer ? "promo_50" : nil, discount: offer ? .payAsYouGo : nil))
        }
        let starts = EligibilityEvaluator.redemptionStarts(in: transactions) { $0.offerType == .promotional && $0.offerIdentifier == "promo_50" }
        #expect(starts.sorted() == [start, Fixture.months(5, from: start)])

        let offer = Fixture.offer(.any, id: "promo_50", rules: OfferRules(maxRedemptions: 3))
        let decision = EligibilityEvaluator().evaluate(offer, evidence: EligibilityEvidence(transactions: transactions, renewalInfos: []), ledger: [], now: Fixture.now)
        #expect(decision.reasons == [], "two redemptions of three allowed: \(decision.reasons)")
        let strict = Fixture.offer(.any, id: "promo_50", rules: OfferRules(maxRedemptions: 2))
        #expect(EligibilityEvaluator().evaluate(strict, evidence: EligibilityEvidence(transactions: transactions, renewalInfos: []), ledger: [], now: Fixture.now).reasons == [.maxRedemptions])

        // The same offer paid up front month after month, or redeemed again after a lapse, is
        // redeemed each time.
        let upFront = (0..<3).map { month in
            Fixture.transaction(
                "u\(month)", start: Fixture.months(month, from: start), end: Fixture.months(month + 1, from: start),
                offerType: .promotional, offerID: "promo_50", discount: .payUpFront)
        }
        #expect(EligibilityEvaluator.redemptionStarts(in: upFront) { $0.offerIdentifier == "promo_50" }.count == 3)
        let afterLapse = [
            Fixture.transaction("l0", start: start, end: Fixture.months(1, from: start), offerType: .promotional, offerID: "promo_50", discount: .payAsYouGo),
            Fixture.transaction(
                "l1", start: Fixture.months(3, from: start), end: Fixture.months(4, from: start), offerType: .promotional, offerID: "promo_50", discount: .payAsYouGo),
        ]
        #expect(EligibilityEvaluator.redemptionStarts(in: afterLapse) { $0.offerIdentifier == "promo_50" }.count == 2)
    }

    @Test("The count's continuation rule: a purchase counts again, a renewal after a billing retry goes on, a new product at renewal counts again")
    func continuationByReasonAndProduct() {
        let start = Fixture.monthsAgo(12)
        func period(_ id: String, month: Int, shiftDays: Double = 0, reason: AppleTransactionReason?, product: String = Fixture.monthly) -> VerifiedTransaction {
            var transaction = Fixture.transaction(
                id, start: Fixture.months(month, from: start).addingTimeInterval(shiftDays * Fixture.day),
                end: Fixture.months(month + 1, from: start).addingTimeInterval(shiftDays * Fixture.day),
                offerType: .promotional, offerID: "promo_50", discount: .payAsYouGo)
            transaction.transactionReason = reason
            transaction.productID = product
            return transaction
        }
        let isOffer: (VerifiedTransaction) -> Bool = { $0.offerIdentifier == "promo_50" }
        // Bought again the day the last period ended: a second redemption.
        #expect(EligibilityEvaluator.redemptionStarts(in: [period("a0", month: 0, reason: .purchase), period("a1", month: 1, reason: .purchase)], where: isOffer).count == 2)
        // Renewed after a billing retry of 10 days: the same redemption; a gap with no reason is a lapse.
        #expect(EligibilityEvaluator.redemptionStarts(in: [period("b0", month: 0, reason: .purchase), period("b1", month: 1, shiftDays: 10, reason: .renewal)], where: isOffer).count == 1)
        #expect(EligibilityEvaluator.redemptionStarts(in: [period("c0", month: 0, reason: nil), period("c1", month: 1, shiftDays: 10, reason: nil)], where: isOffer).count == 2)
        // Renewed into another product of the group under the same offer ID: a new redemption.
        let crossgrade = [period("d0", month: 0, reason: .purchase), period("d1", month: 1, reason: .renewal, product: "pro.annual")]
        #expect(EligibilityEvaluator.redemptionStarts(in: crossgrade, where: isOffer).count == 2)

        // Through the rules: maxRedemptions 1 holds the retried renewal to one redemption.
        let once = Fixture.offer(.any, id: "promo_50", rules: OfferRules(maxRedemptions: 1))
        let retried = [period("e0", month: 0, reason: .purchase), period("e1", month: 1, shiftDays: 10, reason: .renewal)]
        #expect(EligibilityEvaluator().evaluate(once, evidence: EligibilityEvidence(transactions: retried, renewalInfos: []), ledger: [], now: Fixture.now).reasons == [.maxRedemptions])
        let twice = Fixture.offer(.any, id: "promo_50", rules: OfferRules(maxRedemptions: 2))
        #expect(EligibilityEvaluator().evaluate(twice, evidence: EligibilityEvidence(transactions: retried, renewalInfos: []), ledger: [], now: Fixture.now).reasons == [])
        #expect(EligibilityEvaluator().evaluate(twice, evidence: EligibilityEvidence(transactions: crossgrade, renewalInfos: []), ledger: [], now: Fixture.now).reasons == [.maxRedemptions])
    }

    @Test func offerWithoutRulesIsAlwaysEligible() {
        let decision = EligibilityEvaluator().evaluate(
            F.offer(rules: nil), evidence: EligibilityEvidence(failures: [Self.failure]), ledger: [], now: F.now)
        #expect(decision == EligibilityDecision(offerID: "wb1", eligible: true, reasons: []))
    }

    @Test func unverifiedEvidenceMakesOffersWithRulesIneligible() {
        let evidence = EligibilityEvidence(
            transactions: F.paidMonths(6, endingAt: F.monthsAgo(3)), failures: [Self.failure])
        let decision = EligibilityEvaluator().evaluate(F.offer(), evidence: evidence, ledger: [], now: F.now)
        #expect(decision.eligible == false)
        #expect(decision.reasons == [.evidenceUnverified])
        #expect(decision.evidenceFailures == [Self.failure])
    }

    @Test func decisionEncodesStableCodes() throws {
        let decision = EligibilityDecision(
            offerID: "wb1", eligible: false, reasons: [.lapsedTooRecently, .redeemedTooRecently],
            eligibleFrom: Date(timeIntervalSince1970: 0))
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.dateEncodingStrategy = .iso8601
        let json = String(decoding: try encoder.encode(decision), as: UTF8.self)
        #expect(
            json == #"{"eligible":false,"eligibleFrom":"1970-01-01T00:00:00Z","offerID":"wb1","reasons":["lapsed_too_recently","redeemed_too_recently"]}"#
        )
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        #expect(try decoder.decode(EligibilityDecision.self, from: Data(json.utf8)) == decision)
        #expect(EligibilityReason.allCases.map(\.rawValue).contains("apple_win_back_available"))
    }

    @Test func monthsAreUTCCalendarMonths() {
        let evaluator = EligibilityEvaluator()
        let jan31 = Date(timeIntervalSince1970: 1_738_281_600)  // 2025-01-31T00:00:00Z
        #expect(evaluator.adding(months: 1, to: jan31) == Date(timeIntervalSince1970: 1_740_700_800))  // 2025-02-28
        let lateEvening = Date(timeIntervalSince1970: 1_740_783_600)  // 2025-02-28T23:00:00Z
        #expect(evaluator.adding(months: 1, to: lateEvening) == Date(timeIntervalSince1970: 1_743_202_800))  // 2025-03-28T23:00Z
    }

    @Test func catalogWinBackOffersFeedAnyWinBackScope() throws {
        let catalog = try OfferCatalog(offers: [
            F.offer(id: "wb1", rules: OfferRules(waitBetweenOffersMonths: 6, waitScope: .anyWinBack)),
            F.offer(id: "wb2"),
        ])
        let decision = EligibilityEvaluator(catalog: catalog).evaluate(
            catalog.offers[0],
            evidence: EligibilityEvidence(transactions: F.paidMonths(3, endingAt: F.monthsAgo(3))),
            ledger: [IssuedOfferRecord(offerID: "wb2", issuedAt: F.monthsAgo(1))],
            now: F.now)
        #expect(decision.reasons == [.redeemedTooRecently])
    }
}
