import AppStoreServerAPI
import Foundation
import OfferSignerStorage

/// The Apple page (`/admin/apple`): App Store Server Notifications per type per day (30 days),
/// the last one received per app and environment (a gap of more than a day is flagged), the
/// scheduled catch-up's watermark, and this instance's App Store Server API calls, errors and
/// circuit breakers.
struct AdminApplePage: Sendable {
    static let days = 30
    /// No notification for this long is flagged: Apple sends one for every renewal, so an app
    /// with subscribers that hears nothing for a day is likely not receiving them.
    static let gapSeconds: TimeInterval = 86_400

    struct AppEnvironment: Sendable {
        var bundleID: String
        var environment: String
        var lastReceived: Date?
        var watermark: Date?
    }

    var perDay: [AppleNotificationDay]
    var apps: [AppEnvironment]
    var calls: [(labels: [String: String], value: Double)]
    var unavailable: [(labels: [String: String], value: Double)]
    var breakers: [(bundleID: String, host: String, open: Bool)]
    var appleAPIConfigured: Bool
    var since: Date
    var generatedAt: Date

    static func load(
        store: any OfferSignerStore, bundleIDs: Set<String>, exposition: String, client: AppStoreServerAPIClient?, now: Date
    ) async throws -> AdminApplePage {
        let since = AdminOffersReport.windowStart(days: days, now: now)
        let perDay = try await store.appleNotificationsPerDay(since: since)
        var apps: [AppEnvironment] = []
        for bundleID in bundleIDs.union(perDay.map(\.bundleID)).sorted() {
            for environment in ["Production", "Sandbox"] {
                let last = try await store.lastAppleNotificationReceived(bundleID: bundleID, environment: environment)
                let watermark = try await store.notificationRecoveryWatermark(bundleID: bundleID, environment: environment)
                apps.append(AppEnvironment(bundleID: bundleID, environment: environment, lastReceived: last, watermark: watermark))
            }
        }
        return AdminApplePage(
            perDay: perDay, apps: apps, calls: MetricsExposition.samples(exposition, named: "app_store_server_api_calls_total"),
            unavailable: MetricsExposition.samples(exposition, named: "app_store_server_api_unavailable_total"), breakers: client?.breakerStates() ?? [],
            appleAPIConfigured: client != nil, since: since, generatedAt: now)
    }

    func page() -> String {
        var body: [HTML] = [.element("h2", text: "Notifications per day")]
        let firstDay = Int64((since.timeIntervalSince1970 / 86_400).rounded(.down))
        let dayRange = (0..<Int64(Self.days)).map { firstDay + $0 }
        var perType: [String: [Int64]] = [:]
        for day in perDay where day.day >= firstDay && day.day < firstDay + Int64(Self.days) {
            perType[day.notificationType, default: Array(repeating: 0, count: Self.days)][Int(day.day - firstDay)] += day.received
        }
        let types = perType.sorted { ($0.value.reduce(0, +), $1.key) > ($1.value.reduce(0, +), $0.key) }
        let charted = types.prefix(5).map { AdminChart.Series(name: $0.key, values: $0.value) }
            + (types.count > 5
                ? [
                    AdminChart.Series(
                        name: "other",
                        values: types.dropFirst(5).reduce(into: Array(repeating: Int64(0), count: Self.days)) { sum, item in
                            for (index, value) in item.value.enumerated() { sum[index] += value }
                        })
                ] : [])
        if let chart = AdminChart.daily(label: "Notifications received per day, by type", days: dayRange, series: charted) {
            body.append(chart)
            body.append(
                AdminLayout.table(
                    ["type", "last \(Self.days) days", "today"],
                    types.map { [.text($0.key), .text(AdminFormat.count($0.value.reduce(0, +))), .text(AdminFormat.count($0.value.last ?? 0))] }, numeric: [1, 2]))
        } else {
            body.append(AdminLayout.empty("No notification received in the last \(Self.days) days."))
        }
        body.append(.element("h2", text: "Last notification per app and environment"))
        if apps.isEmpty {
            body.append(AdminLayout.empty("No app has a key yet."))
        } else {
            body.append(
                AdminLayout.table(
                    ["app", "environment", "last received", "age", "recovered until (catch-up)"],
                    apps.map { app in
                        let gap = app.lastReceived.map { generatedAt.timeIntervalSince($0) > Self.gapSeconds } ?? true
                        return [
                            .text(app.bundleID), .text(app.environment), .text(AdminFormat.time(app.lastReceived)),
                            .element("span", [("class", gap ? "warn" : "ok"), ("data-gap", gap ? "true" : "false")], text: AdminFormat.age(app.lastReceived, now: generatedAt)),
                            .text(app.watermark.map { AdminFormat.time($0) } ?? "never run"),
                        ]
                    }))
            body.append(.element("p", [("class", "muted")], text: "Flagged: nothing received for more than a day (or ever). Sandbox is quiet unless you test there."))
        }
        body.append(.element("h2", text: "App Store Server API (this instance)"))
        if !appleAPIConfigured {
            body.append(AdminLayout.empty("Not in use: no catalog offer asks Apple for history (historySource apple or apple-then-client)."))
        } else {
            if calls.isEmpty {
                body.append(AdminLayout.empty("No call made since this instance started."))
            } else {
                let rows = calls.sorted { ($0.labels["endpoint"] ?? "", $0.labels["outcome"] ?? "") < ($1.labels["endpoint"] ?? "", $1.labels["outcome"] ?? "") }
                if let chart = AdminChart.horizontal(
                    label: "Calls by endpoint and outcome",
                    bars: rows.map { ("\($0.labels["outcome"] ?? "")", $0.value, "\(AdminFormat.count(Int64($0.value))) \($0.labels["endpoint"] ?? "")") }, limits: [])
                {
                    body.append(chart)
                }
                body.append(
                    AdminLayout.table(
                        ["endpoint", "outcome", "calls"],
                        rows.map { sample in
                            let outcome = sample.labels["outcome"] ?? ""
                            let error = !["ok", "not_found"].contains(outcome)
                            return [.text(sample.labels["endpoint"] ?? ""), .element("span", [("class", error ? "warn" : nil)], text: outcome), .text(AdminFormat.count(Int64(sample.value)))]
                        }, numeric: [2]))
            }
            if !unavailable.isEmpty {
                body.append(
                    AdminLayout.table(
                        ["history unavailable, reason", "lookups"], unavailable.map { [.text($0.labels["reason"] ?? ""), .text(AdminFormat.count(Int64($0.value)))] },
                        numeric: [1]))
            }
            body.append(.element("h2", text: "Circuit breakers"))
            if breakers.isEmpty {
                body.append(AdminLayout.empty("No app has called Apple yet."))
            } else {
                body.append(
                    AdminLayout.table(
                        ["app", "Apple host", "state"],
                        breakers.map { [.text($0.bundleID), .text($0.host), .element("span", [("class", $0.open ? "warn" : "ok")], text: $0.open ? "open (refusing lookups)" : "closed")] }))
            }
        }
        return AdminLayout.document(title: AdminPage.apple.title, page: AdminPage.apple.rawValue, navigation: .apple, generatedAt: generatedAt, body: body)
    }
}
