import Crypto
import Foundation
import JWTKit
import OfferSignerCore
import OfferSignerStorage

/// Who is asking for a signature.
enum Principal: Sendable {
    /// An app backend with an API key; it may sign for its bundles (all when empty).
    case client(APIClientRecord)
    /// An end user with a JWT from the app's auth server, bound to one appAccountToken.
    case user(subject: String, appAccountToken: UUID)
    /// `--dev` mode: no authentication.
    case development

    /// The rate-limit and audit identity.
    var identity: String {
        switch self {
        case .client(let client): return "client:\(client.name)"
        case .user(let subject, _): return "user:\(subject)"
        case .development: return "dev"
        }
    }
}

/// Claims read from an end user's JWT. Standard claims are checked by ``verify(using:)``;
/// string claims are kept so the configured appAccountToken claim can be read.
struct UserJWTPayload: JWTPayload {
    var iss: IssuerClaim?
    var aud: AudienceClaim?
    var exp: ExpirationClaim?
    var nbf: NotBeforeClaim?
    var sub: SubjectClaim?
    var stringClaims: [String: String]

    struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: AnyKey.self)
        iss = try container.decodeIfPresent(IssuerClaim.self, forKey: AnyKey(stringValue: "iss"))
        aud = try container.decodeIfPresent(AudienceClaim.self, forKey: AnyKey(stringValue: "aud"))
        exp = try container.decodeIfPresent(ExpirationClaim.self, forKey: AnyKey(stringValue: "exp"))
        nbf = try container.decodeIfPresent(NotBeforeClaim.self, forKey: AnyKey(stringValue: "nbf"))
        sub = try container.decodeIfPresent(SubjectClaim.self, forKey: AnyKey(stringValue: "sub"))
        var strings: [String: String] = [:]
        for key in container.allKeys {
            if let value = try? container.decode(String.self, forKey: key) { strings[key.stringValue] = value }
        }
        stringClaims = strings
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: AnyKey.self)
        for (name, value) in stringClaims { try container.encode(value, forKey: AnyKey(stringValue: name)) }
    }

    /// Signature checks happen before this; the claims are checked by ``UserJWTVerifier``,
    /// which knows the configured issuer, audience and leeway.
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Verifies end-user JWTs and derives the appAccountToken they are bound to.
///
/// Rules: the header `alg` must be one the configured keys use (ES256 or RS256 from the JWKS,
/// HS256 with the shared secret); `none` is always refused; `iss` must equal the configured
/// issuer, `aud` must include the configured audience, `exp` is required and must be in the
/// future, and `nbf`, if present, in the past (each with the configured leeway).
struct UserJWTVerifier: Sendable {
    let keys: JWTKeyCollection
    let configuration: UserJWTConfiguration
    let allowedAlgorithms: Set<String>

    init(configuration: UserJWTConfiguration) async throws {
        let keys = JWTKeyCollection()
        var algorithms: Set<String> = []
        if let jwks = configuration.jwksJSON {
            try await keys.add(jwksJSON: jwks)
            if jwks.contains("\"EC\"") { algorithms.insert("ES256") }
            if jwks.contains("\"RSA\"") { algorithms.insert("RS256") }
        }
        if let secret = configuration.hs256Secret {
            await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
            algorithms.insert("HS256")
        }
        self.keys = keys
        self.configuration = configuration
        self.allowedAlgorithms = algorithms
    }

    enum Failure: Error {
        case invalid(String)
    }

    func verify(_ token: Substring, now: Date = Date()) async throws(Failure) -> Principal {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Encoding.decodeBase64URL(parts[0]),
            let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            let algorithm = header["alg"] as? String
        else { throw .invalid("the bearer token is neither an API key nor a JWT") }
        guard algorithm.lowercased() != "none" else { throw .invalid("JWT alg 'none' is refused") }
        guard allowedAlgorithms.contains(algorithm) else { throw .invalid("JWT alg '\(algorithm)' is not accepted here") }
        let payload: UserJWTPayload
        do {
            payload = try await keys.verify(String(token), as: UserJWTPayload.self)
        } catch {
            throw .invalid("JWT signature does not verify")
        }
        guard payload.iss?.value == configuration.issuer else { throw .invalid("JWT iss is not the configured issuer") }
        guard payload.aud?.value.contains(configuration.audience) == true else { throw .invalid("JWT aud does not include '\(configuration.audience)'") }
        guard let expiration = payload.exp?.value else { throw .invalid("JWT has no exp") }
        guard expiration.timeIntervalSince(now) > -configuration.leewaySeconds else { throw .invalid("JWT expired") }
        if let notBefore = payload.nbf?.value, notBefore.timeIntervalSince(now) > configuration.leewaySeconds {
            throw .invalid("JWT is not valid yet (nbf)")
        }
        guard let subject = payload.sub?.value, !subject.isEmpty else { throw .invalid("JWT has no sub") }
        let token: UUID
        switch configuration.binding {
        case .claim(let name):
            guard let value = payload.stringClaims[name], let uuid = UUID.parse(value) else {
                throw .invalid("JWT claim '\(name)' is missing or not a UUID")
            }
            token = uuid
        case .subjectUUIDv5(let namespace):
            token = UUIDv5.make(namespace: namespace, name: subject)
        }
        return .user(subject: subject, appAccountToken: token)
    }
}

/// Name-based UUIDs, version 5 (SHA-1), RFC 9562 §5.5.
public enum UUIDv5 {
    public static func make(namespace: UUID, name: String) -> UUID {
        var hasher = Insecure.SHA1()
        withUnsafeBytes(of: namespace.uuid) { hasher.update(bufferPointer: $0) }
        hasher.update(data: Data(name.utf8))
        var bytes = Array(hasher.finalize().prefix(16))
        bytes[6] = (bytes[6] & 0x0F) | 0x50
        bytes[8] = (bytes[8] & 0x3F) | 0x80
        return UUID(uuid: (bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]))
    }
}
