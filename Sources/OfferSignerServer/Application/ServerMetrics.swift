import Foundation
import Prometheus
import Synchronization

/// The service's Prometheus metrics, in a registry owned by one application (no global
/// metrics system, so several servers can run in one process, as tests do).
///
/// Exposed: `http_requests_total` and `http_request_duration_seconds` by route, method and
/// status; `offer_signatures_issued_total` by format and key; `audit_commit_duration_seconds`,
/// `audit_commit_entries_total` and `audit_commit_failures_total`;
/// `offer_signer_rejections_total` by reason code; `offer_signer_connections_timed_out_total`;
/// `offer_signer_registry_rows_rejected` (rows of the loaded registry whose MAC did not verify),
/// `offer_signer_registry_manifest_refusals_total` (registry reads refused for their manifest) and
/// `offer_signer_audit_checkpoint_refusals_total`;
/// `offer_signer_rate_limit_per_second` and
/// `offer_signer_rate_limit_burst` by limit, with `scope="instance"`: each instance keeps its
/// own buckets, so with N instances behind a load balancer the effective limit is N times these.
final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private static let latencyBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1),
    ]

    private struct Handles {
        var requests: [String: Counter] = [:]
        var latency: [String: DurationHistogram] = [:]
        var signatures: [String: Counter] = [:]
        var rejections: [String: Counter] = [:]
        var labelled: [String: Counter] = [:]
        var offerLabels: Set<String> = []
    }

    /// Most distinct offer IDs the per-offer metrics name; further ones are counted as `other`
    /// (offer IDs come from requests, so they must not grow the metrics without bound).
    static let maximumOfferLabels = 500

    private func offerLabel(_ bundleID: String, _ offerID: String) -> String {
        handles.withLock { handles in
            let key = bundleID + "\u{1F}" + offerID
            if handles.offerLabels.contains(key) { return offerID }
            guard handles.offerLabels.count < Self.maximumOfferLabels else { return "other" }
            handles.offerLabels.insert(key)
            return offerID
        }
    }

    private let handles = Mutex(Handles())
    private let auditLatency: DurationHistogram
    private let auditEntries: Counter
    private let auditFailures: Counter
    private let connectionsTimedOut: Counter
    private let rowsRejected: Gauge
    private let checkpointRefusals: Counter
    private let manifestRefusals: Counter

    private static func name(_ name: String, unit: String, help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: name, unitName: unit, helpText: help)
    }

    init() {
        auditLatency = registry.makeDurationHistogram(descriptor: Self.name("audit_commit_duration", unit: "seconds", help: "Time to durably commit one group of audit records"), labels: [], buckets: Self.latencyBuckets)
        auditEntries = registry.makeCounter(descriptor: Self.name("audit_commit_entries", unit: "total", help: "Audit records committed"), labels: [])
        auditFailures = registry.makeCounter(descriptor: Self.name("audit_commit_failures", unit: "total", help: "Audit records that could not be committed (their signatures were withheld)"), labels: [])
        connectionsTimedOut = registry.makeCounter(
            descriptor: Self.name("offer_signer_connections_timed_out", unit: "total", help: "Connections closed because a complete request did not arrive within the idle timeout"), labels: [])
        rowsRejected = registry.makeGauge(
            descriptor: Self.name(
                "offer_signer_registry_rows_rejected", unit: "",
                help: "Key and client rows of the loaded registry left out because their MAC under the master key is missing or does not verify"))
        checkpointRefusals = registry.makeCounter(
            descriptor: Self.name("offer_signer_audit_checkpoint_refusals", unit: "total", help: "Audit checkpoints refused: the chain does not extend the last signed checkpoint, or the audit-signing key row is missing or not the master key's"),
            labels: [])
        manifestRefusals = registry.makeCounter(
            descriptor: Self.name(
                "offer_signer_registry_manifest_refusals", unit: "total",
                help: "Registry reads refused because the registry manifest does not vouch for the rows (added, deleted or restored rows) or is older than one seen (rollback); the last verified registry keeps serving"),
            labels: [])
    }

    /// A registry read the key ring refused for its manifest.
    func registryManifestRefused() {
        manifestRefusals.increment()
    }

    /// A checkpoint the audit checkpointer refused to sign.
    func auditCheckpointRefused() {
        checkpointRefusals.increment()
    }

    /// The number of registry rows the loaded key ring left out (see `KeyRing.rejectedRows`).
    func registryRowsRejected(_ count: Int) {
        rowsRejected.set(Int64(count))
    }

    func request(route: String, method: String, status: Int, duration: Duration) {
        let key = "\(route) \(method) \(status)"
        let (counter, histogram) = handles.withLock { handles -> (Counter, DurationHistogram) in
            if let counter = handles.requests[key], let histogram = handles.latency[key] { return (counter, histogram) }
            let labels = [("route", route), ("method", method), ("status", String(status))]
            let counter = registry.makeCounter(descriptor: Self.name("http_requests", unit: "total", help: "HTTP requests by route, method and status"), labels: labels)
            let histogram = registry.makeDurationHistogram(descriptor: Self.name("http_request_duration", unit: "seconds", help: "HTTP request latency by route, method and status"), labels: labels, buckets: Self.latencyBuckets)
            handles.requests[key] = counter
            handles.latency[key] = histogram
            return (counter, histogram)
        }
        counter.increment()
        histogram.recordNanoseconds(duration.nanoseconds)
    }

    func signatureIssued(format: String, keyID: String) {
        let key = "\(format) \(keyID)"
        handles.withLock { handles in
            if let counter = handles.signatures[key] { return counter }
            let counter = registry.makeCounter(descriptor: Self.name("offer_signatures_issued", unit: "total", help: "Signatures issued by format and key"), labels: [("format", format), ("key_id", keyID)])
            handles.signatures[key] = counter
            return counter
        }.increment()
    }

    /// One issuance (one audit record, whatever its formats) of an offer.
    func offerIssued(bundleID: String, offerID: String) {
        counter("offer_issuances", help: "Offer issuances (one per signing request, whatever its formats) by bundle and offer", labels: [("bundle_id", bundleID), ("offer_id", offerLabel(bundleID, offerID))]).increment()
    }

    /// A recorded redemption of a promotional offer; `matched` when the issuance that enabled it was found.
    func offerRedeemed(bundleID: String, offerID: String, matched: Bool) {
        counter(
            "offer_redemptions", help: "Promotional offer redemptions Apple reported, by bundle, offer and whether the issuance that enabled them was found",
            labels: [("bundle_id", bundleID), ("offer_id", offerLabel(bundleID, offerID)), ("matched", matched ? "true" : "false")]
        ).increment()
    }

    /// An App Store Server Notification by type and outcome (`recorded`, `duplicate`, or the problem code).
    func appleNotification(type: String, outcome: String) {
        counter("apple_notifications", help: "App Store Server Notifications V2 received, by type and outcome", labels: [("type", type), ("outcome", outcome)]).increment()
    }

    /// A history fetched from Apple, stored (`recorded`) or not (`failed`, `dropped`).
    func appleHistoryStored(_ outcome: String) {
        counter("apple_histories_stored", help: "Histories fetched from the App Store Server API and written to the store, by outcome", labels: [("outcome", outcome)]).increment()
    }

    /// A Retention Messaging request by outcome: the answer type, or the problem code it was refused with.
    func retentionRequest(_ outcome: String) {
        counter("retention_requests", help: "Retention Messaging requests by outcome (answer type or refusal code)", labels: [("outcome", outcome)]).increment()
    }

    /// A Retention Messaging answer by type and offer.
    func retentionAnswer(type: String, offerID: String?) {
        counter("retention_answers", help: "Retention Messaging answers by type and offer", labels: [("type", type), ("offer_id", offerID ?? "")]).increment()
    }

    /// A Retention Messaging request answered without an offer, by reason (`budget` is a budget miss).
    func retentionFallback(reason: String) {
        counter("retention_fallbacks", help: "Retention Messaging requests answered without an offer, by reason", labels: [("reason", reason)]).increment()
    }

    private func counter(_ name: String, help: String, labels: [(String, String)]) -> Counter {
        let key = name + labels.map { "\u{1F}\($0.0)=\($0.1)" }.joined()
        return handles.withLock { handles in
            if let counter = handles.labelled[key] { return counter }
            let counter = registry.makeCounter(descriptor: Self.name(name, unit: "total", help: help), labels: labels)
            handles.labelled[key] = counter
            return counter
        }
    }

    func rejection(_ code: String) {
        handles.withLock { handles in
            if let counter = handles.rejections[code] { return counter }
            let counter = registry.makeCounter(descriptor: Self.name("offer_signer_rejections", unit: "total", help: "Requests refused, by problem code"), labels: [("reason", code)])
            handles.rejections[code] = counter
            return counter
        }.increment()
    }

    func auditCommit(duration: Duration, entries: Int) {
        auditLatency.recordNanoseconds(duration.nanoseconds)
        auditEntries.increment(by: Int64(entries))
    }

    func auditFailure() { auditFailures.increment() }

    func connectionTimedOut() { connectionsTimedOut.increment() }
    /// Publishes the configured rate limits and their scope. Each instance counts on its own (a
    /// shared bucket would cost a database round trip per request); the HELP text and the
    /// `scope` label say so, so a dashboard can multiply by the number of instances.
    func rateLimits(_ limits: [(name: String, limit: RateLimit)]) {
        for (name, limit) in limits {
            let labels = [("limit", name), ("scope", "instance")]
            registry.makeGauge(
                descriptor: Self.name(
                    "offer_signer_rate_limit", unit: "per_second",
                    help: "Configured sustained rate per key (0: no limit), enforced per instance: with N instances the effective limit is N times this"),
                labels: labels
            ).set(limit.isUnlimited ? 0 : limit.perSecond)
            registry.makeGauge(
                descriptor: Self.name(
                    "offer_signer_rate_limit_burst", unit: "",
                    help: "Configured burst per key, enforced per instance: with N instances the effective burst is N times this"),
                labels: labels
            ).set(limit.isUnlimited ? 0 : limit.burst)
        }
    }

    func exposition() -> [UInt8] { registry.emitToBuffer() }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
