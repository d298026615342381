import Crypto
import Foundation

/// The signature formats offer-signer produces.
public enum SignatureFormat: String, Sendable, Codable, CaseIterable {
    /// The legacy tuple: keyID, nonce, timestamp, Base64 DER signature.
    case legacy
    /// A promotional-offer compact JWS.
    case jws
    /// An introductory-offer eligibility compact JWS.
    case introEligibility = "intro-eligibility"
}

/// A signed legacy promotional offer, as `offer-signer sign` prints it. Field names match
/// StoreKit's argument labels so a client maps them one to one.
public struct LegacySignatureDocument: Sendable, Equatable, Decodable {
    public var bundleID: String
    public var productID: String
    public var offerID: String
    /// Lowercase UUID, or nil when the signature is not bound to an account.
    public var appAccountToken: String?
    public var keyID: String
    public var nonce: String
    /// UNIX time in milliseconds.
    public var timestamp: Int64
    /// Standard Base64 of the DER signature.
    public var signature: String

    public init(bundleID: String, productID: String, offerID: String, appAccountToken: String?, keyID: String, nonce: String, timestamp: Int64, signature: String) {
        self.bundleID = bundleID
        self.productID = productID
        self.offerID = offerID
        self.appAccountToken = appAccountToken
        self.keyID = keyID
        self.nonce = nonce
        self.timestamp = timestamp
        self.signature = signature
    }

    /// Builds the document for a payload and its signature.
    public init(payload: PromotionalOfferPayload, signature: String) {
        self.init(
            bundleID: payload.bundleID, productID: payload.productID, offerID: payload.offerID,
            appAccountToken: payload.appAccountToken?.lowercasedString, keyID: payload.keyID,
            nonce: payload.nonce.lowercasedString, timestamp: payload.timestamp, signature: signature)
    }

    /// The validated payload the document claims was signed.
    public func payload() throws(OfferSignerError) -> PromotionalOfferPayload {
        try PromotionalOfferPayload(
            bundleID: bundleID, keyID: keyID, productID: productID, offerID: offerID,
            appAccountToken: appAccountToken ?? "", nonce: nonce, timestamp: timestamp)
    }

    enum CodingKeys: String, CodingKey {
        case format, bundleID, productID, offerID, appAccountToken, keyID, nonce, timestamp, signature
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            bundleID: try container.decode(String.self, forKey: .bundleID),
            productID: try container.decode(String.self, forKey: .productID),
            offerID: try container.decode(String.self, forKey: .offerID),
            appAccountToken: try container.decodeIfPresent(String.self, forKey: .appAccountToken),
            keyID: try container.decode(String.self, forKey: .keyID),
            nonce: try container.decode(String.self, forKey: .nonce),
            timestamp: try container.decode(Int64.self, forKey: .timestamp),
            signature: try container.decode(String.self, forKey: .signature))
    }

}

/// A signed promotional offer in compact-JWS form, as `offer-signer sign --format jws` prints it.
public struct PromotionalOfferJWSDocument: Sendable, Equatable, Decodable {
    public var bundleID: String
    public var productID: String
    public var offerID: String
    public var keyID: String
    public var transactionID: String?
    public var compactJWS: String

    public init(bundleID: String, productID: String, offerID: String, keyID: String, transactionID: String?, compactJWS: String) {
        self.bundleID = bundleID
        self.productID = productID
        self.offerID = offerID
        self.keyID = keyID
        self.transactionID = transactionID
        self.compactJWS = compactJWS
    }

    enum CodingKeys: String, CodingKey {
        case format, bundleID, productID, offerID, keyID, transactionID, compactJWS
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            bundleID: try container.decode(String.self, forKey: .bundleID),
            productID: try container.decode(String.self, forKey: .productID),
            offerID: try container.decode(String.self, forKey: .offerID),
            keyID: try container.decode(String.self, forKey: .keyID),
            transactionID: try container.decodeIfPresent(String.self, forKey: .transactionID),
            compactJWS: try container.decode(String.self, forKey: .compactJWS))
    }

}

