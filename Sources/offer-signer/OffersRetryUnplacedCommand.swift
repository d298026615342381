import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer offers retry-unplaced [--bundle-id ID]`: re-arms unplaced redemptions the
/// background placement gave up on (``RedemptionPlacementSchedule/maximumAttempts`` answers from
/// Apple without a history that places them): their attempts go back to 0 and they are due now,
/// so a running server's next sweep asks Apple about them again, backing off as before.
///
/// Rule: one `offer.redemptions_rearmed` audit record (actor, bundle, count, reason) in the same store
/// transaction when any changed; none changed is not an error (prints 0, exits 0).
struct OffersRetryUnplacedCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "retry-unplaced",
        abstract: "Ask Apple again about unplaced redemptions the background placement gave up on (after the cause is fixed).")
    @OptionGroup var store: StoreOptions
    @OptionGroup var actor: ActorOptions
    @Option(name: .customLong("bundle-id"), help: "Only this app's redemptions (default: every app's).")
    var bundleID: String?

    func validate() throws {
        if let bundleID, bundleID.isEmpty || bundleID.count > 255 || bundleID.contains(where: { $0.isWhitespace || $0.isNewline }) {
            throw ValidationError("--bundle-id must be a bundle ID like com.example.app")
        }
    }

    func run() async throws {
        let opened = try await store.open()
        let count: Int
        do {
            count = try await opened.rearmGivenUpOfferRedemptions(bundleID: bundleID, actor: actor.resolvedActor, reason: actor.reason, at: Date())
        } catch let error as StoreError {
            await opened.close()
            throw CLIFailure(error.message)
        }
        await opened.close()
        print("re-armed \(count) given-up unplaced redemption\(count == 1 ? "" : "s")\(bundleID.map { " of \($0)" } ?? ""); a running server asks Apple about them at its next sweep")
    }
}
