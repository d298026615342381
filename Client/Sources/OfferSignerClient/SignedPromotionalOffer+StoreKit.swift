// The StoreKit-facing half of the client.
//
// This one file is compiled twice:
//  * in the shipped `OfferSignerClient` target, where it is active only when the real StoreKit
//    exists (Apple platforms);
//  * on Linux CI, through a symlink in Tests/OfferSignerClientStoreKitTests/, against the
//    `StoreKitShim` test module, which declares the same StoreKit API shapes (checked against
//    Apple's documentation) and records what was built. That test target defines
//    OFFER_SIGNER_CLIENT_STOREKIT_TESTS.
//
// The shim is not named `StoreKit`: a package module called StoreKit would sit in the build's
// module directory on Apple platforms and could shadow the SDK framework for the shipped target.
//
// StoreKit API used here, with Apple's declarations (Apple Developer Documentation, StoreKit):
//  * Product.PurchaseOption.promotionalOffer(_:compactJWS:)
//      https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(_:compactjws:)
//      `@backDeployed(before: iOS 26.0, macOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0)`
//      `static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption]`;
//      available from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0 (Xcode 26 SDK).
//  * Product.SubscriptionOffer.Signature.init(keyID:nonce:timestamp:signature:) and
//    Product.PurchaseOption.promotionalOffer(offerID:signature:)
//      https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:signature:)
//      iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1; deprecated in 26.0.
//  * Product.PurchaseOption.promotionalOffer(offerID:keyID:nonce:signature:timestamp:)
//      https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:keyid:nonce:signature:timestamp:)
//      `timestamp: Int` (UNIX milliseconds: too big for arm64_32's 32-bit Int);
//      iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0; deprecated in 26.0.
//  * Product.PurchaseOption.appAccountToken(_:) — iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0.
//  * Product.purchase(options:)
//      `@MainActor func purchase(options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult`
//      (hence `Set` below); unavailable on visionOS (see OfferPurchase+StoreKit.swift).
//  * SKPaymentDiscount.init(identifier:keyIdentifier:nonce:signature:timestamp:)
//      `init(identifier: String, keyIdentifier: String, nonce: UUID, signature: String, timestamp: NSNumber)`;
//      iOS 12.2, macOS 10.14.4, tvOS 12.2, watchOS 6.2, visionOS 1.0, Mac Catalyst 13.1 (deprecated
//      iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, Mac Catalyst 18.0).
// The deprecated options are used only where the JWS form cannot be (see
// `SignedPromotionalOffer.purchasePlan`); a deployment target below 26.0 compiles them without a warning.

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

// Active in exactly two builds: the shipped target with the real StoreKit, and the Linux test
// target with the shim. (On Apple platforms the test target compiles nothing here: the shipped
// target already has it.)
#if (OFFER_SIGNER_CLIENT_STOREKIT_TESTS && !canImport(StoreKit)) || (!OFFER_SIGNER_CLIENT_STOREKIT_TESTS && canImport(StoreKit))

extension SignedPromotionalOffer {
    /// The StoreKit 2 purchase options that apply this offer on the running OS.
    ///
    /// ```swift
    /// let offer = try await signer.signPromotionalOffer(
    ///     productID: product.id, offerID: "winback50", appAccountToken: accountToken
    /// )
    /// let result = try await product.purchase(options: try offer.purchaseOptions())
    /// ```
    ///
    /// - JWS (`promotionalOffer(_:compactJWS:)`) whenever the service returned one and the SDK
    ///   declares it (the Xcode 26 SDK, Swift 6.2: every OS the package supports; older SDKs: never);
    /// - else `promotionalOffer(offerID:signature:)` with a `Product.SubscriptionOffer.Signature`
    ///   (iOS 17.4+);
    /// - else `promotionalOffer(offerID:keyID:nonce:signature:timestamp:)`.
    ///
    /// The legacy signature is passed as its Base64-*decoded* bytes. `.appAccountToken(_:)` is
    /// included whenever the offer carries a token (bound into the legacy signature; with the JWS
    /// form a separate option the signature does not cover).
    ///
    /// - Parameters:
    ///   - now: The current time; the offer must not have expired.
    ///   - capabilities: What the OS supports; leave the default outside tests.
    /// - Returns: A set to pass to `Product.purchase(options:)` (add your own options to it).
    /// - Throws: `OfferSignerClientError.signatureExpired(expiresAt:)` past ``expiresAt``;
    ///   `.signatureFormatUnavailable(_:)` when the offer carries no form this OS can use.
    public func purchaseOptions(
        now: Date = Date(),
        capabilities: StoreKitCapabilities = .current
    ) throws -> Set<Product.PurchaseOption> {
        try purchasePlan(now: now, capabilities: capabilities).storeKitPurchaseOptions()
    }

