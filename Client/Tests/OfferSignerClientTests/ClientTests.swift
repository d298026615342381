import Foundation
import Testing
@testable import OfferSignerClient
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A scripted transport: hands out the queued outcomes in order and records every request.
final class StubTransport: @unchecked Sendable {
    enum Outcome {
        case response(status: Int, body: Data, headers: [String: String] = [:])
        case failure(any Error)
    }

    private let lock = NSLock()
    private var outcomes: [Outcome]
    private var _requests: [URLRequest] = []
    private var _sleeps: [TimeInterval] = []

    init(_ outcomes: [Outcome]) {
        self.outcomes = outcomes
    }

    var requests: [URLRequest] { lock.withLock { _requests } }
    var sleeps: [TimeInterval] { lock.withLock { _sleeps } }

    func send(_ request: URLRequest) throws -> (Data, URLResponse) {
        let outcome: Outcome = lock.withLock {
            _requests.append(request)
            return outcomes.isEmpty ? .failure(URLError(.resourceUnavailable)) : outcomes.removeFirst()
        }
        switch outcome {
        case .failure(let error):
            throw error
        case .response(let status, let body, let headers):
            let response = HTTPURLResponse(url: request.url!, statusCode: status, httpVersion: "HTTP/1.1", headerFields: headers)!
            return (body, response)
        }
    }

    func sleep(_ seconds: TimeInterval) {
        lock.withLock { _sleeps.append(seconds) }
    }

    func client(
        baseURL: String = "http://127.0.0.1:8080",
        token: String? = "app-session-token",
        retryPolicy: RetryPolicy = RetryPolicy(maxAttempts: 3, baseDelay: 0.5, maxDelay: 8, jitter: 0)
    ) -> OfferSignerClient {
        OfferSignerClient(
            baseURL: URL(string: baseURL)!,
            authorization: { token },
            retryPolicy: retryPolicy,
            transport: { [self] request in try self.send(request) },
            sleeper: { [self] seconds in self.sleep(seconds) },
            random: { 0.5 }
        )
    }
}

func jsonObject(_ request: URLRequest) throws -> [String: Any] {
    let body = try #require(request.httpBody)
    return try #require(try JSONSerialization.jsonObject(with: body) as? [String: Any])
}

