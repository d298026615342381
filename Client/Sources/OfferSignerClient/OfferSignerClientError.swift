import Foundation

/// An RFC 9457 problem document, as the service returns for every 4xx/5xx response.
///
/// When an error body is not a problem document (a proxy's HTML page, an empty body), the client
/// builds one from the HTTP status so callers always get a `Problem`.
public struct Problem: Sendable, Hashable, Codable {
    /// A URI reference identifying the problem type (`about:blank` when not given).
    public var type: String
    /// A short human-readable summary.
    public var title: String?
    /// The HTTP status code. Always the status of the response, whatever the body claimed.
    public var status: Int
    /// A human-readable explanation specific to this occurrence.
    public var detail: String?
    /// The service's machine-readable code, e.g. `not_eligible`, `token_binding_mismatch`.
    public var code: String?
    /// On `403` `not_eligible`: why the customer is not eligible.
    public var reasons: [String]?
    /// On `403` `not_eligible`: when the waiting period that blocks the offer ends.
    public var eligibleFrom: Date?
    /// On `403` `not_eligible`: whose history decided.
    public var historySource: HistorySource?
    /// On `403` `not_eligible`: evidence items the service could not use.
    public var evidenceFailures: [EvidenceFailure]?

    public init(
        type: String = "about:blank",
        title: String? = nil,
        status: Int,
        detail: String? = nil,
        code: String? = nil,
        reasons: [String]? = nil,
        eligibleFrom: Date? = nil,
        historySource: HistorySource? = nil,
        evidenceFailures: [EvidenceFailure]? = nil
    ) {
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.code = code
        self.reasons = reasons
        self.eligibleFrom = eligibleFrom
        self.historySource = historySource
        self.evidenceFailures = evidenceFailures
    }

    private enum CodingKeys: String, CodingKey {
        case type, title, status, detail, code, reasons, eligibleFrom, historySource, evidenceFailures
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(type, forKey: .type)
        try container.encodeIfPresent(title, forKey: .title)
        try container.encode(status, forKey: .status)
        try container.encodeIfPresent(detail, forKey: .detail)
        try container.encodeIfPresent(code, forKey: .code)
        try container.encodeIfPresent(reasons, forKey: .reasons)
        try container.encodeIfPresent(eligibleFrom.map(RFC3339.string(from:)), forKey: .eligibleFrom)
        try container.encodeIfPresent(historySource, forKey: .historySource)
        try container.encodeIfPresent(evidenceFailures, forKey: .evidenceFailures)
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            type: (try? container.decodeIfPresent(String.self, forKey: .type)) ?? "about:blank",
            title: try? container.decodeIfPresent(String.self, forKey: .title),
            status: (try? container.decodeIfPresent(Int.self, forKey: .status)) ?? 0,
            detail: try? container.decodeIfPresent(String.self, forKey: .detail),
            code: try? container.decodeIfPresent(String.self, forKey: .code),
            reasons: try? container.decodeIfPresent([String].self, forKey: .reasons),
            eligibleFrom: (try? container.decodeIfPresent(String.self, forKey: .eligibleFrom)).flatMap { $0.flatMap(RFC3339.date(from:)) },
            historySource: try? container.decodeIfPresent(HistorySource.self, forKey: .historySource),
            evidenceFailures: try? container.decodeIfPresent([EvidenceFailure].self, forKey: .evidenceFailures)
        )
    }

    /// Reads a problem document from an error response body, falling back to one built from
    /// `status` when the body is not a JSON object.
    public init(status: Int, body: Data) {
        if !body.isEmpty,
           (try? JSONSerialization.jsonObject(with: body)) is [String: Any],
           var decoded = try? JSONDecoder().decode(Problem.self, from: body) {
            decoded.status = status
            if decoded.title == nil { decoded.title = Self.reasonPhrase(for: status) }
            self = decoded
        } else {
            self.init(title: Self.reasonPhrase(for: status), status: status)
        }
    }

    static func reasonPhrase(for status: Int) -> String {
        switch status {
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 409: "Conflict"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 422: "Unprocessable Content"
        case 429: "Too Many Requests"
        case 500: "Internal Server Error"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        default: "HTTP \(status)"
        }
    }
}

