// The one-call purchase flow, the win-back and intro helpers, against StoreKitShim (whose purchase
// answers each test scripts) and a stand-in for the service's HTTP answers (StubService below):
// the client itself is the real one, over URLSession.
#if !canImport(StoreKit)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import OfferSignerClient
import StoreKitShim
import Testing

private enum OneCall {
    static let token = UUID(uuidString: "7E3FB20B-4CDB-47CC-936D-99D65F608138")!
    static let jws = "eyJhbGciOiJFUzI1NiJ9.eyJvZmZlcklkZW50aWZpZXIiOiJ3aW5iYWNrNTAifQ.c2ln"

    /// The service's 201 for `formats: ["jws"]`, as SigningController writes it.
    static func signed(jws: String = OneCall.jws) -> StubService.Answer {
        let body = """
        {"bundleID":"com.example.app","productID":"com.example.pro.monthly","offerID":"winback50",\
        "appAccountToken":"7e3fb20b-4cdb-47cc-936d-99d65f608138","jws":{"keyID":"KEY123","compactJWS":"\(jws)"},\
        "expiresAt":"\(RFC3339Text.string(Date().addingTimeInterval(86_400)))"}
        """
        return StubService.Answer(status: 201, body: Data(body.utf8), contentType: "application/json")
    }

    /// The service's 403 not_eligible, as SigningController writes it.
    static let notEligible = StubService.Answer(status: 403, body: Data("""
        {"type":"about:blank","title":"Forbidden","status":403,"code":"not_eligible",\
        "detail":"the customer is not eligible for 'winback50': redeemed_too_recently",\
        "reasons":["redeemed_too_recently"],"historySource":"apple","eligibleFrom":"2027-05-01T00:00:00.000Z"}
        """.utf8), contentType: "application/problem+json")

    static func transaction(_ id: UInt64, _ log: FinishLog) -> Transaction {
        Transaction(id: id, originalID: 1000, productID: "com.example.pro.monthly", appAccountToken: token, finishLog: log)
    }

    static func product(_ answers: [PurchaseScript.Answer]) -> (Product, PurchaseScript) {
        let script = PurchaseScript(answers)
        return (Product(id: "com.example.pro.monthly", purchaseScript: script), script)
    }
}

/// RFC 3339 with milliseconds, as the service writes `expiresAt`.
enum RFC3339Text {
    static func string(_ date: Date) -> String {
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
        return formatter.string(from: date)
    }
}

