import Foundation
import GRDB
import OfferSignerCore

/// The daily roll-up of issuances, `offer_issuance_days`: per UTC day (`issued_at / 86,400,000`),
/// app, offer and client, how many issuances the ledger holds (counted as `offerIssuances` counts
/// them: one per signing request, whatever its formats) and the newest one's time. The Offers
/// page's chart and totals and the Clients page's last use read it (at most days × offers ×
/// clients rows for a window) instead of the ledger (SQLite "v9-issuance-days", PostgreSQL
/// migration 10; the same statements in both).
///
/// Rule: it is written in the transaction that writes the ledger rows it counts. A group commit
/// adds its batch, aggregated in memory, with one UPSERT per distinct (day, app, offer, client),
/// never one per signature; anything else that removes or imports ledger rows (a withdrawn
/// signature, `store copy`) recounts the days it touched from the ledger (``recountStatement``,
/// bounded by the `issued_by_offer` index). Two signing requests identical to the millisecond
/// (same client, customer, product and offer) in two group commits count twice here and once
/// in the ledger's own count; nothing else differs.
public enum IssuanceRollUp {
    /// Migration: the table, filled from the ledger, and the ledger's covering time index
    /// dropped (nothing reads the ledger by time any more: the roll-up answers the windows).
    public static let statements: [String] = [
        """
        CREATE TABLE offer_issuance_days (
            day BIGINT NOT NULL,
            bundle_id TEXT NOT NULL,
            offer_id TEXT NOT NULL,
            client TEXT NOT NULL,
            issued BIGINT NOT NULL,
            last_issued_at BIGINT NOT NULL,
            PRIMARY KEY (day, bundle_id, offer_id, client)
        )
        """,
        """
        INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at)
        SELECT issued_at / \(DashboardSchema.dayMilliseconds), bundle_id, offer_id, client, COUNT(DISTINCT \(AppleHistorySchema.issuanceKey)), MAX(issued_at)
        FROM issued_signatures GROUP BY issued_at / \(DashboardSchema.dayMilliseconds), bundle_id, offer_id, client
        """,
        "DROP INDEX issued_by_time",
    ]

    /// One row of the roll-up: what a group adds to it, or what it holds.
    public struct Day: Sendable, Hashable {
        public var day: Int64
        public var bundleID: String
        public var offerID: String
        public var client: String

        public init(day: Int64, bundleID: String, offerID: String, client: String) {
            self.day = day
            self.bundleID = bundleID
            self.offerID = offerID
            self.client = client
        }

        /// The day's first and past-last millisecond.
        public var range: (start: Int64, end: Int64) { (day * DashboardSchema.dayMilliseconds, (day + 1) * DashboardSchema.dayMilliseconds) }
    }

    /// The UTC day of a ledger time, as the statements compute it (`issued_at / 86,400,000`).
    public static func day(of signature: IssuedSignature) -> Day {
        Day(day: signature.issuedAt.unixMilliseconds / DashboardSchema.dayMilliseconds, bundleID: signature.bundleID, offerID: signature.offerID, client: signature.client)
    }

    /// What identifies one issuance (``AppleHistorySchema/issuanceKey``).
    private struct IssuanceKey: Hashable {
        var client: String
        var token: String?
        var productID: String
        var offerID: String
        var issuedAt: Int64
    }

    /// The batch's issuances per day, app, offer and client (a request's several formats count
    /// once), with the newest time of each: one entry per UPSERT.
    public static func aggregate(_ signatures: some Sequence<IssuedSignature>) -> [(day: Day, issued: Int64, lastIssuedAt: Int64)] {
        var seen = Set<IssuanceKey>()
        var days: [Day: (issued: Int64, last: Int64)] = [:]
        for signature in signatures {
            let time = signature.issuedAt.unixMilliseconds
            guard seen.insert(IssuanceKey(client: signature.client, token: signature.appAccountToken, productID: signature.productID, offerID: signature.offerID, issuedAt: time)).inserted else {
                continue
            }
            let key = day(of: signature)
            var entry = days[key] ?? (0, time)
            entry.issued += 1
            entry.last = max(entry.last, time)
            days[key] = entry
        }
        return days.map { (day: $0.key, issued: $0.value.issued, lastIssuedAt: $0.value.last) }
    }

    /// Adds a batch's counts (SQLite `?` placeholders: day, bundle, offer, client, issued, last).
    static let upsertStatement = """
        INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at) VALUES (?, ?, ?, ?, ?, ?)
        ON CONFLICT (day, bundle_id, offer_id, client) DO UPDATE SET issued = issued + excluded.issued,
            last_issued_at = MAX(last_issued_at, excluded.last_issued_at)
        """

