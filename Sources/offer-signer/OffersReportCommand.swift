import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage

/// `offer-signer offers …`: what became of the offers this service signed.
struct OffersCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "offers",
        abstract: "Report on issued offers and their redemptions (from App Store Server Notifications and fetched histories).",
        subcommands: [OffersReportCommand.self, OffersRetryUnplacedCommand.self]
    )
}

/// `offer-signer offers report`.
///
/// Per offer: issuances (signing requests, whatever their formats), redemptions Apple reported
/// that were matched to one of them, conversion (matched / issued), the median time from
/// signature to purchase, redemptions with no matching signature: with an appAccountToken
/// (a signature from another signer, or a leaked key) or without one (cannot be attributed), and
/// unplaced redemptions (the period they were redeemed in is not known yet; see `OfferReport`).
struct OffersReportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "report", abstract: "Per offer: issued, redeemed, conversion, time to redemption, unmatched and unplaced redemptions.")
    @OptionGroup var store: StoreOptions
    @Option(help: "Only signatures issued, and redemptions purchased, at or after this ISO 8601 time (e.g. 2026-11-01T00:00:00Z).")
    var since: String?
    @Flag(help: "Print a JSON array.")
    var json = false
    @Option(help: "Write the dashboard's Offers page (/admin/offers) to FILE as one self-contained HTML file (no server needed; charts inline, nothing fetched), over the last --days days.")
    var html: String?
    @Option(help: "With --html: the window, 30 or 90 whole UTC days ending today (default 30).")
    var days: Int?

    func validate() throws {
        if html != nil {
            if since != nil { throw ValidationError("--html covers the last --days days (30 or 90); it does not take --since") }
            if json { throw ValidationError("--html and --json write different things; give one") }
            if let days, !AdminOffersReport.windows.contains(days) {
                throw ValidationError("--days must be one of \(AdminOffersReport.windows.map(String.init).joined(separator: ", ")) (it is \(days))")
            }
        } else if days != nil {
            throw ValidationError("--days is for --html; the table and --json take --since")
        }
    }

    func run() async throws {
        if let html {
            try await writeHTML(to: html)
            return
        }
        var sinceDate: Date?
        if let since {
            guard let date = try? Date(since, strategy: .iso8601) else {
                throw ValidationError("--since '\(since)' is not an ISO 8601 time like 2026-11-01T00:00:00Z")
            }
            sinceDate = date
        }
        let store = try await store.open()
        let rows: [OfferReport.Row]
        do {
            rows = OfferReport.rows(issuances: try await store.offerIssuances(since: sinceDate), redemptions: try await store.offerRedemptions(since: sinceDate))
        } catch let error as StoreError {
            await store.close()
            throw CLIFailure(error.message)
        }
        await store.close()
        print(json ? OfferReport.json(rows) : OfferReport.table(rows), terminator: "")
    }

    /// The Offers page as one file: the same renderer and the same figures as /admin/offers.
    private func writeHTML(to path: String) async throws {
        let opened = try await store.open()
        let report: AdminOffersReport
        do {
            report = try await AdminOffersReport.load(store: opened, days: days ?? 30)
        } catch let error as StoreError {
            await opened.close()
            throw CLIFailure(error.message)
        }
        await opened.close()
        do {
            try Data(report.standaloneFile().utf8).write(to: URL(fileURLWithPath: path), options: .atomic)
        } catch {
            throw CLIFailure("cannot write '\(path)': \(error.localizedDescription)")
        }
        CLI.printNote("wrote the offers report (last \(report.days) days, \(report.rows.count) offers) to \(path)")
    }
}
