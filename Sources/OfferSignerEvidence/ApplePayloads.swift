import Foundation
import OfferSignerEligibility

/// Wire form of Apple's `JWSTransactionDecodedPayload` (the fields we use; others are ignored).
struct TransactionPayload: Decodable {
    var transactionId: String
    var originalTransactionId: String
    var productId: String
    var subscriptionGroupIdentifier: String?
    var purchaseDate: Double
    var expiresDate: Double?
    var revocationDate: Double?
    var inAppOwnershipType: String?
    var offerType: Int?
    var offerIdentifier: String?
    var offerDiscountType: String?
    var offerPeriod: String?
    var price: Int64?
    var currency: String?
    var storefront: String?
    var environment: String
    var bundleId: String
    var type: String?
    var appAccountToken: String?
    var signedDate: Double?
    var isUpgraded: Bool?
    var transactionReason: String?
    var revocationReason: Int?
    var revocationType: String?
    var revocationPercentage: Int?

    func verified(environment: AppleEnvironment) -> VerifiedTransaction {
        VerifiedTransaction(
            transactionID: transactionId,
            originalTransactionID: originalTransactionId,
            productID: productId,
            subscriptionGroupID: subscriptionGroupIdentifier,
            purchaseDate: date(purchaseDate),
            expiresDate: expiresDate.map(date),
            revocationDate: revocationDate.map(date),
            ownershipType: inAppOwnershipType.map(AppleOwnershipType.init(rawValue:)),
            offerType: offerType.map(AppleOfferType.init(rawValue:)),
            offerIdentifier: offerIdentifier,
            offerDiscountType: offerDiscountType.map(AppleOfferDiscountType.init(rawValue:)),
            offerPeriod: offerPeriod,
            price: price,
            currency: currency,
            storefront: storefront,
            environment: environment,
            bundleID: bundleId,
            type: type.map(AppleProductType.init(rawValue:)),
            appAccountToken: appAccountToken,
            signedDate: signedDate.map(date),
            isUpgraded: isUpgraded,
            transactionReason: transactionReason.map(AppleTransactionReason.init(rawValue:)),
            revocationReason: revocationReason,
            revocationType: revocationType.map(AppleRevocationType.init(rawValue:)),
            revocationPercentage: revocationPercentage
        )
    }
}

/// Wire form of Apple's `JWSRenewalInfoDecodedPayload` (the fields we use). It has no `bundleId`.
struct RenewalInfoPayload: Decodable {
    var originalTransactionId: String?
    var productId: String?
    var autoRenewProductId: String?
    var autoRenewStatus: Int?
    var isInBillingRetryPeriod: Bool?
    var gracePeriodExpiresDate: Double?
    var eligibleWinBackOfferIds: [String]?
    var environment: String
    var signedDate: Double?
    var expirationIntent: Int?
    var offerType: Int?
    var offerIdentifier: String?
    var offerDiscountType: String?
    var offerPeriod: String?
    var renewalDate: Double?

    func verified(environment: AppleEnvironment) -> VerifiedRenewalInfo {
        VerifiedRenewalInfo(
            originalTransactionID: originalTransactionId,
            productID: productId,
            autoRenewProductID: autoRenewProductId,
            autoRenewEnabled: autoRenewStatus.map { $0 == 1 },
            isInBillingRetryPeriod: isInBillingRetryPeriod,
            gracePeriodExpiresDate: gracePeriodExpiresDate.map(date),
            eligibleWinBackOfferIDs: eligibleWinBackOfferIds ?? [],
            environment: environment,
            signedDate: signedDate.map(date),
            expirationIntent: expirationIntent,
            offerType: offerType.map(AppleOfferType.init(rawValue:)),
            offerIdentifier: offerIdentifier,
            offerDiscountType: offerDiscountType.map(AppleOfferDiscountType.init(rawValue:)),
            offerPeriod: offerPeriod,
            renewalDate: renewalDate.map(date)
        )
    }
}

/// The date the App Store signed a payload, read before the signature is checked (it only selects the
/// time at which certificate validity is evaluated; the signature check that follows binds it).
struct SigningDateProbe: SignedPayload {
    var signedDate: Double?
    var receiptCreationDate: Double?
}

/// A payload type the verifier decodes once, reading its signing time from the decoded value.
protocol SignedPayload: Decodable {
    /// When the item was signed (milliseconds since 1970), as the payload states it.
    var signedDate: Double? { get }
}

extension TransactionPayload: SignedPayload {}
extension RenewalInfoPayload: SignedPayload {}

/// Apple dates are milliseconds since 1970.
func date(_ milliseconds: Double) -> Date {
    Date(timeIntervalSince1970: milliseconds / 1000)
}
