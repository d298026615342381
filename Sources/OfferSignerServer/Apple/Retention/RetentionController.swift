import AppStoreServerAPI
import Foundation
import Hummingbird
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import X509

/// How the Retention Messaging endpoint is bounded.
public struct RetentionConfiguration: Sendable {
    /// The deadline of the whole answer, from the request's arrival to its last byte:
    /// verification, history, locks, ledger, signing and the audit commit. Past it the fallback is
    /// answered, and no signature the customer did not get is recorded as issued.
    ///
    /// Apple: "To pass the performance test, your server must respond to requests within
    /// approximately 700 ms in the sandbox environment" (*Initiate Performance Test*,
    /// https://developer.apple.com/documentation/retentionmessaging/initiate-performance-test; the
    /// exact figure is the `responseTimeThreshold` of its `PerformanceTestConfig`). Apple documents
    /// no production timeout; it shows the default message "if your server response fails for any
    /// reason" (*Responding to real-time retention messaging requests*). 500 ms leaves 200 ms for
    /// the network between Apple and the service.
    public var budget: Duration = .milliseconds(500)
    /// Oldest accepted `signedDate` (and at most a minute in the future).
    public var maximumRequestAge: Duration = .seconds(300)

    public init() {}
}

/// `POST /v1/apple/retention`: Apple's Retention Messaging `Get Retention Message` request.
///
/// Rules:
/// - Any `Content-Type` is accepted (Apple does not document the header it sends). The payload
///   (`{"signedPayload"}`) is verified like all Apple-signed data before anything about the
///   configuration is consulted: an unverified payload gets the same `retention_request_unverified`
///   whatever app it names. Then the app: in Production the catalog app whose `appAppleID` the
///   request names, as Apple's `SignedDataVerifier` checks `appAppleId` in Production only
///   (`verify_and_decode_realtime_request`, `appstoreserverlibrary/signed_data_verifier.py` of
///   Apple's App Store Server Library for Python); in Sandbox that app, else the one app with a
///   `retention` plan. Its environment must be one it accepts. A request signed more than
///   `maximumRequestAge` ago (or over a minute ahead), or whose `requestIdentifier` was seen
///   before, is refused and nothing is signed.
/// - The answer is Apple's `RealtimeResponseBody` with exactly one member: a promotional offer
///   the subscriber is eligible for (decided on Apple's history of the subscription: the stored,
///   complete one, else the App Store Server API), else the product's fallback; no fallback
///   answers 204 (Apple shows its default message). Messages are chosen for the request's
///   `userLocale` (see `LocalizedMessageIdentifier`).
/// - A promotional offer's nonce is the `requestIdentifier`, so the ledger's unique nonces make
///   a replay unable to issue a second signature on any instance; the signature is audited
///   (`signature.issued` with `originalTransactionID` and `retentionRequestIdentifier`) before the
///   answer leaves and is tracked for redemption like any other; a request is a page view, so the
///   signature never counts toward the rules by itself (`LedgerIssuance.pageViewClient`): Apple's
///   redemption does.
/// - One deadline (`budget`) from arrival: whatever is not done by then, the fallback is answered
///   at the deadline (`retention_fallbacks_total{reason="deadline"}`). Audit entries still queued
///   then are withdrawn, never written; entries whose commit was under way and lands late are
///   followed, under the customer's lock, by a `signature.withdrawn` record and the removal of
///   their ledger rows, so no rule counts a signature the customer never saw.
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
    /// Answers per product and type and their latencies, for the dashboard (`/admin/retention`).
    let activity: RetentionActivity

    static let maximumBodyBytes = 64 * 1024
    static let client = "apple-retention"

    var catalog: OfferCatalog { eligibility.configuration.catalog }

    /// What the work behind one answer came to.
    enum Outcome: Sendable {
        case fallback(reason: String)
        case offer(json: String, format: String, keyID: String, offerID: String)
        /// The nonce (the `requestIdentifier`) was issued before, on some instance.
        case replayed
    }

    /// The request as the work behind its answer needs it.
    struct Job: Sendable {
        var verified: VerifiedRetentionRequest
        var app: AppStoreAppSettings
        var plan: RetentionPlan
        var productPlan: RetentionProductPlan
        var deadline: ContinuousClock.Instant
        var claim: RetentionAnswerClaim
        var logger: Logger
    }

    /// Answers a request whose `body` was read already (before the endpoint's gate, see
    /// ``ConcurrencyGate``); the budget runs from `arrived`, when reading it began.
    func answer(body: Data, arrived: ContinuousClock.Instant, context: some RequestContext) async throws -> Response {
        let deadline = arrived + configuration.budget
        let (verified, app, plan) = try await verify(body: body)
        let locale = verified.userLocale
        guard let productPlan = plan.products[verified.productID] else {
            return answered(nil, userLocale: locale, productID: verified.productID, arrival: arrived, reason: "unknown_product")
        }
        guard recentRequests.insert(verified.requestIdentifier, now: Date(), keepFor: configuration.maximumRequestAge + .seconds(60)) else {
            metrics.retentionRequest("retention_request_replayed")
            throw APIProblem(.conflict, code: "retention_request_replayed", detail: "requestIdentifier \(verified.requestIdentifier) was answered before")
        }
        guard ContinuousClock.now < deadline else {
            return answered(productPlan.fallback, userLocale: locale, productID: verified.productID, arrival: arrived, reason: "deadline")
        }
        let job = Job(
            verified: verified, app: app, plan: plan, productPlan: productPlan, deadline: deadline, claim: RetentionAnswerClaim(), logger: context.logger)
        // The work runs in a task of its own: at the deadline the answer leaves without it, and
        // the work finishes what it started (a commit under way, then its withdrawal) under the
        // customer's lock.
        let work = Task { await self.decideAndIssue(job) }
        var outcome = await withDeadline(deadline) { await work.value }
        if outcome == nil {
            let (expired, queued) = job.claim.expire()
            if expired {
                if let queued { committer.withdraw(queued) }
                return answered(productPlan.fallback, userLocale: locale, productID: verified.productID, arrival: arrived, reason: "deadline")
            }
            // The work claimed the answer a moment before the deadline: its outcome is at hand.
            outcome = await work.value
        }
        switch outcome {
        case .offer(let json, let format, let keyID, let offerID)?:
            metrics.signatureIssued(format: format, keyID: keyID)
            metrics.offerIssued(bundleID: app.bundleID, offerID: offerID)
            metrics.retentionRequest("promotionalOffer")
            metrics.retentionAnswer(type: "promotionalOffer", offerID: offerID)
            activity.record(productID: verified.productID, type: "promotionalOffer", fallbackReason: nil, latency: ContinuousClock.now - arrived)
            return Response.json(json)
        case .replayed?:
            metrics.retentionRequest("retention_request_replayed")
            throw APIProblem(.conflict, code: "retention_request_replayed", detail: "requestIdentifier \(verified.requestIdentifier) was answered before")
        case .fallback(let reason)?:
            return answered(productPlan.fallback, userLocale: locale, productID: verified.productID, arrival: arrived, reason: reason)
        case nil:
            return answered(productPlan.fallback, userLocale: locale, productID: verified.productID, arrival: arrived, reason: "deadline")
        }
    }

    /// The request, verified, with its app and plan. Nothing about the configuration is looked
    /// at before the signature verified.
    private func verify(body: Data) async throws -> (VerifiedRetentionRequest, AppStoreAppSettings, RetentionPlan) {
        let signedPayload = try AppleNotificationController.signedPayload(body)
        let now = Date()
        let verifier = AppleSignedDataVerifier(
            trustedRoots: eligibility.configuration.trustedRoots, bundleID: "", environments: [.production, .sandbox], chainCache: eligibility.chainCache)
        let verified: VerifiedRetentionRequest
        switch await verifier.verifyRetentionRequest(signedPayload, now: now) {
        case .success(let value): verified = value
        case .failure(let failure):
            metrics.retentionRequest("retention_request_unverified")
            throw APIProblem(
                .badRequest, code: "retention_request_unverified",
                detail: "signedPayload is not a Retention Messaging request signed by Apple (\(failure.code.rawValue))")
        }
        guard let match = Self.app(answering: verified, catalog: catalog) else {
            metrics.retentionRequest("retention_request_foreign")
            throw APIProblem(
                .forbidden, code: "retention_request_foreign",
                detail: "no app of this service with appAppleId \(verified.appAppleID.map(String.init) ?? "(none)") answers \(verified.environment.rawValue) retention requests (apps.<bundle>.appAppleID, environments, retention)")
        }
        let age = now.timeIntervalSince(verified.signedDate)
        let maximumAge = Double(configuration.maximumRequestAge.components.seconds)
        guard age <= maximumAge, age >= -60 else {
            metrics.retentionRequest("retention_request_stale")
            throw APIProblem(
                .badRequest, code: "retention_request_stale",
                detail: "the request was signed \(Int(age)) s ago; at most \(Int(maximumAge)) s old (and not over a minute ahead) are answered")
        }
        return (verified, match.app, match.plan)
    }

    /// The app a verified request is for, with its plan: the catalog app whose `appAppleID` it
    /// names, which must have a plan and accept the request's environment. In Sandbox, where
    /// Apple's verifier does not compare `appAppleId` (and a tester's request may name none, or
    /// another), a request naming no catalog app goes to the one app with a plan that accepts
    /// Sandbox, if there is exactly one.
    static func app(answering request: VerifiedRetentionRequest, catalog: OfferCatalog) -> (app: AppStoreAppSettings, plan: RetentionPlan)? {
        app(appAppleID: request.appAppleID, environment: request.environment, catalog: catalog)
    }

    /// The app a request naming `appAppleID` in `environment` is answered for (see
    /// ``app(answering:catalog:)``; also `retention simulate`'s check).
    static func app(appAppleID: Int64?, environment: AppleEnvironment, catalog: OfferCatalog) -> (app: AppStoreAppSettings, plan: RetentionPlan)? {
        if let appAppleID, let named = catalog.app(appAppleID: appAppleID) {
            guard let plan = named.retention, named.environments.contains(environment) else { return nil }
            return (named, plan)
        }
        guard environment != .production else { return nil }
        let candidates = catalog.apps.values.filter { $0.retention != nil && $0.environments.contains(environment) }
        guard candidates.count == 1, let app = candidates.first, let plan = app.retention else { return nil }
        return (app, plan)
    }

    /// History, lock, ledger, decision, signature and commit, each within the job's deadline (an
    /// answer without an offer is committed once the lock is given back). A stored history
    /// decoded before is confirmed with the lock (its version read in the lock's round trip on
    /// PostgreSQL, see `EligibilityService.retentionHistoryReadWithLock`); one that moved is read
    /// before the lock as for a first request.
    private func decideAndIssue(_ job: Job) async -> Outcome {
        let verified = job.verified
        var narrowed = job.app
        narrowed.environments = [verified.environment]
        let environmentApp = narrowed
        if let known = eligibility.retentionHistoryReadWithLock(originalTransactionID: verified.originalTransactionID, app: environmentApp) {
            let (customer, token) = RetentionDecider.customerKey(history: known.history, originalTransactionID: verified.originalTransactionID)
            let decided = await decideUnderLock(job, customer: customer, token: token, readingHistory: known.read) { left in
                guard let history = try await eligibility.storedHistoryWithLock(known, now: Date(), timeout: left) else { throw StoredHistoryMovedUnderLock() }
                metrics.storedHistoryWithLock("decided")
                return history
            }
            if let decided { return decided }
            metrics.storedHistoryWithLock("moved")
        }
        guard let history = await history(verified, app: job.app) else { return .fallback(reason: "history_unavailable") }
        guard job.claim.isOpen else { return .fallback(reason: "deadline") }
        let (customer, token) = RetentionDecider.customerKey(history: history, originalTransactionID: verified.originalTransactionID)
        return await decideUnderLock(job, customer: customer, token: token, readingHistory: nil) { _ in history } ?? .fallback(reason: "internal")
    }

    /// Under `customer`'s lock (taken with `readingHistory`'s reads): the subscription's history
    /// (`history`, given the time left), the ledger, the decision, and an offer's signature and
    /// commit; an answer without an offer is committed after the lock. Nil when `history` throws
    /// `StoredHistoryMovedUnderLock`: nothing was decided or committed, the lock is given back.
    private func decideUnderLock(
        _ job: Job, customer: String, token: UUID?, readingHistory: CustomerLockHistoryRead?,
        history: @escaping @Sendable (_ left: Duration) async throws -> VerifiedHistory
    ) async -> Outcome? {
        let bundleID = job.app.bundleID
        let remaining = job.deadline - ContinuousClock.now
        guard remaining > .zero else { return .fallback(reason: "deadline") }
        do {
            let locked = try await customerLocks.withLock(CustomerSigningLocks.key(bundleID: bundleID, appAccountToken: customer), timeout: remaining) {
                () async throws -> LockedAnswer in
                try await store.withExclusiveLock(.customer(bundleID: bundleID, appAccountToken: customer), timeout: remaining, readingHistory: readingHistory) {
                    () async throws -> LockedAnswer in
                    guard job.claim.isOpen else { return .done(.fallback(reason: "deadline")) }
                    let history = try await history(max(job.deadline - ContinuousClock.now, .milliseconds(1)))
                    let now = Date()
                    let left = max(job.deadline - ContinuousClock.now, .milliseconds(1))
                    let ledger = try await eligibility.ledger(customer: customer, bundleID: bundleID, timeout: left)
                    let decision = RetentionDecider.decide(plan: job.productPlan, catalog: catalog, bundleID: bundleID, history: history, ledger: ledger, now: now)
                    guard let choice = decision.offer else { return .withoutOffer(decision, decidedAt: now) }
                    return try await issue(decision, choice: choice, job: job, customer: customer, token: token, now: now)
                }
            }
            switch locked {
            case .done(let outcome): return outcome
            case .withoutOffer(let decision, let now): return try await answerWithoutOffer(decision, job: job, now: now)
            }
        } catch is StoredHistoryMovedUnderLock {
            return nil
        } catch is CustomerSigningLocks.WaitTimedOut {
            return .fallback(reason: "deadline")
        } catch let error as StoreError where error.code == .timeout {
            return .fallback(reason: "deadline")
        } catch {
            job.logger.error("retention answer without an offer: store failure", metadata: ["error": "\(error)"])
            return .fallback(reason: "store_unavailable")
        }
    }

    /// The subscription's history: the stored, complete one (notifications keep it current),
    /// else Apple's answer; nil when neither can be had.
    private func history(_ request: VerifiedRetentionRequest, app: AppStoreAppSettings) async -> VerifiedHistory? {
        var environmentApp = app
        environmentApp.environments = [request.environment]
        // The stored history of the subscription the request names, never another one a row of
        // the store points the ID to (Apple's request names the original transaction ID).
        if app.notificationHistory, let stored = try? await eligibility.storedHistory(transactionID: request.originalTransactionID, app: environmentApp, now: Date()),
            stored.transactions.contains(where: { $0.originalTransactionID == request.originalTransactionID })
        {
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

    /// What the work under the customer's lock came to.
    private enum LockedAnswer: Sendable {
        /// An offer signed and committed (under the lock: the ledger row is the customer's until a
        /// late commit's withdrawal, which also runs under it), or a fallback with nothing to commit.
        case done(Outcome)
        /// No offer (none chosen, or the one chosen could not be signed): the `retention.answered`
        /// record is committed after the lock is given back (see ``answerWithoutOffer(_:job:now:)``).
        case withoutOffer(RetentionDecision, decidedAt: Date)
    }

    /// The fallback (or nothing) for a subscriber no offer was chosen for, once its
    /// `retention.answered` record is committed within the job's deadline. It runs after the
    /// customer's lock is given back: the record carries no signature and adds no ledger row, so
    /// no decision waits for it, and on PostgreSQL no lock place (a pooled connection) is held
    /// through its group commit. Past the deadline the record, if still queued, is withdrawn and
    /// the fallback answered as for any other deadline.
    private func answerWithoutOffer(_ decision: RetentionDecision, job: Job, now: Date) async throws -> Outcome {
        let answer = job.productPlan.fallback == nil ? "nothing" : "fallback"
        let queued = committer.queue([answeredEntry(job.verified, bundleID: job.app.bundleID, decision: decision, answer: answer, now: now)], until: job.deadline)
        guard job.claim.register(queued) else {
            committer.withdraw(queued)
            return .fallback(reason: "deadline")
        }
        do {
            _ = try await queued.value()
        } catch is AuditCommitter.Withdrawn {
            return .fallback(reason: "deadline")
        }
        return .fallback(reason: decision.fallbackReason ?? "not_eligible")
    }

    /// Signs `choice` (the decision's offer) and commits its records under the customer's lock.
    /// An offer that cannot be signed (no active key, no issuer ID for V2, a signing failure) is
    /// answered with the fallback, its decision audited like any answer without an offer.
    private func issue(
        _ decision: RetentionDecision, choice: RetentionOfferChoice, job: Job, customer: String, token: UUID?, now: Date
    ) async throws -> LockedAnswer {
        let verified = job.verified
        let bundleID = job.app.bundleID
        func unsigned(_ reason: String) -> LockedAnswer {
            var withoutOffer = decision
            withoutOffer.offer = nil
            withoutOffer.fallbackReason = reason
            return .withoutOffer(withoutOffer, decidedAt: now)
        }
        guard let active = keyRing.ring.activeKeys[bundleID] else { return unsigned("no_active_key") }
        guard let nonce = UUID(uuidString: verified.requestIdentifier) else { return unsigned("internal") }
        var offer = JSONObjectWriter()
        offer.field("messageIdentifier", choice.message.identifier(for: verified.userLocale))
        let format: String
        do {
            switch job.plan.signatureVersion {
            case .v2:
                guard let issuerID = active.issuerID else { return unsigned("issuer_id_missing") }
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
            job.logger.error("retention offer could not be signed", metadata: ["error": "\(error)"])
            return unsigned("signing_failed")
        }
        let signature = IssuedSignature(
            nonce: nonce.lowercasedString, issuedAt: now, client: Self.client, bundleID: bundleID, productID: verified.productID, offerID: choice.offerID,
            appAccountToken: customer, keyID: active.keyID, format: format, originalTransactionID: verified.originalTransactionID,
            retentionRequestIdentifier: verified.requestIdentifier, environment: verified.environment.rawValue)
        let appends = [answeredEntry(verified, bundleID: bundleID, decision: decision, answer: "promotionalOffer", now: now), AuditAppend(entry: signature.auditEntry, signatures: [signature])]
        // Queued with the deadline: the writer never starts it later, and the answer withdraws it
        // at the deadline if the writer has not taken it.
        let queued = committer.queue(appends, until: job.deadline)
        guard job.claim.register(queued) else {
            if committer.withdraw(queued) { return .done(.fallback(reason: "deadline")) }
            return .done(await settleLate(queued, signature: signature, job: job))
        }
        do {
            _ = try await queued.value()
        } catch is AuditCommitter.Withdrawn {
            return .done(.fallback(reason: "deadline"))
        } catch let error as StoreError where error.code == .duplicate {
            // Another instance answered this requestIdentifier: a replay.
            return .done(.replayed)
        }
        guard job.claim.claimAnswer() else {
            // Committed, but the deadline came first: the customer gets the fallback.
            await withdrawLate(signature, job: job)
            return .done(.fallback(reason: "deadline"))
        }
        var writer = JSONObjectWriter()
        writer.field("promotionalOffer", json: offer.finish())
        return .done(.offer(json: writer.finish(), format: format, keyID: active.keyID, offerID: choice.offerID))
    }

    /// A commit the writer took before the deadline passed but the answer did not wait for:
    /// once it lands, it is withdrawn.
    private func settleLate(_ queued: AuditCommitter.QueuedCommit, signature: IssuedSignature, job: Job) async -> Outcome {
        if (try? await queued.value()) != nil { await withdrawLate(signature, job: job) }
        return .fallback(reason: "deadline")
    }

    /// A signature audited as issued after its answer left without it: a `signature.withdrawn`
    /// record names it (the chain keeps both), then its ledger row goes, so no rule counts it and
    /// no redemption matches it. Runs under the customer's lock, so no decision reads the ledger
    /// in between. If either step fails, the error is logged (the row then still counts).
    private func withdrawLate(_ signature: IssuedSignature, job: Job) async {
        var writer = JSONObjectWriter()
        writer.field("withdrawnAt", Date().unixMilliseconds)
        writer.field("nonce", signature.nonce)
        writer.field("bundleID", signature.bundleID)
        writer.field("offerID", signature.offerID)
        writer.field("originalTransactionID", job.verified.originalTransactionID)
        writer.field("retentionRequestIdentifier", job.verified.requestIdentifier)
        writer.field("reason", "answered_after_deadline")
        do {
            _ = try await committer.commit([AuditAppend(entry: AuditEntry(kind: "signature.withdrawn", body: writer.finish()))], within: storeTimeout)
            _ = try await StoreDeadline.run("withdrawing a late signature", timeout: storeTimeout) { [store] in
                try await store.withdrawIssuedSignatures(nonces: [signature.nonce])
            }
            job.logger.notice(
                "retention signature committed after the deadline: withdrawn", metadata: ["nonce": "\(signature.nonce)", "offer_id": "\(signature.offerID)"])
        } catch {
            job.logger.error(
                "a retention signature committed after the deadline could not be withdrawn; it counts as issued",
                metadata: ["nonce": "\(signature.nonce)", "error": "\(error)"])
        }
    }

    /// One `retention.answered` record, with the decisions of the offers tried.
    private func answeredEntry(_ request: VerifiedRetentionRequest, bundleID: String, decision: RetentionDecision, answer: String, now: Date) -> AuditAppend {
        var writer = JSONObjectWriter()
        writer.field("answeredAt", now.unixMilliseconds)
        writer.field("bundleID", bundleID)
        writer.field("environment", request.environment.rawValue)
        writer.field("originalTransactionID", request.originalTransactionID)
        writer.field("productID", request.productID)
        writer.field("requestIdentifier", request.requestIdentifier)
        writer.field("answer", answer)
        if let offer = decision.offer { writer.field("offerID", offer.offerID) } else if let reason = decision.fallbackReason { writer.field("fallbackReason", reason) }
        let tried = decision.tried.map { tried in
            var item = JSONObjectWriter()
            item.field("offerID", tried.offerID)
            item.field("eligible", tried.eligible)
            item.field("reasons", json: EligibilityService.reasonsJSON(tried.reasons))
            return item.finish()
        }
        writer.field("decisions", json: "[" + tried.joined(separator: ",") + "]")
        return AuditAppend(entry: AuditEntry(kind: "retention.answered", body: writer.finish()))
    }

    private func answered(
        _ fallback: RetentionFallback?, userLocale: String?, productID: String, arrival: ContinuousClock.Instant, reason: String
    ) -> Response {
        metrics.retentionFallback(reason: reason)
        guard let json = RetentionDecider.fallbackJSON(fallback, userLocale: userLocale) else {
            metrics.retentionRequest("nothing")
            activity.record(productID: productID, type: "nothing", fallbackReason: reason, latency: ContinuousClock.now - arrival)
            return Response(status: .noContent)
        }
        let type = if case .message = fallback { "message" } else { "alternateProduct" }
        activity.record(productID: productID, type: type, fallbackReason: reason, latency: ContinuousClock.now - arrival)
        metrics.retentionRequest(type)
        metrics.retentionAnswer(type: type, offerID: nil)
        return Response.json(json)
    }
}
