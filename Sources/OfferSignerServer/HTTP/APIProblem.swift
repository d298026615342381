import Foundation
import HTTPTypes
import Hummingbird
import NIOCore
import OfferSignerCore
import OfferSignerStorage

/// An RFC 9457 problem document (`application/problem+json`) with a stable machine `code`.
///
/// Rule: every 4xx and 5xx the service sends is one of these — never HTML, a stack trace or an
/// empty body. `detail` never contains key material or secrets. Every `code` is an entry of
/// ``ProblemCatalog``, which gives the document its `type` (`/problems/<code>`) and `title`.
public struct APIProblem: Error, HTTPResponseError, Sendable, Equatable {
    public var status: HTTPResponse.Status
    /// Stable, machine-readable code (`snake_case`).
    public var code: String
    public var detail: String
    /// Extra members (e.g. `reasons` for `not_eligible`), already JSON.
    public var extensions: [String: String]
    /// Extra headers (e.g. `Retry-After`, `Allow`).
    public var headers: HTTPFields

    public init(_ status: HTTPResponse.Status, code: String, detail: String, extensions: [String: String] = [:], headers: HTTPFields = [:]) {
        self.status = status
        self.code = code
        self.detail = detail
        self.extensions = extensions
        self.headers = headers
    }

    /// The problem type URI: `/problems/<code>`, relative to the service, which serves its
    /// description (RFC 9457 §3.1.1 allows a relative reference).
    public var type: String { "/problems/\(code)" }

    /// The catalog's summary of the code (the status' reason phrase for a code not in it).
    public var title: String { ProblemCatalog.type(for: code)?.title ?? status.reasonPhrase }

    public var json: String {
        var writer = JSONObjectWriter()
        writer.field("type", type)
        writer.field("title", title)
        writer.field("status", Int64(status.code))
        writer.field("detail", detail)
        writer.field("code", code)
        for (name, value) in extensions.sorted(by: { $0.key < $1.key }) { writer.field(name, json: value) }
        return writer.finish()
    }

    public func response(from request: Request, context: some RequestContext) throws -> Response {
        response(requestID: nil)
    }

    func response(requestID: String?) -> Response {
        var problem = self
        if let requestID { problem.extensions["requestID"] = JSONObjectWriter.quoted(requestID) }
        var headers = self.headers
        headers[.contentType] = "application/problem+json"
        headers[.cacheControl] = "no-store"
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(string: problem.json)))
    }

    // MARK: - Common problems

    static func badRequest(_ code: String, _ detail: String) -> APIProblem { APIProblem(.badRequest, code: code, detail: detail) }

    /// The codes of ``OfferSignerError`` that describe a member of the request.
    static let requestFieldCodes: Set<OfferSignerError.Code> = [.fieldEmpty, .fieldTooLong, .fieldInvalidCharacter, .invalidAppAccountToken]

    /// 400 naming the request member at fault; any other core failure (a value the service made
    /// itself) is this service's fault, so 500 `internal_error`.
    static func field(_ error: OfferSignerError) -> APIProblem {
        guard requestFieldCodes.contains(error.code) else {
            return APIProblem(.internalServerError, code: "internal_error", detail: "signing failed on a value the service made: \(error.message)")
        }
        var problem = APIProblem(.badRequest, code: error.code.rawValue, detail: error.message)
        if let field = error.field { problem.extensions["field"] = JSONObjectWriter.quoted(field) }
        return problem
    }

    /// 429 `rate_limited`, with `Retry-After` (header) and `retryAfter` (member) in seconds.
    static func rateLimited(_ detail: String, retryAfter: Int) -> APIProblem {
        APIProblem(
            .tooManyRequests, code: "rate_limited", detail: "\(detail); retry in \(retryAfter) s",
            extensions: ["retryAfter": String(retryAfter)], headers: [.retryAfter: String(retryAfter)])
    }

    /// 503 `customer_busy`: another request for the same customer held its lock for longer than
    /// the wait allowed.
    static let customerBusy = APIProblem(
        .serviceUnavailable, code: "customer_busy",
        detail: "another request for this customer is still being decided; no signature was issued; retry in 1 s",
        extensions: ["retryAfter": "1"], headers: [.retryAfter: "1"])

    /// 503 `audit_unavailable`: a decision's or a signature's audit record could not be committed,
    /// so nothing was issued.
    static let auditUnavailable = APIProblem(
        .serviceUnavailable, code: "audit_unavailable", detail: "the audit record could not be written, so no signature was issued; retry later")

    /// 503 `store_unavailable`: the store failed or did not answer in time; nothing was issued.
    static func storeUnavailable(_ error: StoreError) -> APIProblem {
        let reason = error.code == .timeout ? "the store did not answer in time" : "the store cannot be reached or written"
        return APIProblem(
            .serviceUnavailable, code: "store_unavailable", detail: "\(reason), so nothing was issued; retry in 1 s",
            extensions: ["retryAfter": "1"], headers: [.retryAfter: "1"])
    }

    static let unauthorized = APIProblem(
        .unauthorized, code: "unauthorized", detail: "missing, unknown or revoked credentials: send 'Authorization: Bearer <API key or user JWT>'",
        headers: [.wwwAuthenticate: "Bearer"])

    static func unauthorized(_ detail: String) -> APIProblem {
        var problem = unauthorized
        problem.detail = detail
        return problem
    }
}
