import AppStoreServerAPI
import Foundation
import Hummingbird
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import Synchronization
import X509

/// How the Retention Messaging endpoint is bounded.
public struct RetentionConfiguration: Sendable {
    /// The whole answer's time budget: when the history or the signature cannot be had within it,
    /// the fallback is answered (Apple's performance test expects about 700 ms).
    public var budget: Duration = .milliseconds(300)
    /// Oldest accepted `signedDate` (and at most a minute in the future).
    public var maximumRequestAge: Duration = .seconds(300)

    public init() {}
}

/// `POST /v1/apple/retention`: Apple's Retention Messaging `Get Retention Message` request.
///
/// Rules:
/// - Authenticity comes from the payload (`{"signedPayload"}`), verified like all Apple-signed
///   data; the app is the catalog app whose `appAppleID` the request names, which must have a
///   `retention` plan; the environment must be one it accepts. A request signed more than
///   `maximumRequestAge` ago (or over a minute ahead), or whose `requestIdentifier` was seen
///   before, is refused and nothing is signed.
/// - The answer is Apple's `RealtimeResponseBody` with exactly one member: a promotional offer
///   the subscriber is eligible for (decided on Apple's history of the subscription: the stored,
///   complete one, else the App Store Server API), else the product's fallback; no fallback
///   answers 204 (Apple shows its default message).
/// - A promotional offer's nonce is the `requestIdentifier`, so the ledger's unique nonces make
///   a replay unable to issue a second signature on any instance; the signature is audited
///   (`signature.issued` with `originalTransactionID` and `retentionRequestIdentifier`) and
///   tracked for redemption like any other; a request is a page view, so the signature never
///   counts toward the rules by itself (`LedgerIssuance.pageViewClient`): Apple's redemption does.
/// - Within `budget`: when the history or the customer lock cannot be had in time, the fallback
///   is answered and counted (`retention_fallbacks_total{reason="budget"}`).
struct RetentionController: Sendable {
    let store: any OfferSignerStore
    let keyRing: KeyRingHolder
    let committer: AuditCommitter
    let eligibility: EligibilityService
    let configuration: RetentionConfiguration
    let metrics: ServerMetrics
    let storeTimeout: Duration
    let customerLocks: CustomerSigningLocks
    let recentRequests: RecentRequestIdentifiers

    static let maximumBodyBytes = 64 * 1024
    static let client = "apple-retention"

    var catalog: OfferCatalog { eligibility.configuration.catalog }

    func answer(_ request: Request, context: some RequestContext) async throws -> Response {
        let deadline = ContinuousClock.now + configuration.budget
        let (verified, app, plan) = try await verify(request)
        guard let productPlan = plan.products[verified.productID] else {
            return answered(nil, reason: "unknown_product", metrics: metrics)
        }
        guard recentRequests.insert(verified.requestIdentifier, now: Date(), keepFor: configuration.maximumRequestAge + .seconds(60)) else {
            metrics.retentionRequest("retention_request_replayed")
            throw APIProblem(.conflict, code: "retention_request_replayed", detail: "requestIdentifier \(verified.requestIdentifier) was answered before")
        }

        // Apple's history of the subscription, within the budget.
        guard let history = await withDeadline(deadline, { await self.history(verified, app: app) }) else {
            return answered(productPlan.fallback, reason: "budget", metrics: metrics)
        }
        guard let history else {
            return answered(productPlan.fallback, reason: "history_unavailable", metrics: metrics)
        }
        let (customer, token) = RetentionDecider.customerKey(history: history, originalTransactionID: verified.originalTransactionID)
        let bundleID = app.bundleID
        let decideAndIssue = { () async throws -> Response in
            let now = Date()
            let ledger = try await eligibility.ledger(customer: customer, bundleID: bundleID, timeout: storeTimeout)
            let decision = RetentionDecider.decide(plan: productPlan, catalog: catalog, bundleID: bundleID, history: history, ledger: ledger, now: now)
            return try await issue(decision, verified: verified, bundleID: bundleID, customer: customer, token: token, plan: plan, productPlan: productPlan, now: now, context: context)
        }
        let remaining = max(deadline - ContinuousClock.now, .milliseconds(1))
        do {
            return try await customerLocks.withLock(CustomerSigningLocks.key(bundleID: bundleID, appAccountToken: customer), timeout: remaining) {
                try await store.withExclusiveLock(.customer(bundleID: bundleID, appAccountToken: customer), timeout: remaining, decideAndIssue)
            }
        } catch is CustomerSigningLocks.WaitTimedOut {
            return answered(productPlan.fallback, reason: "budget", metrics: metrics)
        } catch let error as StoreError where error.code == .timeout {
            return answered(productPlan.fallback, reason: "budget", metrics: metrics)
        } catch let error as StoreError where error.code == .unavailable {
            context.logger.error("retention answer without an offer: store failure", metadata: ["error": "\(error)"])
            return answered(productPlan.fallback, reason: "store_unavailable", metrics: metrics)
        }
    }

