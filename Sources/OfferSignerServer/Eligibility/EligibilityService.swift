import AppStoreServerAPI
import Foundation
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import SwiftASN1
import X509

/// Where eligibility rules come from: the offers catalog and the roots Apple-signed evidence
/// must chain to.
public struct EligibilityConfiguration: Sendable {
    public var catalog: OfferCatalog
    /// Apple Root CA - G3 unless tests pass their own; verification can never be turned off.
    public var trustedRoots: [Certificate]
    /// Most JWS one request may carry.
    public var maximumEvidenceItems: Int = 1000
    /// How Apple's App Store Server API is asked (offers with `historySource` `apple` or
    /// `apple-then-client`; per-app settings are in the catalog's `apps`).
    public var appStoreServerAPI = AppStoreServerAPIConfiguration()

    public init(catalog: OfferCatalog, trustedRoots: [Certificate] = [.appleRootCAG3]) {
        self.catalog = catalog
        self.trustedRoots = trustedRoots
    }

    /// Reads a catalog and optional root certificates (PEM text; none means Apple Root CA - G3).
    public init(catalogJSON: Data, trustedRootPEMs: [String]) throws(ServerConfigurationError) {
        do {
            catalog = try OfferCatalog(jsonData: catalogJSON)
        } catch {
            throw ServerConfigurationError(error.description)
        }
        if trustedRootPEMs.isEmpty {
            trustedRoots = [.appleRootCAG3]
        } else {
            var roots: [Certificate] = []
            for (index, pem) in trustedRootPEMs.enumerated() {
                do {
                    roots.append(try Certificate(pemEncoded: pem))
                } catch {
                    throw ServerConfigurationError("trusted root #\(index + 1) is not a PEM certificate: \(error)")
                }
            }
            trustedRoots = roots
        }
    }
}

/// Decides whether a customer may get an offer, from Apple-signed history and our ledger.
///
/// The history is, per offer (`historySource`), the app's verified evidence or Apple's own answer
/// from the App Store Server API (see `HistorySourceResolver`).
///
/// Rules: every JWS is verified (x5c chain to a trusted root, Apple's marker OIDs, ES256,
/// bundle); a transaction that names another appAccountToken than the customer's is another
/// account's history and counts as unverified evidence. Redemptions count as
/// `EligibilityEvaluator.RedemptionCounting` says: on Apple's history the ones Apple recorded; on
/// the app's evidence also our ledger's attempts (signatures issued to the customer for the
/// bundle, one record per issuance whatever the number of formats, Retention Messaging answers
/// left out: `LedgerIssuance.pageViewClient`).
struct EligibilityService: Sendable {
    let configuration: EligibilityConfiguration
    let store: any OfferSignerStore
    /// Longest wait for the ledger read (then the request is refused with 503).
    let storeTimeout: Duration
    let evaluator: EligibilityEvaluator
    /// Apple's word on history, for offers whose `historySource` asks Apple.
    let appleHistory: AppStoreServerAPIClient?
    /// Certificate chains validated before (shared with the API client and the notifications endpoint).
    let chainCache: AppleChainValidationCache
    /// Stored histories decoded before.
    let decodedHistories = DecodedHistoryCache()

    init(
        configuration: EligibilityConfiguration, store: any OfferSignerStore, storeTimeout: Duration, appleHistory: AppStoreServerAPIClient? = nil,
        chainCache: AppleChainValidationCache = AppleChainValidationCache()
    ) {
        self.configuration = configuration
        self.store = store
        self.storeTimeout = storeTimeout
        self.evaluator = EligibilityEvaluator(catalog: configuration.catalog)
        self.appleHistory = appleHistory
        self.chainCache = chainCache
    }

    /// The complete stored history of the subscription `transactionID` belongs to, in the first of
    /// the app's environments that has one (nil when none is complete).
    /// A history decoded before is used while the store still reports it at that version (one
    /// short read); otherwise it is read whole and each item's stored JWS verified again
    /// (``DecodedHistoryCache``: a database writer's edit of the decoded column is not believed). A history that may have missed a
    /// notification (see `StoredHistoryFreshness`) is not used.
    func storedHistory(transactionID: String, app: AppStoreAppSettings, now: Date) async throws -> VerifiedHistory? {
        for environment in app.environments {
            let version = try await StoreDeadline.run("stored history read", timeout: storeTimeout) { [store] in
                try await store.appleHistoryVersion(bundleID: app.bundleID, environment: environment.rawValue, transactionID: transactionID)
            }
            guard let version, version.isComplete else { continue }
            if let decoded = decodedHistories.history(at: version) {
                guard StoredHistoryFreshness.isCurrent(decoded, updatedAt: version.updatedAt, now: now) else { return nil }
                decodedHistories.noteDecided(bundleID: app.bundleID, transactionID: transactionID)
                return decoded
            }
            let stored = try await StoreDeadline.run("stored history read", timeout: storeTimeout) { [store] in
                try await store.appleHistory(bundleID: app.bundleID, environment: environment.rawValue, transactionID: transactionID)
            }
            if let stored, stored.isComplete,
                let history = await decodedHistories.remember(stored, trustedRoots: configuration.trustedRoots, chainCache: chainCache, now: now)
            {
                guard StoredHistoryFreshness.isCurrent(history, updatedAt: stored.updatedAt, now: now) else { return nil }
                decodedHistories.noteDecided(bundleID: app.bundleID, transactionID: transactionID)
                return history
            }
        }
        return nil
    }

