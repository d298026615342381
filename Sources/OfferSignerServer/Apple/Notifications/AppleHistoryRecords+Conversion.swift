import Crypto
import Foundation
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerStorage
import Synchronization
import X509

/// Converts between verified Apple data and what the store keeps of it.
///
/// Rule: only verified items are ever stored (a notification or an App Store Server API answer
/// whose every JWS verified); the JWS is stored beside the decoded form, and a history read back
/// for an eligibility decision is verified again from it (``DecodedHistoryCache``).
enum AppleHistoryConversion {
    private static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .millisecondsSince1970
        encoder.outputFormatting = .sortedKeys
        return encoder
    }()

    private static let decoder: JSONDecoder = {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .millisecondsSince1970
        return decoder
    }()

    /// `converted`: transactions encoded before (see ``ConvertedTransactionCache``).
    static func item(_ transaction: VerifiedTransaction, jws: String?, converted: ConvertedTransactionCache? = nil) -> AppleSignedItem? {
        let decoded: String
        if let cached = converted?.decoded(transaction, jws: jws) {
            decoded = cached
        } else {
            guard let fresh = encoded(transaction) else { return nil }
            converted?.remember(transaction, jws: jws, decoded: fresh)
            decoded = fresh
        }
        return AppleSignedItem(
            bundleID: transaction.bundleID, environment: transaction.environment.rawValue, key: transaction.transactionID,
            originalTransactionID: transaction.originalTransactionID, signedDate: transaction.signedDate, decoded: decoded,
            jws: jws ?? "")
    }

    /// The decoded form the store keeps of a transaction (the bytes of its strings as they are).
    static func encoded(_ transaction: VerifiedTransaction) -> String? {
        guard let decoded = try? encoder.encode(transaction) else { return nil }
        return String(decoding: decoded, as: UTF8.self)
    }

    static func item(_ renewalInfo: VerifiedRenewalInfo, bundleID: String, jws: String?) -> AppleSignedItem? {
        guard let original = renewalInfo.originalTransactionID, let decoded = try? encoder.encode(renewalInfo) else { return nil }
        return AppleSignedItem(
            bundleID: bundleID, environment: renewalInfo.environment.rawValue, key: original, originalTransactionID: original,
            signedDate: renewalInfo.signedDate, decoded: String(decoding: decoded, as: UTF8.self), jws: jws ?? "")
    }

    /// A redeemed promotional offer of ours (`offerType` 2 with an `offerIdentifier`), placed by
    /// the subscription's period before it. `known`: the subscription's other known transactions,
    /// in any order; `knownWhole`: they are all of them (a fetched history, or a notification of a
    /// recovered billing retry, `DID_RENEW` / `BILLING_RECOVERY`, on a subscription the store holds
    /// complete), so a gap before a renewal is a billing retry, not a period never heard of;
    /// `knownComplete`: the store holds the subscription complete (its first period is known).
    ///
    /// Rule:
    /// - A purchase (`transactionReason` `PURCHASE`: a first purchase, a resubscription, an upgrade
    ///   or crossgrade) was redeemed when it was bought: its signature dates from the 24 hours
    ///   before its `purchaseDate`.
    /// - A renewal (`RENEWAL`; without a reason, a period that began where the one before ended,
    ///   `VerifiedTransaction.follows(_:)`) is placed by the period before it, when that one is
    ///   known: it ended where this one began, or, with `knownWhole`, within Apple's longest
    ///   billing retry before:
    ///   - it continues that period's pay-as-you-go offer while the offer has billing periods left
    ///     (its `offerPeriod` counted in periods of the run's first period,
    ///     `VerifiedTransaction.payAsYouGoContinuations(_:)` over the subscription's known periods,
    ///     the walk the eligibility count uses): the same redemption going on, recorded only if a
    ///     signature of its own matches (``RedemptionCandidate/continuesRedemption``); the same
    ///     offer taken again for the renewal after its last period is a new redemption, placed as
    ///     the next case. When the run can end (Production, with a readable `offerPeriod`:
    ///     `VerifiedTransaction.payAsYouGoBillingPeriods(begunBy:)`) and its first period is not
    ///     known (the earliest held is a renewal with no known period before it, and the store
    ///     does not hold the subscription complete: `knownComplete`), periods of the run may be
    ///     missing and it may have ended before this renewal: not placed, its signature looked for
    ///     from 24 hours before the previous period began, recorded `unplaced` unless Apple's
    ///     history places it. When the run cannot end (outside Production, or no readable
    ///     `offerPeriod`: every renewal under the offer continues it), it is the run going on;
    ///   - otherwise the offer began at this renewal: it was redeemed during the previous period
    ///     (an offer on an active subscription starts at its next renewal), so its signature may
    ///     date from 24 hours before that period began.
    /// - A renewal whose previous period is not known (a notification lost or not arrived yet) is
    ///   not placed (``RedemptionCandidate/isPlaced`` false): that period is estimated to be as
    ///   long as this one, or to begin no later than a known period that ended within a billing
    ///   retry before, and the signature looked for from 24 hours before it began; a pay-as-you-go
    ///   period may continue a redemption whose start was in the missing period. When no signature
    ///   matches the estimate the redemption is recorded `unplaced`, and a history fetched from
    ///   Apple places it (`RedemptionPlacer`).
    ///
    /// Why an estimate cannot decide: the transaction under the offer states the offer's own
    /// terms, not the product's period. Apple's `offerPeriod` is "the duration of the offer"
    /// (ISO 8601, e.g. `P1W`; https://developer.apple.com/documentation/appstoreserverapi/offerperiod)
    /// and `offerDiscountType` "the payment mode you configure for the offer" (`FREE_TRIAL`,
    /// `PAY_AS_YOU_GO`, `PAY_UP_FRONT`; https://developer.apple.com/documentation/appstoreserverapi/offerdiscounttype;
    /// appstoreserverlibrary/models/JWSTransactionDecodedPayload.py), so a one-week free offer on
    /// an annual product has a period (`expiresDate` − `purchaseDate`) of a week while the period
    /// it was redeemed in lasted a year. A promotional offer redeemed on an active subscription
    /// applies "at the next renewal period" (https://developer.apple.com/documentation/storekit/product/subscriptioninfo/renewalinfo/offer;
    /// https://developer.apple.com/documentation/storekit/implementing-promotional-offers-in-your-app).
    /// Apple's transaction carries no field for the product's own duration: Apple is silent on
    /// how long the unknown period was, so only the subscription's history tells.
    static func redemption(
        _ transaction: VerifiedTransaction, known: [VerifiedTransaction] = [], knownWhole: Bool = false, knownComplete: Bool = false
    ) -> RedemptionCandidate? {
        guard transaction.offerType == .promotional, let offerID = transaction.offerIdentifier, !offerID.isEmpty else { return nil }
        let token = transaction.appAccountToken.flatMap { $0.isEmpty ? nil : $0.lowercased() }
        var candidate = RedemptionCandidate(
            transactionID: transaction.transactionID, originalTransactionID: transaction.originalTransactionID, bundleID: transaction.bundleID,
            environment: transaction.environment.rawValue, productID: transaction.productID, offerID: offerID, appAccountToken: token,
            purchaseDate: transaction.purchaseDate)
        let previous = known
            .filter {
                $0.originalTransactionID == transaction.originalTransactionID && $0.transactionID != transaction.transactionID
                    && $0.purchaseDate < transaction.purchaseDate
            }
            .max { ($0.purchaseDate, $0.transactionID) < ($1.purchaseDate, $1.transactionID) }
        let isRenewal = transaction.transactionReason.map { $0 == .renewal } ?? (previous.map(transaction.follows) ?? false)
        guard isRenewal else { return candidate }
        let placing = previous.flatMap { previous in
            transaction.follows(previous) || (knownWhole && transaction.followsAfterBillingRetry(previous)) ? previous : nil
        }
        let earliest: Date
        if let placing {
            let chain = known.filter {
                $0.originalTransactionID == transaction.originalTransactionID && $0.purchaseDate <= placing.purchaseDate && $0.transactionID != transaction.transactionID
            }
            if let first = VerifiedTransaction.payAsYouGoContinuations(chain + [transaction])[transaction.transactionID] {
                candidate.continuesRedemption = true
                // The run's first period held is a renewal whose period before is not known (the
                // store heard the subscription from the middle): the run may have begun earlier
                // and ended before this renewal, which would then be the offer taken again. Not
                // placed: recorded unplaced unless placed later by Apple's history. Only when the
                // run can end at all (Production, readable offerPeriod); otherwise every renewal
                // under the offer continues it, known first period or not.
                let runCanEnd = transaction.payAsYouGoBillingPeriods(begunBy: first) != nil
                let firstIsKnown =
                    knownWhole || knownComplete || first.transactionReason != .renewal
                    || chain.contains { $0.transactionID != first.transactionID && first.follows($0) }
                if firstIsKnown || !runCanEnd { return candidate }
                candidate.isPlaced = false
            }
            earliest = placing.purchaseDate
        } else {
            let length = transaction.expiresDate.map { max(0, $0.timeIntervalSince(transaction.purchaseDate)) } ?? 0
            var guess = transaction.purchaseDate.addingTimeInterval(-length)
            // A known period that ended within a billing retry before: the offer was redeemed
            // during it (a retry) or during a lost period after it, so no earlier than its start.
            if let previous, transaction.followsAfterBillingRetry(previous) { guess = min(guess, previous.purchaseDate) }
            earliest = guess
            candidate.continuesRedemption = transaction.offerDiscountType == .payAsYouGo
            candidate.isPlaced = false
        }
        candidate.signatureWindowStart = min(candidate.signatureWindowStart, earliest.addingTimeInterval(-RedemptionMatching.signatureLifetime))
        return candidate
    }

    /// What a verified notification adds. A first purchase (`SUBSCRIBED` / `INITIAL_BUY`) starts a
    /// complete history of its subscription. `known`: the subscription's transactions already
    /// stored, which place a promotional offer's period (see `redemption(_:known:knownWhole:)`);
    /// `knownIsComplete`: the store holds that subscription complete.
    static func update(
        _ notification: VerifiedNotification, receivedAt: Date, known: [VerifiedTransaction] = [], knownIsComplete: Bool = false
    ) -> AppleHistoryUpdate {
        // A recovered billing retry, when the store holds the subscription whole: the gap before
        // this renewal is the retry, not a period never heard of.
        let billingRecovery = knownIsComplete && notification.notificationType == "DID_RENEW" && notification.subtype == "BILLING_RECOVERY"
        let original = notification.transaction?.value.originalTransactionID ?? notification.renewalInfo?.value.originalTransactionID
        var update = AppleHistoryUpdate(
            notification: AppleNotificationReceipt(
                notificationUUID: notification.notificationUUID, bundleID: notification.bundleID, environment: notification.environment.rawValue,
                notificationType: notification.notificationType, subtype: notification.subtype, originalTransactionID: original,
                signedDate: notification.signedDate, receivedAt: receivedAt),
            source: "notification")
        if let signed = notification.transaction, let item = item(signed.value, jws: signed.jws) {
            update.transactions.append(item)
            if let candidate = redemption(signed.value, known: known, knownWhole: billingRecovery, knownComplete: knownIsComplete) {
                update.redemptions.append(candidate)
            }
        }
        if let signed = notification.renewalInfo, let item = item(signed.value, bundleID: notification.bundleID, jws: signed.jws) {
            update.renewalInfos.append(item)
        }
        if let original {
            let key = AppleSubscriptionKey(bundleID: notification.bundleID, environment: notification.environment.rawValue, originalTransactionID: original)
            update.subscriptions.append(key)
            if notification.notificationType == "SUBSCRIBED" && notification.subtype == "INITIAL_BUY" { update.completeSubscriptions.append(key) }
        }
        return update
    }

    /// What a history fetched from the App Store Server API adds: it is the customer's whole
    /// history, so every subscription in it is complete; a filtered answer (`VerifiedHistory.isFiltered`,
    /// `HistoryFilter`) is stored too, and marks complete only the subscriptions of the groups it
    /// holds whole (`VerifiedHistory.wholeSubscriptionIDs`: a filter on `AUTO_RENEWABLE` and a
    /// `subscriptionGroupIdentifier` returns every transaction of that group's subscriptions,
    /// see `HistoryFilter.wholeSubscriptionGroups`), never those of other groups or other
    /// product types. The whole subscriptions' redemptions are placed with `knownWhole`.
    /// `converted`: transactions encoded before, for a history fetched again (the same update).
    static func update(_ history: VerifiedHistory, converted: ConvertedTransactionCache? = nil) -> AppleHistoryUpdate {
        var update = AppleHistoryUpdate(source: "history")
        let transactions = history.transactions
        let whole = history.wholeSubscriptionIDs
        for transaction in transactions {
            if let item = item(transaction, jws: history.jws(ofTransaction: transaction.transactionID), converted: converted) {
                update.transactions.append(item)
            }
            if let candidate = redemption(transaction, known: transactions, knownWhole: whole.contains(transaction.originalTransactionID)) {
                update.redemptions.append(candidate)
            }
        }
        for info in history.renewalInfos {
            if let original = info.originalTransactionID, let item = item(info, bundleID: history.bundleID, jws: history.jws(ofRenewalInfo: original)) {
                update.renewalInfos.append(item)
            }
        }
        let key = { (original: String) in
            AppleSubscriptionKey(bundleID: history.bundleID, environment: history.environment.rawValue, originalTransactionID: original)
        }
        update.subscriptions = history.originalTransactionIDs.sorted().map(key)
        update.completeSubscriptions = whole.sorted().map(key)
        return update
    }

    /// A stored history as verified history (nil when an item cannot be read back).
    static func history(_ stored: StoredAppleHistory) -> VerifiedHistory? {
        guard let environment = AppleEnvironment(rawValue: stored.subscription.environment) else { return nil }
        var history = VerifiedHistory(bundleID: stored.subscription.bundleID, environment: environment, asOf: stored.updatedAt)
        for item in stored.transactions {
            guard let transaction = try? decoder.decode(VerifiedTransaction.self, from: Data(item.decoded.utf8)) else { return nil }
            history.record(transaction, jws: item.jws)
        }
        for item in stored.renewalInfos {
            guard let info = try? decoder.decode(VerifiedRenewalInfo.self, from: Data(item.decoded.utf8)) else { return nil }
            history.record(info, jws: item.jws)
        }
        return history
    }
}

