import Foundation
import HTTPTypes
import Hummingbird
import OfferSignerCore
import OfferSignerStorage

/// Authenticates a request and applies the per-principal rate limit.
///
/// Rules: without `--dev`, a request needs `Authorization: Bearer` with either an API key of a
/// non-revoked client or, when configured, a valid end-user JWT; anything else is 401 and
/// nothing is signed. Then the principal's token bucket must have a token (429 otherwise).
struct RequestAuthenticator: Sendable {
    let developmentMode: Bool
    let userJWT: UserJWTVerifier?
    let limiter: RateLimiter

    func authenticate(_ request: Request, ring: KeyRing) async throws -> Principal {
        let principal = try await identify(request, ring: ring)
        if case .limited(let retryAfter) = limiter.take(principal.identity) {
            throw APIProblem.rateLimited("rate limit exceeded for this caller", retryAfter: retryAfter)
        }
        return principal
    }

    private func identify(_ request: Request, ring: KeyRing) async throws -> Principal {
        guard let authorization = request.headers.value(of: .authorization) else {
            if developmentMode { return .development }
            throw APIProblem.unauthorized
        }
        guard authorization.count > 7, authorization.prefix(7).lowercased() == "bearer " else {
            throw APIProblem.unauthorized("the Authorization header must be 'Bearer <API key or user JWT>'")
        }
        let credential = authorization.dropFirst(7).drop(while: { $0 == " " })
        if credential.hasPrefix(APIClientCredentials.prefix) {
            guard let client = APIClientCredentials.authenticate(credential, clients: ring.clients) else {
                throw APIProblem.unauthorized("unknown or revoked API key")
            }
            return .client(client)
        }
        guard let userJWT else {
            throw APIProblem.unauthorized("unknown or revoked API key")
        }
        do {
            return try await userJWT.verify(credential)
        } catch {
            switch error {
            case .invalid(let reason): throw APIProblem.unauthorized(reason)
            }
        }
    }
}
