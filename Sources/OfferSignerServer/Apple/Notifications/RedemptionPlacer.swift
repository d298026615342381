import AppStoreServerAPI
import Foundation
import Logging
import OfferSignerEligibility
import OfferSignerStorage
import ServiceLifecycle
import Synchronization

/// Places redemptions recorded `unplaced` (a renewal-time offer whose previous period the store
/// has not heard of, see ``OfferRedemption``) by asking Apple's Get Transaction History for the
/// subscription, in the background, and storing the answer: the store then matches the
/// redemption again with the period Apple states.
///
/// Why: the transaction under the offer does not tell how long the period before it was (a
/// one-week free offer on an annual product lasts a week; the year it was redeemed in is only in
/// the history), and an estimate that finds no signature proves nothing about a leaked key.
/// Apple: a promotional offer redeemed on an active subscription applies "at the next renewal
/// period" (https://developer.apple.com/documentation/storekit/product/subscriptioninfo/renewalinfo/offer),
/// the transaction's `offerPeriod` is the offer's duration, not the product's
/// (https://developer.apple.com/documentation/appstoreserverapi/offerperiod), and Get Transaction
/// History returns the subscription's transactions
/// (https://developer.apple.com/documentation/appstoreserverapi/get-transaction-history; Apple's
/// Python library `api_client.py` `get_transaction_history`).
///
/// Rules:
/// - A redemption recorded unplaced (by a notification) is handed over (``submit(_:)``, never
///   waits); one subscription (bundle, environment, original transaction) is asked about at a
///   time, each at most once while it waits; at most `capacity` wait (more are left to the sweep:
///   they are in the store).
/// - A subscription is asked about only when it can be: its app (the catalog's entry, else the
///   default settings) accepts its environment and has usable credentials (a key with an issuer
///   ID). One that cannot is not asked, counts nothing, holds no place in `sweepLimit`, and is
///   moved a day on (``RedemptionPlacementSchedule/unaskableRetry``), so rows a database writer
///   made up for a served app in an environment it does not accept cannot fill the sweep.
/// - An ask Apple answered about the customer's transaction (the history; 4040010, 4040001 or
///   4000006; an ID that cannot be put in a request path; see ``answer(_:)``) is an attempt for
///   each of the subscription's redemptions still unplaced and due after it, which backs off
///   exponentially and stops at a cap (``RedemptionPlacementSchedule``: from `retryInterval`,
///   doubling, at most a day apart; 10 attempts). Any other outcome (open breaker, rate limited,
///   overloaded, network, 5xx, 401, another 4xx such as a wrong bundle or base URL, the history
///   not stored) counts nothing and only moves the next ask the same step later. A redemption not
///   answered 30 days after it was recorded (``RedemptionPlacementSchedule/maximumAge``) is given
///   up all the same. Each attempt is recorded at the time it ended (`clock`), and only on rows
///   still due then, so two instances sweeping at once count one attempt.
/// - Every `retryInterval`, and once at start, a sweep pages through the store's unplaced
///   redemptions that are due (fewest attempts first, then oldest due; `sweepPageSize` rows a
///   page) and asks about each one's subscription once, at most `sweepLimit` subscriptions a sweep
///   (the rest are due at the next sweep); redemptions from notifications handed over meanwhile
///   are asked about between pages. Rows that were asked about before (rows that cannot be placed,
///   rows a database writer made up) come after every row never asked about.
/// - Values from the store's rows never reach a label or Apple unchecked: a row whose bundle this
///   server does not serve (its keys' bundles and the catalog's apps) or whose environment is not
///   one of Apple's (``AppleEnvironment``) is skipped: not asked about, not counted, not held
///   against `sweepLimit`; one warning a sweep tells how many. Labels are the served bundle and
///   Apple's environment name; a row's own values are logged cut short and with control
///   characters escaped (``loggable(_:limit:)``).
/// - A redemption past the cap (or the maximum age) is no longer asked about: it stays unplaced, reported as such,
///   logged and counted once (`offer_signer_redemption_placements_given_up_total`); a later
///   notification or lookup that states its history still places it. None is ever dropped or
///   guessed to be unmatched.
/// - Apple is asked through the server's one App Store Server API client, so its breaker, its
///   per-app `Retry-After`, its retries and its bound on lookups at once apply, with a budget of
///   `budget` (a background job may give Apple longer than a request's 2 s); only the
///   redemption's environment is asked.
/// - A history Apple answers is stored whole (`AppleHistoryConversion.update(_:)`), as the
///   eligibility lookups store theirs.
final class RedemptionPlacer: Service, Sendable {
    private let store: any OfferSignerStore
    private let client: AppStoreServerAPIClient
    private let catalog: OfferCatalog?
    private let servedBundles: @Sendable () -> Set<String>
    private let clock: @Sendable () -> Date
    private let credentials: @Sendable (String) -> AppStoreServerAPICredentials?
    private let metrics: ServerMetrics
    private let logger: Logger
    private let retryInterval: Duration
    private let budget: Duration
    private let capacity: Int
    private let sweepLimit: Int
    private let sweepPageSize: Int
    private let schedule: RedemptionPlacementSchedule
    private let pending = Mutex<[AppleSubscriptionKey]>([])
    private let sweepDue = Mutex(true)
    private let wakeUps: AsyncStream<Void>
    private let wakeUp: AsyncStream<Void>.Continuation