/// Whether a stored history can still be trusted to be current, or a notification may have been
/// lost or delayed. Apple retries a failed Production notification "five times, at 1, 12, 24, 48,
/// and 72 hours after the previous attempt" and sends a Sandbox one once
/// (https://developer.apple.com/documentation/appstoreservernotifications/responding-to-app-store-server-notifications):
/// a renewal's notification may arrive days late, so this rule does not wait for Apple's
/// retries; it asks Apple's API as soon as the allowance after a period's end has passed unheard.
///
/// Rule: once the latest period of the subscription has ended (its latest `expiresDate`, plus
/// `renewalAllowance` for the renewal's notification to arrive), the store must have heard of
/// the subscription at or after that end: a renewal, an `EXPIRED`, a `DID_FAIL_TO_RENEW`, any
/// write of it. Otherwise a renewal or the expiry went unheard, and Apple's API is asked instead
/// (its answer is then stored). What this cannot catch: a lost notification about an event with no
/// set time (a refund, a revocation).
enum StoredHistoryFreshness {
    static let renewalAllowance: TimeInterval = 3600

    static func isCurrent(_ history: VerifiedHistory, updatedAt: Date, now: Date) -> Bool {
        guard let latestEnd = history.transactions.compactMap(\.expiresDate).max() else { return true }
        if now < latestEnd.addingTimeInterval(renewalAllowance) { return true }
        return updatedAt >= latestEnd
    }
}

