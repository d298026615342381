import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage

/// Issues promotional-offer signatures: `POST /v1/offers/signatures`.
///
/// Rules, in order: the caller is authenticated (except `--dev`) and within its rate limit;
/// the body is a valid request; the bundle is a configured app the caller may sign for; with
/// a user JWT the appAccountToken is the user's own (403 `token_binding_mismatch` otherwise),
/// the offer is in the catalog and a JWS names a transaction proven to be the user's (see
/// `UserSigningPolicy`); the appAccountToken is within its rate limit; an introductory-offer
/// eligibility (`intro-eligibility`, asked alone) is signed for API clients only, never for a
/// user JWT (it overrides Apple's own eligibility decision), and names the customer's transaction
/// and the decision (`allowIntroductoryOffer`); Apple's word, when an offer's rules ask for it, is
/// asked before any lock is taken; an offer with eligibility rules is decided one request at a
/// time per customer, an issuance through its commit, so concurrent requests cannot all pass a
/// rule that counts issued signatures (in this process, and through the store's customer lock in
/// every process on the same database). A customer refused is answered 403 once the decision's
/// record is committed, after the lock is given back (a refusal adds nothing to the ledger the
/// rules count; a client revoked or narrowed meanwhile gets 401 or 403 for that, not the
/// reasons); so is an eligible decision that cannot be signed (no active key, say), answered with
/// why. Otherwise each format is signed with the bundle's active key and every signature's
/// audit record is durably committed before the 201 is sent. If the audit cannot be written, or
/// the store does not answer within `storeTimeout`, the answer is 503 and no signature leaves.
/// Each issuance keeps the customer's subscription and environment as Apple's history or the
/// app's verified evidence proved them (see `EligibilityOutcome.subscription`; for an end user's
/// JWS, the subscription of the transaction the request proves is theirs, with or without rules,
/// see `UserSigningPolicy.checkTransactionOwned`), else the `environment` the request declares
/// (Apple's spelling, 400 `unknown_environment` otherwise), marked declared: not verified, it
/// never keeps a redemption from matching (see `IssuanceEnvironmentSchema`).
struct SigningController: Sendable {
    let keyRing: KeyRingHolder
    let committer: AuditCommitter
    let authenticator: RequestAuthenticator
    let tokenLimiter: RateLimiter
    let metrics: ServerMetrics
    let maximumBodyBytes: Int
    let eligibility: EligibilityService?
    /// The store whose customer locks keep several processes apart.
    let store: any OfferSignerStore
    /// Longest wait for a customer lock or an audit commit before answering 503.
    let storeTimeout: Duration
    /// Serialises eligibility-checked signing per customer (see `CustomerSigningLocks`).
    let customerLocks = CustomerSigningLocks()

