import Foundation
import Testing
@testable import OfferSignerClient

/// What each OS band can call, as Apple's SDKs declare it (see `StoreKitCapabilities`).
enum Bands {
    /// Xcode 26 SDK: the JWS options are back-deployed to iOS 15, so every band has them.
    static let iOS15 = StoreKitCapabilities(
        compactJWSPromotionalOffer: true, subscriptionOfferSignature: false, introductoryOfferEligibility: true, winBackOffer: false)
    static let iOS18_4 = StoreKitCapabilities(
        compactJWSPromotionalOffer: true, subscriptionOfferSignature: true, introductoryOfferEligibility: true, winBackOffer: true)
    /// 26.0 deprecates the original signature's options; the JWS form is the one left.
    static let iOS26 = iOS18_4
    /// iOS 18.4 SDK (Xcode 16.3/16.4, Swift 6.1), on iOS 15 / 17.4 / 18.4: no JWS promotional-offer
    /// option on any OS (Apple declares it only back-deployed before 26.0, i.e. first in the
    /// Xcode 26 SDK); intro eligibility only where it is native (18.4+).
    static let sdk18_4OniOS15 = StoreKitCapabilities(
        compactJWSPromotionalOffer: false, subscriptionOfferSignature: false, introductoryOfferEligibility: false, winBackOffer: false)
    static let sdk18_4OniOS17_4 = StoreKitCapabilities(
        compactJWSPromotionalOffer: false, subscriptionOfferSignature: true, introductoryOfferEligibility: false, winBackOffer: false)
    static let sdk18_4OniOS18_4 = StoreKitCapabilities(
        compactJWSPromotionalOffer: false, subscriptionOfferSignature: true, introductoryOfferEligibility: true, winBackOffer: true)
}

@Suite("Choosing the purchase option per OS")
struct PurchasePlanTests {
    let now = Date(timeIntervalSince1970: 1_900_000_000)

    var expectedParameters: PromotionalOfferPurchasePlan.SignatureParameters {
        .init(keyID: "KEY123", nonce: Fixtures.nonce, timestamp: Int(Fixtures.timestamp), signature: Fixtures.signatureBytes)
    }

