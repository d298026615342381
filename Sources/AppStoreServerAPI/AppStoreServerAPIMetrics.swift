import CoreMetrics
import Foundation
import Synchronization

/// The client's metrics, made by a swift-metrics factory that is passed in (the server passes its
/// Prometheus registry's factory; no global metrics system is touched).
///
/// Exposed: `app_store_server_api_calls_total` and `app_store_server_api_call_duration_seconds` by
/// `endpoint` (`transaction_history`, `subscription_statuses`) and `outcome` (`ok`, `not_found`,
/// `rate_limited`, `server_error`, `unauthorized`, `rejected`, `network_error`, `timeout`);
/// `app_store_server_api_lookups_total` and `app_store_server_api_lookup_duration_seconds` by
/// `outcome` (`history` or a `HistoryUnavailable` reason); `app_store_server_api_unavailable_total`
/// by `reason`; `app_store_server_api_cache_total` by `result` (`hit`, `miss`).
public final class AppStoreServerAPIMetrics: Sendable {
    private let factory: any MetricsFactory
    private let counters = Mutex([String: Counter]())
    private let timers = Mutex([String: CoreMetrics.Timer]())

    /// Metrics that go nowhere (for a one-off command).
    public static var none: AppStoreServerAPIMetrics { AppStoreServerAPIMetrics(factory: NOOPMetricsHandler.instance) }

    public init(factory: any MetricsFactory) {
        self.factory = factory
    }

    func call(endpoint: String, outcome: String, duration: Duration) {
        let dimensions = [("endpoint", endpoint), ("outcome", outcome)]
        counter("app_store_server_api_calls_total", dimensions).increment()
        timer("app_store_server_api_call_duration_seconds", dimensions).recordNanoseconds(duration.wholeNanoseconds)
    }

    func lookup(outcome: String, duration: Duration) {
        counter("app_store_server_api_lookups_total", [("outcome", outcome)]).increment()
        timer("app_store_server_api_lookup_duration_seconds", [("outcome", outcome)]).recordNanoseconds(duration.wholeNanoseconds)
    }

    func unavailable(reason: String) {
        counter("app_store_server_api_unavailable_total", [("reason", reason)]).increment()
    }

    func cache(hit: Bool) {
        counter("app_store_server_api_cache_total", [("result", hit ? "hit" : "miss")]).increment()
    }

    private func counter(_ label: String, _ dimensions: [(String, String)]) -> Counter {
        let key = ([label] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
        return counters.withLock { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: label, dimensions: dimensions, factory: factory)
            counters[key] = counter
            return counter
        }
    }

    private func timer(_ label: String, _ dimensions: [(String, String)]) -> CoreMetrics.Timer {
        let key = ([label] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
        return timers.withLock { timers in
            if let timer = timers[key] { return timer }
            let timer = CoreMetrics.Timer(label: label, dimensions: dimensions, factory: factory)
            timers[key] = timer
            return timer
        }
    }
}
