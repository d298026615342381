import Foundation

/// Parsing and formatting of RFC 3339 timestamps such as `2026-11-23T03:10:00.123Z`.
///
/// Hand-written rather than `ISO8601DateFormatter`/`Date.ISO8601FormatStyle` so that it behaves the
/// same on every Apple OS version and on Linux, accepts the timestamp both with and without
/// fractional seconds, and accepts numeric offsets (`+02:00`) as well as `Z`.
enum RFC3339 {
    /// Parses an RFC 3339 `date-time`. Returns `nil` when `string` is not one.
    static func date(from string: String) -> Date? {
        let bytes = Array(string.utf8)
        var index = 0

        func digits(_ count: Int) -> Int? {
            guard index + count <= bytes.count else { return nil }
            var value = 0
            for byte in bytes[index..<(index + count)] {
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
            }
            index += count
            return value
        }
        func expect(_ characters: Character...) -> Bool {
            guard index < bytes.count else { return false }
            let found = characters.contains { $0.asciiValue == bytes[index] }
            if found { index += 1 }
            return found
        }

        guard let year = digits(4), expect("-"),
              let month = digits(2), expect("-"),
              let day = digits(2), expect("T", "t", " "),
              let hour = digits(2), expect(":"),
              let minute = digits(2), expect(":"),
              let second = digits(2)
        else { return nil }
        guard (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second <= 60 else {
            return nil
        }

        var fraction = 0.0
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            var scale = 0.1
            var sawDigit = false
            while index < bytes.count, bytes[index] >= UInt8(ascii: "0"), bytes[index] <= UInt8(ascii: "9") {
                fraction += Double(bytes[index] - UInt8(ascii: "0")) * scale
                scale /= 10
                index += 1
                sawDigit = true
            }
            guard sawDigit else { return nil }
        }

        var offsetSeconds = 0
        if expect("Z", "z") {
            // UTC
        } else if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
            let sign = bytes[index] == UInt8(ascii: "-") ? -1 : 1
            index += 1
            guard let offsetHour = digits(2), expect(":"), let offsetMinute = digits(2),
                  offsetHour < 24, offsetMinute < 60
            else { return nil }
            offsetSeconds = sign * (offsetHour * 3600 + offsetMinute * 60)
        } else {
            return nil
        }
        guard index == bytes.count else { return nil }

        var calendar = Calendar(identifier: .gregorian)
        guard let utc = TimeZone(identifier: "UTC") else { return nil }
        calendar.timeZone = utc
        // A leap second (`:60`) is folded onto the last representable instant of the minute.
        let components = DateComponents(
            year: year, month: month, day: day, hour: hour, minute: minute, second: min(second, 59)
        )
        guard let base = calendar.date(from: components),
              calendar.component(.day, from: base) == day  // rejects 2026-02-30
        else { return nil }
        let leap = second == 60 ? 0.999 : 0
        return base.addingTimeInterval(fraction + leap - TimeInterval(offsetSeconds))
    }

    /// Formats `date` as UTC with millisecond precision, e.g. `2026-11-23T03:10:00.123Z`.
    static func string(from date: Date) -> String {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC") ?? calendar.timeZone
        // Round to whole milliseconds first so that .9995 does not print as ".1000".
        let milliseconds = (date.timeIntervalSince1970 * 1000).rounded(.down)
        let wholeSeconds = Date(timeIntervalSince1970: (milliseconds / 1000).rounded(.down))
        let millisecondPart = Int(milliseconds - (milliseconds / 1000).rounded(.down) * 1000)
        let parts = calendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: wholeSeconds)
        func pad(_ value: Int?, _ width: Int) -> String {
            let text = String(value ?? 0)
            return String(repeating: "0", count: max(0, width - text.count)) + text
        }
        return "\(pad(parts.year, 4))-\(pad(parts.month, 2))-\(pad(parts.day, 2))"
            + "T\(pad(parts.hour, 2)):\(pad(parts.minute, 2)):\(pad(parts.second, 2))"
            + ".\(pad(millisecondPart, 3))Z"
    }
}
