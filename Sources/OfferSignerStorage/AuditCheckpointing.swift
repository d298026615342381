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
    ///
    /// The store's latest checkpoint, where the check starts, must carry a valid signature of
    /// the key derived from the master key: a row forged or altered by SQL is refused
    /// (`conflict`), never used as a starting point.
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
        if let latest, !key.publicKey.isValidSignature(of: latest) {
            throw StoreError(.conflict, Self.forgedLatestMessage(latest))
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

    static func forgedLatestMessage(_ latest: AuditCheckpoint) -> String {
        "refusing to sign a checkpoint: the store's latest checkpoint (\(latest.sequence)) does not carry a valid signature of the audit-signing key derived from the master key (the row was forged or altered); run `offer-signer audit verify --checkpoint-file …`"
    }

    /// Checks, at a service's start, that the store's latest checkpoint (if any) carries a valid
    /// signature of the key derived from `masterKey`; throws `conflict` when it does not.
    public static func checkLatestSignature(in store: any OfferSignerStore, masterKey: MasterKey) async throws {
        guard let latest = try await store.latestCheckpoint() else { return }
        guard AuditSigningKey.derived(from: masterKey).publicKey.isValidSignature(of: latest) else {
            throw StoreError(.conflict, forgedLatestMessage(latest))
        }
    }

    /// Throws `conflict` unless the store's chain still holds the checkpoint `file` keeps (at a
    /// service's start, so a rewrite is reported at once, not at the first due checkpoint).
    public static func checkStoreExtends(_ file: LastCheckpointFile, in store: any OfferSignerStore) async throws {
        guard let held = try file.lastCheckpoint() else { return }
        try await checkExtends(store: store, head: try await store.auditHead().count, signed: held, origin: "the checkpoint file '\(file.path)'")
    }

    /// Moves `file` forward, at a service's start, to the store's newest checkpoint that
    /// verifies: signed by the key derived from `masterKey`, its record still holding its head
    /// hash, and extending the checkpoint the file holds (the records between them verify as a
    /// chain from the file's record). Several instances with files of their own (PostgreSQL)
    /// thus converge on the deployment's last checkpoint. Returns the checkpoint written, nil
    /// when the file stays as it is (nothing newer verifies; an instance whose file the store no
    /// longer extends then refuses to sign, see ``create(in:masterKey:checkpointFile:lastSigned:now:)``).
    @discardableResult
    public static func advance(_ file: LastCheckpointFile, in store: any OfferSignerStore, masterKey: MasterKey) async throws -> AuditCheckpoint? {
        let publicKey = AuditSigningKey.derived(from: masterKey).publicKey
        let held = try file.lastCheckpoint()
        let head = try await store.auditHead()
        let candidates = try await store.checkpoints()
            .filter { $0.sequence > (held?.sequence ?? 0) && $0.sequence <= head.count }
            .sorted { $0.sequence > $1.sequence }
        for candidate in candidates where publicKey.isValidSignature(of: candidate) {
            guard let anchor = try await store.auditRecords(after: candidate.sequence - 1, limit: 1).first,
                anchor.sequence == candidate.sequence, anchor.hash == candidate.headHash
            else { continue }
            if let held {
                guard (try? await checkExtends(store: store, head: head.count, signed: held, origin: "the checkpoint file")) != nil else { return nil }
                let verifier = try await store.continueAuditVerification(
                    AuditVerification.Verifier(checkpoints: [], startingAfter: held.sequence, hash: held.headHash), through: candidate.sequence)
                let report = verifier.finish()
                guard report.firstBadRecord == nil, report.recordsChecked == candidate.sequence, report.headHash == candidate.headHash else { continue }
            }
            try file.write(candidate, publicKey: publicKey)
            return candidate
        }
        return nil
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
