// A test-only stand-in for the parts of Apple's StoreKit (and the one UIKit type) that
// OfferSignerClient uses, so that the client's StoreKit-facing files
// (Client/Sources/OfferSignerClient/*+StoreKit.swift) type-check and are unit-tested on Linux, where
// StoreKit does not exist.
//
// Rule: every declaration copies the API shape of Apple's SDK as Apple's documentation shows it,
// with the same availability, deprecation and back-deployment attributes (the page is cited above
// each one), so that the Linux build reads the same contract as an Apple build. On Linux the
// Apple-platform attributes constrain nothing; they are there to be read and compared.
// Test conveniences, which the client must not (and does not) use, are marked "test only": the
// `recorded` values, the initializers Apple does not make public, and the scripted purchase.
//
// This module is deliberately not named `StoreKit` (see the comment in the client's StoreKit files)
// and is linked only into the OfferSignerClientStoreKitTests test target, never into
// OfferSignerClient.

import Foundation

/// Apple: `struct Product` (StoreKit › Product), iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0.
/// https://developer.apple.com/documentation/storekit/product
@available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
public struct Product: Sendable {
    /// Apple: `let id: Product.ID` (a `String`).
    public let id: String

    /// Test only: what a purchase does (the test scripts StoreKit's answer) and a record of calls.
    public let purchaseScript: PurchaseScript

    /// Test only (Apple has no public initializer).
    public init(id: String, purchaseScript: PurchaseScript) {
        self.id = id
        self.purchaseScript = purchaseScript
    }

