import Crypto
import Foundation

/// The registry manifest as a store keeps it (columns `manifest_version` and `manifest_mac` of
/// the one `registry` row).
public struct StoredRegistryManifest: Sendable, Equatable {
    /// Moves up by one with every registry change the CLI makes; never down.
    public var version: Int64
    /// HMAC-SHA256 (base64) over the version and every registry row's (table, ID, row MAC), under
    /// a key derived from the master key (see ``RegistryManifest``).
    public var mac: String

    public init(version: Int64, mac: String) {
        self.version = version
        self.mac = mac
    }
}

/// One registry row as the manifest names it: its table, its ID (key ID, client ID) and the row
/// MAC it carries ("" for none).
public struct RegistryManifestEntry: Sendable, Hashable, Comparable {
    public var table: String
    public var rowID: String
    public var rowMAC: String

    public init(table: String, rowID: String, rowMAC: String?) {
        self.table = table
        self.rowID = rowID
        self.rowMAC = rowMAC ?? ""
    }

    public static func < (lhs: Self, rhs: Self) -> Bool {
        (lhs.table, lhs.rowID, lhs.rowMAC) < (rhs.table, rhs.rowID, rhs.rowMAC)
    }

    /// The entry of a key record as the CLI means to write it.
    public init(key: SigningKeyRecord) { self.init(table: "signing_keys", rowID: key.keyID, rowMAC: key.registryMAC) }

    /// The entry of a client record as the CLI means to write it.
    public init(client: APIClientRecord) { self.init(table: "api_clients", rowID: client.clientID, rowMAC: client.registryMAC) }

    /// The entries of a registry's rows, sorted.
    public static func of(keys: [SigningKeyRecord], clients: [APIClientRecord]) -> [RegistryManifestEntry] {
        (keys.map { RegistryManifestEntry(table: "signing_keys", rowID: $0.keyID, rowMAC: $0.registryMAC) }
            + clients.map { RegistryManifestEntry(table: "api_clients", rowID: $0.clientID, rowMAC: $0.registryMAC) }).sorted()
    }
}

/// The registry manifest: which registry rows exist, each with the MAC it carries, at which
/// version, authenticated by the master key.
///
/// Rules: the MAC is HMAC-SHA256 under an HKDF key of its own (label
/// `offer-signer registry manifest MAC v1`) over the version and the sorted (table, row ID, row
/// MAC) of every `signing_keys` and `api_clients` row, length-prefixed. Every registry change
/// the CLI makes checks the stored manifest against the rows before it changes anything
/// (``checkBeforeChange(stored:entries:authenticator:)``), and writes the next version in the
/// same transaction; so a row deleted, added, or restored with an earlier valid MAC (a client's
/// row from before its revocation, a retired key's earlier `active` row) no longer matches the
/// manifest, and a whole registry restored from a backup carries a lower version than the one
/// kept outside the database (``RegistryVersionFile``). A store with no manifest and no row is
/// an empty registry at version 0; one with rows and no manifest was made by an earlier
/// offer-signer (`offer-signer store authenticate` writes its first manifest).
public enum RegistryManifest {
    /// The HKDF label (info) of the manifest MAC key.
    public static let derivationLabel = "offer-signer registry manifest MAC v1"

    /// Why the stored manifest does not vouch for `entries` (nil: it does), and its version.
    public static func problem(
        stored: StoredRegistryManifest?, entries: [RegistryManifestEntry], authenticator: RegistryRowAuthenticator
    ) -> String? {
        guard let stored else {
            if entries.isEmpty { return nil }
            return "the store has key or client rows but no registry manifest: it was removed outside offer-signer (tampering), unless the store was made by an offer-signer from before registry manifests; restore the store from a backup, or check every row (`keys list`, `clients list`) and give `offer-signer store authenticate --accept-registry-rows`"
        }
        guard authenticator.isAuthenticManifest(stored, entries: entries) else {
            return "the key and client rows are not the ones the registry manifest (version \(stored.version)) lists with their MACs, or the manifest was changed: a row was added, deleted or restored from an earlier state outside offer-signer"
        }
        return nil
    }

    /// Rule for every CLI change: the stored manifest must vouch for the rows as they are, and
    /// must not be older than the highest version known outside the database
    /// (``RegistryRowAuthenticator/manifestFloor``). Returns the stored version (0 for none).
    public static func checkBeforeChange(
        stored: StoredRegistryManifest?, entries: [RegistryManifestEntry], authenticator: RegistryRowAuthenticator
    ) throws(StoreError) -> Int64 {
        if let problem = problem(stored: stored, entries: entries, authenticator: authenticator) {
            throw StoreError(.conflict, "refusing to change the registry: \(problem); see Docs/Security.md (Registry manifest)")
        }
        let version = stored?.version ?? 0
        try checkNotRolledBack(version: version, authenticator: authenticator)
        return version
    }

