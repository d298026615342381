import Foundation
import Testing
@testable import OfferSignerClient

/// Fixtures shaped exactly like the service's responses.
enum Fixtures {
    static let token = UUID(uuidString: "7E3FB20B-4CDB-47CC-936D-99D65F608138")!
    static let nonce = UUID(uuidString: "4AD1A6E2-7C2B-4C51-9E2B-0E1C5B7E9F10")!
    /// Standard Base64 of a (fake) DER ECDSA signature, deliberately containing `+` and `/`.
    static let signatureBytes = Data([0x30, 0x45, 0x02, 0x20, 0xFB, 0xEF, 0xFF, 0x3E, 0x7F, 0x01, 0x02, 0x21, 0x00, 0xAB])
    static var signatureBase64: String { signatureBytes.base64EncodedString() }
    static let compactJWS = "eyJhbGciOiJFUzI1NiIsImtpZCI6IktFWTEyMyJ9.eyJub25jZSI6IngifQ.c2ln"
    static let timestamp: Int64 = 1_795_000_000_123

    static func signatureJSON(
        token: String? = "7e3fb20b-4cdb-47cc-936d-99d65f608138",
        legacy: Bool = true,
        jws: Bool = false,
        expiresAt: String = "2026-11-23T03:10:00.123Z",
        signature: String? = nil
    ) -> Data {
        var object: [String: Any] = [
            "bundleID": "com.example.app",
            "productID": "com.example.pro.monthly",
            "offerID": "winback50",
            "appAccountToken": token.map { $0 as Any } ?? NSNull(),
            "expiresAt": expiresAt,
        ]
        if legacy {
            object["legacy"] = [
                "keyID": "KEY123",
                "nonce": "4ad1a6e2-7c2b-4c51-9e2b-0e1c5b7e9f10",
                "timestamp": NSNumber(value: timestamp),
                "signature": signature ?? signatureBase64,
            ]
        }
        if jws {
            object["jws"] = ["keyID": "KEY123", "compactJWS": compactJWS]
        }
        return try! JSONSerialization.data(withJSONObject: object)
    }

    static func offer(
        token: UUID? = Fixtures.token,
        legacy: Bool = true,
        jws: Bool = false,
        expiresAt: Date = Date(timeIntervalSince1970: 2_000_000_000)
    ) -> SignedPromotionalOffer {
        SignedPromotionalOffer(
            bundleID: "com.example.app",
            productID: "com.example.pro.monthly",
            offerID: "winback50",
            appAccountToken: token,
            legacy: legacy
                ? try! LegacyOfferSignature(keyID: "KEY123", nonce: nonce, timestamp: timestamp, signature: signatureBase64)
                : nil,
            jws: jws ? JWSOfferSignature(keyID: "KEY123", compactJWS: compactJWS) : nil,
            expiresAt: expiresAt
        )
    }
}

@Suite("RFC 3339 dates")
struct RFC3339Tests {
    @Test func parsesWithFractionalSeconds() throws {
        let date = try #require(RFC3339.date(from: "2026-11-23T03:10:00.123Z"))
        #expect(abs(date.timeIntervalSince1970 - 1_795_403_400.123) < 0.0005)
    }

    @Test func parsesWithoutFractionalSeconds() throws {
        let date = try #require(RFC3339.date(from: "2026-11-23T03:10:00Z"))
        #expect(date.timeIntervalSince1970 == 1_795_403_400)
    }

    @Test func parsesOffsetsAndLowercase() throws {
        let plus = try #require(RFC3339.date(from: "2026-11-23T05:10:00+02:00"))
        #expect(plus.timeIntervalSince1970 == 1_795_403_400)
        let lower = try #require(RFC3339.date(from: "2026-11-23t03:10:00.5z"))
        #expect(lower.timeIntervalSince1970 == 1_795_403_400.5)
    }

    @Test(arguments: [
        "", "2026-11-23", "2026-11-23T03:10:00", "2026-11-23T03:10:00.Z", "2026-02-30T00:00:00Z",
        "2026-13-01T00:00:00Z", "2026-11-23T25:00:00Z", "2026-11-23T03:10:00Zjunk", "1795403400",
    ])
    func rejectsInvalid(_ text: String) {
        #expect(RFC3339.date(from: text) == nil)
    }

