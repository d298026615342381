// The evidence collector: the customer's signed history for one subscription group, from StoreKit,
// within the service's limits. Compiled twice, like SignedPromotionalOffer+StoreKit.swift (see
// there): in the shipped target against the real StoreKit, and on Linux, through a symlink in
// Client/Tests/OfferSignerClientStoreKitTests/, against StoreKitShim.
//
// StoreKit API used here, with Apple's declarations (iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0,
// visionOS 1.0 for all of them):
//  * Transaction.all — `static var all: Transaction.Transactions { get }`
//      https://developer.apple.com/documentation/storekit/transaction/all
//  * Product.SubscriptionInfo.status(for:) — `static func status(for groupID: String) async throws -> [Product.SubscriptionInfo.Status]`
//      https://developer.apple.com/documentation/storekit/product/subscriptioninfo/status(for:)
//  * VerificationResult.jwsRepresentation, .unsafePayloadValue; Transaction.subscriptionGroupID, .purchaseDate

#if OFFER_SIGNER_CLIENT_STOREKIT_TESTS
#if !canImport(StoreKit)
import Foundation
import OfferSignerClient
import StoreKitShim
#endif
#elseif canImport(StoreKit)
import Foundation
import StoreKit
#endif

#if (OFFER_SIGNER_CLIENT_STOREKIT_TESTS && !canImport(StoreKit)) || (!OFFER_SIGNER_CLIENT_STOREKIT_TESTS && canImport(StoreKit))

extension PurchaseEvidence {
    /// The customer's evidence for the subscription group `subscriptionGroupID`, as StoreKit has
    /// it, within the service's limits (1,000 JWS, 1 MiB body: see
    /// ``PurchaseEvidence/bounded(signedTransactions:signedRenewalInfos:maximumItems:maximumBytes:)``).
    ///
    /// Rule: every renewal info of the group, then the group's transactions newest first, verified
    /// or not (the service verifies each itself and reports the ones it cannot use in
    /// `evidenceFailures`).
    ///
    /// - Returns: The evidence, and whether anything was left out to stay within the limits.
    public static func current(subscriptionGroupID: String) async throws -> (evidence: PurchaseEvidence, truncated: Bool) {
        var transactions: [VerificationResult<Transaction>] = []
        for await result in Transaction.all {
            transactions.append(result)
        }
        let statuses = try await Product.SubscriptionInfo.status(for: subscriptionGroupID)
        return collect(transactions: transactions, renewalInfos: statuses.map(\.renewalInfo), subscriptionGroupID: subscriptionGroupID)
    }

    /// ``current(subscriptionGroupID:)`` on values already read from StoreKit.
    static func collect(
        transactions: [VerificationResult<Transaction>],
        renewalInfos: [VerificationResult<Product.SubscriptionInfo.RenewalInfo>],
        subscriptionGroupID: String
    ) -> (evidence: PurchaseEvidence, truncated: Bool) {
        let group = transactions
            .filter { $0.unsafePayloadValue.subscriptionGroupID == subscriptionGroupID }
            .sorted { $0.unsafePayloadValue.purchaseDate > $1.unsafePayloadValue.purchaseDate }
        return bounded(signedTransactions: group.map(\.jwsRepresentation), signedRenewalInfos: renewalInfos.map(\.jwsRepresentation))
    }
}

#endif
