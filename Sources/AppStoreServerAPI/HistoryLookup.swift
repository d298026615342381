import Foundation
import OfferSignerEligibility

/// The outcome of asking Apple for a customer's history: expected failures are data, so the caller
/// decides what they mean for an offer (see `HistorySource`).
public enum HistoryLookup: Sendable {
    /// Apple answered, and every signed item verified.
    case history(VerifiedHistory)
    /// Apple did not give a usable answer.
    case unavailable(HistoryUnavailable)
}

/// Why Apple's history could not be had.
public struct HistoryUnavailable: Error, Sendable, Hashable, CustomStringConvertible {
    /// Stable reason codes (snake_case on the wire and in the audit log).
    public enum Reason: String, Sendable, Hashable, CaseIterable {
        /// The time budget ran out (slow answers, retries, `Retry-After`).
        case timeBudgetExhausted = "time_budget_exhausted"
        /// Apple kept answering 429 (or error 4290000) and the wait would pass the budget.
        case rateLimited = "rate_limited"
        /// Apple kept answering 5xx.
        case serverError = "server_error"
        /// Apple kept answering one of its retryable 404 errors (4040002, 4040004, 4040006: the
        /// account, app or transaction is not ready there yet). About one customer, not the host:
        /// never held against it.
        case retryLater = "retry_later"
        /// The connection failed.
        case networkError = "network_error"
        /// Too many lookups at once in this service: the budget ran out before this one could ask
        /// Apple (this service's overload, not Apple's; not held against Apple's host).
        case overloaded = "overloaded"
        /// The caller stopped waiting (its task was cancelled); not held against Apple's host.
        case cancelled = "cancelled"
        /// The circuit breaker is open: recent lookups failed; failing fast.
        case circuitOpen = "circuit_open"
        /// Apple refused our token (401): wrong key, issuer ID or bundle.
        case unauthorized = "unauthorized"
        /// The app has no usable key to authenticate with (no active key, or no issuer ID).
        case noCredentials = "no_credentials"
        /// No accepted environment knows the transaction ID (error 4040010 everywhere).
        case transactionNotFound = "transaction_not_found"
        /// Apple refused the request (another 4xx, e.g. an invalid transaction ID).
        case rejected = "rejected"
        /// The answer is not the documented JSON.
        case malformedResponse = "malformed_response"
        /// The answer names another app (bundle ID or App Apple ID) or environment.
        case wrongApp = "wrong_app"
        /// A signed item of the answer did not verify (chain, signature, bundle, environment).
        case unverifiable = "unverifiable"
    }

    public var reason: Reason
    /// Human-readable explanation; never contains a token or key.
    public var detail: String
    /// Apple's `errorCode` from the error body, when Apple sent one with a ``Reason/rejected``
    /// answer (e.g. 4000006 InvalidTransactionIdError, 4040003 AppNotFoundError); nil otherwise.
    public var appleErrorCode: Int?

    public init(_ reason: Reason, _ detail: String, appleErrorCode: Int? = nil) {
        self.reason = reason
        self.detail = detail
        self.appleErrorCode = appleErrorCode
    }

    /// Apple's errors that are statements about the customer or the transaction, not about this
    /// service's request: 4040001 AccountNotFoundError and 4000006 InvalidTransactionIdError
    /// (https://developer.apple.com/documentation/appstoreserverapi/error-codes; Apple's Python
    /// library `api_client.py` `APIError.ACCOUNT_NOT_FOUND`, `INVALID_TRANSACTION_ID`), beside
    /// 4040010 TransactionIdNotFoundError (``Reason/transactionNotFound``).
    public static let transactionErrorCodes: Set<Int> = [4_040_001, 4_000_006]

    /// Whether Apple answered about the transaction ID itself: unknown in every environment asked
    /// (4040010), its account unknown (4040001), or invalid (4000006, also for an ID this client
    /// never sends because it cannot go in a request path). Every other failure (another 4xx such as
    /// 4040003 AppNotFoundError, 4000002 InvalidAppIdentifierError, a 403 or a 404 without Apple's
    /// error body; 401; 5xx; the network; the budget) says nothing about the customer: it is this
    /// service's configuration or Apple's availability. Apple's error-codes page is a list and
    /// states no rule; this is the service's reading of the errors' descriptions.
    public var isAppleAnswerAboutTransaction: Bool {
        switch reason {
        case .transactionNotFound: true
        case .rejected: appleErrorCode.map(Self.transactionErrorCodes.contains) ?? false
        default: false
        }
    }

