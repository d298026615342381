import Crypto
import Foundation
import OfferSignerEligibility
import SwiftASN1
@_spi(FixedExpiryValidationTime) import X509

/// Verifies App Store signed data (StoreKit `jwsRepresentation` of transactions and renewal infos) the
/// way Apple's App Store Server Library (`SignedDataVerifier`, offline mode) does, and turns it into
/// the verified records of OfferSignerEligibility.
///
/// For every JWS:
/// 1. compact serialization of at most 64 KiB, three base64url parts;
/// 2. protected header `alg` is `ES256` and `x5c` holds exactly three base64 DER certificates
///    (leaf, intermediate, root);
/// 3. the signature is 64 bytes (raw r‖s), and the chain has not failed before (see
///    ``AppleChainValidationCache``): cheap checks before any chain validation;
/// 4. the leaf chains through the intermediate to one of `trustedRoots` (swift-certificates `Verifier`
///    with `RFC5280Policy`), the leaf carries OID 1.2.840.113635.100.6.11.1 and the intermediate
///    1.2.840.113635.100.6.2.1. Certificate validity is evaluated at the payload's `signedDate`
///    (or `receiptCreationDate`) when present, else at `now` — as Apple's library does when online
///    checks are off. No OCSP (offline). The `x5c` root entry is not trusted, only parsed: trust comes
///    from `trustedRoots` alone;
/// 5. the ES256 signature (raw r‖s) over `header.payload` verifies with the leaf's P-256 key;
/// 6. transactions: `bundleId` equals `bundleID`; all items: `environment` is one of
///    `acceptedEnvironments` (Production, Sandbox or both; never Xcode or LocalTesting data).
///
/// There is deliberately no way to skip any step. Failures never throw: each rejected JWS becomes an
/// `EvidenceFailure` in the result, which makes offers with rules ineligible (`evidence_unverified`).
public struct AppleSignedDataVerifier: Sendable {
    /// Largest accepted JWS, in bytes (Apple's are about 4–6 KiB).
    public static let maximumJWSLength = 64 * 1024

    /// The roots a chain must end at.
    public let trustedRoots: [Certificate]
    /// The app's bundle ID; transactions of other apps are rejected.
    public let bundleID: String
    /// The environments an item may come from (Production, Sandbox or both).
    public let acceptedEnvironments: [AppleEnvironment]
    /// The one environment required, or `nil` when both Production and Sandbox are accepted.
    @available(*, deprecated, renamed: "acceptedEnvironments")
    public var environment: AppleEnvironment? { acceptedEnvironments.count == 1 ? acceptedEnvironments[0] : nil }
    /// Chains validated before (shared by the verifiers of one process), or nil to validate every chain.
    public let chainCache: AppleChainValidationCache?
    /// Items verified before (see ``AppleVerifiedItemCache``), or nil to verify every item.
    public let verifiedItems: AppleVerifiedItemCache?
    /// The app's Apple ID, as given to Apple's `SignedDataVerifier`; transactions and renewal
    /// infos do not carry it, so it only keeps the verified items of one app apart from another's.
    public let appAppleID: Int64?
    private let rootsDigest: [UInt8]
    /// What verification depends on besides the JWS (bundle ID, environments, roots, app Apple ID):
    /// the scope of ``verifiedItems``' keys.
    private let verifiedItemsScope: [UInt8]

    /// - Parameters:
    ///   - trustedRoots: trusted roots; Apple Root CA - G3 by default (tests pass their own).
    ///   - bundleID: the expected `bundleId` of transactions.
    ///   - environment: the expected `environment`, or `nil` to accept Production and Sandbox.
    ///   - chainCache: where validated chains are remembered (see ``AppleChainValidationCache``).
    ///   - verifiedItems: where verified items are remembered (see ``AppleVerifiedItemCache``).
    public init(
        trustedRoots: [Certificate] = [.appleRootCAG3], bundleID: String, environment: AppleEnvironment?, appAppleID: Int64? = nil,
        chainCache: AppleChainValidationCache? = nil, verifiedItems: AppleVerifiedItemCache? = nil
    ) {
        self.init(
            trustedRoots: trustedRoots, bundleID: bundleID, environments: environment.map { [$0] } ?? [.production, .sandbox], appAppleID: appAppleID,
            chainCache: chainCache, verifiedItems: verifiedItems)
    }

