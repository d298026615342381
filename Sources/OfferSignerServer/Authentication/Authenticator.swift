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
/// Rules: the header `alg` must be the one of the key that checks the signature: HS256 only with
/// the shared secret; ES256 or RS256 only with the JWKS key its `kid` names, whose own `alg` (or,
/// without one, key type: EC P-256 or RSA) it must match (without a `kid`, the JWKS must hold
/// exactly one key of that algorithm); `none` is always refused. A header or claims set that
/// names a member twice is refused (parsers disagree on which value counts). `iss` must equal the
/// configured issuer, `aud` must include the configured audience, `exp` is required and must be
/// in the future, and `nbf`, if present, in the past (each with the configured leeway).
struct UserJWTVerifier: Sendable {
    /// A JWKS key with the one algorithm it verifies, alone in its collection so that no token
    /// can be checked by another key (jwt-kit falls back to a default key for an unknown `kid`).
    struct PublicKey: Sendable {
        var algorithm: String
        var keys: JWTKeyCollection
    }

    /// JWKS keys by `kid`.
    let publicKeys: [String: PublicKey]
    /// The shared HS256 secret, alone in its collection.
    let sharedSecret: JWTKeyCollection?
    let configuration: UserJWTConfiguration

    init(configuration: UserJWTConfiguration) async throws {
        var publicKeys: [String: PublicKey] = [:]
        if let jwksJSON = configuration.jwksJSON {
            guard JSONDuplicateMembers.first(in: Data(jwksJSON.utf8)) == nil else { throw ServerConfigurationError("the JWKS names a member twice") }
            let jwks: JWKS
            do {
                jwks = try JSONDecoder().decode(JWKS.self, from: Data(jwksJSON.utf8))
            } catch {
                throw ServerConfigurationError("the JWKS is not a JSON Web Key Set: \(error)")
            }
            for jwk in jwks.keys {
                guard let kid = jwk.keyIdentifier?.string else { throw ServerConfigurationError("a JWKS key has no kid") }
                guard publicKeys[kid] == nil else { throw ServerConfigurationError("the JWKS has two keys with kid '\(kid)'") }
                let algorithm: String
                if jwk.keyType == .ecdsa, jwk.curve?.rawValue == "P-256", jwk.algorithm == nil || jwk.algorithm == .es256 {
                    algorithm = "ES256"
                } else if jwk.keyType == .rsa, jwk.algorithm == nil || jwk.algorithm == .rs256 {
                    algorithm = "RS256"
                } else {
                    throw ServerConfigurationError(
                        "JWKS key '\(kid)' (kty \(jwk.keyType.rawValue), alg \(jwk.algorithm?.rawValue ?? "none")) is not an ES256 (EC P-256) or RS256 (RSA) key")
                }
                let keys = JWTKeyCollection()
                do {
                    try await keys.add(jwk: jwk)
                } catch {
                    throw ServerConfigurationError("JWKS key '\(kid)' cannot be used: \(error)")
                }
                publicKeys[kid] = PublicKey(algorithm: algorithm, keys: keys)
            }
        }
        var sharedSecret: JWTKeyCollection?
        if let secret = configuration.hs256Secret {
            // jwt-kit checks the key's length only in debug builds (an assert).
            guard secret.utf8.count >= UserJWTConfiguration.minimumHS256SecretBytes else {
                throw ServerConfigurationError(
                    "the HS256 JWT secret is \(secret.utf8.count) bytes; at least \(UserJWTConfiguration.minimumHS256SecretBytes) are required (e.g. `openssl rand -base64 48`)")
            }
            let keys = JWTKeyCollection()
            await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
            sharedSecret = keys
        }
        guard !publicKeys.isEmpty || sharedSecret != nil else {
            throw ServerConfigurationError("end-user JWTs need a JWKS with at least one key or an HS256 secret")
        }
        self.publicKeys = publicKeys
        self.sharedSecret = sharedSecret
        self.configuration = configuration
    }

    enum Failure: Error {
        case invalid(String)
    }

    /// The key collection that may check a token with this header, or why there is none.
    func keys(algorithm: String, kid: String?) throws(Failure) -> JWTKeyCollection {
        switch algorithm {
        case _ where algorithm.lowercased() == "none":
            throw .invalid("JWT alg 'none' is refused")
        case "HS256":
            guard let sharedSecret else { throw .invalid("JWT alg 'HS256' is not accepted here") }
            return sharedSecret
        case "ES256", "RS256":
            if let kid {
                guard let key = publicKeys[kid] else { throw .invalid("JWT kid '\(kid)' is not a key of the JWKS") }
                guard key.algorithm == algorithm else { throw .invalid("JWT alg '\(algorithm)' does not match key '\(kid)' (\(key.algorithm))") }
                return key.keys
            }
            let candidates = publicKeys.values.filter { $0.algorithm == algorithm }
            guard candidates.count == 1, let only = candidates.first else {
                throw .invalid("JWT has no kid, and the JWKS has \(candidates.count) \(algorithm) keys")
            }
            return only.keys
        default:
            throw .invalid("JWT alg '\(algorithm)' is not accepted here")
        }
    }

    func verify(_ token: Substring, now: Date = Date()) async throws(Failure) -> Principal {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let headerData = Encoding.decodeBase64URL(parts[0]),
            let header = try? JSONSerialization.jsonObject(with: headerData) as? [String: Any],
            let algorithm = header["alg"] as? String
        else { throw .invalid("the bearer token is neither an API key nor a JWT") }
        guard JSONDuplicateMembers.first(in: headerData) == nil else { throw .invalid("the JWT header names a member twice") }
        if let claims = Encoding.decodeBase64URL(parts[1]), JSONDuplicateMembers.first(in: claims) != nil {
            throw .invalid("the JWT claims name a member twice")
        }
        let kid: String?
        switch header["kid"] {
        case nil: kid = nil
        case let value as String: kid = value
        default: throw .invalid("JWT kid is not a string")
        }
        let keys = try keys(algorithm: algorithm, kid: kid)
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
