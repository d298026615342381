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
        subcommands: [OffersReportCommand.self]
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

    func run() async throws {
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
}