    /// - Parameters:
    ///   - trustedRoots: trusted roots; Apple Root CA - G3 by default (tests pass their own).
    ///   - bundleID: the expected `bundleId` of transactions.
    ///   - environments: the environments an item may come from, for example an app's
    ///     `apps.<bundleID>.environments`; Xcode and LocalTesting data are refused whatever it holds.
    ///   - appAppleID: the app's Apple ID, when known (it only scopes `verifiedItems`).
    ///   - chainCache: where validated chains are remembered (see ``AppleChainValidationCache``).
    ///   - verifiedItems: where verified items are remembered (see ``AppleVerifiedItemCache``).
    public init(
        trustedRoots: [Certificate] = [.appleRootCAG3], bundleID: String, environments: [AppleEnvironment], appAppleID: Int64? = nil,
        chainCache: AppleChainValidationCache? = nil, verifiedItems: AppleVerifiedItemCache? = nil
    ) {
        self.trustedRoots = trustedRoots
        self.bundleID = bundleID
        self.acceptedEnvironments = environments.filter { $0 == .production || $0 == .sandbox }
        self.appAppleID = appAppleID
        self.chainCache = chainCache
        self.verifiedItems = verifiedItems
        var hasher = SHA256()
        if chainCache != nil || verifiedItems != nil {
            for root in trustedRoots {
                var serializer = DER.Serializer()
                if (try? serializer.serialize(root)) != nil { hasher.update(data: serializer.serializedBytes) }
            }
        }
        self.rootsDigest = Array(hasher.finalize())
        if verifiedItems != nil {
            // Length-prefixed fields: no two scopes hash the same bytes.
            var scope = SHA256()
            scope.update(data: rootsDigest)
            for field in [bundleID] + acceptedEnvironments.map(\.rawValue) + [appAppleID.map(String.init) ?? ""] {
                let bytes = Array(field.utf8)
                withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { scope.update(bufferPointer: $0) }
                scope.update(data: bytes)
            }
            self.verifiedItemsScope = Array(scope.finalize())
        } else {
            self.verifiedItemsScope = []
        }
    }

    /// Most distinct certificate chains (distinct protected headers: `alg` and `x5c`) one call to
    /// ``verify(signedTransactions:signedRenewalInfos:now:)`` validates. Apple signs every item
    /// of a customer with the same chain (two around a certificate renewal); items of further
    /// chains are refused (`too_many_items`) before any work.
    public static let maximumDistinctChains = 4

    /// Verifies all submitted items (`{"signedTransactions": [...], "signedRenewalInfos": [...]}`).
    /// Never throws: rejected items are reported in `EligibilityEvidence.failures`.
    ///
    /// Work is bounded before any validation: a JWS sent twice in one list is verified once and
    /// counted once (the repeat is dropped: no record, no failure); items whose protected header
    /// is not among the first ``maximumDistinctChains`` distinct ones are refused unverified; an
    /// item whose header (its algorithm and chain) failed for an earlier item fails the same way,
    /// without being looked at again.
    public func verify(signedTransactions: [String], signedRenewalInfos: [String], now: Date) async -> EligibilityEvidence {
        var evidence = EligibilityEvidence()
        var headers: [Substring: VerificationFailure?] = [:]
        func admitted(_ jws: String) -> VerificationFailure? {
            guard let header = Base64URL.headerPart(jws) else { return nil }  // malformed: refused by the cheap checks
            if let known = headers[header] { return known }
            guard headers.count < Self.maximumDistinctChains else {
                return VerificationFailure(.tooManyItems, "more than \(Self.maximumDistinctChains) distinct certificate chains in one request; not verified")
            }
            headers[header] = .some(nil)
            return nil
        }
        func remember(_ failure: VerificationFailure, of jws: String) {
            guard Self.headerFailureCodes.contains(failure.code), let header = Base64URL.headerPart(jws) else { return }
            headers[header] = .some(failure)
        }
        var seen = Set<String>()
        for (index, jws) in signedTransactions.enumerated() where seen.insert(jws).inserted {
            let result = if let refused = admitted(jws) { Result<VerifiedTransaction, VerificationFailure>.failure(refused) } else { await verifyTransaction(jws, now: now) }
            switch result {
            case .success(let transaction): evidence.transactions.append(transaction)
            case .failure(let failure):
                remember(failure, of: jws)
                evidence.failures.append(
                    EvidenceFailure(source: .signedTransaction, index: index, code: failure.code, message: failure.message))
            }
        }
        seen.removeAll()
        for (index, jws) in signedRenewalInfos.enumerated() where seen.insert(jws).inserted {
            let result = if let refused = admitted(jws) { Result<VerifiedRenewalInfo, VerificationFailure>.failure(refused) } else { await verifyRenewalInfo(jws, now: now) }
            switch result {
            case .success(let info): evidence.renewalInfos.append(info)
            case .failure(let failure):
                remember(failure, of: jws)
                evidence.failures.append(
                    EvidenceFailure(source: .signedRenewalInfo, index: index, code: failure.code, message: failure.message))
            }
        }
        return evidence
    }