    init(
        store: any OfferSignerStore, client: AppStoreServerAPIClient, catalog: OfferCatalog?, servedBundles: @escaping @Sendable () -> Set<String>,
        credentials: @escaping @Sendable (String) -> AppStoreServerAPICredentials?, metrics: ServerMetrics, logger: Logger,
        retryInterval: Duration, budget: Duration = .seconds(30), capacity: Int = 1024, sweepLimit: Int = 2000, sweepPageSize: Int = 500,
        clock: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.store = store
        self.client = client
        self.catalog = catalog
        self.servedBundles = servedBundles
        self.clock = clock
        self.credentials = credentials
        self.metrics = metrics
        self.logger = logger
        self.retryInterval = retryInterval
        self.budget = budget
        self.capacity = max(1, capacity)
        self.sweepLimit = max(1, sweepLimit)
        self.sweepPageSize = max(1, sweepPageSize)
        let components = retryInterval.components
        self.schedule = RedemptionPlacementSchedule(firstRetry: Double(components.seconds) + Double(components.attoseconds) / 1e18)
        (wakeUps, wakeUp) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// Hands over a redemption recorded unplaced (never waits; others are ignored).
    func submit(_ redemption: OfferRedemption) {
        guard redemption.state == .unplaced else { return }
        let candidate = redemption.candidate
        let key = AppleSubscriptionKey(bundleID: candidate.bundleID, environment: candidate.environment, originalTransactionID: candidate.originalTransactionID)
        let added = pending.withLock { pending -> Bool in
            guard pending.count < capacity, !pending.contains(key) else { return false }
            pending.append(key)
            return true
        }
        if added { wakeUp.yield() }
    }

    func run() async throws {
        wakeUp.yield()
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    while !Task.isCancelled {
                        do { try await Task.sleep(for: self.retryInterval) } catch { return }
                        self.sweepDue.withLock { $0 = true }
                        self.wakeUp.yield()
                    }
                }
                for await _ in self.wakeUps {
                    if self.sweepDue.withLock({ due in defer { due = false }; return due }) { await self.sweep() }
                    await self.placePending()
                    if Task.isCancelled { break }
                }
                group.cancelAll()
            }
        }
    }

    /// Asks about the subscriptions handed over, one at a time.
    private func placePending() async {
        while !Task.isCancelled, let key = pending.withLock({ $0.first }) {
            await attempt(key)
            pending.withLock { pending in pending.removeAll { $0 == key } }
        }
    }

    /// Pages through the unplaced redemptions due now (`clock`), fewest attempts first, then oldest
    /// due, and asks about each one's subscription once (at most `sweepLimit` subscriptions);
    /// returns how many were asked about (skipped rows and subscriptions that cannot be asked are
    /// not: those are moved a day on without a place in `sweepLimit`).
    @discardableResult
    func sweep() async -> Int {
        let now = clock()
        var cursor = UnplacedRedemptionCursor.start
        var asked = Set<AppleSubscriptionKey>()
        var notAskable = Set<AppleSubscriptionKey>()
        var skipped = 0
        var firstSkipped: RedemptionCandidate?
        var firstNotAskable: (key: AppleSubscriptionKey, reason: String)?
        defer {
            if let firstSkipped {
                logger.warning(
                    "unplaced redemptions skipped: their app is not served (no longer configured?) or their environment is not Apple's (rows written behind the service's back?)",
                    metadata: [
                        "rows": "\(skipped)", "first_bundle_id": "\(Self.loggable(firstSkipped.bundleID, limit: 100))",
                        "first_environment": "\(Self.loggable(firstSkipped.environment, limit: 20))",
                        "first_transaction_id": "\(Self.loggable(firstSkipped.transactionID, limit: 40))",
                    ])
            }
            if let firstNotAskable {
                logger.warning(
                    "unplaced redemptions not asked about: their app does not accept their environment or has no usable credentials; looked at again in a day, given up 30 days after they were recorded",
                    metadata: [
                        "subscriptions": "\(notAskable.count)", "first_bundle_id": "\(firstNotAskable.key.bundleID)",
                        "first_environment": "\(firstNotAskable.key.environment)",
                        "first_original_transaction_id": "\(Self.loggable(firstNotAskable.key.originalTransactionID, limit: 40))",
                        "first_reason": "\(firstNotAskable.reason)",
                    ])
            }
        }
        do {
            while !Task.isCancelled {
                let page = try await store.dueUnplacedOfferRedemptions(at: now, after: cursor, limit: sweepPageSize)
                for row in page {
                    let candidate = row.redemption.candidate
                    guard let key = servedKey(bundleID: candidate.bundleID, environment: candidate.environment, originalTransactionID: candidate.originalTransactionID)
                    else {
                        skipped += 1
                        if firstSkipped == nil { firstSkipped = candidate }
                        continue
                    }
                    guard !asked.contains(key), !notAskable.contains(key), !Task.isCancelled else { continue }
                    if let reason = notAskableReason(key) {
                        notAskable.insert(key)
                        if firstNotAskable == nil { firstNotAskable = (key, reason) }
                        await attempt(key)
                        continue
                    }
                    guard asked.count < sweepLimit else { return asked.count }
                    asked.insert(key)
                    await attempt(key)
                }
                guard page.count == sweepPageSize, let last = page.last else { break }
                cursor = last.cursor
                await placePending()
            }
        } catch {
            logger.warning("could not read unplaced redemptions; the next sweep reads them again", metadata: ["error": "\(error)"])
        }
        return asked.count
    }

    /// Why a subscription (of a served bundle, in Apple's environment) cannot be asked about
    /// (`environment_not_accepted`: its app's catalog entry, or the default settings, does not
    /// accept the environment; `no_credentials`: no key with an issuer ID for the bundle, as the
    /// client requires), or nil when it can.
    private func notAskableReason(_ key: AppleSubscriptionKey) -> String? {
        guard let environment = AppleEnvironment(rawValue: key.environment),
            (catalog?.appSettings(bundleID: key.bundleID) ?? AppStoreAppSettings(bundleID: key.bundleID)).environments.contains(environment)
        else { return "environment_not_accepted" }
        guard let credentials = credentials(key.bundleID), credentials.bundleID == key.bundleID, !credentials.issuerID.isEmpty else { return "no_credentials" }
        return nil
    }

    /// `value` cut to `limit` Unicode scalars, with backslashes, control characters (newline, ESC,
    /// …), format characters (bidirectional overrides) and line/paragraph separators escaped as
    /// `\u{…}`, so a value from a row a database writer made cannot forge or hide log lines.
    static func loggable(_ value: String, limit: Int) -> String {
        var escaped = ""
        for scalar in value.unicodeScalars.prefix(limit) {
            switch scalar.properties.generalCategory {
            case .control, .format, .lineSeparator, .paragraphSeparator:
                escaped += "\\u{" + String(scalar.value, radix: 16) + "}"
            default:
                if scalar == "\\" { escaped += "\\\\" } else { escaped.unicodeScalars.append(scalar) }
            }
        }
        return escaped
    }

    /// The subscription's key when its bundle is served (equal to one of the configured bundles, so
    /// a bounded label value) and its environment is Apple's (by Apple's name); else nil.
    private func servedKey(bundleID: String, environment: String, originalTransactionID: String) -> AppleSubscriptionKey? {
        guard let environment = AppleEnvironment(rawValue: environment), servedBundles().contains(bundleID) || catalog?.apps[bundleID] != nil else {
            return nil
        }
        return AppleSubscriptionKey(bundleID: bundleID, environment: environment.rawValue, originalTransactionID: originalTransactionID)
    }

    /// Asks about one subscription (``place(_:)``) when it can be asked (else only moves it a day
    /// on), then records the attempt, at the time it ended, for its redemptions still unplaced and
    /// due: counted when Apple answered, else only moved later; those given up (the cap, or the
    /// maximum age) are logged and counted. A subscription of a bundle not served or an
    /// environment not Apple's is not asked about nor recorded.
    func attempt(_ key: AppleSubscriptionKey) async {
        guard let key = servedKey(bundleID: key.bundleID, environment: key.environment, originalTransactionID: key.originalTransactionID) else { return }
        let outcome: RedemptionPlacementOutcome
        if let reason = notAskableReason(key) {
            metrics.redemptionPlacementLookup(outcome: reason)
            outcome = .notAskable
        } else {
            outcome = await place(key) == .answered ? .answered : .notAnswered
        }
        do {
            let givenUp = try await store.recordRedemptionPlacementAttempt(key, at: clock(), outcome: outcome, schedule: schedule)
            for redemption in givenUp {
                metrics.redemptionPlacementGivenUp(bundleID: key.bundleID, environment: key.environment)
                logger.warning(
                    outcome == .answered
                        ? "an unplaced redemption is no longer asked about (attempt cap reached); it stays unplaced"
                        : "an unplaced redemption is no longer asked about (30 days since it was recorded without an answer from Apple); it stays unplaced",
                    metadata: [
                        "bundle_id": "\(key.bundleID)", "environment": "\(key.environment)",
                        "offer_id": "\(Self.loggable(redemption.candidate.offerID, limit: 100))",
                        "transaction_id": "\(Self.loggable(redemption.candidate.transactionID, limit: 40))",
                    ])
            }
        } catch {
            logger.warning("could not record a redemption placement attempt; it is asked about again", metadata: ["error": "\(error)"])
        }
    }

    /// Whether Apple answered an ask (which counts as an attempt) or not (which does not).
    enum PlacementAnswer: Sendable, Equatable {
        /// Apple returned the history (stored), or made a statement about the customer's
        /// transaction (see ``RedemptionPlacer/answer(_:)``): asking again the same way is
        /// unlikely to change it.
        case answered
        /// A transient failure, or one that says more about this service's configuration than
        /// about the customer (see ``RedemptionPlacementSchedule``).
        case notAnswered
    }


    /// Whether a lookup's failure is Apple's answer about the customer's transaction (see
    /// ``PlacementAnswer``).
    ///
    /// Apple's error-codes page (https://developer.apple.com/documentation/appstoreserverapi/error-codes)
    /// is only a list: it states no rule on which errors are final. Retry advice is only in names
    /// and descriptions (4040002, 4040004, 4040006 "…NotFoundRetryable", 5000001
    /// GeneralInternalRetryableError "…but you can try again"). So only Apple's statements about
    /// the customer count: 4040010 in every accepted environment (``HistoryUnavailable/Reason/transactionNotFound``),
    /// 4040001 and 4000006 (``HistoryUnavailable/transactionErrorCodes``, sent as ``HistoryUnavailable/Reason/rejected``
    /// with Apple's code). Every other outcome is not an answer: another 4xx (4040003
    /// AppNotFoundError, 4000002 InvalidAppIdentifierError, a 403, a 404 without Apple's error
    /// body: a wrong bundle or base URL), 401, `wrong_app`, `unverifiable` say more about this
    /// service's configuration than about the customer, and the rest are transient. (Within one ask
    /// the client itself tries again, inside the budget, on 429, network errors, 5xx other than 500
    /// with 5000000 GeneralInternalError, and the retryable 404s; 401, 5000000 and every other 4xx
    /// end the ask at once. Whatever is left at the end is not an answer here.)
    static func answer(_ unavailable: HistoryUnavailable) -> PlacementAnswer {
        unavailable.isAppleAnswerAboutTransaction ? .answered : .notAnswered
    }

    /// Asks Apple for one subscription's history and stores it; returns whether Apple answered.
    @discardableResult
    func place(_ key: AppleSubscriptionKey) async -> PlacementAnswer {
        guard let environment = AppleEnvironment(rawValue: key.environment) else { return .notAnswered }
        var app = catalog?.appSettings(bundleID: key.bundleID) ?? AppStoreAppSettings(bundleID: key.bundleID)
        guard app.environments.contains(environment) else {
            metrics.redemptionPlacementLookup(outcome: "environment_not_accepted")
            return .notAnswered
        }
        app.environments = [environment]
        // An ID that cannot be put in a request path: Apple would call it invalid (4000006).
        guard AppStoreServerAPIClient.isPathSafe(key.originalTransactionID) else {
            metrics.redemptionPlacementLookup(outcome: HistoryUnavailable.Reason.rejected.rawValue)
            return .answered
        }
        let lookup = await client.history(
            transactionID: key.originalTransactionID, app: app, credentials: credentials(key.bundleID), now: Date(), budget: budget, reportsFetch: false)
        let history: VerifiedHistory
        switch lookup {
        case .history(let answer) where answer.environment == environment:
            history = answer
        case .history:
            metrics.redemptionPlacementLookup(outcome: "wrong_app")
            return .notAnswered
        case .unavailable(let unavailable):
            metrics.redemptionPlacementLookup(outcome: unavailable.reason.rawValue)
            logger.info(
                "an unplaced redemption stays unplaced: Apple's history is unavailable; asked again later",
                metadata: [
                    "bundle_id": "\(key.bundleID)", "environment": "\(key.environment)", "reason": "\(unavailable.reason.rawValue)",
                    "apple_error_code": "\(unavailable.appleErrorCode.map(String.init) ?? "none")",
                ])
            return Self.answer(unavailable)
        }
        do {
            let result = try await store.recordAppleHistory(AppleHistoryConversion.update(history), at: Date())
            metrics.redemptionPlacementLookup(outcome: "history")
            if case .recorded(let redemptions) = result {
                for redemption in redemptions {
                    metrics.offerRedeemed(redemption)
                    logger.notice(
                        redemption.placedAt != nil ? "unplaced redemption placed" : "offer redeemed",
                        metadata: [
                            "bundle_id": "\(redemption.candidate.bundleID)", "offer_id": "\(redemption.candidate.offerID)",
                            "transaction_id": "\(redemption.candidate.transactionID)", "state": "\(redemption.state.rawValue)",
                        ])
                }
            }
            return .answered
        } catch {
            metrics.redemptionPlacementLookup(outcome: "store_failed")
            logger.warning("could not store the history that places a redemption; asked again later", metadata: ["error": "\(error)"])
            return .notAnswered
        }
    }
}
