import Foundation

/// The offers catalog, loaded from a JSON file (`--offers FILE`).
///
/// Format (see `offers.example.json` at the repository root):
///
/// ```json
/// {
///   "apps": {                                       // optional: per-app App Store Server API settings
///     "com.example.app": {
///       "appAppleID": 1234567890,                   // optional integer; Apple's answers must name it
///       "environments": ["Production", "Sandbox"],  // optional, default ["Production"]; asked in this order
///       "subscriptionGroups": {"21345678": ["com.example.app.yearly"]},  // optional: products no offer
///                                                   // names, by subscription group (see Retention.md)
///       "notificationHistory": true,                // optional, default false: Apple sends this app's
///                                                   // Server Notifications V2 here, so a stored, complete
///                                                   // history decides without asking Apple's API
///       "appStoreServerAPI": {                      // optional: other hosts (tests, a proxy)
///         "productionURL": "http://127.0.0.1:9000", "sandboxURL": "http://127.0.0.1:9001" }
///     }
///   },
///   "offers": [
///     {
///       "offerID": "winback_50_3m",                 // required, non-empty; unique per bundleID
///       "bundleID": "com.example.app",              // required, non-empty
///       "productIDs": ["com.example.app.monthly"],  // required, non-empty list of non-empty strings
///       "subscriptionGroupID": "21345678",          // required, non-empty string
///       "kind": "win-back",                         // required: "win-back" | "retention" | "any"
///       "description": "50% off for 3 months",      // optional, ignored
///       "historySource": "apple",                   // optional: "apple" | "apple-then-client" | "client" (default); needs rules
///       "rules": {                                  // optional; absent = always signable
///         "minPaidMonths": 3,                       // integer >= 0
///         "lapsedMonths": { "min": 1, "max": 12 },  // integers >= 0, at least one, min <= max
///         "waitBetweenOffersMonths": 6,             // integer >= 0
///         "waitScope": "offer",                     // "offer" (default) | "any-win-back"; needs waitBetweenOffersMonths
///         "waitFrom": "subscription-end",           // "subscription-end" (default) | "offer-end"; needs waitBetweenOffersMonths
///         "maxRedemptions": 1,                      // integer >= 1
///         "excludeFamilyShared": true,              // booleans, default false
///         "excludeRefunded": true,
///         "excludeBillingRetry": true,             // no longer needed: win-back offers always exclude it
///         "paidTime": "lifetime",                   // "lifetime" (default) | "latest-run"; needs minPaidMonths
///         "clockSkewSeconds": 60,                   // 0...3600, default 60
///         "storefronts": { "allow": ["USA", "CAN"] },  // or { "deny": [...] }: exactly one, 3-letter codes
///         "environment": "Production",              // "Production" | "Sandbox"
///         "deferToAppleWinBack": true
///       }
///     }
///   ]
/// }
/// ```
///
/// (The `//` comments above are for documentation only; JSON has none.) Validation is strict:
/// unknown keys at any level, wrong types, out-of-range values and duplicate offers are rejected with
/// an `OfferCatalogError` naming the offer and the field, so a typo can never silently disable a rule.
/// Month counts are calendar months in UTC (Gregorian calendar).
public struct OfferCatalog: Sendable, Hashable {
    /// The offers, in file order.
    public var offers: [OfferDefinition]
    /// Per-app App Store Server API settings, by bundle ID (`apps`). An app without an entry uses
    /// the defaults of `AppStoreAppSettings` (Production only, Apple's hosts).
    public var apps: [String: AppStoreAppSettings]

