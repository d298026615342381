import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// The app-side client for an offer-signer service.
///
/// Foundation only (`URLSession`); safe to share between tasks. It never caches signatures: each
/// ``signPromotionalOffer(productID:offerID:appAccountToken:formats:evidence:bundleID:transactionID:environment:)``
/// call asks the service for a fresh one, because a signature's nonce is single-use and it must
/// not be used after its `expiresAt`.
///
/// ## From the tap to the finished purchase (StoreKit 2)
///
/// ```swift
/// import StoreKit
/// import OfferSignerClient
///
/// let signer = OfferSignerClient(
///     baseURL: URL(string: "https://offers.example.com")!,
///     authorization: { try await session.currentAccessToken() }  // your own login token
/// )
///
/// // Signs (JWS where the OS takes it), purchases, verifies, finishes; one fresh signature if
/// // StoreKit calls the first one invalid. On visionOS pass `confirmIn: scene`.
/// switch try await signer.purchase(product: product, offerID: "winback50", appAccountToken: accountToken) {
/// case .purchased(let transaction): unlock(transaction.productID)
/// case .pending, .cancelled: break
/// case .notEligible(let why): showWhy(why.reasons, retryAfter: why.eligibleFrom)
/// }
/// ```
///
/// The pieces stay public for apps that own their purchase flow:
/// ``signPromotionalOffer(productID:offerID:appAccountToken:formats:evidence:bundleID:transactionID:environment:)``,
/// then `offer.purchaseOptions()` for `Product.purchase(options:)`.
///
/// Errors are ``OfferSignerClientError`` values (or `CancellationError`): for example
/// `.notEligible(reasons:)` when the customer may not redeem the offer, `.rateLimited(retryAfter:)`.
public struct OfferSignerClient: Sendable {
    /// Sends one request and returns the raw response. Injected in tests.
    typealias Transport = @Sendable (URLRequest) async throws -> (Data, URLResponse)
    /// Waits before a retry. Injected in tests.
    typealias Sleeper = @Sendable (TimeInterval) async throws -> Void

    /// The service's base URL, e.g. `https://offers.example.com` or `http://127.0.0.1:8080`.
    /// Paths such as `v1/offers/signatures` are appended to it (a path prefix is kept).
    public let baseURL: URL
    public let retryPolicy: RetryPolicy
    /// Timeout for each attempt, in seconds.
    public let requestTimeout: TimeInterval

    private let authorization: @Sendable () async throws -> String?
    private let transport: Transport
    private let sleeper: Sleeper
    private let random: @Sendable () -> Double

    /// Creates a client.
    ///
    /// - Parameters:
    ///   - baseURL: The service's base URL (plain `http` works, e.g. for a loopback test server).
    ///   - authorization: Returns the bearer token for the `Authorization` header. Called before
    ///     every attempt, so it can refresh the app's own session token; return `nil` to send no
    ///     header. If it throws, the call fails with `.authorizationFailed(underlying:)`.
    ///   - session: The `URLSession` to use.
    ///   - retryPolicy: Backoff for transport errors and 503s.
    ///   - requestTimeout: Timeout for each attempt, in seconds.
    public init(
        baseURL: URL,
        authorization: @escaping @Sendable () async throws -> String?,
        session: URLSession = .shared,
        retryPolicy: RetryPolicy = .default,
        requestTimeout: TimeInterval = 20
    ) {
        self.init(
            baseURL: baseURL,
            authorization: authorization,
            retryPolicy: retryPolicy,
            requestTimeout: requestTimeout,
            transport: { request in try await session.data(for: request) },
            sleeper: { seconds in try await Task.sleep(nanoseconds: UInt64(max(0, seconds) * 1_000_000_000)) },
            random: { Double.random(in: 0..<1) }
        )
    }