    @Test("JWS wherever the OS takes it: iOS 15, 18.4 and 26 (Xcode 26 SDK), even when both formats came back",
          arguments: [Bands.iOS15, Bands.iOS18_4, Bands.iOS26])
    func jwsPreferredInEveryBand(_ band: StoreKitCapabilities) throws {
        let plan = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: band)
        #expect(plan.method == PromotionalOfferPurchasePlan.Method.compactJWS(Fixtures.compactJWS))
        #expect(plan.offerID == "winback50")
        #expect(plan.appAccountToken == Fixtures.token)
    }

    @Test("iOS 18.4 SDK (Swift 6.1): the original signature on every OS, 18.4 and later included")
    func olderSDKUsesTheOriginalSignatureWhereItMust() throws {
        let onIOS15 = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: Bands.sdk18_4OniOS15)
        #expect(onIOS15.method == PromotionalOfferPurchasePlan.Method.signatureParameters(expectedParameters))
        for band in [Bands.sdk18_4OniOS17_4, Bands.sdk18_4OniOS18_4] {
            let plan = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: band)
            #expect(plan.method == PromotionalOfferPurchasePlan.Method.subscriptionOfferSignature(expectedParameters))
        }
    }

    @Test func legacyOnlyOfferUsesTheSignatureStructWhereItExists() throws {
        let modern = try Fixtures.offer(jws: false).purchasePlan(now: now, capabilities: Bands.iOS26)
        #expect(modern.method == PromotionalOfferPurchasePlan.Method.subscriptionOfferSignature(expectedParameters))
        let old = try Fixtures.offer(jws: false).purchasePlan(now: now, capabilities: Bands.iOS15)
        #expect(old.method == PromotionalOfferPurchasePlan.Method.signatureParameters(expectedParameters))
    }

    @Test(arguments: [Bands.sdk18_4OniOS15, Bands.sdk18_4OniOS17_4, Bands.sdk18_4OniOS18_4])
    func jwsOnlyOfferWhereTheSDKCannotTakeItSaysWhichFormatIsNeeded(_ band: StoreKitCapabilities) {
        #expect {
            try Fixtures.offer(legacy: false, jws: true).purchasePlan(now: now, capabilities: band)
        } throws: { error in
            guard case .signatureFormatUnavailable(.legacy) = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test("arm64_32 (32-bit Int): a millisecond timestamp does not fit, so the JWS form is used; without one, a typed error")
    func arm64_32FallsBackToJWS() throws {
        #expect(Int32(exactly: Fixtures.timestamp) == nil)
        // Both formats: JWS, also where a 64-bit build would have used the original signature.
        let both = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: Bands.iOS26, platformInt: Int32.self)
        #expect(both.method == PromotionalOfferPurchasePlan.Method.compactJWS(Fixtures.compactJWS))
        // The original signature alone cannot be used: `.signatureFormatUnavailable(.jws)`, not `.invalidResponse`.
        for band in [Bands.iOS26, Bands.sdk18_4OniOS17_4] {
            #expect {
                try Fixtures.offer(jws: false).purchasePlan(now: now, capabilities: band, platformInt: Int32.self)
            } throws: { error in
                guard case .signatureFormatUnavailable(.jws) = error as? OfferSignerClientError else { return false }
                return true
            }
        }
        // The same offer on a 64-bit build uses the original signature.
        let wide = try Fixtures.offer(jws: false).purchasePlan(now: now, capabilities: Bands.iOS26, platformInt: Int64.self)
        #expect(wide.method == PromotionalOfferPurchasePlan.Method.subscriptionOfferSignature(expectedParameters))
    }

    @Test("Default formats: JWS wherever it can be used; the original signature only where it must; never empty")
    func defaultFormats() {
        for band in [Bands.iOS15, Bands.iOS18_4, Bands.iOS26] {
            #expect(band.defaultFormats == [.jws])
            #expect(band.defaultFormats(platformInt: Int32.self) == [.jws])
        }
        // The iOS 18.4 SDK has no JWS option on any OS: legacy, 18.4 and later included.
        for band in [Bands.sdk18_4OniOS15, Bands.sdk18_4OniOS17_4, Bands.sdk18_4OniOS18_4] {
            #expect(band.defaultFormats(platformInt: Int64.self) == [.legacy])
        }
        // arm64_32: the original signature cannot work there, so it is never the default.
        #expect(Bands.sdk18_4OniOS15.defaultFormats(platformInt: Int32.self) == [.jws])
    }

    @Test func noTokenNoTokenOption() throws {
        let plan = try Fixtures.offer(token: nil).purchasePlan(now: now, capabilities: Bands.iOS26)
        #expect(plan.appAccountToken == nil)
    }

    @Test func refusesExpiredSignature() {
        let offer = Fixtures.offer(expiresAt: now)
        #expect(offer.isExpired(at: now))
        #expect(!offer.isExpired(at: now.addingTimeInterval(-1)))
        #expect {
            try offer.purchasePlan(now: now, capabilities: Bands.iOS26)
        } throws: { error in
            guard case .signatureExpired(let expiresAt) = error as? OfferSignerClientError else { return false }
            return expiresAt == now
        }
        #expect(throws: OfferSignerClientError.self) {
            try offer.unexpiredLegacySignature(now: now.addingTimeInterval(3600))
        }
    }

    @Test func legacySignatureRequiresLegacyFormat() throws {
        let jwsOnly = Fixtures.offer(legacy: false, jws: true)
        #expect {
            try jwsOnly.unexpiredLegacySignature(now: now)
        } throws: { error in
            guard case .signatureFormatUnavailable(.legacy) = error as? OfferSignerClientError else { return false }
            return true
        }
        #expect(try Fixtures.offer().unexpiredLegacySignature(now: now).keyID == "KEY123")
    }

    @Test func currentCapabilitiesOnThisPlatform() {
        #if !canImport(Darwin)
        // `#available(iOS …, *)` is true off Apple platforms, and this compiler is Swift 6.2 or later
        // (the Xcode 26 SDK era): everything is "available".
        #expect(StoreKitCapabilities.current == Bands.iOS26)
        #expect(StoreKitCapabilities.current.defaultFormats == [.jws])
        #endif
    }
}
