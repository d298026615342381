@testable import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Logging
import OfferSignerEligibility
import OfferSignerEvidence
import Testing

/// Apple lookups verify each signed item once (``AppleVerifiedItemCache``): a history asked about
/// again verifies no signature, and the cache never serves an item outside the scope (bundle,
/// environments, roots) or the exact text it was verified for.
extension AppStoreServerAPIClientTests {
    @Test("a 20-transaction history asked again after its HistoryCache entry is gone verifies no signature and decodes to the same items")
    func aHistoryAskedAgainVerifiesNoSignature() async throws {
        let fake = fake(pageSize: 20)
        let customer = subscriber(months: 20)
        fake.add(try customer.customer(chain, now: now))
        let verifiedItems = AppleVerifiedItemCache()
        let client = try client(verifiedItems: verifiedItems)
        try await fake.run { port in
            try await withClient(client) {
                guard case .history(let first) = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                else {
                    Issue.record("expected history")
                    return
                }
                #expect(first.transactions.count == 20)
                let afterFirst = verifiedItems.statistics
                // 20 transactions and the renewal info; the status's last transaction is the same text as
                // the 20th (verified in full twice only when both endpoints' answers are checked at once).
                #expect(afterFirst.stored + afterFirst.hits == 22 && afterFirst.stored >= 21, "\(afterFirst)")
                #expect(afterFirst.notCacheable == 0)

                // The whole-history cache bypassed: Apple is asked again, its items are not verified again.
                client.invalidate(originalTransactionID: customer.originalTransactionID)
                fake.clearRequests()
                guard case .history(let second) = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                else {
                    Issue.record("expected history")
                    return
                }
                #expect(!fake.requests.isEmpty, "Apple was asked again")
                let afterSecond = verifiedItems.statistics
                #expect(afterSecond.stored == afterFirst.stored && afterSecond.notCacheable == afterFirst.notCacheable, "no item verified again")
                #expect(afterSecond.hits - afterFirst.hits == 22, "20 history transactions, the status's transaction and its renewal info")
                #expect(second == first)
            }
        }
    }

    @Test("a JWS verified for one app, environment or set of roots is verified afresh (and refused) for another")
    func theCacheIsScopedToWhatVerificationDependedOn() async throws {
        let cache = AppleVerifiedItemCache()
        let jws = try customer20().signedTransactions[0]
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, appAppleID: 1, verifiedItems: cache)
        guard case .success(let verified) = await verifier.verifyTransaction(jws, now: now) else {
            Issue.record("the JWS should verify")
            return
        }
        guard case .success(let again) = await verifier.verifyTransaction(jws, now: now) else {
            Issue.record("the JWS should verify again")
            return
        }
        #expect(again == verified)
        #expect(cache.statistics.hits == 1 && cache.statistics.stored == 1)

