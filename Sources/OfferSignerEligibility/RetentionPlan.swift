import Foundation

/// What an app answers Apple's Retention Messaging requests with (`apps.<bundleID>.retention`).
///
/// Rules: per product, the offers are tried in order and the first the customer is eligible for
/// is answered; when none is, the fallback (a message, a switch-plan suggestion, or nothing) is.
/// Every offer named must be a catalog offer of the app that applies to the product, and a
/// switch-plan suggestion must name another product of the same subscription group (checked when
/// the catalog is read).
public struct RetentionPlan: Sendable, Hashable, Encodable {
    /// Which promotional-offer signature Apple gets: the compact JWS (`v2`, the default, which
    /// Apple recommends) or the legacy signature (`v1`).
    public enum SignatureVersion: String, Sendable, Hashable, CaseIterable, Encodable {
        case v1 = "v1"
        case v2 = "v2"
    }

    public var signatureVersion: SignatureVersion
    /// Plans by the product Apple asks about (`productId` of the request).
    public var products: [String: RetentionProductPlan]

    public init(signatureVersion: SignatureVersion = .v2, products: [String: RetentionProductPlan]) {
        self.signatureVersion = signatureVersion
        self.products = products
    }
}

/// One product's retention choices.
public struct RetentionProductPlan: Sendable, Hashable, Encodable {
    /// Promotional offers, best first.
    public var offers: [RetentionOfferChoice]
    /// What to answer when no offer is eligible (or the decision could not be made in time);
    /// nil answers nothing (Apple shows the default message).
    public var fallback: RetentionFallback?

    public init(offers: [RetentionOfferChoice], fallback: RetentionFallback?) {
        self.offers = offers
        self.fallback = fallback
    }
}

/// The `messageIdentifier` of a message uploaded to Apple, per customer locale.
///
/// Apple configures its default retention messages per product and locale (*Configure Default
/// Message*, https://developer.apple.com/documentation/retentionmessaging/configure-default-message,
/// "for every auto-renewable subscription's product ID in every locale"), and each request names
/// the customer's locale (`userLocale` of `DecodedRealtimeRequestBody`,
/// https://developer.apple.com/documentation/retentionmessaging/decodedrealtimerequestbody). So a
/// plan may name a message per locale.
///
/// Rule (`identifier(for:)`): the message of the request's locale (`en-US`), else of its language
/// alone (`en`), else the default. Apple's `locale` page
/// (https://developer.apple.com/documentation/retentionmessaging/locale) says a locale is a
/// "locale short code" and "The locale string is case-sensitive"; its examples use `en-US`.
/// Locales are nevertheless compared case-insensitively, `_` as `-`: a tolerance of ours, so a
/// catalog key spelled `en_us` still matches Apple's `en-US`.
public struct LocalizedMessageIdentifier: Sendable, Hashable, Encodable {
    /// The message for any locale not listed (a UUID, lowercased).
    public var defaultIdentifier: String
    /// Messages by normalized locale (`en-us`, `de`): lowercased, `_` written `-`.
    public var byLocale: [String: String]

    public init(default defaultIdentifier: String, byLocale: [String: String] = [:]) {
        self.defaultIdentifier = defaultIdentifier
        self.byLocale = Dictionary(byLocale.map { (Self.normalized($0.key), $0.value) }) { first, _ in first }
    }

    /// The message for a customer's `userLocale` (nil or empty: the default).
    public func identifier(for userLocale: String?) -> String {
        guard let userLocale, !userLocale.isEmpty, !byLocale.isEmpty else { return defaultIdentifier }
        let locale = Self.normalized(userLocale)
        if let exact = byLocale[locale] { return exact }
        if let language = locale.split(separator: "-").first, let match = byLocale[String(language)] { return match }
        return defaultIdentifier
    }

    /// `en_US` and `EN-us` both read `en-us`.
    public static func normalized(_ locale: String) -> String {
        locale.lowercased().replacingOccurrences(of: "_", with: "-")
    }
}

/// A promotional offer and the approved message Apple shows with it.
public struct RetentionOfferChoice: Sendable, Hashable, Encodable {
    public var offerID: String
    /// The message, per locale.
    public var message: LocalizedMessageIdentifier

    /// The default message (for any locale not listed).
    public var messageIdentifier: String { message.defaultIdentifier }

    public init(offerID: String, message: LocalizedMessageIdentifier) {
        self.offerID = offerID
        self.message = message
    }

    /// One message for every locale.
    public init(offerID: String, messageIdentifier: String) {
        self.init(offerID: offerID, message: LocalizedMessageIdentifier(default: messageIdentifier))
    }
}

/// Apple's `billingPlanType` of a switch-plan suggestion (`AlternateProduct.billingPlanType`):
/// how the suggested subscription is billed. Apple's model may gain values, but the catalog
/// accepts only the values Apple's model lists today (`known`).
///
/// Apple: https://developer.apple.com/documentation/retentionmessaging/billingplantype, and
/// `appstoreserverlibrary/models/BillingPlanType.py` of Apple's App Store Server Library for
/// Python, which lists `BILLED_UPFRONT` and `MONTHLY` without describing them. That `MONTHLY` is a
/// monthly-billed subscription with a 12-month commitment is our reading of the names, not
/// Apple's text.
public struct AlternateProductBillingPlanType: RawRepresentable, Sendable, Hashable, Encodable {
    public var rawValue: String
    public init(rawValue: String) { self.rawValue = rawValue }

    /// `BILLED_UPFRONT`: the whole period is billed at once.
    public static let billedUpfront = AlternateProductBillingPlanType(rawValue: "BILLED_UPFRONT")
    /// `MONTHLY`: billed monthly (a 12-month commitment, by our reading of the name).
    public static let monthly = AlternateProductBillingPlanType(rawValue: "MONTHLY")
    /// The values Apple's library knows today; the catalog accepts only these.
    public static let known: [AlternateProductBillingPlanType] = [.billedUpfront, .monthly]

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

/// What is answered when no offer is.
public enum RetentionFallback: Sendable, Hashable, Encodable {
    /// A text (and image) message (`message` of Apple's `RealtimeResponseBody`).
    case message(LocalizedMessageIdentifier)
    /// A switch-plan suggestion (`alternateProduct`): another product of the same subscription
    /// group, optionally with Apple's `billingPlanType`.
    case alternateProduct(LocalizedMessageIdentifier, productID: String, billingPlanType: AlternateProductBillingPlanType?)

    /// A message with one identifier for every locale.
    public static func message(messageIdentifier: String) -> RetentionFallback {
        .message(LocalizedMessageIdentifier(default: messageIdentifier))
    }

    /// A switch-plan suggestion with one message for every locale and no billing plan type.
    public static func alternateProduct(messageIdentifier: String, productID: String) -> RetentionFallback {
        .alternateProduct(LocalizedMessageIdentifier(default: messageIdentifier), productID: productID, billingPlanType: nil)
    }
}
