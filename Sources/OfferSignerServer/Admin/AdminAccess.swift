import Crypto
import Foundation
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

/// Limits guesses at the admin token, over all callers together: a wrong token (in a login form
/// or a `Bearer` header) spends one of ``burst`` allowances, which come back at one per
/// ``refillSeconds``. While none is left, a presented token is not even compared (429 with
/// `Retry-After`); a valid session cookie still opens the pages, so a signed-in operator is not
/// locked out by someone guessing.
final class AdminGuessLimiter: Sendable {
    static let burst = 10.0
    static let refillSeconds = 6.0
    private let state = Mutex((allowance: AdminGuessLimiter.burst, updated: ContinuousClock.now))

    /// Seconds until a guess is allowed again, nil when one is allowed now.
    func retryAfter(now: ContinuousClock.Instant = .now) -> Int? {
        state.withLock { state in
            refill(&state, now: now)
            return state.allowance >= 1 ? nil : max(1, Int(((1 - state.allowance) * Self.refillSeconds).rounded(.up)))
        }
    }

    func recordFailure(now: ContinuousClock.Instant = .now) {
        state.withLock { state in
            refill(&state, now: now)
            state.allowance = max(0, state.allowance - 1)
        }
    }

    private func refill(_ state: inout (allowance: Double, updated: ContinuousClock.Instant), now: ContinuousClock.Instant) {
        let elapsed = now - state.updated
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        state.allowance = min(Self.burst, state.allowance + max(0, seconds) / Self.refillSeconds)
        state.updated = now
    }
}
