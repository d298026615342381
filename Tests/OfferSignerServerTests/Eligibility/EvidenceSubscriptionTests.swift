import Foundation
import OfferSignerEligibility
import Testing

@testable import OfferSignerServer

/// The subscription an offer decided on the app's evidence keeps on its issuance
/// (`HistorySourceResolver.subscription(in:offer:transactionID:appAccountToken:)`): only verified
/// transactions of the offer's group, none of another account, never a guess between several.
@Suite struct EvidenceSubscriptionTests {
    static let offer = OfferDefinition(offerID: "wb", bundleID: "com.example.app", productIDs: ["pro.monthly"], subscriptionGroupID: "G1", kind: .winBack)
    static let token = UUID(uuidString: "7e3fb20b-4cdb-47cc-936d-99d65f608138")!

    static func transaction(
        _ id: String, original: String, group: String = "G1", environment: AppleEnvironment = .production, token: String? = nil
    ) -> VerifiedTransaction {
        VerifiedTransaction(
            transactionID: id, originalTransactionID: original, productID: "pro.monthly", subscriptionGroupID: group,
            purchaseDate: Date(timeIntervalSince1970: 1_790_000_000), environment: environment, bundleID: "com.example.app", appAccountToken: token)
    }

    func subscription(_ transactions: [VerifiedTransaction], transactionID: String? = nil, token: UUID? = nil) -> [String]? {
        HistorySourceResolver.subscription(in: EligibilityEvidence(transactions: transactions), offer: Self.offer, transactionID: transactionID, appAccountToken: token)
            .map { [$0.originalTransactionID, $0.environment] }
    }

    @Test func oneSubscriptionOfTheGroup() {
        #expect(subscription([Self.transaction("11", original: "10"), Self.transaction("12", original: "10"), Self.transaction("21", original: "20", group: "G2")])
            == ["10", "Production"])
        #expect(subscription([Self.transaction("11", original: "10", environment: .sandbox)]) == ["10", "Sandbox"])
    }

    @Test func noneOrAmbiguous() {
        #expect(subscription([]) == nil)
        #expect(subscription([Self.transaction("21", original: "20", group: "G2")]) == nil, "another group's subscription is not the offer's")
        #expect(subscription([Self.transaction("11", original: "10"), Self.transaction("31", original: "30")]) == nil, "two subscriptions: no guess")
        #expect(subscription([Self.transaction("11", original: "10"), Self.transaction("12", original: "10", environment: .sandbox)]) == nil)
    }

    @Test func theNamedTransactionDecides() {
        let both = [Self.transaction("11", original: "10"), Self.transaction("31", original: "30")]
        #expect(subscription(both, transactionID: "31") == ["30", "Production"])
        #expect(subscription(both, transactionID: "10") == ["10", "Production"], "an original transaction ID names its subscription")
        #expect(subscription(both, transactionID: "99") == nil)
    }

    @Test func anotherAccountsTransactionsDoNotCount() {
        let mine = Self.transaction("11", original: "10", token: Self.token.uuidString)
        let theirs = Self.transaction("31", original: "30", token: UUID().uuidString)
        #expect(subscription([mine, theirs], token: Self.token) == ["10", "Production"])
        #expect(subscription([theirs], transactionID: "31", token: Self.token) == nil)
    }

    @Test("With a token, a subscription counts only when one of its transactions carries the token and none carries another: token-less ones could be anyone's")
    func withATokenOnlyTheCustomersSubscription() {
        let mine = Self.token.uuidString
        let tokenless = [Self.transaction("11", original: "10"), Self.transaction("12", original: "10")]
        #expect(subscription(tokenless, token: Self.token) == nil, "no transaction carries the customer's token")
        #expect(subscription(tokenless, transactionID: "11", token: Self.token) == nil, "named, but not shown to be the customer's")
        #expect(subscription(tokenless) == ["10", "Production"], "without a token in the request, as before")
        let signedInLater = [Self.transaction("11", original: "10"), Self.transaction("12", original: "10", token: mine.lowercased())]
        #expect(subscription(signedInLater, token: Self.token) == ["10", "Production"], "one transaction carries the token (any case)")
        let mixed = [Self.transaction("11", original: "10", token: mine), Self.transaction("12", original: "10", token: UUID().uuidString)]
        #expect(subscription(mixed, token: Self.token) == nil, "another account's token on the same subscription")
        #expect(subscription(mixed, transactionID: "12", token: Self.token) == nil)
        // A token-less subscription beside the customer's is not a second candidate, and is never picked when named.
        let beside = [Self.transaction("11", original: "10", token: mine), Self.transaction("31", original: "30")]
        #expect(subscription(beside, token: Self.token) == ["10", "Production"])
        #expect(subscription(beside, transactionID: "31", token: Self.token) == nil)
    }
}