    func sign(_ request: Request, context: some RequestContext) async throws -> Response {
        let ring = keyRing.ring
        let principal = try await authenticator.authenticate(request, ring: ring)
        let body = try await RequestBodyReader.json(request, limit: maximumBodyBytes)
        var decoded = try SignatureRequestPlainReader.read(body) ?? RequestDecoding.decode(SignatureRequest.self, from: body)

        // Fields.
        do {
            try OfferFieldValidator.validateIdentifier(decoded.productID, field: "productID")
            try OfferFieldValidator.validateIdentifier(decoded.offerID, field: "offerID")
            if let transactionID = decoded.transactionID { try OfferFieldValidator.validateIdentifier(transactionID, field: "transactionID") }
        } catch {
            throw APIProblem.field(error)
        }
        // Apple's spelling, as this service's own constant (never the request's string).
        decoded.environment = try Self.declaredEnvironment(decoded.environment)?.rawValue
        let signatureRequest = decoded
        var token = try AppAccountTokenField.parse(signatureRequest.appAccountToken)
        let formats = try Self.formats(signatureRequest.formats)
        try Self.checkIntroductoryOfferEligibility(signatureRequest, formats: formats, principal: principal)

        // Bundle.
        let bundleID = try Self.bundle(signatureRequest.bundleID, ring: ring)
        if case .client(let client) = principal { try Self.checkBundleAllowed(client, bundleID: bundleID) }

        // Token binding.
        if case .user(_, let bound) = principal {
            if let token, token != bound {
                throw APIProblem(.forbidden, code: "token_binding_mismatch", detail: "the appAccountToken is not the one bound to the authenticated user")
            }
            token = bound
        }
        if let token, case .limited(let retryAfter) = tokenLimiter.take(token.lowercasedString) {
            throw APIProblem.rateLimited("too many signatures for this appAccountToken", retryAfter: retryAfter)
        }

        // End users: catalogued offers only (see `UserSigningPolicy`).
        if case .user = principal {
            try UserSigningPolicy.checkCatalogued(offerID: signatureRequest.offerID, bundleID: bundleID, eligibility: eligibility)
        }
        let offer = eligibility?.rules(offerID: signatureRequest.offerID, bundleID: bundleID)

        // Apple's word, asked before any customer lock: no lock and no store connection is held
        // while Apple answers (up to the API's time budget).
        // Except a stored history decoded before, whose version is read with the customer's lock
        // (one round trip on PostgreSQL, see `EligibilityService.historyReadWithLock`); not for an
        // end user's JWS, whose transaction is proven theirs before the lock.
        var prefetched: PrefetchedAppleAnswer?
        var historyWithLock: CustomerLockHistoryRead?
        if let eligibility, let offer, offer.productIDs.isEmpty || offer.productIDs.contains(signatureRequest.productID) {
            if token != nil, !formats.contains(.introEligibility), !(principal.isUser && formats.contains(.jws)) {
                historyWithLock = eligibility.historyReadWithLock(offer, bundleID: bundleID, transactionID: signatureRequest.transactionID)
            }
            if historyWithLock == nil {
                prefetched = try await eligibility.askApple([offer], bundleID: bundleID, transactionID: signatureRequest.transactionID, ring: keyRing.ring, now: Date())
            }
        }
        // The subscription the user's proof shows: kept on the issuance whatever other tokens the
        // subscription carries (see `UserSigningPolicy.checkTransactionOwned`).
        let provenSubscription: ProvenSubscription? =
            if case .user(_, let bound) = principal, formats.contains(.jws) {
                try await UserSigningPolicy.checkTransactionOwned(
                    transactionID: signatureRequest.transactionID, evidence: signatureRequest.evidence, appAccountToken: bound, bundleID: bundleID,
                    eligibility: eligibility, prefetched: prefetched, ring: keyRing.ring, now: Date(),
                    subscriptionGroupID: eligibility?.configuration.catalog.offer(id: signatureRequest.offerID, bundleID: bundleID)?.subscriptionGroupID)
            } else {
                nil
            }

        // Eligibility, for offers whose catalog entry has rules: decided one request at a time per
        // customer, an issuance through its commit, since the rules count the signatures already in
        // the customer's ledger (a request without an appAccountToken has no ledger, so nothing to
        // wait for; a decision without a signature adds nothing to it, and is committed after the
        // lock, see `answer`). An
        // introductory-offer eligibility carries Apple's introductory-offer decision, not the
        // promotional offer the request names: that offer's rules do not apply to it, and the
        // ledger does not count it (`LedgerIssuance.introEligibilityFormat`).
        if let eligibility, let offer, !formats.contains(.introEligibility) {
            let decideAndIssue = { (prefetched: PrefetchedAppleAnswer?) async throws -> LockedDecision in
                // Under the customer's lock, right before deciding: a client revoked while its
                // request waited (its body, Apple's API, the lock) gets no decision, neither
                // audited nor answered (a 403's reasons tell a customer's subscription state).
                let ring = keyRing.ring
                try Self.checkClientStillAllowed(principal, bundleID: bundleID, ring: ring)
                switch try await checkEligibility(
                    offer, request: signatureRequest, bundleID: bundleID, token: token, principal: principal,
                    eligibility: eligibility, prefetched: prefetched, ring: ring)
                {
                case .refused(let refusal):
                    return .unsigned(refusal)
                case .eligible(let decision, let subscription):
                    do {
                        return .issued(
                            try await signAndCommit(
                                signatureRequest, formats: formats, bundleID: bundleID, token: token, principal: principal, context: context,
                                decision: decision, subscription: provenSubscription ?? subscription))
                    } catch let problem as APIProblem where problem.code != APIProblem.auditUnavailable.code {
                        // Not signed, before any commit (no usable key, a field that cannot be
                        // signed, a client revoked since the decision): nothing joins the ledger,
                        // and the decision, made while the client was allowed, is committed on
                        // its own after the lock, then answered with why (see `answer`).
                        return .unsigned(UnsignedDecision(record: decision, problem: problem))
                    }
                }
            }
            guard let token else {
                return try await answer(decideAndIssue(prefetched), principal: principal, bundleID: bundleID, context: context)
            }
            let customer = token.lowercasedString
            let lock = StoreLock.customer(bundleID: bundleID, appAccountToken: customer)
            do {
                if let historyWithLock, let transactionID = signatureRequest.transactionID {
                    do {
                        let decided = try await customerLocks.withLock(CustomerSigningLocks.key(bundleID: bundleID, appAccountToken: customer), timeout: storeTimeout) {
                            try await store.withExclusiveLock(lock, timeout: storeTimeout, readingHistory: historyWithLock) {
                                guard let stored = try await eligibility.storedAnswerWithLock(offer, bundleID: bundleID, transactionID: transactionID, now: Date())
                                else { throw StoredHistoryMovedUnderLock() }
                                metrics.storedHistoryWithLock("decided")
                                return try await decideAndIssue(stored)
                            }
                        }
                        return try await answer(decided, principal: principal, bundleID: bundleID, context: context)
                    } catch is StoredHistoryMovedUnderLock {
                        metrics.storedHistoryWithLock("moved")
                        // Decided the usual way: Apple's word (stored or asked) before the lock.
                        prefetched = try await eligibility.askApple([offer], bundleID: bundleID, transactionID: transactionID, ring: keyRing.ring, now: Date())
                    }
                }
                let answered = prefetched
                let decided = try await customerLocks.withLock(CustomerSigningLocks.key(bundleID: bundleID, appAccountToken: customer), timeout: storeTimeout) {
                    try await store.withExclusiveLock(lock, timeout: storeTimeout) { try await decideAndIssue(answered) }
                }
                return try await answer(decided, principal: principal, bundleID: bundleID, context: context)
            } catch is CustomerSigningLocks.WaitTimedOut {
                throw APIProblem.customerBusy
            }
        }
        return try await signAndCommit(
            signatureRequest, formats: formats, bundleID: bundleID, token: token, principal: principal, context: context,
            decision: nil, subscription: provenSubscription)
    }

