import Foundation
import Testing
@testable import OfferSignerClient

@Suite("HTTP response → OfferSignerClientError")
struct ErrorMappingTests {
    static func problem(_ status: Int, code: String, extra: [String: Any] = [:]) -> Data {
        var object: [String: Any] = [
            "type": "/problems/\(code)",
            "title": "Title \(code)",
            "status": status,
            "detail": "Detail \(code)",
            "code": code,
        ]
        object.merge(extra) { _, new in new }
        return try! JSONSerialization.data(withJSONObject: object)
    }

    func map(_ status: Int, _ body: Data = Data(), headers: [String: String] = [:]) -> OfferSignerClientError? {
        OfferSignerClientError(status: status, headers: headers, body: body, now: Date(timeIntervalSince1970: 0))
    }

    @Test(arguments: [200, 201, 204])
    func successIsNotAnError(_ status: Int) {
        #expect(map(status) == nil)
    }

    @Test func unauthorized() {
        guard case .unauthorized = map(401, Self.problem(401, code: "unauthorized")) else {
            Issue.record("expected .unauthorized"); return
        }
    }

    @Test func notEligibleCarriesReasons() {
        let body = Self.problem(403, code: "not_eligible", extra: ["reasons": ["active_subscription", "offer_redeemed"]])
        guard case .notEligible(let why) = map(403, body) else {
            Issue.record("expected .notEligible"); return
        }
        #expect(why.reasons == ["active_subscription", "offer_redeemed"])
        #expect(why.eligibleFrom == nil && why.historySource == nil && why.evidenceFailures.isEmpty)
        #expect(why.detail == "Detail not_eligible")
    }

    /// The 403 as the service sends it (SigningController: `reasons`, `historySource`,
    /// `eligibleFrom`, `evidenceFailures` as problem members): all of it reaches the app.
    @Test func notEligibleCarriesTheWholeAnswer() {
        let body = Self.problem(403, code: "not_eligible", extra: [
            "reasons": ["redeemed_too_recently", "evidence_unverified"],
            "historySource": "apple-then-client-someday",
            "eligibleFrom": "2027-03-01T12:00:00.250Z",
            "evidenceFailures": [["source": "signedTransaction", "index": 2, "code": "chain_untrusted", "message": "not Apple's"]],
        ])
        guard case .notEligible(let why) = map(403, body) else {
            Issue.record("expected .notEligible"); return
        }
        #expect(why.reasons == ["redeemed_too_recently", "evidence_unverified"])
        #expect(why.historySource?.rawValue == "apple-then-client-someday")  // an open set: kept as sent
        #expect(why.eligibleFrom == RFC3339.date(from: "2027-03-01T12:00:00.250Z"))
        #expect(why.evidenceFailures == [EvidenceFailure(source: "signedTransaction", index: 2, code: "chain_untrusted", message: "not Apple's")])
        #expect(String(describing: OfferSignerClientError.notEligible(why)).contains("eligible from 2027-03-01T12:00:00.250Z"))
        guard case .notEligible(let apple) = map(403, Self.problem(403, code: "not_eligible", extra: ["historySource": "apple"])) else {
            Issue.record("expected .notEligible"); return
        }
        #expect(apple.historySource == .apple)
    }

    @Test func notEligibleWithoutReasons() {
        guard case .notEligible(let why) = map(403, Self.problem(403, code: "not_eligible")) else {
            Issue.record("expected .notEligible"); return
        }
        #expect(why.reasons.isEmpty)
    }

    @Test(arguments: ["token_binding_mismatch", "forbidden"])
    func otherForbidden(_ code: String) {
        guard case .forbidden(let problem) = map(403, Self.problem(403, code: code)) else {
            Issue.record("expected .forbidden"); return
        }
        #expect(problem.code == code)
        #expect(problem.status == 403)
        #expect(problem.detail == "Detail \(code)")
        #expect(problem.type == "/problems/\(code)")
    }

    @Test func rateLimitedWithRetryAfterSeconds() {
        guard case .rateLimited(let retryAfter) = map(429, Self.problem(429, code: "rate_limited"), headers: ["retry-after": "17"]) else {
            Issue.record("expected .rateLimited"); return
        }
        #expect(retryAfter == 17)
    }

    @Test func rateLimitedWithHTTPDate() {
        let headers = ["Retry-After": "Thu, 01 Jan 1970 00:01:30 GMT"]
        guard case .rateLimited(let retryAfter) = map(429, Data(), headers: headers) else {
            Issue.record("expected .rateLimited"); return
        }
        #expect(retryAfter == 90)
    }

    @Test func rateLimitedWithoutRetryAfter() {
        guard case .rateLimited(let retryAfter) = map(429, Data(), headers: ["Retry-After": "soon"]) else {
            Issue.record("expected .rateLimited"); return
        }
        #expect(retryAfter == nil)
    }

    @Test(arguments: [400, 404, 409, 413, 415, 422])
    func otherClientErrorsAreInvalidRequest(_ status: Int) {
        guard case .invalidRequest(let problem) = map(status, Self.problem(status, code: "bad_\(status)")) else {
            Issue.record("expected .invalidRequest"); return
        }
        #expect(problem.status == status)
        #expect(problem.code == "bad_\(status)")
    }

    @Test(arguments: [500, 502, 503, 504])
    func serverErrors(_ status: Int) {
        guard case .server(let problem) = map(status, Self.problem(status, code: "audit_unavailable")) else {
            Issue.record("expected .server"); return
        }
        #expect(problem.status == status)
        #expect(problem.code == "audit_unavailable")
    }

    @Test func nonJSONBodyStillGivesProblem() {
        let html = Data("<html><body>502 Bad Gateway</body></html>".utf8)
        guard case .server(let problem) = map(502, html) else {
            Issue.record("expected .server"); return
        }
        #expect(problem == Problem(type: "about:blank", title: "Bad Gateway", status: 502))
    }

    @Test func emptyBody413() {
        guard case .invalidRequest(let problem) = map(413) else {
            Issue.record("expected .invalidRequest"); return
        }
        #expect(problem.status == 413)
        #expect(problem.title == "Content Too Large")
        #expect(problem.code == nil)
    }

    @Test func statusComesFromHTTPNotBody() {
        guard case .invalidRequest(let problem) = map(400, Self.problem(500, code: "x")) else {
            Issue.record("expected .invalidRequest"); return
        }
        #expect(problem.status == 400)
    }

    @Test func nonObjectJSONBody() {
        guard case .server(let problem) = map(500, Data("[1,2]".utf8)) else {
            Issue.record("expected .server"); return
        }
        #expect(problem.title == "Internal Server Error")
    }

    @Test func httpStatusAccessor() {
        #expect(map(401)?.httpStatus == 401)
        #expect(map(413)?.httpStatus == 413)
        #expect(OfferSignerClientError.transport(underlying: URLError(.timedOut)).httpStatus == nil)
    }

    @Test func descriptionsAreReadable() {
        let text = String(describing: OfferSignerClientError.notEligible(OfferIneligibility(reasons: ["a", "b"])))
        #expect(text.contains("a, b"))
    }
}
