import AppleTestChain
import Crypto
import Foundation
import OfferSignerEligibility
import OfferSignerEvidence
import SwiftASN1
import Testing
import X509

@Suite("Apple signed data (JWS) verification")
struct AppleSignedDataVerifierTests {
    static let now = Fixture.now
    static let bundleID = "com.example.app"
    static let chain = Result { try TestAppleChain() }

    func chain() throws -> TestAppleChain { try Self.chain.get() }

    func verifier(_ chain: TestAppleChain, environment: AppleEnvironment? = .production) -> AppleSignedDataVerifier {
        AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: environment)
    }

    static func transactionPayload(
        bundleID: String = AppleSignedDataVerifierTests.bundleID,
        environment: String = "Production",
        signedDate: Date? = AppleSignedDataVerifierTests.now
    ) -> [String: Any] {
        var payload: [String: Any] = [
            "transactionId": "2000000123",
            "originalTransactionId": "2000000001",
            "webOrderLineItemId": "2000000000456",
            "bundleId": bundleID,
            "productId": Fixture.monthly,
            "subscriptionGroupIdentifier": Fixture.groupID,
            "purchaseDate": TestAppleChain.milliseconds(Fixture.monthsAgo(4)),
            "originalPurchaseDate": TestAppleChain.milliseconds(Fixture.monthsAgo(10)),
            "expiresDate": TestAppleChain.milliseconds(Fixture.monthsAgo(3)),
            "quantity": 1,
            "type": "Auto-Renewable Subscription",
            "inAppOwnershipType": "PURCHASED",
            "offerType": 2,
            "offerIdentifier": "wb1",
            "offerDiscountType": "PAY_AS_YOU_GO",
            "price": 4990,
            "currency": "USD",
            "storefront": "USA",
            "storefrontId": "143441",
            "environment": environment,
            "transactionReason": "PURCHASE",
            "appAccountToken": "7e3fb20b-4cdb-47cc-936d-99d65f608138",
        ]
        if let signedDate { payload["signedDate"] = TestAppleChain.milliseconds(signedDate) }
        return payload
    }

    static func renewalPayload(environment: String = "Production") -> [String: Any] {
        [
            "originalTransactionId": "2000000001",
            "autoRenewProductId": Fixture.monthly,
            "productId": Fixture.monthly,
            "autoRenewStatus": 0,
            "expirationIntent": 1,
            "isInBillingRetryPeriod": false,
            "eligibleWinBackOfferIds": ["apple_wb_1"],
            "environment": environment,
            "signedDate": TestAppleChain.milliseconds(now),
            "recentSubscriptionStartDate": TestAppleChain.milliseconds(Fixture.monthsAgo(10)),
        ]
    }

    /// Verifies one transaction and returns its single failure (or records an issue).
    func failure(of jws: String, verifier: AppleSignedDataVerifier) async -> EvidenceFailure? {
        let evidence = await verifier.verify(signedTransactions: [jws], signedRenewalInfos: [], now: Self.now)
        #expect(evidence.transactions.isEmpty)
        #expect(evidence.failures.count == 1)
        return evidence.failures.first
    }

    // MARK: - Embedded root

    @Test func embeddedAppleRootMatchesRepositoryFileAndFingerprint() throws {
        let fileURL = OfferCatalogTests.repoRoot.appendingPathComponent("Certificates/AppleRootCA-G3.pem")
        let file = try String(contentsOf: fileURL, encoding: .utf8)
        func squeeze(_ text: String) -> String { text.filter { !$0.isWhitespace } }
        #expect(squeeze(file) == squeeze(AppleRootCA.g3PEM))

        let der = try PEMDocument(pemString: AppleRootCA.g3PEM).derBytes
        let fingerprint = SHA256.hash(data: der).map { String(format: "%02X", $0) }.joined(separator: ":")
        #expect(fingerprint == "63:34:3A:BF:B8:9A:6A:03:EB:B5:7E:9B:3F:5F:A7:BE:7C:4F:5C:75:6F:30:17:B3:A8:C4:88:C3:65:3E:91:79")
        #expect(try Certificate(derEncoded: der) == Certificate.appleRootCAG3)
        #expect(Certificate.appleRootCAG3.subject.description.contains("Apple Root CA - G3"))
    }

    // MARK: - Valid evidence

    @Test func validEvidenceVerifies() async throws {
        let chain = try chain()
        let transaction = try chain.signJWS(Self.transactionPayload())
        let renewal = try chain.signJWS(Self.renewalPayload())
        let evidence = await verifier(chain).verify(
            signedTransactions: [transaction], signedRenewalInfos: [renewal], now: Self.now)
        #expect(evidence.failures == [])
        #expect(evidence.isFullyVerified)
        let verified = try #require(evidence.transactions.first)
        #expect(verified.transactionID == "2000000123")
        #expect(verified.originalTransactionID == "2000000001")
        #expect(verified.productID == Fixture.monthly)
        #expect(verified.subscriptionGroupID == Fixture.groupID)
        #expect(verified.purchaseDate == Fixture.monthsAgo(4))
        #expect(verified.expiresDate == Fixture.monthsAgo(3))
        #expect(verified.revocationDate == nil)
        #expect(verified.ownershipType == .purchased)
        #expect(verified.offerType == .promotional)
        #expect(verified.offerIdentifier == "wb1")
        #expect(verified.offerDiscountType == .payAsYouGo)
        #expect(verified.price == 4990)
        #expect(verified.storefront == "USA")
        #expect(verified.environment == .production)
        #expect(verified.bundleID == Self.bundleID)
        #expect(verified.type == .autoRenewableSubscription)
        #expect(verified.appAccountToken == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        #expect(verified.signedDate == Self.now)

        let info = try #require(evidence.renewalInfos.first)
        #expect(info.originalTransactionID == "2000000001")
        #expect(info.autoRenewEnabled == false)
        #expect(info.isInBillingRetryPeriod == false)
        #expect(info.eligibleWinBackOfferIDs == ["apple_wb_1"])
        #expect(info.environment == .production)
    }

    @Test func nilEnvironmentAcceptsSandbox() async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload(environment: "Sandbox"))
        let evidence = await verifier(chain, environment: nil).verify(
            signedTransactions: [jws], signedRenewalInfos: [], now: Self.now)
        #expect(evidence.failures == [])
        #expect(evidence.transactions.first?.environment == .sandbox)
    }

    @Test func validityIsCheckedAtSignedDateLikeApplesLibrary() async throws {
        // The leaf expired a year before `now`, but the payload was signed while it was valid.
        let chain = try TestAppleChain(
            leafNotBefore: Fixture.monthsAgo(36), leafNotAfter: Fixture.monthsAgo(12))
        let jws = try chain.signJWS(Self.transactionPayload(signedDate: Fixture.monthsAgo(18)))
        let evidence = await verifier(chain).verify(signedTransactions: [jws], signedRenewalInfos: [], now: Self.now)
        #expect(evidence.failures == [])
        #expect(evidence.transactions.count == 1)
    }

    // MARK: - Rejections

    @Test func forgedSelfSignedLeafIsRejected() async throws {
        let forged = try chain().withSelfSignedLeaf()
        let jws = try forged.signJWS(Self.transactionPayload())
        let failure = await failure(of: jws, verifier: verifier(try chain()))
        #expect(failure?.code == .untrustedChain)
        #expect(failure?.source == .signedTransaction)
        #expect(failure?.index == 0)
    }

    @Test func foreignChainIsRejected() async throws {
        let foreign = try TestAppleChain(rootName: "Not Apple Root", markerOIDs: false)
        let jws = try foreign.signJWS(Self.transactionPayload())
        let failure = await failure(of: jws, verifier: verifier(try chain()))
        #expect(failure?.code == .untrustedChain)
        #expect(failure?.message.contains("marker") == true)
    }

    @Test func foreignChainWithMarkerOIDsIsRejected() async throws {
        let foreign = try TestAppleChain(rootName: "Test Apple Root CA")  // same name, other key
        let jws = try foreign.signJWS(Self.transactionPayload())
        #expect(await failure(of: jws, verifier: verifier(try chain()))?.code == .untrustedChain)
    }

    @Test func trustedRootWithoutMarkerOIDsIsRejected() async throws {
        let trusted = try chain()
        let unmarked = try TestAppleChain(rootKey: trusted.rootKey, root: trusted.root, markerOIDs: false)
        let jws = try unmarked.signJWS(Self.transactionPayload())
        let failure = await failure(of: jws, verifier: verifier(trusted))
        #expect(failure?.code == .missingAppleMarkerOID)
        #expect(failure?.message.contains("1.2.840.113635.100.6.11.1") == true)
    }

    @Test func testChainIsNotTrustedByDefault() async throws {
        let jws = try chain().signJWS(Self.transactionPayload())
        let apple = AppleSignedDataVerifier(bundleID: Self.bundleID, environment: .production)
        #expect(apple.trustedRoots == [Certificate.appleRootCAG3])
        #expect(await failure(of: jws, verifier: apple)?.code == .untrustedChain)
    }

    @Test func alteredPayloadIsRejected() async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload())
        var parts = jws.split(separator: ".").map(String.init)
        var payload = Self.transactionPayload()
        payload["offerIdentifier"] = "some_other_offer"
        parts[1] = TestAppleChain.base64URL(try JSONSerialization.data(withJSONObject: payload, options: [.sortedKeys]))
        let failure = await failure(of: parts.joined(separator: "."), verifier: verifier(chain))
        #expect(failure?.code == .invalidSignature)
    }

    @Test func signatureByAnotherKeyIsRejected() async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload())
        let other = try TestAppleChain().signJWS(Self.transactionPayload())
        let spliced = jws.split(separator: ".").prefix(2).joined(separator: ".") + "." + other.split(separator: ".")[2]
        #expect(await failure(of: spliced, verifier: verifier(chain))?.code == .invalidSignature)
    }

    @Test(arguments: ["HS256", "none", "ES384", "RS256"])
    func wrongAlgorithmIsRejected(alg: String) async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload(), alg: alg)
        let failure = await failure(of: jws, verifier: verifier(chain))
        #expect(failure?.code == .unsupportedAlgorithm)
        #expect(failure?.message.contains(alg) == true)
    }

    @Test func badBase64IsRejected() async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload())
        let parts = jws.split(separator: ".").map(String.init)
        let v = verifier(chain)
        #expect(await failure(of: "$$$." + parts[1] + "." + parts[2], verifier: v)?.code == .badBase64)
        #expect(await failure(of: parts[0] + ".pay load." + parts[2], verifier: v)?.code == .badBase64)
        #expect(await failure(of: parts[0] + "." + parts[1] + ".sig+nature/", verifier: v)?.code == .badBase64)
        var x5c = try chain.x5c()
        x5c[1] = "not base64 at all!"
        let badCert = try chain.signJWS(Self.transactionPayload(), x5c: x5c)
        let failure = await failure(of: badCert, verifier: v)
        #expect(failure?.code == .badBase64)
        #expect(failure?.message.contains("x5c[1]") == true)
    }

    @Test func malformedInputsAreRejected() async throws {
        let chain = try chain()
        let v = verifier(chain)
        #expect(await failure(of: "", verifier: v)?.code == .malformedJWS)
        #expect(await failure(of: "a.b", verifier: v)?.code == .malformedJWS)
        #expect(await failure(of: "a.b.c.d", verifier: v)?.code == .malformedJWS)
        #expect(await failure(of: String(repeating: "A", count: 70_000), verifier: v)?.code == .malformedJWS)
        let notJSON = TestAppleChain.base64URL(Data("hello".utf8))
        #expect(await failure(of: "\(notJSON).\(notJSON).\(notJSON)", verifier: v)?.code == .malformedHeader)

        var x5c = try chain.x5c()
        #expect(await failure(of: try chain.signJWS(Self.transactionPayload(), x5c: []), verifier: v)?.code == .missingCertificateChain)
        #expect(
            await failure(of: try chain.signJWS(Self.transactionPayload(), x5c: Array(x5c.prefix(2))), verifier: v)?.code
                == .invalidChainLength)
        x5c[0] = Data("not a certificate".utf8).base64EncodedString()
        #expect(await failure(of: try chain.signJWS(Self.transactionPayload(), x5c: x5c), verifier: v)?.code == .malformedCertificate)

        var missing = Self.transactionPayload()
        missing.removeValue(forKey: "transactionId")
        let missingField = await failure(of: try chain.signJWS(missing), verifier: v)
        #expect(missingField?.code == .malformedPayload)
        #expect(missingField?.message.contains("transactionId") == true)
        #expect(await failure(of: try chain.signJWS(payload: Data("[1,2]".utf8)), verifier: v)?.code == .malformedPayload)
    }

    @Test func expiredLeafIsRejected() async throws {
        let expired = try TestAppleChain(leafNotBefore: Fixture.monthsAgo(36), leafNotAfter: Fixture.monthsAgo(12))
        let jws = try expired.signJWS(Self.transactionPayload())  // signedDate = now, after expiry
        let failure = await failure(of: jws, verifier: verifier(expired))
        #expect(failure?.code == .certificateExpired)
        #expect(failure?.message.contains("leaf") == true)
        // Without signedDate, `now` is the validation time.
        let undated = try expired.signJWS(Self.transactionPayload(signedDate: nil))
        #expect(await self.failure(of: undated, verifier: verifier(expired))?.code == .certificateExpired)
    }

    @Test func notYetValidLeafIsRejected() async throws {
        let future = try TestAppleChain(leafNotBefore: Self.now.addingTimeInterval(86_400), leafNotAfter: Fixture.months(12, from: Self.now))
        let failure = await failure(of: try future.signJWS(Self.transactionPayload()), verifier: verifier(future))
        #expect(failure?.code == .certificateNotYetValid)
    }

    @Test func wrongBundleIsRejected() async throws {
        let chain = try chain()
        let jws = try chain.signJWS(Self.transactionPayload(bundleID: "com.evil.app"))
        let failure = await failure(of: jws, verifier: verifier(chain))
        #expect(failure?.code == .bundleIDMismatch)
        #expect(failure?.message.contains("com.evil.app") == true)
    }

    @Test func wrongEnvironmentIsRejected() async throws {
        let chain = try chain()
        let v = verifier(chain, environment: .production)
        #expect(await failure(of: try chain.signJWS(Self.transactionPayload(environment: "Sandbox")), verifier: v)?.code == .environmentMismatch)
        // Xcode data is never accepted, even without an expected environment.
        let xcode = try chain.signJWS(Self.transactionPayload(environment: "Xcode"))
        #expect(await failure(of: xcode, verifier: verifier(chain, environment: nil))?.code == .environmentMismatch)

        let renewal = try chain.signJWS(Self.renewalPayload(environment: "Sandbox"))
        let evidence = await v.verify(signedTransactions: [], signedRenewalInfos: [renewal], now: Self.now)
        #expect(evidence.renewalInfos.isEmpty)
        #expect(evidence.failures.map(\.code) == [.environmentMismatch])
        #expect(evidence.failures.first?.source == .signedRenewalInfo)
    }

    // MARK: - End to end with the evaluator

    @Test func oneBadItemMakesOffersWithRulesIneligible() async throws {
        let chain = try chain()
        let good = try chain.signJWS(Self.transactionPayload())
        let bad = try TestAppleChain().signJWS(Self.transactionPayload())
        let evidence = await verifier(chain).verify(
            signedTransactions: [good, bad], signedRenewalInfos: [], now: Self.now)
        #expect(evidence.transactions.count == 1)
        #expect(evidence.failures.map(\.index) == [1])

        let evaluator = EligibilityEvaluator()
        let withRules = evaluator.evaluate(Fixture.offer(id: "wb2"), evidence: evidence, ledger: [], now: Self.now)
        #expect(withRules.eligible == false)
        #expect(withRules.reasons == [.evidenceUnverified])
        #expect(withRules.evidenceFailures.first?.code == .untrustedChain)

        let withoutRules = evaluator.evaluate(Fixture.offer(rules: nil), evidence: evidence, ledger: [], now: Self.now)
        #expect(withoutRules.eligible)
    }

    @Test func verifiedRedemptionFeedsTheRules() async throws {
        let chain = try chain()
        let evidence = await verifier(chain).verify(
            signedTransactions: [try chain.signJWS(Self.transactionPayload())],
            signedRenewalInfos: [try chain.signJWS(Self.renewalPayload())], now: Self.now)
        let offer = Fixture.offer(rules: OfferRules(maxRedemptions: 1, deferToAppleWinBack: true))
        let decision = EligibilityEvaluator().evaluate(offer, evidence: evidence, ledger: [], now: Self.now)
        #expect(decision.reasons == [.maxRedemptions, .appleWinBackAvailable])
    }

    @Test("Apple's revocationReason, revocationType, revocationPercentage and expirationIntent decode as Apple spells them")
    func revocationFieldsDecode() async throws {
        let chain = try chain()
        var transaction = Self.transactionPayload()
        transaction["revocationDate"] = TestAppleChain.milliseconds(Self.now)
        transaction["revocationReason"] = 0
        transaction["revocationType"] = "REFUND_PRORATED"
        transaction["revocationPercentage"] = 25_000
        var renewal = Self.renewalPayload()
        renewal["expirationIntent"] = 2
        let evidence = await verifier(chain).verify(
            signedTransactions: [try chain.signJWS(transaction)], signedRenewalInfos: [try chain.signJWS(renewal)], now: Self.now)
        let verified = try #require(evidence.transactions.first)
        #expect(verified.revocationReason == 0 && verified.revocationType == .refundProrated && verified.revocationPercentage == 25_000)
        #expect(verified.isRefunded && !verified.isFamilyRevocation && abs(verified.refundedShare - 0.25) < 1e-9)
        #expect(evidence.renewalInfos.first?.expirationIntent == 2)
        // An older payload without revocationType: a refund, unless the transaction was family-shared.
        var older = verified
        older.revocationType = nil
        older.revocationPercentage = nil
        #expect(older.isRefunded && older.refundedShare == 1)
        older.ownershipType = .familyShared
        #expect(older.isFamilyRevocation && !older.isRefunded && older.refundedShare == 0)
    }
}

