import Foundation

/// The three readers of a `POST /v1/offers/signatures` body, for the libFuzzer targets in
/// `Fuzz/` (a separate package, so these must be `public`; `@_spi(Fuzzing)` keeps them out of
/// the library's API).
///
/// Rule: each entry point runs exactly the code the server runs on a body
/// (`SignatureRequestPlainReader.read`, `RequestDecoding.decode`, `JSONDuplicateMembers.first`)
/// and reports what it decided as plain values, so a fuzz target can cross-check them: when
/// the plain reader accepts a body, the decoder must accept it with the same values.
@_spi(Fuzzing) public enum SignatureRequestReaders {
    /// The members of a signing request as read.
    public struct Fields: Equatable, Sendable, CustomStringConvertible {
        public var productID: String
        public var offerID: String
        public var appAccountToken: String?
        public var bundleID: String?
        public var formats: [String]?
        public var transactionID: String?
        public var environment: String?
        /// `evidence.signedTransactions` and `evidence.signedRenewalInfos`, when `evidence` was sent.
        public var evidence: (signedTransactions: [String], signedRenewalInfos: [String])?

        init(_ request: SignatureRequest) {
            productID = request.productID
            offerID = request.offerID
            appAccountToken = request.appAccountToken
            bundleID = request.bundleID
            formats = request.formats
            transactionID = request.transactionID
            environment = request.environment
            evidence = request.evidence.map { ($0.signedTransactions, $0.signedRenewalInfos) }
        }

        public static func == (left: Fields, right: Fields) -> Bool {
            left.productID == right.productID && left.offerID == right.offerID && left.appAccountToken == right.appAccountToken
                && left.bundleID == right.bundleID && left.formats == right.formats && left.transactionID == right.transactionID
                && left.environment == right.environment
                && left.evidence?.signedTransactions == right.evidence?.signedTransactions
                && left.evidence?.signedRenewalInfos == right.evidence?.signedRenewalInfos
        }

        public var description: String {
            "productID: \(productID.debugDescription), offerID: \(offerID.debugDescription), appAccountToken: \(String(describing: appAccountToken)), "
                + "bundleID: \(String(describing: bundleID)), formats: \(String(describing: formats)), transactionID: \(String(describing: transactionID)), "
                + "environment: \(String(describing: environment)), "
                + "evidence: \(String(describing: evidence))"
        }
    }

    /// What the plain reader made of `body`; `nil` when it leaves the body to the decoder.
    public static func plainReader(_ body: Data) -> Fields? {
        SignatureRequestPlainReader.read(body).map(Fields.init)
    }

    /// What the decoder path made of `body`: the fields, or the refusal's problem `code`
    /// (`malformed_json`, `duplicate_field`, `unknown_field`, `missing_field`, `wrong_type`).
    public static func decoder(_ body: Data) -> Result<Fields, DecoderRefusal> {
        do throws(APIProblem) {
            return .success(Fields(try RequestDecoding.decode(SignatureRequest.self, from: body)))
        } catch {
            return .failure(DecoderRefusal(code: error.code, detail: error.detail))
        }
    }

    /// The decoder path's refusal: its problem document's `code` and `detail`.
    public struct DecoderRefusal: Error, Equatable, Sendable {
        public var code: String
        public var detail: String
    }

    /// The duplicate-member scan's answer: the path of the first repeated member, or `nil`.
    public static func firstDuplicateMember(_ body: Data) -> String? {
        JSONDuplicateMembers.first(in: body)
    }
}
