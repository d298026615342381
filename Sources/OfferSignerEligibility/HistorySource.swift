import Foundation

/// Whose word on a customer's history decides an offer (`historySource` of an offer in the catalog).
///
/// Rule: the default is `client`, so a catalog written before this setting existed keeps its meaning.
public enum HistorySource: String, Sendable, Codable, Hashable, CaseIterable {
    /// Apple's App Store Server API only. The request names the customer by `transactionID`; when
    /// Apple cannot answer, the offer is not eligible (`history_unavailable`). A tampered app cannot
    /// hide renewals from this source.
    case apple = "apple"
    /// Apple's App Store Server API when it answers, else the Apple-signed evidence the app sent.
    /// The audit record of the decision says which of the two decided.
    case appleThenClient = "apple-then-client"
    /// The Apple-signed evidence the app sent (StoreKit's `jwsRepresentation`s). Each item is
    /// verified, but the app chooses which items to send.
    case client = "client"

    /// Whether this source asks Apple's App Store Server API.
    public var asksApple: Bool { self != .client }
}

/// Which source actually decided one eligibility question (the audit record's `historySource`).
public enum DecidingHistorySource: String, Sendable, Codable, Hashable {
    /// Apple's App Store Server API answered.
    case apple = "apple"
    /// The app's evidence decided (source `client`, or `apple-then-client` when Apple could not answer).
    case client = "client"
    /// Nobody could: Apple could not answer under source `apple` (reason `history_unavailable`).
    case undecided = "none"
}

/// Per-app settings of the App Store Server API (`apps.<bundleID>` in the catalog JSON).
///
/// Rule: the key that authenticates to Apple and its issuer ID are never here: they are the app's
/// active In-App Purchase key in the key store (the same key signs offers).
public struct AppStoreAppSettings: Sendable, Hashable, Encodable {
    /// The app's bundle ID (the key of its entry).
    public var bundleID: String
    /// `appAppleID`: the App Store's numeric app identifier. When set, Apple's answers must name it.
    public var appAppleID: Int64?
    /// `environments`: which App Store environments the app's customers may come from, in the order
    /// they are asked: Production first, then Sandbox when Production does not know the transaction
    /// (error 4040010). Default: Production only. The app's own evidence, notifications and
    /// Retention Messaging requests from another environment are refused.
    public var environments: [AppleEnvironment]
    /// Whether `environments` was given in the catalog (`false`: the default, Production only).
    public var environmentsGiven: Bool = false
    /// `notificationHistory`: Apple's App Store Server Notifications V2 for this app come to this
    /// service, so a subscription's stored history, once complete (fetched in full from the App
    /// Store Server API once, or followed from its first purchase), is kept current by them and
    /// decides without asking Apple's API. Default `false`: the API is asked (the stored history
    /// is then only kept, for redemption tracking).
    public var notificationHistory: Bool
    /// `subscriptionGroups`: the subscription group of products no catalog offer names, by
    /// product ID (the catalog JSON lists them by group: `{"groupID": ["productID", …]}`). Offers
    /// tell the group of the products they name; a switch-plan suggestion must stay in its group.
    public var subscriptionGroups: [String: String] = [:]
    /// `retention`: how the app answers Apple's Retention Messaging requests (nil: it does not).
    public var retention: RetentionPlan?
    /// `appStoreServerAPI.productionURL`: overrides Apple's production host (tests, a proxy).
    public var productionURL: String?
    /// `appStoreServerAPI.sandboxURL`: overrides Apple's sandbox host (tests, a proxy).
    public var sandboxURL: String?

    public init(
        bundleID: String, appAppleID: Int64? = nil, environments: [AppleEnvironment] = [.production],
        productionURL: String? = nil, sandboxURL: String? = nil, notificationHistory: Bool = false
    ) {
        self.notificationHistory = notificationHistory
        self.bundleID = bundleID
        self.appAppleID = appAppleID
        self.environments = environments
        self.productionURL = productionURL
        self.sandboxURL = sandboxURL
    }
}
