import Foundation

/// Writing checkpoints, shared by the server's periodic writer and `audit checkpoints create`.
public enum AuditCheckpointing {
    /// Signs and stores a checkpoint of the chain's head when the chain grew since the last
    /// checkpoint; returns nil when it did not.
    ///
    /// Rule: a checkpoint is signed only over a chain that verifies from the previous
    /// checkpoint (whose head hash must still match) to the head, so the service never vouches
    /// for records that were tampered with; otherwise it throws `StoreError.conflict` naming
    /// the first bad record.
    ///
    /// With a `checkpointFile` (the copy beside the master key, see ``LastCheckpointFile``): the
    /// chain must also extend the checkpoint it holds (the last one this deployment signed), or
    /// nothing is signed; a checkpoint signed is written to it. Likewise for `lastSigned`, the last
    /// checkpoint the calling process signed (the service keeps it in memory).
    public static func create(
        in store: any OfferSignerStore, masterKey: MasterKey, checkpointFile: LastCheckpointFile? = nil, lastSigned: AuditCheckpoint? = nil,
        now: Date = Date()
    ) async throws -> AuditCheckpoint? {
        let key = try await store.auditSigningKey(masterKey: masterKey)
        let latest = try await store.latestCheckpoint()
        let head = try await store.auditHead()
        if let checkpointFile, let signed = try checkpointFile.lastCheckpoint() {
            try await checkExtends(store: store, head: head.count, signed: signed, origin: "the checkpoint file '\(checkpointFile.path)'")
        }
        if let lastSigned {
            try await checkExtends(store: store, head: head.count, signed: lastSigned, origin: "the last checkpoint this process signed")
        }
        if let latest, latest.sequence > head.count {
            throw StoreError(.conflict, "refusing to sign a checkpoint: the audit chain has \(head.count) records but checkpoint \(latest.sequence) vouches for more (its tail was removed); run `offer-signer audit verify`")
        }
        guard head.count > (latest?.sequence ?? 0) else { return nil }

        // Check the segment since the last checkpoint.
        var start: (sequence: Int64, hash: String) = (0, AuditChain.genesisHash)
        if let latest {
            guard let anchor = try await store.auditRecords(after: latest.sequence - 1, limit: 1).first,
                anchor.sequence == latest.sequence, anchor.hash == latest.headHash
            else {
                throw StoreError(.conflict, "refusing to sign a checkpoint: record \(latest.sequence) no longer has the hash its checkpoint signed (the chain was rewritten); run `offer-signer audit verify`")
            }
            start = (latest.sequence, latest.headHash)
        }
        let verifier = try await store.continueAuditVerification(
            AuditVerification.Verifier(checkpoints: [], startingAfter: start.sequence, hash: start.hash), through: head.count)
        let report = verifier.finish()
        if let bad = report.firstBadRecord {
            throw StoreError(.conflict, "refusing to sign a checkpoint: audit record \(bad) is bad: \(report.reason ?? "")")
        }
        guard report.recordsChecked == head.count else {
            throw StoreError(.conflict, "refusing to sign a checkpoint: the audit chain ends at record \(report.recordsChecked), not \(head.count)")
        }
        let checkpoint = key.checkpoint(sequence: head.count, headHash: report.headHash, at: now)
        guard try await store.appendCheckpoint(checkpoint) else { return nil }
        try checkpointFile?.write(checkpoint, publicKey: key.publicKey)
        return checkpoint
    }

    /// Throws `conflict` unless the store's chain still holds `signed` (a checkpoint signed
    /// earlier): at least as many records, and the record at its sequence with its head hash.
    static func checkExtends(store: any OfferSignerStore, head: Int64, signed: AuditCheckpoint, origin: String) async throws {
        guard head >= signed.sequence else {
            throw StoreError(.conflict, "refusing to sign a checkpoint: the audit chain has \(head) records but \(origin) vouches for \(signed.sequence) (its tail was removed); run `offer-signer audit verify`")
        }
        guard let anchor = try await store.auditRecords(after: signed.sequence - 1, limit: 1).first,
            anchor.sequence == signed.sequence, anchor.hash == signed.headHash
        else {
            throw StoreError(.conflict, "refusing to sign a checkpoint: record \(signed.sequence) no longer has the hash \(origin) vouches for (the chain was rewritten); run `offer-signer audit verify`")
        }
    }
}
