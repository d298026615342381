import Foundation
import Logging
import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// Apple's history in PostgreSQL (migration 3; see ``OfferSignerStore/recordAppleHistory(_:at:)``).
///
/// Rule: a notification's UUID is inserted first (`ON CONFLICT DO NOTHING`), so two instances that
/// receive the same notification at once write it once: the second waits for the first's commit
/// and then finds the UUID. A redemption's `offer.redeemed` record locks the audit chain head in
/// the same transaction, like every audit append, and only once every history of the batch is
/// written: the head's lock, which every signature of every instance waits for, is held for the
/// redemptions and the commit, not for a batch of upserts.
extension PostgresStore {
    public func recordAppleHistories(_ updates: [AppleHistoryUpdate], at time: Date) async throws -> [AppleHistoryUpdateResult] {
        try await transaction("recording Apple's history") { connection, logger in
            var recorded: [Bool] = []
            for update in updates { recorded.append(try await Self.upsert(update, at: time, connection, logger)) }
            let matching = zip(updates, recorded).filter { $0.1 && !$0.0.redemptions.isEmpty }
            if !matching.isEmpty {
                // Matching takes the chain head's lock first (its audit record needs it anyway), so
                // two instances never match one issuance to two redemptions: under READ COMMITTED
                // neither would see the other's uncommitted match.
                _ = try await connection.query("SELECT seq FROM audit_head WHERE id = 1 FOR UPDATE", logger: logger).collect()
            }
            var results: [AppleHistoryUpdateResult] = []
            for (update, wasRecorded) in zip(updates, recorded) {
                guard wasRecorded else {
                    results.append(.duplicateNotification)
                    continue
                }
                results.append(.recorded(redemptions: try await Self.recordRedemptions(of: update, at: time, connection, logger)))
            }
            return results
        }
    }

    /// Writes a history's notification (false, writing nothing else, when its UUID was seen
    /// before), subscriptions, transactions and renewal infos.
    private static func upsert(_ update: AppleHistoryUpdate, at time: Date, _ connection: PostgresConnection, _ logger: Logger) async throws -> Bool {
        do {
            let now = time.unixMilliseconds
            if let notification = update.notification {
                let inserted = try await connection.query(
                    """
                    INSERT INTO apple_notifications (notification_uuid, bundle_id, environment, notification_type, subtype, original_transaction_id, signed_date, received_at)
                    VALUES (\(notification.notificationUUID), \(notification.bundleID), \(notification.environment), \(notification.notificationType),
                            \(notification.subtype), \(notification.originalTransactionID), \(notification.signedDate.unixMilliseconds), \(notification.receivedAt.unixMilliseconds))
                    ON CONFLICT (notification_uuid) DO NOTHING RETURNING 1
                    """, logger: logger
                ).collect()
                if inserted.isEmpty { return false }
            }
            for subscription in update.subscriptions {
                let complete = update.completeSubscriptions.contains(subscription) ? 1 : 0
                try await connection.run(
                    """
                    INSERT INTO apple_subscriptions (bundle_id, environment, original_transaction_id, complete, updated_at)
                    VALUES (\(subscription.bundleID), \(subscription.environment), \(subscription.originalTransactionID), \(complete), \(now))
                    ON CONFLICT (bundle_id, environment, original_transaction_id) DO UPDATE SET
                        complete = GREATEST(apple_subscriptions.complete, excluded.complete),
                        updated_at = GREATEST(excluded.updated_at, apple_subscriptions.updated_at + 1)
                    """, logger: logger)
            }
            for item in update.transactions {
                try await connection.run(
                    """
                    INSERT INTO apple_transactions (bundle_id, environment, transaction_id, original_transaction_id, signed_date, decoded, jws)
                    VALUES (\(item.bundleID), \(item.environment), \(item.key), \(item.originalTransactionID), \(item.signedDate?.unixMilliseconds), \(item.decoded), \(item.jws))
                    ON CONFLICT (bundle_id, environment, transaction_id) DO UPDATE SET
                        original_transaction_id = excluded.original_transaction_id, signed_date = excluded.signed_date,
                        decoded = excluded.decoded, jws = excluded.jws
                    WHERE apple_transactions.signed_date IS NULL OR excluded.signed_date > apple_transactions.signed_date
                        OR (excluded.signed_date = apple_transactions.signed_date
                            AND (excluded.jws IS DISTINCT FROM apple_transactions.jws OR excluded.decoded IS DISTINCT FROM apple_transactions.decoded
                                OR excluded.original_transaction_id IS DISTINCT FROM apple_transactions.original_transaction_id))
                    """, logger: logger)
            }
            for item in update.renewalInfos {
                try await connection.run(
                    """
                    INSERT INTO apple_renewal_infos (bundle_id, environment, original_transaction_id, signed_date, decoded, jws)
                    VALUES (\(item.bundleID), \(item.environment), \(item.key), \(item.signedDate?.unixMilliseconds), \(item.decoded), \(item.jws))
                    ON CONFLICT (bundle_id, environment, original_transaction_id) DO UPDATE SET
                        signed_date = excluded.signed_date, decoded = excluded.decoded, jws = excluded.jws
                    WHERE apple_renewal_infos.signed_date IS NULL OR excluded.signed_date > apple_renewal_infos.signed_date
                        OR (excluded.signed_date = apple_renewal_infos.signed_date
                            AND (excluded.jws IS DISTINCT FROM apple_renewal_infos.jws OR excluded.decoded IS DISTINCT FROM apple_renewal_infos.decoded))
                    """, logger: logger)
            }
            return true
        }
    }

