import AppleTestChain
import Foundation
@testable import OfferSignerEligibility
import OfferSignerEvidence
import Testing

/// How many redemptions a pay-as-you-go promotional offer makes, read from transactions as Apple
/// signs them (JWSTransactionDecodedPayload with `offerType` 2, `offerIdentifier`,
/// `offerDiscountType` `PAY_AS_YOU_GO` and `offerPeriod`), signed by the Apple-like test chain and
/// verified: one run of the offer's periods is one redemption, the same offer accepted again for
/// the renewal that ends the run is another (`VerifiedTransaction.payAsYouGoContinuations(_:)`).
@Suite("Pay-as-you-go redemptions bounded by offerPeriod")
struct PayAsYouGoRedemptionTests {
    typealias F = Fixture
    static let chain = Result { try TestAppleChain() }

    /// Monthly period `index` of subscription `1000` from `start` (calendar months in UTC, as Apple
    /// renews them): the first a purchase, the others renewals; under the offer `wb1` when
    /// `underOffer`, with `offerPeriod` when given.
    static func payload(_ index: Int, from start: Date, underOffer: Bool, offerPeriod: String?) -> [String: Any] {
        payload(
            index, purchase: F.months(index, from: start), expires: F.months(index + 1, from: start), original: start, underOffer: underOffer,
            offerPeriod: offerPeriod)
    }

    /// Period `index` of subscription `1000`, from `purchase` to `expires`, in `environment`; the
    /// first a purchase, the others renewals; under the offer `wb1` when `underOffer`.
    static func payload(
        _ index: Int, purchase: Date, expires: Date, original: Date? = nil, underOffer: Bool, offerPeriod: String?,
        environment: String = "Production"
    ) -> [String: Any] {
        var payload: [String: Any] = [
            "transactionId": "1000\(String(format: "%03d", index))", "originalTransactionId": "1000", "webOrderLineItemId": "9000\(index)",
            "bundleId": F.bundleID, "productId": F.monthly, "subscriptionGroupIdentifier": F.groupID,
            "purchaseDate": TestAppleChain.milliseconds(purchase), "originalPurchaseDate": TestAppleChain.milliseconds(original ?? purchase),
            "expiresDate": TestAppleChain.milliseconds(expires), "quantity": 1, "type": "Auto-Renewable Subscription",
            "inAppOwnershipType": "PURCHASED", "price": 9990, "currency": "USD", "storefront": "USA", "storefrontId": "143441",
            "environment": environment, "transactionReason": index == 0 ? "PURCHASE" : "RENEWAL",
            "signedDate": TestAppleChain.milliseconds(F.now),
        ]
        if underOffer {
            payload["offerType"] = 2
            payload["offerIdentifier"] = "wb1"
            payload["offerDiscountType"] = "PAY_AS_YOU_GO"
            payload["price"] = 4990
            if let offerPeriod { payload["offerPeriod"] = offerPeriod }
        }
        return payload
    }

