import Crypto
import Foundation

/// Signs promotional offers with an In-App Purchase key.
///
/// Rules: legacy signatures are ECDSA P-256 over SHA-256 of the payload's UTF-8 bytes,
/// DER-encoded, in standard Base64; JWS signatures are ES256 over `header.claims`, raw
/// r‖s (64 bytes), base64url without padding. ECDSA is randomised: the same input never
/// gives the same bytes twice.
public struct PromotionalOfferSigner: Sendable {
    public let key: InAppPurchaseKey

    public init(key: InAppPurchaseKey) {
        self.key = key
    }

    /// The legacy signature (standard Base64 of a DER ECDSA signature) for a payload.
    /// Refuses a payload whose key ID is not this key's.
    public func legacySignature(for payload: PromotionalOfferPayload) throws(OfferSignerError) -> String {
        guard payload.keyID == key.keyID else {
            throw OfferSignerError(code: .keyIDMismatch, field: "keyID", message: "payload names key ID '\(payload.keyID)' but the signing key is '\(key.keyID)'")
        }
        do {
            // SHA-256 of the signed string's UTF-8, hashed in place, then signed as a digest:
            // what `signature(for: Data)` does, without copying the string into `Data` and
            // without the unspecialised `DataProtocol` walk (about 2,000 instructions a signature).
            var signedString = payload.signedString
            let digest = signedString.withUTF8 { utf8 in
                var hasher = SHA256()
                hasher.update(bufferPointer: UnsafeRawBufferPointer(utf8))
                return hasher.finalize()
            }
            return try key.privateKey.signature(for: digest).derRepresentation.base64EncodedString()
        } catch {
            // BoringSSL signing fails only on memory exhaustion; never silently return nothing.
            preconditionFailure("ECDSA P-256 signing failed: \(error)")
        }
    }

    /// A compact JWS (`header.claims.signature`) of the claims, with this key's ID as `kid`.
    public func compactJWS(for claims: OfferJWSClaims) -> String {
        let signingInput = Encoding.base64URL(Data(OfferJWSHeader(keyID: key.keyID).json.utf8)) + "." + Encoding.base64URL(Data(claims.json.utf8))
        do {
            let signature = try key.privateKey.signature(for: Data(signingInput.utf8))
            return signingInput + "." + Encoding.base64URL(signature.rawRepresentation)
        } catch {
            preconditionFailure("ECDSA P-256 signing failed: \(error)")
        }
    }
}

/// The outcome of checking a signature. An invalid signature is an expected result, not
/// an error: it carries a one-line reason.
public enum SignatureCheck: Sendable, Equatable {
    case valid
    case invalid(reason: String)

    public var isValid: Bool { self == .valid }
}

/// The outcome of checking a compact JWS: on success, the decoded header and claims.
public enum JWSCheck: Sendable, Equatable {
    case valid(header: OfferJWSHeader, claims: OfferJWSClaims)
    case invalid(reason: String)
}

/// Checks promotional-offer signatures against a public key.
public struct PromotionalOfferVerifier: Sendable {
    public let publicKey: P256.Signing.PublicKey

    public init(publicKey: P256.Signing.PublicKey) {
        self.publicKey = publicKey
    }

    /// Checks a legacy signature: standard Base64 of a DER ECDSA P-256/SHA-256 signature
    /// over the payload's signed bytes.
    public func verifyLegacy(payload: PromotionalOfferPayload, signature: String) -> SignatureCheck {
        guard let bytes = Encoding.decodeBase64(signature) else {
            return .invalid(reason: "signature is not standard Base64")
        }
        guard let ecdsa = try? P256.Signing.ECDSASignature(derRepresentation: bytes) else {
            return .invalid(reason: "signature is not a DER-encoded ECDSA signature (\(bytes.count) bytes)")
        }
        guard publicKey.isValidSignature(ecdsa, for: payload.signedBytes) else {
            return .invalid(reason: "signature does not match the payload and key")
        }
        return .valid
    }

    /// Checks a compact JWS: `alg` must be ES256 (`none` and every other algorithm are
    /// refused), the signature raw r‖s in base64url, and the claims must carry what the
    /// expected audience requires.
    public func verifyJWS(_ compactJWS: String, audience: OfferJWSAudience) -> JWSCheck {
        let parts = compactJWS.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            return .invalid(reason: "compactJWS has \(parts.count) segments; expected 3 (header.claims.signature)")
        }
        guard let headerData = Encoding.decodeBase64URL(parts[0]) else { return .invalid(reason: "JWS header is not base64url") }
        guard let header = try? JSONDecoder().decode(OfferJWSHeader.self, from: headerData) else {
            return .invalid(reason: "JWS header is not a JSON object with alg and kid")
        }
        guard header.alg == "ES256" else { return .invalid(reason: "JWS alg is '\(header.alg)'; only ES256 is accepted") }
        guard let signatureBytes = Encoding.decodeBase64URL(parts[2]) else { return .invalid(reason: "JWS signature is not base64url") }
        guard signatureBytes.count == 64, let signature = try? P256.Signing.ECDSASignature(rawRepresentation: signatureBytes) else {
            return .invalid(reason: "JWS signature is \(signatureBytes.count) bytes; ES256 wants 64 raw bytes (r‖s), not DER")
        }
        let signingInput = Data(compactJWS.utf8.prefix(parts[0].utf8.count + 1 + parts[1].utf8.count))
        guard publicKey.isValidSignature(signature, for: signingInput) else {
            return .invalid(reason: "JWS signature does not match its header, claims and the key")
        }
        guard let claimsData = Encoding.decodeBase64URL(parts[1]) else { return .invalid(reason: "JWS claims are not base64url") }
        let claims: OfferJWSClaims
        do {
            claims = try JSONDecoder().decode(OfferJWSClaims.self, from: claimsData)
        } catch {
            return .invalid(reason: "JWS claims are incomplete: \(DocumentDecoding.describe(error))")
        }
        if let problem = claims.problem(expecting: audience) { return .invalid(reason: problem) }
        return .valid(header: header, claims: claims)
    }
}
