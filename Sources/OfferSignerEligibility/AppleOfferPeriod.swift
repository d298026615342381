import Foundation

/// The duration of a subscription offer, as Apple states it in a transaction's `offerPeriod`
/// ("The duration of the offer", an ISO 8601 duration such as `P1W`, `P3M` or `P1Y`; Apple's
/// `JWSTransactionDecodedPayload.offerPeriod`, appstoreserverlibrary/models/JWSTransactionDecodedPayload.py;
/// https://developer.apple.com/documentation/appstoreserverapi/offerperiod).
///
/// Rules: only the date part of ISO 8601 durations is read, `P` followed by at least one of
/// `nY`, `nM`, `nW`, `nD` in that order (whole numbers, each at most once; upper case, as Apple
/// writes them). Anything else (a time part `T…`, fractions, signs, lower case, an empty `P`,
/// other text) is not a duration this reads: `init(iso8601:)` answers nil, and the caller keeps
/// its rule for an unknown duration. Apple is silent on whether it ever sends other forms.
/// The end of the offer is its start plus the duration on the Gregorian calendar in UTC
/// (years, then months, clamped to the end of shorter months as Foundation's `Calendar` adds
/// them, then 7 days a week and days), as `RuleTime` counts months.
public struct AppleOfferPeriod: Sendable, Hashable {
    public var years: Int
    public var months: Int
    public var weeks: Int
    public var days: Int

    public init(years: Int = 0, months: Int = 0, weeks: Int = 0, days: Int = 0) {
        self.years = years
        self.months = months
        self.weeks = weeks
        self.days = days
    }

    /// Reads `P#Y#M#W#D` (see the type's rules); nil for anything else.
    public init?(iso8601 text: String) {
        var rest = Substring(text)
        guard rest.first == "P" else { return nil }
        rest = rest.dropFirst()
        guard !rest.isEmpty else { return nil }
        var values: [Character: Int] = [:]
        let order: [Character] = ["Y", "M", "W", "D"]
        var next = 0
        while !rest.isEmpty {
            let digits = rest.prefix { $0.isASCII && $0.isNumber }
            guard !digits.isEmpty, digits.count <= 6, let value = Int(digits) else { return nil }
            rest = rest.dropFirst(digits.count)
            guard let designator = rest.first, let index = order[next...].firstIndex(of: designator) else { return nil }
            values[designator] = value
            next = index + 1
            rest = rest.dropFirst()
        }
        self.init(years: values["Y"] ?? 0, months: values["M"] ?? 0, weeks: values["W"] ?? 0, days: values["D"] ?? 0)
    }

    private static let calendar: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar
    }()

    /// `start` plus this duration (see the type's rules); nil when the calendar cannot add it.
    public func end(from start: Date) -> Date? {
        Self.calendar.date(byAdding: DateComponents(year: years, month: months, day: weeks * 7 + days), to: start)
    }
}
