// The one-call purchase flow, win-back and introductory-offer helpers, and the evidence collector:
// the rest of the client's StoreKit-facing half. Compiled twice, like
// SignedPromotionalOffer+StoreKit.swift (see there): in the shipped target against the real
// StoreKit, and on Linux, through a symlink in Client/Tests/OfferSignerClientStoreKitTests/, against
// StoreKitShim. It uses only the client's public API, so that both builds see the same code.
//
// StoreKit (and UIKit) API used here, with Apple's declarations:
//  * Product.purchase(options:) — iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0; unavailable on visionOS
//      https://developer.apple.com/documentation/storekit/product/purchase(options:)
//  * Product.purchase(confirmIn:options:) with `some UIScene` — iOS 17.0, Mac Catalyst 17.0,
//    tvOS 17.0, visionOS 1.0; `@MainActor`
//      https://developer.apple.com/documentation/storekit/product/purchase(confirmin:options:)-6dj6y
//  * Not called here, only named in docs (apps pass them to `using:`): SwiftUI's PurchaseAction —
//    iOS 17.0, macOS 14.0, tvOS 17.0, watchOS 10.0, visionOS 1.0
//      https://developer.apple.com/documentation/storekit/purchaseaction
//    and Product.purchase(confirmIn: UIViewController, options:) — iOS 18.2, Mac Catalyst 18.2,
//    tvOS 18.2, visionOS 2.2; not on macOS or watchOS
//      https://developer.apple.com/documentation/storekit/product/purchase(confirmin:options:)-3bivf
//  * Product.PurchaseResult (.success(VerificationResult<Transaction>), .userCancelled, .pending),
//    Product.PurchaseError (.invalidOfferSignature, .invalidOfferIdentifier, .ineligibleForOffer, …),
//    VerificationResult (.verified, .unverified), Transaction.finish() — iOS 15.0, macOS 12.0
//      https://developer.apple.com/documentation/storekit/product/purchaseerror/invalidoffersignature
//  * Product.PurchaseOption.winBackOffer(_:) — iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0
//      https://developer.apple.com/documentation/storekit/product/purchaseoption/winbackoffer(_:)
//  * Product.PurchaseOption.introductoryOfferEligibility(compactJWS:) —
//      `@backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4)`, available
//      from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0 (as Apple's page shows it, for
//      the Xcode 26 SDK; what the iOS 18.4 SDK declared cannot be verified, so with Swift 6.1 it is
//      called only where it is native: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4)
//      https://developer.apple.com/documentation/storekit/product/purchaseoption/introductoryoffereligibility(compactjws:)
//  * AppTransaction.shared — iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0;
//    AppTransaction.appTransactionID — `@backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4,
//    watchOS 11.4, visionOS 2.4)`, available from iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0,
//    visionOS 1.0 (as of the Xcode 26 SDK; with Swift 6.1 read only where it is native, as above)
//      https://developer.apple.com/documentation/storekit/apptransaction/apptransactionid
//
// Platforms: iOS, macOS, tvOS and watchOS purchase with `purchase(options:)`; visionOS has no
// scene-less purchase, so there the one-call flow takes the `UIScene` that shows the confirmation
// (`confirmIn:`), and SwiftUI apps can pass their `PurchaseAction` (`using:`, iOS 17 / macOS 14 /
// tvOS 17 / watchOS 10 / visionOS 1).

#if OFFER_SIGNER_CLIENT_STOREKIT_TESTS
#if !canImport(StoreKit)
import Foundation
import OfferSignerClient
import StoreKitShim
#endif
#elseif canImport(StoreKit)
import Foundation
import StoreKit
#if os(visionOS)
import UIKit
#endif
#endif

#if (OFFER_SIGNER_CLIENT_STOREKIT_TESTS && !canImport(StoreKit)) || (!OFFER_SIGNER_CLIENT_STOREKIT_TESTS && canImport(StoreKit))

/// How a one-call offer purchase ended, when it ended normally.
public enum OfferPurchaseOutcome: Sendable {
    /// Bought: the transaction was verified and finished. Deliver the content.
    case purchased(Transaction)
    /// Waiting for approval (Ask to Buy, SCA): the transaction arrives later in `Transaction.updates`.
    case pending
    /// The customer cancelled.
    case cancelled
    /// The service refused the offer; nothing was purchased. Carries its whole answer.
    case notEligible(OfferIneligibility)
}

