import Foundation

/// The audit-signing key as a store keeps it: sealed under the master key, copied as it is.
public struct SealedAuditSigningKey: Sendable, Equatable {
    public var publicKeyPEM: String
    public var fingerprint: String
    public var sealedPrivateKey: Data
    public var createdAt: Date

    public init(publicKeyPEM: String, fingerprint: String, sealedPrivateKey: Data, createdAt: Date) {
        self.publicKeyPEM = publicKeyPEM
        self.fingerprint = fingerprint
        self.sealedPrivateKey = sealedPrivateKey
        self.createdAt = createdAt
    }
}

/// Everything of a store but the audit chain, the ledger and the checkpoints, for a verbatim
/// copy: sealed keys stay sealed (no master key is needed to copy them).
public struct StoreCopyRegistry: Sendable, Equatable {
    /// The master key check value the keys were sealed under (nil before the first key).
    public var masterKeyCheck: String?
    public var registryVersion: Int64
    /// In import order.
    public var keys: [SigningKeyRecord]
    public var clients: [APIClientRecord]
    public var auditSigningKey: SealedAuditSigningKey?
    /// Whether the source's rows carry MACs (its ``RegistryRowsMarker``); MACs are copied as they
    /// are (the master key stays the same).
    public var rowsAuthenticated: Bool
    /// The source's registry manifest, copied as it is: it names the same rows with the same
    /// MACs, so it verifies in the copy exactly when it verified in the source.
    public var manifest: StoredRegistryManifest?

    public init(
        masterKeyCheck: String?, registryVersion: Int64, keys: [SigningKeyRecord], clients: [APIClientRecord], auditSigningKey: SealedAuditSigningKey?,
        rowsAuthenticated: Bool = true, manifest: StoredRegistryManifest? = nil
    ) {
        self.rowsAuthenticated = rowsAuthenticated
        self.manifest = manifest
        self.masterKeyCheck = masterKeyCheck
        self.registryVersion = registryVersion
        self.keys = keys
        self.clients = clients
        self.auditSigningKey = auditSigningKey
    }
}

/// One step of a verbatim import (see ``OfferSignerStore/importVerbatim(_:)``).
public struct VerbatimImport: Sendable {
    /// The registry: only in the first step, which requires an empty store.
    public var registry: StoreCopyRegistry?
    /// Audit records exactly as stored (sequence, time and hashes are not recomputed).
    public var records: [AuditRecord]
    /// Ledger rows exactly as stored.
    public var ledger: [IssuedSignatureRecord]
    public var checkpoints: [AuditCheckpoint]
    /// Rows of one table of Apple's history (``AppleHistorySchema/copiedColumns``), in its column order.
    public var appleHistory: (table: String, rows: [[StoreValue]])?

    public init(registry: StoreCopyRegistry? = nil, records: [AuditRecord] = [], ledger: [IssuedSignatureRecord] = [], checkpoints: [AuditCheckpoint] = []) {
        self.registry = registry
        self.records = records
        self.ledger = ledger
        self.checkpoints = checkpoints
    }
}

/// Copies a whole store into an empty one, engine to engine.
///
/// Rules: the target must be empty (no key, client, audit record, ledger row, checkpoint or
/// audit-signing key); records, hashes, sealed keys and checkpoints are copied byte for byte,
/// through the source's audit head as read at the start; afterwards the target's chain is
/// verified against its checkpoints, and the copy fails unless it is intact with the source's
/// head hash.
public enum StoreCopy {
    /// What a finished copy found.
    public struct Summary: Sendable, Equatable {
        public var keys: Int
        public var clients: Int
        public var records: Int64
        public var ledgerRows: Int64
        public var checkpoints: Int
        public var sourceHead: String
        public var targetHead: String
        public var report: AuditVerificationReport
    }

    /// Records (and ledger rows) read and written per step.
    public static let pageSize = 5000

    /// Copies `source` into `target`; `progress` is called with a line about every 10,000
    /// records and ledger rows.
    public static func copy(
        from source: any OfferSignerStore, to target: any OfferSignerStore, progressEvery: Int64 = 10_000,
        progress: @escaping @Sendable (String) -> Void = { _ in }
    ) async throws -> Summary {
        guard try await target.isEmpty() else {
            throw StoreError(.conflict, "the target store is not empty; copy only into a new SQLite file or an empty PostgreSQL database")
        }
        let head = try await source.auditHead()
        let registry = try await source.copyRegistry()
        try await target.importVerbatim(VerbatimImport(registry: registry))

        var copied: Int64 = 0
        var nextReport = progressEvery
        while copied < head.count {
            let page = try await source.auditRecords(after: copied, limit: pageSize).filter { $0.sequence <= head.count }
            guard let last = page.last else { break }
            try await target.importVerbatim(VerbatimImport(records: page))
            copied = last.sequence
            if copied >= nextReport {
                progress("copied \(copied) of \(head.count) audit records")
                nextReport = (copied / progressEvery + 1) * progressEvery
            }
        }

        var ledgerRows: Int64 = 0
        var position: LedgerPosition?
        nextReport = progressEvery
        while true {
            let page = try await source.ledger(after: position, limit: pageSize)
            guard let last = page.last else { break }
            position = LedgerPosition(auditSequence: last.auditSequence, nonce: last.signature.nonce)
            let rows = page.filter { $0.auditSequence <= head.count }
            if !rows.isEmpty { try await target.importVerbatim(VerbatimImport(ledger: rows)) }
            ledgerRows += Int64(rows.count)
            if ledgerRows >= nextReport {
                progress("copied \(ledgerRows) ledger rows")
                nextReport = (ledgerRows / progressEvery + 1) * progressEvery
            }
        }

        let checkpoints = try await source.checkpoints().filter { $0.sequence <= head.count }
        if !checkpoints.isEmpty { try await target.importVerbatim(VerbatimImport(checkpoints: checkpoints)) }

        // Apple's history and the redemptions (their `offer.redeemed` records are in the chain).
        for (table, _, _) in AppleHistorySchema.copiedColumns {
            var offset = 0
            while true {
                let rows = try await source.appleHistoryRows(table: table, offset: offset, limit: pageSize)
                guard !rows.isEmpty else { break }
                var batch = VerbatimImport()
                batch.appleHistory = (table, rows)
                try await target.importVerbatim(batch)
                offset += rows.count
            }
            if offset > 0 { progress("copied \(offset) rows of \(table)") }
        }

        let report = try await target.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in })
        let targetHead = try await target.auditHead()
        let summary = Summary(
            keys: registry.keys.count, clients: registry.clients.count, records: copied, ledgerRows: ledgerRows, checkpoints: checkpoints.count,
            sourceHead: head.hash, targetHead: targetHead.hash, report: report)
        guard report.isIntact, report.recordsChecked == head.count, targetHead.hash == head.hash, targetHead.count == head.count else {
            throw StoreError(.conflict, "the copy does not verify: source head \(head.count) \(head.hash), target head \(targetHead.count) \(targetHead.hash); \(report)")
        }
        return summary
    }
}

/// Where a walk through the ledger stands: rows are ordered by audit sequence, then nonce.
public struct LedgerPosition: Sendable, Equatable {
    public var auditSequence: Int64
    public var nonce: String

    public init(auditSequence: Int64, nonce: String) {
        self.auditSequence = auditSequence
        self.nonce = nonce
    }
}
