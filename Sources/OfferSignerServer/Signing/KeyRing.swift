import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// The signing key a bundle uses right now.
struct ActiveSigningKey: Sendable {
    var signer: PromotionalOfferSigner
    var issuerID: String?
    var fingerprint: String
    var keyID: String { signer.key.keyID }
}

/// What a running server signs with and whom it trusts, built from one registry snapshot.
///
/// Rule: only keys in state `active` sign; only clients that are not revoked authenticate; and
/// only rows whose MAC under the master key verifies count at all (see
/// ``RegistryRowAuthenticator``): a row without one, or with one that does not verify, was
/// written or changed by someone without the master key, and is left out (a client cannot
/// authenticate, a key does not sign, its bundle is not "configured" by it). MACs are checked
/// here, once per snapshot, never per request.
struct KeyRing: Sendable {
    var version: Int64
    var activeKeys: [String: ActiveSigningKey]
    var clients: [String: APIClientRecord]
    /// Bundle IDs with any key at all (an app is "configured" once it has a key).
    var configuredBundles: Set<String>
    /// The rows left out because their MAC is missing or does not verify ("key KEYID",
    /// "client NAME (CLIENTID)"): no secrets.
    var rejectedRows: [String] = []
    /// Whether the store's rows were ever given MACs (see ``RegistrySnapshot/rowsAuthenticated``).
    var rowsAuthenticated = true
    /// Rows whose MAC verified.
    var authenticRows = 0

    static let empty = KeyRing(version: 0, activeKeys: [:], clients: [:], configuredBundles: [])

    init(version: Int64, activeKeys: [String: ActiveSigningKey], clients: [String: APIClientRecord], configuredBundles: Set<String>) {
        self.version = version
        self.activeKeys = activeKeys
        self.clients = clients
        self.configuredBundles = configuredBundles
    }

    /// Unseals the active keys of a snapshot whose rows verify. A key that cannot be opened is
    /// skipped and reported, so one bad row does not take the service down.
    init(snapshot: RegistrySnapshot, masterKey: MasterKey, logger: Logger) {
        let authenticator = masterKey.registryRows
        var rejected: [String] = []
        let keys = snapshot.keys.filter { record in
            if authenticator.isAuthentic(record) { return true }
            rejected.append("key \(record.keyID)")
            return false
        }
        let authenticClients = snapshot.clients.filter { record in
            if authenticator.isAuthentic(record) { return true }
            rejected.append("client \(record.name) (\(record.clientID))")
            return false
        }
        var active: [String: ActiveSigningKey] = [:]
        for record in keys where record.state == .active {
            do {
                let pem = try masterKey.open(record.sealedPrivateKey, context: record.keyID)
                let key = try InAppPurchaseKey(keyID: record.keyID, pemRepresentation: pem)
                active[record.bundleID] = ActiveSigningKey(signer: PromotionalOfferSigner(key: key), issuerID: record.issuerID, fingerprint: record.fingerprint)
            } catch {
                logger.error("cannot load active key", metadata: ["key_id": "\(record.keyID)", "bundle_id": "\(record.bundleID)", "error": "\(error)"])
            }
        }
        var clients: [String: APIClientRecord] = [:]
        for client in authenticClients where !client.isRevoked { clients[client.clientID] = client }
        self.init(version: snapshot.version, activeKeys: active, clients: clients, configuredBundles: Set(keys.map(\.bundleID)))
        rejectedRows = rejected
        rowsAuthenticated = snapshot.rowsAuthenticated
        authenticRows = keys.count + authenticClients.count
    }
}

/// Holds the current ``KeyRing`` and swaps it when the store's registry version changes.
///
/// Rule: a key activation or client revocation in the store is in force on every running
/// server within one poll interval (250 ms by default), without restart; when the store can
/// notify (PostgreSQL's LISTEN/NOTIFY), at once, with polling kept as the safety net for a lost
/// notification or connection. Requests in flight finish with the ring they started with, and a
/// ring never gives way to one read at an older registry version.
final class KeyRingHolder: Service, Sendable {
    private let current = Mutex(KeyRing.empty)
    private let store: any OfferSignerStore
    private let masterKey: MasterKey
    private let interval: Duration
    private let logger: Logger
    /// Called with the number of rejected rows each time a ring is loaded.
    private let onRejectedRows: @Sendable (Int) -> Void

    init(store: any OfferSignerStore, masterKey: MasterKey, interval: Duration, logger: Logger, onRejectedRows: @escaping @Sendable (Int) -> Void = { _ in }) {
        self.store = store
        self.masterKey = masterKey
        self.interval = interval
        self.logger = logger
        self.onRejectedRows = onRejectedRows
    }

    var ring: KeyRing { current.withLock { $0 } }

    /// Loads the registry now.
    func reload() async throws {
        let snapshot = try await store.registrySnapshot()
        let ring = KeyRing(snapshot: snapshot, masterKey: masterKey, logger: logger)
        let swapped = current.withLock { current -> (previousVersion: Int64, swapped: Bool) in
            // The poller and the listener may both reload; the later registry version wins.
            guard ring.version >= current.version else { return (current.version, false) }
            let previous = current.version
            current = ring
            return (previous, true)
        }
        if swapped.swapped {
            onRejectedRows(ring.rejectedRows.count)
            // Once per row per registry version (the poller and the listener may both load one).
            if swapped.previousVersion != ring.version {
                for row in ring.rejectedRows {
                    logger.error(
                        "registry row refused: its MAC under the master key is missing or does not verify (written or changed outside offer-signer)",
                        metadata: ["row": "\(row)", "registry_version": "\(ring.version)"])
                }
            }
            logger.info("key ring loaded", metadata: ["registry_version": "\(ring.version)", "active_keys": "\(ring.activeKeys.values.map(\.keyID).sorted())"])
        }
    }

    /// Reloads when the store's registry version is not the ring's.
    private func reloadIfChanged() async throws {
        if try await store.registryVersion() != ring.version { try await reload() }
    }

    func run() async throws {
        // Graceful shutdown cancels both at once (a long poll interval must not hold it up).
        await cancelWhenGracefulShutdown {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.listen() }
                await self.poll()
                group.cancelAll()
            }
        }
    }

    private func poll() async {
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: interval)
            } catch {
                return
            }
            do {
                try await reloadIfChanged()
            } catch {
                logger.error("registry poll failed", metadata: ["error": "\(error)"])
            }
        }
    }

    /// Follows the store's change notifications until cancelled; returns at once when the store
    /// has none. After a lost connection it listens again (and looks at the version, since a
    /// change may have come while it was not listening).
    private func listen() async {
        var pause = Duration.milliseconds(100)
        while !Task.isCancelled {
            do {
                for try await _ in store.registryChanges() {
                    pause = .milliseconds(100)
                    do {
                        try await reloadIfChanged()
                    } catch {
                        logger.error("registry reload after a change notification failed", metadata: ["error": "\(error)"])
                    }
                }
                return
            } catch {
                if Task.isCancelled { return }
                logger.warning("registry change notifications lost; polling until they are back", metadata: ["error": "\(error)"])
            }
            do {
                try await Task.sleep(for: pause)
            } catch {
                return
            }
            pause = min(pause * 2, .seconds(2))
            try? await reloadIfChanged()
        }
    }
}
