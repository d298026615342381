import AppleTestChain
import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HummingbirdTesting
import OfferSignerClient
import OfferSignerEligibility
import OfferSignerServer
import SwiftASN1
import Testing
import X509

// Shared pieces for driving the real `OfferSignerClient` (URLSession) against the real server
// that `TestServer.live` runs on loopback. Nothing here stands in for the client or the server.

/// Counts calls to the client's `authorization` closure: one per HTTP attempt, so it also
/// counts retries.
actor CallCounter {
    private(set) var count = 0

    func increment() -> Int {
        count += 1
        return count
    }
}

/// A retry policy that keeps tests fast but still retries: `attempts` tries, 10 ms apart.
func quickRetries(_ attempts: Int = 3) -> RetryPolicy {
    RetryPolicy(maxAttempts: attempts, baseDelay: 0.01, maxDelay: 0.05, jitter: 0)
}

/// The real client against `http://127.0.0.1:<port>`, over its own ephemeral `URLSession`.
///
/// - Parameters:
///   - token: The bearer token the authorization closure returns (nil: no header).
///   - counter: Incremented on every call of the authorization closure.
func makeClient(
    port: Int,
    token: String?,
    counter: CallCounter,
    retryPolicy: RetryPolicy = quickRetries()
) throws -> OfferSignerClient {
    let baseURL = try #require(URL(string: "http://127.0.0.1:\(port)"))
    return OfferSignerClient(
        baseURL: baseURL,
        authorization: {
            _ = await counter.increment()
            return token
        },
        session: URLSession(configuration: .ephemeral),
        retryPolicy: retryPolicy,
        requestTimeout: 15
    )
}

extension TestClientProtocol {
    /// The port the live test server is bound to.
    func boundPort(sourceLocation: SourceLocation = #_sourceLocation) throws -> Int {
        try #require(port, "the live test server has no port", sourceLocation: sourceLocation)
    }
}

/// Runs `body` and returns the `OfferSignerClientError` it threw; records an issue (and returns
/// nil) when it returned normally or threw something else.
func clientError<Value>(
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Value
) async -> OfferSignerClientError? {
    do {
        let value = try await body()
        Issue.record("expected an OfferSignerClientError, got \(value)", sourceLocation: sourceLocation)
        return nil
    } catch let error as OfferSignerClientError {
        return error
    } catch {
        Issue.record("expected an OfferSignerClientError, got \(type(of: error)): \(error)", sourceLocation: sourceLocation)
        return nil
    }
}

// MARK: - End-user JWT (HS256), as an app's own auth server would issue

enum UserJWT {
    static let secret = "a-shared-secret-of-at-least-32-bytes!!"
    static let issuer = "https://auth.example.com"
    static let audience = "offer-signer"
    static let tokenClaim = "https://example.com/app_account_token"

    static var configuration: UserJWTConfiguration {
        UserJWTConfiguration(jwksJSON: nil, hs256Secret: secret, issuer: issuer, audience: audience, binding: .claim(tokenClaim))
    }

    /// End users get catalogued offers only: the one these tests sign, without rules.
    static var catalog: EligibilityConfiguration {
        try! EligibilityConfiguration(
            catalogJSON: Data(
                #"{"offers": [{"offerID": "WINBACK50", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"}]}"#
                    .utf8), trustedRootPEMs: [])
    }

    /// A compact HS256 JWT for `sub` bound to `appAccountToken`, valid for ten minutes.
    static func token(appAccountToken: UUID, subject: String = "user-42") throws -> String {
        let header = try JSONSerialization.data(withJSONObject: ["alg": "HS256", "typ": "JWT"], options: [.sortedKeys])
        let claims: [String: Any] = [
            "iss": issuer, "aud": audience, "sub": subject,
            "exp": Int(Date().addingTimeInterval(600).timeIntervalSince1970),
            tokenClaim: appAccountToken.uuidString.lowercased(),
        ]
        let payload = try JSONSerialization.data(withJSONObject: claims, options: [.sortedKeys])
        let signingInput = TestAppleChain.base64URL(header) + "." + TestAppleChain.base64URL(payload)
        let mac = HMAC<SHA256>.authenticationCode(for: Data(signingInput.utf8), using: SymmetricKey(data: Data(secret.utf8)))
        return signingInput + "." + TestAppleChain.base64URL(Data(mac))
    }
}

// MARK: - Win-back eligibility: a catalog and Apple-like signed history

enum WinBack {
    static let token = UUID(uuidString: "7e3fb20b-4cdb-47cc-936d-99d65f608138")!
    static let catalog = #"""
    {"offers": [
      {"offerID": "wb1", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
       "kind": "win-back", "rules": {"minPaidMonths": 3, "lapsedMonths": {"min": 1}, "waitBetweenOffersMonths": 12}},
      {"offerID": "goodwill", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"}
    ]}
    """#

    /// A server whose eligibility trusts `chain`'s root (as `--apple-root` does).
    static func server(_ chain: TestAppleChain, configure: (inout ServerConfiguration) -> Void = { _ in }) async throws -> TestServer {
        let rootPEM = try chain.root.serializeAsPEM().pemString
        let eligibility = try EligibilityConfiguration(catalogJSON: Data(catalog.utf8), trustedRootPEMs: [rootPEM])
        return try await TestServer { configuration in
            configuration.eligibility = eligibility
            configure(&configuration)
        }
    }

    static func monthsAgo(_ months: Int, from now: Date = Date()) -> Date {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        return calendar.date(byAdding: .month, value: -months, to: now)!
    }

    /// Six paid monthly periods that ended `lapsedMonths` ago, each an App Store-style JWS.
    /// With `redeemedLast`, the last period is a redemption of `wb1` (as the app shows once it redeemed it).
    static func evidence(_ chain: TestAppleChain, lapsedMonths: Int = 2, token: UUID = token, redeemedLast: Bool = false) throws -> PurchaseEvidence {
        let transactions = try (0..<6).map { index in
            let start = monthsAgo(lapsedMonths + 6 - index)
            let end = monthsAgo(lapsedMonths + 5 - index)
            var payload: [String: Any] = [
                "transactionId": "20000001\(index)", "originalTransactionId": "200000010", "bundleId": "com.example.app",
                "productId": "pro.monthly", "subscriptionGroupIdentifier": "G1",
                "purchaseDate": TestAppleChain.milliseconds(start), "expiresDate": TestAppleChain.milliseconds(end),
                "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED", "price": 4990, "currency": "USD",
                "storefront": "USA", "environment": "Production", "appAccountToken": token.uuidString.lowercased(),
                "signedDate": TestAppleChain.milliseconds(end),
            ]
            if redeemedLast && index == 5 {
                payload.merge(["offerType": 2, "offerIdentifier": "wb1", "offerDiscountType": "PAY_UP_FRONT"]) { $1 }
            }
            return try chain.signJWS(payload)
        }
        return PurchaseEvidence(signedTransactions: transactions)
    }
}