@Suite("One call from tap to finished purchase (against StoreKitShim)")
struct OneCallPurchaseTests {
    @Test("Purchased: signed as JWS with the app's token and appTransactionID, verified, finished")
    func purchased() async throws {
        let service = StubService([OneCall.signed()])
        let log = FinishLog()
        let (product, script) = OneCall.product([.result(.success(.verified(OneCall.transaction(42, log))))])
        let outcome = try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        guard case .purchased(let transaction) = outcome else { Issue.record("\(outcome)"); return }
        #expect(transaction.id == 42)
        #expect(log.finished == [42])
        // One signature asked for, in this OS's default format, bound to the app transaction.
        let requests = service.requests
        #expect(requests.count == 1)
        #expect(requests.first?["formats"] as? [String] == ["jws"])
        #expect(requests.first?["transactionID"] as? String == "705000000000001")
        #expect(requests.first?["appAccountToken"] as? String == "7e3fb20b-4cdb-47cc-936d-99d65f608138")
        // What StoreKit got: purchase(options:) with the JWS option and the token.
        let calls = script.calls
        #expect(calls.count == 1)
        #expect(calls.first?.entryPoint == .options)
        #expect(Set(calls.first?.options.map(\.recorded) ?? []) == [
            .promotionalOfferCompactJWS(offerID: "winback50", compactJWS: OneCall.jws), .appAccountToken(OneCall.token),
        ])
    }

    @Test("An explicit transactionID wins over the app transaction; extra options are added")
    func explicitTransactionIDAndExtraOptions() async throws {
        let service = StubService([OneCall.signed()])
        let (product, script) = OneCall.product([.result(.pending)])
        let other = UUID()
        let outcome = try await service.client.purchase(
            product: product, offerID: "winback50", appAccountToken: OneCall.token, formats: [.jws], transactionID: "2000000123",
            options: [.appAccountToken(other)])
        guard case .pending = outcome else { Issue.record("\(outcome)"); return }
        #expect(service.requests.first?["transactionID"] as? String == "2000000123")
        #expect(script.calls.first?.options.contains { $0.recorded == .appAccountToken(other) } == true)
    }

    @Test("Pending and cancelled are outcomes; nothing is finished")
    func pendingAndCancelled() async throws {
        for (answer, expected) in [(Product.PurchaseResult.pending, "pending"), (.userCancelled, "cancelled")] {
            let service = StubService([OneCall.signed()])
            let (product, _) = OneCall.product([.result(answer)])
            let outcome = try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
            switch outcome {
            case .pending: #expect(expected == "pending")
            case .cancelled: #expect(expected == "cancelled")
            default: Issue.record("\(outcome)")
            }
        }
    }

    @Test("Not eligible: the service's whole answer, and StoreKit is never asked")
    func notEligible() async throws {
        let service = StubService([OneCall.notEligible])
        let (product, script) = OneCall.product([.result(.pending)])
        let outcome = try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        guard case .notEligible(let why) = outcome else { Issue.record("\(outcome)"); return }
        #expect(why.reasons == ["redeemed_too_recently"])
        #expect(why.historySource == .apple)
        #expect(why.eligibleFrom == ISO8601DateFormatter().date(from: "2027-05-01T00:00:00Z"))
        #expect(script.calls.isEmpty)
    }

    @Test("An unverified transaction is refused and not finished")
    func unverifiedRefused() async throws {
        let service = StubService([OneCall.signed()])
        let log = FinishLog()
        let (product, _) = OneCall.product([.result(.success(.unverified(OneCall.transaction(7, log), .invalidSignature)))])
        await #expect {
            try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        } throws: { error in
            guard case .unverifiedTransaction(let transaction, .invalidSignature) = error as? OfferPurchaseError else { return false }
            return transaction.id == 7
        }
        #expect(log.finished.isEmpty)
    }

    @Test("invalidOfferSignature: one fresh signature, then success")
    func oneResignThenSuccess() async throws {
        let service = StubService([OneCall.signed(jws: "first.jws.sig"), OneCall.signed(jws: "second.jws.sig")])
        let log = FinishLog()
        let (product, script) = OneCall.product([.error(.invalidOfferSignature), .result(.success(.verified(OneCall.transaction(9, log))))])
        let outcome = try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        guard case .purchased = outcome else { Issue.record("\(outcome)"); return }
        #expect(service.requests.count == 2)
        let jwsSent = script.calls.map { call in
            call.options.compactMap { option -> String? in
                if case .promotionalOfferCompactJWS(_, let jws) = option.recorded { jws } else { nil }
            }
        }
        #expect(jwsSent == [["first.jws.sig"], ["second.jws.sig"]])
        #expect(log.finished == [9])
    }

    @Test("invalidOfferSignature twice: exactly one re-sign, then a typed failure")
    func oneResignThenTypedFailure() async throws {
        let service = StubService([OneCall.signed()])
        let (product, script) = OneCall.product([.error(.invalidOfferSignature)])
        await #expect {
            try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        } throws: { error in
            guard case .offerRefused(.invalidOfferSignature, freshSignatureTried: true) = error as? OfferPurchaseError else { return false }
            return true
        }
        #expect(service.requests.count == 2)
        #expect(script.calls.count == 2)
    }

    @Test("invalidOfferSignature, then the service refuses a fresh signature: a typed failure with its answer, not .notEligible")
    func freshSignatureRefused() async throws {
        let service = StubService([OneCall.signed(), OneCall.notEligible])
        let (product, script) = OneCall.product([.error(.invalidOfferSignature)])
        await #expect {
            try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        } throws: { error in
            guard case .freshSignatureRefused(let why) = error as? OfferPurchaseError else { return false }
            return why.reasons == ["redeemed_too_recently"]
        }
        #expect(service.requests.count == 2)
        #expect(script.calls.count == 1)
    }

    @Test("Other offer errors are typed failures at once, without re-signing", arguments: [
        Product.PurchaseError.invalidOfferIdentifier, .ineligibleForOffer, .missingOfferParameters, .invalidOfferPrice,
    ])
    func otherOfferErrorsNotRetried(_ storeKitError: Product.PurchaseError) async throws {
        let service = StubService([OneCall.signed()])
        let (product, script) = OneCall.product([.error(storeKitError)])
        await #expect {
            try await service.client.purchase(product: product, offerID: "winback50", appAccountToken: OneCall.token)
        } throws: { error in
            guard case .offerRefused(let refused, freshSignatureTried: false) = error as? OfferPurchaseError else { return false }
            return refused == storeKitError
        }
        #expect(service.requests.count == 1)
        #expect(script.calls.count == 1)
    }

    @Test("visionOS: the flow purchases through purchase(confirmIn:options:) with the app's scene")
    @MainActor
    func visionOSConfirmInScene() async throws {
        let service = StubService([OneCall.signed()])
        let log = FinishLog()
        let (product, script) = OneCall.product([.result(.success(.verified(OneCall.transaction(5, log))))])
        let outcome = try await service.client.purchase(
            product: product, offerID: "winback50", appAccountToken: OneCall.token, confirmIn: UIScene())
        guard case .purchased = outcome else { Issue.record("\(outcome)"); return }
        #expect(script.calls.map(\.entryPoint) == [.confirmInScene])
        #expect(log.finished == [5])
    }

    @Test("Win-back: .winBackOffer with the token, verified and finished; a promotional offer is refused")
    func winBack() async throws {
        let offer = Product.SubscriptionOffer(id: "wb-apple-1", type: .winBack)
        #expect(try OfferSignerClient.winBackPurchaseOptions(offer, appAccountToken: OneCall.token).map(\.recorded).sorted { "\($0)" < "\($1)" }
            == [.appAccountToken(OneCall.token), .winBackOffer(offerID: "wb-apple-1")].sorted { "\($0)" < "\($1)" })
        let log = FinishLog()
        let (product, script) = OneCall.product([.result(.success(.verified(OneCall.transaction(11, log))))])
        let outcome = try await OfferSignerClient.purchase(winBackOffer: offer, appAccountToken: nil) { options in
            try await product.purchase(options: options)
        }
        guard case .purchased = outcome else { Issue.record("\(outcome)"); return }
        #expect(script.calls.first?.options.map(\.recorded) == [.winBackOffer(offerID: "wb-apple-1")])
        #expect(log.finished == [11])
        #expect(throws: OfferSignerClientError.self) {
            try OfferSignerClient.winBackPurchaseOptions(Product.SubscriptionOffer(id: "promo", type: .promotional), appAccountToken: nil)
        }
    }

    @Test("Intro eligibility: introductoryOfferEligibility(compactJWS:) with the signed JWS; refused once expired")
    func introEligibility() throws {
        let signed = SignedIntroductoryOfferEligibility(
            bundleID: "com.example.app", productID: "com.example.pro.monthly", transactionID: "2000000123",
            allowIntroductoryOffer: true, keyID: "KEY123", compactJWS: OneCall.jws, expiresAt: Date().addingTimeInterval(60))
        #expect(try signed.purchaseOption().recorded == .introductoryOfferEligibility(compactJWS: OneCall.jws))
        #expect(throws: OfferSignerClientError.self) { try signed.purchaseOption(now: signed.expiresAt) }
    }

    @Test("appTransactionID comes from AppTransaction.shared where the OS has it")
    func appTransactionID() async {
        #expect(await OfferSignerClient.appTransactionID() == "705000000000001")
    }
}