    @Test func formatsRoundTrip() throws {
        let date = Date(timeIntervalSince1970: 1_795_403_400.123)
        #expect(RFC3339.string(from: date) == "2026-11-23T03:10:00.123Z")
        let back = try #require(RFC3339.date(from: RFC3339.string(from: date)))
        #expect(abs(back.timeIntervalSince(date)) < 0.001)
    }
}

@Suite("Response models")
struct ModelDecodingTests {
    @Test func decodesLegacySignatureResponse() throws {
        let offer = try JSONDecoder().decode(SignedPromotionalOffer.self, from: Fixtures.signatureJSON())
        #expect(offer.bundleID == "com.example.app")
        #expect(offer.productID == "com.example.pro.monthly")
        #expect(offer.offerID == "winback50")
        #expect(offer.appAccountToken == Fixtures.token)
        let legacy = try #require(offer.legacy)
        #expect(legacy.keyID == "KEY123")
        #expect(legacy.nonce == Fixtures.nonce)
        #expect(legacy.timestamp == Fixtures.timestamp)
        #expect(legacy.signature == Fixtures.signatureBase64)
        #expect(offer.jws == nil)
        #expect(RFC3339.string(from: offer.expiresAt) == "2026-11-23T03:10:00.123Z")
        #expect(offer.applicationUsername == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
    }

    /// The #1 field bug: the signature StoreKit 2 needs is the Base64-decoded DER, not the UTF-8
    /// bytes of the Base64 text.
    @Test func signatureDataIsBase64Decoded() throws {
        let offer = try JSONDecoder().decode(SignedPromotionalOffer.self, from: Fixtures.signatureJSON())
        let legacy = try #require(offer.legacy)
        #expect(legacy.signatureData == Fixtures.signatureBytes)
        #expect(legacy.signatureData != Data(Fixtures.signatureBase64.utf8))
        #expect(legacy.signatureData.first == 0x30)  // DER SEQUENCE
    }

    @Test func decodesJWSAndNullToken() throws {
        let offer = try JSONDecoder().decode(
            SignedPromotionalOffer.self,
            from: Fixtures.signatureJSON(token: nil, legacy: false, jws: true, expiresAt: "2026-11-23T03:10:00Z")
        )
        #expect(offer.appAccountToken == nil)
        #expect(offer.applicationUsername == nil)
        #expect(offer.legacy == nil)
        #expect(offer.jws == JWSOfferSignature(keyID: "KEY123", compactJWS: Fixtures.compactJWS))
        #expect(offer.expiresAt == Date(timeIntervalSince1970: 1_795_403_400))
    }