    /// Failures decided by the protected header alone (its algorithm and certificate chain), whatever
    /// the payload and signing time.
    static let headerFailureCodes: Set<EvidenceFailure.Code> = [
        .malformedHeader, .unsupportedAlgorithm, .missingCertificateChain, .invalidChainLength, .malformedCertificate, .untrustedChain,
        .missingAppleMarkerOID, .unsupportedKey,
    ]

    /// Verifies one signed transaction.
    /// With ``verifiedItems``, a JWS verified before in this verifier's scope is served from it.
    public func verifyTransaction(_ jws: String, now: Date) async -> Result<VerifiedTransaction, VerificationFailure> {
        let cacheKey = verifiedItems.map { _ in AppleVerifiedItemCache.key(jws: jws, kind: 1, scope: verifiedItemsScope) }
        if let verifiedItems, let cacheKey, case .transaction(let known)? = verifiedItems.item(cacheKey) {
            return .success(known)
        }
        let decoded: TransactionPayload
        let atSigningTime: Bool
        switch await verifiedPayload(jws, as: TransactionPayload.self, named: "transaction", now: now) {
        case .success(let (payload, validatedAtSigningTime)): (decoded, atSigningTime) = (payload, validatedAtSigningTime)
        case .failure(let failure): return .failure(failure)
        }
        guard decoded.bundleId == bundleID else {
            return .failure(.init(.bundleIDMismatch, "bundleId '\(decoded.bundleId)' is not '\(bundleID)'"))
        }
        switch checkEnvironment(decoded.environment) {
        case .success(let environment):
            let transaction = decoded.verified(environment: environment)
            remember(.transaction(transaction), cacheKey, atSigningTime: atSigningTime)
            return .success(transaction)
        case .failure(let failure): return .failure(failure)
        }
    }

    /// Verifies one signed renewal info (it has no bundle ID to check, as in Apple's library).
    public func verifyRenewalInfo(_ jws: String, now: Date) async -> Result<VerifiedRenewalInfo, VerificationFailure> {
        let cacheKey = verifiedItems.map { _ in AppleVerifiedItemCache.key(jws: jws, kind: 2, scope: verifiedItemsScope) }
        if let verifiedItems, let cacheKey, case .renewalInfo(let known)? = verifiedItems.item(cacheKey) {
            return .success(known)
        }
        let decoded: RenewalInfoPayload
        let atSigningTime: Bool
        switch await verifiedPayload(jws, as: RenewalInfoPayload.self, named: "renewal info", now: now) {
        case .success(let (payload, validatedAtSigningTime)): (decoded, atSigningTime) = (payload, validatedAtSigningTime)
        case .failure(let failure): return .failure(failure)
        }
        switch checkEnvironment(decoded.environment) {
        case .success(let environment):
            let info = decoded.verified(environment: environment)
            remember(.renewalInfo(info), cacheKey, atSigningTime: atSigningTime)
            return .success(info)
        case .failure(let failure): return .failure(failure)
        }
    }

    /// Keeps a verified item, unless its chain was validated at `now` (no signing time stated).
    private func remember(_ item: AppleVerifiedItemCache.Item, _ key: SHA256Digest?, atSigningTime: Bool) {
        guard let verifiedItems, let key else { return }
        if atSigningTime { verifiedItems.remember(item, key) } else { verifiedItems.noteNotCacheable() }
    }

    /// Why one JWS was rejected.
    public struct VerificationFailure: Error, Sendable, Hashable {
        public var code: EvidenceFailure.Code
        public var message: String
        public init(_ code: EvidenceFailure.Code, _ message: String) {
            self.code = code
            self.message = message
        }
    }

