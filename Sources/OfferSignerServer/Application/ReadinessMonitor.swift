import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Logging
import OfferSignerCore
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Whether this instance can sign, as `GET /readyz` answers it.
///
/// Ready means: the store answers within `timeout` and accepts writes, audit commits are getting
/// through (after a failed one, until a commit or the committer's write test succeeds again), and
/// every configured app has a usable active key, so a load balancer takes an instance that cannot
/// sign out of rotation.
///
/// Rules:
/// - The store is checked in the background every `interval` (by the service lifecycle), never
///   per request: a flood of `/readyz` takes no store connection and delays no audit commit. Audit
///   health and keys are read from memory at each request.
/// - An unauthenticated caller gets the status alone: 200 `{"status":"ready"}`, or 503 `not_ready`
///   whose detail names nothing (no database message, host, path or bundle ID).
/// - The details go to the log when they change, and to `GET /readyz?detail` with
///   `Authorization: Bearer <operator token>` (`--operator-token-file`); without a configured
///   operator token the detailed form is refused (401).
final class ReadinessMonitor: Service, Sendable {
    private struct StoreCheck {
        var problem: String?
        var checkedAt: Date
    }

    let store: any OfferSignerStore
    let keyRing: KeyRingHolder
    let auditHealth: AuditCommitHealth
    /// Why the audit checkpointer refuses to sign, if it does (``AuditCheckpointer/refusal``):
    /// an operator's detail; signing goes on, so the instance stays ready.
    let checkpointRefusal: @Sendable () -> String?
    let timeout: Duration
    let interval: Duration
    let operatorToken: OperatorToken?
    let logger: Logger
    /// Told the outcome of each check (true: ready), for `offer_signer_ready`.
    let onCheck: @Sendable (Bool) -> Void
    private let storeCheck = Mutex<StoreCheck?>(nil)
    private let lastLogged = Mutex<[String]?>(nil)

    init(
        store: any OfferSignerStore, keyRing: KeyRingHolder, auditHealth: AuditCommitHealth,
        checkpointRefusal: @escaping @Sendable () -> String? = { nil }, timeout: Duration, interval: Duration,
        operatorToken: OperatorToken?, logger: Logger, onCheck: @escaping @Sendable (Bool) -> Void = { _ in }
    ) {
        self.onCheck = onCheck
        self.store = store
        self.keyRing = keyRing
        self.auditHealth = auditHealth
        self.checkpointRefusal = checkpointRefusal
        self.timeout = timeout
        self.interval = interval
        self.operatorToken = operatorToken
        self.logger = logger
    }

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            // Ends at once on graceful shutdown, not after the rest of the interval.
            do {
                try await cancelWhenGracefulShutdown { [interval] in try await Task.sleep(for: interval) }
            } catch {
                break
            }
            await refresh()
        }
    }

    /// Checks the store now and logs the state when it changed. While audit commits are failing
    /// the instance is not ready anyway and the committer tests the store itself: the check is
    /// left out then, so an outage does not get one more connection attempt a second (measured:
    /// it delayed PostgreSQL's recovery past 5 s in `PostgresInstancesTests`).
    func refresh() async {
        if auditHealth.failure != nil, storeCheck.withLock({ $0 != nil }) {
            logIfChanged()
            return
        }
        var problem: String?
        do {
            try await StoreDeadline.run("readiness check", timeout: timeout) { [store] in try await store.checkWritable() }
        } catch {
            problem = "store unreachable or read-only: \(error)"
        }
        storeCheck.withLock { $0 = StoreCheck(problem: problem, checkedAt: Date()) }
        logIfChanged()
    }

    private func logIfChanged() {
        let problems = self.problems(ring: keyRing.ring)
        onCheck(problems.isEmpty)
        let changed = lastLogged.withLock { last in
            guard last != problems else { return false }
            last = problems
            return true
        }
        guard changed else { return }
        if problems.isEmpty {
            logger.notice("ready", metadata: ["registry_version": "\(keyRing.ring.version)"])
        } else {
            logger.error("not ready", metadata: ["problems": "\(problems.joined(separator: "; "))"])
        }
    }

    /// What keeps this instance from signing (empty: ready).
    func problems(ring: KeyRing) -> [String] {
        var problems: [String] = []
        switch storeCheck.withLock({ $0 }) {
        case nil: problems.append("the store has not been checked yet")
        case let check?: if let problem = check.problem { problems.append(problem) }
        }
        if let failure = auditHealth.failure {
            problems.append("audit commits are failing: \(failure.summary)")
        }
        if ring.configuredBundles.isEmpty { problems.append("no signing key configured") }
        for bundle in ring.configuredBundles.sorted() where ring.activeKeys[bundle] == nil {
            problems.append("\(bundle) has no usable active key")
        }
        return problems
    }

    /// The answer to `GET /readyz` (see the type's rules).
    func response(_ request: Request) throws -> Response {
        let ring = keyRing.ring
        let problems = problems(ring: ring)
        guard Self.asksForDetail(request.uri.query) else {
            guard problems.isEmpty else {
                throw APIProblem(
                    .serviceUnavailable, code: "not_ready",
                    detail: "this instance cannot sign now; operators: see the server log, or GET /readyz?detail with the operator token")
            }
            return Response.json(#"{"status":"ready"}"#)
        }
        guard let operatorToken else {
            throw APIProblem.unauthorized("GET /readyz?detail needs Authorization: Bearer <operator token> (--operator-token-file)")
        }
        try operatorToken.admit(request, what: "GET /readyz?detail")
        // The operator's view: the same status, with every detail (as members of the problem
        // document when not ready). Registry rows refused because their MAC does not verify
        // (see KeyRing) and a checkpointer that refuses to sign (see AuditCheckpointer) are
        // details, not reasons to be unready: signing with the rows that verify goes on.
        var details: [String: String] = [
            "problems": "[" + problems.map(JSONObjectWriter.quoted).joined(separator: ",") + "]",
            "registryVersion": String(ring.version),
            "apps": String(ring.configuredBundles.count),
            "registryRowsRejected": String(ring.rejectedRows.count),
            "auditCheckpointRefused": checkpointRefusal() != nil ? "true" : "false",
        ]
        // A registry read refused for its manifest: the last verified ring keeps serving.
        let manifestProblem = keyRing.manifestProblem
        details["registryManifestVerified"] = manifestProblem == nil ? "true" : "false"
        if let manifestProblem { details["registryManifestProblem"] = JSONObjectWriter.quoted(manifestProblem) }
        if let checkedAt = storeCheck.withLock({ $0?.checkedAt }) {
            details["storeCheckedAt"] = JSONObjectWriter.quoted(Date.rfc3339(milliseconds: checkedAt.unixMilliseconds))
        }
        guard problems.isEmpty else {
            throw APIProblem(.serviceUnavailable, code: "not_ready", detail: problems.joined(separator: "; "), extensions: details)
        }
        var writer = JSONObjectWriter()
        writer.field("status", "ready")
        for (name, value) in details.sorted(by: { $0.key < $1.key }) { writer.field(name, json: value) }
        var headers = HTTPFields()
        headers[.contentType] = "application/json"
        headers[.cacheControl] = "no-store"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: writer.finish())))
    }

    /// `detail` among the query's parameters (`?detail`, `?detail=1`).
    static func asksForDetail(_ query: String?) -> Bool {
        guard let query, !query.isEmpty else { return false }
        return query.split(separator: "&").contains { $0 == "detail" || $0.hasPrefix("detail=") }
    }
}