extension AppleSignedDataVerifierTests {
    @Test("A renewal info with an offer for the next renewal decodes offerType, offerIdentifier, offerDiscountType, offerPeriod and renewalDate as Apple spells them, and counts as a pending redemption")
    func pendingOfferInRenewalInfoDecodes() async throws {
        let chain = try chain()
        let renewalDate = Fixture.months(1, from: Self.now)
        // Shaped as JWSRenewalInfoDecodedPayload (appstoreserverlibrary/models/JWSRenewalInfoDecodedPayload.py).
        var renewal = Self.renewalPayload()
        renewal["autoRenewStatus"] = 1
        renewal.removeValue(forKey: "expirationIntent")
        renewal["offerType"] = 2
        renewal["offerIdentifier"] = "wb1"
        renewal["offerDiscountType"] = "PAY_UP_FRONT"
        renewal["offerPeriod"] = "P3M"
        renewal["renewalDate"] = TestAppleChain.milliseconds(renewalDate)
        // The current period, at the full price (no offer of its own): only the renewal info names wb1.
        var transaction = Self.transactionPayload()
        transaction["expiresDate"] = TestAppleChain.milliseconds(renewalDate)
        for key in ["offerType", "offerIdentifier", "offerDiscountType"] { transaction.removeValue(forKey: key) }
        let evidence = await verifier(chain).verify(
            signedTransactions: [try chain.signJWS(transaction)], signedRenewalInfos: [try chain.signJWS(renewal)], now: Self.now)
        let info = try #require(evidence.renewalInfos.first)
        #expect(info.offerType == .promotional && info.offerIdentifier == "wb1" && info.offerDiscountType == .payUpFront)
        #expect(info.offerPeriod == "P3M" && info.renewalDate == renewalDate)
        let decision = EligibilityEvaluator().evaluate(
            Fixture.offer(.retention, rules: OfferRules(maxRedemptions: 1)), evidence: evidence, ledger: [], now: Self.now, counting: .applesRecord)
        #expect(decision.reasons == [.maxRedemptions])
    }
}