    /// The request, verified, with its app and plan.
    private func verify(_ request: Request) async throws -> (VerifiedRetentionRequest, AppStoreAppSettings, RetentionPlan) {
        let body = try await RequestBodyReader.json(request, limit: Self.maximumBodyBytes)
        let signedPayload = try AppleNotificationController.signedPayload(body)
        guard let appAppleID = AppleRetentionRequestProbe.claimedAppAppleID(signedPayload) else {
            metrics.retentionRequest("retention_request_unverified")
            throw APIProblem(.badRequest, code: "retention_request_unverified", detail: "signedPayload is not a compact JWS of a retention request naming an appAppleId")
        }
        guard let app = catalog.app(appAppleID: appAppleID), let plan = app.retention else {
            metrics.retentionRequest("retention_request_foreign")
            throw APIProblem(.forbidden, code: "retention_request_foreign", detail: "no app of this service with that appAppleId answers retention requests (apps.<bundle>.retention)")
        }
        let now = Date()
        let verifier = AppleSignedDataVerifier(
            trustedRoots: eligibility.configuration.trustedRoots, bundleID: app.bundleID, environment: nil, chainCache: eligibility.chainCache)
        let verified: VerifiedRetentionRequest
        switch await verifier.verifyRetentionRequest(signedPayload, appAppleID: appAppleID, now: now) {
        case .success(let value): verified = value
        case .failure(let failure) where failure.code == .bundleIDMismatch || failure.code == .environmentMismatch:
            metrics.retentionRequest("retention_request_foreign")
            throw APIProblem(.forbidden, code: "retention_request_foreign", detail: "\(failure.code.rawValue): \(failure.message)")
        case .failure(let failure):
            metrics.retentionRequest("retention_request_unverified")
            throw APIProblem(.badRequest, code: "retention_request_unverified", detail: "\(failure.code.rawValue): \(failure.message)")
        }
        guard app.environments.contains(verified.environment) else {
            metrics.retentionRequest("retention_request_foreign")
            throw APIProblem(.forbidden, code: "retention_request_foreign", detail: "environment \(verified.environment.rawValue) is not accepted for \(app.bundleID)")
        }
        let age = now.timeIntervalSince(verified.signedDate)
        let maximumAge = Double(configuration.maximumRequestAge.components.seconds)
        guard age <= maximumAge, age >= -60 else {
            metrics.retentionRequest("retention_request_stale")
            throw APIProblem(
                .badRequest, code: "retention_request_stale",
                detail: "the request was signed \(Int(age)) s ago; at most \(Int(maximumAge)) s old (and not over a minute ahead) are answered")
        }
        return (verified, app, plan)
    }

    /// The subscription's history: the stored, complete one (notifications keep it current),
    /// else Apple's answer; nil when neither can be had.
    private func history(_ request: VerifiedRetentionRequest, app: AppStoreAppSettings) async -> VerifiedHistory? {
        var environmentApp = app
        environmentApp.environments = [request.environment]
        if app.notificationHistory, let stored = try? await eligibility.storedHistory(transactionID: request.originalTransactionID, app: environmentApp, now: Date()) {
            return stored
        }
        guard let client = eligibility.appleHistory else { return nil }
        let ring = keyRing.ring
        let credentials = ring.activeKeys[app.bundleID].flatMap { active in
            active.issuerID.map { AppStoreServerAPICredentials(key: active.signer.key, issuerID: $0, bundleID: app.bundleID) }
        }
        if case .history(let history) = await client.history(transactionID: request.originalTransactionID, app: environmentApp, credentials: credentials) {
            return history
        }
        return nil
    }