    /// Builds a catalog from already-validated definitions (checks uniqueness of offerID per bundleID).
    public init(offers: [OfferDefinition], apps: [String: AppStoreAppSettings] = [:]) throws(OfferCatalogError) {
        self.apps = apps
        var seen = Set<String>()
        for (index, offer) in offers.enumerated() {
            let key = offer.bundleID + "\u{0}" + offer.offerID
            if !seen.insert(key).inserted {
                throw OfferCatalogError(
                    offerID: offer.offerID, index: index, field: "offerID",
                    problem: .duplicateOffer(bundleID: offer.bundleID))
            }
            // History from an environment the app does not accept never verifies, so such a rule
            // could never be met.
            let accepted = (apps[offer.bundleID] ?? AppStoreAppSettings(bundleID: offer.bundleID)).environments
            if let environment = offer.rules?.environment, !accepted.contains(environment) {
                throw OfferCatalogError(
                    offerID: offer.offerID, index: index, field: "rules.environment",
                    problem: .invalidValue(
                        "'\(environment.rawValue)' is not among the environments \(offer.bundleID) accepts "
                            + "(apps.\(offer.bundleID).environments: \(accepted.map(\.rawValue).joined(separator: ", "))), so no history could meet it"))
            }
        }
        self.offers = offers
        for (bundleID, app) in apps {
            guard let retention = app.retention else { continue }
            for (productID, plan) in retention.products {
                try Self.checkAlternateProduct(plan, of: productID, app: app, offers: offers)
                for choice in plan.offers {
                    guard let offer = offers.first(where: { $0.bundleID == bundleID && $0.offerID == choice.offerID }) else {
                        throw OfferCatalogError(
                            offerID: choice.offerID, index: nil, field: "apps.\(bundleID).retention.products.\(productID)",
                            problem: .invalidValue("'\(choice.offerID)' is not an offer of \(bundleID) in this catalog"))
                    }
                    guard offer.productIDs.isEmpty || offer.productIDs.contains(productID) else {
                        throw OfferCatalogError(
                            offerID: choice.offerID, index: nil, field: "apps.\(bundleID).retention.products.\(productID)",
                            problem: .invalidValue("offer '\(choice.offerID)' does not apply to product '\(productID)'"))
                    }
                }
            }
        }
    }

    /// The app whose `appAppleID` is `appAppleID` (Retention Messaging requests name the app only so).
    public func app(appAppleID: Int64) -> AppStoreAppSettings? {
        apps.values.first { $0.appAppleID == appAppleID }
    }

    /// Parses and validates the catalog JSON (format above).
    public init(jsonData: Data) throws(OfferCatalogError) {
        let root: JSONValue
        do {
            root = try JSONDecoder().decode(JSONValue.self, from: jsonData)
        } catch {
            throw OfferCatalogError(offerID: nil, index: nil, field: "", problem: .invalidJSON(String(describing: error)))
        }
        var parser = CatalogParser()
        let offers = try parser.parseRoot(root)
        try self.init(offers: offers, apps: try parser.parseApps(root))
    }

    /// The App Store Server API settings of an app (its `apps` entry, or the defaults).
    public func appSettings(bundleID: String) -> AppStoreAppSettings {
        apps[bundleID] ?? AppStoreAppSettings(bundleID: bundleID)
    }

    /// The offer with this ID. With a `bundleID`, only that app's offer; without one, the offer only if
    /// exactly one bundle defines that ID (`nil` when ambiguous).
    public func offer(id: String, bundleID: String?) -> OfferDefinition? {
        let matches = offers.filter { $0.offerID == id && (bundleID == nil || $0.bundleID == bundleID) }
        return matches.count == 1 ? matches[0] : nil
    }

    /// IDs of the offers of kind `win-back` (used by `waitScope: "any-win-back"`).
    public var winBackOfferIDs: Set<String> {
        Set(offers.filter { $0.kind == .winBack }.map(\.offerID))
    }
}

/// A catalog validation error: which offer (ID when known, else position), which field (a dotted
/// path such as `rules.lapsedMonths.min`), and what is wrong.
public struct OfferCatalogError: Error, Sendable, Hashable, CustomStringConvertible, LocalizedError {
    /// What is wrong with the field.
    public enum Problem: Sendable, Hashable {
        /// The file is not JSON.
        case invalidJSON(String)
        /// A required field is absent.
        case missingField
        /// A key that the format does not define (typo?). Carries the allowed keys.
        case unknownField(allowed: [String])
        /// The value has the wrong JSON type.
        case wrongType(expected: String)
        /// The value has the right type but is not acceptable.
        case invalidValue(String)
        /// Another offer of the same bundle has this offerID.
        case duplicateOffer(bundleID: String)
    }

