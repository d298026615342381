import Foundation

/// What the client sent, after verification: the verified records plus one failure per
/// submitted JWS that did not verify.
///
/// Rule enforced by `EligibilityEvaluator`: when `failures` is non-empty, every offer that has
/// `rules` is ineligible with `evidence_unverified` (the verified records are still used to report
/// any other reasons); offers without rules are unaffected.
public struct EligibilityEvidence: Sendable, Codable, Hashable {
    /// Transactions whose signature, chain, bundle ID and environment checked out.
    public var transactions: [VerifiedTransaction]
    /// Renewal infos whose signature, chain and environment checked out.
    public var renewalInfos: [VerifiedRenewalInfo]
    /// Submitted items that did not verify, in submission order (transactions first).
    public var failures: [EvidenceFailure]

    public init(
        transactions: [VerifiedTransaction] = [],
        renewalInfos: [VerifiedRenewalInfo] = [],
        failures: [EvidenceFailure] = []
    ) {
        self.transactions = transactions
        self.renewalInfos = renewalInfos
        self.failures = failures
    }

    /// No evidence at all (nothing submitted, or nothing verified and nothing failed).
    public static let empty = EligibilityEvidence()

    /// `true` when every submitted item verified.
    public var isFullyVerified: Bool { failures.isEmpty }
}

/// Why one submitted JWS was rejected. Surfaced as the detail of `evidence_unverified`.
public struct EvidenceFailure: Sendable, Codable, Hashable, CustomStringConvertible {
    /// Which list of the request the item came from.
    public enum Source: String, Sendable, Codable, Hashable {
        /// `signedTransactions`.
        case signedTransaction
        /// `signedRenewalInfos`.
        case signedRenewalInfo
    }

    /// Stable machine-readable failure codes (snake_case strings on the wire).
    public enum Code: String, Sendable, Codable, Hashable, CaseIterable {
        /// Not three dot-separated parts, or too large.
        case malformedJWS = "malformed_jws"
        /// A JWS part or an `x5c` entry is not valid base64/base64url.
        case badBase64 = "bad_base64"
        /// The protected header is not a JSON object.
        case malformedHeader = "malformed_header"
        /// Header `alg` is not `ES256`.
        case unsupportedAlgorithm = "unsupported_algorithm"
        /// Header has no (or an empty) `x5c`.
        case missingCertificateChain = "missing_x5c"
        /// `x5c` does not hold exactly three certificates (leaf, intermediate, root).
        case invalidChainLength = "invalid_chain_length"
        /// An `x5c` entry is not a DER X.509 certificate.
        case malformedCertificate = "malformed_certificate"
        /// A certificate of the chain is expired at the evaluation time.
        case certificateExpired = "certificate_expired"
        /// A certificate of the chain is not yet valid at the evaluation time.
        case certificateNotYetValid = "certificate_not_yet_valid"
        /// The leaf lacks OID 1.2.840.113635.100.6.11.1 or the intermediate lacks 1.2.840.113635.100.6.2.1.
        case missingAppleMarkerOID = "missing_apple_marker_oid"
        /// The chain does not lead to a trusted root (foreign or self-signed certificates, bad certificate signatures).
        case untrustedChain = "untrusted_chain"
        /// The leaf key is not a P-256 key.
        case unsupportedKey = "unsupported_key"
        /// The ES256 signature does not match header and payload (altered data).
        case invalidSignature = "invalid_signature"
        /// The payload is not JSON or lacks a required field.
        case malformedPayload = "malformed_payload"
        /// Transaction `bundleId` differs from the expected bundle ID.
        case bundleIDMismatch = "bundle_id_mismatch"
        /// `environment` differs from the expected environment (or is unknown).
        case environmentMismatch = "environment_mismatch"
        /// The transaction carries an `appAccountToken` other than the customer's: it is
        /// another account's history.
        case appAccountTokenMismatch = "app_account_token_mismatch"
        /// More JWS than one request may carry.
        case tooManyItems = "too_many_items"
    }

    /// Which list the item came from.
    public var source: Source
    /// Position of the item in its list.
    public var index: Int
    /// The specific failure.
    public var code: Code
    /// Human-readable explanation (safe to log and to return; contains no secrets).
    public var message: String

    public init(source: Source, index: Int, code: Code, message: String) {
        self.source = source
        self.index = index
        self.code = code
        self.message = message
    }

    public var description: String { "\(source.rawValue)[\(index)]: \(code.rawValue): \(message)" }
}

/// One promotional-offer signature this service issued to a customer (our own ledger).
///
/// Pass all records of the customer being evaluated (for every offer); the evaluator filters.
public struct IssuedOfferRecord: Sendable, Codable, Hashable {
    /// The offer signed.
    public var offerID: String
    /// When the signature was issued.
    public var issuedAt: Date

    public init(offerID: String, issuedAt: Date) {
        self.offerID = offerID
        self.issuedAt = issuedAt
    }
}
