import Foundation

/// `GET /inApps/v2/history/{transactionId}` (Apple's `HistoryResponse`).
struct HistoryResponseBody: Decodable {
    var revision: String?
    var hasMore: Bool?
    var bundleId: String?
    var appAppleId: Int64?
    var environment: String?
    var signedTransactions: [String]?
}

/// `GET /inApps/v1/subscriptions/{transactionId}` (Apple's `StatusResponse`).
struct StatusResponseBody: Decodable {
    var environment: String?
    var bundleId: String?
    var appAppleId: Int64?
    var data: [SubscriptionGroup]?

    struct SubscriptionGroup: Decodable {
        var subscriptionGroupIdentifier: String?
        var lastTransactions: [LastTransaction]?
    }

    struct LastTransaction: Decodable {
        var originalTransactionId: String?
        var status: Int?
        var signedTransactionInfo: String?
        var signedRenewalInfo: String?
    }
}

/// Apple's error body: `{"errorCode": 4040010, "errorMessage": "..."}`.
struct ErrorResponseBody: Decodable {
    var errorCode: Int?
    var errorMessage: String?
}

/// Apple's error codes the client acts on.
enum AppleErrorCode {
    /// TransactionIdNotFoundError: not in this environment (try Sandbox next).
    static let transactionIDNotFound = 4_040_010
    /// RateLimitExceededError.
    static let rateLimitExceeded = 4_290_000
    /// GeneralInternalError: not retryable (GeneralInternalRetryableError, 5000001, is).
    static let generalInternal = 5_000_000
    /// AccountNotFoundRetryableError, AppNotFoundRetryableError and
    /// OriginalTransactionIdNotFoundRetryableError: answered 404, to be tried again.
    static let retryableNotFound: Set<Int> = [4_040_002, 4_040_004, 4_040_006]
    /// InvalidTransactionIdError.
    static let invalidTransactionID = 4_000_006
}