    /// The offer's `offerID`, when it could be read.
    public var offerID: String?
    /// The offer's position in `offers` (0-based), `nil` for file-level errors.
    public var index: Int?
    /// Dotted path of the field inside the offer (or at the top level for file-level errors).
    public var field: String
    /// The problem.
    public var problem: Problem

    public init(offerID: String?, index: Int?, field: String, problem: Problem) {
        self.offerID = offerID
        self.index = index
        self.field = field
        self.problem = problem
    }

    public var description: String {
        var location: String
        if let offerID {
            location = "offer '\(offerID)'"
            if let index { location += " (offers[\(index)])" }
        } else if let index {
            location = "offers[\(index)]"
        } else {
            location = "catalog"
        }
        if !field.isEmpty { location += ", field '\(field)'" }
        let what: String
        switch problem {
        case .invalidJSON(let detail): what = "not valid JSON (\(detail))"
        case .missingField: what = "required field is missing"
        case .unknownField(let allowed): what = "unknown key (allowed: \(allowed.joined(separator: ", ")))"
        case .wrongType(let expected): what = "expected \(expected)"
        case .invalidValue(let detail): what = detail
        case .duplicateOffer(let bundleID): what = "duplicate offerID for bundle '\(bundleID)'"
        }
        return "Invalid offers catalog: \(location): \(what)"
    }

    public var errorDescription: String? { description }
}

// MARK: - Parsing

/// A decoded JSON value (numbers kept as integers when they are integral).
enum JSONValue: Decodable, Hashable {
    case null
    case bool(Bool)
    case integer(Int64)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Int64.self) {
            self = .integer(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }
}

struct CatalogParser {
    static let offerKeys = ["offerID", "bundleID", "productIDs", "subscriptionGroupID", "kind", "description", "rules", "historySource"]
    static let appKeys = ["appAppleID", "environments", "appStoreServerAPI", "notificationHistory", "retention", "subscriptionGroups"]
    static let ruleKeys = [
        "minPaidMonths", "lapsedMonths", "waitBetweenOffersMonths", "waitScope", "waitFrom", "maxRedemptions",
        "excludeFamilyShared", "excludeRefunded", "excludeBillingRetry", "storefronts", "environment",
        "deferToAppleWinBack", "paidTime", "clockSkewSeconds",
    ]

    // Location of the offer being parsed, for errors.
    var offerID: String?
    var index: Int?

    func error(_ field: String, _ problem: OfferCatalogError.Problem) -> OfferCatalogError {
        OfferCatalogError(offerID: offerID, index: index, field: field, problem: problem)
    }

    mutating func parseRoot(_ root: JSONValue) throws(OfferCatalogError) -> [OfferDefinition] {
        guard case .object(let object) = root else {
            throw error("", .wrongType(expected: "a JSON object with an \"offers\" array"))
        }
        try checkKeys(object, allowed: ["apps", "offers"], path: "")
        guard let offersValue = object["offers"] else { throw error("offers", .missingField) }
        guard case .array(let items) = offersValue else { throw error("offers", .wrongType(expected: "an array")) }
        var offers: [OfferDefinition] = []
        for (position, item) in items.enumerated() {
            index = position
            offerID = nil
            offers.append(try parseOffer(item))
        }
        return offers
    }

