import Foundation

/// What an app answers Apple's Retention Messaging requests with (`apps.<bundleID>.retention`).
///
/// Rules: per product, the offers are tried in order and the first the customer is eligible for
/// is answered; when none is, the fallback (a message, a switch-plan suggestion, or nothing) is.
/// Every offer named must be a catalog offer of the app that applies to the product (checked when
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

/// A promotional offer and the approved message Apple shows with it.
public struct RetentionOfferChoice: Sendable, Hashable, Encodable {
    public var offerID: String
    /// The `messageIdentifier` of a message uploaded to Apple (a UUID, lowercased).
    public var messageIdentifier: String

    public init(offerID: String, messageIdentifier: String) {
        self.offerID = offerID
        self.messageIdentifier = messageIdentifier
    }
}

/// What is answered when no offer is.
public enum RetentionFallback: Sendable, Hashable, Encodable {
    /// A text (and image) message.
    case message(messageIdentifier: String)
    /// A switch-plan suggestion.
    case alternateProduct(messageIdentifier: String, productID: String)
}
