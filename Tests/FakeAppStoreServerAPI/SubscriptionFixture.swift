import AppleTestChain
import Foundation

/// A subscriber's history for tests: monthly renewals of one subscription, signed like the App
/// Store signs them (transactions and the renewal info of the subscription group).
public struct SubscriptionFixture: Sendable {
    public var bundleID: String
    public var productID: String
    public var subscriptionGroupID: String
    public var originalTransactionID: String
    public var environment: String
    public var appAccountToken: String?
    /// Start of each paid month, oldest first; each lasts one calendar month (UTC).
    public var periodStarts: [Date]

    public init(
        bundleID: String, productID: String, subscriptionGroupID: String, originalTransactionID: String, environment: String = "Production",
        appAccountToken: String? = nil, periodStarts: [Date]
    ) {
        self.bundleID = bundleID
        self.productID = productID
        self.subscriptionGroupID = subscriptionGroupID
        self.originalTransactionID = originalTransactionID
        self.environment = environment
        self.appAccountToken = appAccountToken
        self.periodStarts = periodStarts
    }

    /// `count` consecutive months ending with the month that contains `now` (so the last one is active).
    public static func monthlyStarts(count: Int, activeAt now: Date) -> [Date] {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        let first = calendar.date(byAdding: .day, value: -10, to: now)!
        return (0..<count).reversed().map { calendar.date(byAdding: .month, value: -$0, to: first)! }
    }

    public func transactionID(_ index: Int) -> String { index == 0 ? originalTransactionID : "\(originalTransactionID)\(String(format: "%03d", index))" }

    public func expiry(_ index: Int) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar.date(byAdding: .month, value: 1, to: periodStarts[index])!
    }

    /// The JSON payload of transaction `index`.
    public func transactionPayload(_ index: Int) -> [String: Any] {
        var payload: [String: Any] = [
            "transactionId": transactionID(index), "originalTransactionId": originalTransactionID, "productId": productID,
            "subscriptionGroupIdentifier": subscriptionGroupID, "purchaseDate": TestAppleChain.milliseconds(periodStarts[index]),
            "originalPurchaseDate": TestAppleChain.milliseconds(periodStarts[0]),
            "expiresDate": TestAppleChain.milliseconds(expiry(index)), "inAppOwnershipType": "PURCHASED", "environment": environment,
            "bundleId": bundleID, "type": "Auto-Renewable Subscription", "price": 9990, "currency": "USD", "storefront": "USA",
            "signedDate": TestAppleChain.milliseconds(periodStarts[index]),
        ]
        if let appAccountToken { payload["appAccountToken"] = appAccountToken }
        return payload
    }

    /// Every transaction, signed.
    public func signedTransactions(_ chain: TestAppleChain) throws -> [String] {
        try periodStarts.indices.map { try chain.signJWS(transactionPayload($0)) }
    }

    /// The renewal info of the subscription, signed: auto-renew on while the last period runs at
    /// `signedAt`, off once it has expired (a subscription that expired and is not in billing retry
    /// does not renew: Apple's `autoRenewStatus` 0).
    public func signedRenewalInfo(_ chain: TestAppleChain, signedAt: Date) throws -> String {
        let renews = periodStarts.isEmpty || expiry(periodStarts.count - 1) > signedAt
        return try chain.signJWS([
            "originalTransactionId": originalTransactionID, "productId": productID, "autoRenewProductId": productID, "autoRenewStatus": renews ? 1 : 0,
            "environment": environment, "signedDate": TestAppleChain.milliseconds(signedAt),
        ])
    }

    /// The fake's view of this customer: all transactions in the history, the latest one in the status.
    public func customer(_ chain: TestAppleChain, now: Date, status: Int = 1) throws -> FakeAppStoreServerAPI.Customer {
        let signed = try signedTransactions(chain)
        return FakeAppStoreServerAPI.Customer(
            environment: environment, transactionIDs: Set(periodStarts.indices.map(transactionID)), signedTransactions: signed,
            statuses: [
                .init(
                    subscriptionGroupIdentifier: subscriptionGroupID, originalTransactionID: originalTransactionID, status: status,
                    signedTransactionInfo: signed.last!, signedRenewalInfo: try signedRenewalInfo(chain, signedAt: now))
            ])
    }
}