    /// The environment a request declares, as Apple spells it (`AppleEnvironment`), or nil when
    /// it declares none; 400 `unknown_environment` otherwise, echoing at most the first 32
    /// Unicode scalars of what was sent (a request body may hold a megabyte of it).
    static func declaredEnvironment(_ declared: String?) throws -> AppleEnvironment? {
        guard let declared else { return nil }
        guard let environment = AppleEnvironment(rawValue: declared) else {
            let scalars = declared.unicodeScalars
            let shown = scalars.count > 32 ? String(String.UnicodeScalarView(scalars.prefix(32))) + "…" : declared
            throw APIProblem.badRequest(
                "unknown_environment", "environment '\(shown)' is not one of Apple's: Production, Sandbox, Xcode, LocalTesting")
        }
        return environment
    }

    /// Signs each format with the bundle's active key and commits every signature's audit record
    /// (after the eligibility decision's, in the same group commit, when there is one) before the
    /// response exists. Every failure is an `APIProblem`; any other than `audit_unavailable` comes
    /// before the commit, so nothing of the request was committed.
    private func signAndCommit(
        _ signatureRequest: SignatureRequest, formats: [SignatureFormat], bundleID: String, token: UUID?, principal: Principal,
        context: some RequestContext, decision: AuditAppend?,
        subscription: ProvenSubscription?
    ) async throws -> Response {
        // The key ring as it is now, not as the request found it: a request can spend seconds
        // between its start and here (its body, a customer lock, Apple's API), and a key retired
        // or revoked meanwhile must not sign. A signature is timestamped just below, so one dated
        // more than the registry's propagation time (1 s, Docs/Deploy.md) after an activation
        // uses the activated key, however long its request took.
        let ring = keyRing.ring
        // The same for the caller (see `checkClientStillAllowed`).
        try Self.checkClientStillAllowed(principal, bundleID: bundleID, ring: ring)
        guard let active = ring.activeKeys[bundleID] else {
            throw APIProblem(.serviceUnavailable, code: "no_active_key", detail: "'\(bundleID)' has no active signing key; activate one with `offer-signer keys activate`")
        }
        if (formats.contains(.jws) || formats.contains(.introEligibility)) && active.issuerID == nil {
            throw APIProblem(.unprocessableContent, code: "issuer_id_missing", detail: "the JWS formats need the key's issuer ID; import key '\(active.keyID)' with --issuer-id")
        }

        // Sign.
        let now = Date()
        let timestamp = now.unixMilliseconds
        var writer = JSONObjectWriter()
        writer.field("bundleID", bundleID)
        writer.field("productID", signatureRequest.productID)
        writer.field("offerID", signatureRequest.offerID)
        writer.field("appAccountToken", token?.lowercasedString)
        var issued: [IssuedSignature] = []
        do {
            for format in formats {
                let nonce = UUID.timeOrdered(at: now)
                switch format {
                case .legacy:
                    let payload = try PromotionalOfferPayload(
                        bundleID: bundleID, keyID: active.keyID, productID: signatureRequest.productID, offerID: signatureRequest.offerID,
                        appAccountToken: token, nonce: nonce, timestamp: timestamp)
                    var legacy = JSONObjectWriter()
                    legacy.field("keyID", active.keyID)
                    legacy.field("nonce", nonce.lowercasedString)
                    legacy.field("timestamp", timestamp)
                    legacy.field("signature", try active.signer.legacySignature(for: payload))
                    writer.field("legacy", json: legacy.finish())
                case .jws:
                    let claims = try OfferJWSClaims.promotionalOffer(
                        issuerID: active.issuerID ?? "", bundleID: bundleID, productID: signatureRequest.productID,
                        offerID: signatureRequest.offerID, transactionID: signatureRequest.transactionID, issuedAt: now, nonce: nonce)
                    var jws = JSONObjectWriter()
                    jws.field("keyID", active.keyID)
                    jws.field("compactJWS", active.signer.compactJWS(for: claims))
                    writer.field("jws", json: jws.finish())
                case .introEligibility:
                    // Checked in checkIntroductoryOfferEligibility: both are present.
                    let transactionID = signatureRequest.transactionID ?? ""
                    let allow = signatureRequest.allowIntroductoryOffer ?? false
                    let claims = try OfferJWSClaims.introductoryOfferEligibility(
                        issuerID: active.issuerID ?? "", bundleID: bundleID, productID: signatureRequest.productID,
                        allowIntroductoryOffer: allow, transactionID: transactionID, issuedAt: now, nonce: nonce)
                    var intro = JSONObjectWriter()
                    intro.field("keyID", active.keyID)
                    intro.field("compactJWS", active.signer.compactJWS(for: claims))
                    intro.field("transactionID", transactionID)
                    intro.field("allowIntroductoryOffer", allow)
                    writer.field("introEligibility", json: intro.finish())
                }
                let isIntro = format == .introEligibility
                issued.append(IssuedSignature(
                    nonce: nonce.lowercasedString, issuedAt: now, client: principal.identity, bundleID: bundleID,
                    productID: signatureRequest.productID, offerID: signatureRequest.offerID, appAccountToken: token?.lowercasedString,
                    keyID: active.keyID, format: format.rawValue, originalTransactionID: subscription?.originalTransactionID,
                    transactionID: isIntro ? signatureRequest.transactionID : nil,
                    allowIntroductoryOffer: isIntro ? (signatureRequest.allowIntroductoryOffer ?? false) : nil,
                    environment: subscription?.environment ?? signatureRequest.environment,
                    environmentIsDeclared: subscription == nil && signatureRequest.environment != nil))
            }
        } catch {
            throw APIProblem.field(error)
        }
        writer.field("expiresAt", Date.rfc3339(milliseconds: timestamp + PromotionalOfferPayload.validityMilliseconds))

        // Audit, durably, before anything leaves.
        do {
            let appends = (decision.map { [$0] } ?? []) + Self.signatureAppends(issued)
            _ = try await committer.commit(appends, within: storeTimeout)
        } catch {
            context.logger.error("signature withheld: audit record not written", metadata: ["error": "\(error)"])
            throw APIProblem.auditUnavailable
        }
        for signature in issued { metrics.signatureIssued(format: signature.format, keyID: signature.keyID) }
        metrics.offerIssued(bundleID: bundleID, offerID: signatureRequest.offerID)
        context.logger.info(
            "signature issued",
            metadata: [
                "principal": "\(principal.identity)", "bundle_id": "\(bundleID)", "product_id": "\(signatureRequest.productID)",
                "offer_id": "\(signatureRequest.offerID)", "key_id": "\(active.keyID)", "formats": "\(formats.map(\.rawValue))",
            ])
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "no-store"
        return Response(status: .created, headers: headers, body: .init(byteBuffer: ByteBuffer(string: writer.finish())))
    }