/// Everything `OfferSignerClient` throws (besides `CancellationError` when the calling task is
/// cancelled).
///
/// HTTP mapping (the service's contract):
///
/// | Response | Error |
/// | --- | --- |
/// | 401 | ``unauthorized`` |
/// | 403 `code: not_eligible` | ``notEligible(_:)`` with the whole answer |
/// | any other 403 (`token_binding_mismatch`, `forbidden`, …) | ``forbidden(_:)`` |
/// | 429 | ``rateLimited(retryAfter:)`` with the `Retry-After` seconds |
/// | any other 4xx (400, 404, 413, …) | ``invalidRequest(_:)`` |
/// | 5xx (503 only after the retries) | ``server(_:)`` |
/// | network failure (after the retries) | ``transport(underlying:)`` |
///
/// Other 403s get their own case rather than ``invalidRequest(_:)`` because they are not a
/// malformed request: the request was understood and refused for this caller (e.g. the app
/// account token does not match the signed-in user), and apps usually handle that differently.
public enum OfferSignerClientError: Error, Sendable {
    /// 403 `not_eligible`: the customer may not redeem the offer. Carries the service's whole
    /// answer: machine-readable `reasons`, `eligibleFrom`, `historySource`, `evidenceFailures`.
    case notEligible(OfferIneligibility)
    /// 429: slow down. `retryAfter` is the `Retry-After` header in seconds, when present.
    case rateLimited(retryAfter: TimeInterval?)
    /// 401: the bearer token was missing, invalid or expired.
    case unauthorized
    /// 403 other than `not_eligible`, e.g. `token_binding_mismatch` or `forbidden`.
    case forbidden(Problem)
    /// Any other 4xx, including 400, 404 and 413.
    case invalidRequest(Problem)
    /// 5xx (for 503, after the retry policy gave up).
    case server(Problem)
    /// The request never got an HTTP response (after the retry policy gave up).
    case transport(underlying: any Error)
    /// The service answered 2xx with a body the client cannot use (not the API's shape, a
    /// signature that is not Base64, or an answer for a different product/offer/token).
    case invalidResponse(String)
    /// The authorization closure threw; the request was not sent.
    case authorizationFailed(underlying: any Error)
    /// The call's arguments cannot make a valid request (e.g. `formats: []`); nothing was sent.
    case invalidArgument(String)
    /// The signature's `expiresAt` has passed; fetch a new one.
    case signatureExpired(expiresAt: Date)
    /// The offer was not signed in the format this API needs (e.g. building an `SKPaymentDiscount`
    /// from an offer requested with `formats: [.jws]`).
    case signatureFormatUnavailable(SignatureFormat)
}

extension OfferSignerClientError {
    /// Maps a completed HTTP exchange to an error; `nil` for 2xx.
    ///
    /// A pure function of the response so the mapping is testable without a server.
    /// `headers` are matched case-insensitively.
    public init?(status: Int, headers: [String: String], body: Data, now: Date = Date()) {
        if (200..<300).contains(status) { return nil }
        let problem = Problem(status: status, body: body)
        switch status {
        case 401:
            self = .unauthorized
        case 403 where problem.code == "not_eligible":
            self = .notEligible(OfferIneligibility(
                reasons: problem.reasons ?? [], eligibleFrom: problem.eligibleFrom, historySource: problem.historySource,
                evidenceFailures: problem.evidenceFailures ?? [], detail: problem.detail))
        case 403:
            self = .forbidden(problem)
        case 429:
            self = .rateLimited(retryAfter: Self.retryAfter(in: headers, now: now))
        case 400..<500:
            self = .invalidRequest(problem)
        case 500..<600:
            self = .server(problem)
        default:
            // 1xx/3xx reaching us means the exchange did not follow the API.
            self = .invalidResponse("unexpected HTTP status \(status)")
        }
    }

    /// The `Retry-After` header (RFC 9110 §10.2.3) as seconds from `now`: either delay-seconds or
    /// an HTTP-date. `nil` when absent or unreadable.
    static func retryAfter(in headers: [String: String], now: Date) -> TimeInterval? {
        guard let raw = headers.first(where: { $0.key.caseInsensitiveCompare("Retry-After") == .orderedSame })?.value
        else { return nil }
        let value = raw.trimmingCharacters(in: .whitespaces)
        if let seconds = Int(value), seconds >= 0 {
            return TimeInterval(seconds)
        }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        if let date = formatter.date(from: value) {
            return max(0, date.timeIntervalSince(now))
        }
        return nil
    }

    /// The HTTP status behind this error, when it came from a response.
    public var httpStatus: Int? {
        switch self {
        case .unauthorized: 401
        case .notEligible: 403
        case .rateLimited: 429
        case .forbidden(let problem), .invalidRequest(let problem), .server(let problem): problem.status
        default: nil
        }
    }
}

extension OfferSignerClientError: CustomStringConvertible, LocalizedError {
    public var description: String {
        switch self {
        case .notEligible(let ineligibility):
            "not eligible for the offer"
                + (ineligibility.reasons.isEmpty ? "" : " (\(ineligibility.reasons.joined(separator: ", ")))")
                + (ineligibility.eligibleFrom.map { "; eligible from \(RFC3339.string(from: $0))" } ?? "")
        case .rateLimited(let retryAfter):
            "rate limited" + (retryAfter.map { "; retry after \(Int($0)) s" } ?? "")
        case .unauthorized:
            "unauthorized: the bearer token was missing, invalid or expired"
        case .forbidden(let problem):
            "forbidden: \(Self.summary(problem))"
        case .invalidRequest(let problem):
            "invalid request: \(Self.summary(problem))"
        case .server(let problem):
            "server error: \(Self.summary(problem))"
        case .transport(let underlying):
            "network error: \(underlying)"
        case .invalidResponse(let reason):
            "invalid response from offer-signer: \(reason)"
        case .authorizationFailed(let underlying):
            "could not obtain an authorization token: \(underlying)"
        case .invalidArgument(let reason):
            "invalid argument: \(reason)"
        case .signatureExpired(let expiresAt):
            "the offer signature expired at \(RFC3339.string(from: expiresAt)); fetch a new one"
        case .signatureFormatUnavailable(let format):
            "the offer was not signed in the \(format.rawValue) format; request formats: [.\(format.rawValue)]"
        }
    }

    public var errorDescription: String? { description }

    private static func summary(_ problem: Problem) -> String {
        var text = "\(problem.status)"
        if let code = problem.code { text += " \(code)" }
        if let detail = problem.detail ?? problem.title { text += ": \(detail)" }
        return text
    }
}