    @Test func rejectsNonBase64Signature() {
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(SignedPromotionalOffer.self, from: Fixtures.signatureJSON(signature: "not base64!"))
        }
        #expect(throws: OfferSignerClientError.self) {
            try LegacyOfferSignature(keyID: "K", nonce: UUID(), timestamp: 1, signature: "%%%")
        }
    }

    @Test func rejectsBadExpiry() {
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(SignedPromotionalOffer.self, from: Fixtures.signatureJSON(expiresAt: "tomorrow"))
        }
    }

    @Test func signedOfferRoundTripsThroughCodable() throws {
        let original = try JSONDecoder().decode(SignedPromotionalOffer.self, from: Fixtures.signatureJSON(jws: true))
        let again = try JSONDecoder().decode(SignedPromotionalOffer.self, from: JSONEncoder().encode(original))
        #expect(again == original)
    }

    @Test func decodesEligibility() throws {
        let json = Data("""
        {"decisions": [
          {"offerID": "winback50", "eligible": true, "reasons": []},
          {"offerID": "winback70", "eligible": false, "reasons": ["subscribed_recently"],
           "eligibleFrom": "2026-12-01T00:00:00Z"}
        ]}
        """.utf8)
        let result = try JSONDecoder().decode(OfferEligibility.self, from: json)
        #expect(result.decisions.count == 2)
        #expect(result.eligibleOfferIDs == ["winback50"])
        let denied = try #require(result.decision(for: "winback70"))
        #expect(!denied.eligible)
        #expect(denied.reasons == ["subscribed_recently"])
        #expect(denied.eligibleFrom == RFC3339.date(from: "2026-12-01T00:00:00Z"))
        #expect(result.decision(for: "winback50")?.eligibleFrom == nil)
        #expect(result.decision(for: "nope") == nil)
        #expect(denied.ineligibility?.reasons == ["subscribed_recently"])
        #expect(result.decision(for: "winback50")?.ineligibility == nil)
    }

    /// A decision as EligibilityService.json writes it: every member reaches the app.
    @Test func decodesTheWholeDecision() throws {
        let json = Data("""
        {"decisions": [{"offerID": "wb1", "eligible": false, "reasons": ["evidence_unverified", "no_history"],
          "evidenceFailures": [{"source": "signedRenewalInfo", "index": 0, "code": "signature_invalid", "message": "bad"}],
          "historySource": "client"}]}
        """.utf8)
        let decision = try #require(try JSONDecoder().decode(OfferEligibility.self, from: json).decision(for: "wb1"))
        #expect(decision.historySource == .client)
        #expect(decision.evidenceFailures == [EvidenceFailure(source: "signedRenewalInfo", index: 0, code: "signature_invalid", message: "bad")])
        let again = try JSONDecoder().decode(OfferEligibilityDecision.self, from: JSONEncoder().encode(decision))
        #expect(again == decision)
        #expect(decision.ineligibility == OfferIneligibility(
            reasons: ["evidence_unverified", "no_history"], historySource: .client, evidenceFailures: decision.evidenceFailures))
    }
}

@Suite("Evidence within the service's limits (1,000 JWS, 1 MiB body)")
struct EvidenceBoundsTests {
    static func jws(_ index: Int, bytes: Int = 3000) -> String {
        let head = "eyJ\(index)."
        return head + String(repeating: "A", count: max(0, bytes - head.count))
    }

    @Test func smallEvidenceIsKeptWhole() {
        let (evidence, truncated) = PurchaseEvidence.bounded(signedTransactions: ["a", "b"], signedRenewalInfos: ["r"])
        #expect(evidence == PurchaseEvidence(signedTransactions: ["a", "b"], signedRenewalInfos: ["r"]))
        #expect(!truncated)
    }

    @Test("At most 1,000 items: renewal infos first, then the newest transactions")
    func itemLimit() {
        let transactions = (0..<1500).map { "t\($0)" }
        let (evidence, truncated) = PurchaseEvidence.bounded(signedTransactions: transactions, signedRenewalInfos: ["r1", "r2"])
        #expect(truncated)
        #expect(evidence.signedRenewalInfos == ["r1", "r2"])
        #expect(evidence.signedTransactions == Array(transactions.prefix(998)))
        #expect(evidence.signedTransactions.count + evidence.signedRenewalInfos.count == PurchaseEvidence.serviceMaximumItems)
    }

    @Test("At most 1 MiB of JSON, the request around it included")
    func byteLimit() throws {
        // 600 transactions of ~3 KB each: under 1,000 items, over 1 MiB.
        let transactions = (0..<600).map { Self.jws($0) }
        let (evidence, truncated) = PurchaseEvidence.bounded(signedTransactions: transactions, signedRenewalInfos: [Self.jws(9999)])
        #expect(truncated)
        #expect(evidence.signedRenewalInfos.count == 1)
        #expect(evidence.signedTransactions == Array(transactions.prefix(evidence.signedTransactions.count)))
        // The whole request body, as the client encodes it, stays within the service's limit.
        let body = SignatureRequestBody(
            productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: Fixtures.token.uuidString.lowercased(),
            bundleID: "com.example.app", formats: ["jws"], transactionID: "2000000123", evidence: evidence)
        let size = try JSONEncoder().encode(body).count
        #expect(size <= PurchaseEvidence.serviceMaximumBytes, "\(size)")
        #expect(size > PurchaseEvidence.serviceMaximumBytes - 8192, "uses the room it has: \(size)")
    }
}
