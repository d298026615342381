import Foundation
import OfferSignerStorage
import Synchronization

/// The Offers page (`/admin/offers?days=30|90`) and `offer-signer offers report --html FILE`: per
/// offer, what `offers report` reports (the same ``OfferReport`` rows over the same window), a
/// daily chart of issuances and redemptions, and redemptions without a signature of ours flagged
/// as a possible key leak.
///
/// Rule: the window is whole UTC days, today and the `days - 1` before it; its start is shown on
/// the page, and `offers report --json --since <that start>` gives the same figures. Issuances are
/// read once, per day, from the store's daily roll-up (``OfferSignerStore/offerIssuancesPerDay(since:)``,
/// see ``IssuanceRollUp``: at most days × offers × clients rows); their per-offer totals are what
/// `offerIssuances(since:)` counts in the ledger (the storage conformance suite checks both agree).
/// Redemptions not placed yet are a column of their own (`unplaced`, `redeemedUnplaced` in the JSON).
public struct AdminOffersReport: Sendable {
    /// The windows the page offers.
    public static let windows = [30, 90]

    public var days: Int
    public var since: Date
    public var generatedAt: Date
    public var rows: [OfferReport.Row]
    /// The window's days (days since 1970-01-01, UTC), oldest first.
    public var dayRange: [Int64]
    public var issuedPerDay: [String: [Int64]]
    public var matchedPerDay: [String: [Int64]]
    public var unmatchedPerDay: [String: [Int64]]

    static func key(_ bundleID: String, _ offerID: String) -> String { bundleID + "\u{1F}" + offerID }

    /// The start of a window of `days` whole UTC days ending today.
    public static func windowStart(days: Int, now: Date) -> Date {
        let today = Int64((now.timeIntervalSince1970 / 86_400).rounded(.down))
        return Date(timeIntervalSince1970: Double(today - Int64(days) + 1) * 86_400)
    }

    public static func load(store: any OfferSignerStore, days: Int, now: Date = Date()) async throws -> AdminOffersReport {
        let since = windowStart(days: days, now: now)
        let perDay = try await store.offerIssuancesPerDay(since: since)
        let redemptions = try await store.offerRedemptions(since: since)
        let firstDay = Int64((since.timeIntervalSince1970 / 86_400).rounded(.down))
        let dayRange = (0..<Int64(days)).map { firstDay + $0 }
        var report = AdminOffersReport(
            days: days, since: since, generatedAt: now, rows: OfferReport.rows(issuances: OfferIssuanceDay.totals(perDay), redemptions: redemptions),
            dayRange: dayRange, issuedPerDay: [:], matchedPerDay: [:], unmatchedPerDay: [:])
        func add(_ table: inout [String: [Int64]], _ key: String, day: Int64, _ count: Int64) {
            let index = Int(day - firstDay)
            guard index >= 0, index < days else { return }
            table[key, default: Array(repeating: 0, count: days)][index] += count
        }
        for day in perDay { add(&report.issuedPerDay, key(day.bundleID, day.offerID), day: day.day, day.issuances) }
        for redemption in redemptions {
            let candidate = redemption.candidate
            let day = Int64((candidate.purchaseDate.timeIntervalSince1970 / 86_400).rounded(.down))
            if redemption.signatureIssuedAt != nil {
                add(&report.matchedPerDay, key(candidate.bundleID, candidate.offerID), day: day, 1)
            } else if candidate.appAccountToken != nil {
                add(&report.unmatchedPerDay, key(candidate.bundleID, candidate.offerID), day: day, 1)
            }
        }
        return report
    }

    private func total(_ table: [String: [Int64]]) -> [Int64] {
        table.values.reduce(into: Array(repeating: 0, count: days)) { sum, values in
            for (index, value) in values.enumerated() { sum[index] += value }
        }
    }