    /// Refuses a stored manifest older than the one the registry file holds.
    public static func checkNotRolledBack(version: Int64, authenticator: RegistryRowAuthenticator) throws(StoreError) {
        guard version >= authenticator.manifestFloor else {
            throw StoreError(
                .conflict,
                "refusing to change the registry: its manifest is version \(version), below version \(authenticator.manifestFloor) recorded in the registry file beside the master key; the registry was rolled back (restored from a backup, or by SQL)")
        }
    }

    /// The manifest after a change: the next version, over the rows as they now are.
    public static func next(after version: Int64, entries: [RegistryManifestEntry], authenticator: RegistryRowAuthenticator) -> StoredRegistryManifest {
        let next = max(version, authenticator.manifestFloor) + 1
        return StoredRegistryManifest(version: next, mac: authenticator.manifestMAC(version: next, entries: entries))
    }

    /// The entries a change must leave: the verified entries from before the change, with the
    /// rows the CLI wrote (`written`, as planned) replacing or adding theirs. The next manifest
    /// is computed over these, never over rows read back from the database.
    public static func expected(previous: [RegistryManifestEntry], written: [RegistryManifestEntry]) -> [RegistryManifestEntry] {
        var byRow: [String: RegistryManifestEntry] = [:]
        func key(_ entry: RegistryManifestEntry) -> String { entry.table + "\u{0}" + entry.rowID }
        for entry in previous { byRow[key(entry)] = entry }
        for entry in written { byRow[key(entry)] = entry }
        return byRow.values.sorted()
    }

    /// Rule after the writes of a change, before the manifest: the rows read back must be
    /// exactly the expected entries. Otherwise something in the database (a trigger, a rule)
    /// undid or altered the write, and the change is refused (its transaction rolls back).
    public static func checkWritten(expected: [RegistryManifestEntry], actual: [RegistryManifestEntry]) throws(StoreError) {
        guard expected.sorted() == actual.sorted() else {
            throw StoreError(
                .conflict,
                "refusing to change the registry: after writing, the key and client rows are not the ones written (a trigger, rule or another writer inside the database changed or undid the write); the registry was tampered with, nothing was changed; see Docs/Security.md (Registry manifest)")
        }
    }

    /// Rule for every registry write: it must change exactly one row.
    public static func checkOneRowChanged(_ count: Int, _ what: String) throws(StoreError) {
        guard count == 1 else {
            throw StoreError(
                .conflict,
                "refusing to change the registry: \(what) changed \(count) rows instead of 1 (a trigger or rule inside the database changed or undid the write); the registry was tampered with, nothing was changed; see Docs/Security.md (Registry manifest)")
        }
    }

    /// The audit entry of a manifest written over the rows as they are, without the previous
    /// one vouching for them (`store authenticate`).
    public static func rewrittenAuditEntry(_ manifest: StoredRegistryManifest, previous: StoredRegistryManifest?, rows: Int, actor: String, reason: String) -> AuditEntry {
        AuditEntry(kind: "registry.manifest.written", body: AuditBody.make([
            ("actor", actor), ("reason", reason), ("version", String(manifest.version)),
            ("previousVersion", previous.map { String($0.version) }), ("rows", String(rows)),
        ]))
    }
}

extension RegistryRowAuthenticator {
    /// The manifest MAC (base64) of `version` over `entries` (sorted here).
    public func manifestMAC(version: Int64, entries: [RegistryManifestEntry]) -> String {
        Data(HMAC<SHA256>.authenticationCode(for: Self.manifestBytes(version: version, entries: entries), using: manifestKey)).base64EncodedString()
    }

    /// Whether `manifest`'s MAC verifies over its version and `entries` (constant time).
    public func isAuthenticManifest(_ manifest: StoredRegistryManifest, entries: [RegistryManifestEntry]) -> Bool {
        guard let mac = Data(base64Encoded: manifest.mac) else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: Self.manifestBytes(version: manifest.version, entries: entries), using: manifestKey)
    }

    static func manifestBytes(version: Int64, entries: [RegistryManifestEntry]) -> Data {
        var data = Data()
        func append(_ text: String) {
            let bytes = Data(text.utf8)
            let count = UInt32(bytes.count)
            data.append(contentsOf: [UInt8(count >> 24), UInt8((count >> 16) & 0xFF), UInt8((count >> 8) & 0xFF), UInt8(count & 0xFF)])
            data.append(bytes)
        }
        append(RegistryManifest.derivationLabel)
        append(String(version))
        append(String(entries.count))
        for entry in entries.sorted() {
            append(entry.table)
            append(entry.rowID)
            append(entry.rowMAC)
        }
        return data
    }
}