    /// The catalog offers of a bundle, or those named.
    func offers(bundleID: String, named offerIDs: [String]?) throws(APIProblem) -> [OfferDefinition] {
        guard let offerIDs else { return configuration.catalog.offers.filter { $0.bundleID == bundleID } }
        return try offerIDs.map { offerID throws(APIProblem) in
            guard let offer = configuration.catalog.offer(id: offerID, bundleID: bundleID) else {
                throw APIProblem.badRequest("unknown_offer", "'\(offerID)' is not an offer of \(bundleID) in the offers catalog")
            }
            return offer
        }
    }

    /// The catalog entry of an offer, if it has rules that must be checked before signing.
    func rules(offerID: String, bundleID: String) -> OfferDefinition? {
        guard let offer = configuration.catalog.offer(id: offerID, bundleID: bundleID), offer.rules != nil else { return nil }
        return offer
    }

    /// Each offer decided on the history its `historySource` names (see `HistorySourceResolver`).
    /// `prefetched`: Apple's answer asked before (see `askApple`). `strictAccountToken`: the
    /// principal is an end user (see `HistorySourceResolver.decide`).
    func decide(
        _ offers: [OfferDefinition], bundleID: String, appAccountToken: UUID?, evidence: PurchaseEvidence?, transactionID: String?,
        ring: KeyRing, now: Date, prefetched: PrefetchedAppleAnswer? = nil, strictAccountToken: Bool = false
    ) async throws -> [EligibilityOutcome] {
        try HistorySourceResolver.checkHandles(offers, evidence: evidence, transactionID: transactionID)
        // Refused whatever source decides: the app's evidence is only verified when it is used.
        if let evidence {
            let count = evidence.signedTransactions.count + evidence.signedRenewalInfos.count
            guard count <= configuration.maximumEvidenceItems else {
                throw APIProblem.badRequest("too_much_evidence", "evidence holds \(count) JWS; at most \(configuration.maximumEvidenceItems) are accepted")
            }
        }
        let ledger = try await self.ledger(appAccountToken: appAccountToken, bundleID: bundleID)
        return try await HistorySourceResolver(service: self).decide(
            offers, bundleID: bundleID, appAccountToken: appAccountToken, evidence: evidence, transactionID: transactionID,
            credentials: Self.credentials(bundleID: bundleID, ring: ring), ledger: ledger, now: now, prefetched: prefetched,
            strictAccountToken: strictAccountToken)
    }

    /// Apple's word for the offers that ask Apple (see `HistorySourceResolver.askApple`), asked
    /// before any customer lock is taken: no lock, no pooled store connection held meanwhile.
    func askApple(_ offers: [OfferDefinition], bundleID: String, transactionID: String?, ring: KeyRing, now: Date) async throws -> PrefetchedAppleAnswer {
        let answer = try await HistorySourceResolver(service: self).askApple(
            offers, bundleID: bundleID, transactionID: transactionID, credentials: Self.credentials(bundleID: bundleID, ring: ring), now: now)
        return PrefetchedAppleAnswer(answer: answer)
    }

    /// The App Store Server API credentials of a bundle: its active key, when it has an issuer ID.
    static func credentials(bundleID: String, ring: KeyRing) -> AppStoreServerAPICredentials? {
        ring.activeKeys[bundleID].flatMap { active in
            active.issuerID.map { AppStoreServerAPICredentials(key: active.signer.key, issuerID: $0, bundleID: bundleID) }
        }
    }

    func verifiedEvidence(_ evidence: PurchaseEvidence?, bundleID: String, appAccountToken: UUID?, now: Date) async throws -> EligibilityEvidence {
        guard let evidence else { return .empty }
        let count = evidence.signedTransactions.count + evidence.signedRenewalInfos.count
        guard count <= configuration.maximumEvidenceItems else {
            throw APIProblem.badRequest("too_much_evidence", "evidence holds \(count) JWS; at most \(configuration.maximumEvidenceItems) are accepted")
        }
        // Evidence counts only from the environments the app's customers come from, as
        // notifications and Apple's API do: Sandbox data in a Production-only app is refused.
        let environments = configuration.catalog.appSettings(bundleID: bundleID).environments
        let verifier = AppleSignedDataVerifier(
            trustedRoots: configuration.trustedRoots, bundleID: bundleID, environments: environments, chainCache: chainCache)
        var verified = await verifier.verify(signedTransactions: evidence.signedTransactions, signedRenewalInfos: evidence.signedRenewalInfos, now: now)
        for index in verified.failures.indices where verified.failures[index].code == .environmentMismatch {
            verified.failures[index].message += " (apps.\(bundleID).environments)"
        }
        if let appAccountToken {
            let customer = appAccountToken.lowercasedString
            // A failure names the item's place in `signedTransactions`, items that failed before included.
            // Duplicates were dropped (see `AppleSignedDataVerifier.verify`): the first of each counts.
            let failed = Set(verified.failures.filter { $0.source == .signedTransaction }.map(\.index))
            var seen = Set<String>()
            let submittedIndices = evidence.signedTransactions.indices.filter { seen.insert(evidence.signedTransactions[$0]).inserted && !failed.contains($0) }
            for (verifiedIndex, transaction) in verified.transactions.enumerated() {
                if let token = transaction.appAccountToken, !token.isEmpty, token.lowercased() != customer {
                    verified.failures.append(EvidenceFailure(
                        source: .signedTransaction, index: submittedIndices[verifiedIndex], code: .appAccountTokenMismatch,
                        message: "transaction \(transaction.transactionID) belongs to another appAccountToken"))
                }
            }
        }
        return verified
    }

