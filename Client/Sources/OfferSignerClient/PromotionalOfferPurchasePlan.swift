import Foundation

/// Which StoreKit 2 offer APIs the running OS offers, as the SDK the app was built with declares
/// them.
///
/// Rule: every value here follows Apple's declaration of the API it names (cited by each
/// property), and ``current`` computes it with the same `#available` versions. Tests and apps with
/// special needs can pass their own value to ``SignedPromotionalOffer/purchasePlan(now:capabilities:)``.
///
/// SDK eras (told apart by the Swift compiler that ships with them, the only compile-time mark an
/// SDK leaves): Xcode 26 (Swift 6.2) declares `promotionalOffer(_:compactJWS:)`
/// `@backDeployed(before: iOS 26.0, …)` and available from iOS 15, so the JWS form is usable on
/// every OS this package supports. That is Apple's only declaration of it, and a symbol
/// back-deployed *before 26.0* first shipped in the 26.0 SDKs: with Xcode 16.3/16.4 (Swift 6.1, the
/// iOS 18.4 SDK) and older, this package has no JWS promotional-offer option at all (the original
/// signature only). With Swift 6.1, `introductoryOfferEligibility(compactJWS:)` counts only from
/// iOS 18.4 / macOS 15.4 / tvOS 18.4 / watchOS 11.4 / visionOS 2.4, where it is native: Apple's
/// pages show the Xcode 26 SDK's `@backDeployed(before: iOS 18.4, …)`, and what the 18.4 SDK itself
/// declared cannot be verified, so its back-deployment is relied on with Swift 6.2 only.
public struct StoreKitCapabilities: Sendable, Hashable {
    /// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)` may be called.
    /// Apple: https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(_:compactjws:)
    /// `@backDeployed(before: iOS 26.0, macOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0)`, available
    /// from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0.
    public var compactJWSPromotionalOffer: Bool
    /// `Product.SubscriptionOffer.Signature` and `Product.PurchaseOption.promotionalOffer(offerID:signature:)`
    /// may be called. Apple: https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:signature:)
    /// iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1; deprecated in 26.0.
    public var subscriptionOfferSignature: Bool
    /// `Product.PurchaseOption.introductoryOfferEligibility(compactJWS:)` may be called.
    /// Apple: https://developer.apple.com/documentation/storekit/product/purchaseoption/introductoryoffereligibility(compactjws:)
    /// `@backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4)`, available
    /// from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0 (as of the Xcode 26 SDK; with
    /// Swift 6.1 this package counts it only where it is native, 18.4 and later).
    public var introductoryOfferEligibility: Bool
    /// `Product.PurchaseOption.winBackOffer(_:)` may be called.
    /// Apple: https://developer.apple.com/documentation/storekit/product/purchaseoption/winbackoffer(_:)
    /// iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0.
    public var winBackOffer: Bool

    public init(
        compactJWSPromotionalOffer: Bool,
        subscriptionOfferSignature: Bool,
        introductoryOfferEligibility: Bool = false,
        winBackOffer: Bool = false
    ) {
        self.compactJWSPromotionalOffer = compactJWSPromotionalOffer
        self.subscriptionOfferSignature = subscriptionOfferSignature
        self.introductoryOfferEligibility = introductoryOfferEligibility
        self.winBackOffer = winBackOffer
    }

