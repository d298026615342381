import Foundation

/// The App Store environment a piece of signed data comes from, as spelled in Apple's payloads
/// (`"environment"` field of a transaction or renewal info).
public enum AppleEnvironment: String, Sendable, Codable, Hashable, CaseIterable {
    /// Real purchases.
    case production = "Production"
    /// App Store sandbox (TestFlight, sandbox testers).
    case sandbox = "Sandbox"
    /// StoreKit testing in Xcode. Such data is not signed by Apple and never verifies against Apple's root.
    case xcode = "Xcode"
    /// Local StoreKit testing. Such data is not signed by Apple and never verifies against Apple's root.
    case localTesting = "LocalTesting"
}

/// Apple's `offerType` of a transaction (an open set: unknown future values are kept as-is).
public struct AppleOfferType: AppleOpenSetValue {
    public var rawValue: Int
    public init(rawValue: Int) { self.rawValue = rawValue }

    /// `1`: an introductory offer (including free trials).
    public static let introductory = AppleOfferType(rawValue: 1)
    /// `2`: a promotional offer — the kind this service signs. A redemption of one of our offers.
    public static let promotional = AppleOfferType(rawValue: 2)
    /// `3`: an offer code.
    public static let offerCode = AppleOfferType(rawValue: 3)
    /// `4`: one of Apple's own win-back offers (configured in App Store Connect, not signed by us).
    public static let winBack = AppleOfferType(rawValue: 4)
}

/// Apple's `offerDiscountType` (an open set).
public struct AppleOfferDiscountType: AppleOpenSetValue {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `FREE_TRIAL`.
    public static let freeTrial = AppleOfferDiscountType(rawValue: "FREE_TRIAL")
    /// `PAY_AS_YOU_GO`.
    public static let payAsYouGo = AppleOfferDiscountType(rawValue: "PAY_AS_YOU_GO")
    /// `PAY_UP_FRONT`.
    public static let payUpFront = AppleOfferDiscountType(rawValue: "PAY_UP_FRONT")
    /// `ONE_TIME`.
    public static let oneTime = AppleOfferDiscountType(rawValue: "ONE_TIME")
}

/// Apple's `inAppOwnershipType` (an open set).
public struct AppleOwnershipType: AppleOpenSetValue {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `PURCHASED`: the customer bought it.
    public static let purchased = AppleOwnershipType(rawValue: "PURCHASED")
    /// `FAMILY_SHARED`: access through Family Sharing; the customer did not pay.
    public static let familyShared = AppleOwnershipType(rawValue: "FAMILY_SHARED")
}

/// Apple's product `type` of a transaction (an open set).
public struct AppleProductType: AppleOpenSetValue {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    public static let autoRenewableSubscription = AppleProductType(rawValue: "Auto-Renewable Subscription")
    public static let nonRenewingSubscription = AppleProductType(rawValue: "Non-Renewing Subscription")
    public static let consumable = AppleProductType(rawValue: "Consumable")
    public static let nonConsumable = AppleProductType(rawValue: "Non-Consumable")
}

/// Apple's `transactionReason` of a transaction: `PURCHASE` (the customer bought, upgraded or
/// resubscribed) or `RENEWAL` (the App Store renewed the subscription). An open set, as Apple's.
public struct AppleTransactionReason: AppleOpenSetValue {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `PURCHASE`.
    public static let purchase = AppleTransactionReason(rawValue: "PURCHASE")
    /// `RENEWAL`.
    public static let renewal = AppleTransactionReason(rawValue: "RENEWAL")
}

/// Apple's `revocationType` of a transaction (an open set): what kind of refund or revocation
/// applies (appstoreserverlibrary/models/RevocationType.py; App Store Server Notifications
/// `revocationType`).
public struct AppleRevocationType: AppleOpenSetValue {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `REFUND_FULL`: the whole transaction was refunded.
    public static let refundFull = AppleRevocationType(rawValue: "REFUND_FULL")
    /// `REFUND_PRORATED`: part of it was refunded (`revocationPercentage` says how much).
    public static let refundProrated = AppleRevocationType(rawValue: "REFUND_PRORATED")
    /// `FAMILY_REVOKE`: access through Family Sharing was withdrawn; nothing was refunded.
    public static let familyRevoke = AppleRevocationType(rawValue: "FAMILY_REVOKE")
}

/// One of Apple's open sets of values (`offerType`, `inAppOwnershipType`, …): any raw value is
/// kept as it is, so a value Apple adds later still decodes, and it is coded as the bare value
/// (`2`, `"PURCHASED"`), as in Apple's payloads.
public protocol AppleOpenSetValue: RawRepresentable, Sendable, Codable, Hashable where RawValue: Codable & Sendable & Hashable {
    init(rawValue: RawValue)
}

extension AppleOpenSetValue {
    public init(from decoder: any Decoder) throws { self.init(rawValue: try decoder.singleValueContainer().decode(RawValue.self)) }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}