    /// An `SKPaymentDiscount` for apps still on the original StoreKit API.
    ///
    /// The discount takes the signature as the Base64 *string* and the timestamp as an
    /// `NSNumber` of UNIX milliseconds. When the offer is bound to an app account token, set
    /// `payment.applicationUsername = offer.applicationUsername` too.
    ///
    /// ```swift
    /// let payment = SKMutablePayment(product: skProduct)
    /// payment.paymentDiscount = try offer.paymentDiscount()
    /// payment.applicationUsername = offer.applicationUsername
    /// SKPaymentQueue.default().add(payment)
    /// ```
    ///
    /// - Throws: `.signatureExpired(expiresAt:)` past ``expiresAt``;
    ///   `.signatureFormatUnavailable(.legacy)` when the offer was requested without `.legacy`.
    @available(iOS, deprecated: 18.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    @available(macOS, deprecated: 15.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    @available(tvOS, deprecated: 18.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    @available(watchOS, deprecated: 11.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    @available(visionOS, deprecated: 2.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    @available(macCatalyst, deprecated: 18.0, message: "SKPaymentDiscount is deprecated; use purchaseOptions() with Product.purchase(options:)")
    public func paymentDiscount(now: Date = Date()) throws -> SKPaymentDiscount {
        let legacy = try unexpiredLegacySignature(now: now)
        return SKPaymentDiscount(
            identifier: offerID,
            keyIdentifier: legacy.keyID,
            nonce: legacy.nonce,
            signature: legacy.signature,
            timestamp: NSNumber(value: legacy.timestamp)
        )
    }
}

extension PromotionalOfferPurchasePlan {
    /// Translates the plan into StoreKit 2 purchase options.
    ///
    /// - Throws: `OfferSignerClientError.signatureFormatUnavailable(.legacy)` for a JWS plan built
    ///   with an SDK older than Xcode 26 (Swift 6.2), which does not declare `promotionalOffer(_:compactJWS:)`.
    public func storeKitPurchaseOptions() throws -> Set<Product.PurchaseOption> {
        var options = Set<Product.PurchaseOption>()
        switch method {
        case .compactJWS(let compactJWS):
            options.formUnion(try Self.compactJWSOptions(offerID: offerID, compactJWS: compactJWS))
        case .subscriptionOfferSignature(let parameters):
            // Apple: promotionalOffer(offerID:signature:), iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4,
            // visionOS 1.1 (https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:signature:)).
            if #available(iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1, *) {
                let signature = Product.SubscriptionOffer.Signature(
                    keyID: parameters.keyID,
                    nonce: parameters.nonce,
                    timestamp: parameters.timestamp,
                    signature: parameters.signature
                )
                options.insert(.promotionalOffer(offerID: offerID, signature: signature))
            } else {
                options.insert(Self.signatureParametersOption(offerID: offerID, parameters))
            }
        case .signatureParameters(let parameters):
            options.insert(Self.signatureParametersOption(offerID: offerID, parameters))
        }
        if let appAccountToken {
            options.insert(.appAccountToken(appAccountToken))
        }
        return options
    }

    /// `promotionalOffer(_:compactJWS:)`, as the SDK in use declares it (see `StoreKitCapabilities`).
    private static func compactJWSOptions(offerID: String, compactJWS: String) throws -> [Product.PurchaseOption] {
        #if compiler(>=6.2)
        // Xcode 26 SDK: `@backDeployed(before: iOS 26.0, …)`, available from iOS 15.0, macOS 12.0,
        // tvOS 15.0, watchOS 8.0, visionOS 1.0 — the package's floors
        // (https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(_:compactjws:)).
        return Product.PurchaseOption.promotionalOffer(offerID, compactJWS: compactJWS)
        #else
        // Swift 6.1 (Xcode 16.3/16.4, iOS 18.4 SDK) and older: no JWS option. Apple's only
        // declaration (same page) is `@backDeployed(before: iOS 26.0, …)`, which says the symbol
        // first shipped in the Xcode 26 SDK; calling it with an older SDK could fail to compile.
        throw OfferSignerClientError.signatureFormatUnavailable(.legacy)
        #endif
    }

    private static func signatureParametersOption(offerID: String, _ parameters: SignatureParameters) -> Product.PurchaseOption {
        .promotionalOffer(
            offerID: offerID,
            keyID: parameters.keyID,
            nonce: parameters.nonce,
            signature: parameters.signature,
            timestamp: parameters.timestamp
        )
    }
}

#endif
