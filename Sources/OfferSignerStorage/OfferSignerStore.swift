import Foundation

/// Everything offer-signer keeps: the key registry, API clients, the ledger of issued
/// signatures and the hash-chained audit log. The SQLite implementation is the embedded
/// default; other backends (PostgreSQL) implement the same protocol.
///
/// Rules every implementation keeps: nonces in the ledger are unique; an audit append and its
/// ledger rows commit atomically and durably before the call returns; each change to keys or
/// clients bumps the registry version and is itself audited in the same transaction.
public protocol OfferSignerStore: StoreCoordination {
    /// Binds the store to a master key on first use; afterwards refuses any other key
    /// (`StoreError.masterKeyMismatch`).
    func bindMasterKey(_ masterKey: MasterKey) async throws

    /// Called by a serving process once at start, then `performMaintenance` about every
    /// second: housekeeping that must stay off the commit path (SQLite: WAL checkpoints).
    func prepareForServing() async throws

    /// Periodic housekeeping while serving (see `prepareForServing`).
    func performMaintenance() async throws

    /// Succeeds when the store can be read.
    func ping() async throws

    /// The registry version, bumped by every key or client change.
    func registryVersion() async throws -> Int64

    /// Keys and clients, with the version they were read at.
    func registrySnapshot() async throws -> RegistrySnapshot

    /// Adds a key. It becomes `active` when its bundle has no active key, else `ready`. The row
    /// is stored with its MAC (see ``RegistryRowAuthenticator``).
    func importKey(_ key: SigningKeyRecord, actor: String, reason: String?, authenticator: RegistryRowAuthenticator) async throws -> SigningKeyRecord

    /// All keys, in import order.
    func listKeys() async throws -> [SigningKeyRecord]

    /// Moves a key to a new state, keeping one active key per bundle (activating a key retires
    /// the bundle's previous active key). Audited with actor, reason and both fingerprints.
    /// Every row it changes gets a new MAC; a key whose row's MAC does not verify (changed
    /// outside offer-signer) can only be revoked (`StoreError.conflict` otherwise).
    func transitionKey(keyID: String, to state: SigningKeyState, actor: String, reason: String?, force: Bool, authenticator: RegistryRowAuthenticator) async throws -> SigningKeyRecord

