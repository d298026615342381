import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerServer
import OfferSignerStorage
import Testing

/// One deadline covers a Retention Messaging answer, from arrival to the last byte: a request
/// whose audit commit cannot land in time gets the fallback within it, and no signature the
/// customer did not get counts (real server, SQLite and PostgreSQL, commits held back by another
/// connection holding the audit log's write lock).
@Suite("Retention Messaging: the end-to-end deadline", .serialized)
struct RetentionDeadlineTests {
    static let offerMessage = "5d0e8a2e-1111-4c1e-9a43-0123456789ab"
    static let fallbackMessage = "5d0e8a2e-2222-4c1e-9a43-0123456789ab"
    static let budget = Duration.milliseconds(500)

    static func catalog(port: Int) -> String {
        #"""
        {"apps": {"com.example.app": {"appAppleID": 1234567890, "environments": ["Production"], "notificationHistory": true,
                  "appStoreServerAPI": {"productionURL": "http://127.0.0.1:\#(port)/production"},
                  "retention": {"products": {"pro.monthly": {
                      "offers": [{"offerID": "retain_50", "messageIdentifier": "\#(offerMessage)"}],
                      "fallback": {"message": {"messageIdentifier": "\#(fallbackMessage)"}}}}}}},
         "offers": [
          {"offerID": "retain_50", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1",
           "kind": "retention", "historySource": "apple", "rules": {"minPaidMonths": 3, "waitBetweenOffersMonths": 12}}
        ]}
        """#
    }

    @Test(
        "Commits held past the deadline: both answers are the fallback within it; the queued signature is never written, the one committed late is withdrawn and counts for nothing",
        arguments: StoreBackend.testedCases)
    func commitSlowerThanTheDeadline(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:), configure: { $0.retention.budget = Self.budget }) { h in
            let first = h.subscriber(months: 6, id: "600000001", token: "11111111-aaaa-4aaa-8aaa-000000000001")
            let second = h.subscriber(months: 6, id: "600000002", token: "11111111-aaaa-4aaa-8aaa-000000000002")
            try await h.notify(first)
            try await h.notify(second)
            let firstID = UUID().uuidString.lowercased()
            let secondID = UUID().uuidString.lowercased()
            let firstBody = try h.request(first.originalTransactionID, requestIdentifier: firstID)
            let secondBody = try h.request(second.originalTransactionID, requestIdentifier: secondID)

            let hold = try await h.holdAuditWrites()
            // The first request's commit is taken by the writer, which then waits for the lock;
            // the second one's is queued behind it.
            async let firstAnswer = h.postConcurrently(firstBody)
            try await Task.sleep(for: .milliseconds(150))
            async let secondAnswer = h.postConcurrently(secondBody)
            let answers = try await [firstAnswer, secondAnswer]
            // Past both deadlines before the commits may go on.
            try await Task.sleep(for: .milliseconds(200))
            try await hold.release()

            for answer in answers {
                #expect(answer.status == .ok)
                #expect(Array(answer.json.keys) == ["message"], "the fallback: \(answer.json)")
                #expect((answer.json["message"] as? [String: Any])?["messageIdentifier"] as? String == Self.fallbackMessage)
                // The server answers at its 500 ms deadline; the rest is slack for loopback on a
                // loaded machine (the commits waited about a second longer).
                #expect(answer.elapsed < .milliseconds(1000), "answered after \(answer.elapsed)")
            }

            // The first request's group lands once the lock is released, and is then withdrawn:
            // the withdrawal's record first, then the ledger row goes (both under the customer's lock).
            let firstToken = try #require(first.appAccountToken)
            let deadline = ContinuousClock.now + .seconds(30)
            while ContinuousClock.now < deadline {
                let withdrawnYet = try await !h.audited("signature.withdrawn").isEmpty
                if withdrawnYet, try await h.store.issuedSignatures(appAccountToken: firstToken, bundleID: RetentionHarness.bundleID).isEmpty { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            let issued = try await h.audited("signature.issued")
            let withdrawn = try await h.audited("signature.withdrawn")
            #expect(issued.filter { $0["nonce"] as? String == secondID }.isEmpty, "the queued signature was never written")
            #expect(try await h.audited("retention.answered").filter { $0["requestIdentifier"] as? String == secondID }.isEmpty)
            #expect(issued.map { $0["nonce"] as? String } == [firstID], "the first one's commit was under way at its deadline: \(issued)")
            #expect(withdrawn.map { $0["nonce"] as? String } == [firstID], "and is withdrawn: \(withdrawn)")
            #expect(withdrawn.first?["reason"] as? String == "answered_after_deadline")
            #expect(withdrawn.first?["retentionRequestIdentifier"] as? String == firstID)
            for customer in [first, second] {
                let ledger = try await h.store.issuedSignatures(appAccountToken: try #require(customer.appAccountToken), bundleID: RetentionHarness.bundleID)
                #expect(ledger.isEmpty, "no ledger row counts a signature the customer never saw: \(ledger)")
            }
            #expect(try await h.store.verifiedChain().isIntact)
            let metrics = try await h.client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"retention_fallbacks_total{reason="deadline"} 2"#), "\(metrics.split(separator: "\n").filter { $0.contains("retention") })")

            // With the store quick again, the customer's next page view gets the offer: the
            // withdrawn signature counted for nothing (the rule allows one a year).
            let again = try await h.post(try h.request(first.originalTransactionID))
            #expect(again.status == .ok, "\(again.text)")
            #expect(RetentionHarness.members(again) == ["promotionalOffer"], "\(again.text)")
        }
    }

    @Test("With a quick store the offer is answered well within the deadline, its signature audited and in the ledger", arguments: StoreBackend.testedCases)
    func quickStoreAnswersTheOffer(_ backend: StoreBackend) async throws {
        try await RetentionHarness.run(backend, catalog: Self.catalog(port:), configure: { $0.retention.budget = .seconds(5) }) { h in
            let customer = h.subscriber(months: 6, id: "600000003", token: "11111111-aaaa-4aaa-8aaa-000000000003")
            try await h.notify(customer)
            let requestIdentifier = UUID().uuidString.lowercased()
            let answer = try await h.postConcurrently(try h.request(customer.originalTransactionID, requestIdentifier: requestIdentifier))
            #expect(answer.status == .ok)
            #expect(Array(answer.json.keys) == ["promotionalOffer"], "\(answer.json)")
            #expect(try await h.audited("signature.issued").map { $0["nonce"] as? String } == [requestIdentifier])
            #expect(try await h.audited("signature.withdrawn").isEmpty)
            let ledger = try await h.store.issuedSignatures(appAccountToken: try #require(customer.appAccountToken), bundleID: RetentionHarness.bundleID)
            #expect(ledger.map(\.signature.nonce) == [requestIdentifier])
        }
    }
}