    /// The page's content (below its title).
    func body(links: Bool) -> [HTML] {
        var body: [HTML] = []
        if links {
            body.append(
                .element(
                    "p", [],
                    [.text("Window: ")] + Self.windows.map { window in
                        window == days
                            ? .element("strong", text: "\(window) days ")
                            : .element("a", [("href", "/admin/offers?days=\(window)")], text: "\(window) days ")
                    }))
        }
        body.append(.element("p", [("class", "muted")], [.text("Since "), .element("time", [("data-since", AdminFormat.time(since))], text: AdminFormat.time(since)), .text(" (UTC days). The same figures: offer-signer offers report --json --since \(AdminFormat.time(since))")]))
        let unmatched = rows.reduce(0) { $0 + $1.unmatched }
        if unmatched > 0 {
            body.append(
                .element(
                    "div", [("class", "alert"), ("role", "alert"), ("data-alert", "key-leak")],
                    [
                        .element("p", [("class", "warn")], text: "Possible key leak: \(AdminFormat.count(unmatched)) redemption(s) carry an appAccountToken that no signature of this service matches."),
                        .element(
                            "p", [],
                            text: "Another signer with the same In-App Purchase key, or a leaked key. What to do: check whether anything else signs offers for this app; if not, create a new In-App Purchase key in App Store Connect, import and activate it (offer-signer keys import, keys activate), revoke the old one here (offer-signer keys revoke) and in App Store Connect, and watch this figure stop growing. See Docs/Operations.md, “Dashboard” and “Key lifecycle”."),
                    ]))
        }
        guard !rows.isEmpty else {
            body.append(AdminLayout.empty("No offer was issued or redeemed in the last \(days) days."))
            return body
        }
        let overall = AdminChart.daily(
            label: "Issued and redeemed per day, all offers", days: dayRange,
            series: [
                .init(name: "issued", values: total(issuedPerDay)), .init(name: "redeemed", values: total(matchedPerDay)),
                .init(name: "no signature of ours", values: total(unmatchedPerDay)),
            ])
        body.append(.element("h2", text: "Per day"))
        body.append(overall ?? AdminLayout.empty("Nothing issued or redeemed per day in this window."))
        body.append(.element("h2", text: "Per offer"))
        let headers = ["bundle", "offer", "issued", "redeemed", "conversion", "median to redemption", "no signature of ours", "no appAccountToken", "unplaced"]
        body.append(
            .element(
                "div", [("class", "table")],
                [
                    .element(
                        "table", [("data-table", "offers")],
                        [
                            .element("thead", [.element("tr", headers.enumerated().map { .element("th", [("class", $0.offset >= 2 ? "n" : nil)], text: $0.element) })]),
                            .element("tbody", rows.map(row)),
                        ]),
                ]))
        for row in rows.prefix(20) {
            let key = Self.key(row.bundleID, row.offerID)
            let chart = AdminChart.daily(
                label: "\(row.offerID) (\(row.bundleID)) per day", days: dayRange,
                series: [
                    .init(name: "issued", values: issuedPerDay[key] ?? []), .init(name: "redeemed", values: matchedPerDay[key] ?? []),
                    .init(name: "no signature of ours", values: unmatchedPerDay[key] ?? []),
                ])
            if let chart {
                body.append(.element("h2", text: "\(row.offerID) · \(row.bundleID)"))
                body.append(chart)
            }
        }
        if rows.count > 20 { body.append(.element("p", [("class", "muted")], text: "Charts for the first 20 offers; every offer is in the table.")) }
        return body
    }

    private func row(_ row: OfferReport.Row) -> HTML {
        func cell(_ field: String, _ text: String, warn: Bool = false) -> HTML {
            .element("td", [("class", warn ? "n warn" : "n"), ("data-field", field)], text: text)
        }
        return .element(
            "tr", [("data-bundle", row.bundleID), ("data-offer", row.offerID)],
            [
                .element("td", text: row.bundleID), .element("td", text: row.offerID),
                cell("issued", String(row.issued)), cell("redeemed", String(row.matched.count)),
                cell("conversion", row.conversion.map { String(format: "%.4f", $0) } ?? "–"),
                cell("medianSecondsToRedemption", row.medianSeconds.map { String(format: "%.0f", $0) + " s" } ?? "–"),
                cell("redeemedWithoutSignature", String(row.unmatched), warn: row.unmatched > 0),
                cell("redeemedWithoutAppAccountToken", String(row.unattributed)),
                cell("redeemedUnplaced", String(row.unplaced)),
            ])
    }

    /// The page as the server serves it.
    func page() -> String {
        AdminLayout.document(title: AdminPage.offers.title, page: AdminPage.offers.rawValue, navigation: .offers, generatedAt: generatedAt, body: body(links: true))
    }

    /// The page as one self-contained file (`offers report --html`): no links into the server, the
    /// policy in a meta element.
    public func standaloneFile() -> String {
        AdminLayout.document(
            title: "Offers report, last \(days) days", page: AdminPage.offers.rawValue, navigation: nil, generatedAt: generatedAt, body: body(links: false), standalone: true)
    }
}

/// The Offers page per window, computed and rendered at most once every ``lifetime`` (requests in
/// between, and those that arrive while it is computed, share one computation): a window reads
/// its days of the issuance roll-up and every redemption of the window, and a dashboard left open
/// or polled must not repeat that work for each view while signing runs. The page's footer says when it was computed.
final class AdminOffersCache: Sendable {
    static let lifetime: Duration = .seconds(30)
    private let entries = Mutex([Int: (computedAt: ContinuousClock.Instant, task: Task<String, any Error>)]())

    func page(days: Int, render: @escaping @Sendable () async throws -> String) async throws -> String {
        let task = entries.withLock { entries in
            if let entry = entries[days], ContinuousClock.now - entry.computedAt < Self.lifetime { return entry.task }
            let task = Task { try await render() }
            entries[days] = (ContinuousClock.now, task)
            return task
        }
        do {
            return try await task.value
        } catch {
            // A failure is not kept: the next view tries again.
            entries.withLock { entries in
                if entries[days]?.task == task { entries[days] = nil }
            }
            throw error
        }
    }
}