    init(
        baseURL: URL,
        authorization: @escaping @Sendable () async throws -> String?,
        retryPolicy: RetryPolicy,
        requestTimeout: TimeInterval = 20,
        transport: @escaping Transport,
        sleeper: @escaping Sleeper,
        random: @escaping @Sendable () -> Double
    ) {
        self.baseURL = baseURL
        self.authorization = authorization
        self.retryPolicy = retryPolicy
        self.requestTimeout = requestTimeout
        self.transport = transport
        self.sleeper = sleeper
        self.random = random
    }

    // MARK: - API

    /// Asks the service to sign a promotional offer (`POST /v1/offers/signatures`).
    ///
    /// - Parameters:
    ///   - productID: The subscription's product identifier.
    ///   - offerID: The promotional offer identifier from App Store Connect.
    ///   - appAccountToken: Binds the signature to this token; the purchase must then carry the
    ///     same token (the StoreKit helpers add it). When `nil`, the service may still bind the
    ///     signature to the signed-in user's token (user JWTs); it is in the result's
    ///     `appAccountToken`.
    ///   - formats: Which signatures to return; `nil` (the default) asks for what this OS uses
    ///     (``StoreKitCapabilities/defaultFormats``: JWS wherever StoreKit takes it, the original
    ///     signature only where it must). `[.legacy, .jws]` lets
    ///     ``SignedPromotionalOffer/purchasePlan(now:capabilities:)`` pick. The JWS form needs the
    ///     service's key to have an issuer ID (else `422 issuer_id_missing`: pass `[.legacy]`).
    ///   - evidence: Signed transactions/renewal infos, when the service checks eligibility.
    ///   - bundleID: The app's bundle ID, when the service serves several apps.
    ///   - transactionID: Any of the customer's transaction IDs (e.g. `Transaction.originalID`): a JWS
    ///     signature is bound to it, and an offer decided on Apple's word (`historySource` `apple`)
    ///     finds the customer's history with it.
    ///   - environment: The App Store environment the customer buys in, as Apple's App Store
    ///     Server Library spells it (`Production`, `Sandbox`, `Xcode`, `LocalTesting`): map
    ///     StoreKit's `AppTransaction.shared` `environment` (`.production`, `.sandbox`, `.xcode`)
    ///     explicitly; Apple documents no raw values. Your declaration, not verified: the
    ///     service keeps it on the issuance marked declared, where it only orders the issuances a
    ///     redemption may match (its own environment first). Any other value is refused
    ///     (`400 unknown_environment`).
    /// - Returns: The signed offer; use it once, before `expiresAt`.
    /// - Throws: ``OfferSignerClientError`` (e.g. `.notEligible(_:)` with the service's whole
    ///   answer; `.invalidArgument(_:)` for `formats: []`, which is never sent), or `CancellationError`.
    public func signPromotionalOffer(
        productID: String,
        offerID: String,
        appAccountToken: UUID?,
        formats: [SignatureFormat]? = nil,
        evidence: PurchaseEvidence? = nil,
        bundleID: String? = nil,
        transactionID: String? = nil,
        environment: String? = nil
    ) async throws -> SignedPromotionalOffer {
        let formats = formats ?? StoreKitCapabilities.current.defaultFormats
        guard !formats.isEmpty else {
            throw OfferSignerClientError.invalidArgument("formats is empty; pass nil for this OS's default, or .legacy and/or .jws")
        }
        let body = SignatureRequestBody(
            productID: productID,
            offerID: offerID,
            appAccountToken: appAccountToken?.uuidString.lowercased(),
            bundleID: bundleID,
            formats: formats.map(\.rawValue),
            transactionID: transactionID,
            evidence: evidence,
            environment: environment
        )
        let data = try await send(path: ["v1", "offers", "signatures"], body: body)
        let offer: SignedPromotionalOffer
        do {
            offer = try JSONDecoder().decode(SignedPromotionalOffer.self, from: data)
        } catch {
            throw OfferSignerClientError.invalidResponse("signature response: \(error)")
        }
        try Self.validate(
            offer, productID: productID, offerID: offerID, appAccountToken: appAccountToken,
            bundleID: bundleID, formats: formats
        )
        return offer
    }