/// A signed introductory-offer eligibility override, as `offer-signer sign --format
/// intro-eligibility` prints it.
public struct IntroductoryOfferEligibilityDocument: Sendable, Equatable, Decodable {
    public var bundleID: String
    public var productID: String
    public var keyID: String
    public var transactionID: String
    public var allowIntroductoryOffer: Bool
    public var compactJWS: String

    public init(bundleID: String, productID: String, keyID: String, transactionID: String, allowIntroductoryOffer: Bool, compactJWS: String) {
        self.bundleID = bundleID
        self.productID = productID
        self.keyID = keyID
        self.transactionID = transactionID
        self.allowIntroductoryOffer = allowIntroductoryOffer
        self.compactJWS = compactJWS
    }

    enum CodingKeys: String, CodingKey {
        case format, bundleID, productID, keyID, transactionID, allowIntroductoryOffer, compactJWS
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            bundleID: try container.decode(String.self, forKey: .bundleID),
            productID: try container.decode(String.self, forKey: .productID),
            keyID: try container.decode(String.self, forKey: .keyID),
            transactionID: try container.decode(String.self, forKey: .transactionID),
            allowIntroductoryOffer: try container.decode(Bool.self, forKey: .allowIntroductoryOffer),
            compactJWS: try container.decode(String.self, forKey: .compactJWS))
    }

}

/// Any of the signed objects `offer-signer sign` prints, told apart by their `format`.
public enum SignatureDocument: Sendable, Equatable {
    case legacy(LegacySignatureDocument)
    case jws(PromotionalOfferJWSDocument)
    case introductoryOfferEligibility(IntroductoryOfferEligibilityDocument)

    private struct FormatProbe: Decodable {
        var format: String
    }

    /// The document's format.
    public var format: SignatureFormat {
        switch self {
        case .legacy: return .legacy
        case .jws: return .jws
        case .introductoryOfferEligibility: return .introEligibility
        }
    }

    /// Decodes a document, with a message naming the missing or mistyped field.
    public static func decode(json: Data) throws(OfferSignerError) -> SignatureDocument {
        do {
            let format = try JSONDecoder().decode(FormatProbe.self, from: json).format
            switch SignatureFormat(rawValue: format) {
            case .legacy: return .legacy(try JSONDecoder().decode(LegacySignatureDocument.self, from: json))
            case .jws: return .jws(try JSONDecoder().decode(PromotionalOfferJWSDocument.self, from: json))
            case .introEligibility:
                return .introductoryOfferEligibility(try JSONDecoder().decode(IntroductoryOfferEligibilityDocument.self, from: json))
            case nil:
                let known = SignatureFormat.allCases.map(\.rawValue).joined(separator: ", ")
                throw OfferSignerError(code: .documentMalformed, field: "format", message: "unknown format '\(format)'; expected one of \(known)")
            }
        } catch let error as OfferSignerError {
            throw error
        } catch {
            throw OfferSignerError(code: .documentMalformed, message: DocumentDecoding.describe(error))
        }
    }

