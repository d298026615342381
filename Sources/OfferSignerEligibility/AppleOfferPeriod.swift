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

    /// How many billing periods this offer lasts, when its first billing period ran from
    /// `firstStart` to `firstEnd` (`purchaseDate` and `expiresDate` of the offer's first
    /// transaction); nil when that period has no length or the calendar cannot add this duration.
    ///
    /// Apple's `offerPeriod` is the single period length times the period count: its table
    /// "Single period length | Period count | Offer period value" gives 1 month × 1 = `P1M`,
    /// 1 month × 2 = `P2M`, 3 days × 1 = `P3D`
    /// (https://developer.apple.com/documentation/appstoreserverapi/offerperiod). So the count is
    /// this duration divided by the first period's length, rounded, at least 1. Months differ in
    /// length (28–31 days: a `P1Y` offer whose first month is February would divide to 13), so
    /// when this duration is whole months (and years) and the first period is a whole number of
    /// calendar months from `firstStart` (within ``monthMatchTolerance``, which also takes
    /// Jan 31 → Feb 28), the division is in months; otherwise in seconds, this duration added to
    /// `firstStart` on the calendar. Apple does not say how it counts a period of months that
    /// began on the 29th–31st; this reading needs only the first period's length.
    public func billingPeriods(firstFrom firstStart: Date, to firstEnd: Date) -> Int? {
        let firstLength = firstEnd.timeIntervalSince(firstStart)
        guard firstLength > 0 else { return nil }
        let offerMonths = years * 12 + months
        if weeks == 0, days == 0, offerMonths > 0,
            let periodMonths = (1...12).first(where: { count in
                Self.calendar.date(byAdding: .month, value: count, to: firstStart)
                    .map { abs($0.timeIntervalSince(firstEnd)) <= Self.monthMatchTolerance } ?? false
            })
        {
            return max(1, Int((Double(offerMonths) / Double(periodMonths)).rounded()))
        }
        guard let end = end(from: firstStart) else { return nil }
        return max(1, Int((end.timeIntervalSince(firstStart) / firstLength).rounded()))
    }

    /// How many billing periods this offer lasts, read from the periods of its run seen so far
    /// (`periods`: each one's `purchaseDate` and `expiresDate`, the run's first period first); nil
    /// when none has a length or the calendar cannot add this duration.
    ///
    /// One period is a fragile measure of the product's billing period: a first period shortened
    /// (a renewal recovered late in Billing Grace Period, if Apple keeps the renewal date) would
    /// divide `P3M` into 18 five-day periods, and one lengthened (Apple's Extend Subscription
    /// Renewal Date, up to 90 days) into too few. So the billing period is the most common of the
    /// run's periods whose length is one Apple sells (``StandardLength``: a week, 1, 2, 3 or 6
    /// months, a year, read within a few days), the shortest of them on a tie (Apple's Extend
    /// Subscription Renewal Date only lengthens a period, up to 90 days, and can lengthen one
    /// month into a length read as two or three: a two-period run [1 month, 2 months] is one
    /// month); only when none is standard, the first period as before. The count is then ``billingPeriods(firstFrom:to:)``
    /// of that period, at most ``maximumBillingPeriods``. Apple is silent on how shortened or
    /// extended periods relate to `offerPeriod`, and on any largest period count; the rule and
    /// the bound are this service's.
    public func billingPeriods(run periods: [(start: Date, end: Date)]) -> Int? {
        let measured = periods.filter { $0.end > $0.start }
        guard let first = measured.first else { return nil }
        var tally: [StandardLength: (count: Int, latest: Int)] = [:]
        for (index, period) in measured.enumerated() {
            guard let length = StandardLength(from: period.start, to: period.end) else { continue }
            tally[length] = ((tally[length]?.count ?? 0) + 1, index)
        }
        // Most common first, then the shorter length (fewer days) on a tie.
        let chosen = tally.max { left, right in
            left.value.count != right.value.count ? left.value.count < right.value.count : left.key.nominalDays > right.key.nominalDays
        }.map { measured[$0.value.latest] } ?? first
        guard let count = billingPeriods(firstFrom: chosen.start, to: chosen.end) else { return nil }
        return min(count, maximumBillingPeriods)
    }

    /// The most billing periods this offer is counted as: its length in weeks (rounded, at least
    /// 1), since no billing period Apple sells is shorter than a week (auto-renewable
    /// subscription durations: 1 week, 1, 2, 3 or 6 months, 1 year). `P3M` is at most 13
    /// periods, `P1Y` 52. Apple does not state a largest pay-as-you-go period count; this bound
    /// only limits the harm of a mismeasured billing period.
    public var maximumBillingPeriods: Int {
        let start = Date(timeIntervalSince1970: 0)
        guard let end = end(from: start) else { return 1 }
        return max(1, Int((end.timeIntervalSince(start) / (7 * 86_400)).rounded()))
    }

    /// A billing period length Apple sells for auto-renewable subscriptions, read from a period's
    /// length in days: a week (6–8 days), 1 month (27–32), 2 months (58–63), 3 months (88–94),
    /// 6 months (179–186), a year (355–370). Other lengths (a period shortened or extended, a
    /// Sandbox period of minutes) are none.
    public enum StandardLength: Hashable, Sendable {
        case week
        case months(Int)

        /// The length in days, to order lengths (a week 7, a month 30).
        var nominalDays: Int {
            switch self {
            case .week: 7
            case .months(let months): months * 30
            }
        }

        public init?(from start: Date, to end: Date) {
            let days = end.timeIntervalSince(start) / 86_400
            switch days {
            case 6...8: self = .week
            case 27...32: self = .months(1)
            case 58...63: self = .months(2)
            case 88...94: self = .months(3)
            case 179...186: self = .months(6)
            case 355...370: self = .months(12)
            default: return nil
            }
        }
    }

    /// How far a first billing period's end may be from a whole number of calendar months after
    /// its start and still be read as that many months (3 days: a month that began on the 31st
    /// and was renewed on the 28th, or 3rd of the month after, is one month; a week is never).
    public static let monthMatchTolerance: TimeInterval = 3 * 86_400
}