    // MARK: - Steps

    func checkEnvironmentName(_ raw: String) -> Result<AppleEnvironment, VerificationFailure> {
        checkEnvironment(raw)
    }

    /// Checks structure, header, chain and signature of any Apple JWS; returns the signed payload bytes.
    func verifySignedPayload(_ jws: String, now: Date) async -> Result<Data, VerificationFailure> {
        await verifySignedData(jws, decoding: SigningDateProbe.self, now: now).map(\.payload)
    }

    private func checkEnvironment(_ raw: String) -> Result<AppleEnvironment, VerificationFailure> {
        guard let value = AppleEnvironment(rawValue: raw) else {
            return .failure(.init(.environmentMismatch, "unknown environment '\(raw)'"))
        }
        guard acceptedEnvironments.contains(value) else {
            let accepted = acceptedEnvironments.count == 1
                ? "'\(acceptedEnvironments[0].rawValue)'" : acceptedEnvironments.map(\.rawValue).joined(separator: " or ")
            return .failure(.init(.environmentMismatch, "environment '\(raw)' is not \(acceptedEnvironments.isEmpty ? "accepted" : accepted)"))
        }
        return .success(value)
    }

    /// A verified JWS's payload decoded as `Payload`; a payload that is not one is
    /// `malformedPayload`, naming what it should have been (`name`).
    /// With it: whether the chain was validated at the payload's own signing time (not at `now`).
    private func verifiedPayload<Payload: SignedPayload>(
        _ jws: String, as type: Payload.Type, named name: String, now: Date
    ) async -> Result<(Payload, validatedAtSigningTime: Bool), VerificationFailure> {
        switch await verifySignedData(jws, decoding: type, now: now) {
        case .success(let verified):
            if let payload = verified.decoded { return .success((payload, verified.atSigningTime)) }
            // Decoded again only to say what is wrong with it.
            do {
                return .success((try JSONDecoder().decode(type, from: verified.payload), verified.atSigningTime))
            } catch {
                return .failure(.init(.malformedPayload, "\(name) payload: \(Self.describe(error))"))
            }
        case .failure(let failure):
            return .failure(failure)
        }
    }

    /// Checks structure, header, chain and signature; returns the signed payload bytes and, when
    /// they decode as `Payload`, the decoded value (decoded once: its signing time is the one the
    /// chain is checked at), and whether that time came from the payload (`atSigningTime`; false
    /// when the chain was checked at `now`).
    private func verifySignedData<Payload: SignedPayload>(
        _ jws: String, decoding: Payload.Type, now: Date
    ) async -> Result<(payload: Data, decoded: Payload?, atSigningTime: Bool), VerificationFailure> {
        guard jws.utf8.count <= Self.maximumJWSLength else {
            return .failure(.init(.malformedJWS, "JWS is larger than \(Self.maximumJWSLength) bytes"))
        }
        guard let parts = Base64URL.compactParts(jws), parts.allSatisfy({ !$0.isEmpty }) else {
            let count = jws.utf8.reduce(1) { $0 + ($1 == UInt8(ascii: ".") ? 1 : 0) }
            return .failure(.init(.malformedJWS, "expected three non-empty dot-separated parts, got \(count)"))
        }

        // Header (decoded once per distinct header text when a cache is shared).
        let headerText = String(parts[0])
        let header: AppleChainValidationCache.DecodedHeader
        let cachedHeader = chainCache?.header(headerText)
        let headerWasCached = cachedHeader != nil
        if let cachedHeader {
            header = cachedHeader
        } else {
            guard let headerData = Base64URL.decode(parts[0]) else {
                return .failure(.init(.badBase64, "header is not base64url"))
            }
            guard let decoded = try? JSONDecoder().decode(JWSHeader.self, from: headerData) else {
                return .failure(.init(.malformedHeader, "header is not a JSON object with string \"alg\" and \"x5c\" fields"))
            }
            header = AppleChainValidationCache.DecodedHeader(alg: decoded.alg, x5c: decoded.x5c)
        }
        guard header.alg == "ES256" else {
            return .failure(.init(.unsupportedAlgorithm, "alg is '\(header.alg ?? "(missing)")', expected ES256"))
        }
        guard let x5c = header.x5c, !x5c.isEmpty else {
            return .failure(.init(.missingCertificateChain, "header has no x5c certificate chain"))
        }
        guard x5c.count == 3 else {
            return .failure(.init(.invalidChainLength, "x5c has \(x5c.count) certificates, expected 3"))
        }

        // Signature shape: an ES256 signature is 64 bytes (r‖s), checked before any chain work.
        guard let signatureBytes = Base64URL.decode(parts[2]) else {
            return .failure(.init(.badBase64, "signature is not base64url"))
        }
        guard signatureBytes.count == 64, let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes) else {
            return .failure(.init(.invalidSignature, "signature is not a 64-byte ES256 (r||s) value"))
        }
        // A chain that failed before fails again, at no cost (forged chains cost P-384 work once).
        let cacheKey = chainCache.map { _ in AppleChainValidationCache.key(x5c: x5c, rootsDigest: rootsDigest) }
        if let chainCache, let cacheKey, let failure = chainCache.failure(cacheKey) {
            return .failure(failure)
        }