/// Stored histories already decoded, so a subscription asked about again is neither read whole
/// nor decoded again.
///
/// Rules: an entry is used only while the store reports the history at the very version
/// (`updatedAt`) it was decoded from; every write of a history moves that on (see
/// ``OfferSignerStore/appleHistoryVersion(bundleID:environment:transactionID:)``). At most
/// `capacity` subscriptions are kept (when full, the cache starts over).
///
/// What is decided on comes from the stored JWS, verified again, never from the `decoded`
/// column (which anyone who can write the database could edit): each item's JWS must verify
/// (chain to a trusted root, Apple's marker OIDs, ES256, the subscription's bundle and
/// environment) and name the transaction (or, for a renewal info, the subscription) its row is
/// stored under; otherwise the whole history is refused (nil: the caller asks Apple or the app's
/// evidence instead), and the refusal is counted. A JWS verified once, for the same bundle,
/// environment and roots, is not verified again (``AppleVerifiedItemCache``, at most
/// `verifiedCapacity` items, the same mechanism as the App Store Server API client's); the hot
/// path, a history at an unchanged version, costs no verification at all.
final class DecodedHistoryCache: Sendable {
    private struct Entry {
        var updatedAt: Date
        var history: VerifiedHistory
    }

    private let entries = Mutex<[AppleSubscriptionKey: Entry]>([:])
    /// Bundle and transaction IDs a current history was found for (at most `capacity`), a hint
    /// only: see `EligibilityService.historyReadWithLock`.
    private let decidedTransactions = Mutex<Set<String>>([])
    private let verified: AppleVerifiedItemCache
    private let refusals = Mutex(0)
    private let capacity: Int