    /// Asks the service to sign an introductory-offer eligibility (`POST /v1/offers/signatures`
    /// with `formats: ["intro-eligibility"]`), for StoreKit's
    /// `Product.PurchaseOption.introductoryOfferEligibility(compactJWS:)`.
    ///
    /// Only an API client (the app's backend) may ask; a user JWT gets 403.
    ///
    /// - Parameters:
    ///   - productID: The subscription's product identifier.
    ///   - allowIntroductoryOffer: Whether the purchase may carry the introductory offer.
    ///   - transactionID: Any of the customer's transaction IDs, or their `appTransactionID`
    ///     (Apple requires one for this signature).
    ///   - offerID: The name the service's audit and catalog give this decision (StoreKit's
    ///     introductory offer has no identifier; it is not part of the JWS).
    ///   - appAccountToken: The customer's token, for the audit and per-customer rate limits.
    ///   - bundleID: The app's bundle ID, when the service serves several apps.
    public func signIntroductoryOfferEligibility(
        productID: String,
        allowIntroductoryOffer: Bool,
        transactionID: String,
        offerID: String = "introductory",
        appAccountToken: UUID? = nil,
        bundleID: String? = nil
    ) async throws -> SignedIntroductoryOfferEligibility {
        let body = SignatureRequestBody(
            productID: productID,
            offerID: offerID,
            appAccountToken: appAccountToken?.uuidString.lowercased(),
            bundleID: bundleID,
            formats: ["intro-eligibility"],
            transactionID: transactionID,
            evidence: nil,
            allowIntroductoryOffer: allowIntroductoryOffer
        )
        let data = try await send(path: ["v1", "offers", "signatures"], body: body)
        let signed: SignedIntroductoryOfferEligibility
        do {
            signed = try JSONDecoder().decode(SignedIntroductoryOfferEligibility.self, from: data)
        } catch {
            throw OfferSignerClientError.invalidResponse("intro-eligibility response: \(error)")
        }
        guard signed.productID == productID, signed.transactionID == transactionID,
              signed.allowIntroductoryOffer == allowIntroductoryOffer, bundleID == nil || signed.bundleID == bundleID
        else {
            throw OfferSignerClientError.invalidResponse("the intro-eligibility signature does not answer the request")
        }
        return signed
    }

    /// Asks the service which offers the customer may redeem (`POST /v1/offers/eligibility`).
    ///
    /// - Parameters:
    ///   - offerIDs: The offers to decide; `nil` lets the service decide for all it knows.
    ///   - evidence: The customer's signed transactions and renewal infos (offers decided on the
    ///     app's word, `historySource` `client` or `apple-then-client`).
    ///   - transactionID: Any of the customer's transaction IDs (e.g. `Transaction.originalID`), for
    ///     offers decided on Apple's word (`historySource` `apple` or `apple-then-client`).
    ///   - appAccountToken: The customer's app account token, if the app uses them.
    ///   - bundleID: The app's bundle ID, when the service serves several apps.
    /// - Returns: One decision per offer, with everything the service said (reasons,
    ///   `eligibleFrom`, `historySource`, `evidenceFailures`).
    public func eligibility(
        offerIDs: [String]? = nil,
        evidence: PurchaseEvidence? = nil,
        transactionID: String? = nil,
        appAccountToken: UUID? = nil,
        bundleID: String? = nil
    ) async throws -> OfferEligibility {
        let body = EligibilityRequestBody(
            bundleID: bundleID,
            appAccountToken: appAccountToken?.uuidString.lowercased(),
            offerIDs: offerIDs,
            evidence: evidence,
            transactionID: transactionID
        )
        let data = try await send(path: ["v1", "offers", "eligibility"], body: body)
        do {
            return try JSONDecoder().decode(OfferEligibility.self, from: data)
        } catch {
            throw OfferSignerClientError.invalidResponse("eligibility response: \(error)")
        }
    }

