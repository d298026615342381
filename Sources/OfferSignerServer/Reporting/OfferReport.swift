import Foundation
import OfferSignerCore
import OfferSignerStorage

/// What became of the offers this service signed (`offer-signer offers report`).
///
/// Per bundle and offer: issuances (signing requests, whatever their formats), redemptions Apple
/// reported that were matched to one of them, conversion (matched / issued), the median time
/// from signature to purchase, redemptions no signature of ours matched: with an
/// appAccountToken (another signer, or a leaked key) or without one (cannot be attributed), and
/// redemptions not placed yet (``OfferRedemption/State/unplaced``: the period they were redeemed
/// in is unknown until Apple's history is fetched; never counted as without a signature).
///
/// Rule: every stored redemption counts in exactly one of `matched`, `unplaced`, `unattributed`
/// and `unmatched`, so they add up to the redemptions stored. The admin pages read this model.
public enum OfferReport {
    public struct Row: Sendable, Equatable {
        public var bundleID: String
        public var offerID: String
        public var issued: Int64 = 0
        /// Seconds from signature to purchase, one per matched redemption.
        public var matched: [TimeInterval] = []
        /// Redemptions with an appAccountToken that no signature of ours matched.
        public var unmatched: Int64 = 0
        /// Redemptions without an appAccountToken (no signature can be matched to them).
        public var unattributed: Int64 = 0
        /// Redemptions not placed yet (see ``OfferRedemption/State/unplaced``).
        public var unplaced: Int64 = 0

        public init(bundleID: String, offerID: String) {
            self.bundleID = bundleID
            self.offerID = offerID
        }

        /// Matched redemptions per issuance.
        public var conversion: Double? { issued > 0 ? Double(matched.count) / Double(issued) : nil }
        /// Every redemption of the offer stored: matched, unplaced, without a token, or unmatched.
        public var redemptions: Int64 { Int64(matched.count) + unplaced + unattributed + unmatched }
        /// Median seconds from signature to purchase, over matched redemptions.
        public var medianSeconds: Double? {
            guard !matched.isEmpty else { return nil }
            let sorted = matched.sorted()
            let middle = sorted.count / 2
            return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
        }
    }

    public static func rows(issuances: [OfferIssuanceCount], redemptions: [OfferRedemption]) -> [Row] {
        var rows: [String: Row] = [:]
        func key(_ bundleID: String, _ offerID: String) -> String { bundleID + "\u{1F}" + offerID }
        for count in issuances {
            rows[key(count.bundleID, count.offerID), default: Row(bundleID: count.bundleID, offerID: count.offerID)].issued += count.issuances
        }
        for redemption in redemptions {
            let candidate = redemption.candidate
            var row = rows[key(candidate.bundleID, candidate.offerID)] ?? Row(bundleID: candidate.bundleID, offerID: candidate.offerID)
            if let issuedAt = redemption.signatureIssuedAt {
                row.matched.append(max(0, candidate.purchaseDate.timeIntervalSince(issuedAt)))
            } else if redemption.state == .unplaced {
                row.unplaced += 1
            } else if candidate.appAccountToken == nil {
                row.unattributed += 1
            } else {
                row.unmatched += 1
            }
            rows[key(candidate.bundleID, candidate.offerID)] = row
        }
        return rows.values.sorted { ($0.bundleID, $0.offerID) < ($1.bundleID, $1.offerID) }
    }

    public static func json(_ rows: [Row]) -> String {
        let items = rows.map { row in
            var writer = JSONObjectWriter()
            writer.field("bundleID", row.bundleID)
            writer.field("offerID", row.offerID)
            writer.field("issued", row.issued)
            writer.field("redeemed", Int64(row.matched.count))
            if let conversion = row.conversion { writer.field("conversion", json: String(format: "%.4f", conversion)) }
            if let median = row.medianSeconds { writer.field("medianSecondsToRedemption", json: String(format: "%.0f", median)) }
            writer.field("redeemedWithoutSignature", row.unmatched)
            writer.field("redeemedWithoutAppAccountToken", row.unattributed)
            writer.field("redeemedUnplaced", row.unplaced)
            writer.field("redemptions", row.redemptions)
            return writer.finish()
        }
        return "[" + items.joined(separator: ",") + "]\n"
    }

    public static func table(_ rows: [Row]) -> String {
        guard !rows.isEmpty else { return "no offers issued or redeemed\n" }
        var lines = [["bundle", "offer", "issued", "redeemed", "conversion", "median to redemption", "no signature", "no token", "unplaced"]]
        for row in rows {
            lines.append([
                row.bundleID, row.offerID, String(row.issued), String(row.matched.count),
                row.conversion.map { String(format: "%.1f%%", $0 * 100) } ?? "-",
                row.medianSeconds.map(Self.duration) ?? "-", String(row.unmatched), String(row.unattributed), String(row.unplaced),
            ])
        }
        let widths = (0..<lines[0].count).map { column in lines.map { $0[column].count }.max() ?? 0 }
        var text = lines.map { line in
            line.enumerated().map { $0.element.padding(toLength: widths[$0.offset], withPad: " ", startingAt: 0) }.joined(separator: "  ")
                .trimmingCharacters(in: .whitespaces)
        }.joined(separator: "\n") + "\n"
        if rows.contains(where: { $0.unmatched > 0 }) {
            text += "warning: redemptions with an appAccountToken but no signature from this service: another signer, or a leaked In-App Purchase key\n"
        }
        if rows.contains(where: { $0.unplaced > 0 }) {
            text += "note: unplaced redemptions wait for Apple's history of their subscription (the period they were redeemed in is unknown); a running server asks Apple again every 15 minutes\n"
        }
        return text
    }

    static func duration(_ seconds: Double) -> String {
        if seconds < 120 { return String(format: "%.0f s", seconds) }
        if seconds < 7200 { return String(format: "%.0f min", seconds / 60) }
        return String(format: "%.1f h", seconds / 3600)
    }
}
