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
    /// Key IDs of the key rows whose MAC verified (any state): the keys this ring holds.
    var authenticKeyIDs: Set<String> = []
    /// Client IDs of the client rows whose MAC verified (revoked ones too): the clients this ring holds.
    var authenticClientIDs: Set<String> = []

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
        authenticKeyIDs = Set(keys.map(\.keyID))
        authenticClientIDs = Set(authenticClients.map(\.clientID))
    }
}

/// The first registry load found no manifest that vouches for the rows: the server does not start.
struct RegistryManifestRefused: Error, CustomStringConvertible {
    var problem: String
    /// Whether the store's rows carry MACs at all (see ``RegistrySnapshot/rowsAuthenticated``).
    var rowsAuthenticated: Bool
    var description: String { problem }
}

/// Holds the current ``KeyRing`` and swaps it when the store's registry changes.
///
/// Rules: a key activation or client revocation in the store is in force on every running
/// server within one poll interval (250 ms by default), without restart; when the store can
/// notify (PostgreSQL's LISTEN/NOTIFY), at once, with polling kept as the safety net for a lost
/// notification or connection. A reload happens whenever the store's change mark (its version,
/// the manifest's version and MAC) differs from the last one seen, in either direction: the
/// store's version is no order (`UPDATE registry SET version = 0` must not freeze the servers).
/// Loads are ordered by a counter of this process (a later load wins) and the authoritative
/// version is the registry manifest's (``RegistryManifest``), verified under the master key:
///
/// - a snapshot whose manifest does not vouch for its rows (a row added, deleted, or restored
///   with an earlier MAC) is not used: the last verified ring keeps serving; at start, the
///   server refuses to start;
/// - a manifest older than the highest version this process has seen, or the registry file
///   beside the master key holds (``RegistryVersionFile``), is a rollback and refused the same way;
/// - each refusal is counted, logged once per problem, and shown in `/readyz?detail`.
///
/// A request is authenticated, and its app looked up, in the ring it started with; what it uses
/// later comes from the ring as it is then: the App Store Server API credentials when it asks
/// Apple, and, when it signs, the bundle's active key and a second check of its API client
/// (`SigningController.signAndCommit`).
final class KeyRingHolder: Service, Sendable {
    private struct State {
        var ring = KeyRing.empty
        var loaded = false
        var lastMark: String?
        var lastSwappedLoad: UInt64 = 0
        var highestManifest: Int64
        var manifestProblem: String?
        var loggedProblem: String?
    }

    private let state: Mutex<State>
    private let loads = Atomic<UInt64>(0)
    private let store: any OfferSignerStore
    private let masterKey: MasterKey
    private let interval: Duration
    private let logger: Logger
    private let registryFile: RegistryVersionFile?
    /// Called with the number of rejected rows each time a ring is loaded.
    private let onRejectedRows: @Sendable (Int) -> Void
    /// Called each time a loaded registry is refused for its manifest.
    private let onManifestRefused: @Sendable () -> Void

    init(
        store: any OfferSignerStore, masterKey: MasterKey, interval: Duration, logger: Logger, registryFile: RegistryVersionFile? = nil,
        highestKnownManifest: Int64 = 0, onRejectedRows: @escaping @Sendable (Int) -> Void = { _ in },
        onManifestRefused: @escaping @Sendable () -> Void = {}
    ) {
        self.store = store
        self.masterKey = masterKey
        self.interval = interval
        self.logger = logger
        self.registryFile = registryFile
        self.onRejectedRows = onRejectedRows
        self.onManifestRefused = onManifestRefused
        state = Mutex(State(highestManifest: highestKnownManifest))
    }

    var ring: KeyRing { state.withLock { $0.ring } }

    /// Why the last registry read was refused (nil: the ring is the store's registry as it is).
    var manifestProblem: String? { state.withLock { $0.manifestProblem } }

