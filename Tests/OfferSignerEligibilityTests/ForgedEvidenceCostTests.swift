import AppleTestChain
import Crypto
import Foundation
import OfferSignerEligibility
import OfferSignerEvidence
import SwiftASN1
import Testing
import X509

#if canImport(Glibc)
import Glibc
#endif

/// The attacker's evidence: a thousand signed "transactions" whose chains reuse the real-looking
/// intermediate and root, each leaf made and signed by the attacker. Each one that reached chain
/// validation would cost a certificate-signature verification; the verifier must refuse the lot
/// for almost nothing.
@Suite("Forged evidence is cheap to refuse", .serialized)
struct ForgedEvidenceCostTests {
    static let bundleID = "com.example.app"

    /// A leaf named like Apple's, claiming the chain's intermediate as issuer, signed by the attacker.
    static func forgedLeaf(issuer: Certificate) throws -> (P256.Signing.PrivateKey, Certificate) {
        let attacker = P256.Signing.PrivateKey()
        let leafKey = P256.Signing.PrivateKey()
        let subject = try DistinguishedName {
            CommonName("Prod ECC Mac App Store and iTunes Store Receipt Signing")
            OrganizationName("Offer Signer Tests")
        }
        let leaf = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(leafKey.publicKey),
            notValidBefore: TestAppleChain.defaultNotBefore, notValidAfter: TestAppleChain.defaultNotAfter,
            issuer: issuer.subject, subject: subject, signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                Critical(KeyUsage(digitalSignature: true))
                Certificate.Extension(oid: TestAppleChain.leafMarkerOID, critical: false, value: [0x05, 0x00])
            },
            issuerPrivateKey: Certificate.PrivateKey(attacker))
        return (leafKey, leaf)
    }

    /// `count` forged transactions over `leaves` distinct forged chains, every payload different,
    /// plus `duplicates` exact repeats of the first items.
    static func forgedItems(chain: TestAppleChain, count: Int, leaves: Int, duplicates: Int = 0) throws -> [String] {
        let intermediate = try TestAppleChain.base64DER(chain.intermediate)
        let root = try TestAppleChain.base64DER(chain.root)
        let forged = try (0..<leaves).map { _ in try forgedLeaf(issuer: chain.intermediate) }
        var items: [String] = []
        for index in 0..<count {
            let (key, leaf) = forged[index % leaves]
            let header = try JSONSerialization.data(
                withJSONObject: ["alg": "ES256", "x5c": [try TestAppleChain.base64DER(leaf), intermediate, root]], options: [.sortedKeys])
            let payload = try JSONSerialization.data(
                withJSONObject: [
                    "transactionId": "\(900_000_000 + index)", "originalTransactionId": "900000000", "bundleId": bundleID,
                    "productId": "pro.monthly", "purchaseDate": 1_700_000_000_000, "signedDate": 1_700_000_000_000,
                    "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "environment": "Production",
                ] as [String: Any], options: [.sortedKeys])
            let input = TestAppleChain.base64URL(header) + "." + TestAppleChain.base64URL(payload)
            items.append(input + "." + TestAppleChain.base64URL(try key.signature(for: Data(input.utf8)).rawRepresentation))
        }
        return items + items.prefix(duplicates)
    }

    /// The bound: refusing the 1,000 items costs less CPU than this many P-256 signature checks.
    static let boundInSignatureChecks = 450.0
    static let referenceVerifications = 100
    /// The bound as a ratio of the items' CPU to that of the `referenceVerifications` checks.
    static let boundRatio = boundInSignatureChecks / Double(referenceVerifications)
    static let referencePrivateKey = P256.Signing.PrivateKey()
    static let referenceKey = referencePrivateKey.publicKey
    static let referenceMessage = Data("reference".utf8)
    static let referenceSignature = try! referencePrivateKey.signature(for: referenceMessage)

    /// CPU time of the whole process (every thread), as the kernel counts it.
    /// (C's `clock()`, in microseconds: POSIX fixes CLOCKS_PER_SEC at 1,000,000. No `timespec`:
    /// in a clean build its members resolve to CoreFoundation's copy of the struct, which this
    /// module does not import.)
    static func processCPUTime() -> Duration {
        .microseconds(Int64(clock()))
    }

    @Test("1,000 forged evidence items over 50 forged chains (plus repeats) cost less CPU than 450 P-256 signature checks, and none verifies")
    func thousandForgedItems() async throws {
        let chain = try TestAppleChain()
        let items = try Self.forgedItems(chain: chain, count: 1000, leaves: 50, duplicates: 20)
        // The cost is measured against the machine: each run first times 100 P-256 signature
        // checks (the operation a forged item that reached chain validation would cost, several
        // times over), then the 1,000 items, both as process CPU. A slower machine, or other
        // suites' threads (they share the process, and in the suite's busiest minute tripled
        // what was counted), inflate both alike; the bound is on their ratio. On the development
        // VM, quiet: 28 ms for the items, 10.3 ms for the 100 checks (2.7); a verifier checking
        // every item's signature would add 1,000 checks, a ratio above 12. The least ratio of up
        // to thirty cold runs (a fresh cache each), stopping at the first under the bound; after
        // the first three, a second apart, so the runs reach a quieter moment of the suite.
        var cheapest = Double.infinity
        var cheapestCost = Duration.zero
        for attempt in 0..<30 where cheapest >= Self.boundRatio {
            if attempt >= 3 { try await Task.sleep(for: .seconds(1)) }
            let referenceStart = Self.processCPUTime()
            for _ in 0..<Self.referenceVerifications { _ = Self.referenceKey.isValidSignature(Self.referenceSignature, for: Self.referenceMessage) }
            let reference = Self.processCPUTime() - referenceStart
            let cache = AppleChainValidationCache()
            let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environments: [.production], chainCache: cache)
            let start = Self.processCPUTime()
            let evidence = await verifier.verify(signedTransactions: items, signedRenewalInfos: [], now: Date())
            let cost = Self.processCPUTime() - start
            if reference > .zero, cost / reference < cheapest { (cheapest, cheapestCost) = (cost / reference, cost) }
            #expect(evidence.transactions.isEmpty)
            #expect(evidence.failures.count == 1000, "the 20 repeats are dropped, not verified again")
            #expect(Set(evidence.failures.map(\.index)) == Set(0..<1000))
            let codes = Dictionary(grouping: evidence.failures, by: \.code).mapValues(\.count)
            // Four chains (the cap) are validated, once each; the items of the others are refused unverified.
            #expect(codes[.untrustedChain] == 4 * 20, "\(codes)")
            #expect(codes[.tooManyItems] == 1000 - 4 * 20, "\(codes)")
            #expect(cache.failureCount == 4, "each forged chain validated once, its failure remembered")
        }
        #expect(
            cheapest < Self.boundRatio,
            "refusing 1,000 forged items cost as much CPU as \(Int(cheapest * Double(Self.referenceVerifications))) P-256 signature checks (\(cheapestCost))")
    }

    @Test("A forged chain sent again, in another request, is refused from the failure cache; a genuine item still verifies")
    func failedChainCached() async throws {
        let chain = try TestAppleChain()
        let cache = AppleChainValidationCache()
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environments: [.production], chainCache: cache)
        let forged = try Self.forgedItems(chain: chain, count: 3, leaves: 1)
        let first = await verifier.verify(signedTransactions: forged, signedRenewalInfos: [], now: Date())
        #expect(first.failures.map(\.code) == [.untrustedChain, .untrustedChain, .untrustedChain])
        #expect(cache.failureCount == 1)
        let again = await verifier.verify(signedTransactions: forged, signedRenewalInfos: [], now: Date())
        #expect(again.failures.map(\.code) == [.untrustedChain, .untrustedChain, .untrustedChain])
        #expect(cache.failureCount == 1)
        // The genuine chain is not refused for sharing the intermediate with the forgeries.
        let genuine = try chain.signJWS([
            "transactionId": "1", "originalTransactionId": "1", "bundleId": Self.bundleID, "productId": "pro.monthly",
            "purchaseDate": 1_700_000_000_000, "signedDate": 1_700_000_000_000, "type": "Auto-Renewable Subscription",
            "inAppOwnershipType": "PURCHASED", "environment": "Production",
        ])
        let mixed = await verifier.verify(signedTransactions: [genuine] + forged, signedRenewalInfos: [], now: Date())
        #expect(mixed.transactions.map(\.transactionID) == ["1"])
        #expect(mixed.failures.map(\.index) == [1, 2, 3])
        // A signature that is not 64 bytes is refused before any chain work.
        let parts = forged[0].split(separator: ".")
        let shortSignature = parts[0] + "." + parts[1] + "." + TestAppleChain.base64URL(Data(repeating: 1, count: 63))
        let fresh = AppleChainValidationCache()
        let cheap = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environments: [.production], chainCache: fresh)
        let refused = await cheap.verify(signedTransactions: [String(shortSignature)], signedRenewalInfos: [], now: Date())
        #expect(refused.failures.map(\.code) == [.invalidSignature])
        #expect(fresh.failureCount == 0 && fresh.count == 0, "no chain was looked at")
    }
}
