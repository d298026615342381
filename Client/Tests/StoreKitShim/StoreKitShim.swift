// A test-only stand-in for the parts of Apple's StoreKit that OfferSignerClient uses, so that the
// client's StoreKit-facing file (Sources/OfferSignerClient/SignedPromotionalOffer+StoreKit.swift)
// type-checks and is unit-tested on Linux, where StoreKit does not exist.
//
// Every declaration below copies the API shape of Apple's StoreKit as documented on
// developer.apple.com (Apple Developer Documentation › StoreKit); the page is named above each one.
// Each value records how it was built so tests can assert on it. The extra `Hashable` conformance of
// `Product.SubscriptionOffer.Signature` and the `recorded` properties are test conveniences: the
// client code must not (and does not) use them.
//
// This module is deliberately not named `StoreKit` (see the comment in the client file) and is
// linked only into the OfferSignerClientStoreKitTests test target, never into OfferSignerClient.

import Foundation

/// Apple: `struct Product` (StoreKit › Product).
public struct Product: Sendable {
    /// Apple: `struct Product.PurchaseOption` (StoreKit › Product › PurchaseOption), `Hashable`,
    /// used as `Set<Product.PurchaseOption>` by `Product.purchase(options:)`.
    public struct PurchaseOption: Hashable, Sendable {
        /// What the option was built from (test inspection only).
        public enum Recorded: Hashable, Sendable {
            case appAccountToken(UUID)
            case promotionalOfferSignatureParameters(offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int)
            case promotionalOfferSignature(offerID: String, signature: Product.SubscriptionOffer.Signature)
            case promotionalOfferCompactJWS(offerID: String, compactJWS: String)
        }

        public let recorded: Recorded

        init(_ recorded: Recorded) {
            self.recorded = recorded
        }

        /// Apple: Product.PurchaseOption.appAccountToken(_:)
        /// `static func appAccountToken(_ token: UUID) -> Product.PurchaseOption` — iOS 15.0+, macOS 12.0+.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public static func appAccountToken(_ token: UUID) -> Product.PurchaseOption {
            PurchaseOption(.appAccountToken(token))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(offerID:keyID:nonce:signature:timestamp:)
        /// `static func promotionalOffer(offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int) -> Product.PurchaseOption`
        /// — iOS 15.0–26.0 (deprecated in 26.0), macOS 12.0+.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public static func promotionalOffer(
            offerID: String, keyID: String, nonce: UUID, signature: Data, timestamp: Int
        ) -> Product.PurchaseOption {
            PurchaseOption(.promotionalOfferSignatureParameters(
                offerID: offerID, keyID: keyID, nonce: nonce, signature: signature, timestamp: timestamp
            ))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(offerID:signature:)
        /// `static func promotionalOffer(offerID: String, signature: Product.SubscriptionOffer.Signature) -> Product.PurchaseOption`
        /// — iOS 17.4–26.0 (deprecated in 26.0), macOS 14.4+.
        @available(iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1, *)
        public static func promotionalOffer(
            offerID: String, signature: Product.SubscriptionOffer.Signature
        ) -> Product.PurchaseOption {
            PurchaseOption(.promotionalOfferSignature(offerID: offerID, signature: signature))
        }

        /// Apple: Product.PurchaseOption.promotionalOffer(_:compactJWS:)
        /// `@backDeployed(before: iOS 26.0, macOS 26.0, tvOS 26.0, watchOS 26.0, visionOS 26.0)`
        /// `static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption]`
        /// — listed as iOS 15.0+, macOS 12.0+ (back-deployed). Note it returns an array.
        @available(iOS 15.0, macOS 12.0, tvOS 15.0, watchOS 8.0, visionOS 1.0, *)
        public static func promotionalOffer(_ offerID: String, compactJWS: String) -> [Product.PurchaseOption] {
            [PurchaseOption(.promotionalOfferCompactJWS(offerID: offerID, compactJWS: compactJWS))]
        }
    }

    /// Apple: `struct Product.SubscriptionOffer` (StoreKit › Product › SubscriptionOffer).
    public struct SubscriptionOffer: Sendable {
        /// Apple: `struct Product.SubscriptionOffer.Signature` — iOS 17.4–26.0, macOS 14.4+.
        @available(iOS 17.4, macOS 14.4, tvOS 17.4, watchOS 10.4, visionOS 1.1, *)
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

/// Apple: `class SKPaymentDiscount` (StoreKit › SKPaymentDiscount), an `NSObject` subclass —
/// iOS 12.2–18.0 (deprecated), macOS 10.14.4–15.0 (deprecated).
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