/// How a one-call offer purchase failed (besides ``OfferSignerClientError`` from the service,
/// StoreKit's own errors such as `StoreKitError.networkError`, and `CancellationError`).
public enum OfferPurchaseError: Error, Sendable {
    /// StoreKit returned a transaction that did not verify. It is refused: not finished, no
    /// content to deliver; StoreKit offers it again (`Transaction.unfinished`).
    case unverifiedTransaction(Transaction, VerificationResult<Transaction>.VerificationError)
    /// StoreKit refused the offer. For `.invalidOfferSignature` a fresh signature was asked for once
    /// and refused again (`freshSignatureTried`); the other errors (`.invalidOfferIdentifier`,
    /// `.ineligibleForOffer`, `.missingOfferParameters`, …) are not retried.
    case offerRefused(Product.PurchaseError, freshSignatureTried: Bool)
    /// StoreKit called the first signature invalid, and the service refused to sign again (for an
    /// offer whose rules count issued signatures, the first one already counts). Carries the
    /// service's answer; not an ineligibility found before any purchase attempt.
    case freshSignatureRefused(OfferIneligibility)
    /// A purchase result this version of the client does not know.
    case unknownPurchaseResult
}

extension OfferSignerClient {
    #if !os(visionOS)
    /// Buys `product` with a promotional offer, from the tap to the finished transaction.
    ///
    /// Signs (in ``StoreKitCapabilities/defaultFormats`` unless `formats` says otherwise), builds the
    /// options for this OS, purchases, verifies the transaction (an unverified one is refused), and
    /// finishes it. When StoreKit calls the signature invalid, asks the service for a fresh one once.
    ///
    /// - Parameters:
    ///   - transactionID: Any of the customer's transaction IDs; when `nil`, the app's
    ///     `appTransactionID` where the OS has it (Apple recommends a transaction ID in JWS offers).
    ///   - options: Further purchase options (e.g. `.quantity`), added to the offer's.
    @available(visionOS, unavailable, message: "visionOS has no scene-less purchase: use purchase(product:offerID:…confirmIn:) or using:")
    public func purchase(
        product: Product, offerID: String, appAccountToken: UUID?, formats: [SignatureFormat]? = nil,
        evidence: PurchaseEvidence? = nil, bundleID: String? = nil, transactionID: String? = nil,
        options: Set<Product.PurchaseOption> = []
    ) async throws -> OfferPurchaseOutcome {
        try await purchase(
            product: product, offerID: offerID, appAccountToken: appAccountToken, formats: formats, evidence: evidence,
            bundleID: bundleID, transactionID: transactionID, options: options,
            using: { try await product.purchase(options: $0) })
    }
    #endif

    #if os(visionOS) || OFFER_SIGNER_CLIENT_STOREKIT_TESTS
    /// ``purchase(product:offerID:appAccountToken:formats:evidence:bundleID:transactionID:options:using:)``
    /// through `Product.purchase(confirmIn:options:)`: visionOS's purchase, which shows the
    /// confirmation in `scene`.
    @available(iOS 17.0, macCatalyst 17.0, tvOS 17.0, visionOS 1.0, *)
    @available(macOS, unavailable)
    @available(watchOS, unavailable)
    @MainActor
    public func purchase(
        product: Product, offerID: String, appAccountToken: UUID?, formats: [SignatureFormat]? = nil,
        evidence: PurchaseEvidence? = nil, bundleID: String? = nil, transactionID: String? = nil,
        options: Set<Product.PurchaseOption> = [], confirmIn scene: some UIScene
    ) async throws -> OfferPurchaseOutcome {
        try await purchase(
            product: product, offerID: offerID, appAccountToken: appAccountToken, formats: formats, evidence: evidence,
            bundleID: bundleID, transactionID: transactionID, options: options,
            using: { try await product.purchase(confirmIn: scene, options: $0) })
    }
    #endif