    /// Decodes either one document as `sign` prints it (with `format`), or a response of
    /// `POST /v1/offers/signatures`, which nests a `legacy` and/or a `jws` object, or an
    /// `introEligibility` one: each becomes a document.
    public static func decodeAll(json: Data) throws(OfferSignerError) -> [SignatureDocument] {
        struct ServiceResponse: Decodable {
            struct Legacy: Decodable {
                var keyID: String
                var nonce: String
                var timestamp: Int64
                var signature: String
            }
            struct JWS: Decodable {
                var keyID: String
                var compactJWS: String
            }
            struct IntroEligibility: Decodable {
                var keyID: String
                var compactJWS: String
                var transactionID: String
                var allowIntroductoryOffer: Bool
            }
            var format: String?
            var bundleID: String?
            var productID: String?
            var offerID: String?
            var appAccountToken: String?
            var legacy: Legacy?
            var jws: JWS?
            var introEligibility: IntroEligibility?
        }
        let response: ServiceResponse
        do {
            response = try JSONDecoder().decode(ServiceResponse.self, from: json)
        } catch {
            throw OfferSignerError(code: .documentMalformed, message: DocumentDecoding.describe(error))
        }
        guard response.format == nil, response.legacy != nil || response.jws != nil || response.introEligibility != nil else {
            return [try decode(json: json)]
        }
        if let intro = response.introEligibility, let bundleID = response.bundleID, let productID = response.productID {
            return [.introductoryOfferEligibility(IntroductoryOfferEligibilityDocument(
                bundleID: bundleID, productID: productID, keyID: intro.keyID, transactionID: intro.transactionID,
                allowIntroductoryOffer: intro.allowIntroductoryOffer, compactJWS: intro.compactJWS))]
        }
        guard let bundleID = response.bundleID, let productID = response.productID, let offerID = response.offerID else {
            throw OfferSignerError(code: .documentMalformed, message: "a service response needs bundleID, productID and offerID")
        }
        var documents: [SignatureDocument] = []
        if let legacy = response.legacy {
            documents.append(.legacy(LegacySignatureDocument(
                bundleID: bundleID, productID: productID, offerID: offerID, appAccountToken: response.appAccountToken,
                keyID: legacy.keyID, nonce: legacy.nonce, timestamp: legacy.timestamp, signature: legacy.signature)))
        }
        if let jws = response.jws {
            // The response does not repeat the transactionID; take it from the claims (the
            // signature over them is checked by `verify`).
            let claimsSegment = jws.compactJWS.split(separator: ".", omittingEmptySubsequences: false).dropFirst().first
            let claims = claimsSegment.flatMap(Encoding.decodeBase64URL).flatMap { try? JSONDecoder().decode(OfferJWSClaims.self, from: $0) }
            documents.append(.jws(PromotionalOfferJWSDocument(
                bundleID: bundleID, productID: productID, offerID: offerID, keyID: jws.keyID,
                transactionID: claims?.transactionId, compactJWS: jws.compactJWS)))
        }
        return documents
    }

    /// The document as one line of JSON, fields in StoreKit's order.
    public func jsonData() -> Data {
        var writer = JSONObjectWriter()
        switch self {
        case .legacy(let document):
            writer.field("format", SignatureFormat.legacy.rawValue)
            writer.field("bundleID", document.bundleID)
            writer.field("productID", document.productID)
            writer.field("offerID", document.offerID)
            writer.field("appAccountToken", document.appAccountToken)
            writer.field("keyID", document.keyID)
            writer.field("nonce", document.nonce)
            writer.field("timestamp", document.timestamp)
            writer.field("signature", document.signature)
        case .jws(let document):
            writer.field("format", SignatureFormat.jws.rawValue)
            writer.field("bundleID", document.bundleID)
            writer.field("productID", document.productID)
            writer.field("offerID", document.offerID)
            writer.field("keyID", document.keyID)
            writer.field("transactionID", document.transactionID)
            writer.field("compactJWS", document.compactJWS)
        case .introductoryOfferEligibility(let document):
            writer.field("format", SignatureFormat.introEligibility.rawValue)
            writer.field("bundleID", document.bundleID)
            writer.field("productID", document.productID)
            writer.field("keyID", document.keyID)
            writer.field("transactionID", document.transactionID)
            writer.field("allowIntroductoryOffer", document.allowIntroductoryOffer)
            writer.field("compactJWS", document.compactJWS)
        }
        return Data(writer.finish().utf8)
    }

