import Foundation
import Testing
@testable import OfferSignerClient

@Suite("Choosing the purchase option per OS")
struct PurchasePlanTests {
    let now = Date(timeIntervalSince1970: 1_900_000_000)
    let modern = StoreKitCapabilities(nativeCompactJWSPromotionalOffers: true, subscriptionOfferSignature: true)
    let iOS17_4 = StoreKitCapabilities(nativeCompactJWSPromotionalOffers: false, subscriptionOfferSignature: true)
    let iOS15 = StoreKitCapabilities(nativeCompactJWSPromotionalOffers: false, subscriptionOfferSignature: false)

    var expectedParameters: PromotionalOfferPurchasePlan.SignatureParameters {
        .init(keyID: "KEY123", nonce: Fixtures.nonce, timestamp: Int(Fixtures.timestamp), signature: Fixtures.signatureBytes)
    }

    @Test func jwsWhenNative() throws {
        let plan = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: modern)
        #expect(plan.method == .compactJWS(Fixtures.compactJWS))
        #expect(plan.offerID == "winback50")
        #expect(plan.appAccountToken == Fixtures.token)
    }

    @Test func signatureStructOn17_4WhenBothFormats() throws {
        let plan = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: iOS17_4)
        #expect(plan.method == .subscriptionOfferSignature(expectedParameters))
    }

    @Test func parametersOn15() throws {
        let plan = try Fixtures.offer(jws: true).purchasePlan(now: now, capabilities: iOS15)
        #expect(plan.method == .signatureParameters(expectedParameters))
    }

    @Test func legacyOnlyOnModernOSUsesSignatureStruct() throws {
        let plan = try Fixtures.offer(jws: false).purchasePlan(now: now, capabilities: modern)
        #expect(plan.method == .subscriptionOfferSignature(expectedParameters))
    }

    @Test func jwsOnlyStillUsedOnOlderOS() throws {
        // Apple back-deploys promotionalOffer(_:compactJWS:), so a JWS-only offer is still usable.
        let plan = try Fixtures.offer(legacy: false, jws: true).purchasePlan(now: now, capabilities: iOS15)
        #expect(plan.method == .compactJWS(Fixtures.compactJWS))
    }

    @Test func noTokenNoTokenOption() throws {
        let plan = try Fixtures.offer(token: nil).purchasePlan(now: now, capabilities: modern)
        #expect(plan.appAccountToken == nil)
    }

    @Test func refusesExpiredSignature() {
        let offer = Fixtures.offer(expiresAt: now)
        #expect(offer.isExpired(at: now))
        #expect(!offer.isExpired(at: now.addingTimeInterval(-1)))
        #expect {
            try offer.purchasePlan(now: now, capabilities: modern)
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
        // `#available(iOS …, *)` is true off Apple platforms: every branch compiles and is "available".
        #expect(StoreKitCapabilities.current == modern)
        #endif
    }
}