    /// Adds an API client, stored with its MAC.
    func createClient(_ client: APIClientRecord, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord

    /// All clients, revoked ones included.
    func listClients() async throws -> [APIClientRecord]

    /// Revokes a client by name; the revoked row gets a new MAC.
    func revokeClient(name: String, actor: String, authenticator: RegistryRowAuthenticator) async throws -> APIClientRecord

    /// Gives every registry row without a MAC its MAC and sets the marker that the rows are
    /// authenticated, in one transaction, audited (`registry.authenticated`, naming the rows).
    /// Run once on a store made before MACs existed; refused (`conflict`) once the marker is set,
    /// since a row without a MAC in an authenticated store was not written by offer-signer.
    func authenticateRegistry(authenticator: RegistryRowAuthenticator, actor: String) async throws -> RegistryAuthenticationSummary

    /// Writes a registry manifest over the rows as they are, whatever the stored one says (the
    /// next version above both it and ``RegistryRowAuthenticator/manifestFloor``), audited
    /// (`registry.manifest.written`). Only `store authenticate` calls it, to upgrade a store made
    /// before manifests or, when told to, to accept the rows as they are.
    func writeRegistryManifest(authenticator: RegistryRowAuthenticator, actor: String, reason: String) async throws -> StoredRegistryManifest

    /// A value that changes with every registry change (the version, the manifest's version and
    /// MAC): a server reloads when it differs from the last one it saw, in either direction.
    func registryChangeMark() async throws -> String

    /// Appends a batch of audit entries (with their ledger rows) in one durable transaction,
    /// in order; returns the stored records. All or nothing.
    func appendAudit(_ batch: [AuditAppend], at time: Date) async throws -> [AuditRecord]

    /// The same as ``appendAudit(_:at:)``, blocking the calling thread until the transaction is
    /// durably committed. For a writer that owns a thread of its own (the service's audit
    /// committer), so the commit path never waits in line behind request work on the
    /// concurrency pool. Never call it from async code.
    func appendAuditBlocking(_ batch: [AuditAppend], at time: Date) throws -> [AuditRecord]

    /// A durable write test on the audit commit path, blocking like ``appendAuditBlocking(_:at:)``
    /// (the service's audit committer runs it on its own thread while commits are failing, so it
    /// notices by itself, without signing traffic, when the store takes writes again).
    ///
    /// Rule: it succeeds only when a transaction that writes, and is synced, as an audit group
    /// commit is, commits; and it leaves nothing behind (no audit record, no ledger row). It must
    /// fail whenever an audit commit would fail for a store-wide reason (full, read-only, gone).
    func checkAuditWritable() throws

    /// Audit records with sequence greater than `sequence`, in order, at most `limit`.
    func auditRecords(after sequence: Int64, limit: Int) async throws -> [AuditRecord]

    /// Feeds the audit records after `verifier.count` through `sequence` to `verifier`, in order,
    /// stopping at the first bad one, and returns it. The walk streams inside the store (for
    /// SQLite, one read transaction on the store's own reader thread), so a long segment never
    /// holds a thread of the concurrency pool that requests are waiting for.
    func continueAuditVerification(_ verifier: AuditVerification.Verifier, through sequence: Int64) async throws -> AuditVerification.Verifier

    /// Number of audit records and the head hash.
    func auditHead() async throws -> (count: Int64, hash: String)

    /// The signatures issued for a customer (appAccountToken) of a bundle.
    func issuedSignatures(appAccountToken: String, bundleID: String) async throws -> [IssuedSignatureRecord]

    /// The issuances of a customer (appAccountToken) of a bundle, oldest first: one per signing
    /// request (its formats share the offer and the issue time), the offer and the time only.
    /// The read eligibility rules make before each decision, so it reads no more than that.
    func ledgerIssuances(appAccountToken: String, bundleID: String) async throws -> [LedgerIssuance]

    /// Removes the ledger rows of signatures that were audited as issued but never handed out
    /// (a Retention Messaging answer committed after Apple's time limit, whose customer saw the
    /// fallback instead), so no rule counts them. The audit chain keeps their `signature.issued`
    /// records; the caller commits a `signature.withdrawn` record naming them first. Returns the
    /// number of rows removed (0 for nonces not in the ledger).
    func withdrawIssuedSignatures(nonces: [String]) async throws -> Int

    // MARK: Apple's history (App Store Server Notifications V2 and App Store Server API answers)

    /// Records, in one durable transaction, what verified notifications or fetched histories
    /// says: the notification's UUID (a UUID recorded before makes the call a no-op,
    /// `.duplicateNotification`), the items (a later `signedDate` replaces an earlier one), which
    /// subscriptions are complete, and each redemption not recorded before, matched to its
    /// issuance (see ``OfferRedemption``) with its `offer.redeemed` audit record, or one recorded
    /// unplaced before that the update places, with its `offer.redemption_placed` record.
    func recordAppleHistories(_ updates: [AppleHistoryUpdate], at time: Date) async throws -> [AppleHistoryUpdateResult]

    /// The stored history of the subscription that `transactionID` belongs to (a transaction ID
    /// or an original transaction ID), or nil when the store knows neither.
    func appleHistory(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistory?

    /// Which stored history `transactionID` belongs to, whether it is complete and when it last
    /// changed, without its items (one short read): a history decoded before at that
    /// ``StoredAppleHistoryVersion/updatedAt`` is still the stored one.
    ///
    /// Rule: every write of a subscription's history moves its `updatedAt` on (to the write's time,
    /// or one millisecond past the last, whichever is later), in the same transaction as its items.
    func appleHistoryVersion(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistoryVersion?

    /// When the notification with this `notificationUUID` was stored, nil when it was not.
    func appleNotificationReceivedAt(notificationUUID: String) async throws -> Date?

    /// Until when Apple's notification history of an app and environment has been recovered (the
    /// scheduled catch-up's watermark, see `NotificationCatchUp`), nil before the first run.
    func notificationRecoveryWatermark(bundleID: String, environment: String) async throws -> Date?

    /// When the scheduled catch-up of an app and environment last moved (or held) its watermark,
    /// nil before the first run.
    func notificationRecoveryLastRun(bundleID: String, environment: String) async throws -> Date?

    /// Moves the watermark of an app and environment to `recoveredUntil` (never back: an earlier
    /// time leaves a later one in place), with the time of the run.
    func setNotificationRecoveryWatermark(bundleID: String, environment: String, recoveredUntil: Date, at time: Date) async throws

    /// Recorded redemptions whose purchase date is at or after `since` (all when nil), oldest first.
    func offerRedemptions(since: Date?) async throws -> [OfferRedemption]

    /// Redemptions recorded `unplaced` and not placed yet, the earliest recorded first, at most `limit`.
    func unplacedOfferRedemptions(limit: Int) async throws -> [OfferRedemption]

    /// Unplaced redemptions the sweep may still ask about (fewer than
    /// ``RedemptionPlacementSchedule/maximumAttempts`` attempts) that are due at `time`, after
    /// `cursor` in the order fewest attempts first, then oldest due (then bundle, environment,
    /// transaction), at most `limit`.
    func dueUnplacedOfferRedemptions(at time: Date, after cursor: UnplacedRedemptionCursor, limit: Int) async throws -> [UnplacedRedemption]

    /// Records one placement attempt, made at `time`, for each redemption of `subscription` still
    /// unplaced, still asked about and still due at `time` (another instance's attempt did not move
    /// it on), as `schedule` says for `outcome` (``RedemptionPlacementSchedule/afterAsk(_:attempts:recordedAt:at:)``:
    /// counted when Apple answered, else only moved on; given up at the cap or past the maximum
    /// age). Returns the redemptions given up with it.
    func recordRedemptionPlacementAttempt(
        _ subscription: AppleSubscriptionKey, at time: Date, outcome: RedemptionPlacementOutcome, schedule: RedemptionPlacementSchedule
    ) async throws -> [OfferRedemption]

    /// Re-arms given-up unplaced redemptions (of `bundleID`, or of every app): their attempts back
    /// to 0 and due at `time`, so the sweep asks Apple about them again; with one
    /// `offer.redemptions_rearmed` audit record (actor, bundle, count, reason) in the same transaction when
    /// any changed. Returns how many changed.
    func rearmGivenUpOfferRedemptions(bundleID: String?, actor: String, reason: String?, at time: Date) async throws -> Int

    /// Unplaced redemptions no longer asked about (given up), at most `limit`, the earliest recorded first.
    func givenUpOfferRedemptions(limit: Int) async throws -> [UnplacedRedemption]

    /// Issuances per bundle and offer, issued at or after `since` (all when nil).
    func offerIssuances(since: Date?) async throws -> [OfferIssuanceCount]

    // MARK: The operator's dashboard (/admin): bounded by a window, served by indexes (DashboardSchema)

    /// Issuances per bundle, offer and UTC day, issued at or after `since`; their per-offer totals
    /// (``OfferIssuanceDay/totals(_:)``) equal `offerIssuances(since:)` for the same window.
    func offerIssuancesPerDay(since: Date) async throws -> [OfferIssuanceDay]

    /// Notifications received at or after `since`, per app, environment, type and UTC day.
    func appleNotificationsPerDay(since: Date) async throws -> [AppleNotificationDay]

    /// When the newest notification of an app and environment was received, nil when none was.
    func lastAppleNotificationReceived(bundleID: String, environment: String) async throws -> Date?

    /// For each of `clients` (the ledger's `client` column, e.g. `client:<name>`), the time of its
    /// newest issuance at or after `since`; clients without one are absent.
    func lastIssuances(clients: [String], since: Date) async throws -> [String: Date]

    /// Keeps the last intact `audit verify` run (replacing the one before).
    func recordAuditVerification(_ record: AuditVerificationRecord) async throws

    /// The last intact `audit verify` run recorded, nil when none was.
    func lastAuditVerification() async throws -> AuditVerificationRecord?

    // MARK: Signed audit checkpoints

    /// The key that signs audit checkpoints: derived from the master key (see
    /// ``AuditSigningKey/derived(from:)``). Its public key is stored for a store with no audit
    /// record and no checkpoint yet (also when the master key is first bound); otherwise a
    /// missing or different stored key is refused (`conflict`), see
    /// ``AuditSigningKey/checkStored(publicKeyPEM:auditRecords:hasCheckpoints:)``.
    func auditSigningKey(masterKey: MasterKey) async throws -> AuditSigningKey

    /// Replaces the stored audit-signing key and all checkpoints (with `resigned`, the same
    /// checkpoints signed by `key`) and appends `entry`, in one transaction. Only for
    /// `offer-signer store authenticate`, after the chain verified against the old checkpoints.
    func replaceAuditSigningKey(_ key: AuditSigningKey, masterKey: MasterKey, resigned: [AuditCheckpoint], entry: AuditEntry) async throws

    /// The audit-signing public key, nil before the first checkpoint.
    func auditSigningPublicKey() async throws -> AuditSigningPublicKey?

    /// Stores a checkpoint; returns false when one for the same sequence and head hash exists
    /// already, throws `conflict` when one for the same sequence has another head hash.
    func appendCheckpoint(_ checkpoint: AuditCheckpoint) async throws -> Bool

    /// All checkpoints, by ascending sequence.
    func checkpoints() async throws -> [AuditCheckpoint]

    /// The checkpoint with the highest sequence.
    func latestCheckpoint() async throws -> AuditCheckpoint?

    /// Verifies the whole audit chain against checkpoints: `trusted` (an off-machine export,
    /// checked with its own key) first, then the store's own checkpoints with the store's key,
    /// which must be the trusted key when one is given. Calls `progress` about every
    /// `progressInterval` records. The default walks the chain with
    /// ``continueAuditVerification(_:through:)`` (see ``AuditVerification/verify(store:trusted:progressInterval:progress:)``).
    func verifyAudit(
        trusted: AuditCheckpointSet?, progressInterval: Int64, progress: @escaping @Sendable (Int64) -> Void
    ) async throws -> AuditVerificationReport

    /// Releases what the store holds open (connections); later calls fail. The default does
    /// nothing (SQLite closes with its last reference).
    func close() async

    // MARK: Verbatim copies (`offer-signer store copy`, see ``StoreCopy``)

    /// Whether the store holds nothing: no key, client, audit record, ledger row, checkpoint,
    /// audit-signing key or bound master key.
    func isEmpty() async throws -> Bool

    /// The registry as stored (sealed keys stay sealed), for a verbatim copy.
    func copyRegistry() async throws -> StoreCopyRegistry

    /// Rows of a table of Apple's history (``AppleHistorySchema/copiedColumns``), by primary key,
    /// skipping `offset`, at most `limit`, for a verbatim copy.
    func appleHistoryRows(table: String, offset: Int, limit: Int) async throws -> [[StoreValue]]

    /// Ledger rows after `position` (all when nil), by audit sequence then nonce, at most `limit`.
    func ledger(after position: LedgerPosition?, limit: Int) async throws -> [IssuedSignatureRecord]

    /// Writes one step of a verbatim copy in one transaction, byte for byte (no hash is
    /// recomputed, nothing is audited). A step with a registry is refused unless the store is
    /// empty; audit records must come after the store's last one, in order.
    func importVerbatim(_ batch: VerbatimImport) async throws
}

extension OfferSignerStore {
    /// One update (see ``recordAppleHistories(_:at:)``).
    public func recordAppleHistory(_ update: AppleHistoryUpdate, at time: Date) async throws -> AppleHistoryUpdateResult {
        try await recordAppleHistories([update], at: time).first ?? .recorded(redemptions: [])
    }
}

extension OfferSignerStore {
    public func verifyAudit(
        trusted: AuditCheckpointSet?, progressInterval: Int64, progress: @escaping @Sendable (Int64) -> Void
    ) async throws -> AuditVerificationReport {
        try await AuditVerification.verify(store: self, trusted: trusted, progressInterval: progressInterval, progress: progress)
    }

    public func close() async {}
}

extension AuditVerification {
    /// Verifies `store`'s whole chain against `trusted` and the store's own checkpoints, walking
    /// it in segments of `progressInterval` records through
    /// ``OfferSignerStore/continueAuditVerification(_:through:)`` up to the head read at the
    /// start (records appended meanwhile are left for the next run).
    public static func verify(
        store: some OfferSignerStore, trusted: AuditCheckpointSet?, progressInterval: Int64 = 100_000,
        progress: @escaping @Sendable (Int64) -> Void = { _ in }
    ) async throws -> AuditVerificationReport {
        var sets: [AuditCheckpointSet] = []
        if let trusted { sets.append(trusted) }
        let storedKey = try await store.auditSigningPublicKey()
        let storeSet = AuditCheckpointSet(origin: "the store", publicKey: storedKey, checkpoints: try await store.checkpoints())
        let storeProblems = storeProblems(trusted: trusted, store: storeSet)
        sets.append(storeSet)
        let head = try await store.auditHead().count
        var verifier = AuditVerification.Verifier(checkpoints: sets)
        let step = max(1, progressInterval)
        while verifier.count < head {
            let from = verifier.count
            let target = min(head, from + step)
            verifier = try await store.continueAuditVerification(verifier, through: target)
            // Short of the target: a bad or missing record stopped the walk.
            if verifier.count < target { break }
            if verifier.count % step == 0 { progress(verifier.count) }
        }
        var report = verifier.finish()
        report.checkpointProblems.insert(contentsOf: storeProblems, at: 0)
        return report
    }

    /// What the store's own checkpoint records say against a trusted copy (an export, the
    /// checkpoint file beside the master key): its key must be the trusted one and still be
    /// there, and its checkpoints must reach at least as far as the trusted ones (else rows were
    /// deleted, and the service could be made to sign over a rewritten chain).
    public static func storeProblems(trusted: AuditCheckpointSet?, store: AuditCheckpointSet) -> [String] {
        guard let trusted else { return [] }
        var problems: [String] = []
        let trustedLast = trusted.checkpoints.map(\.sequence).max() ?? 0
        if let storedKey = store.publicKey, let trustedKey = trusted.publicKey, storedKey != trustedKey {
            problems.append("the store's audit-signing key (\(storedKey.fingerprint)) is not the one in \(trusted.origin) (\(trustedKey.fingerprint)): it was replaced")
        }
        if store.publicKey == nil && trustedLast > 0 {
            problems.append("the store has no audit-signing key, but \(trusted.origin) vouches for \(trustedLast) records: the key row was deleted")
        }
        let storeLast = store.checkpoints.map(\.sequence).max() ?? 0
        if storeLast < trustedLast {
            problems.append("the store's checkpoints end at record \(storeLast), but \(trusted.origin) holds one of \(trustedLast) records: the store's checkpoints were deleted")
        }
        return problems
    }
}

extension OfferSignerStore {
    /// The fallback for backends without a write test of their own: an empty audit group
    /// commit. It reaches the store and takes the write lock, but may write nothing, so it can
    /// miss a full disk; backends should implement a write test that really writes.
    public func checkAuditWritable() throws {
        _ = try appendAuditBlocking([], at: Date())
    }
}