    /// A subscription of `count` monthly periods ending before `F.now`, each period `i` under the
    /// offer when `underOffer(i)`, signed and verified as the service reads Apple's history.
    static func history(count: Int, offerPeriod: String?, underOffer: (Int) -> Bool) async throws -> [VerifiedTransaction] {
        let chain = try Self.chain.get()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: F.bundleID, environment: .production)
        let start = F.months(-count - 1, from: F.now)
        var verified: [VerifiedTransaction] = []
        for index in 0..<count {
            let jws = try chain.signJWS(payload(index, from: start, underOffer: underOffer(index), offerPeriod: offerPeriod))
            guard case .success(let transaction) = await verifier.verifyTransaction(jws, now: F.now) else {
                Issue.record("period \(index) did not verify")
                return []
            }
            verified.append(transaction)
        }
        return verified
    }

    /// Signs and verifies `payloads` as the service reads Apple's history (in `environment`).
    static func verified(_ payloads: [[String: Any]], environment: AppleEnvironment = .production) async throws -> [VerifiedTransaction] {
        let chain = try Self.chain.get()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: F.bundleID, environment: environment)
        var verified: [VerifiedTransaction] = []
        for payload in payloads {
            guard case .success(let transaction) = await verifier.verifyTransaction(try chain.signJWS(payload), now: F.now) else {
                Issue.record("\(payload["transactionId"] ?? "?") did not verify")
                return []
            }
            verified.append(transaction)
        }
        return verified
    }

    /// A UTC date at 10:00.
    static func date(_ year: Int, _ month: Int, _ day: Int) -> Date {
        F.utc.date(from: DateComponents(year: year, month: month, day: day, hour: 10))!
    }

    static func redemptions(_ transactions: [VerifiedTransaction]) -> Int {
        EligibilityEvaluator.redemptions(in: transactions) { $0.offerIdentifier == "wb1" }.count
    }

    /// The `maxRedemptions` reason for an offer allowing `limit` redemptions, on Apple's record.
    static func limited(_ transactions: [VerifiedTransaction], limit: Int) -> Bool {
        let offer = F.offer(.any, id: "wb1", rules: OfferRules(maxRedemptions: limit))
        return EligibilityEvaluator().evaluate(
            offer, evidence: EligibilityEvidence(transactions: transactions, renewalInfos: []), ledger: [], now: F.now, counting: .applesRecord
        ).reasons.contains(.maxRedemptions)
    }

    @Test("A three-month pay-as-you-go offer (P3M) on a monthly product taken twice back to back is two redemptions")
    func takenTwice() async throws {
        let history = try await Self.history(count: 8, offerPeriod: "P3M") { (1...6).contains($0) }
        #expect(history.count == 8)
        #expect(history.allSatisfy { $0.offerIdentifier == nil || $0.offerPeriod == "P3M" }, "offerPeriod is read from Apple's payload")
        #expect(Self.redemptions(history) == 2)
        #expect(Self.limited(history, limit: 2))
        #expect(!Self.limited(history, limit: 3))
        // The second run's first period starts a redemption; the others continue one.
        let continuing = VerifiedTransaction.payAsYouGoContinuations(history)
        #expect(continuing.keys.sorted() == ["1000002", "1000003", "1000005", "1000006"])
        #expect(continuing["1000006"]?.transactionID == "1000004")
    }

    @Test("One run of three monthly periods of a P3M offer is one redemption")
    func singleRun() async throws {
        let history = try await Self.history(count: 5, offerPeriod: "P3M") { (1...3).contains($0) }
        #expect(Self.redemptions(history) == 1)
        #expect(!Self.limited(history, limit: 2) && Self.limited(history, limit: 1))
    }

    @Test("A one-year pay-as-you-go offer (P1Y) on a monthly product: twelve periods are one redemption, the thirteenth under the offer begins another")
    func oneYearOnMonthly() async throws {
        let year = try await Self.history(count: 14, offerPeriod: "P1Y") { (1...12).contains($0) }
        #expect(Self.redemptions(year) == 1)
        let again = try await Self.history(count: 15, offerPeriod: "P1Y") { (1...14).contains($0) }
        #expect(Self.redemptions(again) == 2)
        #expect(VerifiedTransaction.payAsYouGoContinuations(again)["1000013"] == nil)
    }

    @Test("A two-month offer (P2M) on a monthly product whose second period was renewed after a 30-day billing retry is one redemption: periods are counted, not calendar time")
    func billingRetryInsideTheRun() async throws {
        let start = F.months(-6, from: F.now)
        let second = F.months(2, from: start).addingTimeInterval(30 * F.day)  // a 30-day billing retry after period 1
        let history = try await Self.verified([
            Self.payload(0, purchase: start, expires: F.months(1, from: start), underOffer: false, offerPeriod: nil),
            Self.payload(1, purchase: F.months(1, from: start), expires: F.months(2, from: start), underOffer: true, offerPeriod: "P2M"),
            Self.payload(2, purchase: second, expires: F.months(1, from: second), underOffer: true, offerPeriod: "P2M"),
            Self.payload(3, purchase: F.months(1, from: second), expires: F.months(2, from: second), underOffer: false, offerPeriod: nil),
        ])
        #expect(history.count == 4)
        #expect(
            second >= AppleOfferPeriod(months: 2).end(from: history[1].purchaseDate)!.addingTimeInterval(-15 * F.day),
            "past the calendar rule's limit (the offer's end less half a period)")
        #expect(VerifiedTransaction.payAsYouGoContinuations(history)["1000002"]?.transactionID == "1000001")
        #expect(Self.redemptions(history) == 1)
        #expect(Self.limited(history, limit: 1) && !Self.limited(history, limit: 2))
        // A third period under the offer after the retry would be past the offer's two: a new redemption.
        let third = try await Self.verified([
            Self.payload(3, purchase: F.months(1, from: second), expires: F.months(2, from: second), underOffer: true, offerPeriod: "P2M")
        ])
        #expect(Self.redemptions(Array(history.prefix(3)) + third) == 2)
    }

    @Test("A renewal info naming the offer after a run that went through a billing retry is a pending new redemption only when the next renewal's index reaches the offer's period count")
    func renewalInfoAfterBillingRetry() async throws {
        // Period 1 under the offer, period 2 after a 30-day billing retry and running now.
        let start = F.months(-3, from: F.now.addingTimeInterval(10 * F.day)).addingTimeInterval(-30 * F.day)
        let second = F.months(2, from: start).addingTimeInterval(30 * F.day)
        func count(offerPeriod: String) async throws -> Int {
            let history = try await Self.verified([
                Self.payload(0, purchase: start, expires: F.months(1, from: start), underOffer: false, offerPeriod: nil),
                Self.payload(1, purchase: F.months(1, from: start), expires: F.months(2, from: start), original: start, underOffer: true, offerPeriod: offerPeriod),
                Self.payload(2, purchase: second, expires: F.months(1, from: second), original: start, underOffer: true, offerPeriod: offerPeriod),
            ])
            #expect(history.count == 3 && history[2].expiresDate! > F.now)
            let chain = try Self.chain.get()
            let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: F.bundleID, environment: .production)
            let jws = try chain.signJWS([
                "originalTransactionId": "1000", "productId": F.monthly, "autoRenewProductId": F.monthly, "autoRenewStatus": 1,
                "environment": "Production", "signedDate": TestAppleChain.milliseconds(F.now), "offerType": 2, "offerIdentifier": "wb1",
                "offerDiscountType": "PAY_AS_YOU_GO", "offerPeriod": offerPeriod, "renewalDate": TestAppleChain.milliseconds(history[2].expiresDate!),
            ] as [String: Any])
            guard case .success(let info) = await verifier.verifyRenewalInfo(jws, now: F.now) else { throw CancellationError() }
            let customer = CustomerHistory(offer: F.offer(.any, id: "wb1"), evidence: EligibilityEvidence(transactions: history, renewalInfos: [info]))
            return EligibilityEvaluator.redemptions(in: customer) { $0 == .promotional && $1 == "wb1" }.count
        }
        #expect(try await count(offerPeriod: "P2M") == 2, "the next renewal would be the third period of a two-period offer: accepted again")
        #expect(try await count(offerPeriod: "P3M") == 1, "the third of three periods, months past the calendar end: the run going on")
    }

    @Test("A run that began on January 31 and renews on drifting dates (Feb 29, Mar 29, …) is twelve periods of a P1Y offer; the thirteenth under the offer is another redemption")
    func januaryThirtyFirstDrift() async throws {
        // Apple's renewal dates for a subscription bought on the 31st are not documented; here they
        // drift to the 29th (the assumption the calendar rule needed a half-period margin for).
        var dates = [Self.date(2023, 12, 31), Self.date(2024, 1, 31), Self.date(2024, 2, 29)]
        for month in 3...12 { dates.append(Self.date(2024, month, 29)) }
        dates += [Self.date(2025, 1, 29), Self.date(2025, 2, 28), Self.date(2025, 3, 28)]
        let payloads = (0..<(dates.count - 1)).map { index in
            Self.payload(index, purchase: dates[index], expires: dates[index + 1], underOffer: index >= 1, offerPeriod: "P1Y")
        }
        let history = try await Self.verified(payloads)
        #expect(history.count == 15)
        let continuing = VerifiedTransaction.payAsYouGoContinuations(history)
        #expect((2...12).allSatisfy { continuing["1000\(String(format: "%03d", $0))"]?.transactionID == "1000001" }, "periods 1–12: one run")
        #expect(continuing["1000013"] == nil, "period 13 (Jan 29, 2025) under the offer begins another")
        #expect(Self.redemptions(history) == 2)
        // The first period, Jan 31 → Feb 29, is one calendar month: 12 periods, not 366 / 29 ≈ 13.
        #expect(AppleOfferPeriod(years: 1).billingPeriods(firstFrom: dates[1], to: dates[2]) == 12)
        #expect(AppleOfferPeriod(months: 3).billingPeriods(firstFrom: Self.date(2025, 1, 31), to: Self.date(2025, 2, 28)) == 3)
        #expect(AppleOfferPeriod(months: 1).billingPeriods(firstFrom: Self.date(2025, 1, 31), to: Self.date(2025, 2, 28)) == 1)
    }

    /// Eight periods of a monthly subscription, 1–6 under a `P3M` pay-as-you-go offer accepted
    /// twice (1–3, then 4–6), the offer's first period from `firstStart` to `firstEnd` (the
    /// others calendar months from `firstEnd`).
    static func acceptedTwice(firstStart: Date, firstEnd: Date) async throws -> [VerifiedTransaction] {
        func period(_ index: Int) -> (Date, Date) {
            switch index {
            case 0: (Self.date(2025, 2, 1), Self.date(2025, 3, 1))
            case 1: (firstStart, firstEnd)
            default: (F.months(index - 2, from: firstEnd), F.months(index - 1, from: firstEnd))
            }
        }
        let payloads = (0..<8).map { index in
            Self.payload(index, purchase: period(index).0, expires: period(index).1, underOffer: (1...6).contains(index), offerPeriod: "P3M")
        }
        return try await Self.verified(payloads)
    }

    @Test("A first period shortened (a renewal recovered late in Billing Grace Period, the renewal date kept: 5 days) does not stretch a P3M offer to 18 periods: accepted again after three, another redemption")
    func shortFirstPeriod() async throws {
        let history = try await Self.acceptedTwice(firstStart: Self.date(2025, 3, 27), firstEnd: Self.date(2025, 4, 1))
        #expect(history.count == 8)
        #expect(history[1].expiresDate!.timeIntervalSince(history[1].purchaseDate) == 5 * F.day)
        let continuing = VerifiedTransaction.payAsYouGoContinuations(history)
        #expect(continuing["1000002"]?.transactionID == "1000001" && continuing["1000003"]?.transactionID == "1000001")
        #expect(continuing["1000004"] == nil, "the fourth period under the offer begins another redemption")
        #expect(continuing["1000005"]?.transactionID == "1000004" && continuing["1000006"]?.transactionID == "1000004")
        #expect(Self.redemptions(history) == 2)
        #expect(history[2].payAsYouGoBillingPeriods(begunBy: history[1], runBefore: [history[1]]) == 3)
        #expect(history[2].payAsYouGoBillingPeriods(begunBy: history[1]) == 3, "without the run: the first period and this one")
    }

    @Test("A first period lengthened (Extend Subscription Renewal Date, 20 days) does not shrink a P3M offer to 2 periods: its third period is no new redemption")
    func longFirstPeriod() async throws {
        let history = try await Self.acceptedTwice(firstStart: Self.date(2025, 3, 1), firstEnd: Self.date(2025, 4, 21))
        #expect(history.count == 8)
        let continuing = VerifiedTransaction.payAsYouGoContinuations(history)
        #expect(continuing["1000002"]?.transactionID == "1000001" && continuing["1000003"]?.transactionID == "1000001", "periods 1–3: one run")
        #expect(continuing["1000004"] == nil)
        #expect(continuing["1000005"]?.transactionID == "1000004" && continuing["1000006"]?.transactionID == "1000004")
        #expect(Self.redemptions(history) == 2)
        #expect(history[2].payAsYouGoBillingPeriods(begunBy: history[1]) == 3)
    }

    @Test("A second period extended into a length read as 2 or 3 months (Extend Subscription Renewal Date, 28 or 60 days) leaves a P2M or P3M run counted in months")
    func extendedSecondPeriod() {
        let start = Self.date(2025, 1, 1)
        let first = (start, F.months(1, from: start))
        let extendedTo59Days = (first.1, first.1.addingTimeInterval(59 * F.day))
        let extendedTo90Days = (first.1, first.1.addingTimeInterval(90 * F.day))
        #expect(AppleOfferPeriod(months: 2).billingPeriods(run: [first, extendedTo59Days]) == 2)
        #expect(AppleOfferPeriod(months: 3).billingPeriods(run: [first, extendedTo90Days]) == 3)
    }

    @Test("When no period of the run has a length Apple sells, the first period's count is bounded by the offer's length in weeks (P3M: 13)")
    func countBounded() {
        let start = Self.date(2025, 3, 27)
        #expect(AppleOfferPeriod(months: 3).billingPeriods(run: [(start, start.addingTimeInterval(5 * F.day)), (start, start.addingTimeInterval(40 * F.day))]) == 13)
        #expect(AppleOfferPeriod(months: 3).maximumBillingPeriods == 13 && AppleOfferPeriod(years: 1).maximumBillingPeriods == 52)
        #expect(AppleOfferPeriod(days: 3).maximumBillingPeriods == 1)
        // A standard length wins over any number of odd ones only by count; on a tie the shortest
        // (Extend Subscription Renewal Date only lengthens a period).
        let monthly = (start, F.months(1, from: start))
        let quarterly = (start, F.months(3, from: start))
        #expect(AppleOfferPeriod(years: 1).billingPeriods(run: [quarterly, monthly]) == 12)
        #expect(AppleOfferPeriod(years: 1).billingPeriods(run: [monthly, quarterly]) == 12)
        #expect(AppleOfferPeriod(years: 1).billingPeriods(run: [quarterly, quarterly, monthly]) == 4)
        #expect(AppleOfferPeriod(weeks: 4).billingPeriods(run: [(start, start.addingTimeInterval(3 * F.day)), (start, start.addingTimeInterval(7 * F.day))]) == 4)
    }

    @Test("offerPeriod counted in billing periods after Apple's table (single period length × period count): weeks, months, quarters, years")
    func periodCounts() {
        let start = Self.date(2025, 2, 1)
        #expect(AppleOfferPeriod(months: 1).billingPeriods(firstFrom: start, to: F.months(1, from: start)) == 1)
        #expect(AppleOfferPeriod(months: 2).billingPeriods(firstFrom: start, to: F.months(1, from: start)) == 2)
        #expect(AppleOfferPeriod(years: 1).billingPeriods(firstFrom: start, to: F.months(1, from: start)) == 12, "February is 28 days; still 12 months")
        #expect(AppleOfferPeriod(months: 6).billingPeriods(firstFrom: start, to: F.months(3, from: start)) == 2)
        #expect(AppleOfferPeriod(years: 1).billingPeriods(firstFrom: start, to: F.months(12, from: start)) == 1)
        #expect(AppleOfferPeriod(weeks: 4).billingPeriods(firstFrom: start, to: start.addingTimeInterval(7 * F.day)) == 4)
        #expect(AppleOfferPeriod(days: 3).billingPeriods(firstFrom: start, to: start.addingTimeInterval(3 * F.day)) == 1)
        #expect(AppleOfferPeriod(months: 1).billingPeriods(firstFrom: start, to: F.months(3, from: start)) == 1, "at least one period")
        #expect(AppleOfferPeriod(months: 1).billingPeriods(firstFrom: start, to: start) == nil, "a period without length")
    }

    @Test("Outside Production the run is not bounded (accelerated renewals make the count meaningless): a P3M offer taken twice in Sandbox is one redemption, as before")
    func sandboxKeepsTheRunUnbounded() async throws {
        // Sandbox renews a month in minutes: 5-minute periods.
        let start = F.now.addingTimeInterval(-3600)
        let payloads = (0..<8).map { index in
            Self.payload(
                index, purchase: start.addingTimeInterval(Double(index) * 300), expires: start.addingTimeInterval(Double(index + 1) * 300),
                underOffer: (1...6).contains(index), offerPeriod: "P3M", environment: "Sandbox")
        }
        let history = try await Self.verified(payloads, environment: .sandbox)
        #expect(history.count == 8 && history.allSatisfy { $0.environment == .sandbox })
        #expect(history[2].payAsYouGoBillingPeriods(begunBy: history[1]) == nil)
        #expect(Self.redemptions(history) == 1)
        // The same months in Production are two runs of three.
        let production = try await Self.history(count: 8, offerPeriod: "P3M") { (1...6).contains($0) }
        #expect(Self.redemptions(production) == 2)
    }

    @Test("Without offerPeriod (transactions from before Apple sent it) or with one that is not a duration, the periods of the offer are one redemption, as before")
    func withoutOfferPeriod() async throws {
        let missing = try await Self.history(count: 8, offerPeriod: nil) { (1...6).contains($0) }
        #expect(missing.allSatisfy { $0.offerPeriod == nil })
        #expect(Self.redemptions(missing) == 1)
        let unreadable = try await Self.history(count: 8, offerPeriod: "PT72H") { (1...6).contains($0) }
        #expect(Self.redemptions(unreadable) == 1)
    }

    @Test("A purchase under the offer is never a continuation, even within offerPeriod")
    func purchaseWithinOfferPeriod() async throws {
        var history = try await Self.history(count: 8, offerPeriod: "P6M") { (1...6).contains($0) }
        // Period 3 bought again (a resubscription with the offer): a new redemption inside P6M.
        history[3].transactionReason = .purchase
        #expect(Self.redemptions(history) == 2)
    }

    @Test("The offer accepted again for the renewal that ends its run (renewal info offerType 2, PAY_AS_YOU_GO, offerPeriod) is a pending redemption; during the run it is not")
    func acceptedAgainForTheNextRenewal() async throws {
        // Three periods under a P3M offer, the third running now (it ends after F.now).
        let chain = try Self.chain.get()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: F.bundleID, environment: .production)
        let start = F.months(-3, from: F.now.addingTimeInterval(10 * F.day))
        var history: [VerifiedTransaction] = []
        for index in 0..<4 {
            let jws = try chain.signJWS(Self.payload(index, from: start, underOffer: index >= 1, offerPeriod: "P3M"))
            guard case .success(let transaction) = await verifier.verifyTransaction(jws, now: F.now) else {
                Issue.record("period \(index) did not verify")
                return
            }
            history.append(transaction)
        }
        func renewalInfo(after last: VerifiedTransaction) async throws -> VerifiedRenewalInfo {
            let jws = try chain.signJWS([
                "originalTransactionId": "1000", "productId": F.monthly, "autoRenewProductId": F.monthly, "autoRenewStatus": 1,
                "environment": "Production", "signedDate": TestAppleChain.milliseconds(F.now), "offerType": 2, "offerIdentifier": "wb1",
                "offerDiscountType": "PAY_AS_YOU_GO", "offerPeriod": "P3M", "renewalDate": TestAppleChain.milliseconds(last.expiresDate!),
            ] as [String: Any])
            guard case .success(let info) = await verifier.verifyRenewalInfo(jws, now: F.now) else { throw CancellationError() }
            return info
        }
        func count(_ transactions: [VerifiedTransaction]) async throws -> Int {
            let info = try await renewalInfo(after: transactions.last!)
            let customer = CustomerHistory(offer: F.offer(.any, id: "wb1"), evidence: EligibilityEvidence(transactions: transactions, renewalInfos: [info]))
            return EligibilityEvaluator.redemptions(in: customer) { $0 == .promotional && $1 == "wb1" }.count
        }
        #expect(try await count(history) == 2, "the run, and the offer accepted again for the renewal after its three months")
        #expect(try await count(Array(history.prefix(3))) == 1, "within the run the next renewal continues it")
    }
}