    /// Matches a recorded history's redeemed offers to our issuances and audits each new one; the
    /// caller holds the chain head's lock.
    private static func recordRedemptions(
        of update: AppleHistoryUpdate, at time: Date, _ connection: PostgresConnection, _ logger: Logger
    ) async throws -> [OfferRedemption] {
        do {
            let now = time.unixMilliseconds
            var redemptions: [OfferRedemption] = []
            for candidate in update.redemptions {
                let seen = try await connection.query(
                    """
                    SELECT unplaced, recorded_at, source FROM offer_redemptions
                    WHERE bundle_id = \(candidate.bundleID) AND environment = \(candidate.environment) AND transaction_id = \(candidate.transactionID)
                    FOR UPDATE
                    """, logger: logger
                ).collect().first
                if let seen {
                    // Recorded before: only an unplaced one, now stated placed, changes.
                    let (unplaced, recordedAt, source) = try seen.decode((Int64, Int64, String).self)
                    guard unplaced != 0, candidate.isPlaced else { continue }
                    let issuance = try await matchingIssuance(candidate, connection, logger)
                    var placed = OfferRedemption(
                        candidate: candidate, issuanceSequence: issuance?.0, signatureIssuedAt: issuance.map { date($0.1) }, source: source,
                        recordedAt: date(recordedAt), placedAt: date(now))
                    let outcome: String
                    if issuance == nil && candidate.continuesRedemption {
                        outcome = "continues"
                        try await connection.run(
                            """
                            DELETE FROM offer_redemptions
                            WHERE bundle_id = \(candidate.bundleID) AND environment = \(candidate.environment) AND transaction_id = \(candidate.transactionID)
                            """, logger: logger)
                    } else {
                        outcome = placed.state.rawValue
                        try await connection.run(
                            """
                            UPDATE offer_redemptions SET unplaced = 0, placed_at = \(now), issuance_seq = \(issuance?.0), signature_issued_at = \(issuance?.1)
                            WHERE bundle_id = \(candidate.bundleID) AND environment = \(candidate.environment) AND transaction_id = \(candidate.transactionID)
                            """, logger: logger)
                    }
                    placed.source = update.source
                    _ = try await appendAudit(connection, logger, [AuditAppend(entry: placed.placementAuditEntry(outcome: outcome))], at: time)
                    redemptions.append(placed)
                    continue
                }
                // A pay-as-you-go renewal whose previous period is unknown never matches on its
                // estimate: the window would reach the lost first period's signature.
                let issuance = candidate.continuesRedemption && !candidate.isPlaced ? nil : try await matchingIssuance(candidate, connection, logger)
                let unplaced = issuance == nil && !candidate.isPlaced
                if issuance == nil && candidate.continuesRedemption && !unplaced { continue }
                // Inserted first: a transaction recorded before (or by another instance now) is skipped.
                let inserted = try await connection.query(
                    """
                    INSERT INTO offer_redemptions (bundle_id, environment, transaction_id, original_transaction_id, product_id, offer_id,
                        app_account_token, purchase_date, issuance_seq, signature_issued_at, source, recorded_at, unplaced)
                    VALUES (\(candidate.bundleID), \(candidate.environment), \(candidate.transactionID), \(candidate.originalTransactionID),
                        \(candidate.productID), \(candidate.offerID), \(candidate.appAccountToken), \(candidate.purchaseDate.unixMilliseconds),
                        \(issuance?.0), \(issuance?.1), \(update.source), \(now), \(Int64(unplaced ? 1 : 0)))
                    ON CONFLICT (bundle_id, environment, transaction_id) DO NOTHING RETURNING 1
                    """, logger: logger
                ).collect()
                guard !inserted.isEmpty else { continue }
                let redemption = OfferRedemption(
                    candidate: candidate, issuanceSequence: issuance?.0, signatureIssuedAt: issuance.map { date($0.1) }, source: update.source,
                    recordedAt: date(now), isUnplaced: unplaced)
                _ = try await appendAudit(connection, logger, [AuditAppend(entry: redemption.auditEntry)], at: time)
                redemptions.append(redemption)
            }
            return redemptions
        }
    }

