import Foundation
import OfferSignerEligibility
import Testing

@Suite("Offers catalog")
struct OfferCatalogTests {
    static let repoRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    func parse(_ json: String) throws(OfferCatalogError) -> OfferCatalog {
        try OfferCatalog(jsonData: Data(json.utf8))
    }

    func parseError(_ json: String) -> OfferCatalogError? {
        do {
            _ = try parse(json)
            return nil
        } catch {
            return error
        }
    }

    /// One offer with the given extra JSON members spliced into the offer object.
    func offerJSON(rules: String? = nil, id: String = "wb1", extra: String = "") -> String {
        """
        {"offers": [{"offerID": "\(id)", "bundleID": "com.example.app", "productIDs": ["p.monthly"],
          "subscriptionGroupID": "123", "kind": "win-back"\(extra)\(rules.map { ", \"rules\": \($0)" } ?? "")}]}
        """
    }

    @Test func repositoryExampleParses() throws {
        let data = try Data(contentsOf: Self.repoRoot.appendingPathComponent("offers.example.json"))
        let catalog = try OfferCatalog(jsonData: data)
        #expect(catalog.offers.map(\.offerID) == ["winback_50pct_3m", "retention_1m_free", "support_goodwill"])
        let winBack = try #require(catalog.offer(id: "winback_50pct_3m", bundleID: "com.example.app"))
        #expect(winBack.kind == .winBack)
        #expect(winBack.subscriptionGroupID == "21345678")
        let rules = try #require(winBack.rules)
        #expect(rules.minPaidMonths == 3)
        #expect(rules.lapsedMonths == .init(min: 1, max: 24))
        #expect(rules.waitBetweenOffersMonths == 12)
        #expect(rules.waitScope == .anyWinBack)
        #expect(rules.maxRedemptions == 2)
        #expect(rules.excludeFamilyShared && rules.excludeRefunded && rules.excludeBillingRetry && rules.deferToAppleWinBack)
        #expect(rules.storefronts == .deny(["CHN"]))
        #expect(rules.environment == .production)
        #expect(catalog.offer(id: "retention_1m_free", bundleID: nil)?.rules?.storefronts == .allow(["USA", "CAN", "GBR"]))
        #expect(catalog.offer(id: "support_goodwill", bundleID: nil)?.rules == nil)
        #expect(catalog.winBackOfferIDs == ["winback_50pct_3m"])
        #expect(winBack.historySource == .apple)
        #expect(catalog.offer(id: "retention_1m_free", bundleID: nil)?.historySource == .client, "client is the default")
        let app = catalog.appSettings(bundleID: "com.example.app")
        #expect(app.appAppleID == 1_234_567_890 && app.environments == [.production] && app.notificationHistory)
        let plan = try #require(app.retention?.products["com.example.app.premium.monthly"])
        #expect(app.retention?.signatureVersion == .v2)
        #expect(plan.offers == [RetentionOfferChoice(offerID: "retention_1m_free", messageIdentifier: "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f")])
        #expect(
            plan.fallback
                == .alternateProduct(
                    LocalizedMessageIdentifier(default: "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50", byLocale: ["de": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e51"]),
                    productID: "com.example.app.premium.yearly", billingPlanType: nil))
    }

    @Test func minimalOfferHasNoRules() throws {
        let catalog = try parse(offerJSON())
        #expect(catalog.offers.count == 1)
        #expect(catalog.offers[0].rules == nil)
        #expect(catalog.offer(id: "wb1", bundleID: "other.bundle") == nil)
        #expect(catalog.offer(id: "missing", bundleID: nil) == nil)
    }

    @Test func storefrontCodesAreNormalised() throws {
        let catalog = try parse(offerJSON(rules: #"{"storefronts": {"allow": ["usa", "Fra"]}}"#))
        #expect(catalog.offers[0].rules?.storefronts == .allow(["USA", "FRA"]))
    }

    @Test func unknownRuleKeyIsRejectedNamingOfferAndField() throws {
        let error = try #require(parseError(offerJSON(rules: #"{"minPaidMonth": 3}"#)))
        #expect(error.offerID == "wb1")
        #expect(error.index == 0)
        #expect(error.field == "rules.minPaidMonth")
        guard case .unknownField(let allowed) = error.problem else {
            Issue.record("unexpected problem \(error.problem)")
            return
        }
        #expect(allowed.contains("minPaidMonths"))
        #expect(error.description.contains("offer 'wb1'"))
        #expect(error.description.contains("rules.minPaidMonth"))
        #expect(error.description.contains("unknown key"))
    }

    @Test func unknownNestedAndOfferLevelKeysAreRejected() {
        #expect(parseError(offerJSON(rules: #"{"lapsedMonths": {"min": 1, "maximum": 3}}"#))?.field == "rules.lapsedMonths.maximum")
        #expect(parseError(offerJSON(extra: #", "rule": {"minPaidMonths": 3}"#))?.field == "rule")
        #expect(parseError(#"{"offers": [], "offer": []}"#)?.field == "offer")
    }

    @Test func missingFieldIsNamed() throws {
        let json = #"{"offers": [{"offerID": "x1", "productIDs": ["p"], "subscriptionGroupID": "1", "kind": "any"}]}"#
        let error = try #require(parseError(json))
        #expect(error.offerID == "x1")
        #expect(error.field == "bundleID")
        #expect(error.problem == .missingField)
        #expect(error.description == "Invalid offers catalog: offer 'x1' (offers[0]), field 'bundleID': required field is missing")
    }

    @Test func missingOfferIDIsNamedByPosition() throws {
        let json = #"{"offers": [{"bundleID": "b", "productIDs": ["p"], "subscriptionGroupID": "1", "kind": "any"}]}"#
        let error = try #require(parseError(json))
        #expect(error.offerID == nil)
        #expect(error.index == 0)
        #expect(error.field == "offerID")
        #expect(error.description.contains("offers[0]"))
    }

    @Test func badKindIsRejected() throws {
        let json = offerJSON().replacingOccurrences(of: "\"win-back\"", with: "\"winback\"")
        let error = try #require(parseError(json))
        #expect(error.offerID == "wb1")
        #expect(error.field == "kind")
        #expect(error.description.contains("'winback' is not one of: win-back, retention, any"))
    }

    @Test(arguments: [
        (#"{"minPaidMonths": "3"}"#, "rules.minPaidMonths"),
        (#"{"minPaidMonths": 1.5}"#, "rules.minPaidMonths"),
        (#"{"minPaidMonths": -1}"#, "rules.minPaidMonths"),
        (#"{"maxRedemptions": 0}"#, "rules.maxRedemptions"),
        (#"{"excludeRefunded": 1}"#, "rules.excludeRefunded"),
        (#"{"lapsedMonths": {}}"#, "rules.lapsedMonths"),
        (#"{"lapsedMonths": {"min": 6, "max": 3}}"#, "rules.lapsedMonths"),
        (#"{"lapsedMonths": 3}"#, "rules.lapsedMonths"),
        (#"{"waitScope": "offer"}"#, "rules.waitScope"),
        (#"{"waitBetweenOffersMonths": 6, "waitScope": "all"}"#, "rules.waitScope"),
        (#"{"storefronts": {"allow": ["USA"], "deny": ["FRA"]}}"#, "rules.storefronts"),
        (#"{"storefronts": {"allow": []}}"#, "rules.storefronts.allow"),
        (#"{"storefronts": {"deny": ["US"]}}"#, "rules.storefronts.deny"),
        (#"{"environment": "production"}"#, "rules.environment"),
        (#"{"environment": "Xcode"}"#, "rules.environment"),
        (#"[]"#, "rules"),
    ])
    func invalidRuleValuesAreRejected(rules: String, field: String) throws {
        let error = try #require(parseError(offerJSON(rules: rules)))
        #expect(error.offerID == "wb1")
        #expect(error.field == field)
    }

    @Test func invalidTopLevelShapes() {
        #expect(parseError("not json")?.problem.isInvalidJSON == true)
        #expect(parseError(#"{"offers": {}}"#)?.field == "offers")
        #expect(parseError(#"{}"#)?.problem == .missingField)
        #expect(parseError(#"[1]"#) != nil)
        #expect(parseError(#"{"offers": [1]}"#)?.index == 0)
    }

    @Test func emptyAndDuplicateValues() {
        #expect(parseError(offerJSON(id: ""))?.field == "offerID")
        let products = offerJSON().replacingOccurrences(of: #"["p.monthly"]"#, with: #"["p", "p"]"#)
        #expect(parseError(products)?.field == "productIDs")
        let noProducts = offerJSON().replacingOccurrences(of: #"["p.monthly"]"#, with: "[]")
        #expect(parseError(noProducts)?.field == "productIDs")
        let numericGroup = offerJSON().replacingOccurrences(of: #""123""#, with: "123")
        #expect(parseError(numericGroup)?.problem == .wrongType(expected: "a string"))
    }

    @Test func historySourceAndAppSettings() throws {
        #expect(try parse(offerJSON(rules: "{}", extra: #", "historySource": "apple-then-client""#)).offers[0].historySource == .appleThenClient)
        #expect(try parse(offerJSON(rules: "{}")).offers[0].historySource == .client)
        #expect(parseError(offerJSON(rules: "{}", extra: #", "historySource": "Apple""#))?.field == "historySource")
        #expect(parseError(offerJSON(rules: "{}", extra: #", "historySource": 1"#))?.problem == .wrongType(expected: "a string"))
        let withoutRules = parseError(offerJSON(extra: #", "historySource": "apple""#))
        #expect(withoutRules?.field == "historySource", "an offer without rules is always signable: the source would mean nothing")

        let offers = #""offers": []"#
        let apps = try parse(#"{"apps": {"b": {"appAppleID": 7, "environments": ["Production", "Sandbox"], "appStoreServerAPI": {"productionURL": "http://127.0.0.1:9/p/", "sandboxURL": "https://sandbox.example"}}}, \#(offers)}"#)
        var expected = AppStoreAppSettings(bundleID: "b", appAppleID: 7, environments: [.production, .sandbox], productionURL: "http://127.0.0.1:9/p", sandboxURL: "https://sandbox.example")
        expected.environmentsGiven = true
        #expect(apps.appSettings(bundleID: "b") == expected)
        #expect(apps.appSettings(bundleID: "other").environments == [.production], "defaults: Production, Apple's hosts")
        #expect(parseError(#"{"apps": {"b": {"environments": ["Xcode"]}}, \#(offers)}"#)?.field == "apps.b.environments")
        #expect(parseError(#"{"apps": {"b": {"environments": []}}, \#(offers)}"#)?.field == "apps.b.environments")
        #expect(parseError(#"{"apps": {"b": {"appAppleID": "7"}}, \#(offers)}"#)?.field == "apps.b.appAppleID")
        #expect(parseError(#"{"apps": {"b": {"appAppleId": 7}}, \#(offers)}"#)?.field == "apps.b.appAppleId", "a typo is refused")
        #expect(parseError(#"{"apps": {"b": {"appStoreServerAPI": {"productionURL": "ftp://x"}}}, \#(offers)}"#)?.field == "apps.b.appStoreServerAPI.productionURL")
        #expect(parseError(#"{"apps": {"b": {"appStoreServerAPI": {"sandboxURL": "https://x/?q=1"}}}, \#(offers)}"#)?.field == "apps.b.appStoreServerAPI.sandboxURL")
        #expect(parseError(#"{"apps": [], \#(offers)}"#)?.field == "apps")
    }

    @Test("rules.environment must be an environment the app accepts (Production unless apps.<bundle>.environments says more)")
    func ruleEnvironmentAmongTheAppsEnvironments() throws {
        let error = try #require(parseError(offerJSON(rules: #"{"environment": "Sandbox"}"#)))
        #expect(error.field == "rules.environment")
        #expect(error.description.contains("apps.com.example.app.environments"), "\(error)")
        #expect(try parse(offerJSON(rules: #"{"environment": "Production"}"#)).offers.first?.rules?.environment == .production)

        let accepting = offerJSON(rules: #"{"environment": "Sandbox"}"#)
            .replacingOccurrences(of: #"{"offers": ["#, with: #"{"apps": {"com.example.app": {"environments": ["Production", "Sandbox"]}}, "offers": ["#)
        let catalog = try parse(accepting)
        #expect(catalog.offers.first?.rules?.environment == .sandbox)
        #expect(catalog.appSettings(bundleID: "com.example.app").environmentsGiven)
        #expect(!catalog.appSettings(bundleID: "com.other.app").environmentsGiven)
    }

    @Test func duplicateOfferIsRejected() throws {
        let one = #"{"offerID": "a", "bundleID": "b", "productIDs": ["p"], "subscriptionGroupID": "1", "kind": "any"}"#
        let error = try #require(parseError(#"{"offers": [\#(one), \#(one)]}"#))
        #expect(error.index == 1)
        #expect(error.problem == .duplicateOffer(bundleID: "b"))
        // The same offer ID in another bundle is fine, but then a lookup without bundle is ambiguous.
        let other = one.replacingOccurrences(of: #""b""#, with: #""c""#)
        let catalog = try parse(#"{"offers": [\#(one), \#(other)]}"#)
        #expect(catalog.offer(id: "a", bundleID: nil) == nil)
        #expect(catalog.offer(id: "a", bundleID: "c")?.bundleID == "c")
    }
}

extension OfferCatalogError.Problem {
    var isInvalidJSON: Bool {
        if case .invalidJSON = self { return true }
        return false
    }
}

@Suite("Offers catalog: retention plans")
struct RetentionPlanCatalogTests {
    static func catalog(_ retention: String, offers: String = #"[{"offerID": "keep", "bundleID": "com.example.app", "productIDs": ["p.monthly"], "subscriptionGroupID": "G", "kind": "retention"}]"#) -> Data {
        Data(#"{"apps": {"com.example.app": {"appAppleID": 1, "retention": \#(retention)}}, "offers": \#(offers)}"#.utf8)
    }

    @Test("A plan names catalog offers that apply to its product, and UUID message identifiers; anything else is refused with the path")
    func refusals() throws {
        let good = #"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": "8C1B9D2E-5F4A-4C3B-9E2D-1A0B7C6D5E4F"}], "fallback": {"message": {"messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50"}}}}}"#
        let catalog = try OfferCatalog(jsonData: Self.catalog(good))
        #expect(catalog.app(appAppleID: 1)?.retention?.products["p.monthly"]?.offers.first?.messageIdentifier == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f", "lowercased")
        let bad: [(String, String)] = [
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "nope", "messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f"}]}}}"#, "not an offer"),
            (#"{"products": {"p.yearly": {"offers": [{"offerID": "keep", "messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f"}]}}}"#, "does not apply"),
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": "hello"}]}}}"#, "UUID"),
            (#"{"signatureVersion": "v3", "products": {}}"#, "v1"),
            (#"{"products": {"p.monthly": {"fallback": {"message": {}, "alternateProduct": {}}}}}"#, "alternateProduct"),
            (#"{"products": {"p.monthly": {"fallback": {"alternateProduct": {"messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f"}}}}}"#, "productID"),
        ]
        for (retention, message) in bad {
            #expect {
                _ = try OfferCatalog(jsonData: Self.catalog(retention))
            } throws: { error in
                "\(error)".contains(message) && "\(error)".contains("retention")
            }
        }
    }

    @Test("Message identifiers per locale: the locale, else its language, else the default; a default is required and locales are checked")
    func localizedMessages() throws {
        let plan = #"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": {"default": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e40", "en-US": "8C1B9D2E-5F4A-4C3B-9E2D-1A0B7C6D5E41", "de": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e42", "pt_BR": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e43"}}]}}}"#
        let catalog = try OfferCatalog(jsonData: Self.catalog(plan))
        let message = try #require(catalog.app(appAppleID: 1)?.retention?.products["p.monthly"]?.offers.first?.message)
        #expect(message.identifier(for: "en-US") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e41", "exact, lowercased")
        #expect(message.identifier(for: "en_us") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e41", "case and _ do not matter")
        #expect(message.identifier(for: "de-CH") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e42", "the language alone")
        #expect(message.identifier(for: "pt-BR") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e43")
        #expect(message.identifier(for: "pt-PT") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e40", "pt_BR is not pt")
        #expect(message.identifier(for: "en-GB") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e40", "en-US is not en")
        #expect(message.identifier(for: nil) == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e40")
        #expect(message.identifier(for: "") == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e40")
        let uuid = "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f"
        let bad: [(String, String)] = [
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": {"en-US": "\#(uuid)"}}]}}}"#, "default"),
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": {"default": "\#(uuid)", "english": "\#(uuid)"}}]}}}"#, "not a locale"),
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": {"default": "\#(uuid)", "en-US": "\#(uuid)", "en_us": "\#(uuid)"}}]}}}"#, "twice"),
            (#"{"products": {"p.monthly": {"offers": [{"offerID": "keep", "messageIdentifier": {"default": "\#(uuid)", "de": "hello"}}]}}}"#, "UUID"),
            (#"{"products": {"p.monthly": {"fallback": {"message": {"messageIdentifier": {"default": 7}}}}}}"#, "UUID"),
        ]
        for (retention, message) in bad {
            #expect {
                _ = try OfferCatalog(jsonData: Self.catalog(retention))
            } throws: { error in
                "\(error)".contains(message) && "\(error)".contains("retention")
            }
        }
    }

    static func groupsCatalog(_ fallback: String, groups: String? = nil) -> Data {
        let declared = groups.map { #", "subscriptionGroups": \#($0)"# } ?? ""
        return Data(#"""
            {"apps": {"com.example.app": {"appAppleID": 1\#(declared), "retention": {"products": {"p.monthly": {
                "offers": [{"offerID": "keep", "messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e4f"}], "fallback": \#(fallback)}}}}},
             "offers": [
              {"offerID": "keep", "bundleID": "com.example.app", "productIDs": ["p.monthly"], "subscriptionGroupID": "G", "kind": "retention"},
              {"offerID": "yearly", "bundleID": "com.example.app", "productIDs": ["p.yearly"], "subscriptionGroupID": "G", "kind": "any"},
              {"offerID": "other", "bundleID": "com.example.app", "productIDs": ["q.monthly"], "subscriptionGroupID": "H", "kind": "any"}]}
            """#.utf8)
    }

    static func alternate(_ productID: String, billing: String? = nil) -> String {
        let billingPlanType = billing.map { #", "billingPlanType": "\#($0)""# } ?? ""
        return #"{"alternateProduct": {"messageIdentifier": "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50", "productID": "\#(productID)"\#(billingPlanType)}}"#
    }

    @Test("A switch-plan suggestion stays in the offer's subscription group (known from offers or apps.<bundle>.subscriptionGroups) and takes Apple's billingPlanType values")
    func alternateProductGroupAndBillingPlanType() throws {
        let fromOffers = try OfferCatalog(jsonData: Self.groupsCatalog(Self.alternate("p.yearly", billing: "MONTHLY")))
        #expect(
            fromOffers.app(appAppleID: 1)?.retention?.products["p.monthly"]?.fallback
                == .alternateProduct(LocalizedMessageIdentifier(default: "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50"), productID: "p.yearly", billingPlanType: .monthly))
        let declared = try OfferCatalog(jsonData: Self.groupsCatalog(Self.alternate("p.weekly", billing: "BILLED_UPFRONT"), groups: #"{"G": ["p.weekly"]}"#))
        #expect(declared.app(appAppleID: 1)?.retention?.products["p.monthly"]?.fallback
            == .alternateProduct(LocalizedMessageIdentifier(default: "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50"), productID: "p.weekly", billingPlanType: .billedUpfront))
        let bad: [(Data, String)] = [
            (Self.groupsCatalog(Self.alternate("q.monthly")), "subscription group H, not G"),
            (Self.groupsCatalog(Self.alternate("p.weekly")), "group of 'p.weekly' is unknown"),
            (Self.groupsCatalog(Self.alternate("p.monthly")), "the product itself"),
            (Self.groupsCatalog(Self.alternate("p.weekly"), groups: #"{"H": ["p.weekly"]}"#), "not G"),
            (Self.groupsCatalog(Self.alternate("p.yearly"), groups: #"{"H": ["p.yearly"]}"#), "several subscription groups"),
            (Self.groupsCatalog(Self.alternate("p.yearly"), groups: #"{"G": ["p.x"], "H": ["p.x"]}"#), "exactly one"),
            (Self.groupsCatalog(Self.alternate("p.yearly", billing: "WEEKLY")), "BILLED_UPFRONT, MONTHLY"),
            (Self.groupsCatalog(Self.alternate("p.yearly"), groups: #"["p.yearly"]"#), "subscriptionGroups"),
        ]
        for (data, message) in bad {
            #expect {
                _ = try OfferCatalog(jsonData: data)
            } throws: { error in
                "\(error)".contains(message)
            }
        }
    }
}