    /// Whether falling back to the app's own evidence is allowed (`apple-then-client`).
    ///
    /// Rule: only when Apple did not answer about the transaction ID
    /// (``isAppleAnswerAboutTransaction``). When Apple answered that the ID is unknown or invalid,
    /// the app chose that ID, so its evidence must not decide instead (else a made-up ID would
    /// switch a tampered app back to its own word). A failure that is this service's
    /// configuration (a 403, 4040003) or Apple's availability lets the evidence decide, as Apple
    /// being unreachable does: a genuine customer is not refused for it.
    public var allowsFallback: Bool { !isAppleAnswerAboutTransaction }

    public var description: String { "\(reason.rawValue): \(detail)" }
}

/// Filters of a Get Transaction History request: only the transactions of these product types
/// and subscription groups (Apple's `productType` and `subscriptionGroupIdentifier` query
/// parameters, each repeatable; appstoreserverlibrary/models/TransactionHistoryRequest.py,
/// api_client.py `get_transaction_history`;
/// https://developer.apple.com/documentation/appstoreserverapi/get-transaction-history).
///
/// Rules: Apple asks the same query parameters on every page ("For requests that use the revision
/// token, include the same query parameters from the initial request"), so they are sent with
/// each; a filtered answer is `VerifiedHistory.isFiltered`: cached under its filter only, and
/// stored as the complete history of only the subscriptions of the groups it holds whole
/// (``wholeSubscriptionGroups``), never of other groups or of other product types. `revoked` and `sort` are not used (a
/// decision needs refunds, and reads the history in any order).
public struct HistoryFilter: Sendable, Hashable {
    /// Apple's `ProductType` values (`AUTO_RENEWABLE`, `NON_RENEWABLE`, `CONSUMABLE`, `NON_CONSUMABLE`).
    public var productTypes: [String]
    public var subscriptionGroupIdentifiers: [String]

    public init(productTypes: [String] = [], subscriptionGroupIdentifiers: [String] = []) {
        self.productTypes = productTypes
        self.subscriptionGroupIdentifiers = subscriptionGroupIdentifiers
    }

    /// The auto-renewable subscriptions of one subscription group: what a decision about an
    /// offer of that group reads (`EligibilityEvaluator` looks at the group's transactions only).
    public static func subscriptionGroup(_ identifier: String) -> HistoryFilter {
        HistoryFilter(productTypes: ["AUTO_RENEWABLE"], subscriptionGroupIdentifiers: [identifier])
    }

    public var isEmpty: Bool { productTypes.isEmpty && subscriptionGroupIdentifiers.isEmpty }

    /// The subscription groups whose subscriptions an answer to this filter holds whole: those
    /// named by `subscriptionGroupIdentifier`, when `productType` is absent or includes
    /// `AUTO_RENEWABLE`. Apple: "You can also exclude revoked or nonrevoked transactions, and limit
    /// the transactions by in-app ownership type. If you provide multiple filters in the query,
    /// the transactions that return match all the filters."
    /// (https://developer.apple.com/documentation/appstoreserverapi/get-transaction-history); each
    /// parameter is "an optional filter that indicates the subscription group identifier [product
    /// type] to include in the transaction history", and the answer holds transactions "in any
    /// state, including transactions that are refunded or revoked"
    /// (https://developer.apple.com/documentation/appstoreserverapi/historyresponse; Apple's Python
    /// library `appstoreserverlibrary/models/TransactionHistoryRequest.py`). So the answer is the
    /// transactions matching both filters; `revoked`, `excludeRevoked` and `inAppOwnershipType`,
    /// which would leave some out, are never sent. That every transaction of such a subscription
    /// matches (a subscription's `originalTransactionId` stays within its group, so none of its
    /// transactions is of another group) is this service's reading: Apple is silent on it, and
    /// does not state that a filtered answer is complete for its filter. Apple is also silent on
    /// a filter of `AUTO_RENEWABLE` alone; it is not read as whole here.
    public var wholeSubscriptionGroups: Set<String> {
        guard productTypes.isEmpty || productTypes.contains("AUTO_RENEWABLE") else { return [] }
        return Set(subscriptionGroupIdentifiers)
    }

    /// The query parameters, in a stable order (also the cache's key for the filter).
    var queryItems: [(String, String)] {
        productTypes.sorted().map { ("productType", $0) } + subscriptionGroupIdentifiers.sorted().map { ("subscriptionGroupIdentifier", $0) }
    }
}
