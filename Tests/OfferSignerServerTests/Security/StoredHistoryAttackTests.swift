import AppleTestChain
import FakeAppStoreServerAPI
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import Testing

/// Stored Apple history against a database writer without the master key: what decides comes
/// from the stored JWS, verified again when the history is read, never from the decoded column.
/// Docs/Security.md names these tests. (In `AppleNotificationTests`' suite, for its server,
/// catalog and notification helpers.)
extension AppleNotificationTests {
    /// SQL on the server's SQLite store behind its back; then the subscription's version moves on,
    /// as any write would, so the server reads the history again.
    static func tamper(_ server: TestServer, _ statements: [String], originalTransactionID: String) async throws {
        let queue = try DatabaseQueue(path: server.storePath)
        try await queue.write { db in
            for statement in statements { try db.execute(sql: statement) }
            try db.execute(sql: "UPDATE apple_subscriptions SET updated_at = updated_at + 1 WHERE original_transaction_id = ?", arguments: [originalTransactionID])
        }
    }

    @Test("A refund erased from the stored decoded column (the JWS kept) still applies: the decision comes from the stored JWS, verified again")
    func editedDecodedColumnIsNotBelieved() async throws {
        let customer = subscriber()
        try await withServer { server, fake, secret, client in
            try await postEveryPeriod(of: customer, to: client)
            var refunded = customer.transactionPayload(5)
            refunded["revocationDate"] = TestAppleChain.milliseconds(now)
            refunded["revocationReason"] = 0
            refunded["signedDate"] = TestAppleChain.milliseconds(now)
            #expect(try await client.postJSON("/v1/apple/notifications", try body("REFUND", transaction: refunded)).status == .ok)
            let question = #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","offerIDs":["loyal_no_refunds"]}"#
            let before = try #require((try await client.postJSON("/v1/offers/eligibility", question, bearer: secret).json["decisions"] as? [[String: Any]])?.first)
            #expect(before["eligible"] as? Bool == false)

            // The attacker removes the refund from every decoded column that names it.
            let queue = try DatabaseQueue(path: server.storePath)
            let rows = try await queue.read { db in
                try Row.fetchAll(db, sql: "SELECT transaction_id, decoded FROM apple_transactions").map { ($0["transaction_id"] as String, $0["decoded"] as String) }
            }
            var statements: [String] = []
            for (transactionID, decoded) in rows where decoded.contains("revocation") {
                var object = try #require(try JSONSerialization.jsonObject(with: Data(decoded.utf8)) as? [String: Any])
                for key in object.keys where key.lowercased().contains("revocation") { object.removeValue(forKey: key) }
                let edited = String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]), as: UTF8.self)
                statements.append("UPDATE apple_transactions SET decoded = '\(edited)' WHERE transaction_id = '\(transactionID)'")
            }
            #expect(!statements.isEmpty, "the refund is in a decoded column")
            try await Self.tamper(server, statements, originalTransactionID: customer.originalTransactionID)

            let after = try #require((try await client.postJSON("/v1/offers/eligibility", question, bearer: secret).json["decisions"] as? [[String: Any]])?.first)
            #expect(after["eligible"] as? Bool == false, "\(after)")
            #expect((after["reasons"] as? [String])?.contains("refunded") == true, "\(after)")
            #expect(fake.arrivals == 0, "the stored history still decided (its JWS verify)")
        }
    }

    @Test("A stored row whose JWS was swapped (another genuine transaction's, or one signed by another chain) makes the stored history refused: Apple's API is asked instead")
    func swappedJWSRefusesTheStoredHistory() async throws {
        let customer = subscriber()
        for forgedByAnotherChain in [false, true] {
            try await withServer { server, fake, secret, client in
                try await postEveryPeriod(of: customer, to: client)
                let question = #"{"appAccountToken":"\#(Self.token)","transactionID":"\#(customer.originalTransactionID)","offerIDs":["wb_apple"]}"#
                _ = try await client.postJSON("/v1/offers/eligibility", question, bearer: secret)
                #expect(fake.arrivals == 0, "the stored history decided")

                let queue = try DatabaseQueue(path: server.storePath)
                let firstJWS = try #require(try await queue.read { db in
                    try String.fetchOne(db, sql: "SELECT jws FROM apple_transactions WHERE transaction_id = ?", arguments: [customer.transactionID(0)])
                })
                let replacement = forgedByAnotherChain ? try TestAppleChain().signJWS(customer.transactionPayload(5)) : firstJWS
                try await Self.tamper(
                    server, ["UPDATE apple_transactions SET jws = '\(replacement)' WHERE transaction_id = '\(customer.transactionID(5))'"],
                    originalTransactionID: customer.originalTransactionID)

                let answer = try await client.postJSON("/v1/offers/eligibility", question, bearer: secret)
                #expect(answer.status == .ok, "\(answer.text)")
                #expect(!fake.requests.isEmpty, "the tampered stored history was used instead of asking Apple")
            }
        }
    }
}
