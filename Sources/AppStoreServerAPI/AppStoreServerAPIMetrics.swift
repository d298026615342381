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
/// by `reason`; `app_store_server_api_cache_total` by `result` (`hit`, `miss`);
/// `app_store_server_api_circuit_open` (1 open, 0 closed) by `bundle_id` and `environment`, set
/// when a lookup's outcome moves the circuit breaker of that app in that environment.
public final class AppStoreServerAPIMetrics: Sendable {
    /// A metric family this client exposes: its full Prometheus name, type and help text (the
    /// server declares each one, so a family shows on `/metrics` before its first sample).
    public struct Family: Sendable {
        public let name: String
        /// `counter`, `gauge` or `histogram`.
        public let type: String
        public let help: String
    }

    static let calls = Family(name: "app_store_server_api_calls_total", type: "counter", help: "App Store Server API calls by endpoint and outcome")
    static let callDuration = Family(name: "app_store_server_api_call_duration_seconds", type: "histogram", help: "App Store Server API call latency by endpoint and outcome")
    static let lookups = Family(name: "app_store_server_api_lookups_total", type: "counter", help: "History lookups by outcome (history, or why none was had)")
    static let lookupDuration = Family(name: "app_store_server_api_lookup_duration_seconds", type: "histogram", help: "History lookup latency (all environments and pages) by outcome")
    static let unavailable = Family(name: "app_store_server_api_unavailable_total", type: "counter", help: "Lookups that ended without a history, by reason")
    static let cacheResults = Family(name: "app_store_server_api_cache_total", type: "counter", help: "History cache lookups by result")
    static let circuitOpen = Family(
        name: "app_store_server_api_circuit_open", type: "gauge", help: "1 while the circuit breaker of an app in an environment is open (lookups fail fast), 0 once a lookup succeeds again")

    /// Every family this client can expose.
    public static let families = [calls, callDuration, lookups, lookupDuration, unavailable, cacheResults, circuitOpen]

    private let factory: any MetricsFactory
    private let counters = Mutex([String: Counter]())
    private let timers = Mutex([String: CoreMetrics.Timer]())
    private let gauges = Mutex([String: Gauge]())

    /// Metrics that go nowhere (for a one-off command).
    public static var none: AppStoreServerAPIMetrics { AppStoreServerAPIMetrics(factory: NOOPMetricsHandler.instance) }

    public init(factory: any MetricsFactory) {
        self.factory = factory
    }

    func call(endpoint: String, outcome: String, duration: Duration) {
        let dimensions = [("endpoint", endpoint), ("outcome", outcome)]
        counter(Self.calls.name, dimensions).increment()
        timer(Self.callDuration.name, dimensions).recordNanoseconds(duration.wholeNanoseconds)
    }

    func lookup(outcome: String, duration: Duration) {
        counter(Self.lookups.name, [("outcome", outcome)]).increment()
        timer(Self.lookupDuration.name, [("outcome", outcome)]).recordNanoseconds(duration.wholeNanoseconds)
    }

    func unavailable(reason: String) {
        counter(Self.unavailable.name, [("reason", reason)]).increment()
    }

    func cache(hit: Bool) {
        counter(Self.cacheResults.name, [("result", hit ? "hit" : "miss")]).increment()
    }

    /// The state of one app's circuit breaker in one environment, after a lookup's outcome.
    func circuit(bundleID: String, environment: String, open: Bool) {
        let dimensions = [("bundle_id", bundleID), ("environment", environment)]
        let key = ([Self.circuitOpen.name] + dimensions.map { "\($0.0)=\($0.1)" }).joined(separator: " ")
        gauges.withLock { gauges in
            if let gauge = gauges[key] { return gauge }
            let gauge = Gauge(label: Self.circuitOpen.name, dimensions: dimensions, factory: factory)
            gauges[key] = gauge
            return gauge
        }.record(open ? 1 : 0)
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