/// The chain validation cache must save work without weakening any check.
@Suite("Apple chain validation cache")
struct AppleChainValidationCacheTests {
    static let bundleID = AppleSignedDataVerifierTests.bundleID

    @Test("A chain is validated once; later items signed with it verify from the cache, and each signature is still checked")
    func validatedOnce() async throws {
        let chain = try TestAppleChain()
        let cache = AppleChainValidationCache()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, chainCache: cache)
        let jws = try chain.signJWS(AppleSignedDataVerifierTests.transactionPayload())
        for _ in 0..<3 {
            guard case .success = await verifier.verifyTransaction(jws, now: Fixture.now) else {
                Issue.record("a valid transaction was refused")
                return
            }
        }
        #expect(cache.count == 1)
        // Same (cached) chain, a tampered payload: the signature check still refuses it.
        let parts = jws.split(separator: ".")
        let forged = parts[0] + "." + TestAppleChain.base64URL(Data(#"{"bundleId":"com.example.app"}"#.utf8)) + "." + parts[2]
        guard case .failure(let failure) = await verifier.verifyTransaction(String(forged), now: Fixture.now) else {
            Issue.record("a tampered payload verified")
            return
        }
        #expect(failure.code == .invalidSignature)
    }

    @Test("A cached chain does not cover a signing time outside its certificates' validity")
    func timeStillChecked() async throws {
        let leafNotAfter = Date(timeIntervalSince1970: 1_700_000_000)
        let chain = try TestAppleChain(leafNotAfter: leafNotAfter)
        let cache = AppleChainValidationCache()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, chainCache: cache)
        let inside = try chain.signJWS(AppleSignedDataVerifierTests.transactionPayload(signedDate: leafNotAfter.addingTimeInterval(-86_400)))
        guard case .success = await verifier.verifyTransaction(inside, now: Fixture.now) else {
            Issue.record("signed while the leaf was valid, refused")
            return
        }
        #expect(cache.count == 1)
        let after = try chain.signJWS(AppleSignedDataVerifierTests.transactionPayload(signedDate: leafNotAfter.addingTimeInterval(86_400)))
        guard case .failure(let failure) = await verifier.verifyTransaction(after, now: Fixture.now) else {
            Issue.record("signed after the leaf expired, accepted from the cache")
            return
        }
        #expect(failure.code == .certificateExpired)
    }