    /// The one-call flow with the app's own purchase call: SwiftUI's `PurchaseAction`
    /// (`using: { try await purchase(product, options: $0) }`; iOS 17, macOS 14, tvOS 17, watchOS 10,
    /// visionOS 1), or `product.purchase(confirmIn: viewController, options: $0)` in UIKit (iOS 18.2,
    /// Mac Catalyst 18.2, tvOS 18.2, visionOS 2.2; not on macOS or watchOS).
    ///
    /// No availability of its own: it takes any closure, and the call passed in carries Apple's
    /// (https://developer.apple.com/documentation/storekit/purchaseaction,
    /// https://developer.apple.com/documentation/storekit/product/purchase(confirmin:options:)-3bivf).
    public func purchase(
        product: Product, offerID: String, appAccountToken: UUID?, formats: [SignatureFormat]? = nil,
        evidence: PurchaseEvidence? = nil, bundleID: String? = nil, transactionID: String? = nil,
        options: Set<Product.PurchaseOption> = [],
        using purchase: @MainActor (Set<Product.PurchaseOption>) async throws -> Product.PurchaseResult
    ) async throws -> OfferPurchaseOutcome {
        var customerTransactionID = transactionID
        if customerTransactionID == nil { customerTransactionID = await Self.appTransactionID() }
        let boundTransactionID = customerTransactionID
        return try await OfferPurchaseFlow.run(
            capabilities: .current, now: Date.init, extraOptions: options,
            sign: {
                try await self.signPromotionalOffer(
                    productID: product.id, offerID: offerID, appAccountToken: appAccountToken, formats: formats,
                    evidence: evidence, bundleID: bundleID, transactionID: boundTransactionID)
            },
            purchase: purchase)
    }

    /// Buys `product` with a win-back offer (`Product.PurchaseOption.winBackOffer(_:)`), verifying and
    /// finishing the transaction like the promotional-offer flow. Win-back offers need no
    /// signature: the App Store decides who may redeem them.
    ///
    /// - Throws: ``OfferSignerClientError/invalidArgument(_:)`` when `offer` is not a win-back offer.
    @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
    public static func purchase(
        winBackOffer offer: Product.SubscriptionOffer, appAccountToken: UUID?,
        options: Set<Product.PurchaseOption> = [],
        using purchase: @MainActor (Set<Product.PurchaseOption>) async throws -> Product.PurchaseResult
    ) async throws -> OfferPurchaseOutcome {
        var all = try winBackPurchaseOptions(offer, appAccountToken: appAccountToken)
        all.formUnion(options)
        let result: Product.PurchaseResult
        do {
            result = try await purchase(all)
        } catch let error as Product.PurchaseError {
            throw OfferPurchaseError.offerRefused(error, freshSignatureTried: false)
        }
        return try await OfferPurchaseFlow.complete(result)
    }

    /// The purchase options for a win-back offer: `.winBackOffer(offer)`, and `.appAccountToken`
    /// when given.
    ///
    /// - Throws: ``OfferSignerClientError/invalidArgument(_:)`` when `offer.type` is not `.winBack`.
    @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
    public static func winBackPurchaseOptions(
        _ offer: Product.SubscriptionOffer, appAccountToken: UUID?
    ) throws -> Set<Product.PurchaseOption> {
        guard offer.type == .winBack else {
            throw OfferSignerClientError.invalidArgument("offer \(offer.id ?? "(no id)") is not a win-back offer")
        }
        var options: Set<Product.PurchaseOption> = [.winBackOffer(offer)]
        if let appAccountToken { options.insert(.appAccountToken(appAccountToken)) }
        return options
    }

    /// The app's `appTransactionID` (Apple: any of the customer's transaction IDs may be named in
    /// a JWS offer; this one exists even before any purchase), or `nil` where the OS or SDK has
    /// none or the app transaction does not verify.
    public static func appTransactionID() async -> String? {
        #if compiler(>=6.2)
        // AppTransaction: iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0; the Xcode 26 SDK
        // back-deploys its appTransactionID to those (Apple's page, above).
        if #available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0, *) {
            guard let shared = try? await AppTransaction.shared, case .verified(let appTransaction) = shared else { return nil }
            return appTransaction.appTransactionID
        }
        #elseif compiler(>=6.1)
        // iOS 18.4 SDK: appTransactionID only where it is native. Apple's page shows the Xcode 26
        // SDK's `@backDeployed(before: iOS 18.4, …)`; what the 18.4 SDK declared cannot be verified.
        if #available(iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4, *) {
            guard let shared = try? await AppTransaction.shared, case .verified(let appTransaction) = shared else { return nil }
            return appTransaction.appTransactionID
        }
        #endif
        return nil
    }
}

