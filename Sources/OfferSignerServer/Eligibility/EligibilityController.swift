import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerStorage

/// The body of `POST /v1/offers/eligibility`.
struct EligibilityRequest: Decodable, Sendable {
    var bundleID: String?
    var appAccountToken: String?
    var offerIDs: [String]?
    var evidence: PurchaseEvidence?
    /// Any of the customer's transaction IDs (e.g. `Transaction.originalID`): their handle at Apple,
    /// for offers whose `historySource` asks Apple.
    var transactionID: String?

    static let members: Set<String> = ["bundleID", "appAccountToken", "offerIDs", "evidence", "transactionID"]

    enum CodingKeys: String, CodingKey {
        case bundleID, appAccountToken, offerIDs, evidence, transactionID
    }

    init(from decoder: any Decoder) throws {
        try UnknownMember.check(decoder, allowed: Self.members)
        let container = try decoder.container(keyedBy: CodingKeys.self)
        bundleID = try container.decodeIfPresent(String.self, forKey: .bundleID)
        appAccountToken = try container.decodeIfPresent(String.self, forKey: .appAccountToken)
        offerIDs = try container.decodeIfPresent([String].self, forKey: .offerIDs)
        evidence = try container.decodeIfPresent(PurchaseEvidence.self, forKey: .evidence)
        transactionID = try container.decodeIfPresent(String.self, forKey: .transactionID)
    }
}

/// `POST /v1/offers/eligibility`: the per-offer decision and reasons, without signing.
///
/// Rules: the same authentication, rate limits, bundle resolution and appAccountToken binding
/// as signing; offers default to every catalog offer of the bundle; each offer is decided on
/// the history its `historySource` names (the app's `evidence`, Apple's history of the customer
/// named by `transactionID`, or Apple's then the app's); nothing is signed or recorded in the ledger.
struct EligibilityController: Sendable {
    let keyRing: KeyRingHolder
    let authenticator: RequestAuthenticator
    let eligibility: EligibilityService?
    let maximumBodyBytes: Int
    /// Per appAccountToken, with the signing limit's settings but a budget of its own, so asking
    /// about eligibility does not spend the customer's signatures.
    let tokenLimiter: RateLimiter

    func decide(_ request: Request, context: some RequestContext) async throws -> Response {
        let ring = keyRing.ring
        let principal = try await authenticator.authenticate(request, ring: ring)
        let body = try await RequestBodyReader.json(request, limit: maximumBodyBytes)
        let eligibilityRequest = try RequestDecoding.decode(EligibilityRequest.self, from: body)
        if let transactionID = eligibilityRequest.transactionID {
            do {
                try OfferFieldValidator.validateIdentifier(transactionID, field: "transactionID")
            } catch {
                throw APIProblem.field(error)
            }
        }
        var token = try AppAccountTokenField.parse(eligibilityRequest.appAccountToken)
        let bundleID = try SigningController.bundle(eligibilityRequest.bundleID, ring: ring)
        if case .client(let client) = principal { try SigningController.checkBundleAllowed(client, bundleID: bundleID, action: "ask about") }
        if case .user(_, let bound) = principal {
            if let token, token != bound {
                throw APIProblem(.forbidden, code: "token_binding_mismatch", detail: "the appAccountToken is not the one bound to the authenticated user")
            }
            token = bound
        }
        if let token, case .limited(let retryAfter) = tokenLimiter.take(token.lowercasedString) {
            throw APIProblem.rateLimited("too many eligibility questions for this appAccountToken", retryAfter: retryAfter)
        }
        guard let eligibility else {
            throw APIProblem(.notFound, code: "eligibility_not_configured", detail: "this service has no offers catalog; start it with --offers FILE")
        }
        let offers = try eligibility.offers(bundleID: bundleID, named: eligibilityRequest.offerIDs)
        let decisions = try await eligibility.decide(
            offers, bundleID: bundleID, appAccountToken: token, evidence: eligibilityRequest.evidence, transactionID: eligibilityRequest.transactionID,
            ring: keyRing.ring, now: Date(), strictAccountToken: principal.isUser)
        // The decisions tell a customer's subscription state: not to a client revoked while they
        // were made (see `SigningController.checkClientStillAllowed`).
        try SigningController.checkClientStillAllowed(principal, bundleID: bundleID, ring: keyRing.ring, action: "ask about")
        var writer = JSONObjectWriter()
        writer.field("bundleID", bundleID)
        writer.field("appAccountToken", token?.lowercasedString)
        writer.field("decisions", json: "[" + decisions.map(EligibilityService.json).joined(separator: ",") + "]")
        return Response(status: .ok, headers: [.contentType: "application/json", .cacheControl: "no-store"], body: .init(byteBuffer: ByteBuffer(string: writer.finish())))
    }
}