    /// The issuance a candidate matches (audit sequence, issue time), see ``OfferRedemption``.
    private static func matchingIssuance(
        _ candidate: RedemptionCandidate, _ connection: PostgresConnection, _ logger: Logger
    ) async throws -> (Int64, Int64)? {
        let customer = candidate.matchingCustomerKey
        let from = candidate.signatureWindowStart.unixMilliseconds
        let until = candidate.purchaseDate.addingTimeInterval(RedemptionMatching.clockSkew).unixMilliseconds
        let row = try await connection.query(
            """
            SELECT s.audit_seq, s.issued_at FROM issued_signatures s
            WHERE s.bundle_id = \(candidate.bundleID) AND s.offer_id = \(candidate.offerID) AND s.product_id = \(candidate.productID)
              AND s.issued_at BETWEEN \(from) AND \(until)
              AND (s.app_account_token = \(customer) OR s.original_transaction_id = \(candidate.originalTransactionID))
              AND (s.environment IS NULL OR s.environment = \(candidate.environment) OR s.environment_declared = 1)
              AND NOT EXISTS (
                SELECT 1 FROM offer_redemptions r JOIN issued_signatures m
                  ON m.bundle_id = r.bundle_id AND m.offer_id = r.offer_id AND m.issued_at = r.signature_issued_at AND m.audit_seq = r.issuance_seq
                WHERE r.bundle_id = s.bundle_id AND r.offer_id = s.offer_id AND r.signature_issued_at = s.issued_at
                  AND (m.audit_seq = s.audit_seq
                    OR (ABS(m.audit_seq - s.audit_seq) = 1 AND m.format <> s.format AND m.client = s.client AND m.product_id = s.product_id
                      AND COALESCE(m.app_account_token, '') = COALESCE(s.app_account_token, '')
                      AND COALESCE(m.original_transaction_id, '') = COALESCE(s.original_transaction_id, '')
                      AND COALESCE(m.environment, '') = COALESCE(s.environment, ''))))
            ORDER BY CASE WHEN s.app_account_token = \(customer) THEN 0 ELSE 1 END,
              CASE WHEN s.environment = \(candidate.environment) THEN 0 WHEN s.environment IS NULL THEN 1 ELSE 2 END,
              s.issued_at DESC, s.audit_seq DESC
            LIMIT 1
            """, logger: logger
        ).collect().first
        return try row?.decode((Int64, Int64).self)
    }