    /// Checks the document's signature with a public key, and that a JWS's claims say what
    /// the document's fields say.
    public func verify(with publicKey: P256.Signing.PublicKey) -> SignatureCheck {
        let verifier = PromotionalOfferVerifier(publicKey: publicKey)
        switch self {
        case .legacy(let document):
            let payload: PromotionalOfferPayload
            do {
                payload = try document.payload()
            } catch {
                return .invalid(reason: error.message)
            }
            return verifier.verifyLegacy(payload: payload, signature: document.signature)
        case .jws(let document):
            let header: OfferJWSHeader, claims: OfferJWSClaims
            switch verifier.verifyJWS(document.compactJWS, audience: .promotionalOffer) {
            case .invalid(let reason): return .invalid(reason: reason)
            case .valid(let validHeader, let validClaims): (header, claims) = (validHeader, validClaims)
            }
            return Self.compare([
                ClaimComparison(claim: "kid", field: "keyID", claimValue: header.kid, fieldValue: document.keyID),
                ClaimComparison(claim: "bid", field: "bundleID", claimValue: claims.bid, fieldValue: document.bundleID),
                ClaimComparison(claim: "productId", field: "productID", claimValue: claims.productId, fieldValue: document.productID),
                ClaimComparison(claim: "offerIdentifier", field: "offerID", claimValue: claims.offerIdentifier, fieldValue: document.offerID),
                ClaimComparison(claim: "transactionId", field: "transactionID", claimValue: claims.transactionId, fieldValue: document.transactionID),
            ])
        case .introductoryOfferEligibility(let document):
            let header: OfferJWSHeader, claims: OfferJWSClaims
            switch verifier.verifyJWS(document.compactJWS, audience: .introductoryOfferEligibility) {
            case .invalid(let reason): return .invalid(reason: reason)
            case .valid(let validHeader, let validClaims): (header, claims) = (validHeader, validClaims)
            }
            return Self.compare([
                ClaimComparison(claim: "kid", field: "keyID", claimValue: header.kid, fieldValue: document.keyID),
                ClaimComparison(claim: "bid", field: "bundleID", claimValue: claims.bid, fieldValue: document.bundleID),
                ClaimComparison(claim: "productId", field: "productID", claimValue: claims.productId, fieldValue: document.productID),
                ClaimComparison(claim: "transactionId", field: "transactionID", claimValue: claims.transactionId, fieldValue: document.transactionID),
                ClaimComparison(
                    claim: "allowIntroductoryOffer", field: "allowIntroductoryOffer",
                    claimValue: claims.allowIntroductoryOffer.map { String($0) }, fieldValue: String(document.allowIntroductoryOffer)),
            ])
        }
    }

    private struct ClaimComparison {
        var claim: String
        var field: String
        var claimValue: String?
        var fieldValue: String?
    }

    private static func compare(_ comparisons: [ClaimComparison]) -> SignatureCheck {
        for comparison in comparisons where comparison.claimValue != comparison.fieldValue {
            func show(_ value: String?) -> String { value.map { "'\($0)'" } ?? "absent" }
            return .invalid(reason: "JWS \(comparison.claim) is \(show(comparison.claimValue)) but \(comparison.field) is \(show(comparison.fieldValue))")
        }
        return .valid
    }
}
/// Turns `DecodingError`s into one-line messages that name the field.
public enum DocumentDecoding {
    public static func describe(_ error: any Error) -> String {
        guard let decodingError = error as? DecodingError else { return "\(error)" }
        func path(_ context: DecodingError.Context, appending key: (any CodingKey)? = nil) -> String {
            let keys = context.codingPath + (key.map { [$0] } ?? [])
            return keys.map { $0.intValue.map { "[\($0)]" } ?? $0.stringValue }.joined(separator: ".")
        }
        switch decodingError {
        case .keyNotFound(let key, let context):
            return "missing field '\(path(context, appending: key))'"
        case .typeMismatch(_, let context) where context.codingPath.isEmpty:
            return "input is not a JSON object"
        case .typeMismatch(let type, let context):
            return "field '\(path(context))' has the wrong type; expected \(jsonTypeName(type))"
        case .valueNotFound(let type, let context):
            return "field '\(path(context))' is null; expected \(jsonTypeName(type))"
        case .dataCorrupted(let context):
            if context.codingPath.isEmpty { return "input is not valid JSON" }
            return "field '\(path(context))' is invalid: \(context.debugDescription)"
        @unknown default:
            return "input could not be decoded"
        }
    }

    static func jsonTypeName(_ type: Any.Type) -> String {
        switch type {
        case is String.Type: return "a string"
        case is Bool.Type: return "a boolean"
        case is Int.Type, is Int64.Type, is Int32.Type, is UInt64.Type, is Double.Type: return "a number"
        case is [Any].Type: return "an array"
        default:
            let name = "\(type)"
            if name.hasPrefix("Array") { return "an array" }
            if name.hasPrefix("Dictionary") { return "an object" }
            return "an object"
        }
    }
}
