import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing

/// A dashboard page parsed as XML (the pages are XHTML: a parse failure fails the test).
final class ParsedPage: NSObject, XMLParserDelegate, @unchecked Sendable {
    final class Node {
        let name: String
        let attributes: [String: String]
        var children: [Node] = []
        var text = ""
        init(name: String, attributes: [String: String]) {
            self.name = name
            self.attributes = attributes
        }

        /// This node's text and its descendants'.
        var allText: String { text + children.map(\.allText).joined() }

        func all(_ name: String) -> [Node] {
            (self.name == name ? [self] : []) + children.flatMap { $0.all(name) }
        }

        func all(where predicate: (Node) -> Bool) -> [Node] {
            (predicate(self) ? [self] : []) + children.flatMap { $0.all(where: predicate) }
        }
    }

    private var stack: [Node] = []
    private(set) var root: Node?
    private(set) var error: String?

    init(_ markup: String) {
        super.init()
        let parser = XMLParser(data: Data(markup.utf8))
        parser.delegate = self
        if !parser.parse() { error = parser.parserError.map { "\($0)" } ?? "the page is not well-formed XML" }
    }

    func parser(_ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?, qualifiedName: String?, attributes: [String: String] = [:]) {
        let node = Node(name: elementName, attributes: attributes)
        stack.last?.children.append(node)
        if stack.isEmpty { root = node }
        stack.append(node)
    }

    func parser(_ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName: String?) {
        _ = stack.popLast()
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        stack.last?.text += string
    }

    /// `<main data-page>`.
    var page: String? { root?.all("main").first?.attributes["data-page"] }
    /// The charts (`<svg class="chart">`) and their data marks (rect, circle, line with a title).
    var charts: [Node] { root?.all { $0.name == "svg" && $0.attributes["class"] == "chart" } ?? [] }
    func dataMarks(_ chart: Node) -> [Node] {
        chart.all { ["rect", "circle", "line"].contains($0.name) && $0.children.contains { $0.name == "title" } }
    }

    func attributed(_ name: String, _ value: String? = nil) -> [Node] {
        root?.all { node in node.attributes[name] != nil && (value == nil || node.attributes[name] == value) } ?? []
    }
}

/// The real server on loopback with the dashboard on, an offers catalog with Retention
/// Messaging, Apple's test chain, an API client, on a fresh store of either backend.
struct DashboardHarness: Sendable {
    static let adminSecret = "test-admin-token-abcdefghijklmnopqrstuvwxyz-0123"
    let apple: RetentionHarness
    let masterKey: MasterKey
    let masterKeyBase64: String
    let clientSecret: String
    let clientHash: String
    var client: any TestClientProtocol { apple.client }
    var store: any OfferSignerStore { apple.store }

    static func run(_ backend: StoreBackend, _ body: @escaping @Sendable (DashboardHarness) async throws -> Void) async throws {
        let chain = try TestAppleChain()
        try await StoreFixture.with(backend) { fixture in
            let (masterKey, masterKeyBase64) = MasterKey.generate()
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: "DASHKEY001")
            _ = try await KeyRegistry.importKey(
                key, bundleID: RetentionHarness.bundleID, issuerID: TestServer.issuerID, development: true, into: fixture.store, masterKey: masterKey,
                actor: "test", reason: nil)
            let (record, secret) = try await APIClientCredentials.create(
                in: fixture.store, name: "backend", bundleIDs: [RetentionHarness.bundleID], actor: "test", masterKey: masterKey)
            var configuration = ServerConfiguration(masterKey: masterKey, logger: StoreFixture.quietLogger)
            configuration.operatorToken = TestServer.operatorToken
            configuration.adminToken = try AdminToken(adminSecret)
            configuration.host = "127.0.0.1"
            configuration.port = 0
            configuration.registryPollInterval = .milliseconds(50)
            configuration.clientRateLimit = .unlimited
            configuration.appAccountTokenRateLimit = .unlimited
            configuration.storeTimeout = .seconds(60)
            configuration.retention.budget = .seconds(30)
            let fake = FakeAppStoreServerAPI(bundleID: RetentionHarness.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
            let root = try chain.root.serializeAsPEM().pemString
            let base = configuration
            try await fake.run { port in
                var eligibility = try EligibilityConfiguration(catalogJSON: Data(RetentionAppleRulesTests.catalog(port: port).utf8), trustedRootPEMs: [root])
                eligibility.appStoreServerAPI.timeBudget = .seconds(30)
                var serving = base
                serving.eligibility = eligibility
                let application = try await buildApplication(configuration: serving, store: fixture.store)
                try await application.test(.live) { client in
                    let apple = RetentionHarness(fixture: fixture, chain: chain, key: key, masterKey: masterKey, client: client, now: Date())
                    try await body(
                        DashboardHarness(
                            apple: apple, masterKey: masterKey, masterKeyBase64: masterKeyBase64, clientSecret: secret, clientHash: record.secretHash))
                }
            }
        }
    }

    /// A page with the admin token.
    func page(_ path: String, sourceLocation: SourceLocation = #_sourceLocation) async throws -> (response: TestResponse, parsed: ParsedPage) {
        let response = try await client.execute(uri: path, method: .get, headers: [.authorization: "Bearer \(Self.adminSecret)"])
        #expect(response.status == .ok, "\(path): \(response.text)", sourceLocation: sourceLocation)
        let parsed = ParsedPage(response.text)
        #expect(parsed.error == nil, "\(path) is not well-formed: \(parsed.error ?? "")", sourceLocation: sourceLocation)
        return (response, parsed)
    }

    /// An OFFER_REDEEMED notification as Apple sends it, for a purchase of `offerID` by `token`.
    func offerRedeemed(transactionID: String, offerID: String, token: String?, purchasedAt: Date) throws -> String {
        let customer = apple.subscriber(months: 2, id: "60000\(transactionID.suffix(4))", token: token ?? "00000000-0000-4000-8000-000000000000")
        var transaction = customer.transactionPayload(1)
        transaction["transactionId"] = transactionID
        transaction["purchaseDate"] = TestAppleChain.milliseconds(purchasedAt)
        transaction["offerType"] = 2
        transaction["offerIdentifier"] = offerID
        if let token { transaction["appAccountToken"] = token.uppercased() } else { transaction["appAccountToken"] = nil }
        let data: [String: Any] = [
            "bundleId": RetentionHarness.bundleID, "environment": "Production", "bundleVersion": "1.0", "appAppleId": RetentionHarness.appAppleID,
            "signedTransactionInfo": try apple.chain.signJWS(transaction),
        ]
        let payload: [String: Any] = [
            "notificationType": "OFFER_REDEEMED", "subtype": "UPGRADE", "notificationUUID": UUID().uuidString, "data": data, "version": "2.0",
            "signedDate": TestAppleChain.milliseconds(Date()),
        ]
        return #"{"signedPayload":"\#(try apple.chain.signJWS(payload))"}"#
    }
}
