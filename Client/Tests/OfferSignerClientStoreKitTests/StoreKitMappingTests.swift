// Unit tests for the StoreKit-facing file of OfferSignerClient, compiled here (via the symlink
// next to this file) against StoreKitShim. On Apple platforms this target compiles to nothing:
// the shipped target already builds the file against the real StoreKit.
#if !canImport(StoreKit)
import Foundation
import OfferSignerClient
import StoreKitShim
import Testing

private enum Fixture {
    static let token = UUID(uuidString: "7E3FB20B-4CDB-47CC-936D-99D65F608138")!
    static let nonce = UUID(uuidString: "4AD1A6E2-7C2B-4C51-9E2B-0E1C5B7E9F10")!
    static let signatureBytes = Data([0x30, 0x44, 0x02, 0x20, 0xFB, 0xEF, 0xFF, 0x3E, 0x02, 0x20, 0x7F, 0xAA])
    static let timestamp: Int64 = 1_795_000_000_123
    static let jws = "eyJhbGciOiJFUzI1NiJ9.eyJvZmZlcklkZW50aWZpZXIiOiJ3aW5iYWNrNTAifQ.c2ln"
    /// The fixtures' `expiresAt` (2030-03-17T17:46:40Z) and a moment before it.
    static let expiry = Date(timeIntervalSince1970: 1_900_000_000)
    static let now = expiry.addingTimeInterval(-1000)

    /// iOS 18.4 and 26 with the Xcode 26 SDK (everything callable).
    static let modern = StoreKitCapabilities(
        compactJWSPromotionalOffer: true, subscriptionOfferSignature: true, introductoryOfferEligibility: true, winBackOffer: true)
    /// iOS 15 with the Xcode 26 SDK: the JWS option is back-deployed; no Signature struct.
    static let backDeployedIOS15 = StoreKitCapabilities(
        compactJWSPromotionalOffer: true, subscriptionOfferSignature: false, introductoryOfferEligibility: true)
    /// An SDK older than Xcode 26 (Swift 6.1 and before) on iOS 17.4+ and on iOS 15: no JWS
    /// promotional-offer option on any OS (see StoreKitCapabilities).
    static let iOS17_4 = StoreKitCapabilities(compactJWSPromotionalOffer: false, subscriptionOfferSignature: true)
    static let iOS15 = StoreKitCapabilities(compactJWSPromotionalOffer: false, subscriptionOfferSignature: false)

    /// Decoded from the wire format, like the client does.
    static func offer(token: Bool = true, legacy: Bool = true, jws: Bool = true, expiresAt: String = "2030-03-17T17:46:40Z") throws -> SignedPromotionalOffer {
        var object: [String: Any] = [
            "bundleID": "com.example.app",
            "productID": "com.example.pro.monthly",
            "offerID": "winback50",
            "appAccountToken": token ? "7e3fb20b-4cdb-47cc-936d-99d65f608138" : NSNull(),
            "expiresAt": expiresAt,
        ]
        if legacy {
            object["legacy"] = [
                "keyID": "KEY123",
                "nonce": "4ad1a6e2-7c2b-4c51-9e2b-0e1c5b7e9f10",
                "timestamp": NSNumber(value: timestamp),
                "signature": signatureBytes.base64EncodedString(),
            ]
        }
        if jws {
            object["jws"] = ["keyID": "KEY123", "compactJWS": Fixture.jws]
        }
        return try JSONDecoder().decode(SignedPromotionalOffer.self, from: JSONSerialization.data(withJSONObject: object))
    }
}

