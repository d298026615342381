import Crypto
import Foundation
import OfferSignerCore
import Synchronization

/// What authenticates the service to Apple for one app: the app's In-App Purchase key (the same
/// key type signs promotional offers) and the issuer ID of its App Store Connect team.
public struct AppStoreServerAPICredentials: Sendable {
    public var key: InAppPurchaseKey
    public var issuerID: String
    public var bundleID: String

    public init(key: InAppPurchaseKey, issuerID: String, bundleID: String) {
        self.key = key
        self.issuerID = issuerID
        self.bundleID = bundleID
    }
}

/// Makes the ES256 bearer tokens of the App Store Server API and reuses each until shortly before
/// it expires.
///
/// Rules (Apple's "Generating JSON Web Tokens for API requests",
/// https://developer.apple.com/documentation/appstoreserverapi/generating-json-web-tokens-for-api-requests):
/// header `alg` ES256, `kid` the key ID, `typ` JWT; claims `iss` the issuer ID, `iat` now, `exp`
/// `lifetime` later (never more than 60 minutes, Apple's maximum), `aud` `appstoreconnect-v1`,
/// `bid` the bundle ID; signed with the key (raw r‖s). A cached token is used only while more
/// than `renewBefore` of it is left; a key rotation gets a new token at once (the cache is keyed
/// by key ID, issuer and bundle).
///
/// Why a short-lived cache, when Apple's page says to generate a new token for each request:
/// Apple sets no one-use rule (no `jti`, no replay check it documents), so a new ES256 signature
/// per call (every page of a history, two calls at once) buys nothing Apple checks; the default
/// 5-minute lifetime is the one Apple's Python library gives its tokens (api_client.py
/// `_generate_token`), and bounds what a leaked token is good for.
public final class AppStoreServerAPITokenMaker: Sendable {
    public static let audience = "appstoreconnect-v1"
    private let lifetime: Duration
    private let renewBefore: Duration
    private let cache = Mutex([String: (token: String, expires: Date)]())

    public init(lifetime: Duration, renewBefore: Duration) {
        self.lifetime = min(lifetime, AppStoreServerAPIConfiguration.maximumTokenLifetime)
        self.renewBefore = renewBefore
    }

    /// A token for `credentials`, valid for at least `renewBefore` after `now`.
    public func token(for credentials: AppStoreServerAPICredentials, now: Date = Date()) -> String {
        let cacheKey = [credentials.key.keyID, credentials.issuerID, credentials.bundleID, credentials.key.publicKeyFingerprint].joined(separator: "\u{0}")
        let renewBy = now.addingTimeInterval(Self.seconds(renewBefore))
        if let cached = cache.withLock({ $0[cacheKey] }), cached.expires > renewBy {
            return cached.token
        }
        let issuedAt = Int64(now.timeIntervalSince1970.rounded(.down))
        let expiresAt = issuedAt + Int64(Self.seconds(lifetime).rounded(.down))
        let token = Self.makeToken(credentials: credentials, issuedAt: issuedAt, expiresAt: expiresAt)
        cache.withLock { $0[cacheKey] = (token, Date(timeIntervalSince1970: TimeInterval(expiresAt))) }
        return token
    }

    /// One signed token (no caching).
    public static func makeToken(credentials: AppStoreServerAPICredentials, issuedAt: Int64, expiresAt: Int64) -> String {
        var header = JSONObjectWriter()
        header.field("alg", "ES256")
        header.field("kid", credentials.key.keyID)
        header.field("typ", "JWT")
        var claims = JSONObjectWriter()
        claims.field("iss", credentials.issuerID)
        claims.field("iat", issuedAt)
        claims.field("exp", expiresAt)
        claims.field("aud", audience)
        claims.field("bid", credentials.bundleID)
        let signingInput = Encoding.base64URL(Data(header.finish().utf8)) + "." + Encoding.base64URL(Data(claims.finish().utf8))
        // ECDSA over P-256 with SHA-256 cannot fail for a valid key and any input.
        let signature = (try? credentials.key.privateKey.signature(for: Data(signingInput.utf8)))?.rawRepresentation ?? Data()
        return signingInput + "." + Encoding.base64URL(signature)
    }

    static func seconds(_ duration: Duration) -> Double {
        let (seconds, attoseconds) = duration.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
