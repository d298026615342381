import Foundation
import Logging
import OfferSignerEligibility
import OfferSignerStorage
import ServiceLifecycle

/// Writes the histories fetched from Apple's App Store Server API to the store, off the request
/// path: a lookup hands its history over and goes on deciding.
///
/// Rules: at most `capacity` histories wait (when more arrive, the oldest waiting one is dropped
/// and counted: the next lookup of that customer fetches and hands it over again); each write
/// records the redemptions the history shows (see ``OfferRedemption``); a failed write is logged
/// and counted, never retried (the next fetch carries the same history).
final class AppleHistoryRecorder: Service, Sendable {
    private let store: any OfferSignerStore
    private let metrics: ServerMetrics
    private let logger: Logger
    private let stream: AsyncStream<VerifiedHistory>
    private let continuation: AsyncStream<VerifiedHistory>.Continuation

    init(store: any OfferSignerStore, metrics: ServerMetrics, logger: Logger, capacity: Int = 1024) {
        self.store = store
        self.metrics = metrics
        self.logger = logger
        (stream, continuation) = AsyncStream.makeStream(of: VerifiedHistory.self, bufferingPolicy: .bufferingNewest(capacity))
    }

    /// Hands a fetched history over (never waits).
    func submit(_ history: VerifiedHistory) {
        if case .dropped = continuation.yield(history) { metrics.appleHistoryStored("dropped") }
    }

    func run() async throws {
        await withGracefulShutdownHandler {
            for await history in stream {
                await record(history)
            }
        } onGracefulShutdown: { [continuation] in
            continuation.finish()
        }
    }

    func record(_ history: VerifiedHistory) async {
        do {
            let result = try await store.recordAppleHistory(AppleHistoryConversion.update(history), at: Date())
            metrics.appleHistoryStored("recorded")
            if case .recorded(let redemptions) = result {
                for redemption in redemptions {
                    metrics.offerRedeemed(bundleID: redemption.candidate.bundleID, offerID: redemption.candidate.offerID, matched: redemption.isMatched)
                }
            }
        } catch {
            metrics.appleHistoryStored("failed")
            logger.warning("could not store a history fetched from Apple", metadata: ["bundle_id": "\(history.bundleID)", "error": "\(error)"])
        }
    }
}