@Suite("StoreKit 2 purchase options (against StoreKitShim)")
struct PurchaseOptionMappingTests {
    @Test func compactJWSBranch() throws {
        let options = try Fixture.offer().purchaseOptions(now: Fixture.now, capabilities: Fixture.modern)
        #expect(Set(options.map(\.recorded)) == [
            .promotionalOfferCompactJWS(offerID: "winback50", compactJWS: Fixture.jws),
            .appAccountToken(Fixture.token),
        ])
    }

    @Test func signatureStructBranch() throws {
        let options = try Fixture.offer().purchaseOptions(now: Fixture.now, capabilities: Fixture.iOS17_4)
        let signature = Product.SubscriptionOffer.Signature(
            keyID: "KEY123", nonce: Fixture.nonce, timestamp: Int(Fixture.timestamp), signature: Fixture.signatureBytes
        )
        #expect(Set(options.map(\.recorded)) == [
            .promotionalOfferSignature(offerID: "winback50", signature: signature),
            .appAccountToken(Fixture.token),
        ])
    }

    @Test func signatureParametersBranch() throws {
        let options = try Fixture.offer().purchaseOptions(now: Fixture.now, capabilities: Fixture.iOS15)
        #expect(Set(options.map(\.recorded)) == [
            .promotionalOfferSignatureParameters(
                offerID: "winback50", keyID: "KEY123", nonce: Fixture.nonce,
                signature: Fixture.signatureBytes, timestamp: Int(Fixture.timestamp)
            ),
            .appAccountToken(Fixture.token),
        ])
    }

    /// The #1 field bug: StoreKit 2 wants the decoded DER bytes, not the Base64 text's UTF-8.
    @Test(arguments: [Fixture.iOS17_4, Fixture.iOS15])
    func signatureIsBase64DecodedData(_ capabilities: StoreKitCapabilities) throws {
        let options = try Fixture.offer(jws: false).purchaseOptions(now: Fixture.now, capabilities: capabilities)
        let signatures: [Data] = options.compactMap {
            switch $0.recorded {
            case .promotionalOfferSignature(_, let signature): signature.signature
            case .promotionalOfferSignatureParameters(_, _, _, let signature, _): signature
            default: nil
            }
        }
        #expect(signatures == [Fixture.signatureBytes])
        #expect(signatures.first != Data(Fixture.signatureBytes.base64EncodedString().utf8))
    }

    @Test(arguments: [Fixture.modern, Fixture.iOS17_4, Fixture.iOS15])
    func noAppAccountTokenOptionWhenUnbound(_ capabilities: StoreKitCapabilities) throws {
        let options = try Fixture.offer(token: false).purchaseOptions(now: Fixture.now, capabilities: capabilities)
        #expect(options.count == 1)
        #expect(!options.contains { if case .appAccountToken = $0.recorded { true } else { false } })
    }

    @Test("iOS 15 (Xcode 26 SDK): the back-deployed JWS option, also when both formats came back")
    func jwsOnIOS15WhereBackDeployed() throws {
        for offer in [try Fixture.offer(legacy: false), try Fixture.offer()] {
            let options = try offer.purchaseOptions(now: Fixture.now, capabilities: Fixture.backDeployedIOS15)
            #expect(Set(options.map(\.recorded)) == [
                .promotionalOfferCompactJWS(offerID: "winback50", compactJWS: Fixture.jws),
                .appAccountToken(Fixture.token),
            ])
        }
    }

    @Test("A JWS-only offer where the OS cannot take it: a typed error, no options")
    func jwsOnlyOfferWhereUnavailable() throws {
        let offer = try Fixture.offer(legacy: false)
        #expect {
            try offer.purchaseOptions(now: Fixture.now, capabilities: Fixture.iOS15)
        } throws: { error in
            guard case .signatureFormatUnavailable(.legacy) = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test func legacyOnlyOfferOnNewOSUsesSignatureStruct() throws {
        let options = try Fixture.offer(jws: false).purchaseOptions(now: Fixture.now, capabilities: Fixture.modern)
        #expect(options.contains { if case .promotionalOfferSignature = $0.recorded { true } else { false } })
    }

    @Test func defaultCapabilitiesOnLinuxPickJWS() throws {
        // `#available(iOS …, *)` holds off Apple platforms, so `.current` claims everything.
        let options = try Fixture.offer().purchaseOptions(now: Fixture.now)
        #expect(options.contains { if case .promotionalOfferCompactJWS = $0.recorded { true } else { false } })
    }

    @Test func refusesExpiredSignature() throws {
        let offer = try Fixture.offer(expiresAt: "2030-03-17T17:46:40Z")
        let expiry = Fixture.expiry
        #expect(throws: Never.self) { try offer.purchaseOptions(now: expiry.addingTimeInterval(-0.001)) }
        for now in [expiry, expiry.addingTimeInterval(86_400)] {
            #expect {
                try offer.purchaseOptions(now: now, capabilities: Fixture.modern)
            } throws: { error in
                guard case .signatureExpired(let expiresAt) = error as? OfferSignerClientError else { return false }
                return expiresAt == expiry
            }
        }
    }

    @Test func planTranslationIsUsableDirectly() throws {
        let plan = try Fixture.offer().purchasePlan(now: Fixture.now, capabilities: Fixture.iOS15)
        #expect(try plan.storeKitPurchaseOptions() == (try Fixture.offer().purchaseOptions(now: Fixture.now, capabilities: Fixture.iOS15)))
    }
}

@Suite("SKPaymentDiscount builder (against StoreKitShim)")
struct PaymentDiscountTests {
    @Test func buildsDiscountWithBase64StringAndNSNumber() throws {
        let offer = try Fixture.offer()
        let discount = try offer.paymentDiscount(now: Fixture.now)
        #expect(discount.identifier == "winback50")
        #expect(discount.keyIdentifier == "KEY123")
        #expect(discount.nonce == Fixture.nonce)
        #expect(discount.signature == Fixture.signatureBytes.base64EncodedString())  // the Base64 string itself
        #expect(discount.timestamp == NSNumber(value: Fixture.timestamp))
        #expect(discount.timestamp.int64Value == 1_795_000_000_123)
        #expect(offer.applicationUsername == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
    }

    @Test func refusesExpired() throws {
        let offer = try Fixture.offer()
        #expect {
            try offer.paymentDiscount(now: Fixture.expiry)
        } throws: { error in
            guard case .signatureExpired = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test func needsLegacyFormat() throws {
        let offer = try Fixture.offer(legacy: false)
        #expect {
            try offer.paymentDiscount(now: Fixture.now)
        } throws: { error in
            guard case .signatureFormatUnavailable(.legacy) = error as? OfferSignerClientError else { return false }
            return true
        }
    }
}
#endif