    init(capacity: Int = 20_000, verifiedCapacity: Int = 200_000) {
        self.capacity = max(1, capacity)
        self.verified = AppleVerifiedItemCache(capacity: verifiedCapacity)
    }

    /// Stored histories refused because an item's JWS did not verify or did not match its row.
    var refusedHistories: Int { refusals.withLock { $0 } }

    /// The history decoded before at exactly `version`.
    func history(at version: StoredAppleHistoryVersion) -> VerifiedHistory? {
        entries.withLock { entries in
            guard let entry = entries[version.subscription], entry.updatedAt == version.updatedAt else { return nil }
            return entry.history
        }
    }

    /// The history decoded last for `subscription`, with the version (`updatedAt`) it was decoded
    /// at (the store's may have moved since): a hint only, to be confirmed with ``history(at:)``.
    func latest(_ subscription: AppleSubscriptionKey) -> (history: VerifiedHistory, updatedAt: Date)? {
        entries.withLock { entries in entries[subscription].map { ($0.history, $0.updatedAt) } }
    }

    /// A current history of `transactionID` was decided on.
    func noteDecided(bundleID: String, transactionID: String) {
        let key = bundleID + "\n" + transactionID
        decidedTransactions.withLock { decided in
            if decided.count >= capacity, !decided.contains(key) { decided.removeAll(keepingCapacity: true) }
            decided.insert(key)
        }
    }