    /// What the running OS supports, with the SDK this package was compiled with.
    public static var current: StoreKitCapabilities {
        var capabilities = StoreKitCapabilities(compactJWSPromotionalOffer: false, subscriptionOfferSignature: false)
        #if compiler(>=6.2)
        // Xcode 26 SDK: both JWS options are back-deployed to the package's floors (see above).
        capabilities.compactJWSPromotionalOffer = true
        capabilities.introductoryOfferEligibility = true
        #elseif compiler(>=6.1)
        // Xcode 16.3/16.4 SDK: no promotionalOffer(_:compactJWS:) (first in the Xcode 26 SDK, see
        // above); introductoryOfferEligibility(compactJWS:) only where it is native, since its
        // back-deployment is verified for the Xcode 26 SDK only (Apple's page, above).
        if #available(iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4, *) {
            capabilities.introductoryOfferEligibility = true
        }
        #endif
        // Apple: promotionalOffer(offerID:signature:), iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1.
        if #available(iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1, *) {
            capabilities.subscriptionOfferSignature = true
        }
        // Apple: winBackOffer(_:), iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0.
        if #available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *) {
            capabilities.winBackOffer = true
        }
        return capabilities
    }

    /// The signature formats to ask the service for on this OS: the JWS form wherever it can be
    /// used, else the original signature, which needs the UNIX-millisecond timestamp to fit the
    /// platform's `Int` (it does not on arm64_32 Apple Watch builds, where `Int` is 32 bits: JWS
    /// is then the only form that could work).
    ///
    /// Never empty: the service refuses `formats: []`.
    public var defaultFormats: [SignatureFormat] {
        defaultFormats(platformInt: Int.self)
    }

    /// ``defaultFormats`` for a platform whose `Int` is `PlatformInt` (tests run the arm64_32 case
    /// on 64-bit hosts with `Int32`).
    func defaultFormats<PlatformInt: FixedWidthInteger>(platformInt: PlatformInt.Type) -> [SignatureFormat] {
        if compactJWSPromotionalOffer { return [.jws] }
        return PlatformInt.bitWidth >= 64 ? [.legacy] : [.jws]
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
        /// UNIX milliseconds (StoreKit's `timestamp: Int`).
        public var timestamp: Int
        /// The DER ECDSA signature bytes (Base64-decoded).
        public var signature: Data
    }

    public enum Method: Sendable, Hashable {
        /// `Product.PurchaseOption.promotionalOffer(_:compactJWS:)`.
        case compactJWS(String)
        /// `Product.PurchaseOption.promotionalOffer(offerID:signature:)` with a
        /// `Product.SubscriptionOffer.Signature` (iOS 17.4+, deprecated in 26.0).
        case subscriptionOfferSignature(SignatureParameters)
        /// `Product.PurchaseOption.promotionalOffer(offerID:keyID:nonce:signature:timestamp:)`
        /// (iOS 15+, deprecated in 26.0).
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
    /// Rule: the JWS form whenever the offer carries one and the OS can take it (Apple back-deploys
    /// it, and deprecates the original signature's options in 26.0); the original signature only
    /// where it must be: as a `Product.SubscriptionOffer.Signature` where that type exists, else as
    /// the separate key ID/nonce/signature/timestamp parameters. The original signature also needs
    /// its millisecond timestamp to fit `Int`; where it does not (arm64_32), the JWS form is the
    /// only way.
    ///
    /// - Throws: ``OfferSignerClientError/signatureExpired(expiresAt:)`` when `now` is at or past
    ///   ``expiresAt``; ``OfferSignerClientError/signatureFormatUnavailable(_:)`` when the offer
    ///   carries no form this OS can use (e.g. only the original signature on arm64_32: ask for
    ///   `.jws`); ``OfferSignerClientError/invalidResponse(_:)`` when it carries no signature at all.
    public func purchasePlan(
        now: Date = Date(),
        capabilities: StoreKitCapabilities = .current
    ) throws -> PromotionalOfferPurchasePlan {
        try purchasePlan(now: now, capabilities: capabilities, platformInt: Int.self)
    }

    /// ``purchasePlan(now:capabilities:)`` for a platform whose `Int` is `PlatformInt`: the
    /// decision itself, so that the arm64_32 case (32-bit `Int`) runs on 64-bit test hosts.
    func purchasePlan<PlatformInt: FixedWidthInteger>(
        now: Date, capabilities: StoreKitCapabilities, platformInt: PlatformInt.Type
    ) throws -> PromotionalOfferPurchasePlan {
        guard !isExpired(at: now) else {
            throw OfferSignerClientError.signatureExpired(expiresAt: expiresAt)
        }
        func plan(_ method: PromotionalOfferPurchasePlan.Method) -> PromotionalOfferPurchasePlan {
            PromotionalOfferPurchasePlan(offerID: offerID, method: method, appAccountToken: appAccountToken)
        }
        if let jws, capabilities.compactJWSPromotionalOffer {
            return plan(.compactJWS(jws.compactJWS))
        }
        guard let legacy else {
            if jws == nil {
                throw OfferSignerClientError.invalidResponse("the offer carries neither a legacy nor a JWS signature")
            }
            // A JWS this build cannot take (an SDK older than Xcode 26).
            throw OfferSignerClientError.signatureFormatUnavailable(.legacy)
        }
        // StoreKit's timestamp is an `Int`; on arm64_32 it cannot hold UNIX milliseconds.
        guard PlatformInt(exactly: legacy.timestamp) != nil, let timestamp = Int(exactly: legacy.timestamp) else {
            throw OfferSignerClientError.signatureFormatUnavailable(.jws)
        }
        let parameters = PromotionalOfferPurchasePlan.SignatureParameters(
            keyID: legacy.keyID, nonce: legacy.nonce, timestamp: timestamp, signature: legacy.signatureData
        )
        return plan(capabilities.subscriptionOfferSignature ? .subscriptionOfferSignature(parameters) : .signatureParameters(parameters))
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