/// The operator token (`--operator-token-file`): a bearer secret for operators' views that
/// callers must not see (`GET /readyz?detail`).
///
/// Rule: only its SHA-256 is kept; a presented token is hashed and compared in constant time.
/// Wrong tokens are counted per source address (``failureLimit``: 10 at once, then one a
/// second): beyond it, a wrong bearer from that address is answered 429 `rate_limited` instead
/// of 401 (a flood of wrong tokens stays out of the counts); a right token is compared first,
/// never counted nor refused, and other addresses are not affected. The limit therefore does not
/// slow an online guesser: the token's length (at least 32 characters) and randomness do. The
/// address is the connection's peer, set by `RequestDeadlineHandler` (a caller's own
/// `x-offer-signer-peer` header is always removed).
public struct OperatorToken: Sendable {
    private let digest: SHA256Digest
    private let failures = RateLimiter(limit: Self.failureLimit)
    /// Wrong tokens allowed per source address.
    static let failureLimit = RateLimit(perSecond: 1, burst: 10)
    /// The header the connection handler sets to the caller's address on the operator's paths
    /// (any such header the caller sent is removed first; see `RequestDeadlineHandler`).
    static let peerField = HTTPField.Name("x-offer-signer-peer")!

    /// Whether `path` is an operator view (or /admin) whose requests carry ``peerField``.
    /// Leading slashes are skipped first: Hummingbird's router ignores empty path segments, so
    /// `//metrics` reaches the same handler as `/metrics`.
    static func isOperatorPath(_ path: String) -> Bool {
        var rest = Substring(path)
        while rest.first == "/" { rest = rest.dropFirst() }
        return rest.hasPrefix("readyz") || rest.hasPrefix("metrics") || rest.hasPrefix("admin")
    }

    /// Admits a request carrying the operator token; throws 401 for a missing or wrong one
    /// (counted against its source address) and 429 for a wrong one when that address guessed
    /// too often. The right token is always admitted, also from a throttled address (it is at
    /// least 32 characters, so guesses compared beyond the limit cannot find it): a reverse
    /// proxy's address shared with a guesser does not lock the operator out.
    func admit(_ request: Request, what: String) throws(APIProblem) {
        let authorization = request.headers[.authorization]
        if matches(authorization: authorization) { return }
        if authorization != nil {
            let peer = request.headers[Self.peerField] ?? "unknown"
            if case .limited(let retryAfter) = failures.wouldAllow(peer) {
                throw APIProblem.rateLimited("too many wrong operator tokens from this address", retryAfter: retryAfter)
            }
            _ = failures.take(peer)
        }
        throw APIProblem.unauthorized("\(what) needs Authorization: Bearer <operator token> (--operator-token-file)")
    }

    /// At least 32 characters (the file's content without surrounding whitespace).
    public init(_ secret: String) throws(ServerConfigurationError) {
        guard secret.count >= 32 else { throw ServerConfigurationError("the operator token must be at least 32 characters (it is \(secret.count))") }
        digest = SHA256.hash(data: Data(secret.utf8))
    }

    /// Whether `secret` is this token (e.g. to refuse the same secret as the admin token).
    public func matches(secret: String) -> Bool {
        SHA256.hash(data: Data(secret.utf8)) == digest
    }

    func matches(authorization: String?) -> Bool {
        guard let authorization, authorization.count > 7, authorization.prefix(7).lowercased() == "bearer " else { return false }
        let presented = authorization.dropFirst(7).drop(while: { $0 == " " })
        return SHA256.hash(data: Data(presented.utf8)) == digest
    }
}
