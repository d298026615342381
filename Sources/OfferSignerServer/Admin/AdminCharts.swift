import Foundation

/// The dashboard's charts: inline SVG (`<svg class="chart">`), drawn on the server, with no
/// script and no external asset; every data mark carries a `<title>` with its exact figure, and
/// colours come from the page's stylesheet (classes `s0`…`s5`, `limit`, `grid`).
enum AdminChart {
    struct Series: Sendable {
        var name: String
        var values: [Int64]
    }

    static let width = 640.0
    static let height = 200.0
    static let left = 44.0
    static let right = 8.0
    static let top = 22.0
    static let bottom = 22.0

    /// One decimal, computed (String(format:) is slow on Linux, and a chart has thousands).
    private static func number(_ value: Double) -> String {
        let tenths = Int64((value * 10).rounded())
        return (tenths < 0 ? "-" : "") + String(tenths.magnitude / 10) + "." + String(tenths.magnitude % 10)
    }

    /// Bars per UTC day (one group per day, one bar per series), with a legend; nil when every
    /// value is zero (the page shows its empty state instead).
    static func daily(label: String, days: [Int64], series: [Series]) -> HTML? {
        let maximum = series.flatMap(\.values).max() ?? 0
        guard maximum > 0, !days.isEmpty else { return nil }
        let plotWidth = width - left - right
        let plotHeight = height - top - bottom
        let group = plotWidth / Double(days.count)
        let bar = max(0.5, (group * 0.8) / Double(max(1, series.count)))
        var marks: [HTML] = [
            .element("line", [("class", "grid"), ("x1", number(left)), ("y1", number(top)), ("x2", number(width - right)), ("y2", number(top))], []),
            .element("line", [("class", "grid"), ("x1", number(left)), ("y1", number(height - bottom)), ("x2", number(width - right)), ("y2", number(height - bottom))], []),
            .element("text", [("x", number(left - 4)), ("y", number(top + 4)), ("text-anchor", "end")], text: AdminFormat.count(maximum)),
            .element("text", [("x", number(left - 4)), ("y", number(height - bottom)), ("text-anchor", "end")], text: "0"),
            .element("text", [("x", number(left)), ("y", number(height - 6))], text: AdminFormat.day(days[0])),
            .element("text", [("x", number(width - right)), ("y", number(height - 6)), ("text-anchor", "end")], text: AdminFormat.day(days[days.count - 1])),
        ]
        for (dayIndex, day) in days.enumerated() {
            for (seriesIndex, item) in series.enumerated() {
                let value = dayIndex < item.values.count ? item.values[dayIndex] : 0
                let barHeight = plotHeight * Double(value) / Double(maximum)
                let x = left + Double(dayIndex) * group + group * 0.1 + Double(seriesIndex) * bar
                marks.append(
                    .element(
                        "rect",
                        [("class", "bar s\(seriesIndex % 6)"), ("x", number(x)), ("y", number(height - bottom - barHeight)), ("width", number(bar)), ("height", number(barHeight))],
                        [.element("title", text: "\(AdminFormat.day(day)) \(item.name): \(AdminFormat.count(value))")]))
            }
        }
        var legendX = left
        for (seriesIndex, item) in series.enumerated() {
            marks.append(.element("rect", [("class", "s\(seriesIndex % 6)"), ("x", number(legendX)), ("y", "6"), ("width", "10"), ("height", "10")], []))
            marks.append(.element("text", [("x", number(legendX + 14)), ("y", "15")], text: item.name))
            legendX += 24 + Double(item.name.count) * 7
        }
        return svg(label: label, marks)
    }

