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
/// Rule: only keys in state `active` sign; only clients that are not revoked authenticate.
struct KeyRing: Sendable {
    var version: Int64
    var activeKeys: [String: ActiveSigningKey]
    var clients: [String: APIClientRecord]
    /// Bundle IDs with any key at all (an app is "configured" once it has a key).
    var configuredBundles: Set<String>

    static let empty = KeyRing(version: 0, activeKeys: [:], clients: [:], configuredBundles: [])

    init(version: Int64, activeKeys: [String: ActiveSigningKey], clients: [String: APIClientRecord], configuredBundles: Set<String>) {
        self.version = version
        self.activeKeys = activeKeys
        self.clients = clients
        self.configuredBundles = configuredBundles
    }

    /// Unseals the active keys of a snapshot. A key that cannot be opened is skipped and
    /// reported, so one bad row does not take the service down.
    init(snapshot: RegistrySnapshot, masterKey: MasterKey, logger: Logger) {
        var active: [String: ActiveSigningKey] = [:]
        for record in snapshot.keys where record.state == .active {
            do {
                let pem = try masterKey.open(record.sealedPrivateKey, context: record.keyID)
                let key = try InAppPurchaseKey(keyID: record.keyID, pemRepresentation: pem)
                active[record.bundleID] = ActiveSigningKey(signer: PromotionalOfferSigner(key: key), issuerID: record.issuerID, fingerprint: record.fingerprint)
            } catch {
                logger.error("cannot load active key", metadata: ["key_id": "\(record.keyID)", "bundle_id": "\(record.bundleID)", "error": "\(error)"])
            }
        }
        var clients: [String: APIClientRecord] = [:]
        for client in snapshot.clients where !client.isRevoked { clients[client.clientID] = client }
        self.init(version: snapshot.version, activeKeys: active, clients: clients, configuredBundles: Set(snapshot.keys.map(\.bundleID)))
    }
}

/// Holds the current ``KeyRing`` and swaps it when the store's registry version changes.
///
/// Rule: a key activation or client revocation in the store is in force on every running
/// server within one poll interval (250 ms by default), without restart; requests in flight
/// finish with the ring they started with.
final class KeyRingHolder: Service, Sendable {
    private let current = Mutex(KeyRing.empty)
    private let store: any OfferSignerStore
    private let masterKey: MasterKey
    private let interval: Duration
    private let logger: Logger

    init(store: any OfferSignerStore, masterKey: MasterKey, interval: Duration, logger: Logger) {
        self.store = store
        self.masterKey = masterKey
        self.interval = interval
        self.logger = logger
    }

    var ring: KeyRing { current.withLock { $0 } }

    /// Loads the registry now.
    func reload() async throws {
        let snapshot = try await store.registrySnapshot()
        let ring = KeyRing(snapshot: snapshot, masterKey: masterKey, logger: logger)
        current.withLock { $0 = ring }
        logger.info("key ring loaded", metadata: ["registry_version": "\(ring.version)", "active_keys": "\(ring.activeKeys.values.map(\.keyID).sorted())"])
    }

    func run() async throws {
        while !Task.isShuttingDownGracefully && !Task.isCancelled {
            do {
                try await Task.sleep(for: interval)
            } catch {
                return
            }
            do {
                if try await store.registryVersion() != ring.version { try await reload() }
            } catch {
                logger.error("registry poll failed", metadata: ["error": "\(error)"])
            }
        }
    }
}