    /// Whether a current history of `transactionID` was decided on before (it may have moved since).
    func decidedBefore(bundleID: String, transactionID: String) -> Bool {
        let key = bundleID + "\n" + transactionID
        return decidedTransactions.withLock { $0.contains(key) }
    }

    /// Verifies a history read whole (nil when an item's JWS does not verify or does not match
    /// its row) and keeps it for its version.
    func remember(_ stored: StoredAppleHistory, trustedRoots: [Certificate], chainCache: AppleChainValidationCache, now: Date) async -> VerifiedHistory? {
        guard let history = await verifiedHistory(stored, trustedRoots: trustedRoots, chainCache: chainCache, now: now) else {
            refusals.withLock { $0 += 1 }
            return nil
        }
        entries.withLock { entries in
            if entries.count >= capacity { entries.removeAll(keepingCapacity: true) }
            entries[stored.subscription] = Entry(updatedAt: stored.updatedAt, history: history)
        }
        return history
    }

    private func verifiedHistory(_ stored: StoredAppleHistory, trustedRoots: [Certificate], chainCache: AppleChainValidationCache, now: Date) async -> VerifiedHistory? {
        guard let environment = AppleEnvironment(rawValue: stored.subscription.environment) else { return nil }
        let verifier = AppleSignedDataVerifier(
            trustedRoots: trustedRoots, bundleID: stored.subscription.bundleID, environment: environment, chainCache: chainCache, verifiedItems: verified)
        var history = VerifiedHistory(bundleID: stored.subscription.bundleID, environment: environment, asOf: stored.updatedAt)
        for item in stored.transactions {
            guard case .transaction(let transaction)? = await verify(item.jws, renewalInfo: false, verifier: verifier, now: now),
                transaction.transactionID == item.key, transaction.originalTransactionID == item.originalTransactionID
            else { return nil }
            history.record(transaction, jws: item.jws)
        }
        for item in stored.renewalInfos {
            guard case .renewalInfo(let info)? = await verify(item.jws, renewalInfo: true, verifier: verifier, now: now), info.originalTransactionID == item.key
            else { return nil }
            history.record(info, jws: item.jws)
        }
        return history
    }

    /// What `jws` verifies to (from `verified` when it verified before in the verifier's scope).
    private func verify(_ jws: String, renewalInfo: Bool, verifier: AppleSignedDataVerifier, now: Date) async -> AppleVerifiedItemCache.Item? {
        if renewalInfo {
            guard case .success(let info) = await verifier.verifyRenewalInfo(jws, now: now) else { return nil }
            return .renewalInfo(info)
        }
        guard case .success(let transaction) = await verifier.verifyTransaction(jws, now: now) else { return nil }
        return .transaction(transaction)
    }
}