    /// Counts one day of one app, offer and client again from the ledger, along `issued_by_offer`
    /// (bundle, offer, time): after it, the row equals the ledger, or is gone when the ledger has
    /// none. Placeholders: day, bundle, offer, client (the delete), then day, bundle, offer, the
    /// day's start and end, client (the insert).
    public static let recountStatements = [
        "DELETE FROM offer_issuance_days WHERE day = ? AND bundle_id = ? AND offer_id = ? AND client = ?",
        """
        INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at)
        SELECT ?, bundle_id, offer_id, client, COUNT(DISTINCT \(AppleHistorySchema.issuanceKey)), MAX(issued_at) FROM issued_signatures
        WHERE bundle_id = ? AND offer_id = ? AND issued_at >= ? AND issued_at < ? AND client = ? GROUP BY bundle_id, offer_id, client
        """,
    ]

    /// The roll-up's rows of a window, per app, offer and day (summed over clients); rows of the
    /// first day only when the window starts at midnight UTC, else that day is counted from the
    /// ledger (``partialDayStatement``).
    static let perDayStatement = """
        SELECT bundle_id, offer_id, day, SUM(issued) AS issuances FROM offer_issuance_days WHERE day >= ?
        GROUP BY bundle_id, offer_id, day ORDER BY bundle_id, offer_id, day
        """

    /// A window's first day when it starts after midnight UTC: from the ledger, along
    /// `issued_by_offer`, only for the offers the roll-up has on that day. Placeholders: the day,
    /// the window's start, the day's end.
    public static let partialDayStatement = """
        SELECT bundle_id, offer_id, COUNT(DISTINCT \(AppleHistorySchema.issuanceKey)) AS issuances FROM issued_signatures
        WHERE (bundle_id, offer_id) IN (SELECT DISTINCT bundle_id, offer_id FROM offer_issuance_days WHERE day = ?) AND issued_at >= ? AND issued_at < ?
        GROUP BY bundle_id, offer_id ORDER BY bundle_id, offer_id
        """

    /// A client's last issuance at or after a day (placeholders: client, day).
    public static let lastIssuanceStatement = "SELECT MAX(last_issued_at) FROM offer_issuance_days WHERE client = ? AND day >= ?"

    /// The first day of a window, and whether the window starts at that day's midnight.
    public static func firstDay(of since: Date) -> (day: Int64, whole: Bool) {
        let millis = since.unixMilliseconds
        let day = Int64((Double(millis) / Double(DashboardSchema.dayMilliseconds)).rounded(.down))
        return (day, millis == day * DashboardSchema.dayMilliseconds)
    }

    /// Merges a window's roll-up rows with its partial first day counted from the ledger.
    public static func window(_ rows: [OfferIssuanceDay], firstDay: Int64, partial: [OfferIssuanceCount]?) -> [OfferIssuanceDay] {
        guard let partial else { return rows.filter { $0.day >= firstDay } }
        let edge = partial.filter { $0.issuances > 0 }.map { OfferIssuanceDay(bundleID: $0.bundleID, offerID: $0.offerID, day: firstDay, issuances: $0.issuances) }
        return (rows.filter { $0.day > firstDay } + edge).sorted { ($0.bundleID, $0.offerID, $0.day) < ($1.bundleID, $1.offerID, $1.day) }
    }
}

extension SQLiteStore {
    /// Adds a group's ledger rows to the roll-up, inside the group's transaction.
    static func rollUp(_ db: Database, _ signatures: some Sequence<IssuedSignature>) throws {
        let days = IssuanceRollUp.aggregate(signatures)
        guard !days.isEmpty else { return }
        let upsert = try db.cachedStatement(sql: IssuanceRollUp.upsertStatement)
        for entry in days {
            try upsert.execute(arguments: [entry.day.day, entry.day.bundleID, entry.day.offerID, entry.day.client, entry.issued, entry.lastIssuedAt])
        }
    }

    /// Counts these days again from the ledger, inside the caller's transaction.
    static func recount(_ db: Database, _ days: Set<IssuanceRollUp.Day>) throws {
        let delete = try db.cachedStatement(sql: IssuanceRollUp.recountStatements[0])
        let insert = try db.cachedStatement(sql: IssuanceRollUp.recountStatements[1])
        for day in days {
            let (start, end) = day.range
            try delete.execute(arguments: [day.day, day.bundleID, day.offerID, day.client])
            try insert.execute(arguments: [day.day, day.bundleID, day.offerID, start, end, day.client])
        }
    }
}