    mutating func parseOffer(_ value: JSONValue) throws(OfferCatalogError) -> OfferDefinition {
        guard case .object(let object) = value else { throw error("", .wrongType(expected: "an object")) }
        // Read the ID first so that every later error names the offer.
        if case .string(let id)? = object["offerID"], !id.isEmpty { offerID = id }
        try checkKeys(object, allowed: Self.offerKeys, path: "")
        let id = try requiredString(object, "offerID", path: "")
        let bundleID = try requiredString(object, "bundleID", path: "")
        let productIDs = try stringList(object["productIDs"], path: "productIDs", required: true)
        let groupID = try requiredString(object, "subscriptionGroupID", path: "")
        let kindRaw = try requiredString(object, "kind", path: "")
        guard let kind = OfferKind(rawValue: kindRaw) else {
            throw error("kind", .invalidValue("'\(kindRaw)' is not one of: win-back, retention, any"))
        }
        var description: String?
        if let value = object["description"] {
            guard case .string(let text) = value else { throw error("description", .wrongType(expected: "a string")) }
            description = text
        }
        var rules: OfferRules?
        if let value = object["rules"] {
            rules = try parseRules(value)
        }
        var historySource = HistorySource.client
        if let value = object["historySource"] {
            guard case .string(let raw) = value else { throw error("historySource", .wrongType(expected: "a string")) }
            guard let source = HistorySource(rawValue: raw) else {
                throw error("historySource", .invalidValue("'\(raw)' is not one of: apple, apple-then-client, client"))
            }
            guard rules != nil || source == .client else {
                throw error("historySource", .invalidValue("has no effect without \"rules\" (an offer without rules is always signable)"))
            }
            historySource = source
        }
        return OfferDefinition(
            offerID: id, bundleID: bundleID, productIDs: productIDs, subscriptionGroupID: groupID,
            kind: kind, description: description, rules: rules, historySource: historySource)
    }

