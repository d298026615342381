import Crypto
import Foundation
import HTTPTypes
import Hummingbird
import Synchronization

/// The dashboard's credential (`serve --admin-token-file`), separate from the operator token.
///
/// Rules:
/// - At least 32 characters (as the operator token). Only its SHA-256 digest and a session key
///   derived from it (HKDF-SHA256) are kept in memory; the token itself is never stored,
///   logged, shown or put in a cookie.
/// - Scripts send `Authorization: Bearer <admin token>` on every request. Browsers sign in at
///   `POST /admin/login` and get a session cookie: `<expiry>.<nonce>.<HMAC-SHA256 over both under
///   the session key>`, verified by recomputing the MAC (no session table), valid for
///   ``sessionLifetime``. Changing the token invalidates every session. `POST /admin/logout`
///   clears the cookie and refuses its nonce on this instance until it expires.
public struct AdminToken: Sendable {
    private let digest: SHA256Digest
    private let sessionKey: SymmetricKey
    private let loggedOut = LoggedOutSessions()

    /// How long a browser session lasts.
    public static let sessionLifetime: TimeInterval = 8 * 3600
    /// The session cookie's name.
    static let cookieName = "offer_signer_admin"

    public init(_ secret: String) throws(ServerConfigurationError) {
        guard secret.count >= 32 else { throw ServerConfigurationError("the admin token must be at least 32 characters (it is \(secret.count))") }
        digest = SHA256.hash(data: Data(secret.utf8))
        sessionKey = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: Data(secret.utf8)), salt: Data("offer-signer admin session".utf8), info: Data("v1".utf8), outputByteCount: 32)
    }

    /// Whether `presented` is the token (compared by digest, so in constant time over the secret).
    func matches(token presented: String) -> Bool {
        SHA256.hash(data: Data(presented.utf8)) == digest
    }

    func matches(authorization: String?) -> Bool {
        guard let authorization, authorization.count > 7, authorization.prefix(7).lowercased() == "bearer " else { return false }
        return matches(token: String(authorization.dropFirst(7).drop(while: { $0 == " " })))
    }

    /// A new session value, valid until `now + sessionLifetime`.
    func newSession(now: Date) -> String {
        let expiry = Int64(now.timeIntervalSince1970 + Self.sessionLifetime)
        let nonce = SymmetricKey(size: .bits128).withUnsafeBytes { Data($0) }.base64URLEncoded
        let claims = "\(expiry).\(nonce)"
        return claims + "." + mac(claims)
    }

    /// Whether `session` is a value this token issued, not expired and not logged out.
    func verifies(session: String, now: Date) -> Bool {
        let parts = session.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let expiry = Int64(parts[0]), Double(expiry) > now.timeIntervalSince1970 else { return false }
        let claims = "\(parts[0]).\(parts[1])"
        guard let presented = Data(base64URLEncoded: String(parts[2])),
            HMAC<SHA256>.isValidAuthenticationCode(presented, authenticating: Data(claims.utf8), using: sessionKey)
        else { return false }
        return !loggedOut.contains(String(parts[1]), now: now)
    }

    /// Refuses `session` from now on (on this instance), until it would have expired anyway.
    func logOut(session: String, now: Date) {
        guard verifies(session: session, now: now) else { return }
        let parts = session.split(separator: ".")
        loggedOut.insert(String(parts[1]), until: Date(timeIntervalSince1970: Double(Int64(parts[0]) ?? 0)), now: now)
    }

    private func mac(_ claims: String) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Data(claims.utf8), using: sessionKey)).base64URLEncoded
    }

    /// The session cookie's value in a `Cookie` header, if any.
    static func sessionCookie(_ header: String?) -> String? {
        guard let header else { return nil }
        for pair in header.split(separator: ";") {
            let trimmed = pair.trimmingCharacters(in: .whitespaces)
            if trimmed.hasPrefix(cookieName + "=") { return String(trimmed.dropFirst(cookieName.count + 1)) }
        }
        return nil
    }
}

/// Nonces of logged-out sessions, kept until their sessions expire (at most 10,000: beyond it
/// the oldest go, which only means such a session works again until its expiry on this instance).
final class LoggedOutSessions: Sendable {
    private let nonces = Mutex([String: Date]())

    func insert(_ nonce: String, until expiry: Date, now: Date) {
        nonces.withLock { nonces in
            nonces = nonces.filter { $0.value > now }
            if nonces.count >= 10_000, let oldest = nonces.min(by: { $0.value < $1.value })?.key { nonces[oldest] = nil }
            nonces[nonce] = expiry
        }
    }

    func contains(_ nonce: String, now: Date) -> Bool {
        nonces.withLock { $0[nonce].map { $0 > now } ?? false }
    }
}

fileprivate extension Data {
    var base64URLEncoded: String {
        base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    init?(base64URLEncoded text: String) {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        self.init(base64Encoded: base64)
    }
}

/// Limits guesses at the admin token per source address (the connection's peer, which
/// `RequestDeadlineHandler` sets on /admin requests; a caller's own header is removed): a wrong
/// token (in a login form or a `Bearer` header) spends one of ``limit``'s 10 allowances, which
/// come back at one per 6 s. While an address has none left, its wrong tokens are answered 429
/// with `Retry-After`. The right token is always admitted (it is at least 32 characters, so
/// guesses beyond the limit cannot find it), and a valid session cookie opens the pages: neither
/// a guesser elsewhere nor one behind the same proxy locks the operator out.
enum AdminGuessLimit {
    static let limit = RateLimit(perSecond: 1.0 / 6.0, burst: 10)

    /// Counts a wrong token from `request`'s address; throws 429 when the address has none left.
    static func recordWrongToken(_ request: Request, in limiter: RateLimiter) throws(APIProblem) {
        let peer = request.headers[OperatorToken.peerField] ?? "unknown"
        if case .limited(let retryAfter) = limiter.take(peer) {
            throw APIProblem.rateLimited("too many wrong admin tokens from this address", retryAfter: retryAfter)
        }
    }
}

/// Refuses a cross-site `POST /admin/login` or `/admin/logout` (login CSRF: another site signing
/// a browser in, or spending its address's guesses; logout CSRF): 403 `cross_site_request` when
/// `Sec-Fetch-Site` is `cross-site`, or `Origin` is present and is not the request's own origin
/// (scheme aside: its host and port equal the request's `Host`). A request with neither header
/// (curl, an old browser) is let through: the session cookie is `SameSite=Strict` anyway.
enum AdminSameOrigin {
    static func check(_ request: Request) throws(APIProblem) {
        if request.headers[HTTPField.Name("Sec-Fetch-Site")!]?.lowercased() == "cross-site" {
            throw APIProblem(.forbidden, code: "cross_site_request", detail: "Sec-Fetch-Site is cross-site: /admin/login and /admin/logout take forms from the dashboard's own pages only")
        }
        guard let origin = request.headers[HTTPField.Name("Origin")!] else { return }
        let authority = origin.range(of: "://").map { origin[$0.upperBound...] }.map(String.init)
        guard let authority, let host = request.head.authority, authority.lowercased() == host.lowercased() else {
            throw APIProblem(.forbidden, code: "cross_site_request", detail: "Origin is not this server's own: /admin/login and /admin/logout take forms from the dashboard's own pages only")
        }
    }
}