    public func appleHistoryVersion(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistoryVersion? {
        // Read already, with the customer's lock (`CustomerDecisionLock`).
        if let version = try prefetchedRead("reading Apple's history", {
            $0.takeHistoryVersion(bundleID: bundleID, environment: environment, transactionID: transactionID)
        }) {
            return version
        }
        // One statement: the subscription of the transaction ID (or of the ID itself, when it is an
        // original transaction ID the store has no transaction for).
        let logger = self.logger
        let statement = HistoryVersionLookup(bundleID: bundleID, environment: environment, transactionID: transactionID)
        let rows = try await onLockConnection("reading Apple's history") { connection in
            try await Self.collect(statement, on: connection, logger: logger)
        }
        guard let (original, complete, updatedAt) = rows.first else { return nil }
        return StoredAppleHistoryVersion(
            subscription: AppleSubscriptionKey(bundleID: bundleID, environment: environment, originalTransactionID: original),
            isComplete: complete != 0, updatedAt: Self.date(updatedAt))
    }

    /// One statement, so one round trip and one snapshot: the subscription of `transactionID` (or
    /// of the ID itself, when it is an original transaction ID the store has no transaction
    /// for), its transactions and its renewal info, as they were when the statement began. Under
    /// the customer's lock it runs on the lock's connection (see ``LockConnectionLoan``), so it
    /// sees what the previous holder committed; otherwise on a pooled connection, outside a
    /// transaction (one statement needs none to be consistent).
    ///
    /// Rows come tagged by part (0 the subscription, 1 a transaction, 2 the renewal info) and
    /// are told apart by that tag, never by their order. Unnamed, so planned with its values on
    /// each call (a generic plan made on a small table can stay a sequential scan, see
    /// Docs/Performance.md).
    public func appleHistory(bundleID: String, environment: String, transactionID: String) async throws -> StoredAppleHistory? {
        let read = { @Sendable (connection: PostgresConnection, logger: Logger) async throws -> StoredAppleHistory? in
            var binds = PostgresBindings(capacity: 3)
            binds.append(bundleID)
            binds.append(environment)
            binds.append(transactionID)
            let rows = try await connection.query(PostgresQuery(unsafeSQL: Self.historyReadSQL, binds: binds), logger: logger).collect()
            var subscription: (original: String, complete: Int, updatedAt: Int64)?
            var transactions: [AppleSignedItem] = []
            var renewalInfos: [AppleSignedItem] = []
            for row in rows {
                let (part, original, complete, updatedAt, key, signed, decoded, jws) =
                    try row.decode((Int, String, Int?, Int64?, String?, Int64?, String?, String?).self)
                switch part {
                case 0:
                    guard let complete, let updatedAt else { throw StoreError(.unavailable, "reading Apple's history: a subscription row without its state") }
                    subscription = (original, complete, updatedAt)
                case 1:
                    guard let key, let decoded, let jws else { throw StoreError(.unavailable, "reading Apple's history: a transaction row without its content") }
                    transactions.append(AppleSignedItem(
                        bundleID: bundleID, environment: environment, key: key, originalTransactionID: original, signedDate: Self.optionalDate(signed),
                        decoded: decoded, jws: jws))
                default:
                    guard let decoded, let jws else { throw StoreError(.unavailable, "reading Apple's history: a renewal info row without its content") }
                    renewalInfos.append(AppleSignedItem(
                        bundleID: bundleID, environment: environment, key: original, originalTransactionID: original, signedDate: Self.optionalDate(signed),
                        decoded: decoded, jws: jws))
                }
            }
            guard let subscription else { return nil }
            return StoredAppleHistory(
                subscription: AppleSubscriptionKey(bundleID: bundleID, environment: environment, originalTransactionID: subscription.original),
                isComplete: subscription.complete != 0, updatedAt: Self.date(subscription.updatedAt), transactions: transactions, renewalInfos: renewalInfos)
        }
        let logger = self.logger
        if let loan = Self.lockConnectionLoan, loan.lender == ObjectIdentifier(self) {
            return try await onLockConnection("reading Apple's history") { connection in try await read(connection, logger) }
        }
        return try await boundedOnConnection("reading Apple's history") { connection in try await read(connection, logger) }
    }

    /// The statement of ``appleHistory(bundleID:environment:transactionID:)``; `$1` bundle ID, `$2`
    /// environment, `$3` transaction ID. The items are found by `= (SELECT … FROM subscription)`,
    /// not by a join: a join with the subscription is planned, on a table without statistics
    /// yet, as a scan of the whole bundle's rows with a filter; the scalar subquery is a value
    /// the index condition takes (`PostgresStoreTests` checks the plan).
    static let historyReadSQL = """
        WITH subscription AS (
            SELECT s.original_transaction_id, s.complete, s.updated_at FROM apple_subscriptions s
            WHERE s.bundle_id = $1 AND s.environment = $2 AND s.original_transaction_id = COALESCE(
                (SELECT t.original_transaction_id FROM apple_transactions t WHERE t.bundle_id = $1 AND t.environment = $2 AND t.transaction_id = $3), $3)
        )
        SELECT 0, s.original_transaction_id, s.complete, s.updated_at, NULL::text, NULL::bigint, NULL::text, NULL::text FROM subscription s
        UNION ALL
        SELECT 1, t.original_transaction_id, NULL::integer, NULL::bigint, t.transaction_id, t.signed_date, t.decoded, t.jws FROM apple_transactions t
        WHERE t.original_transaction_id = (SELECT original_transaction_id FROM subscription) AND t.bundle_id = $1 AND t.environment = $2
        UNION ALL
        SELECT 2, r.original_transaction_id, NULL::integer, NULL::bigint, NULL::text, r.signed_date, r.decoded, r.jws FROM apple_renewal_infos r
        WHERE r.original_transaction_id = (SELECT original_transaction_id FROM subscription) AND r.bundle_id = $1 AND r.environment = $2
        """

    /// The columns ``redemption(_:)`` reads.
    static let redemptionColumns = """
        bundle_id, environment, transaction_id, original_transaction_id, product_id, offer_id, app_account_token, purchase_date,
        issuance_seq, signature_issued_at, source, recorded_at, unplaced, placed_at
        """

    private static func redemption(_ row: PostgresRow) throws -> OfferRedemption {
        let c = try row.decode((String, String, String, String, String, String, String?, Int64, Int64?, Int64?, String, Int64, Int64, Int64?).self)
        return OfferRedemption(
            candidate: RedemptionCandidate(
                transactionID: c.2, originalTransactionID: c.3, bundleID: c.0, environment: c.1, productID: c.4, offerID: c.5, appAccountToken: c.6,
                purchaseDate: date(c.7)),
            issuanceSequence: c.8, signatureIssuedAt: optionalDate(c.9), source: c.10, recordedAt: date(c.11), isUnplaced: c.12 != 0,
            placedAt: optionalDate(c.13))
    }

    public func offerRedemptions(since: Date?) async throws -> [OfferRedemption] {
        try await rows(
            "reading redemptions",
            """
            SELECT \(unescaped: Self.redemptionColumns)
            FROM offer_redemptions WHERE purchase_date >= \(since?.unixMilliseconds ?? Int64.min) ORDER BY purchase_date, transaction_id
            """
        ).map(Self.redemption)
    }

    public func unplacedOfferRedemptions(limit: Int) async throws -> [OfferRedemption] {
        try await rows(
            "reading unplaced redemptions",
            """
            SELECT \(unescaped: Self.redemptionColumns)
            FROM offer_redemptions WHERE unplaced = 1 ORDER BY recorded_at, transaction_id LIMIT \(Int64(limit))
            """
        ).map(Self.redemption)
    }

    public func offerIssuances(since: Date?) async throws -> [OfferIssuanceCount] {
        try await rows(
            "counting issuances",
            """
            SELECT bundle_id, offer_id, COUNT(DISTINCT \(unescaped: AppleHistorySchema.issuanceKey)) FROM issued_signatures
            WHERE issued_at >= \(since?.unixMilliseconds ?? Int64.min) GROUP BY bundle_id, offer_id ORDER BY bundle_id, offer_id
            """
        ).map { row in
            let (bundleID, offerID, count) = try row.decode((String, String, Int64).self)
            return OfferIssuanceCount(bundleID: bundleID, offerID: offerID, issuances: count)
        }
    }
}

extension PostgresStore {
    public func appleNotificationReceivedAt(notificationUUID: String) async throws -> Date? {
        try await rows(
            "reading a notification", "SELECT received_at FROM apple_notifications WHERE notification_uuid = \(notificationUUID)"
        ).first.map { row in Date(timeIntervalSince1970: Double(try row.decode(Int64.self)) / 1000) }
    }