        let otherBundle = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: "com.example.other", environment: .production, verifiedItems: cache)
        #expect(failureCode(await otherBundle.verifyTransaction(jws, now: now)) == .bundleIDMismatch)
        let otherEnvironment = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .sandbox, appAppleID: 1, verifiedItems: cache)
        #expect(failureCode(await otherEnvironment.verifyTransaction(jws, now: now)) == .environmentMismatch)
        let otherRoots = AppleSignedDataVerifier(trustedRoots: [try TestAppleChain().root], bundleID: Self.bundleID, environment: .production, appAppleID: 1, verifiedItems: cache)
        #expect(failureCode(await otherRoots.verifyTransaction(jws, now: now)) == .untrustedChain)
        // Another app Apple ID: verified in full again (it verifies: transactions do not name it).
        let otherAppleID = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, appAppleID: 2, verifiedItems: cache)
        #expect(failureCode(await otherAppleID.verifyTransaction(jws, now: now)) == nil)
        // A renewal info is not served what a transaction verified to (verified in full as one).
        _ = await verifier.verifyRenewalInfo(jws, now: now)
        #expect(cache.statistics.hits == 1, "none of these was served from the cache")
        #expect(cache.statistics.stored >= 2)
    }

    @Test("a JWS with one byte changed is not served from the cache")
    func aTamperedJWSIsVerifiedAndRefused() async throws {
        let cache = AppleVerifiedItemCache()
        let jws = try customer20().signedTransactions[0]
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, verifiedItems: cache)
        #expect(failureCode(await verifier.verifyTransaction(jws, now: now)) == nil)
        // One base64url character of the payload changed for another (still base64url).
        var bytes = Array(jws.utf8)
        let payloadStart = try #require(bytes.firstIndex(of: UInt8(ascii: "."))) + 1
        let index = payloadStart + 40
        bytes[index] = bytes[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let tampered = String(decoding: bytes, as: UTF8.self)
        #expect(tampered != jws)
        let code = failureCode(await verifier.verifyTransaction(tampered, now: now))
        #expect(code == .invalidSignature || code == .malformedPayload || code == .badBase64, "\(String(describing: code))")
        #expect(cache.statistics.hits == 0)
        #expect(cache.statistics.stored == 1, "the failure is not remembered")
    }

    @Test("an item without a signing time (validated at now) is not kept")
    func itemsValidatedAtNowAreNotKept() async throws {
        let cache = AppleVerifiedItemCache()
        let jws = try chain.signJWS([
            "transactionId": "1", "originalTransactionId": "1", "productId": "com.example.app.coins", "purchaseDate": TestAppleChain.milliseconds(now),
            "type": "Consumable", "environment": "Production", "bundleId": Self.bundleID, "inAppOwnershipType": "PURCHASED",
        ])
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, verifiedItems: cache)
        #expect(failureCode(await verifier.verifyTransaction(jws, now: now)) == nil)
        #expect(failureCode(await verifier.verifyTransaction(jws, now: now)) == nil)
        #expect(cache.statistics == AppleVerifiedItemCache.Statistics(hits: 0, stored: 0, notCacheable: 2))
    }

    @Test("the cache keeps at most its capacity")
    func theCacheIsBounded() async throws {
        let cache = AppleVerifiedItemCache(capacity: 4)
        let verifier = AppleSignedDataVerifier(trustedRoots: [chain.root], bundleID: Self.bundleID, environment: .production, verifiedItems: cache)
        let items = try customer20().signedTransactions
        for jws in items.prefix(10) { #expect(failureCode(await verifier.verifyTransaction(jws, now: now)) == nil) }
        // Only the latest entries remain: the first item is verified in full again.
        let stored = cache.statistics.stored
        #expect(failureCode(await verifier.verifyTransaction(items[0], now: now)) == nil)
        #expect(cache.statistics.stored == stored + 1)
        #expect(failureCode(await verifier.verifyTransaction(items[0], now: now)) == nil)
        #expect(cache.statistics.hits == 1)
    }

    /// A measurement, not a test (run with APPLE_LOOKUP_CPU=1): the process CPU of a repeated lookup
    /// of a 20-transaction history (client and the fake API on loopback, in this process), with the
    /// whole-history cache bypassed, without and with the verified-item cache; both with the chain
    /// cache the server uses.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["APPLE_LOOKUP_CPU"] != nil))
    func measuresTheCPUOfARepeatedLookup() async throws {
        let fake = fake(pageSize: 20)
        let customer = subscriber(months: 20)
        fake.add(try customer.customer(chain, now: now))
        for verifiedItems in [nil, AppleVerifiedItemCache()] {
            var logger = Logger(label: "measure")
            logger.logLevel = .critical
            var configuration = AppStoreServerAPIConfiguration()
            configuration.timeBudget = Self.generousBudget
            let client = try AppStoreServerAPIClient(
                configuration: configuration, trustedRoots: [chain.root], metrics: .none, logger: logger, chainCache: AppleChainValidationCache(),
                verifiedItems: verifiedItems)
            let rounds = 50
            let perLookup = try await fake.run { port in
                try await withClient(client) {
                    _ = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                    let start = Self.processCPUMicroseconds()
                    for _ in 0..<rounds {
                        client.invalidate(originalTransactionID: customer.originalTransactionID)
                        guard case .history = await client.history(transactionID: customer.originalTransactionID, app: app(port: port), credentials: credentials, now: now)
                        else { throw CancellationError() }
                    }
                    return (Self.processCPUMicroseconds() - start) / Double(rounds)
                }
            }
            print("repeated 20-transaction lookup, verified-item cache \(verifiedItems == nil ? "off" : "on"): \(Int(perLookup)) µs of process CPU (client and fake API)")
        }
    }

    private static func processCPUMicroseconds() -> Double {
        var usage = rusage()
        getrusage(RUSAGE_SELF.rawValue, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e6 + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec)
    }

    private func customer20() throws -> FakeAppStoreServerAPI.Customer {
        try subscriber(months: 20).customer(chain, now: now)
    }

    private func failureCode<T>(_ result: Result<T, AppleSignedDataVerifier.VerificationFailure>) -> EvidenceFailure.Code? {
        if case .failure(let failure) = result { return failure.code }
        return nil
    }
}