/// The highest registry manifest version this deployment has seen, kept outside the database:
/// by default a file beside the master key (`<master-key-file>.registry`, `--registry-file`), so
/// someone who can write the database but not the master key's directory cannot roll the
/// registry back to an earlier, validly authenticated state.
///
/// Rules: one line, `offer-signer registry manifest version N`, read and replaced atomically as
/// ``FloorFile`` says (a temporary file in the same directory, synced, renamed, the directory
/// synced), mode 600; it only moves forward. Only a
/// version whose manifest verified under the master key is recorded (a forged high version
/// would otherwise lock the deployment out).
public struct RegistryVersionFile: Sendable {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// The default location for a master key read from `masterKeyFile`.
    public static func beside(masterKeyFile: String) -> RegistryVersionFile {
        RegistryVersionFile(path: masterKeyFile + ".registry")
    }

    /// Where `serve` keeps it when the master key comes from the environment and no
    /// `--registry-file` is given: beside the checkpoint file it keeps (`<name>.checkpoint` →
    /// `<name>.registry`), which serve always has.
    public static func beside(checkpointFile path: String) -> RegistryVersionFile {
        RegistryVersionFile(path: (path.hasSuffix(".checkpoint") ? String(path.dropLast(".checkpoint".count)) : path) + ".registry")
    }

    static let prefix = "offer-signer registry manifest version "

    /// The version the file holds; nil when there is no file yet.
    public func read() throws(StoreError) -> Int64? {
        guard let data = try FloorFile.read(path, what: "the registry file", limit: Self.sizeLimit) else { return nil }
        return try parse(data)
    }

    /// The largest registry file read (it holds one line).
    static let sizeLimit = 4096

    private func parse(_ data: Data) throws(StoreError) -> Int64 {
        let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard text.hasPrefix(Self.prefix), let version = Int64(text.dropFirst(Self.prefix.count)), version >= 0 else {
            throw StoreError(.conflict, "the registry file '\(path)' does not hold '\(Self.prefix)N'")
        }
        return version
    }

    /// Throws unless this process can replace the file (``FloorFile``): `serve` records every
    /// higher version it loads, so it checks this at start.
    public func checkWritable() throws(StoreError) {
        try FloorFile.checkWritable(path, what: "the registry file")
    }

    /// Refuses one path given for this file and the checkpoint file (`conflict`): each would
    /// replace the other.
    public func checkDistinct(from checkpointFile: LastCheckpointFile) throws(StoreError) {
        guard (checkpointFile.path as NSString).standardizingPath != (path as NSString).standardizingPath else {
            throw StoreError(.conflict, "the checkpoint file and the registry file are one file ('\(path)'): each would replace the other; give them paths of their own")
        }
    }

    /// The master key's registry authenticator, refusing changes onto a manifest older than this file's.
    public func authenticator(_ masterKey: MasterKey) throws(StoreError) -> RegistryRowAuthenticator {
        var authenticator = masterKey.registryRows
        authenticator.manifestFloor = try read() ?? 0
        return authenticator
    }

    /// Records `version` unless the file holds a higher one.
    public func record(_ version: Int64) throws(StoreError) {
        let bytes = Array((Self.prefix + String(version) + "\n").utf8)
        try FloorFile.raise(path, what: "the registry file", limit: Self.sizeLimit, to: bytes) { held throws(StoreError) in
            guard let held else { return false }
            return try parse(held) >= version
        }
    }

    /// After a CLI change: records the store's manifest version, if its manifest verifies.
    public func recordCurrent(of store: any OfferSignerStore, masterKey: MasterKey) async throws {
        let snapshot = try await store.registrySnapshot()
        let authenticator = masterKey.registryRows
        guard let manifest = snapshot.manifest,
            RegistryManifest.problem(stored: manifest, entries: snapshot.manifestEntries, authenticator: authenticator) == nil
        else { return }
        try record(manifest.version)
    }
}

extension RegistrySnapshot {
    /// The manifest entries of the snapshot's rows.
    public var manifestEntries: [RegistryManifestEntry] { RegistryManifestEntry.of(keys: keys, clients: clients) }
}