    @Test("A chain that failed is not remembered, and a cache never trusts a chain for other roots")
    func failuresAndOtherRoots() async throws {
        let trusted = try TestAppleChain()
        let stranger = try TestAppleChain()
        let cache = AppleChainValidationCache()
        let jws = try stranger.signJWS(AppleSignedDataVerifierTests.transactionPayload())
        let strict = AppleSignedDataVerifier(trustedRoots: [trusted.root], bundleID: Self.bundleID, environment: .production, chainCache: cache)
        guard case .failure = await strict.verifyTransaction(jws, now: Fixture.now) else {
            Issue.record("an untrusted chain verified")
            return
        }
        #expect(cache.count == 0)
        // Another verifier that trusts the stranger's root validates (and caches) it…
        let lenient = AppleSignedDataVerifier(trustedRoots: [stranger.root], bundleID: Self.bundleID, environment: .production, chainCache: cache)
        guard case .success = await lenient.verifyTransaction(jws, now: Fixture.now) else {
            Issue.record("refused under its own root")
            return
        }
        // …which does not make it trusted under the first verifier's roots.
        guard case .failure(let failure) = await strict.verifyTransaction(jws, now: Fixture.now) else {
            Issue.record("a chain cached for other roots was trusted")
            return
        }
        #expect(failure.code == .untrustedChain)
    }