@Suite("OfferSignerClient over a stub transport")
struct ClientTests {
    @Test func signsAndSendsTheContractRequest() async throws {
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON(jws: true))])
        let client = stub.client(baseURL: "http://127.0.0.1:8080/prefix/")
        let evidence = PurchaseEvidence(signedTransactions: ["t.j.s"], signedRenewalInfos: ["r.j.s"])
        let offer = try await client.signPromotionalOffer(
            productID: "com.example.pro.monthly",
            offerID: "winback50",
            appAccountToken: Fixtures.token,
            formats: [.legacy, .jws],
            evidence: evidence,
            bundleID: "com.example.app",
            transactionID: "2000000123",
            environment: "Sandbox"
        )
        #expect(offer.jws?.compactJWS == Fixtures.compactJWS)
        #expect(offer.legacy?.signatureData == Fixtures.signatureBytes)

        let request = try #require(stub.requests.first)
        #expect(stub.requests.count == 1)
        #expect(request.httpMethod == "POST")
        #expect(request.url?.absoluteString == "http://127.0.0.1:8080/prefix/v1/offers/signatures")
        #expect(request.value(forHTTPHeaderField: "Authorization") == "Bearer app-session-token")
        #expect(request.value(forHTTPHeaderField: "Content-Type") == "application/json")
        let body = try jsonObject(request)
        #expect(body["productID"] as? String == "com.example.pro.monthly")
        #expect(body["offerID"] as? String == "winback50")
        #expect(body["appAccountToken"] as? String == "7e3fb20b-4cdb-47cc-936d-99d65f608138")  // lowercase
        #expect(body["bundleID"] as? String == "com.example.app")
        #expect(body["transactionID"] as? String == "2000000123")
        #expect(body["environment"] as? String == "Sandbox")
        #expect(body["formats"] as? [String] == ["legacy", "jws"])
        let sentEvidence = try #require(body["evidence"] as? [String: Any])
        #expect(sentEvidence["signedTransactions"] as? [String] == ["t.j.s"])
        #expect(sentEvidence["signedRenewalInfos"] as? [String] == ["r.j.s"])
    }

    @Test func minimalRequestOmitsOptionalFields() async throws {
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON(token: nil, jws: true))])
        _ = try await stub.client(baseURL: "http://127.0.0.1:9").signPromotionalOffer(
            productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: nil
        )
        let request = try #require(stub.requests.first)
        #expect(request.url?.absoluteString == "http://127.0.0.1:9/v1/offers/signatures")
        let body = try jsonObject(request)
        #expect(Set(body.keys) == ["productID", "offerID", "formats"])
        // No formats given: this OS's default (JWS wherever StoreKit takes it; here, all of it).
        #expect(body["formats"] as? [String] == StoreKitCapabilities.current.defaultFormats.map(\.rawValue))
        #expect(body["formats"] as? [String] == ["jws"])
    }

    @Test("formats: [] is never sent: a local .invalidArgument, no request")
    func emptyFormatsAreRefusedLocally() async {
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON(token: nil))])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil, formats: [])
        } throws: { error in
            guard case .invalidArgument(let reason) = error as? OfferSignerClientError else { return false }
            return reason.contains("formats")
        }
        #expect(stub.requests.isEmpty)
    }

    @Test("intro-eligibility: the request names the format, the decision and the transaction; the answer is checked")
    func introductoryOfferEligibility() async throws {
        let answer = Data("""
        {"bundleID":"com.example.app","productID":"com.example.pro.monthly","offerID":"introductory","appAccountToken":null,
         "introEligibility":{"keyID":"KEY123","compactJWS":"\(Fixtures.compactJWS)","transactionID":"2000000123","allowIntroductoryOffer":false},
         "expiresAt":"2030-03-17T17:46:40Z"}
        """.utf8)
        let stub = StubTransport([.response(status: 201, body: answer)])
        let signed = try await stub.client().signIntroductoryOfferEligibility(
            productID: "com.example.pro.monthly", allowIntroductoryOffer: false, transactionID: "2000000123")
        #expect(signed.compactJWS == Fixtures.compactJWS)
        #expect(signed.allowIntroductoryOffer == false)
        #expect(signed.keyID == "KEY123")
        #expect(signed.expiresAt == RFC3339.date(from: "2030-03-17T17:46:40Z"))
        let body = try jsonObject(try #require(stub.requests.first))
        #expect(body["formats"] as? [String] == ["intro-eligibility"])
        #expect(body["allowIntroductoryOffer"] as? Bool == false)
        #expect(body["transactionID"] as? String == "2000000123")
        #expect(body["offerID"] as? String == "introductory")

        // An answer for another transaction is refused.
        let stub2 = StubTransport([.response(status: 201, body: answer)])
        await #expect {
            try await stub2.client().signIntroductoryOfferEligibility(
                productID: "com.example.pro.monthly", allowIntroductoryOffer: false, transactionID: "2000000999")
        } throws: { error in
            guard case .invalidResponse = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test func noTokenNoAuthorizationHeader() async throws {
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON(token: nil, jws: true))])
        _ = try await stub.client(token: nil).signPromotionalOffer(
            productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: nil
        )
        #expect(stub.requests.first?.value(forHTTPHeaderField: "Authorization") == nil)
    }

    @Test func authorizationIsAskedPerAttempt() async throws {
        let counter = Counter()
        let stub = StubTransport([
            .response(status: 503, body: ErrorMappingTests.problem(503, code: "audit_unavailable")),
            .response(status: 201, body: Fixtures.signatureJSON(token: nil, jws: true)),
        ])
        let client = OfferSignerClient(
            baseURL: URL(string: "http://127.0.0.1:8080")!,
            authorization: { "token-\(counter.next())" },
            retryPolicy: RetryPolicy(maxAttempts: 3, jitter: 0),
            transport: { request in try stub.send(request) },
            sleeper: { _ in },
            random: { 0 }
        )
        _ = try await client.signPromotionalOffer(productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: nil)
        #expect(stub.requests.map { $0.value(forHTTPHeaderField: "Authorization") } == ["Bearer token-1", "Bearer token-2"])
    }

    @Test func authorizationFailureIsWrapped() async {
        struct LoggedOut: Error {}
        let stub = StubTransport([])
        let client = OfferSignerClient(
            baseURL: URL(string: "http://127.0.0.1:8080")!,
            authorization: { throw LoggedOut() },
            retryPolicy: .default,
            transport: { request in try stub.send(request) },
            sleeper: { _ in },
            random: { 0 }
        )
        await #expect {
            try await client.signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .authorizationFailed(let underlying) = error as? OfferSignerClientError else { return false }
            return underlying is LoggedOut
        }
        #expect(stub.requests.isEmpty)
    }

    @Test func retriesTransportErrorsWithBackoffThenSucceeds() async throws {
        let stub = StubTransport([
            .failure(URLError(.networkConnectionLost)),
            .failure(URLError(.timedOut)),
            .response(status: 201, body: Fixtures.signatureJSON(jws: true)),
        ])
        let offer = try await stub.client().signPromotionalOffer(
            productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: Fixtures.token
        )
        #expect(offer.offerID == "winback50")
        #expect(stub.requests.count == 3)
        #expect(stub.sleeps == [0.5, 1.0])
    }

    @Test func givesUpAfterMaxAttemptsWithTransportError() async {
        let stub = StubTransport([
            .failure(URLError(.cannotConnectToHost)),
            .failure(URLError(.cannotConnectToHost)),
            .failure(URLError(.cannotConnectToHost)),
            .response(status: 201, body: Fixtures.signatureJSON()),
        ])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: Fixtures.token)
        } throws: { error in
            guard case .transport(let underlying) = error as? OfferSignerClientError else { return false }
            return (underlying as? URLError)?.code == .cannotConnectToHost
        }
        #expect(stub.requests.count == 3)
        #expect(stub.sleeps == [0.5, 1.0])
    }

    @Test func retries503ThenReportsServerProblem() async {
        let problem = ErrorMappingTests.problem(503, code: "audit_unavailable")
        let stub = StubTransport([
            .response(status: 503, body: problem, headers: ["Retry-After": "2"]),
            .response(status: 503, body: problem),
            .response(status: 503, body: problem),
        ])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .server(let problem) = error as? OfferSignerClientError else { return false }
            return problem.status == 503 && problem.code == "audit_unavailable"
        }
        #expect(stub.requests.count == 3)
        #expect(stub.sleeps == [2.0, 1.0])  // Retry-After raised the first delay
    }

    @Test(arguments: [400, 401, 403, 413, 429, 500, 502])
    func doesNotRetryOtherStatuses(_ status: Int) async {
        let stub = StubTransport([
            .response(status: status, body: ErrorMappingTests.problem(status, code: "x"), headers: ["Retry-After": "1"]),
            .response(status: 201, body: Fixtures.signatureJSON(token: nil)),
        ])
        await #expect(throws: OfferSignerClientError.self) {
            try await stub.client().signPromotionalOffer(productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: nil)
        }
        #expect(stub.requests.count == 1)
        #expect(stub.sleeps.isEmpty)
    }

    @Test func notEligibleSurfacesReasons() async {
        let body = ErrorMappingTests.problem(403, code: "not_eligible", extra: ["reasons": ["never_subscribed"]])
        let stub = StubTransport([.response(status: 403, body: body, headers: ["Content-Type": "application/problem+json"])])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .notEligible(let why) = error as? OfferSignerClientError else { return false }
            return why.reasons == ["never_subscribed"]
        }
    }

    @Test func rateLimitedIsNotRetried() async {
        let stub = StubTransport([.response(status: 429, body: Data(), headers: ["Retry-After": "30"])])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .rateLimited(let retryAfter) = error as? OfferSignerClientError else { return false }
            return retryAfter == 30
        }
        #expect(stub.requests.count == 1)
    }

    @Test func rejectsAnswerForAnotherOfferOrToken() async {
        // The service answered for another token: never hand that to StoreKit.
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON())])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: UUID())
        } throws: { error in
            guard case .invalidResponse = error as? OfferSignerClientError else { return false }
            return true
        }
        let other = StubTransport([.response(status: 201, body: Fixtures.signatureJSON())])
        await #expect(throws: OfferSignerClientError.self) {
            try await other.client().signPromotionalOffer(productID: "com.example.pro.monthly", offerID: "other", appAccountToken: Fixtures.token)
        }
    }

    @Test func rejectsMissingRequestedFormat() async {
        let stub = StubTransport([.response(status: 201, body: Fixtures.signatureJSON(jws: false))])
        await #expect {
            try await stub.client().signPromotionalOffer(
                productID: "com.example.pro.monthly", offerID: "winback50", appAccountToken: Fixtures.token, formats: [.jws]
            )
        } throws: { error in
            guard case .invalidResponse(let reason) = error as? OfferSignerClientError else { return false }
            return reason.contains("jws")
        }
    }

    @Test func garbageSuccessBodyIsInvalidResponse() async {
        let stub = StubTransport([.response(status: 201, body: Data("<html/>".utf8))])
        await #expect {
            try await stub.client().signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .invalidResponse = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test func eligibilityRoundTrip() async throws {
        let response = Data("""
        {"decisions": [{"offerID": "winback50", "eligible": false, "reasons": ["active_subscription"]}]}
        """.utf8)
        let stub = StubTransport([.response(status: 200, body: response)])
        let result = try await stub.client().eligibility(
            offerIDs: ["winback50"],
            evidence: PurchaseEvidence(signedTransactions: ["a.b.c"]),
            appAccountToken: Fixtures.token,
            bundleID: "com.example.app"
        )
        #expect(result.decisions == [OfferEligibilityDecision(offerID: "winback50", eligible: false, reasons: ["active_subscription"])])

        let request = try #require(stub.requests.first)
        #expect(request.url?.absoluteString == "http://127.0.0.1:8080/v1/offers/eligibility")
        let body = try jsonObject(request)
        #expect(body["offerIDs"] as? [String] == ["winback50"])
        #expect(body["bundleID"] as? String == "com.example.app")
        #expect(body["appAccountToken"] as? String == Fixtures.token.uuidString.lowercased())
        let evidence = try #require(body["evidence"] as? [String: Any])
        #expect(evidence["signedTransactions"] as? [String] == ["a.b.c"])
        #expect(evidence["signedRenewalInfos"] as? [String] == [])
    }

    @Test func eligibilityWithoutOptionalFields() async throws {
        let stub = StubTransport([.response(status: 200, body: Data(#"{"decisions": []}"#.utf8))])
        let result = try await stub.client().eligibility(evidence: PurchaseEvidence())
        #expect(result.decisions.isEmpty)
        let body = try jsonObject(try #require(stub.requests.first))
        #expect(Set(body.keys) == ["evidence"])
    }

    @Test func eligibilityOnApplesWordSendsTransactionIDWithoutEvidence() async throws {
        let stub = StubTransport([.response(status: 200, body: Data(#"{"decisions": []}"#.utf8))])
        _ = try await stub.client().eligibility(offerIDs: ["wb_apple"], transactionID: "2000000123", appAccountToken: Fixtures.token)
        let body = try jsonObject(try #require(stub.requests.first))
        #expect(Set(body.keys) == ["offerIDs", "transactionID", "appAccountToken"])
        #expect(body["transactionID"] as? String == "2000000123")
    }

    @Test func cancellationStopsRetrying() async {
        let stub = StubTransport([.failure(URLError(.timedOut)), .failure(URLError(.timedOut)), .failure(URLError(.timedOut))])
        let client = OfferSignerClient(
            baseURL: URL(string: "http://127.0.0.1:8080")!,
            authorization: { nil },
            retryPolicy: RetryPolicy(maxAttempts: 3),
            transport: { request in try stub.send(request) },
            sleeper: { _ in throw CancellationError() },  // what Task.sleep does when cancelled
            random: { 0 }
        )
        await #expect(throws: CancellationError.self) {
            try await client.signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        }
        #expect(stub.requests.count == 1)
    }

    /// The real URLSession path over plain HTTP on loopback: nothing listens on port 1, so the
    /// connection is refused and surfaces as a transport error.
    @Test func realURLSessionTransportErrorOnLoopback() async {
        let client = OfferSignerClient(
            baseURL: URL(string: "http://127.0.0.1:1")!,
            authorization: { "t" },
            retryPolicy: .none,
            requestTimeout: 5
        )
        await #expect {
            try await client.signPromotionalOffer(productID: "p", offerID: "o", appAccountToken: nil)
        } throws: { error in
            guard case .transport = error as? OfferSignerClientError else { return false }
            return true
        }
    }

    @Test func publicInitUsesURLSession() {
        let client = OfferSignerClient(baseURL: URL(string: "http://127.0.0.1:1")!, authorization: { nil })
        #expect(client.retryPolicy == .default)
        #expect(client.url(for: ["v1", "offers", "signatures"]).absoluteString == "http://127.0.0.1:1/v1/offers/signatures")
    }
}

final class Counter: @unchecked Sendable {
    private let lock = NSLock()
    private var value = 0
    func next() -> Int {
        lock.withLock {
            value += 1
            return value
        }
    }
}
