import Foundation

/// A piece of markup that is safe by construction: text and attribute values are always escaped,
/// element and attribute names can only be string literals, and every element is closed (void
/// elements as `<meta ... />`), so a page is well-formed XML (XHTML) whatever the data in it.
///
/// Escaped: `&`, `<`, `>`, `"` and `'` become character references; characters XML 1.0 does not
/// allow (C0 controls other than tab, newline and carriage return) become U+FFFD.
public struct HTML: Sendable {
    public let markup: String

    private init(markup: String) { self.markup = markup }

    /// Nothing.
    public static let empty = HTML(markup: "")

    /// Text, escaped.
    public static func text(_ value: String) -> HTML { HTML(markup: escape(value)) }

    /// Several pieces, one after the other.
    public static func join(_ parts: [HTML]) -> HTML { HTML(markup: parts.map(\.markup).joined()) }

    /// An element with attributes (values are escaped; a nil value leaves the attribute out; a
    /// name that is not letters, digits, `-` and `:` is left out too) and children.
    public static func element(_ name: StaticString, _ children: [HTML]) -> HTML {
        element(name, [] as [(String, String?)], children)
    }

    public static func element(_ name: StaticString, _ attributes: [(String, String?)], _ children: [HTML]) -> HTML {
        var markup = "<" + name.description
        for (attribute, value) in attributes {
            guard let value, isName(attribute) else { continue }
            markup += " " + attribute + "=\"" + escape(value) + "\""
        }
        if voidElements.contains(name.description) {
            return HTML(markup: markup + " />")
        }
        return HTML(markup: markup + ">" + children.map(\.markup).joined() + "</" + name.description + ">")
    }

    /// An element whose only child is text.
    public static func element(_ name: StaticString, _ attributes: [(String, String?)] = [], text: String) -> HTML {
        element(name, attributes, [.text(text)])
    }

    /// A fixed stylesheet from this module, inserted as written (it is a literal, never data).
    static func style(_ css: StaticString) -> HTML {
        HTML(markup: "<style>" + css.description + "</style>")
    }

    static let voidElements: Set<String> = ["meta", "input", "br", "hr", "link", "img"]

    static func isName(_ name: String) -> Bool {
        !name.isEmpty && name.unicodeScalars.allSatisfy { ($0.properties.isASCIIHexDigit || ("a"..."z").contains($0) || ("A"..."Z").contains($0) || $0 == "-" || $0 == ":") }
    }

    static func escape(_ value: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(value.utf8.count)
        for scalar in value.unicodeScalars {
            switch scalar {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            case "\t", "\n", "\r": escaped.unicodeScalars.append(scalar)
            default:
                // XML 1.0 allows no other C0 control, nor U+FFFE and U+FFFF.
                if scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF {
                    escaped += "\u{FFFD}"
                } else {
                    escaped.unicodeScalars.append(scalar)
                }
            }
        }
        return escaped
    }
}

/// Formats the dashboard shows numbers and times in.
enum AdminFormat {
    static func count(_ value: Int64) -> String {
        let digits = String(value.magnitude)
        var grouped = ""
        for (index, character) in digits.enumerated() {
            if index > 0 && (digits.count - index) % 3 == 0 { grouped += "," }
            grouped.append(character)
        }
        return (value < 0 ? "-" : "") + grouped
    }

    static func percent(_ value: Double?) -> String {
        value.map { String(format: "%.1f%%", $0 * 100) } ?? "–"
    }

    /// `2026-11-27T05:31:09Z` (UTC; computed, not formatted: a page shows thousands).
    static func time(_ date: Date?) -> String {
        guard let date else { return "–" }
        let seconds = Int64(date.timeIntervalSince1970.rounded(.down))
        let days = seconds >= 0 ? seconds / 86_400 : (seconds - 86_399) / 86_400
        let inDay = seconds - days * 86_400
        return day(days) + "T" + two(inDay / 3600) + ":" + two(inDay / 60 % 60) + ":" + two(inDay % 60) + "Z"
    }

    /// `2026-11-27` for a day counted from 1970-01-01 (UTC), by the proleptic Gregorian calendar
    /// (Howard Hinnant's `civil_from_days`).
    static func day(_ day: Int64) -> String {
        let z = day + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let dayOfEra = z - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36_524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let dayOfMonth = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        return String(year) + "-" + two(month) + "-" + two(dayOfMonth)
    }

    private static func two(_ value: Int64) -> String { value < 10 ? "0" + String(value) : String(value) }

    /// "3 h ago", "2 d ago".
    static func age(_ date: Date?, now: Date) -> String {
        guard let date else { return "never" }
        let seconds = max(0, now.timeIntervalSince(date))
        if seconds < 120 { return String(format: "%.0f s ago", seconds) }
        if seconds < 7200 { return String(format: "%.0f min ago", seconds / 60) }
        if seconds < 172_800 { return String(format: "%.0f h ago", seconds / 3600) }
        return String(format: "%.0f d ago", seconds / 86_400)
    }

    static func milliseconds(_ seconds: Double?) -> String {
        seconds.map { String(format: "%.0f ms", $0 * 1000) } ?? "–"
    }
}