extension SignedIntroductoryOfferEligibility {
    /// `Product.PurchaseOption.introductoryOfferEligibility(compactJWS:)` with this signature.
    ///
    /// - Throws: `OfferSignerClientError.signatureExpired(expiresAt:)` past ``expiresAt``;
    ///   `.invalidArgument(_:)` when built with an SDK older than iOS 18.4 (Swift 6.1), which does
    ///   not declare the option, or built with the iOS 18.4 SDK and running below iOS 18.4 / macOS
    ///   15.4 / tvOS 18.4 / watchOS 11.4 / visionOS 2.4.
    public func purchaseOption(now: Date = Date()) throws -> Product.PurchaseOption {
        guard !isExpired(at: now) else { throw OfferSignerClientError.signatureExpired(expiresAt: expiresAt) }
        #if compiler(>=6.2)
        // Xcode 26 SDK: back-deployed to iOS 15 … visionOS 1 (Apple's page, above).
        return .introductoryOfferEligibility(compactJWS: compactJWS)
        #elseif compiler(>=6.1)
        // iOS 18.4 SDK: only where the option is native. Apple's page shows the Xcode 26 SDK's
        // `@backDeployed(before: iOS 18.4, …)`; what the 18.4 SDK declared cannot be verified.
        if #available(iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4, *) {
            return .introductoryOfferEligibility(compactJWS: compactJWS)
        }
        throw OfferSignerClientError.invalidArgument(
            "built with the iOS 18.4 SDK, introductoryOfferEligibility(compactJWS:) is used on iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4 or later only (Xcode 26 back-deploys it)")
        #else
        throw OfferSignerClientError.invalidArgument("introductoryOfferEligibility(compactJWS:) needs the iOS 18.4 SDK (Xcode 16.3) or later")
        #endif
    }
}

/// The one-call flow's steps, apart from where the signature and the purchase come from.
enum OfferPurchaseFlow {
    /// Rule: sign, purchase, and on StoreKit's `.invalidOfferSignature` sign once more and purchase
    /// again; any other StoreKit refusal, or a second invalid signature, is a typed failure. The
    /// service's `not_eligible` to the first request is an outcome, not a failure; to the fresh
    /// signature's request it is `OfferPurchaseError.freshSignatureRefused`.
    static func run(
        capabilities: StoreKitCapabilities,
        now: () -> Date,
        extraOptions: Set<Product.PurchaseOption>,
        sign: () async throws -> SignedPromotionalOffer,
        purchase: @MainActor (Set<Product.PurchaseOption>) async throws -> Product.PurchaseResult
    ) async throws -> OfferPurchaseOutcome {
        var freshSignatureTried = false
        while true {
            let offer: SignedPromotionalOffer
            do {
                offer = try await sign()
            } catch OfferSignerClientError.notEligible(let ineligibility) {
                if freshSignatureTried { throw OfferPurchaseError.freshSignatureRefused(ineligibility) }
                return .notEligible(ineligibility)
            }
            let options = try offer.purchaseOptions(now: now(), capabilities: capabilities).union(extraOptions)
            let result: Product.PurchaseResult
            do {
                result = try await purchase(options)
            } catch let error as Product.PurchaseError {
                if case .invalidOfferSignature = error, !freshSignatureTried {
                    freshSignatureTried = true
                    continue
                }
                throw OfferPurchaseError.offerRefused(error, freshSignatureTried: freshSignatureTried)
            }
            return try await complete(result)
        }
    }

    /// Verifies and finishes a purchase's transaction; refuses an unverified one.
    static func complete(_ result: Product.PurchaseResult) async throws -> OfferPurchaseOutcome {
        switch result {
        case .success(let verification):
            switch verification {
            case .verified(let transaction):
                await transaction.finish()
                return .purchased(transaction)
            case .unverified(let transaction, let error):
                throw OfferPurchaseError.unverifiedTransaction(transaction, error)
            }
        case .pending:
            return .pending
        case .userCancelled:
            return .cancelled
        #if !OFFER_SIGNER_CLIENT_STOREKIT_TESTS
        // StoreKit's enum is not frozen (the shim's, in a non-resilient module, has no unknown cases).
        @unknown default:
            throw OfferPurchaseError.unknownPurchaseResult
        #endif
        }
    }
}

#endif