    /// `apps`: `{bundleID: {appAppleID?, environments?, appStoreServerAPI?}}`.
    mutating func parseApps(_ root: JSONValue) throws(OfferCatalogError) -> [String: AppStoreAppSettings] {
        index = nil
        offerID = nil
        guard case .object(let object) = root, let value = object["apps"] else { return [:] }
        guard case .object(let entries) = value else { throw error("apps", .wrongType(expected: "an object keyed by bundle ID")) }
        var apps: [String: AppStoreAppSettings] = [:]
        for (bundleID, entry) in entries.sorted(by: { $0.key < $1.key }) {
            let path = "apps.\(bundleID)"
            guard !bundleID.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
                throw error("apps", .invalidValue("a bundle ID must not be empty"))
            }
            guard case .object(let settings) = entry else { throw error(path, .wrongType(expected: "an object")) }
            try checkKeys(settings, allowed: Self.appKeys, path: path)
            var app = AppStoreAppSettings(bundleID: bundleID)
            if let value = settings["appAppleID"] {
                guard case .integer(let number) = value else { throw error(path + ".appAppleID", .wrongType(expected: "an integer")) }
                guard number > 0 else { throw error(path + ".appAppleID", .invalidValue("\(number) is not a positive App Apple ID")) }
                app.appAppleID = number
            }
            if settings["environments"] != nil {
                let names = try stringList(settings["environments"], path: path + ".environments", required: true)
                app.environments = try names.map { name throws(OfferCatalogError) in
                    guard name == AppleEnvironment.production.rawValue || name == AppleEnvironment.sandbox.rawValue,
                        let environment = AppleEnvironment(rawValue: name)
                    else {
                        throw error(path + ".environments", .invalidValue("'\(name)' is not one of: Production, Sandbox"))
                    }
                    return environment
                }
                app.environmentsGiven = true
            }
            if let value = settings["retention"] {
                app.retention = try retentionPlan(value, path: path + ".retention")
            }
            if let value = settings["subscriptionGroups"] {
                app.subscriptionGroups = try subscriptionGroups(value, path: path + ".subscriptionGroups")
            }
            if let value = settings["notificationHistory"] {
                guard case .bool(let flag) = value else { throw error(path + ".notificationHistory", .wrongType(expected: "true or false")) }
                app.notificationHistory = flag
            }
            if let value = settings["appStoreServerAPI"] {
                guard case .object(let urls) = value else {
                    throw error(path + ".appStoreServerAPI", .wrongType(expected: "an object like {\"productionURL\": \"https://...\"}"))
                }
                try checkKeys(urls, allowed: ["productionURL", "sandboxURL"], path: path + ".appStoreServerAPI")
                app.productionURL = try baseURL(urls["productionURL"], path: path + ".appStoreServerAPI.productionURL")
                app.sandboxURL = try baseURL(urls["sandboxURL"], path: path + ".appStoreServerAPI.sandboxURL")
            }
            apps[bundleID] = app
        }
        return apps
    }

    /// An absolute `http` or `https` URL with a host and no query or fragment, without a trailing `/`.
    func baseURL(_ value: JSONValue?, path: String) throws(OfferCatalogError) -> String? {
        guard let value else { return nil }
        guard case .string(let text) = value else { throw error(path, .wrongType(expected: "a string")) }
        guard let url = URLComponents(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = url.host, !host.isEmpty, url.query == nil, url.fragment == nil, url.user == nil, url.password == nil
        else {
            throw error(path, .invalidValue("'\(text)' is not an http(s) base URL such as https://api.storekit.apple.com"))
        }
        return text.hasSuffix("/") ? String(text.dropLast()) : text
    }

    func parseRules(_ value: JSONValue) throws(OfferCatalogError) -> OfferRules {
        guard case .object(let object) = value else { throw error("rules", .wrongType(expected: "an object")) }
        try checkKeys(object, allowed: Self.ruleKeys, path: "rules")
        var rules = OfferRules()
        rules.minPaidMonths = try integer(object["minPaidMonths"], path: "rules.minPaidMonths", minimum: 0)
        if let value = object["lapsedMonths"] {
            guard case .object(let range) = value else {
                throw error("rules.lapsedMonths", .wrongType(expected: "an object like {\"min\": 1, \"max\": 12}"))
            }
            try checkKeys(range, allowed: ["min", "max"], path: "rules.lapsedMonths")
            let min = try integer(range["min"], path: "rules.lapsedMonths.min", minimum: 0)
            let max = try integer(range["max"], path: "rules.lapsedMonths.max", minimum: 0)
            if min == nil && max == nil {
                throw error("rules.lapsedMonths", .invalidValue("set \"min\" and/or \"max\""))
            }
            if let min, let max, min > max {
                throw error("rules.lapsedMonths", .invalidValue("min (\(min)) is greater than max (\(max))"))
            }
            rules.lapsedMonths = .init(min: min, max: max)
        }
        rules.waitBetweenOffersMonths = try integer(
            object["waitBetweenOffersMonths"], path: "rules.waitBetweenOffersMonths", minimum: 0)
        if let value = object["waitScope"] {
            guard case .string(let raw) = value else { throw error("rules.waitScope", .wrongType(expected: "a string")) }
            guard let scope = OfferRules.WaitScope(rawValue: raw) else {
                throw error("rules.waitScope", .invalidValue("'\(raw)' is not one of: offer, any-win-back"))
            }
            guard rules.waitBetweenOffersMonths != nil else {
                throw error("rules.waitScope", .invalidValue("has no effect without \"waitBetweenOffersMonths\""))
            }
            rules.waitScope = scope
        }
        if let value = object["waitFrom"] {
            guard case .string(let raw) = value, let waitFrom = OfferRules.WaitFrom(rawValue: raw) else {
                throw error("rules.waitFrom", .invalidValue("expected one of: subscription-end, offer-end"))
            }
            guard rules.waitBetweenOffersMonths != nil else {
                throw error("rules.waitFrom", .invalidValue("has no effect without \"waitBetweenOffersMonths\""))
            }
            rules.waitFrom = waitFrom
        }
        rules.maxRedemptions = try integer(object["maxRedemptions"], path: "rules.maxRedemptions", minimum: 1)
        rules.excludeFamilyShared = try bool(object["excludeFamilyShared"], path: "rules.excludeFamilyShared")
        rules.excludeRefunded = try bool(object["excludeRefunded"], path: "rules.excludeRefunded")
        rules.excludeBillingRetry = try bool(object["excludeBillingRetry"], path: "rules.excludeBillingRetry")
        rules.deferToAppleWinBack = try bool(object["deferToAppleWinBack"], path: "rules.deferToAppleWinBack")
        if let value = object["paidTime"] {
            guard case .string(let raw) = value, let paidTime = OfferRules.PaidTime(rawValue: raw) else {
                throw error("rules.paidTime", .invalidValue("expected one of: lifetime, latest-run"))
            }
            guard rules.minPaidMonths != nil else { throw error("rules.paidTime", .invalidValue("has no effect without \"minPaidMonths\"")) }
            rules.paidTime = paidTime
        }
        if let skew = try integer(object["clockSkewSeconds"], path: "rules.clockSkewSeconds", minimum: 0) {
            guard skew <= 3600 else { throw error("rules.clockSkewSeconds", .invalidValue("\(skew) is more than 3600 seconds")) }
            rules.clockSkewSeconds = skew
        }
        if let value = object["storefronts"] {
            guard case .object(let lists) = value else {
                throw error("rules.storefronts", .wrongType(expected: "an object like {\"allow\": [\"USA\"]}"))
            }
            try checkKeys(lists, allowed: ["allow", "deny"], path: "rules.storefronts")
            guard lists.count == 1 else {
                throw error("rules.storefronts", .invalidValue("set exactly one of \"allow\" or \"deny\""))
            }
            let isAllow = lists["allow"] != nil
            let path = isAllow ? "rules.storefronts.allow" : "rules.storefronts.deny"
            let codes = try stringList(isAllow ? lists["allow"] : lists["deny"], path: path, required: true)
            for code in codes where !(code.count == 3 && code.allSatisfy { $0.isASCII && $0.isLetter }) {
                throw error(path, .invalidValue("'\(code)' is not a 3-letter ISO 3166-1 alpha-3 storefront code"))
            }
            let normalized = Set(codes.map { $0.uppercased() })
            rules.storefronts = isAllow ? .allow(normalized) : .deny(normalized)
        }
        if let value = object["environment"] {
            guard case .string(let raw) = value else { throw error("rules.environment", .wrongType(expected: "a string")) }
            guard raw == AppleEnvironment.production.rawValue || raw == AppleEnvironment.sandbox.rawValue else {
                throw error("rules.environment", .invalidValue("'\(raw)' is not one of: Production, Sandbox"))
            }
            rules.environment = AppleEnvironment(rawValue: raw)
        }
        return rules
    }

    // MARK: Field helpers

    func checkKeys(_ object: [String: JSONValue], allowed: [String], path: String) throws(OfferCatalogError) {
        for key in object.keys.sorted() where !allowed.contains(key) {
            throw error(path.isEmpty ? key : path + "." + key, .unknownField(allowed: allowed))
        }
    }

    func requiredString(_ object: [String: JSONValue], _ key: String, path: String) throws(OfferCatalogError) -> String {
        let field = path.isEmpty ? key : path + "." + key
        guard let value = object[key] else { throw error(field, .missingField) }
        guard case .string(let text) = value else { throw error(field, .wrongType(expected: "a string")) }
        guard !text.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty else {
            throw error(field, .invalidValue("must not be empty"))
        }
        return text
    }

    func stringList(_ value: JSONValue?, path: String, required: Bool) throws(OfferCatalogError) -> [String] {
        guard let value else {
            if required { throw error(path, .missingField) }
            return []
        }
        guard case .array(let items) = value else { throw error(path, .wrongType(expected: "an array of strings")) }
        if required && items.isEmpty { throw error(path, .invalidValue("must not be empty")) }
        var result: [String] = []
        for item in items {
            guard case .string(let text) = item else { throw error(path, .wrongType(expected: "an array of strings")) }
            guard !text.isEmpty else { throw error(path, .invalidValue("must not contain empty strings")) }
            guard !result.contains(text) else { throw error(path, .invalidValue("contains '\(text)' twice")) }
            result.append(text)
        }
        return result
    }

    func integer(_ value: JSONValue?, path: String, minimum: Int) throws(OfferCatalogError) -> Int? {
        guard let value else { return nil }
        guard case .integer(let number) = value else { throw error(path, .wrongType(expected: "an integer")) }
        guard number >= minimum, number <= 1200 else {
            throw error(path, .invalidValue("\(number) is out of range (\(minimum)...1200)"))
        }
        return Int(number)
    }

    func bool(_ value: JSONValue?, path: String) throws(OfferCatalogError) -> Bool {
        guard let value else { return false }
        guard case .bool(let flag) = value else { throw error(path, .wrongType(expected: "true or false")) }
        return flag
    }
}
