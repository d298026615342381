import Foundation
import OfferSignerCore

/// The body of `POST /v1/offers/signatures`.
///
/// Rule: unknown members are refused (`unknown_field`), so a misspelt `appAccountToken` can
/// never silently produce a signature that is not bound to the account.
struct SignatureRequest: Decodable, Equatable, Sendable {
    var productID: String
    var offerID: String
    var appAccountToken: String?
    var bundleID: String?
    var formats: [String]?
    var transactionID: String?
    var evidence: PurchaseEvidence?
    /// With `formats: ["intro-eligibility"]` only: the decision the signature carries.
    var allowIntroductoryOffer: Bool?
    /// The App Store environment the client declares its customer is in, spelt as Apple's Python
    /// library `appstoreserverlibrary/models/Environment.py` spells its four values: `Production`,
    /// `Sandbox`, `Xcode`, `LocalTesting` (the last "used for unit testing" there; the App Store
    /// Server API's `environment` names only sandbox and production). The app reads StoreKit's
    /// `AppStore.Environment` (`.production`, `.sandbox`, `.xcode`) from
    /// `AppTransaction.environment` and maps it.
    /// Not verified: stored on the issuance marked declared (Apple's spelling), where it only
    /// orders the issuances a redemption may match (the same environment first) and never keeps
    /// one from matching (see `IssuanceEnvironmentSchema`); an environment proved by Apple-signed
    /// history or evidence takes its place, and is strict.
    var environment: String?

    static let members: Set<String> = [
        "productID", "offerID", "appAccountToken", "bundleID", "formats", "transactionID", "evidence", "allowIntroductoryOffer", "environment",
    ]

    enum CodingKeys: String, CodingKey {
        case productID, offerID, appAccountToken, bundleID, formats, transactionID, evidence, allowIntroductoryOffer, environment
    }

    init(
        productID: String, offerID: String, appAccountToken: String? = nil, bundleID: String? = nil, formats: [String]? = nil,
        transactionID: String? = nil, evidence: PurchaseEvidence? = nil, allowIntroductoryOffer: Bool? = nil, environment: String? = nil
    ) {
        self.environment = environment
        self.productID = productID
        self.offerID = offerID
        self.appAccountToken = appAccountToken
        self.bundleID = bundleID
        self.formats = formats
        self.transactionID = transactionID
        self.evidence = evidence
        self.allowIntroductoryOffer = allowIntroductoryOffer
    }

    init(from decoder: any Decoder) throws {
        try UnknownMember.check(decoder, allowed: Self.members)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        productID = try container.decode(String.self, forKey: .productID)
        offerID = try container.decode(String.self, forKey: .offerID)
        appAccountToken = try container.decodeIfPresent(String.self, forKey: .appAccountToken)
        bundleID = try container.decodeIfPresent(String.self, forKey: .bundleID)
        formats = try container.decodeIfPresent([String].self, forKey: .formats)
        transactionID = try container.decodeIfPresent(String.self, forKey: .transactionID)
        evidence = try container.decodeIfPresent(PurchaseEvidence.self, forKey: .evidence)
        allowIntroductoryOffer = try container.decodeIfPresent(Bool.self, forKey: .allowIntroductoryOffer)
        environment = try container.decodeIfPresent(String.self, forKey: .environment)
    }
}

/// What StoreKit gives the app as proof of the customer's history: JWS strings signed by
/// Apple.
struct PurchaseEvidence: Decodable, Equatable, Sendable {
    var signedTransactions: [String]
    var signedRenewalInfos: [String]

    static let members: Set<String> = ["signedTransactions", "signedRenewalInfos"]

    enum CodingKeys: String, CodingKey {
        case signedTransactions, signedRenewalInfos
    }

    init(from decoder: any Decoder) throws {
        try UnknownMember.check(decoder, allowed: Self.members)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        signedTransactions = try container.decodeIfPresent([String].self, forKey: .signedTransactions) ?? []
        signedRenewalInfos = try container.decodeIfPresent([String].self, forKey: .signedRenewalInfos) ?? []
    }
}

/// Thrown while decoding when a JSON object has a member the API does not define.
struct UnknownMember: Error {
    var path: String

    private struct AnyKey: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    static func check(_ decoder: any Decoder, allowed: Set<String>) throws {
        let container = try decoder.container(keyedBy: AnyKey.self)
        for key in container.allKeys where !allowed.contains(key.stringValue) {
            let prefix = decoder.codingPath.map(\.stringValue).joined(separator: ".")
            throw UnknownMember(path: prefix.isEmpty ? key.stringValue : "\(prefix).\(key.stringValue)")
        }
    }
}

enum RequestDecoding {
    /// Decodes a JSON body, turning every failure into a 400 problem that names the member.
    /// A member named twice in one object is refused (`duplicate_field`, with `field`), never
    /// resolved by picking one of its values (see `JSONDuplicateMembers`).
    static func decode<T: Decodable>(_ type: T.Type, from data: Data) throws(APIProblem) -> T {
        if let duplicate = JSONDuplicateMembers.first(in: data) {
            var problem = APIProblem.badRequest("duplicate_field", "member '\(duplicate)' appears more than once; send each member once")
            problem.extensions["field"] = JSONObjectWriter.quoted(duplicate)
            throw problem
        }
        do {
            return try JSONDecoder().decode(type, from: data)
        } catch let unknown as UnknownMember {
            throw APIProblem.badRequest("unknown_field", "unknown member '\(unknown.path)'")
        } catch let error as DecodingError {
            switch error {
            case .keyNotFound:
                throw APIProblem.badRequest("missing_field", DocumentDecoding.describe(error))
            case .typeMismatch(_, let context) where context.codingPath.isEmpty:
                throw APIProblem.badRequest("malformed_json", "the body must be a JSON object")
            case .typeMismatch, .valueNotFound:
                throw APIProblem.badRequest("wrong_type", DocumentDecoding.describe(error))
            case .dataCorrupted(let context) where context.codingPath.isEmpty:
                throw APIProblem.badRequest("malformed_json", "the body is not valid JSON")
            default:
                throw APIProblem.badRequest("malformed_json", DocumentDecoding.describe(error))
            }
        } catch {
            throw APIProblem.badRequest("malformed_json", "the body is not valid JSON")
        }
    }
}
