import Foundation

/// Reading and checking `apps.<bundleID>.retention` and `apps.<bundleID>.subscriptionGroups`.
extension OfferCatalog {
    /// The subscription group of a product of an app: from the catalog offers that name it, else
    /// from the app's `subscriptionGroups`; nil when neither tells. Several groups is an error.
    static func subscriptionGroup(
        of productID: String, app: AppStoreAppSettings, offers: [OfferDefinition], field: String
    ) throws(OfferCatalogError) -> String? {
        var groups = Set(offers.filter { $0.bundleID == app.bundleID && $0.productIDs.contains(productID) }.map(\.subscriptionGroupID))
        if let declared = app.subscriptionGroups[productID] { groups.insert(declared) }
        guard groups.count <= 1 else {
            throw OfferCatalogError(
                offerID: nil, index: nil, field: field,
                problem: .invalidValue("product '\(productID)' is in several subscription groups (\(groups.sorted().joined(separator: ", "))); a product is in exactly one"))
        }
        return groups.first
    }

    /// A switch-plan suggestion (`fallback.alternateProduct`) names another product of the same
    /// subscription group as the product the plan answers for (and as its offers).
    ///
    /// Apple: "the product identifier of the subscription the retention message suggests for your
    /// customer to switch to" (`AlternateProduct.productId`,
    /// https://developer.apple.com/documentation/retentionmessaging/alternateproduct); a switch is
    /// an upgrade, downgrade or crossgrade within the subscription's group
    /// (https://developer.apple.com/app-store/subscriptions/#ranking), as "users can subscribe to
    /// one subscription product per group at a time" (App Store Connect Help, *Auto-renewable
    /// subscription information*). A product of another group would be a second subscription.
    static func checkAlternateProduct(
        _ plan: RetentionProductPlan, of productID: String, app: AppStoreAppSettings, offers: [OfferDefinition]
    ) throws(OfferCatalogError) {
        let path = "apps.\(app.bundleID).retention.products.\(productID)"
        var planGroups = Set(plan.offers.compactMap { choice in
            offers.first { $0.bundleID == app.bundleID && $0.offerID == choice.offerID }?.subscriptionGroupID
        })
        if let group = try subscriptionGroup(of: productID, app: app, offers: offers, field: path) { planGroups.insert(group) }
        guard case .alternateProduct(_, let alternate, _)? = plan.fallback else { return }
        let field = path + ".fallback.alternateProduct.productID"
        func refuse(_ detail: String) -> OfferCatalogError {
            OfferCatalogError(offerID: nil, index: nil, field: field, problem: .invalidValue(detail))
        }
        guard alternate != productID else { throw refuse("'\(alternate)' is the product itself; suggest another plan of its subscription group") }
        guard planGroups.count == 1, let group = planGroups.first else {
            throw refuse(
                planGroups.isEmpty
                    ? "the subscription group of '\(productID)' is unknown: name it in an offer's productIDs or in apps.\(app.bundleID).subscriptionGroups"
                    : "'\(productID)' and its offers are in several subscription groups (\(planGroups.sorted().joined(separator: ", ")))")
        }
        guard let alternateGroup = try subscriptionGroup(of: alternate, app: app, offers: offers, field: field) else {
            throw refuse("the subscription group of '\(alternate)' is unknown: name it in an offer's productIDs or in apps.\(app.bundleID).subscriptionGroups")
        }
        guard alternateGroup == group else {
            throw refuse("'\(alternate)' is in subscription group \(alternateGroup), not \(group) of '\(productID)': a customer can switch only within a group")
        }
    }
}

extension CatalogParser {
    /// `subscriptionGroups`: `{"groupID": ["productID", …]}`, read into product → group.
    func subscriptionGroups(_ value: JSONValue, path: String) throws(OfferCatalogError) -> [String: String] {
        guard case .object(let groups) = value else { throw error(path, .wrongType(expected: "an object like {\"21345678\": [\"com.example.app.yearly\"]}")) }
        var byProduct: [String: String] = [:]
        for (group, products) in groups.sorted(by: { $0.key < $1.key }) {
            guard !group.isEmpty else { throw error(path, .invalidValue("a subscription group ID must not be empty")) }
            for product in try stringList(products, path: path + "." + group, required: true) {
                if let other = byProduct[product] {
                    throw error(path, .invalidValue("product '\(product)' is listed in groups \(other) and \(group); a product is in exactly one"))
                }
                byProduct[product] = group
            }
        }
        return byProduct
    }