    /// The audit appends of one request's signatures: each signature its own `signature.issued`
    /// record and its ledger row under that record's sequence (a row's `audit_seq` names the
    /// record that accounts for it), all consecutive in one commit. Redemption matching reads a
    /// request from that: its formats are adjacent sequences in different formats (see
    /// `OfferRedemption`).
    static func signatureAppends(_ issued: [IssuedSignature]) -> [AuditAppend] {
        issued.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }
    }

    /// What a decision made under the customer's lock came to.
    enum LockedDecision: Sendable {
        /// Signed, every record committed (under the lock: the next decision for the customer
        /// counts these signatures).
        case issued(Response)
        /// Nothing signed (the customer does not qualify, or qualifies but the request could not
        /// be signed), the decision's record not committed yet (see ``answer``).
        case unsigned(UnsignedDecision)
    }

    /// A decision that ends without a signature: its audit record, and the problem it is
    /// answered with once that record is committed (403 `not_eligible` with the reasons for a
    /// customer who does not qualify; for one who does, why nothing was signed, such as 503
    /// `no_active_key`).
    struct UnsignedDecision: Sendable {
        let record: AuditAppend
        let problem: APIProblem
    }

    /// Answers a decision made under the customer's lock, after the lock is given back. The record
    /// of a decision without a signature is committed here, not under the lock: it adds no
    /// signature to the ledger the rules count (only `signature.issued` records carry ledger
    /// rows), so the customer's next decision has nothing to wait for, and on PostgreSQL the
    /// lock's pooled connection (one of the store's few lock places) is not held through a group
    /// commit for it. It is still durably audited before its answer exists; a 503
    /// `audit_unavailable` if it cannot be (the decision's outcome never leaves unaudited). (So
    /// the records of one customer's concurrent requests may be committed in another order than
    /// they were decided in; a client that waits for each answer sees them in order.)
    private func answer(
        _ decided: LockedDecision, principal: Principal, bundleID: String, context: some RequestContext
    ) async throws -> Response {
        switch decided {
        case .issued(let response):
            return response
        case .unsigned(let unsigned):
            do {
                _ = try await committer.commit(unsigned.record, within: storeTimeout)
            } catch {
                context.logger.error("eligibility decision not audited", metadata: ["error": "\(error)"])
                throw APIProblem.auditUnavailable
            }
            // A refusal's reasons tell the customer's subscription state: not to a client revoked
            // while the decision was committed (it stays audited: it was decided while the client
            // was allowed).
            try Self.checkClientStillAllowed(principal, bundleID: bundleID, ring: keyRing.ring)
            throw unsigned.problem
        }
    }

    /// Decides eligibility. A customer who does not qualify is refused: the decision's record and
    /// its 403 (`not_eligible` with the reasons) are returned, to be committed and answered by
    /// ``answer`` once the customer's lock is given back; for one who does, the decision's audit
    /// record is returned, to be committed with the signatures (one group commit, not two).
    private func checkEligibility(
        _ offer: OfferDefinition, request: SignatureRequest, bundleID: String, token: UUID?, principal: Principal,
        eligibility: EligibilityService, prefetched: PrefetchedAppleAnswer?, ring: KeyRing
    ) async throws -> EligibilityCheck {
        guard offer.productIDs.isEmpty || offer.productIDs.contains(request.productID) else {
            throw APIProblem.badRequest("product_not_in_offer", "offer '\(offer.offerID)' does not apply to product '\(request.productID)'")
        }
        let now = Date()
        guard
            let outcome = try await eligibility.decide(
                [offer], bundleID: bundleID, appAccountToken: token, evidence: request.evidence, transactionID: request.transactionID, ring: ring,
                now: now, prefetched: prefetched, strictAccountToken: principal.isUser
            ).first
        else {
            throw APIProblem(.internalServerError, code: "internal_error", detail: "no eligibility decision")
        }
        let decision = outcome.decision
        let entry = EligibilityService.auditEntry(
            outcome, bundleID: bundleID, productID: request.productID, appAccountToken: token, transactionID: request.transactionID,
            principal: principal.identity, at: now)
        if decision.eligible { return .eligible(AuditAppend(entry: entry), subscription: outcome.subscription) }
        var extensions = ["reasons": EligibilityService.reasonsJSON(decision.reasons)]
        if let source = outcome.source { extensions["historySource"] = JSONObjectWriter.quoted(source.rawValue) }
        if let eligibleFrom = decision.eligibleFrom { extensions["eligibleFrom"] = JSONObjectWriter.quoted(Date.rfc3339(milliseconds: eligibleFrom.unixMilliseconds)) }
        if !decision.evidenceFailures.isEmpty { extensions["evidenceFailures"] = EligibilityService.evidenceFailuresJSON(decision.evidenceFailures) }
        let reasons = decision.reasons.map(\.rawValue).joined(separator: ", ")
        var detail = "the customer is not eligible for '\(offer.offerID)': \(reasons)"
        if let failure = decision.evidenceFailures.first { detail += " (\(failure))" }
        let problem = APIProblem(.forbidden, code: "not_eligible", detail: detail, extensions: extensions)
        return .refused(UnsignedDecision(record: AuditAppend(entry: entry), problem: problem))
    }

    /// What ``checkEligibility`` decided.
    enum EligibilityCheck: Sendable {
        /// Eligible: the decision's record, to be committed with the signatures.
        case eligible(AuditAppend, subscription: ProvenSubscription?)
        case refused(UnsignedDecision)
    }

    static func formats(_ requested: [String]?) throws(APIProblem) -> [SignatureFormat] {
        guard let requested else { return [.legacy] }
        guard !requested.isEmpty else {
            throw APIProblem.badRequest("unknown_format", "formats is empty; ask for \"legacy\", \"jws\" or both, or \"intro-eligibility\" alone")
        }
        var formats: [SignatureFormat] = []
        for name in requested {
            guard let format = SignatureFormat(rawValue: name) else {
                throw APIProblem.badRequest("unknown_format", "unknown format '\(name)'; the service signs \"legacy\", \"jws\" and \"intro-eligibility\"")
            }
            if !formats.contains(format) { formats.append(format) }
        }
        if formats.contains(.introEligibility) && formats.count > 1 {
            throw APIProblem.badRequest("unknown_format", "\"intro-eligibility\" is signed alone; ask for it in a request of its own")
        }
        return formats
    }

    /// Apple's introductory-offer eligibility signature names a customer's transaction and the
    /// decision (https://developer.apple.com/documentation/storekit/generating-jws-to-sign-app-store-requests,
    /// "Include custom claims for introductory offer eligibility"); only the app's backend (an API
    /// client) may ask for one, since it overrides Apple's own decision for the customer.
    static func checkIntroductoryOfferEligibility(
        _ request: SignatureRequest, formats: [SignatureFormat], principal: Principal
    ) throws(APIProblem) {
        guard formats == [.introEligibility] else {
            if request.allowIntroductoryOffer != nil {
                throw APIProblem.badRequest("bad_request", "allowIntroductoryOffer applies to formats [\"intro-eligibility\"] only")
            }
            return
        }
        if case .user = principal {
            throw APIProblem(.forbidden, code: "intro_eligibility_not_allowed", detail: "an introductory-offer eligibility is signed for API clients only, not for a user token")
        }
        guard request.allowIntroductoryOffer != nil else {
            throw APIProblem.badRequest("missing_field", "allowIntroductoryOffer is required with \"intro-eligibility\"")
        }
        guard request.transactionID != nil else {
            throw APIProblem.badRequest("missing_field", "transactionID is required with \"intro-eligibility\" (any of the customer's transaction IDs, or the appTransactionID)")
        }
    }

    /// An API client limited to some bundles may sign (or ask) only for those (403
    /// `bundle_not_allowed`).
    static func checkBundleAllowed(_ client: APIClientRecord, bundleID: String, action: String = "sign for") throws(APIProblem) {
        if !client.bundleIDs.isEmpty, !client.bundleIDs.contains(bundleID) {
            throw APIProblem(.forbidden, code: "bundle_not_allowed", detail: "this API client may not \(action) '\(bundleID)'")
        }
    }

    /// Rule: a request's API client is authenticated when the request begins, and checked again
    /// in `ring` (the key ring as it is now) before anything is decided, signed or answered for
    /// it. A client revoked, or narrowed to other bundles, while its request was under way (a
    /// slow body, Apple's API, a customer lock) gets what a fresh request would: 401
    /// `unauthorized` or 403 `bundle_not_allowed`. End users' tokens are not in the ring.
    static func checkClientStillAllowed(
        _ principal: Principal, bundleID: String, ring: KeyRing, action: String = "sign for"
    ) throws(APIProblem) {
        guard case .client(let client) = principal else { return }
        guard let current = ring.clients[client.clientID] else {
            throw APIProblem.unauthorized("unknown or revoked API key")
        }
        try checkBundleAllowed(current, bundleID: bundleID, action: action)
    }

    static func bundle(_ requested: String?, ring: KeyRing) throws(APIProblem) -> String {
        if let requested {
            guard ring.configuredBundles.contains(requested) else {
                throw APIProblem.badRequest("unknown_bundle", "'\(requested)' is not an app this service signs for")
            }
            return requested
        }
        guard ring.configuredBundles.count == 1, let only = ring.configuredBundles.first else {
            if ring.configuredBundles.isEmpty {
                throw APIProblem(.serviceUnavailable, code: "no_active_key", detail: "no signing key is configured; import one with `offer-signer keys import`")
            }
            throw APIProblem.badRequest("bundle_required", "this service signs for several apps; say which with bundleID")
        }
        return only
    }
}