/// A stand-in for the service's HTTP answers, one per request in order (the last repeats), through
/// a `URLProtocol` on the client's own `URLSession`; records each request's JSON body.
final class StubService: Sendable {
    struct Answer: Sendable {
        var status: Int
        var body: Data
        var contentType: String
    }

    let host = "stub-\(UUID().uuidString.lowercased()).invalid"
    let client: OfferSignerClient

    init(_ answers: [Answer]) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.protocolClasses = [StubURLProtocol.self]
        client = OfferSignerClient(
            baseURL: URL(string: "https://\(host)")!, authorization: { "token" },
            session: URLSession(configuration: configuration), retryPolicy: RetryPolicy(maxAttempts: 1))
        StubURLProtocol.register(host: host, answers: answers)
    }

    deinit { StubURLProtocol.unregister(host: host) }

    var requests: [[String: Any]] {
        StubURLProtocol.bodies(host: host).compactMap { try? JSONSerialization.jsonObject(with: $0) as? [String: Any] }
    }
}

final class StubURLProtocol: URLProtocol {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var answers: [String: [StubService.Answer]] = [:]
    nonisolated(unsafe) private static var received: [String: [Data]] = [:]

    static func register(host: String, answers: [StubService.Answer]) {
        lock.withLock { self.answers[host] = answers; received[host] = [] }
    }

    static func unregister(host: String) {
        lock.withLock { answers[host] = nil; received[host] = nil }
    }

    static func bodies(host: String) -> [Data] {
        lock.withLock { received[host] ?? [] }
    }

    override class func canInit(with request: URLRequest) -> Bool {
        request.url?.host?.hasSuffix(".invalid") == true
    }

    override class func canonicalRequest(for request: URLRequest) -> URLRequest { request }

    override func startLoading() {
        let host = request.url?.host ?? ""
        var body = request.httpBody ?? Data()
        if body.isEmpty, let stream = request.httpBodyStream {
            stream.open()
            var buffer = [UInt8](repeating: 0, count: 65_536)
            while stream.hasBytesAvailable {
                let count = stream.read(&buffer, maxLength: buffer.count)
                if count <= 0 { break }
                body.append(buffer, count: count)
            }
            stream.close()
        }
        let answer: StubService.Answer? = Self.lock.withLock {
            Self.received[host, default: []].append(body)
            guard var queue = Self.answers[host], !queue.isEmpty else { return nil }
            let next = queue.count > 1 ? queue.removeFirst() : queue[0]
            Self.answers[host] = queue
            return next
        }
        guard let answer, let url = request.url,
              let response = HTTPURLResponse(url: url, statusCode: answer.status, httpVersion: "HTTP/1.1", headerFields: ["Content-Type": answer.contentType])
        else {
            client?.urlProtocol(self, didFailWithError: URLError(.cannotConnectToHost))
            return
        }
        client?.urlProtocol(self, didReceive: response, cacheStoragePolicy: .notAllowed)
        client?.urlProtocol(self, didLoad: answer.body)
        client?.urlProtocolDidFinishLoading(self)
    }

    override func stopLoading() {}
}
#endif
