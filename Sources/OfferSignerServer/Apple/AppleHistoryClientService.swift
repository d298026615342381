import AppStoreServerAPI
import Logging
import OfferSignerEvidence
import OfferSignerEligibility
import Prometheus
import ServiceLifecycle

/// Owns the App Store Server API client of a running server: made whenever the server has an
/// offers catalog (offers with `historySource` `apple` or `apple-then-client` ask it, and
/// ``RedemptionPlacer`` places unplaced redemptions with it), with its metrics in the server's
/// registry, and shut down (its connection pool closed) when the server stops.
final class AppleHistoryClientService: Service, Sendable {
    let client: AppStoreServerAPIClient

    private init(client: AppStoreServerAPIClient) {
        self.client = client
    }

    static func make(
        _ eligibility: EligibilityConfiguration?, metrics: ServerMetrics, logger: Logger, chainCache: AppleChainValidationCache,
        onFetch: @escaping @Sendable (VerifiedHistory) -> Void
    ) throws -> AppleHistoryClientService? {
        guard let eligibility else { return nil }
        do {
            let client = try AppStoreServerAPIClient(
                configuration: eligibility.appStoreServerAPI, trustedRoots: eligibility.trustedRoots,
                metrics: AppStoreServerAPIMetrics(factory: PrometheusMetricsFactory(registry: metrics.registry)), logger: logger,
                chainCache: chainCache, onFetch: onFetch)
            return AppleHistoryClientService(client: client)
        } catch {
            throw ServerConfigurationError(error.description)
        }
    }

    func run() async throws {
        try? await gracefulShutdown()
        try await client.shutdown()
    }
}
