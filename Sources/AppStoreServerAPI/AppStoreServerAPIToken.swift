import Crypto
import Foundation
import OfferSignerCore

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

/// Makes the ES256 bearer tokens of the App Store Server API: a new one for every request.
///
/// Rules (Apple's "Generating JSON Web Tokens for API requests",
/// https://developer.apple.com/documentation/appstoreserverapi/generating-json-web-tokens-for-api-requests):
/// header `alg` ES256, `kid` the key ID, `typ` JWT; claims `iss` the issuer ID, `iat` now, `exp`
/// `lifetime` later (never more than 60 minutes, Apple's maximum), `aud` `appstoreconnect-v1`,
/// `bid` the bundle ID; signed with the key (raw r‖s). Apple's page says "Generate a new signed
/// JWT for each new request", and Apple's Python library does so (api_client.py `_get_headers`
/// calls `_generate_token()` on every request, each token living 5 minutes): no token is reused.
/// One ES256 signature per request is small next to the network call it authenticates.
public struct AppStoreServerAPITokenMaker: Sendable {
    public static let audience = "appstoreconnect-v1"
    private let lifetime: Duration

    public init(lifetime: Duration) {
        self.lifetime = min(lifetime, AppStoreServerAPIConfiguration.maximumTokenLifetime)
    }

    /// A new token for `credentials`, issued at `now`.
    public func token(for credentials: AppStoreServerAPICredentials, now: Date = Date()) -> String {
        let issuedAt = Int64(now.timeIntervalSince1970.rounded(.down))
        let expiresAt = issuedAt + Int64(Self.seconds(lifetime).rounded(.down))
        return Self.makeToken(credentials: credentials, issuedAt: issuedAt, expiresAt: expiresAt)
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
