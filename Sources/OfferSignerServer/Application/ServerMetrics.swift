import Foundation
import OfferSignerStorage
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
/// own buckets, so with N instances behind a load balancer the effective limit is N times these;
/// `offer_signer_ready`, `offer_signer_audit_commit_group_size`,
/// `offer_signer_retention_answer_duration_seconds`,
/// `offer_signer_apple_notification_last_received_timestamp_seconds` by bundle and environment and
/// `offer_signer_redemptions_without_signature_total`. Every family is declared in
/// `MetricFamily` and shown (`# HELP`, `# TYPE`) before its first sample.
final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private static let latencyBuckets: [Duration] = [
        .microseconds(250), .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .seconds(1),
    ]
    /// Finer around Apple's limit for a Retention Messaging answer (about 700 ms) and the default
    /// budget (500 ms), so a quantile near the limit is read from buckets, not interpolated across 250 ms–1 s.
    private static let retentionBuckets: [Duration] = [
        .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(200), .milliseconds(300),
        .milliseconds(400), .milliseconds(500), .milliseconds(600), .milliseconds(700), .milliseconds(1000), .milliseconds(2000),
    ]
    private static let groupSizeBuckets: [Double] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]

    /// The labels of one route's request metrics. A struct key, not an interpolated string:
    /// the lookup runs on every request.
    private struct RequestKey: Hashable {
        var route: String
        var method: String
        var status: Int
    }

    /// Two label values (format and key; bundle and offer).
    private struct PairKey: Hashable {
        var first: String
        var second: String
    }

    private struct Handles {
        var requests: [RequestKey: (Counter, DurationHistogram)] = [:]
        var signatures: [PairKey: Counter] = [:]
        var rejections: [String: Counter] = [:]
        var labelled: [String: Counter] = [:]
        var notificationTimes: [String: Gauge] = [:]
        /// `offer_issuances` by bundle and offer as requested (an offer past the label limit
        /// maps to its bundle's `other` counter).
        var issuances: [PairKey: Counter] = [:]
        var offerLabels: Set<PairKey> = []
    }

    /// Most distinct offer IDs the per-offer metrics name; further ones are counted as `other`
    /// (offer IDs come from requests, so they must not grow the metrics without bound).
    static let maximumOfferLabels = 500

    private func offerLabel(_ bundleID: String, _ offerID: String) -> String {
        handles.withLock { handles in Self.offerLabel(PairKey(first: bundleID, second: offerID), in: &handles) }
    }

    private static func offerLabel(_ key: PairKey, in handles: inout Handles) -> String {
        if handles.offerLabels.contains(key) { return key.second }
        guard handles.offerLabels.count < maximumOfferLabels else { return "other" }
        handles.offerLabels.insert(key)
        return key.second
    }

    private let handles = Mutex(Handles())
    private let auditLatency: DurationHistogram
    private let auditEntries: Counter
    private let auditFailures: Counter
    private let connectionsTimedOut: Counter
    private let rowsRejected: Gauge
    private let checkpointRefusals: Counter
    private let auditGroupSize: ValueHistogram
    private let ready: Gauge
    private let retentionLatency: DurationHistogram
    private let manifestRefusals: Counter

    init() {
        auditLatency = registry.makeDurationHistogram(descriptor: MetricFamily.auditCommitDuration.descriptor, labels: [], buckets: Self.latencyBuckets)
        auditEntries = registry.makeCounter(descriptor: MetricFamily.auditCommitEntries.descriptor, labels: [])
        auditFailures = registry.makeCounter(descriptor: MetricFamily.auditCommitFailures.descriptor, labels: [])
        auditGroupSize = registry.makeValueHistogram(descriptor: MetricFamily.auditCommitGroupSize.descriptor, labels: [], buckets: Self.groupSizeBuckets)
        connectionsTimedOut = registry.makeCounter(descriptor: MetricFamily.connectionsTimedOut.descriptor, labels: [])
        rowsRejected = registry.makeGauge(descriptor: MetricFamily.registryRowsRejected.descriptor)
        checkpointRefusals = registry.makeCounter(descriptor: MetricFamily.checkpointRefusals.descriptor, labels: [])
        // 0 until the first readiness check says otherwise.
        ready = registry.makeGauge(descriptor: MetricFamily.ready.descriptor)
        retentionLatency = registry.makeDurationHistogram(descriptor: MetricFamily.retentionDuration.descriptor, labels: [], buckets: Self.retentionBuckets)
        manifestRefusals = registry.makeCounter(descriptor: MetricFamily.registryManifestRefusals.descriptor, labels: [])
    }

    /// A registry read the key ring refused for its manifest.
    func registryManifestRefused() {
        manifestRefusals.increment()
    }

    /// The outcome of a readiness check (`ReadinessMonitor`): 1 ready, 0 not.
    func readiness(_ isReady: Bool) {
        ready.set(Int64(isReady ? 1 : 0))
    }

    /// One Retention Messaging request, from its arrival to its answer or refusal.
    func retentionAnswered(after duration: Duration) {
        retentionLatency.recordNanoseconds(duration.nanoseconds)
    }

    /// A notification stored now (`recorded`): the time it was stored, per bundle and environment.
    func notificationStored(bundleID: String, environment: String, at date: Date) {
        let key = bundleID + "\u{1F}" + environment
        handles.withLock { handles in
            if let gauge = handles.notificationTimes[key] { return gauge }
            let gauge = registry.makeGauge(descriptor: MetricFamily.notificationLastReceived.descriptor, labels: [("bundle_id", bundleID), ("environment", environment)])
            handles.notificationTimes[key] = gauge
            return gauge
        }.set(date.timeIntervalSince1970.rounded(.down))
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
        let key = RequestKey(route: route, method: method, status: status)
        let (counter, histogram) = handles.withLock { handles -> (Counter, DurationHistogram) in
            if let handles = handles.requests[key] { return handles }
            let labels = [("route", route), ("method", method), ("status", String(status))]
            let counter = registry.makeCounter(descriptor: MetricFamily.httpRequests.descriptor, labels: labels)
            let histogram = registry.makeDurationHistogram(descriptor: MetricFamily.httpRequestDuration.descriptor, labels: labels, buckets: Self.latencyBuckets)
            handles.requests[key] = (counter, histogram)
            return (counter, histogram)
        }
        counter.increment()
        histogram.recordNanoseconds(duration.nanoseconds)
    }

    func signatureIssued(format: String, keyID: String) {
        let key = PairKey(first: format, second: keyID)
        handles.withLock { handles in
            if let counter = handles.signatures[key] { return counter }
            let counter = registry.makeCounter(descriptor: MetricFamily.signaturesIssued.descriptor, labels: [("format", format), ("key_id", keyID)])
            handles.signatures[key] = counter
            return counter
        }.increment()
    }

    /// One issuance (one audit record, whatever its formats) of an offer.
    ///
    /// On every signature: one lookup by (bundle, offer) under one lock; the label limit and the
    /// registry are consulted only the first time a pair is seen.
    func offerIssued(bundleID: String, offerID: String) {
        let key = PairKey(first: bundleID, second: offerID)
        handles.withLock { handles in
            if let counter = handles.issuances[key] { return counter }
            let labels = [("bundle_id", bundleID), ("offer_id", Self.offerLabel(key, in: &handles))]
            let counter = Self.counter(MetricFamily.offerIssuances, labels: labels, registry: registry, in: &handles)
            // Offers past the label limit share `other`: only the first `maximumOfferLabels`
            // pairs (and as many more) are remembered here, so the table stays bounded too.
            if handles.issuances.count < 2 * Self.maximumOfferLabels { handles.issuances[key] = counter }
            return counter
        }.increment()
    }

    /// A redemption recorded (`matched` `true`, `false`, or `unplaced`: not known yet), or one
    /// recorded unplaced before and placed now (`offer_redemptions_placed_total`, `matched` `true`,
    /// `false`, or `continues`: it only continued a redemption and was removed). One no signature
    /// matches is also counted by whether the purchase carried an appAccountToken (with one, the
    /// offer was signed elsewhere: another signer or a leaked key); an unplaced one only once placed.
    func offerRedeemed(_ redemption: OfferRedemption) {
        let bundleID = redemption.candidate.bundleID
        let offer = offerLabel(bundleID, redemption.candidate.offerID)
        if redemption.placedAt != nil {
            let outcome = redemption.isMatched ? "true" : (redemption.candidate.continuesRedemption ? "continues" : "false")
            counter(MetricFamily.offerRedemptionsPlaced, labels: [("bundle_id", bundleID), ("offer_id", offer), ("matched", outcome)]).increment()
            if outcome == "false" { redemptionWithoutSignature(redemption, offer: offer) }
            return
        }
        let matched = redemption.isMatched ? "true" : (redemption.isUnplaced ? "unplaced" : "false")
        counter(MetricFamily.offerRedemptions, labels: [("bundle_id", bundleID), ("offer_id", offer), ("matched", matched)]).increment()
        if matched == "false" { redemptionWithoutSignature(redemption, offer: offer) }
    }

    private func redemptionWithoutSignature(_ redemption: OfferRedemption, offer: String) {
        counter(
            MetricFamily.redemptionsWithoutSignature,
            labels: [
                ("bundle_id", redemption.candidate.bundleID), ("offer_id", offer),
                ("app_account_token", redemption.candidate.appAccountToken != nil ? "present" : "absent"),
            ]
        ).increment()
    }

    /// A background lookup of Apple's history to place unplaced redemptions (`RedemptionPlacer`):
    /// `history` (answered and stored), or why not (a `HistoryUnavailable` reason, `store_failed`).
    func redemptionPlacementLookup(outcome: String) {
        counter(MetricFamily.redemptionPlacementLookups, labels: [("outcome", outcome)]).increment()
    }

    /// An unplaced redemption the background placement stopped asking about (its attempt cap);
    /// `bundleID` is a served bundle and `environment` Apple's name, never a row's raw value.
    func redemptionPlacementGivenUp(bundleID: String, environment: String) {
        counter(MetricFamily.redemptionPlacementsGivenUp, labels: [("bundle_id", bundleID), ("environment", environment)]).increment()
    }

    /// A notification that failed for over 24 hours and no longer holds the catch-up's watermark.
    func notificationCatchUpAbandoned(bundleID: String, environment: String) {
        counter(MetricFamily.notificationCatchUpAbandoned, labels: [("bundle_id", bundleID), ("environment", environment)]).increment()
    }

    /// A scheduled catch-up round that held the lock: `asked`, `skipped_recent_round` or
    /// `skipped_last_run_ahead` (`NotificationCatchUp`; labels are the configured target's).
    func notificationCatchUpRound(bundleID: String, environment: String, outcome: String) {
        counter(MetricFamily.notificationCatchUpRounds, labels: [("bundle_id", bundleID), ("environment", environment), ("outcome", outcome)]).increment()
    }

    /// An App Store Server Notification by type and outcome (`recorded`, `duplicate`, or the problem code).
    func appleNotification(type: String, outcome: String) {
        counter(MetricFamily.appleNotifications, labels: [("type", type), ("outcome", outcome)]).increment()
    }

    /// A history fetched from Apple, stored (`recorded`) or not (`failed`, `dropped`).
    func appleHistoryStored(_ outcome: String) {
        counter(MetricFamily.appleHistoriesStored, labels: [("outcome", outcome)]).increment()
    }

    /// A Retention Messaging request by outcome: the answer type, or the problem code it was refused with.
    func retentionRequest(_ outcome: String) {
        counter(MetricFamily.retentionRequests, labels: [("outcome", outcome)]).increment()
    }

    /// A Retention Messaging answer by type and offer.
    func retentionAnswer(type: String, offerID: String?) {
        counter(MetricFamily.retentionAnswers, labels: [("type", type), ("offer_id", offerID ?? "")]).increment()
    }

    /// A Retention Messaging request answered without an offer, by reason (`budget` is a budget miss).
    func retentionFallback(reason: String) {
        counter(MetricFamily.retentionFallbacks, labels: [("reason", reason)]).increment()
    }

    /// A signing decision or Retention Messaging answer on a stored history whose version was read
    /// with the customer lock: `decided` under the lock, or `moved` (decided again before the lock).
    func storedHistoryWithLock(_ outcome: String) {
        counter(MetricFamily.storedHistoryWithLock, labels: [("outcome", outcome)]).increment()
    }

    private func counter(_ family: MetricFamily, labels: [(String, String)]) -> Counter {
        handles.withLock { handles in Self.counter(family, labels: labels, registry: registry, in: &handles) }
    }

    private static func counter(
        _ family: MetricFamily, labels: [(String, String)], registry: PrometheusCollectorRegistry, in handles: inout Handles
    ) -> Counter {
        let key = family.metricName + labels.map { "\u{1F}\($0.0)=\($0.1)" }.joined()
        if let counter = handles.labelled[key] { return counter }
        let counter = registry.makeCounter(descriptor: family.descriptor, labels: labels)
        handles.labelled[key] = counter
        return counter
    }

    func rejection(_ code: String) {
        handles.withLock { handles in
            if let counter = handles.rejections[code] { return counter }
            let counter = registry.makeCounter(descriptor: MetricFamily.rejections.descriptor, labels: [("reason", code)])
            handles.rejections[code] = counter
            return counter
        }.increment()
    }

    func auditCommit(duration: Duration, entries: Int) {
        auditLatency.recordNanoseconds(duration.nanoseconds)
        auditEntries.increment(by: Int64(entries))
        auditGroupSize.record(Double(entries))
    }

    func auditFailure() { auditFailures.increment() }

    func connectionTimedOut() { connectionsTimedOut.increment() }
    /// Publishes the configured rate limits and their scope. Each instance counts on its own (a
    /// shared bucket would cost a database round trip per request); the HELP text and the
    /// `scope` label say so, so a dashboard can multiply by the number of instances.
    func rateLimits(_ limits: [(name: String, limit: RateLimit)]) {
        for (name, limit) in limits {
            let labels = [("limit", name), ("scope", "instance")]
            registry.makeGauge(descriptor: MetricFamily.rateLimit.descriptor, labels: labels).set(limit.isUnlimited ? 0 : limit.perSecond)
            registry.makeGauge(descriptor: MetricFamily.rateLimitBurst.descriptor, labels: labels).set(limit.isUnlimited ? 0 : limit.burst)
        }
    }

    /// The registry's text, then `# HELP` and `# TYPE` for each declared family that has no series
    /// yet (the text format allows a family without samples), so every family of `MetricFamily.all`
    /// is always named.
    func exposition() -> [UInt8] {
        var buffer = registry.emitToBuffer()
        var present = Set<Substring>()
        let text = String(decoding: buffer, as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("# TYPE ") {
            if let name = line.dropFirst(7).split(separator: " ").first { present.insert(name) }
        }
        for family in MetricFamily.all where !present.contains(Substring(family.name)) {
            buffer.append(contentsOf: "# HELP \(family.name) \(family.help)\n# TYPE \(family.name) \(family.type)\n".utf8)
        }
        return buffer
    }
}

extension Duration {
    var nanoseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1_000_000_000 + attoseconds / 1_000_000_000
    }
}
