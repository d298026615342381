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
        var payload: [String: Any] = [
            "transactionId": "1000\(String(format: "%03d", index))", "originalTransactionId": "1000", "webOrderLineItemId": "9000\(index)",
            "bundleId": F.bundleID, "productId": F.monthly, "subscriptionGroupIdentifier": F.groupID,
            "purchaseDate": TestAppleChain.milliseconds(F.months(index, from: start)),
            "originalPurchaseDate": TestAppleChain.milliseconds(start),
            "expiresDate": TestAppleChain.milliseconds(F.months(index + 1, from: start)), "quantity": 1, "type": "Auto-Renewable Subscription",
            "inAppOwnershipType": "PURCHASED", "price": 9990, "currency": "USD", "storefront": "USA", "storefrontId": "143441",
            "environment": "Production", "transactionReason": index == 0 ? "PURCHASE" : "RENEWAL",
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
