import Foundation
import OfferSignerEligibility

/// How the App Store Server API client bounds its work. Passed in; every value has a default that
/// suits a signing service answering an app in real time.
///
/// Rules: one lookup (all pages of the transaction history, the subscription statuses, every retry
/// and the Sandbox fallback) never takes longer than `timeBudget`; a token lives at most 60 minutes
/// (Apple refuses longer ones); nothing here is a secret.
public struct AppStoreServerAPIConfiguration: Sendable, Hashable {
    /// Total time one lookup may take, across pages, retries and environments.
    public var timeBudget: Duration = .seconds(2)
    /// How long a looked-up history is served from memory (0 turns the cache off).
    public var cacheTTL: Duration = .seconds(60)
    /// Most histories held in the cache; the soonest to expire are dropped first.
    public var maximumCachedHistories: Int = 10_000
    /// Most HTTP/1 connections per Apple host (requests beyond it wait for a connection, within the budget).
    public var maximumConnectionsPerHost: Int = 64
    /// Most lookups asking Apple at once; further ones wait, for three quarters of the budget at
    /// most, and are refused `overloaded` (not held against Apple's host) when none made room. `nil`: half
    /// the connections per host (each lookup makes two calls at once), so a lookup asking Apple
    /// never waits for a connection.
    public var maximumConcurrentLookups: Int?
    /// How long an idle connection is kept.
    public var connectionIdleTimeout: Duration = .seconds(60)
    /// Most attempts of one HTTP call (the first included) on 5xx, 429 and network errors.
    public var maximumAttempts: Int = 4
    /// First retry delay; doubles each retry, up to `maximumBackoff` (plus up to 50 % jitter).
    public var initialBackoff: Duration = .milliseconds(50)
    /// Longest retry delay.
    public var maximumBackoff: Duration = .milliseconds(800)
    /// Most pages of one transaction history (Apple sends 20 transactions a page).
    public var maximumPages: Int = 250
    /// Largest response body accepted, in bytes.
    public var maximumResponseBytes: Int = 4 * 1024 * 1024
    /// After this many consecutive failed lookups against one host, fail fast…
    public var circuitBreakerThreshold: Int = 5
    /// …for this long, then let one trial lookup through.
    public var circuitBreakerCoolDown: Duration = .seconds(30)
    /// Lifetime of an authentication token (`exp` − `iat`); at most 60 minutes. A new token is
    /// made for every request (see ``AppStoreServerAPITokenMaker``).
    public var tokenLifetime: Duration = .seconds(300)
    /// Apple's hosts; tests and proxies use the per-app overrides (`AppStoreAppSettings`).
    public var productionBaseURL: String = AppStoreServerAPIConfiguration.appleProductionBaseURL
    public var sandboxBaseURL: String = AppStoreServerAPIConfiguration.appleSandboxBaseURL

    /// Apple's recommended production host (since May 2026).
    public static let appleProductionBaseURL = "https://api.storekit.apple.com"
    /// Apple's recommended sandbox host (since May 2026).
    public static let appleSandboxBaseURL = "https://api.storekit-sandbox.apple.com"
    /// Apple's ceiling for `exp` − `iat`.
    public static let maximumTokenLifetime: Duration = .seconds(3600)

    public init() {}

    /// The lookups allowed at once (see ``maximumConcurrentLookups``).
    public var concurrentLookups: Int { maximumConcurrentLookups ?? max(1, maximumConnectionsPerHost / 2) }

    /// Why this configuration cannot be used, or `nil` when it can.
    public var problem: String? {
        if timeBudget <= .zero { return "the time budget must be positive" }
        if cacheTTL < .zero { return "the cache lifetime must not be negative" }
        if maximumConnectionsPerHost < 1 { return "at least one connection per host is needed" }
        if let maximumConcurrentLookups, maximumConcurrentLookups < 1 { return "at least one concurrent lookup is needed" }
        if maximumAttempts < 1 { return "at least one attempt is needed" }
        if initialBackoff < .zero || maximumBackoff < initialBackoff { return "backoff must satisfy 0 <= initial <= maximum" }
        if maximumPages < 1 { return "at least one page is needed" }
        if circuitBreakerThreshold < 1 { return "the circuit breaker threshold must be at least 1" }
        if tokenLifetime <= .zero || tokenLifetime > Self.maximumTokenLifetime {
            return "the token lifetime must be positive and at most 60 minutes"
        }
        return nil
    }

    /// The base URL of `environment` for an app (its override, else Apple's host).
    public func baseURL(for environment: AppleEnvironment, app: AppStoreAppSettings) -> String {
        switch environment {
        case .sandbox: app.sandboxURL ?? sandboxBaseURL
        default: app.productionURL ?? productionBaseURL
        }
    }
}
