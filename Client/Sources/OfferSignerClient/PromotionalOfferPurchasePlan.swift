import Foundation

/// Which promotional-offer purchase APIs the running OS offers.
///
/// ``current`` is computed with `#available`; tests and apps with special needs can pass their
/// own value to ``SignedPromotionalOffer/purchasePlan(now:capabilities:)``.
public struct StoreKitCapabilities: Sendable, Hashable {
    /// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)` is implemented by the OS itself
    /// (iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4 and later). Apple back-deploys
    /// the API to iOS 15 (`@backDeployed(before: iOS 26.0, …)`), so a JWS-only offer is still usable
    /// below that; the legacy signature is preferred there when both are available.
    public var nativeCompactJWSPromotionalOffers: Bool
    /// `Product.SubscriptionOffer.Signature` and
    /// `Product.PurchaseOption.promotionalOffer(offerID:signature:)` exist (iOS 17.4, macOS 14.4,
    /// tvOS 17.4, watchOS 10.4, visionOS 1.1 and later).
    public var subscriptionOfferSignature: Bool

    public init(nativeCompactJWSPromotionalOffers: Bool, subscriptionOfferSignature: Bool) {
        self.nativeCompactJWSPromotionalOffers = nativeCompactJWSPromotionalOffers
        self.subscriptionOfferSignature = subscriptionOfferSignature
    }

    /// What the running OS supports.
    public static var current: StoreKitCapabilities {
        var capabilities = StoreKitCapabilities(
            nativeCompactJWSPromotionalOffers: false, subscriptionOfferSignature: false
        )
        if #available(iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4, *) {
            capabilities.nativeCompactJWSPromotionalOffers = true
        }
        // macOS is left to `*`: the package's macOS floor (15) is above 14.4.
        if #available(iOS 17.4, tvOS 17.4, watchOS 10.4, visionOS 1.1, *) {
            capabilities.subscriptionOfferSignature = true
        }
        return capabilities
    }
}

/// A StoreKit-independent description of how to apply a ``SignedPromotionalOffer`` to a purchase.
///
/// The StoreKit helpers (`SignedPromotionalOffer.purchaseOptions()`) are a direct translation of
/// this value; apps wrapping StoreKit themselves (or using a cross-platform layer) can use it too.
public struct PromotionalOfferPurchasePlan: Sendable, Hashable {
    /// The original signature's parameters, with the signature already Base64-decoded.
    public struct SignatureParameters: Sendable, Hashable {
        public var keyID: String
        public var nonce: UUID
        /// UNIX milliseconds.
        public var timestamp: Int
        /// The DER ECDSA signature bytes (Base64-decoded).
        public var signature: Data
    }

    public enum Method: Sendable, Hashable {
        /// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)`.
        case compactJWS(String)
        /// `Product.PurchaseOption.promotionalOffer(offerID:signature:)` with a
        /// `Product.SubscriptionOffer.Signature` (iOS 17.4+).
        case subscriptionOfferSignature(SignatureParameters)
        /// `Product.PurchaseOption.promotionalOffer(offerID:keyID:nonce:signature:timestamp:)`
        /// (iOS 15+).
        case signatureParameters(SignatureParameters)
    }

    public var offerID: String
    public var method: Method
    /// When set, the purchase must also carry `.appAccountToken(token)`.
    public var appAccountToken: UUID?
}

extension SignedPromotionalOffer {
    /// Chooses how to apply this offer on an OS with `capabilities`.
    ///
    /// - JWS when the service returned one and the OS implements it natively, or when it is the
    ///   only format returned (Apple back-deploys the JWS option).
    /// - Otherwise the legacy signature: as a `Product.SubscriptionOffer.Signature` where that type
    ///   exists, else as the separate key ID/nonce/signature/timestamp parameters.
    ///
    /// - Throws: ``OfferSignerClientError/signatureExpired(expiresAt:)`` when `now` is at or past
    ///   ``expiresAt``; ``OfferSignerClientError/invalidResponse(_:)`` when the offer carries no
    ///   signature or a timestamp that does not fit `Int`.
    public func purchasePlan(
        now: Date = Date(),
        capabilities: StoreKitCapabilities = .current
    ) throws -> PromotionalOfferPurchasePlan {
        guard !isExpired(at: now) else {
            throw OfferSignerClientError.signatureExpired(expiresAt: expiresAt)
        }
        let method: PromotionalOfferPurchasePlan.Method
        if let jws, capabilities.nativeCompactJWSPromotionalOffers || legacy == nil {
            method = .compactJWS(jws.compactJWS)
        } else if let legacy {
            guard let timestamp = Int(exactly: legacy.timestamp) else {
                throw OfferSignerClientError.invalidResponse("legacy.timestamp \(legacy.timestamp) does not fit Int")
            }
            let parameters = PromotionalOfferPurchasePlan.SignatureParameters(
                keyID: legacy.keyID, nonce: legacy.nonce, timestamp: timestamp, signature: legacy.signatureData
            )
            method = capabilities.subscriptionOfferSignature
                ? .subscriptionOfferSignature(parameters)
                : .signatureParameters(parameters)
        } else {
            throw OfferSignerClientError.invalidResponse("the offer carries neither a legacy nor a JWS signature")
        }
        return PromotionalOfferPurchasePlan(offerID: offerID, method: method, appAccountToken: appAccountToken)
    }

    /// The original signature, checked for expiry, for building an `SKPaymentDiscount`.
    ///
    /// - Throws: ``OfferSignerClientError/signatureExpired(expiresAt:)`` or
    ///   ``OfferSignerClientError/signatureFormatUnavailable(_:)``.
    public func unexpiredLegacySignature(now: Date = Date()) throws -> LegacyOfferSignature {
        guard !isExpired(at: now) else {
            throw OfferSignerClientError.signatureExpired(expiresAt: expiresAt)
        }
        guard let legacy else {
            throw OfferSignerClientError.signatureFormatUnavailable(.legacy)
        }
        return legacy
    }
}
