import Foundation
import Logging
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Writes signed audit checkpoints: when `everyRecords` records were appended since the last
/// checkpoint or `every` has passed, whichever comes first — only when the chain grew — and a
/// final one on graceful shutdown.
///
/// Rule: it runs first in the service list, so on shutdown (services stop in reverse order) it
/// stops last, after the HTTP server and the audit committer have drained, and its final
/// checkpoint covers every record the server wrote.
final class AuditCheckpointer: Service, Sendable {
    private let store: any OfferSignerStore
    private let masterKey: MasterKey
    private let everyRecords: Int64
    private let every: Duration
    private let logger: Logger
    private let lastCheckpointed = Mutex<Int64>(0)

    init(store: any OfferSignerStore, masterKey: MasterKey, everyRecords: Int, every: Duration, logger: Logger) {
        self.store = store
        self.masterKey = masterKey
        self.everyRecords = Int64(max(1, everyRecords))
        self.every = every > .zero ? every : .seconds(300)
        self.logger = logger
    }

    func run() async throws {
        lastCheckpointed.withLock { $0 = 0 }
        if let latest = try? await store.latestCheckpoint() { lastCheckpointed.withLock { $0 = latest.sequence } }
        let tick = min(every, .seconds(1))
        await cancelWhenGracefulShutdown {
            let clock = ContinuousClock()
            var lastTime = clock.now
            while !Task.isCancelled {
                do {
                    try await Task.sleep(for: tick)
                } catch {
                    return
                }
                do {
                    let count = try await self.store.auditHead().count
                    let last = self.lastCheckpointed.withLock { $0 }
                    guard count > last else {
                        lastTime = clock.now
                        continue
                    }
                    if count - last >= self.everyRecords || clock.now - lastTime >= self.every {
                        await self.checkpoint(reason: count - last >= self.everyRecords ? "records" : "interval")
                        lastTime = clock.now
                    }
                } catch {
                    self.logger.error("audit head read failed", metadata: ["error": "\(error)"])
                }
            }
        }
        // Graceful shutdown (or cancellation): a final checkpoint when the chain grew. When the
        // service group was cancelled (another service failed, say the HTTP server could not
        // bind), this task is cancelled too and the store's async calls would refuse to start;
        // so the checkpoint runs in a task of its own, which does not inherit the cancellation,
        // and this one waits for it.
        await Task { await self.checkpoint(reason: "shutdown") }.value
    }

    /// Writes a checkpoint now if the chain grew; errors are logged, never thrown (a failing
    /// checkpoint must not stop signing).
    func checkpoint(reason: String) async {
        do {
            if let checkpoint = try await AuditCheckpointing.create(in: store, masterKey: masterKey) {
                lastCheckpointed.withLock { $0 = checkpoint.sequence }
                logger.info("audit checkpoint signed", metadata: [
                    "sequence": "\(checkpoint.sequence)", "head_hash": "\(checkpoint.headHash)",
                    "key_fingerprint": "\(checkpoint.keyFingerprint)", "reason": "\(reason)",
                ])
            }
        } catch {
            logger.error("audit checkpoint failed", metadata: ["error": "\(error)", "reason": "\(reason)"])
        }
    }
}