        // Payload.
        guard let payload = Base64URL.decode(parts[1]) else {
            return .failure(.init(.badBase64, "payload is not base64url"))
        }
        let typed = try? JSONDecoder().decode(Payload.self, from: payload)
        let signedMilliseconds: Double?
        if let stated = typed?.signedDate {
            signedMilliseconds = stated
        } else {
            guard let probe = try? JSONDecoder().decode(SigningDateProbe.self, from: payload) else {
                return .failure(.init(.malformedPayload, "payload is not a JSON object"))
            }
            signedMilliseconds = probe.signedDate ?? probe.receiptCreationDate
        }

        // A chain validated before (the same x5c text, the same trusted roots) is neither parsed
        // nor validated again; the signing time must still be inside its certificates' validity.
        let validationTime = signedMilliseconds.map(date) ?? now
        let key: P256.Signing.PublicKey
        if let chainCache, let cacheKey, let cachedKey = chainCache.leafKey(cacheKey, at: validationTime) {
            key = cachedKey
        } else {
            switch await validatedLeafKey(x5c, at: validationTime) {
            case .failure(let failure):
                // Remembered unless it depends on the signing time (which the payload chooses):
                // a certificate of the chain outside its validity, or a trusted root outside its
                // own at that time (an operator-added root with a validity gap: the same chain
                // signed inside the root's validity must still be validated).
                if let chainCache, let cacheKey, failure.code != .certificateExpired, failure.code != .certificateNotYetValid,
                    trustedRoots.allSatisfy({ $0.notValidBefore <= validationTime && validationTime <= $0.notValidAfter })
                {
                    chainCache.rememberFailure(cacheKey, failure)
                }
                return .failure(failure)
            case .success(let (leafKey, chain)):
                key = leafKey
                if let chainCache, let cacheKey { chainCache.remember(cacheKey, chain: chain, leafKey: leafKey) }
            }
        }

