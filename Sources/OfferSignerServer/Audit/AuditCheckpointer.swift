import Foundation
import Logging
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Writes signed audit checkpoints: when `everyRecords` records were appended since the last
/// checkpoint or `every` has passed since it was signed, whichever comes first — only when the
/// chain grew — and a final one on graceful shutdown.
///
/// Rules: the last checkpoint is the store's, not this process's, so several instances on one
/// database keep one checkpoint per interval for the deployment rather than one each; an
/// instance decides and signs while holding the store's checkpoint-writer lock, looking again
/// under the lock, so two instances never both sign the one that is due. It runs first in the
/// service list, so on shutdown (services stop in reverse order) it stops last, after the HTTP
/// server and the audit committer have drained, and its final checkpoint covers every record
/// the server wrote.
///
/// A checkpoint it refuses to sign (the chain no longer extends the last signed checkpoint, the
/// audit-signing key row is gone or replaced) is reported: logged, counted
/// (`offer_signer_audit_checkpoint_refusals_total`) and kept as ``refusal`` for readiness, until
/// a checkpoint is signed again. It checks the key and the signature of the store's latest
/// checkpoint once at start, so a deleted key row or a forged checkpoint row is reported at once,
/// not at the first due checkpoint.
final class AuditCheckpointer: Service, Sendable {
    private let store: any OfferSignerStore
    private let masterKey: MasterKey
    private let checkpointFile: LastCheckpointFile?
    private let onRefusal: @Sendable () -> Void
    private let lastRefusal = Mutex<String?>(nil)
    /// The store's latest checkpoint ``followStore()`` looked at last.
    private let followedThrough = Mutex<Int64>(0)
    /// The last checkpoint this process signed: the next must extend it.
    private let lastSigned = Mutex<AuditCheckpoint?>(nil)
    /// Why the last attempt to checkpoint was refused; nil once one succeeds.
    var refusal: String? { lastRefusal.withLock { $0 } }
    private let everyRecords: Int64
    private let every: Duration
    private let lockTimeout: Duration
    private let logger: Logger
    /// When this process started: before the store has any checkpoint, the interval runs from here.
    private let started = Mutex(Date())

    init(
        store: any OfferSignerStore, masterKey: MasterKey, everyRecords: Int, every: Duration, lockTimeout: Duration = .seconds(3), logger: Logger,
        checkpointFile: LastCheckpointFile? = nil, onRefusal: @escaping @Sendable () -> Void = {}
    ) {
        self.store = store
        self.masterKey = masterKey
        self.checkpointFile = checkpointFile
        self.onRefusal = onRefusal
        self.everyRecords = Int64(max(1, everyRecords))
        self.every = every > .zero ? every : .seconds(300)
        self.lockTimeout = lockTimeout
        self.logger = logger
    }

    func run() async throws {
        started.withLock { $0 = Date() }
        await checkSigningKey()
        let tick = min(every, .seconds(1))
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                do {
                    try await Task.sleep(for: tick)
                } catch {
                    return
                }
                do {
                    if let reason = try await self.dueReason(now: Date()) { await self.checkpoint(reason: reason) }
                    try await self.followStore()
                } catch {
                    self.logger.error("audit checkpoint check failed", metadata: ["error": "\(error)"])
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

    /// Checks that the store's audit-signing key is the master key's (and present when the log
    /// is not empty), that its latest checkpoint carries that key's valid signature and that the
    /// chain still extends the checkpoint file's, reporting a refusal when not.
    func checkSigningKey() async {
        do {
            _ = try await store.auditSigningKey(masterKey: masterKey)
            try await AuditCheckpointing.checkLatestSignature(in: store, masterKey: masterKey)
            if let checkpointFile { try await AuditCheckpointing.checkStoreExtends(checkpointFile, in: store) }
        } catch let error as StoreError where error.code == .conflict {
            refused(error)
        } catch {
            logger.error("audit-signing key check failed", metadata: ["error": "\(error)"])
        }
    }

    private func refused(_ error: StoreError) {
        lastRefusal.withLock { $0 = error.message }
        onRefusal()
        logger.error("audit checkpoint refused", metadata: ["error": "\(error.message)"])
    }

    /// Moves the checkpoint file forward when the store's latest checkpoint is newer than any
    /// this instance looked at (another instance signed it), if it verifies and extends the
    /// file (``AuditCheckpointing/advance(_:in:masterKey:)``): instances with files of their own
    /// follow the deployment's last checkpoint, not only their own. Each newer checkpoint is
    /// looked at once.
    func followStore() async throws {
        guard let checkpointFile, let latest = try await store.latestCheckpoint() else { return }
        let isNew = followedThrough.withLock { followed in
            guard latest.sequence > followed else { return false }
            followed = latest.sequence
            return true
        }
        guard isNew, (try checkpointFile.lastCheckpoint()?.sequence ?? 0) < latest.sequence else { return }
        if let moved = try await AuditCheckpointing.advance(checkpointFile, in: store, masterKey: masterKey) {
            logger.debug("checkpoint file moved forward to another instance's checkpoint", metadata: ["sequence": "\(moved.sequence)"])
        }
    }

    /// Why a checkpoint is due now ("records" or "interval"), from the store's head and its
    /// latest checkpoint; nil when none is.
    func dueReason(now: Date) async throws -> String? {
        let count = try await store.auditHead().count
        let latest = try await store.latestCheckpoint()
        let last = latest?.sequence ?? 0
        guard count > last else { return nil }
        if count - last >= everyRecords { return "records" }
        let since = latest?.createdAt ?? started.withLock { $0 }
        return now.timeIntervalSince(since) * 1_000_000_000 >= Double(every.nanoseconds) ? "interval" : nil
    }

    /// Writes a checkpoint under the store's checkpoint-writer lock: for "shutdown" whenever the
    /// chain grew, otherwise only if one is still due once the lock is held (another instance may
    /// just have signed it). Errors are logged, never thrown (a failing checkpoint must not stop
    /// signing).
    func checkpoint(reason: String) async {
        do {
            let written = try await store.withExclusiveLock(.auditCheckpointWriter, timeout: lockTimeout) { () async throws -> AuditCheckpoint? in
                if reason != "shutdown" {
                    guard try await self.dueReason(now: Date()) != nil else { return nil }
                }
                return try await AuditCheckpointing.create(
                    in: self.store, masterKey: self.masterKey, checkpointFile: self.checkpointFile, lastSigned: self.lastSigned.withLock { $0 })
            }
            if let checkpoint = written {
                lastRefusal.withLock { $0 = nil }
                lastSigned.withLock { $0 = checkpoint }
                logger.info("audit checkpoint signed", metadata: [
                    "sequence": "\(checkpoint.sequence)", "head_hash": "\(checkpoint.headHash)",
                    "key_fingerprint": "\(checkpoint.keyFingerprint)", "reason": "\(reason)",
                ])
            }
        } catch let error as StoreError where error.code == .conflict {
            refused(error)
        } catch where Task.isCancelled {
            // Shutdown interrupted a periodic checkpoint; the final one (in a task of its own) follows.
            logger.debug("audit checkpoint interrupted by shutdown", metadata: ["reason": "\(reason)"])
        } catch {
            logger.error("audit checkpoint failed", metadata: ["error": "\(error)", "reason": "\(reason)"])
        }
    }
}