    public func notificationRecoveryWatermark(bundleID: String, environment: String) async throws -> Date? {
        try await rows(
            "reading the notification recovery watermark",
            "SELECT recovered_until FROM notification_recovery WHERE bundle_id = \(bundleID) AND environment = \(environment)"
        ).first.map { row in Date(timeIntervalSince1970: Double(try row.decode(Int64.self)) / 1000) }
    }

    public func notificationRecoveryLastRun(bundleID: String, environment: String) async throws -> Date? {
        try await rows(
            "reading the notification recovery watermark",
            "SELECT updated_at FROM notification_recovery WHERE bundle_id = \(bundleID) AND environment = \(environment)"
        ).first.map { row in Date(timeIntervalSince1970: Double(try row.decode(Int64.self)) / 1000) }
    }

    public func setNotificationRecoveryWatermark(bundleID: String, environment: String, recoveredUntil: Date, at time: Date) async throws {
        try await transaction("moving the notification recovery watermark") { connection, logger in
            _ = try await connection.query(
                """
                INSERT INTO notification_recovery (bundle_id, environment, recovered_until, updated_at)
                VALUES (\(bundleID), \(environment), \(recoveredUntil.unixMilliseconds), \(time.unixMilliseconds))
                ON CONFLICT (bundle_id, environment) DO UPDATE SET
                    recovered_until = GREATEST(notification_recovery.recovered_until, excluded.recovered_until), updated_at = excluded.updated_at
                """, logger: logger
            ).collect()
        }
    }
}

extension PostgresStore {
    /// From the roll-up (``IssuanceRollUp``); a first day that starts after midnight from the ledger.
    public func offerIssuancesPerDay(since: Date) async throws -> [OfferIssuanceDay] {
        let (firstDay, whole) = IssuanceRollUp.firstDay(of: since)
        let rows = try await rows(
            "counting issuances per day",
            """
            SELECT bundle_id, offer_id, day, SUM(issued)::int8 FROM offer_issuance_days WHERE day >= \(firstDay)
            GROUP BY bundle_id, offer_id, day ORDER BY bundle_id, offer_id, day
            """
        ).map { row in
            let (bundleID, offerID, day, count) = try row.decode((String, String, Int64, Int64).self)
            return OfferIssuanceDay(bundleID: bundleID, offerID: offerID, day: day, issuances: count)
        }
        var partial: [OfferIssuanceCount]?
        if !whole {
            partial = try await self.rows(
                "counting issuances of a partial day",
                """
                SELECT bundle_id, offer_id, COUNT(DISTINCT \(unescaped: AppleHistorySchema.issuanceKey)) FROM issued_signatures
                WHERE (bundle_id, offer_id) IN (SELECT DISTINCT bundle_id, offer_id FROM offer_issuance_days WHERE day = \(firstDay))
                    AND issued_at >= \(since.unixMilliseconds) AND issued_at < \((firstDay + 1) * DashboardSchema.dayMilliseconds)
                GROUP BY bundle_id, offer_id ORDER BY bundle_id, offer_id
                """
            ).map { row in
                let (bundleID, offerID, count) = try row.decode((String, String, Int64).self)
                return OfferIssuanceCount(bundleID: bundleID, offerID: offerID, issuances: count)
            }
        }
        return IssuanceRollUp.window(rows, firstDay: firstDay, partial: partial)
    }