    private func issue(
        _ decision: RetentionDecision, verified: VerifiedRetentionRequest, bundleID: String, customer: String, token: UUID?, plan: RetentionPlan,
        productPlan: RetentionProductPlan, now: Date, context: some RequestContext
    ) async throws -> Response {
        guard let choice = decision.offer else {
            try await audit(verified, bundleID: bundleID, decision: decision, answer: productPlan.fallback == nil ? "nothing" : "fallback", signatures: [], now: now)
            return answered(productPlan.fallback, reason: decision.fallbackReason ?? "not_eligible", metrics: metrics)
        }
        guard let active = keyRing.ring.activeKeys[bundleID] else {
            return answered(productPlan.fallback, reason: "no_active_key", metrics: metrics)
        }
        guard let nonce = UUID(uuidString: verified.requestIdentifier) else {
            return answered(productPlan.fallback, reason: "internal", metrics: metrics)
        }
        var offer = JSONObjectWriter()
        offer.field("messageIdentifier", choice.messageIdentifier)
        let format: String
        do {
            switch plan.signatureVersion {
            case .v2:
                guard let issuerID = active.issuerID else { return answered(productPlan.fallback, reason: "issuer_id_missing", metrics: metrics) }
                let claims = try OfferJWSClaims.promotionalOffer(
                    issuerID: issuerID, bundleID: bundleID, productID: verified.productID, offerID: choice.offerID,
                    transactionID: verified.originalTransactionID, issuedAt: now, nonce: nonce)
                offer.field("promotionalOfferSignatureV2", active.signer.compactJWS(for: claims))
                format = "jws"
            case .v1:
                let timestamp = now.unixMilliseconds
                let payload = try PromotionalOfferPayload(
                    bundleID: bundleID, keyID: active.keyID, productID: verified.productID, offerID: choice.offerID, appAccountToken: token,
                    nonce: nonce, timestamp: timestamp)
                var v1 = JSONObjectWriter()
                v1.field("encodedSignature", try active.signer.legacySignature(for: payload))
                v1.field("productId", verified.productID)
                v1.field("nonce", nonce.lowercasedString)
                v1.field("timestamp", timestamp)
                v1.field("keyId", active.keyID)
                v1.field("offerIdentifier", choice.offerID)
                if let token { v1.field("appAccountToken", token.lowercasedString) }
                offer.field("promotionalOfferSignatureV1", json: v1.finish())
                format = "legacy"
            }
        } catch {
            context.logger.error("retention offer could not be signed", metadata: ["error": "\(error)"])
            return answered(productPlan.fallback, reason: "signing_failed", metrics: metrics)
        }
        let signature = IssuedSignature(
            nonce: nonce.lowercasedString, issuedAt: now, client: Self.client, bundleID: bundleID, productID: verified.productID, offerID: choice.offerID,
            appAccountToken: customer, keyID: active.keyID, format: format, originalTransactionID: verified.originalTransactionID,
            retentionRequestIdentifier: verified.requestIdentifier)
        do {
            try await audit(verified, bundleID: bundleID, decision: decision, answer: "promotionalOffer", signatures: [signature], now: now)
        } catch let error as StoreError where error.code == .duplicate {
            // Another instance answered this requestIdentifier: a replay.
            metrics.retentionRequest("retention_request_replayed")
            throw APIProblem(.conflict, code: "retention_request_replayed", detail: "requestIdentifier \(verified.requestIdentifier) was answered before")
        }
        metrics.signatureIssued(format: format, keyID: active.keyID)
        metrics.offerIssued(bundleID: bundleID, offerID: choice.offerID)
        metrics.retentionRequest("promotionalOffer")
        metrics.retentionAnswer(type: "promotionalOffer", offerID: choice.offerID)
        var writer = JSONObjectWriter()
        writer.field("promotionalOffer", json: offer.finish())
        return Response.json(writer.finish())
    }

