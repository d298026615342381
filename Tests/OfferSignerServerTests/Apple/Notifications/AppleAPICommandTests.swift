import AppStoreServerAPI
import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
@testable import OfferSignerServer
import OfferSignerStorage
import SwiftASN1
import Testing

/// `notifications test` and `transactions set-app-account-token`, the real CLI as a child process,
/// against the fake App Store Server API and a real server on loopback.
@Suite("App Store Server API commands", .serialized)
struct AppleAPICommandTests {
    static let bundleID = AppleNotificationTests.bundleID
    let chain: TestAppleChain

    init() throws {
        chain = try TestAppleChain()
    }

    /// A live server with the catalog, the fake API on the side, and the CLI's arguments.
    func withSetUp(_ body: @escaping @Sendable (TestServer, FakeAppStoreServerAPI, [String], Int) async throws -> Void) async throws {
        let server = try await TestServer(bundles: [Self.bundleID])
        defer { server.cleanUp() }
        let key = try #require(server.keys[Self.bundleID])
        let fake = FakeAppStoreServerAPI(bundleID: Self.bundleID, keyID: key.keyID, issuerID: TestServer.issuerID, publicKey: key.publicKey)
        fake.setNotificationSigner(chain)
        let root = try chain.root.serializeAsPEM().pemString
        let chain = self.chain
        try await fake.run { port in
            var running = server
            running.configuration.eligibility = try EligibilityConfiguration(
                catalogJSON: Data(AppleNotificationTests.catalog(port: port).utf8), trustedRootPEMs: [root])
            let configured = running
            let arguments = try NotificationRecoveryTests.cliFiles(server: configured, chain: chain, port: port)
            try await configured.live { client in
                try await body(configured, fake, arguments, try #require(client.port))
            }
        }
    }

    @Test("notifications test: Apple's test notification reaches the endpoint, is stored, and Apple's SUCCESS is printed; an unreachable URL exits 1 with Apple's NO_RESPONSE")
    func testNotificationRoundTrip() async throws {
        try await withSetUp { server, fake, arguments, port in
            fake.setNotificationURL("http://127.0.0.1:\(port)/v1/apple/notifications", environment: "Production")
            let result = try await NotificationRecoveryTests.offerSigner(["notifications", "test"] + arguments + ["--json", "--wait-seconds", "30"])
            #expect(result.status == 0, "\(result.stdout) \(result.stderr)")
            let outcome = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any], "\(result.stdout) \(result.stderr)")
            #expect(outcome["arrived"] as? Bool == true)
            #expect(outcome["sendAttemptResult"] as? String == "SUCCESS")
            let uuid = try #require(outcome["notificationUUID"] as? String)
            #expect(try await server.store.appleNotificationReceivedAt(notificationUUID: uuid) != nil, "stored by the endpoint")
            #expect(fake.requests.contains { $0.endpoint == .requestTestNotification && $0.answeredStatus == 200 })
            #expect(fake.requests.contains { $0.endpoint == .testNotificationStatus && $0.answeredStatus == 200 })

            fake.setNotificationURL("http://127.0.0.1:9/v1/apple/notifications", environment: "Production")
            let lost = try await NotificationRecoveryTests.offerSigner(["notifications", "test"] + arguments + ["--wait-seconds", "8"])
            #expect(lost.status == 1, "\(lost.stdout) \(lost.stderr)")
            #expect(lost.stderr.contains("did not reach the service") && lost.stderr.contains("NO_RESPONSE"), "\(lost.stderr)")
            #expect(lost.stdout.contains("arrived: no"))
        }
    }

    @Test("transactions set-app-account-token: Apple's PUT with the token as its body; an unknown transaction and a token that is no UUID are clear failures")
    func setAppAccountToken() async throws {
        try await withSetUp { _, fake, arguments, _ in
            fake.add(.init(environment: "Production", transactionIDs: ["400000001"], signedTransactions: [], statuses: []))
            let token = "7E3FB20B-4CDB-47CC-936D-99D65F608138"
            let set = try await NotificationRecoveryTests.offerSigner(
                ["transactions", "set-app-account-token"] + arguments + ["--original-transaction-id", "400000001", "--app-account-token", token])
            #expect(set.status == 0, "\(set.stdout) \(set.stderr)")
            #expect(fake.appAccountTokens["400000001"] == token.lowercased())
            let request = try #require(fake.requests.first { $0.endpoint == .setAppAccountToken })
            #expect(request.token?.problems == [])
            let body = try #require(try JSONSerialization.jsonObject(with: Data((request.body ?? "").utf8)) as? [String: String])
            #expect(body == ["appAccountToken": token.lowercased()])

            let unknown = try await NotificationRecoveryTests.offerSigner(
                ["transactions", "set-app-account-token"] + arguments + ["--original-transaction-id", "999", "--app-account-token", token])
            #expect(unknown.status == 1 && unknown.stderr.contains("4040005"), "\(unknown.stderr)")
            let notUUID = try await NotificationRecoveryTests.offerSigner(
                ["transactions", "set-app-account-token"] + arguments + ["--original-transaction-id", "400000001", "--app-account-token", "abc"])
            #expect(notUUID.status != 0 && notUUID.stderr.contains("not a UUID"), "\(notUUID.stderr)")
        }
    }

    @Test("notifications recover --since: a start outside Apple's window (180 days in Production, 30 in Sandbox) is refused with a clear error, before asking Apple")
    func recoverRefusesAStartOutsideApplesWindow() async throws {
        try await withSetUp { _, fake, arguments, _ in
            let formatter = ISO8601DateFormatter()
            let production = try await NotificationRecoveryTests.offerSigner(
                ["notifications", "recover"] + arguments + ["--since", formatter.string(from: Date().addingTimeInterval(-181 * 86_400))])
            #expect(production.status != 0, "\(production.stdout) \(production.stderr)")
            #expect(production.stderr.contains("within the past 180 days in Production"), "\(production.stderr)")
            let sandbox = try await NotificationRecoveryTests.offerSigner(
                ["notifications", "recover"] + arguments.filter { !$0.hasPrefix("--environment") }
                    + ["--environment", "Sandbox", "--since", formatter.string(from: Date().addingTimeInterval(-31 * 86_400))])
            #expect(sandbox.status != 0, "\(sandbox.stdout) \(sandbox.stderr)")
            #expect(sandbox.stderr.contains("within the past 30 days in Sandbox"), "\(sandbox.stderr)")
            #expect(!fake.requests.contains { $0.endpoint == .notificationHistory }, "Apple was not asked")
        }
    }
}