    /// Apple: Product.purchase(options:)
    /// https://developer.apple.com/documentation/storekit/product/purchase(options:)
    /// `@MainActor func purchase(options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult`
    /// — iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0; unavailable on visionOS.
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, *)
    @available(visionOS, unavailable, message: "Use @Environment(\\.purchase) to get a PurchaseAction value to call. If your app uses UIKit, use purchase(confirmIn:options:).")
    @MainActor
    public func purchase(options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult {
        try await purchaseScript.run(PurchaseCall(entryPoint: .options, options: options))
    }

    /// Apple: Product.purchase(confirmIn:options:) (the UIScene form)
    /// https://developer.apple.com/documentation/storekit/product/purchase(confirmin:options:)-6dj6y
    /// `@MainActor func purchase(confirmIn scene: some UIScene, options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult`
    /// — iOS 17.0, Mac Catalyst 17.0, tvOS 17.0, visionOS 1.0; not on macOS or watchOS.
    @available(iOS 17.0, macCatalyst 17.0, tvOS 17.0, visionOS 1.0, *)
    @available(macOS, unavailable)
    @available(watchOS, unavailable)
    @MainActor
    public func purchase(confirmIn scene: some UIScene, options: Set<Product.PurchaseOption> = []) async throws -> Product.PurchaseResult {
        try await purchaseScript.run(PurchaseCall(entryPoint: .confirmInScene, options: options))
    }

    /// Apple: `enum Product.PurchaseResult`
    /// https://developer.apple.com/documentation/storekit/product/purchaseresult
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public enum PurchaseResult: Sendable {
        case success(VerificationResult<Transaction>)
        case userCancelled
        case pending
    }

    /// Apple: `enum Product.PurchaseError` (its cases, in Apple's list)
    /// https://developer.apple.com/documentation/storekit/product/purchaseerror — iOS 15.0, macOS 12.0.
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public enum PurchaseError: Error, Sendable, Hashable {
        case invalidQuantity
        case productUnavailable
        case purchaseNotAllowed
        case ineligibleForOffer
        case invalidOfferIdentifier
        case invalidOfferPrice
        /// https://developer.apple.com/documentation/storekit/product/purchaseerror/invalidoffersignature
        case invalidOfferSignature
        case missingOfferParameters
    }

    /// Apple: `struct Product.PurchaseOption` (StoreKit › Product › PurchaseOption), `Hashable`,
    /// used as `Set<Product.PurchaseOption>` by `Product.purchase(options:)`.
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public struct PurchaseOption: Hashable, Sendable {
        /// Test only: what the option was built from.
        public enum Recorded: Hashable, Sendable {
            case appAccountToken(UUID)
            case promotionalOfferSignatureParameters(offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int)
            case promotionalOfferSignature(offerID: String, signature: Product.SubscriptionOffer.Signature)
            case promotionalOfferCompactJWS(offerID: String, compactJWS: String)
            case introductoryOfferEligibility(compactJWS: String)
            case winBackOffer(offerID: String?)
        }

        /// Test only.
        public let recorded: Recorded

        init(_ recorded: Recorded) {
            self.recorded = recorded
        }

        /// Apple: Product.PurchaseOption.appAccountToken(_:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/appaccounttoken(_:)
        /// `static func appAccountToken(_ token: UUID) -> Product.PurchaseOption` — iOS 15.0, macOS 12.0.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public static func appAccountToken(_ token: UUID) -> Product.PurchaseOption {
            PurchaseOption(.appAccountToken(token))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(offerID:keyID:nonce:signature:timestamp:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:keyid:nonce:signature:timestamp:)
        /// iOS 15.0–26.0, macOS 12.0–26.0, tvOS 15.0–26.0, watchOS 8.0–26.0, visionOS 1.0–26.0 (deprecated in 26.0).
        @available(iOS, introduced: 15.0, deprecated: 26.0)
        @available(macOS, introduced: 12.0, deprecated: 26.0)
        @available(tvOS, introduced: 15.0, deprecated: 26.0)
        @available(watchOS, introduced: 8.0, deprecated: 26.0)
        @available(visionOS, introduced: 1.0, deprecated: 26.0)
        public static func promotionalOffer(
            offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int
        ) -> Product.PurchaseOption {
            PurchaseOption(.promotionalOfferSignatureParameters(
                offerID: offerID, keyID: keyID, nonce: nonce, signature: signature, timestamp: timestamp
            ))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(offerID:signature:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(offerid:signature:)
        /// iOS 17.4–26.0, macOS 14.4–26.0, tvOS 17.4–26.0, watchOS 10.4–26.0, visionOS 1.1–26.0 (deprecated in 26.0).
        @available(iOS, introduced: 17.4, deprecated: 26.0)
        @available(macOS, introduced: 14.4, deprecated: 26.0)
        @available(tvOS, introduced: 17.4, deprecated: 26.0)
        @available(watchOS, introduced: 10.4, deprecated: 26.0)
        @available(visionOS, introduced: 1.1, deprecated: 26.0)
        public static func promotionalOffer(
            offerID: String, signature: Product.SubscriptionOffer.Signature
        ) -> Product.PurchaseOption {
            PurchaseOption(.promotionalOfferSignature(offerID: offerID, signature: signature))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(_:compactJWS:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/promotionaloffer(_:compactjws:)
        /// `@backDeployed(before: iOS 26.0, macOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0)`
        /// `static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption]`
        /// — available from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0. Note it returns an array.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        @backDeployed(before: iOS 26.0, macOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0)
        public static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption] {
            [PurchaseOption(.promotionalOfferCompactJWS(offerID: offerID, compactJWS: compactJWS))]
        }

        /// Apple: Product.PurchaseOption.introductoryOfferEligibility(compactJWS:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/introductoryoffereligibility(compactjws:)
        /// `@backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4)`
        /// `static func introductoryOfferEligibility(compactJWS: String) -> Product.PurchaseOption`
        /// — available from iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        @backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4)
        public static func introductoryOfferEligibility(compactJWS: String) -> Product.PurchaseOption {
            PurchaseOption(.introductoryOfferEligibility(compactJWS: compactJWS))
        }

        /// Apple: Product.PurchaseOption.winBackOffer(_:)
        /// https://developer.apple.com/documentation/storekit/product/purchaseoption/winbackoffer(_:)
        /// `static func winBackOffer(_ offer: Product.SubscriptionOffer) -> Product.PurchaseOption`
        /// — iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0.
        @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
        public static func winBackOffer(_ offer: Product.SubscriptionOffer) -> Product.PurchaseOption {
            PurchaseOption(.winBackOffer(offerID: offer.id))
        }
    }

    /// Apple: `struct Product.SubscriptionOffer` (StoreKit › Product › SubscriptionOffer).
    /// https://developer.apple.com/documentation/storekit/product/subscriptionoffer
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public struct SubscriptionOffer: Sendable, Hashable {
        /// Apple: `let id: String?` — nil for an introductory offer.
        public let id: String?
        /// Apple: `let type: Product.SubscriptionOffer.OfferType`
        public let type: OfferType

        /// Test only (Apple has no public initializer).
        public init(id: String?, type: OfferType) {
            self.id = id
            self.type = type
        }

        /// Apple: `struct Product.SubscriptionOffer.OfferType` (an open set of static values).
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public struct OfferType: Sendable, Hashable {
            let name: String
            /// Apple: `static let introductory` — iOS 15.0.
            public static let introductory = OfferType(name: "introductory")
            /// Apple: `static let promotional` — iOS 15.0.
            public static let promotional = OfferType(name: "promotional")
            /// Apple: `static let winBack` — iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0.
            @available(iOS 18.0, macOS 15.0, tvOS 18.0, watchOS 11.0, visionOS 2.0, *)
            public static let winBack = OfferType(name: "winBack")
        }

        /// Apple: `struct Product.SubscriptionOffer.Signature`
        /// https://developer.apple.com/documentation/storekit/product/subscriptionoffer/signature
        /// iOS 17.4–26.0, macOS 14.4–26.0, tvOS 17.4–26.0, watchOS 10.4–26.0, visionOS 1.1–26.0 (deprecated in 26.0).
        @available(iOS, introduced: 17.4, deprecated: 26.0)
        @available(macOS, introduced: 14.4, deprecated: 26.0)
        @available(tvOS, introduced: 17.4, deprecated: 26.0)
        @available(watchOS, introduced: 10.4, deprecated: 26.0)
        @available(visionOS, introduced: 1.1, deprecated: 26.0)
        public struct Signature: Hashable, Sendable {
            /// Apple: `var keyID: String`
            public var keyID: String
            /// Apple: `var nonce: UUID`
            public var nonce: UUID
            /// Apple: `var timestamp: Int` (UNIX milliseconds)
            public var timestamp: Int
            /// Apple: `var signature: Data`
            public var signature: Data

            /// Apple: Product.SubscriptionOffer.Signature.init(keyID:nonce:timestamp:signature:)
            /// `init(keyID: String, nonce: UUID, timestamp: Int, signature: Data)`
            public init(keyID: String, nonce: UUID, timestamp: Int, signature: Data) {
                self.keyID = keyID
                self.nonce = nonce
                self.timestamp = timestamp
                self.signature = signature
            }
        }
    }
}

extension Product {
    /// Apple: `struct Product.SubscriptionInfo` (only what the client uses).
    /// https://developer.apple.com/documentation/storekit/product/subscriptioninfo
    @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
    public struct SubscriptionInfo: Sendable {
        /// Apple: Product.SubscriptionInfo.status(for:)
        /// https://developer.apple.com/documentation/storekit/product/subscriptioninfo/status(for:)
        /// `static func status(for groupID: String) async throws -> [Product.SubscriptionInfo.Status]`
        /// — iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0. Here: always empty.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public static func status(for groupID: String) async throws -> [Product.SubscriptionInfo.Status] {
            []
        }

        /// Apple: `struct Product.SubscriptionInfo.Status`.
        public struct Status: Sendable {
            /// Apple: `let renewalInfo: VerificationResult<Product.SubscriptionInfo.RenewalInfo>`
            public let renewalInfo: VerificationResult<RenewalInfo>

            /// Test only (Apple has no public initializer).
            public init(renewalInfo: VerificationResult<RenewalInfo>) {
                self.renewalInfo = renewalInfo
            }
        }

        /// Apple: `struct Product.SubscriptionInfo.RenewalInfo` (none of its members are used).
        public struct RenewalInfo: Sendable, Hashable, ShimSignedValue {
            /// Test only: the JWS it was decoded from.
            public let jws: String

            /// Test only.
            public init(jws: String) {
                self.jws = jws
            }
        }
    }
}

/// Test only: a signed StoreKit value that knows the JWS it came from (for
/// `VerificationResult.jwsRepresentation`).
public protocol ShimSignedValue: Sendable {
    var jws: String { get }
}

/// Apple: `@frozen enum VerificationResult<SignedType>` (StoreKit › VerificationResult),
/// iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0.
/// https://developer.apple.com/documentation/storekit/verificationresult
@available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
@frozen
public enum VerificationResult<SignedType: Sendable>: Sendable {
    case unverified(SignedType, VerificationResult<SignedType>.VerificationError)
    case verified(SignedType)

    /// Apple: `enum VerificationResult.VerificationError` (its cases, in Apple's list).
    public enum VerificationError: Error, Sendable, Hashable {
        case revokedCertificate
        case invalidCertificateChain
        case invalidDeviceVerification
        case invalidEncoding
        case invalidSignature
        case missingRequiredProperties
    }

    /// Apple: `var unsafePayloadValue: SignedType { get }` — the payload, verified or not.
    public var unsafePayloadValue: SignedType {
        switch self {
        case .verified(let value), .unverified(let value, _): value
        }
    }
}

extension VerificationResult where SignedType: ShimSignedValue {
    /// Apple: `var jwsRepresentation: String { get }` — the JWS compact serialization.
    public var jwsRepresentation: String { unsafePayloadValue.jws }
}

/// Apple: `struct Transaction` (StoreKit › Transaction), iOS 15.0, macOS 12.0.
/// https://developer.apple.com/documentation/storekit/transaction
@available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
public struct Transaction: Sendable, Hashable, ShimSignedValue {
    /// Apple: `let id: UInt64`
    public let id: UInt64
    /// Apple: `let originalID: UInt64`
    public let originalID: UInt64
    /// Apple: `let productID: String`
    public let productID: String
    /// Apple: `let appAccountToken: UUID?`
    public let appAccountToken: UUID?
    /// Apple: `let subscriptionGroupID: String?`
    public let subscriptionGroupID: String?
    /// Apple: `let purchaseDate: Date`
    public let purchaseDate: Date
    /// Test only: where `finish()` is recorded.
    public let finishLog: FinishLog
    /// Test only: the JWS it was decoded from.
    public let jws: String

    /// Test only (Apple has no public initializer).
    public init(
        id: UInt64, originalID: UInt64, productID: String, appAccountToken: UUID?, finishLog: FinishLog,
        subscriptionGroupID: String? = nil, purchaseDate: Date = Date(timeIntervalSince1970: 0), jws: String = ""
    ) {
        self.id = id
        self.originalID = originalID
        self.productID = productID
        self.appAccountToken = appAccountToken
        self.finishLog = finishLog
        self.subscriptionGroupID = subscriptionGroupID
        self.purchaseDate = purchaseDate
        self.jws = jws
    }

    /// Apple: `typealias Transaction.Transactions` — an `AsyncSequence` of `VerificationResult<Transaction>`.
    public typealias Transactions = AsyncStream<VerificationResult<Transaction>>

    /// Apple: Transaction.all — `static var all: Transaction.Transactions { get }`, iOS 15.0, macOS 12.0.
    /// https://developer.apple.com/documentation/storekit/transaction/all  Here: always empty.
    public static var all: Transactions {
        AsyncStream { $0.finish() }
    }

    /// Apple: Transaction.finish() — `func finish() async`
    /// https://developer.apple.com/documentation/storekit/transaction/finish()
    public func finish() async {
        finishLog.record(id)
    }
}

/// Apple: `struct AppTransaction` (StoreKit › AppTransaction), iOS 16.0, macOS 13.0, tvOS 16.0,
/// watchOS 9.0, visionOS 1.0. https://developer.apple.com/documentation/storekit/apptransaction
@available(iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0, *)
public struct AppTransaction: Sendable {
    /// Apple: AppTransaction.appTransactionID
    /// https://developer.apple.com/documentation/storekit/apptransaction/apptransactionid
    /// `@backDeployed(before: iOS 18.4, macOS 15.4, tvOS 18.4, watchOS 11.4, visionOS 2.4) var appTransactionID: String { get }`
    /// — available from iOS 16.0, macOS 13.0, tvOS 16.0, watchOS 9.0, visionOS 1.0.
    public let appTransactionID: String

    /// Test only (Apple has no public initializer).
    public init(appTransactionID: String) {
        self.appTransactionID = appTransactionID
    }

    /// Apple: AppTransaction.shared — `static var shared: VerificationResult<AppTransaction> { get async throws }`.
    /// Here: always the same test value.
    public static var shared: VerificationResult<AppTransaction> {
        get async throws { .verified(AppTransaction(appTransactionID: "705000000000001")) }
    }
}

/// Apple (UIKit): `@MainActor class UIScene` — iOS 13.0, Mac Catalyst 13.1, tvOS 13.0, visionOS 1.0;
/// not on macOS or watchOS. https://developer.apple.com/documentation/uikit/uiscene
/// Only its existence matters here: the visionOS purchase takes one.
@available(iOS 13.0, macCatalyst 13.1, tvOS 13.0, visionOS 1.0, *)
@available(macOS, unavailable)
@available(watchOS, unavailable)
@MainActor
open class UIScene {
    /// Test only.
    public init() {}
}

/// Apple: `class SKPaymentDiscount` (StoreKit › SKPaymentDiscount), an `NSObject` subclass —
/// iOS 12.2–18.0, macOS 10.14.4–15.0, tvOS 12.2–18.0, watchOS 6.2–11.0, visionOS 1.0–2.0,
/// Mac Catalyst 13.1–18.0 (deprecated).
/// https://developer.apple.com/documentation/storekit/skpaymentdiscount
@available(iOS, introduced: 12.2, deprecated: 18.0)
@available(macOS, introduced: 10.14.4, deprecated: 15.0)
@available(tvOS, introduced: 12.2, deprecated: 18.0)
@available(watchOS, introduced: 6.2, deprecated: 11.0)
@available(visionOS, introduced: 1.0, deprecated: 2.0)
@available(macCatalyst, introduced: 13.1, deprecated: 18.0)
open class SKPaymentDiscount: NSObject {
    /// Apple: `var identifier: String { get }`
    public let identifier: String
    /// Apple: `var keyIdentifier: String { get }`
    public let keyIdentifier: String
    /// Apple: `var nonce: UUID { get }`
    public let nonce: UUID
    /// Apple: `var signature: String { get }` — the Base64 text, not decoded bytes.
    public let signature: String
    /// Apple: `@NSCopying var timestamp: NSNumber { get }` — UNIX milliseconds.
    public let timestamp: NSNumber

    /// Apple: SKPaymentDiscount.init(identifier:keyIdentifier:nonce:signature:timestamp:)
    /// `init(identifier: String, keyIdentifier: String, nonce: UUID, signature: String, timestamp: NSNumber)`
    public init(identifier: String, keyIdentifier: String, nonce: UUID, signature: String, timestamp: NSNumber) {
        self.identifier = identifier
        self.keyIdentifier = keyIdentifier
        self.nonce = nonce
        self.signature = signature
        self.timestamp = timestamp
        super.init()
    }
}