    @Test("An operator-added root with a validity gap: a chain refused for an item signed before the root's validity is not remembered, so the same chain verifies an item signed inside it")
    func failureDuringRootValidityGapIsNotRemembered() async throws {
        let chain = try TestAppleChain()
        // The operator's copy of the root: the same key and name, valid only from 2030 (the
        // chain's own certificates are valid 2020-2040, so only the trusted root has the gap).
        let rootValidFrom = Date(timeIntervalSince1970: 1_893_456_000)
        let operatorRoot = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(chain.rootKey.publicKey),
            notValidBefore: rootValidFrom, notValidAfter: TestAppleChain.defaultNotAfter, issuer: chain.root.subject, subject: chain.root.subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                SubjectKeyIdentifier(hash: Certificate.PublicKey(chain.rootKey.publicKey))
            },
            issuerPrivateKey: Certificate.PrivateKey(chain.rootKey))
        let cache = AppleChainValidationCache()
        let verifier = AppleSignedDataVerifier(trustedRoots: [operatorRoot], bundleID: Self.bundleID, environment: .production, chainCache: cache)
        let inGap = try chain.signJWS(AppleSignedDataVerifierTests.transactionPayload(signedDate: rootValidFrom.addingTimeInterval(-86_400)))
        guard case .failure = await verifier.verifyTransaction(inGap, now: rootValidFrom.addingTimeInterval(86_400 * 2)) else {
            Issue.record("a chain verified under a root that was not valid at its signing time")
            return
        }
        #expect(cache.failureCount == 0, "a failure that depends on the signing time was remembered")
        let inside = try chain.signJWS(AppleSignedDataVerifierTests.transactionPayload(signedDate: rootValidFrom.addingTimeInterval(86_400)))
        guard case .success = await verifier.verifyTransaction(inside, now: rootValidFrom.addingTimeInterval(86_400 * 2)) else {
            Issue.record("the same chain, signed inside the root's validity, was refused")
            return
        }
        #expect(cache.count == 1)
    }
}
