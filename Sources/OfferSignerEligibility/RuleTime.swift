import Foundation

/// How the month counts of the rules are measured for one decision.
///
/// Rules:
/// - Production (and any environment other than Sandbox): calendar months in UTC on the Gregorian
///   calendar, as Foundation's `Calendar` adds them: "N months after D" is D plus N months, clamped
///   to the end of shorter months (Jan 31 + 1 month = Feb 28, or Feb 29 in a leap year). Apple is
///   silent on how it counts a month of its win-back criteria; these are the months its
///   subscription periods renew by.
/// - Sandbox: Apple's accelerated renewal rate, so that a tester reaches a win-back offer in
///   minutes. Apple's table ("Subscription renewal period → Renewal time": 1 week → 3 minutes,
///   1 month → 5 minutes, 2 months → 10 minutes, 3 months → 15 minutes, 6 months → 30 minutes,
///   1 year → 1 hour) is StoreKit Test's `SKTestSession.TimeRate.monthlyRenewalEveryFiveMinutes`,
///   of which Apple's page says only "The sandbox environment also supports this subscription
///   renewal rate" (App Store Connect Help, "Manage Sandbox Apple Account settings": a tester's
///   renewal rate can be changed, and it also sets the length of billing retry and grace periods).
///   Apple does not call it the sandbox's default; it is the rate these rules assume. A month of a
///   rule (a threshold such as `lapsedMonths` or a wait) is then `sandboxMonth` (5 minutes: the
///   table is 5 minutes per month from 1 to 12 months). Paid time is not read at that rate: the
///   table is not linear (a week is 3 minutes, not 5 × 7/30), so an observed Sandbox period counts
///   as the nominal duration of the nearest entry of the table (`sandboxNominalMonths`: 3 minutes is
///   a week, about 0.23 months, not 0.6). Apple is silent on how to read other renewal rates.
public struct RuleTime: Sendable, Hashable {
    /// A month's length in Sandbox at Apple's default renewal rate.
    public static let sandboxMonth: TimeInterval = 300

    /// Apple's Sandbox table: the observed length of a period (seconds) and the period it stands for
    /// (months; a week is 7 days of a mean Gregorian month, 365.2425 / 12 days).
    public static let sandboxTable: [(observed: TimeInterval, months: Double)] = [
        (180, 7 / (365.2425 / 12)), (300, 1), (600, 2), (900, 3), (1800, 6), (3600, 12),
    ]

    /// The nominal months of one observed Sandbox subscription period: those of the entry of
    /// `sandboxTable` whose renewal time is nearest to `observed` (a tie goes to the shorter).
    public static func sandboxNominalMonths(observed: TimeInterval) -> Double {
        sandboxTable.min { abs($0.observed - observed) < abs($1.observed - observed) }?.months ?? observed / sandboxMonth
    }

    /// `nil`: calendar months; otherwise a month is this many seconds.
    public let fixedMonth: TimeInterval?
    private let calendar: Calendar

    /// Calendar months (built once: a `Calendar` is not free to make, and every decision needs one).
    public static let calendarMonths = RuleTime(fixedMonth: nil)
    /// Sandbox months.
    public static let sandboxMonths = RuleTime(fixedMonth: sandboxMonth)

    /// The months of decisions on history from `environment`.
    public init(environment: AppleEnvironment?) {
        self = environment == .sandbox ? Self.sandboxMonths : Self.calendarMonths
    }

    init(fixedMonth: TimeInterval?) {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        self.calendar = calendar
        self.fixedMonth = fixedMonth
    }

    /// `date` plus `months` months.
    public func adding(months: Int, to date: Date) -> Date {
        if let fixedMonth { return date.addingTimeInterval(Double(months) * fixedMonth) }
        return calendar.date(byAdding: .month, value: months, to: date) ?? date
    }

    /// Months from `start` to `end`: whole months, plus the remainder as a fraction of the month
    /// that follows them (so Jan 15 → Mar 1 is 1 + 15/28 months in 2025).
    public func months(from start: Date, to end: Date) -> Double {
        guard end > start else { return 0 }
        if let fixedMonth { return end.timeIntervalSince(start) / fixedMonth }
        var whole = calendar.dateComponents([.month], from: start, to: end).month ?? 0
        while whole > 0 && adding(months: whole, to: start) > end { whole -= 1 }
        while adding(months: whole + 1, to: start) <= end { whole += 1 }
        let monthStart = adding(months: whole, to: start)
        let monthEnd = adding(months: whole + 1, to: start)
        let length = monthEnd.timeIntervalSince(monthStart)
        guard length > 0 else { return Double(whole) }
        return Double(whole) + end.timeIntervalSince(monthStart) / length
    }
}