    // MARK: - Plumbing

    /// Checks that the service answered the question that was asked.
    static func validate(
        _ offer: SignedPromotionalOffer,
        productID: String,
        offerID: String,
        appAccountToken: UUID?,
        bundleID: String?,
        formats: [SignatureFormat]
    ) throws {
        func fail(_ reason: String) -> OfferSignerClientError { .invalidResponse(reason) }
        guard offer.productID == productID else { throw fail("signed productID \(offer.productID), asked \(productID)") }
        guard offer.offerID == offerID else { throw fail("signed offerID \(offer.offerID), asked \(offerID)") }
        // Without a requested token the service may still bind one (a user JWT's own token);
        // the offer carries it and the StoreKit helpers add it to the purchase.
        if let appAccountToken, offer.appAccountToken != appAccountToken {
            throw fail("signed appAccountToken does not match the requested one")
        }
        if let bundleID, offer.bundleID != bundleID {
            throw fail("signed bundleID \(offer.bundleID), asked \(bundleID)")
        }
        let requested = formats
        if requested.contains(.legacy), offer.legacy == nil { throw fail("legacy signature missing") }
        if requested.contains(.jws), offer.jws == nil { throw fail("jws signature missing") }
    }

    func url(for path: [String]) -> URL {
        path.reduce(baseURL) { $0.appendingPathComponent($1) }
    }

    func makeRequest(path: [String], body: Data) async throws -> URLRequest {
        var request = URLRequest(url: url(for: path), cachePolicy: .reloadIgnoringLocalCacheData, timeoutInterval: requestTimeout)
        request.httpMethod = "POST"
        request.httpBody = body
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json, application/problem+json", forHTTPHeaderField: "Accept")
        let token: String?
        do {
            token = try await authorization()
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            throw OfferSignerClientError.authorizationFailed(underlying: error)
        }
        if let token, !token.isEmpty {
            request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization")
        }
        return request
    }

    /// POSTs `body` as JSON, retrying per ``retryPolicy``; returns the 2xx body or throws the
    /// mapped error.
    func send(path: [String], body: some Encodable) async throws -> Data {
        let encoded: Data
        do {
            encoded = try JSONEncoder().encode(body)
        } catch {
            throw OfferSignerClientError.invalidResponse("could not encode request: \(error)")
        }
        var attempt = 1
        while true {
            try Task.checkCancellation()
            let request = try await makeRequest(path: path, body: encoded)
            let failure: OfferSignerClientError
            var retryAfter: TimeInterval?
            do {
                let (data, response) = try await transport(request)
                guard let http = response as? HTTPURLResponse else {
                    throw OfferSignerClientError.invalidResponse("not an HTTP response")
                }
                var headers: [String: String] = [:]
                for (key, value) in http.allHeaderFields {
                    if let key = key as? String, let value = value as? String { headers[key] = value }
                }
                guard let mapped = OfferSignerClientError(status: http.statusCode, headers: headers, body: data) else {
                    return data
                }
                failure = mapped
                if http.statusCode == 503 {
                    retryAfter = OfferSignerClientError.retryAfter(in: headers, now: Date())
                }
            } catch let error as OfferSignerClientError {
                throw error
            } catch {
                if error is CancellationError || Task.isCancelled { throw CancellationError() }
                failure = .transport(underlying: error)
            }
            guard attempt < retryPolicy.maxAttempts, retryPolicy.isRetryable(failure) else {
                throw failure
            }
            let delay = retryPolicy.delay(beforeRetry: attempt, random: random(), retryAfter: retryAfter)
            try await sleeper(delay)
            attempt += 1
        }
    }
}
