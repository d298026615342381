import Logging
import OfferSignerStorage
import ServiceLifecycle

/// Runs the store's housekeeping (for SQLite: passive WAL checkpoints) about every second, so
/// that it never runs inside an audit commit that requests are waiting on. The store was prepared
/// for serving before (`buildApplication` calls `prepareForServing`).
struct StoreMaintenance: Service {
    let store: any OfferSignerStore
    let interval: Duration
    let logger: Logger

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await Task.sleep(for: interval)
            } catch {
                break
            }
            do {
                try await store.performMaintenance()
            } catch {
                logger.warning("store maintenance failed", metadata: ["error": "\(error)"])
            }
        }
        try? await store.performMaintenance()
    }
}