        // Signature.
        var signingInput = Data(parts[0].utf8)
        signingInput.append(UInt8(ascii: "."))
        signingInput.append(contentsOf: parts[1].utf8)
        guard key.isValidSignature(signature, for: signingInput) else {
            return .failure(.init(.invalidSignature, "ES256 signature does not match header and payload"))
        }
        // Only a header that verified is remembered: forged items cannot crowd Apple's out.
        if !headerWasCached { chainCache?.rememberHeader(headerText, header) }
        return .success((payload, typed, signedMilliseconds != nil))
    }

    /// Parses the three x5c certificates, validates the chain at `validationTime`, and returns the
    /// leaf's P-256 key with the validated chain.
    private func validatedLeafKey(_ x5c: [String], at validationTime: Date) async -> Result<(P256.Signing.PublicKey, [Certificate]), VerificationFailure> {
        var certificates: [Certificate] = []
        for (position, entry) in x5c.enumerated() {
            let name = Self.certificateNames[position]
            guard let der = Data(base64Encoded: entry) else {
                return .failure(.init(.badBase64, "x5c[\(position)] (\(name)) is not base64"))
            }
            do {
                certificates.append(try Certificate(derEncoded: Array(der)))
            } catch {
                return .failure(.init(.malformedCertificate, "x5c[\(position)] (\(name)) is not a DER X.509 certificate"))
            }
        }
        let leaf = certificates[0]
        let intermediate = certificates[1]
        // Validity dates first (no cryptography): a certificate outside its validity at the
        // signing time fails the chain whatever else it holds, so the chain's signatures are only
        // checked for a time inside every validity, and a chain that fails then fails at any time.
        if let failure = Self.validityFailure(leaf: leaf, intermediate: intermediate, at: validationTime) { return .failure(failure) }
        // Chain, at the signing time when the payload states it (as Apple's library does offline).
        let chain: [Certificate]
        switch await verifyChain(leaf: leaf, intermediate: intermediate, at: validationTime) {
        case .failure(let failure): return .failure(failure)
        case .success(let validated): chain = validated
        }
        guard let key = P256.Signing.PublicKey(leaf.publicKey) else {
            return .failure(.init(.unsupportedKey, "leaf public key is not P-256"))
        }
        return .success((key, chain))
    }

    private static let certificateNames = ["leaf", "intermediate", "root"]

    private static func validityFailure(leaf: Certificate, intermediate: Certificate, at time: Date) -> VerificationFailure? {
        for (certificate, name) in [(leaf, "leaf"), (intermediate, "intermediate")] {
            if time > certificate.notValidAfter {
                return .init(.certificateExpired, "\(name) certificate expired at \(ISO8601DateFormatter().string(from: certificate.notValidAfter)), checked at \(ISO8601DateFormatter().string(from: time))")
            }
            if time < certificate.notValidBefore {
                return .init(.certificateNotYetValid, "\(name) certificate is not valid before \(ISO8601DateFormatter().string(from: certificate.notValidBefore)), checked at \(ISO8601DateFormatter().string(from: time))")
            }
        }
        return nil
    }

    /// The validated chain when it is trusted and carries Apple's marker OIDs.
    private func verifyChain(leaf: Certificate, intermediate: Certificate, at time: Date) async -> Result<[Certificate], VerificationFailure> {
        var verifier = Verifier(rootCertificates: CertificateStore(trustedRoots)) {
            RFC5280Policy(fixedExpiryValidationTime: time)
            AppleMarkerOIDPolicy()
        }
        let result = await verifier.validate(leaf: leaf, intermediates: CertificateStore([intermediate]))
        let failures: [CertificateValidationResult.PolicyFailure]
        switch result {
        case .validCertificate(let chain):
            // Defence in depth: the policy already enforced this shape.
            guard chain.count == 3, chain[0] == leaf, chain[1] == intermediate else {
                return .failure(.init(.untrustedChain, "validated chain is not leaf, intermediate, trusted root"))
            }
            return .success(Array(chain))
        case .couldNotValidate(let policyFailures):
            failures = policyFailures
        }

        // Explain the failure as specifically as possible.
        let timestamp = ISO8601DateFormatter().string(from: time)
        if let failure = Self.validityFailure(leaf: leaf, intermediate: intermediate, at: time) { return .failure(failure) }
        let reasons = failures.map(\.policyFailureReason.description)
        if let marker = reasons.first(where: { $0.hasPrefix(AppleMarkerOIDPolicy.failurePrefix) }) {
            return .failure(.init(.missingAppleMarkerOID, String(marker.dropFirst(AppleMarkerOIDPolicy.failurePrefix.count))))
        }
        if reasons.contains(where: { $0.contains("expired") || $0.contains("not yet valid") }) {
            return .failure(.init(.certificateExpired, "a certificate of the chain is not valid at \(timestamp)"))
        }
        var message = "certificate chain does not lead to a trusted root"
        if leaf.extensions[oid: AppleCertificateMarkers.leaf] == nil
            || intermediate.extensions[oid: AppleCertificateMarkers.intermediate] == nil
        {
            message += " (and lacks Apple's marker OIDs)"
        }
        return .failure(.init(.untrustedChain, message))
    }

    private static func describe(_ error: any Error) -> String {
        switch error {
        case DecodingError.keyNotFound(let key, _): return "missing field '\(key.stringValue)'"
        case DecodingError.typeMismatch(_, let context), DecodingError.valueNotFound(_, let context):
            return "wrong type for '\(context.codingPath.map(\.stringValue).joined(separator: "."))'"
        case DecodingError.dataCorrupted: return "not valid JSON"
        default: return "cannot be decoded"
        }
    }
}

/// The JOSE header fields we read.
private struct JWSHeader: Decodable {
    var alg: String?
    var x5c: [String]?
}