/// Reads request bodies with a size limit and a content-type check.
enum RequestBodyReader {
    static func json(_ request: Request, limit: Int) async throws -> Data {
        let contentType = request.headers.value(of: .contentType) ?? ""
        guard contentType == "application/json" || Self.isJSON(mediaTypeOf: contentType) else {
            throw APIProblem(
                .unsupportedMediaType, code: "unsupported_media_type",
                detail: contentType.isEmpty ? "send the body as application/json" : "'\(contentType)' is not accepted; send application/json",
                headers: [.accept: "application/json"])
        }
        return try await body(request, limit: limit)
    }

    /// The body, whatever its `Content-Type` (Apple's endpoints: Apple does not document the
    /// header it sends, so none is required there).
    static func body(_ request: Request, limit: Int) async throws -> Data {
        if let length = request.headers.value(of: .contentLength).flatMap(Int.init), length > limit {
            throw APIProblem(.contentTooLarge, code: "body_too_large", detail: "the body is \(length) bytes; at most \(limit) are accepted")
        }
        do {
            let buffer = try await request.body.collect(upTo: limit)
            return Data(buffer.readableBytesView)
        } catch is NIOTooManyBytesError {
            throw APIProblem(.contentTooLarge, code: "body_too_large", detail: "the body is larger than \(limit) bytes")
        } catch {
            // The body stopped before its end: the client closed the connection, or the server
            // did because the request was not complete within the idle timeout. The client's
            // failure, not the service's (no 500, no error log); usually no one is left to read it.
            throw APIProblem(.badRequest, code: "body_incomplete", detail: "the request body did not arrive completely: the connection closed before its end")
        }
    }

    /// The body, read within `deadline` (the unauthenticated Apple endpoints, before their
    /// gate: a client that sends its body slowly holds a connection, never a gate's place);
    /// past it, 400 `body_incomplete` and the connection is closed.
    static func body(_ request: Request, limit: Int, deadline: Duration) async throws -> Data {
        let result = await withTaskGroup(of: Result<Data, any Error>?.self) { group in
            group.addTask {
                do { return .success(try await body(request, limit: limit)) } catch { return .failure(error) }
            }
            group.addTask {
                try? await Task.sleep(for: deadline)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        guard let result else {
            throw APIProblem(
                .badRequest, code: "body_incomplete",
                detail: "the request body did not arrive completely within \(deadline.components.seconds) s", headers: [.connection: "close"])
        }
        return try result.get()
    }

    /// `application/json` or `application/*+json`, any case, parameters ignored.
    static func isJSON(mediaTypeOf contentType: String) -> Bool {
        let mediaType = contentType.lowercased().split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces) } ?? ""
        return mediaType == "application/json" || (mediaType.hasPrefix("application/") && mediaType.hasSuffix("+json"))
    }
}