    /// `retention`: `{"signatureVersion"?: "v1"|"v2", "products": {productID: {"offers": [{"offerID", "messageIdentifier"}],
    /// "fallback"?: {"message": {"messageIdentifier"}} | {"alternateProduct": {"messageIdentifier", "productID", "billingPlanType"?}}}}}`,
    /// where a `messageIdentifier` is a UUID or `{"default": UUID, "<locale>": UUID, …}`.
    func retentionPlan(_ value: JSONValue, path: String) throws(OfferCatalogError) -> RetentionPlan {
        guard case .object(let object) = value else { throw error(path, .wrongType(expected: "an object")) }
        try checkKeys(object, allowed: ["signatureVersion", "products"], path: path)
        var plan = RetentionPlan(products: [:])
        if let version = object["signatureVersion"] {
            guard case .string(let raw) = version, let parsed = RetentionPlan.SignatureVersion(rawValue: raw) else {
                throw error(path + ".signatureVersion", .invalidValue("expected \"v1\" or \"v2\""))
            }
            plan.signatureVersion = parsed
        }
        guard case .object(let products)? = object["products"] else { throw error(path + ".products", .wrongType(expected: "an object keyed by product ID")) }
        for (productID, entry) in products {
            let productPath = path + ".products." + productID
            guard case .object(let product) = entry else { throw error(productPath, .wrongType(expected: "an object")) }
            try checkKeys(product, allowed: ["offers", "fallback"], path: productPath)
            var offers: [RetentionOfferChoice] = []
            if let list = product["offers"] {
                guard case .array(let items) = list else { throw error(productPath + ".offers", .wrongType(expected: "an array")) }
                for (index, item) in items.enumerated() {
                    let itemPath = productPath + ".offers[\(index)]"
                    guard case .object(let choice) = item else { throw error(itemPath, .wrongType(expected: "an object")) }
                    try checkKeys(choice, allowed: ["offerID", "messageIdentifier"], path: itemPath)
                    guard case .string(let offerID)? = choice["offerID"], !offerID.isEmpty else { throw error(itemPath + ".offerID", .missingField) }
                    offers.append(RetentionOfferChoice(offerID: offerID, message: try localizedMessage(choice["messageIdentifier"], path: itemPath + ".messageIdentifier")))
                }
            }
            var fallback: RetentionFallback?
            if let value = product["fallback"], value != .null {
                fallback = try retentionFallback(value, path: productPath + ".fallback")
            }
            plan.products[productID] = RetentionProductPlan(offers: offers, fallback: fallback)
        }
        return plan
    }

    private func retentionFallback(_ value: JSONValue, path: String) throws(OfferCatalogError) -> RetentionFallback {
        guard case .object(let choice) = value, choice.count == 1 else {
            throw error(path, .wrongType(expected: "{\"message\": {…}} or {\"alternateProduct\": {…}}"))
        }
        if case .object(let message)? = choice["message"] {
            try checkKeys(message, allowed: ["messageIdentifier"], path: path + ".message")
            return .message(try localizedMessage(message["messageIdentifier"], path: path + ".message.messageIdentifier"))
        }
        guard case .object(let alternate)? = choice["alternateProduct"] else {
            throw error(path, .wrongType(expected: "{\"message\": {…}} or {\"alternateProduct\": {…}}"))
        }
        try checkKeys(alternate, allowed: ["messageIdentifier", "productID", "billingPlanType"], path: path + ".alternateProduct")
        guard case .string(let alternateID)? = alternate["productID"], !alternateID.isEmpty else {
            throw error(path + ".alternateProduct.productID", .missingField)
        }
        var billingPlanType: AlternateProductBillingPlanType?
        if let value = alternate["billingPlanType"] {
            let known = AlternateProductBillingPlanType.known.map(\.rawValue)
            guard case .string(let raw) = value, known.contains(raw) else {
                throw error(path + ".alternateProduct.billingPlanType", .invalidValue("expected one of Apple's BillingPlanType values: \(known.joined(separator: ", "))"))
            }
            billingPlanType = AlternateProductBillingPlanType(rawValue: raw)
        }
        return .alternateProduct(
            try localizedMessage(alternate["messageIdentifier"], path: path + ".alternateProduct.messageIdentifier"), productID: alternateID,
            billingPlanType: billingPlanType)
    }

    /// A UUID (one message for every locale), or `{"default": UUID, "<locale>": UUID, …}`.
    private func localizedMessage(_ value: JSONValue?, path: String) throws(OfferCatalogError) -> LocalizedMessageIdentifier {
        guard let value else { throw error(path, .missingField) }
        guard case .object(let byLocale) = value else {
            return LocalizedMessageIdentifier(default: try messageIdentifier(value, path: path))
        }
        guard let fallback = byLocale["default"] else {
            throw error(path + ".default", .invalidValue("a per-locale messageIdentifier needs a \"default\" for the other locales"))
        }
        var messages: [String: String] = [:]
        for (locale, identifier) in byLocale.sorted(by: { $0.key < $1.key }) where locale != "default" {
            guard Self.isLocale(locale) else {
                throw error(path + "." + locale, .invalidValue("'\(locale)' is not a locale such as en-US, de or pt_BR"))
            }
            let key = LocalizedMessageIdentifier.normalized(locale)
            guard messages[key] == nil else { throw error(path + "." + locale, .invalidValue("locale '\(locale)' is given twice")) }
            messages[key] = try messageIdentifier(identifier, path: path + "." + locale)
        }
        return LocalizedMessageIdentifier(default: try messageIdentifier(fallback, path: path + ".default"), byLocale: messages)
    }

    /// A language (2–3 letters), then optional subtags of 2–8 letters or digits, `-` or `_` between.
    static func isLocale(_ text: String) -> Bool {
        let parts = text.split(separator: "-", omittingEmptySubsequences: false).flatMap { $0.split(separator: "_", omittingEmptySubsequences: false) }
        guard let language = parts.first, (2...3).contains(language.count), language.allSatisfy({ $0.isASCII && $0.isLetter }) else { return false }
        return parts.dropFirst().allSatisfy { (2...8).contains($0.count) && $0.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) } }
    }

    private func messageIdentifier(_ value: JSONValue, path: String) throws(OfferCatalogError) -> String {
        guard case .string(let text) = value, let uuid = UUID(uuidString: text) else {
            throw error(path, .invalidValue("a messageIdentifier is the UUID of a message uploaded to Apple"))
        }
        return uuid.uuidString.lowercased()
    }
}