    private func ledger(appAccountToken: UUID?, bundleID: String) async throws -> [IssuedOfferRecord] {
        guard let appAccountToken else { return [] }
        return try await ledger(customer: appAccountToken.lowercasedString, bundleID: bundleID, timeout: storeTimeout)
    }

    /// The issuances recorded for a customer (the ledger's `app_account_token` key), one per
    /// issuance whatever its formats; Retention Messaging answers (page views) are not among them.
    func ledger(customer: String, bundleID: String, timeout: Duration) async throws -> [IssuedOfferRecord] {
        try await Self.ledger(customer: customer, bundleID: bundleID, store: store, timeout: timeout)
    }

    static func ledger(customer: String, bundleID: String, store: any OfferSignerStore, timeout: Duration) async throws -> [IssuedOfferRecord] {
        try await StoreDeadline.run("ledger read", timeout: timeout) { [store] in
            try await store.ledgerIssuances(appAccountToken: customer, bundleID: bundleID)
        }.map { IssuedOfferRecord(offerID: $0.offerID, issuedAt: $0.issuedAt) }
    }

    /// A decision as the API returns it.
    static func json(_ outcome: EligibilityOutcome) -> String {
        let decision = outcome.decision
        var writer = JSONObjectWriter()
        writer.field("offerID", decision.offerID)
        writer.field("eligible", decision.eligible)
        writer.field("reasons", json: reasonsJSON(decision.reasons))
        if let eligibleFrom = decision.eligibleFrom { writer.field("eligibleFrom", Date.rfc3339(milliseconds: eligibleFrom.unixMilliseconds)) }
        if !decision.evidenceFailures.isEmpty {
            writer.field("evidenceFailures", json: evidenceFailuresJSON(decision.evidenceFailures))
        }
        if let source = outcome.source { writer.field("historySource", source.rawValue) }
        return writer.finish()
    }

    /// The `evidenceFailures` array, as the eligibility decisions and the signing endpoint's
    /// `not_eligible` problem carry it.
    static func evidenceFailuresJSON(_ failures: [EvidenceFailure]) -> String {
        let items = failures.map { failure in
            var item = JSONObjectWriter()
            item.field("source", failure.source.rawValue)
            item.field("index", Int64(failure.index))
            item.field("code", failure.code.rawValue)
            item.field("message", failure.message)
            return item.finish()
        }
        return "[" + items.joined(separator: ",") + "]"
    }

    static func reasonsJSON(_ reasons: [EligibilityReason]) -> String {
        "[" + reasons.map { JSONObjectWriter.quoted($0.rawValue) }.joined(separator: ",") + "]"
    }

    /// The audit entry of a decision taken before signing.
    ///
    /// It says whose word decided (`historySource`: `apple`, `client`, or `none` when Apple could
    /// not answer and nothing else could decide) and, when Apple was asked and could not answer,
    /// why (`appleUnavailable`).
    static func auditEntry(
        _ outcome: EligibilityOutcome, bundleID: String, productID: String, appAccountToken: UUID?, transactionID: String?, principal: String,
        at time: Date
    ) -> AuditEntry {
        let decision = outcome.decision
        var writer = JSONObjectWriter()
        writer.field("decidedAt", time.unixMilliseconds)
        writer.field("client", principal)
        writer.field("bundleID", bundleID)
        writer.field("productID", productID)
        writer.field("offerID", decision.offerID)
        writer.field("appAccountToken", appAccountToken?.lowercasedString)
        writer.field("eligible", decision.eligible)
        writer.field("reasons", json: reasonsJSON(decision.reasons))
        if let source = outcome.source { writer.field("historySource", source.rawValue) }
        if let transactionID { writer.field("transactionID", transactionID) }
        if let via = outcome.appleVia { writer.field("appleHistoryVia", via) }
        if let unavailable = outcome.appleUnavailable { writer.field("appleUnavailable", unavailable.reason.rawValue) }
        return AuditEntry(kind: "eligibility.decided", body: writer.finish())
    }
}
