import Foundation
import Testing

@testable import OfferSignerServer

/// The dashboard's markup builder and formats: whatever the data, the markup is well-formed and
/// shows the text as given; dates are the ISO 8601 UTC text Foundation writes.
struct AdminHTMLTests {
    @Test("Text and attribute values are escaped: markup characters, quotes and characters XML forbids cannot break a page")
    func escaping() throws {
        let hostile = "</td><script>alert('x')</script> & \"quoted\" \u{0}\u{1B}\u{FFFF} é 🙂"
        let markup = HTML.element("p", [("title", hostile), ("onclick\"x", "dropped"), ("class", nil)], [.text(hostile)]).markup
        #expect(!markup.contains("<script") && !markup.contains("onclick"))
        let page = ParsedPage("<root>" + markup + "</root>")
        #expect(page.error == nil, "\(markup)")
        let paragraph = try #require(page.root?.all("p").first)
        let expected = hostile.replacingOccurrences(of: "\u{0}", with: "\u{FFFD}").replacingOccurrences(of: "\u{1B}", with: "\u{FFFD}")
            .replacingOccurrences(of: "\u{FFFF}", with: "\u{FFFD}")
        #expect(paragraph.allText == expected)
        #expect(paragraph.attributes["title"] == expected)
        #expect(paragraph.attributes.count == 1)
    }

    @Test("Days and times are written as ISO 8601 in UTC, as Foundation writes them, across leap years and before 1970")
    func dates() {
        let formatter = ISO8601DateFormatter()
        var generator = SystemRandomNumberGenerator()
        let samples = [-86_400.0 * 365 * 3 - 1, 0, 951_782_400, 951_868_799, 1_709_164_800, 4_107_542_399] + (0..<500).map { _ in Double(Int64.random(in: -2_000_000_000...4_000_000_000, using: &generator)) }
        for seconds in samples {
            let date = Date(timeIntervalSince1970: seconds)
            #expect(AdminFormat.time(date) == formatter.string(from: date), "\(seconds)")
            let day = Int64((seconds / 86_400).rounded(.down))
            #expect(AdminFormat.day(day) == String(formatter.string(from: Date(timeIntervalSince1970: Double(day) * 86_400)).prefix(10)))
        }
    }
}