    /// Horizontal bars (e.g. latency percentiles) against vertical limits (e.g. Apple's), all in
    /// the same unit; nil when there is no bar.
    static func horizontal(label: String, bars: [(name: String, value: Double, text: String)], limits: [(name: String, value: Double)]) -> HTML? {
        guard !bars.isEmpty else { return nil }
        let maximum = max(bars.map(\.value).max() ?? 0, limits.map(\.value).max() ?? 0) * 1.1
        guard maximum > 0 else { return nil }
        let rowHeight = 24.0
        let chartHeight = top + Double(bars.count) * rowHeight + bottom
        let plotLeft = 80.0
        let plotWidth = width - plotLeft - right - 60
        var marks: [HTML] = []
        for (index, bar) in bars.enumerated() {
            let y = top + Double(index) * rowHeight
            let barWidth = max(1, plotWidth * bar.value / maximum)
            marks.append(.element("text", [("x", number(plotLeft - 6)), ("y", number(y + 15)), ("text-anchor", "end")], text: bar.name))
            marks.append(
                .element(
                    "rect", [("class", "bar s0"), ("x", number(plotLeft)), ("y", number(y + 4)), ("width", number(barWidth)), ("height", number(rowHeight - 8))],
                    [.element("title", text: "\(bar.name): \(bar.text)")]))
            marks.append(.element("text", [("x", number(plotLeft + barWidth + 4)), ("y", number(y + 15))], text: bar.text))
        }
        for (index, limit) in limits.enumerated() {
            let x = plotLeft + plotWidth * limit.value / maximum
            marks.append(
                .element(
                    "line", [("class", "limit"), ("x1", number(x)), ("y1", number(top - 4)), ("x2", number(x)), ("y2", number(chartHeight - bottom + 4))],
                    [.element("title", text: limit.name)]))
            marks.append(.element("text", [("x", number(x)), ("y", number(index % 2 == 0 ? chartHeight - 4 : 12)), ("text-anchor", "middle")], text: limit.name))
        }
        return svg(label: label, marks, height: chartHeight)
    }

    /// One lane per item from `start` to `end` (nil: now), with a point at each event: a
    /// timeline (keys: imported, active, retired, revoked).
    struct Lane: Sendable {
        var name: String
        var segments: [(start: Date, end: Date, className: String, title: String)]
        var events: [(time: Date, title: String)]
    }

    static func timeline(label: String, lanes: [Lane], now: Date) -> HTML? {
        let times = lanes.flatMap { $0.segments.flatMap { [$0.start, $0.end] } + $0.events.map(\.time) }
        guard let first = times.min(), !lanes.isEmpty else { return nil }
        let last = max(times.max() ?? now, now)
        let span = max(1, last.timeIntervalSince(first))
        let rowHeight = 26.0
        let plotLeft = 120.0
        let plotWidth = width - plotLeft - right
        let chartHeight = top + Double(lanes.count) * rowHeight + bottom
        func x(_ date: Date) -> Double { plotLeft + plotWidth * date.timeIntervalSince(first) / span }
        var marks: [HTML] = [
            .element("text", [("x", number(plotLeft)), ("y", number(chartHeight - 6))], text: AdminFormat.time(first)),
            .element("text", [("x", number(width - right)), ("y", number(chartHeight - 6)), ("text-anchor", "end")], text: AdminFormat.time(last)),
        ]
        for (index, lane) in lanes.enumerated() {
            let y = top + Double(index) * rowHeight
            marks.append(.element("text", [("x", number(plotLeft - 6)), ("y", number(y + 16)), ("text-anchor", "end")], text: lane.name))
            for segment in lane.segments {
                marks.append(
                    .element(
                        "rect",
                        [("class", "bar \(segment.className)"), ("x", number(x(segment.start))), ("y", number(y + 5)),
                         ("width", number(max(2, x(segment.end) - x(segment.start)))), ("height", number(rowHeight - 10))],
                        [.element("title", text: segment.title)]))
            }
            for event in lane.events {
                marks.append(
                    .element("circle", [("class", "event"), ("cx", number(x(event.time))), ("cy", number(y + rowHeight / 2)), ("r", "4")], [.element("title", text: event.title)]))
            }
        }
        return svg(label: label, marks, height: chartHeight)
    }

    private static func svg(label: String, _ marks: [HTML], height: Double = height) -> HTML {
        .element(
            "svg",
            [("xmlns", "http://www.w3.org/2000/svg"), ("class", "chart"), ("viewBox", "0 0 \(Int(width)) \(Int(height.rounded(.up)))"), ("role", "img"), ("aria-label", label)],
            [.element("title", text: label)] + marks)
    }
}
