import AppStoreServerAPI
import Prometheus

/// One metric family the service exposes on `GET /metrics`: its full Prometheus name, its type
/// and its help text.
///
/// Rule: every family is declared here, and `ServerMetrics.exposition()` prints `# HELP` and
/// `# TYPE` for each one even before its first sample (a family with labels gets its first series
/// lazily), so dashboards and alert rules (Deploy/grafana, Deploy/prometheus) name only families
/// a fresh server already shows; `OperationsFilesTests` checks that against a real server.
struct MetricFamily: Sendable {
    let metricName: String
    /// The unit suffix (`total`, `seconds`, …) or empty.
    let unit: String
    /// `counter`, `gauge` or `histogram`.
    let type: String
    let help: String

    var name: String { unit.isEmpty ? metricName : metricName + "_" + unit }
    var descriptor: MetricNameDescriptor { MetricNameDescriptor(metricName: metricName, unitName: unit, helpText: help) }

    static let httpRequests = MetricFamily(metricName: "http_requests", unit: "total", type: "counter", help: "HTTP requests by route, method and status")
    static let httpRequestDuration = MetricFamily(
        metricName: "http_request_duration", unit: "seconds", type: "histogram", help: "HTTP request latency by route, method and status")
    static let signaturesIssued = MetricFamily(metricName: "offer_signatures_issued", unit: "total", type: "counter", help: "Signatures issued by format and key")
    static let offerIssuances = MetricFamily(
        metricName: "offer_issuances", unit: "total", type: "counter",
        help: "Offer issuances (one per signing request, whatever its formats) by bundle and offer")
    static let offerRedemptions = MetricFamily(
        metricName: "offer_redemptions", unit: "total", type: "counter",
        help: "Promotional offer redemptions Apple reported, by bundle, offer and whether the issuance that enabled them was found (unplaced: not known yet)")
    static let offerRedemptionsPlaced = MetricFamily(
        metricName: "offer_redemptions_placed", unit: "total", type: "counter",
        help: "Redemptions recorded unplaced that a fetched history placed later, by bundle, offer and outcome")
    static let redemptionPlacementLookups = MetricFamily(
        metricName: "redemption_placement_lookups", unit: "total", type: "counter",
        help: "Background lookups of Apple's history that place unplaced redemptions, by outcome")
    static let redemptionPlacementsGivenUp = MetricFamily(
        metricName: "offer_signer_redemption_placements_given_up", unit: "total", type: "counter",
        help: "Unplaced redemptions the background placement stopped asking Apple about after its attempt cap (they stay unplaced), by bundle and environment")
    static let redemptionsWithoutSignature = MetricFamily(
        metricName: "offer_signer_redemptions_without_signature", unit: "total", type: "counter",
        help:
            "Redemptions no signature of this service matches, by bundle, offer and app_account_token (present: signed elsewhere, another signer or a leaked In-App Purchase key; absent: cannot be attributed)"
    )
    static let appleNotifications = MetricFamily(
        metricName: "apple_notifications", unit: "total", type: "counter", help: "App Store Server Notifications V2 received, by type and outcome")
    static let notificationLastReceived = MetricFamily(
        metricName: "offer_signer_apple_notification_last_received_timestamp", unit: "seconds", type: "gauge",
        help: "When this instance last stored an App Store Server Notification (UNIX seconds), by bundle and environment")
    static let appleHistoriesStored = MetricFamily(
        metricName: "apple_histories_stored", unit: "total", type: "counter",
        help: "Histories fetched from the App Store Server API and written to the store, by outcome")
    static let retentionRequests = MetricFamily(
        metricName: "retention_requests", unit: "total", type: "counter", help: "Retention Messaging requests by outcome (answer type or refusal code)")
    static let retentionAnswers = MetricFamily(metricName: "retention_answers", unit: "total", type: "counter", help: "Retention Messaging answers by type and offer")
    static let retentionFallbacks = MetricFamily(
        metricName: "retention_fallbacks", unit: "total", type: "counter", help: "Retention Messaging requests answered without an offer, by reason")
    static let retentionDuration = MetricFamily(
        metricName: "offer_signer_retention_answer_duration", unit: "seconds", type: "histogram",
        help: "Time from a Retention Messaging request's arrival to its answer or refusal (Apple fails a request after about 0.7 s)")
    static let rejections = MetricFamily(metricName: "offer_signer_rejections", unit: "total", type: "counter", help: "Requests refused, by problem code")
    static let auditCommitDuration = MetricFamily(
        metricName: "audit_commit_duration", unit: "seconds", type: "histogram", help: "Time to durably commit one group of audit records")
    static let auditCommitEntries = MetricFamily(metricName: "audit_commit_entries", unit: "total", type: "counter", help: "Audit records committed")
    static let auditCommitGroupSize = MetricFamily(
        metricName: "offer_signer_audit_commit_group_size", unit: "", type: "histogram", help: "Audit records per durable group commit")
    static let auditCommitFailures = MetricFamily(
        metricName: "audit_commit_failures", unit: "total", type: "counter", help: "Audit records that could not be committed (their signatures were withheld)")
    static let checkpointRefusals = MetricFamily(
        metricName: "offer_signer_audit_checkpoint_refusals", unit: "total", type: "counter",
        help: "Audit checkpoints refused: the chain does not extend the last signed checkpoint, or the audit-signing key row is missing or not the master key's")
    static let ready = MetricFamily(
        metricName: "offer_signer_ready", unit: "", type: "gauge",
        help: "1 while /readyz answers 200 (the store answers, audit commits get through, every app has a usable active key), else 0; set at each readiness check (every second)")
    static let connectionsTimedOut = MetricFamily(
        metricName: "offer_signer_connections_timed_out", unit: "total", type: "counter",
        help: "Connections closed because a complete request did not arrive within the idle timeout")
    static let registryRowsRejected = MetricFamily(
        metricName: "offer_signer_registry_rows_rejected", unit: "", type: "gauge",
        help: "Key and client rows of the loaded registry left out because their MAC under the master key is missing or does not verify")
    static let registryManifestRefusals = MetricFamily(
        metricName: "offer_signer_registry_manifest_refusals", unit: "total", type: "counter",
        help: "Registry reads refused because the registry manifest does not vouch for the rows (added, deleted or restored rows) or is older than one seen (rollback); the last verified registry keeps serving")
    static let rateLimit = MetricFamily(
        metricName: "offer_signer_rate_limit", unit: "per_second", type: "gauge",
        help: "Configured sustained rate per key (0: no limit), enforced per instance: with N instances the effective limit is N times this")
    static let notificationCatchUpAbandoned = MetricFamily(
        metricName: "offer_signer_notification_catch_up_abandoned", unit: "total", type: "counter",
        help: "Notifications that kept failing for over 24 hours and no longer hold the scheduled catch-up's watermark, by bundle and environment")
    static let notificationCatchUpRounds = MetricFamily(
        metricName: "offer_signer_notification_catch_up_rounds", unit: "total", type: "counter",
        help: "Scheduled notification catch-up rounds that held the lock, by bundle, environment and outcome: asked (Apple was asked), skipped_recent_round (a last run within 0.9 interval: expected on all but one of several instances), skipped_last_run_ahead (a last run up to 60 s after the round's time: clock skew, or a database writer skipping rounds)")
    static let storedHistoryWithLock = MetricFamily(
        metricName: "offer_signer_stored_history_with_lock", unit: "total", type: "counter",
        help: "Signing decisions and Retention Messaging answers on a stored history decoded before, its version read with the customer lock: decided there (decided), or decided again before the lock because the history had moved or was no longer current or complete (moved)")
    static let rateLimitBurst = MetricFamily(
        metricName: "offer_signer_rate_limit_burst", unit: "", type: "gauge",
        help: "Configured burst per key, enforced per instance: with N instances the effective burst is N times this")

    /// The service's own families (the App Store Server API client's are `AppStoreServerAPIMetrics.families`).
    static let server: [MetricFamily] = [
        httpRequests, httpRequestDuration, signaturesIssued, offerIssuances, offerRedemptions, offerRedemptionsPlaced, redemptionPlacementLookups, redemptionPlacementsGivenUp, redemptionsWithoutSignature, appleNotifications,
        notificationLastReceived, appleHistoriesStored, retentionRequests, retentionAnswers, retentionFallbacks, retentionDuration, rejections,
        auditCommitDuration, auditCommitEntries, auditCommitGroupSize, auditCommitFailures, checkpointRefusals, ready, connectionsTimedOut,
        registryRowsRejected, registryManifestRefusals, rateLimit, rateLimitBurst, notificationCatchUpAbandoned,
        notificationCatchUpRounds, storedHistoryWithLock,
    ]

    /// Every family `GET /metrics` declares: `(name, type, help)`.
    static var all: [(name: String, type: String, help: String)] {
        server.map { ($0.name, $0.type, $0.help) } + AppStoreServerAPIMetrics.families.map { ($0.name, $0.type, $0.help) }
    }
}
