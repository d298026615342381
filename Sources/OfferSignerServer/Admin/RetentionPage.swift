import Foundation

/// The Retention Messaging page (`/admin/retention`): what this instance answered since it
/// started (``RetentionActivity``, and the `retention_requests_total` counter of `/metrics` for
/// refusals), per product and type, fallbacks by reason, and latency percentiles against the
/// configured budget and Apple's limit.
///
/// Apple's limit: "your server must respond to requests within approximately 700 ms in the
/// sandbox environment" (*Initiate Performance Test*,
/// https://developer.apple.com/documentation/retentionmessaging/initiate-performance-test);
/// Apple documents no production timeout (see ``RetentionConfiguration/budget``).
struct AdminRetentionPage: Sendable {
    static let appleLimitSeconds = 0.7

    var activity: RetentionActivity.Snapshot
    var requestsByOutcome: [(outcome: String, count: Double)]
    var budgetSeconds: Double
    var configured: Bool
    var generatedAt: Date

    static func percentile(_ sorted: [Double], _ fraction: Double) -> Double? {
        guard !sorted.isEmpty else { return nil }
        let rank = Int((fraction * Double(sorted.count)).rounded(.up)) - 1
        return sorted[min(max(rank, 0), sorted.count - 1)]
    }

    func page() -> String {
        var body: [HTML] = [
            .element(
                "p", [("class", "muted")],
                text: "Since this instance started (each instance counts its own). Budget \(AdminFormat.milliseconds(budgetSeconds)); Apple's limit about \(AdminFormat.milliseconds(Self.appleLimitSeconds)) (Initiate Performance Test)."),
        ]
        if !configured {
            body.append(AdminLayout.empty("Retention Messaging is not configured (serve --offers with apps.<bundle>.retention)."))
        }
        body.append(.element("h2", text: "Latency"))
        let sorted = activity.latencies.sorted()
        if sorted.isEmpty {
            body.append(AdminLayout.empty("No request answered yet."))
        } else {
            let percentiles: [(String, Double)] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1)].compactMap { name, fraction in
                Self.percentile(sorted, fraction).map { (name, $0) }
            }
            let over = sorted.filter { $0 > budgetSeconds }.count
            body.append(
                .element(
                    "p", [],
                    text: "Latest \(AdminFormat.count(Int64(sorted.count))) answers; \(over) over the budget (answered with the fallback at the deadline)."))
            if let chart = AdminChart.horizontal(
                label: "Latency percentiles against the budget and Apple's limit",
                bars: percentiles.map { ($0.0, $0.1 * 1000, AdminFormat.milliseconds($0.1)) },
                limits: [("budget \(AdminFormat.milliseconds(budgetSeconds))", budgetSeconds * 1000), ("Apple \(AdminFormat.milliseconds(Self.appleLimitSeconds))", Self.appleLimitSeconds * 1000)])
            {
                body.append(chart)
            }
            body.append(
                AdminLayout.table(
                    percentiles.map(\.0), [percentiles.map { .element("span", [("data-percentile", $0.0)], text: AdminFormat.milliseconds($0.1)) }],
                    numeric: Set(percentiles.indices)))
        }
        body.append(.element("h2", text: "Answers per product"))
        let types = ["promotionalOffer", "alternateProduct", "message", "nothing"]
        if activity.answers.isEmpty {
            body.append(AdminLayout.empty("No answer yet."))
        } else {
            let totals = types.map { type in activity.answers.values.reduce(Int64(0)) { $0 + ($1[type] ?? 0) } }
            if let chart = AdminChart.horizontal(
                label: "Answers by type", bars: zip(types, totals).map { ($0, Double($1), AdminFormat.count($1)) }, limits: [])
            {
                body.append(chart)
            }
            body.append(
                AdminLayout.table(
                    ["product"] + types + ["total"],
                    activity.answers.keys.sorted().map { product in
                        let counts = activity.answers[product] ?? [:]
                        return [HTML.text(product)] + types.map { HTML.text(AdminFormat.count(counts[$0] ?? 0)) }
                            + [.text(AdminFormat.count(counts.values.reduce(0, +)))]
                    }, numeric: Set(1...types.count + 1)))
        }
        body.append(.element("h2", text: "Fallbacks by reason"))
        if activity.fallbacks.isEmpty {
            body.append(AdminLayout.empty("No fallback answered."))
        } else {
            body.append(
                AdminLayout.table(
                    ["reason", "answers"], activity.fallbacks.sorted { $0.key < $1.key }.map { [.text($0.key), .text(AdminFormat.count($0.value))] }, numeric: [1]))
        }
        body.append(.element("h2", text: "Requests by outcome"))
        if requestsByOutcome.isEmpty {
            body.append(AdminLayout.empty("No request received."))
        } else {
            body.append(
                AdminLayout.table(
                    ["outcome (answer type or refusal code)", "requests"],
                    requestsByOutcome.map { [.text($0.outcome), .text(AdminFormat.count(Int64($0.count)))] }, numeric: [1]))
        }
        return AdminLayout.document(title: AdminPage.retention.title, page: AdminPage.retention.rawValue, navigation: .retention, generatedAt: generatedAt, body: body)
    }
}

/// Samples of the service's own Prometheus exposition (`/metrics` text), read back for the
/// dashboard: `name{label="value",…} number` lines.
enum MetricsExposition {
    static func samples(_ text: String, named name: String) -> [(labels: [String: String], value: Double)] {
        var samples: [(labels: [String: String], value: Double)] = []
        for line in text.split(separator: "\n") where line.hasPrefix(name) {
            let rest = line.dropFirst(name.count)
            var labels: [String: String] = [:]
            var valueText: Substring
            if rest.hasPrefix("{") {
                guard let close = rest.lastIndex(of: "}") else { continue }
                labels = parseLabels(rest[rest.index(after: rest.startIndex)..<close])
                valueText = rest[rest.index(after: close)...]
            } else if rest.hasPrefix(" ") {
                valueText = rest
            } else {
                continue
            }
            valueText = valueText.drop(while: { $0 == " " })
            if let value = Double(valueText.split(separator: " ").first ?? "") { samples.append((labels, value)) }
        }
        return samples
    }

    private static func parseLabels(_ text: Substring) -> [String: String] {
        var labels: [String: String] = [:]
        var index = text.startIndex
        while index < text.endIndex {
            guard let equals = text[index...].firstIndex(of: "=") else { break }
            let name = text[index..<equals].trimmingCharacters(in: CharacterSet(charactersIn: ", "))
            var cursor = text.index(after: equals)
            guard cursor < text.endIndex, text[cursor] == "\"" else { break }
            cursor = text.index(after: cursor)
            var value = ""
            while cursor < text.endIndex, text[cursor] != "\"" {
                if text[cursor] == "\\", text.index(after: cursor) < text.endIndex {
                    cursor = text.index(after: cursor)
                    value.append(text[cursor] == "n" ? "\n" : text[cursor])
                } else {
                    value.append(text[cursor])
                }
                cursor = text.index(after: cursor)
            }
            labels[name] = value
            index = cursor < text.endIndex ? text.index(after: cursor) : cursor
        }
        return labels
    }
}