    public func appleNotificationsPerDay(since: Date) async throws -> [AppleNotificationDay] {
        try await rows(
            "counting notifications per day",
            """
            SELECT bundle_id, environment, notification_type, received_at / \(unescaped: String(DashboardSchema.dayMilliseconds)) AS day, COUNT(*)
            FROM apple_notifications WHERE received_at >= \(since.unixMilliseconds) GROUP BY bundle_id, environment, notification_type, day
            ORDER BY bundle_id, environment, notification_type, day
            """
        ).map { row in
            let (bundleID, environment, type, day, count) = try row.decode((String, String, String, Int64, Int64).self)
            return AppleNotificationDay(bundleID: bundleID, environment: environment, notificationType: type, day: day, received: count)
        }
    }

    public func lastAppleNotificationReceived(bundleID: String, environment: String) async throws -> Date? {
        try await rows(
            "reading the last notification",
            "SELECT received_at FROM apple_notifications WHERE bundle_id = \(bundleID) AND environment = \(environment) ORDER BY received_at DESC LIMIT 1"
        ).first.map { row in Self.date(try row.decode(Int64.self)) }
    }

    /// From the roll-up's newest time per day (``IssuanceRollUp``): one primary-key range per client.
    public func lastIssuances(clients: [String], since: Date) async throws -> [String: Date] {
        var last: [String: Date] = [:]
        let firstDay = IssuanceRollUp.firstDay(of: since).day
        for client in clients {
            let found = try await rows(
                "reading a client's last issuance",
                "SELECT MAX(last_issued_at) FROM offer_issuance_days WHERE client = \(client) AND day >= \(firstDay)")
            if let time = try found.first?.decode(Int64?.self), time >= since.unixMilliseconds { last[client] = Self.date(time) }
        }
        return last
    }

    public func recordAuditVerification(_ record: AuditVerificationRecord) async throws {
        _ = try await rows(
            "recording an audit verification",
            "INSERT INTO meta (name, value) VALUES (\(AuditVerificationRecord.metaName), \(record.metaValue)) ON CONFLICT (name) DO UPDATE SET value = excluded.value")
    }

    public func lastAuditVerification() async throws -> AuditVerificationRecord? {
        try await rows("reading the last audit verification", "SELECT value FROM meta WHERE name = \(AuditVerificationRecord.metaName)")
            .first.flatMap { AuditVerificationRecord(metaValue: try $0.decode(String.self)) }
    }
}