    /// Loads the registry now.
    func reload() async throws {
        let load = loads.add(1, ordering: .relaxed).newValue
        // Read before the snapshot: a change in between makes the next poll load again.
        let mark = try await store.registryChangeMark()
        let snapshot = try await store.registrySnapshot()
        let version = snapshot.manifest?.version ?? 0
        var problem = RegistryManifest.problem(stored: snapshot.manifest, entries: snapshot.manifestEntries, authenticator: masterKey.registryRows)
        let highest = state.withLock { $0.highestManifest }
        if problem == nil && version < highest {
            problem = "the registry manifest is version \(version), below version \(highest), the highest this server or its registry file has seen: the registry was rolled back (restored from a backup, or by SQL)"
        }
        if let problem {
            let (first, log, serving) = state.withLock { state -> (Bool, Bool, Int64) in
                state.lastMark = mark
                state.manifestProblem = problem
                let log = state.loggedProblem != problem
                state.loggedProblem = problem
                return (!state.loaded, log, state.ring.version)
            }
            onManifestRefused()
            if first { throw RegistryManifestRefused(problem: problem, rowsAuthenticated: snapshot.rowsAuthenticated) }
            if log {
                logger.error(
                    "registry refused; the last verified registry keeps serving",
                    metadata: ["problem": "\(problem)", "serving_registry_version": "\(serving)"])
            }
            return
        }
        var ring = KeyRing(snapshot: snapshot, masterKey: masterKey, logger: logger)
        ring.version = version
        let swapped = state.withLock { state -> (previousVersion: Int64, swapped: Bool, raised: Bool) in
            state.lastMark = mark
            // The poller and the listener may both reload: the later load wins, never a lower manifest.
            guard load > state.lastSwappedLoad, version >= state.highestManifest else { return (state.ring.version, false, false) }
            let previous = state.ring.version
            let raised = version > state.highestManifest
            state.ring = ring
            state.loaded = true
            state.lastSwappedLoad = load
            state.highestManifest = version
            state.manifestProblem = nil
            state.loggedProblem = nil
            return (previous, true, raised)
        }
        guard swapped.swapped else { return }
        if swapped.raised, let registryFile {
            do {
                try registryFile.record(version)
            } catch {
                logger.error("cannot record the registry manifest version in the registry file", metadata: ["error": "\(error)"])
            }
        }
        onRejectedRows(ring.rejectedRows.count)
        // Once per row per registry version (the poller and the listener may both load one).
        if swapped.previousVersion != ring.version {
            for row in ring.rejectedRows {
                logger.error(
                    "registry row refused: its MAC under the master key is missing or does not verify (written or changed outside offer-signer)",
                    metadata: ["row": "\(row)", "registry_version": "\(ring.version)"])
            }
            logger.info("key ring loaded", metadata: ["registry_version": "\(ring.version)", "active_keys": "\(ring.activeKeys.values.map(\.keyID).sorted())"])
        }
    }

    /// Reloads when the store's change mark is not the last one seen.
    private func reloadIfChanged() async throws {
        let mark = try await store.registryChangeMark()
        if mark != state.withLock({ $0.lastMark }) { try await reload() }
    }

    /// Polls and listens on a thread of its own (``DedicatedThreadExecutor``): on a server
    /// whose concurrency pool is saturated with requests, a reload queued behind them came more
    /// than a second late (`KeyRotationUnderLoadTests`, in a full test run on two cores).
    func run() async throws {
        let executor = DedicatedThreadExecutor(name: "os-registry")
        defer { executor.shutdown() }
        await withTaskExecutorPreference(executor) {
            // Graceful shutdown cancels both at once (a long poll interval must not hold it up).
            await cancelWhenGracefulShutdown {
                // Child tasks, so both run on the executor whatever the caller's isolation.
                await withDiscardingTaskGroup { group in
                    group.addTask { await self.listen(executor) }
                    group.addTask { await self.poll(executor) }
                }
            }
        }
    }

    private func poll(_ executor: DedicatedThreadExecutor) async {
        while !Task.isCancelled {
            do {
                try await executor.sleep(for: interval)
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
    private func listen(_ executor: DedicatedThreadExecutor) async {
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
                try await executor.sleep(for: pause)
            } catch {
                return
            }
            pause = min(pause * 2, .seconds(2))
            try? await reloadIfChanged()
        }
    }
}