    /// One `retention.answered` record (with the signature's records, when one was issued),
    /// committed before the answer leaves.
    private func audit(
        _ request: VerifiedRetentionRequest, bundleID: String, decision: RetentionDecision, answer: String, signatures: [IssuedSignature], now: Date
    ) async throws {
        var writer = JSONObjectWriter()
        writer.field("answeredAt", now.unixMilliseconds)
        writer.field("bundleID", bundleID)
        writer.field("environment", request.environment.rawValue)
        writer.field("originalTransactionID", request.originalTransactionID)
        writer.field("productID", request.productID)
        writer.field("requestIdentifier", request.requestIdentifier)
        writer.field("answer", answer)
        if let offer = decision.offer { writer.field("offerID", offer.offerID) }
        let tried = decision.tried.map { tried in
            var item = JSONObjectWriter()
            item.field("offerID", tried.offerID)
            item.field("eligible", tried.eligible)
            item.field("reasons", json: EligibilityService.reasonsJSON(tried.reasons))
            return item.finish()
        }
        writer.field("decisions", json: "[" + tried.joined(separator: ",") + "]")
        let appends = [AuditAppend(entry: AuditEntry(kind: "retention.answered", body: writer.finish()))]
            + signatures.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }
        _ = try await committer.commit(appends, within: storeTimeout)
    }

    private func answered(_ fallback: RetentionFallback?, reason: String, metrics: ServerMetrics) -> Response {
        metrics.retentionFallback(reason: reason)
        guard let json = RetentionDecider.fallbackJSON(fallback) else {
            metrics.retentionRequest("nothing")
            return Response(status: .noContent)
        }
        let type = if case .message = fallback { "message" } else { "alternateProduct" }
        metrics.retentionRequest(type)
        metrics.retentionAnswer(type: type, offerID: nil)
        return Response.json(json)
    }
}

/// Runs `work` in a task of its own and waits for it until `deadline`: nil when the deadline
/// comes first. The work is not cancelled (a lookup of Apple's history then still fills the
/// caches and the store, and is not held against Apple's host); only the wait ends.
func withDeadline<T: Sendable>(_ deadline: ContinuousClock.Instant, _ work: @escaping @Sendable () async -> T) async -> T? {
    let first = DeadlineRace<T>()
    return await withCheckedContinuation { (continuation: CheckedContinuation<T?, Never>) in
        first.install(continuation)
        Task { first.resume(await work()) }
        Task {
            try? await Task.sleep(until: deadline, clock: .continuous)
            first.resume(nil)
        }
    }
}

/// Resumes a continuation once, with whichever value comes first.
private final class DeadlineRace<T: Sendable>: Sendable {
    private let continuation = Mutex<CheckedContinuation<T?, Never>?>(nil)

    func install(_ continuation: CheckedContinuation<T?, Never>) {
        self.continuation.withLock { $0 = continuation }
    }

    func resume(_ value: T?) {
        continuation.withLock { $0.take() }?.resume(returning: value)
    }
}

/// Recently answered `requestIdentifier`s, so a replay is refused at once on this instance (the
/// ledger's unique nonces refuse it on every instance once a signature was issued).
///
/// Rules: an identifier is remembered for `keepFor` (longer than a request stays fresh); at most
/// `capacity` are remembered (the oldest are forgotten first).
final class RecentRequestIdentifiers: Sendable {
    private struct State {
        var seen: [String: Date] = [:]
        var order: [(String, Date)] = []
        var head = 0
    }

    private let state = Mutex(State())
    private let capacity: Int

    init(capacity: Int = 200_000) {
        self.capacity = capacity
    }

    /// Remembers `identifier`; false when it was remembered already.
    func insert(_ identifier: String, now: Date, keepFor: Duration) -> Bool {
        state.withLock { state in
            let horizon = now.addingTimeInterval(-Double(keepFor.components.seconds))
            while state.head < state.order.count, state.order[state.head].1 < horizon || state.order.count - state.head >= capacity {
                state.seen.removeValue(forKey: state.order[state.head].0)
                state.head += 1
            }
            if state.head > 4096 && state.head * 2 > state.order.count {
                state.order.removeFirst(state.head)
                state.head = 0
            }
            guard state.seen[identifier] == nil else { return false }
            state.seen[identifier] = now
            state.order.append((identifier, now))
            return true
        }
    }
}
