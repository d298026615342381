import Foundation
import OfferSignerCore
import OfferSignerStorage
import Testing

/// The store reads the dashboard (`/admin`) makes, the same on SQLite and PostgreSQL: bounded by
/// their window, per UTC day, and in agreement with the report's own counts.
@Suite("Store conformance: the dashboard's reads")
struct DashboardStoreConformanceTests {
    static let bundle = "com.example.app"

    static func signature(_ nonce: String, offer: String, at: Date, client: String = "client:backend", token: String? = "tok-1", format: String = "legacy") -> IssuedSignature {
        IssuedSignature(
            nonce: nonce, issuedAt: at, client: client, bundleID: bundle, productID: "pro.monthly", offerID: offer, appAccountToken: token, keyID: "KEY1234567",
            format: format)
    }

    @Test("Issuances per offer and UTC day inside the window (the roll-up; a partial first day from the ledger), their totals equal offerIssuances after signatures, withdrawals and a store copy; notifications per type and day; the last one per app and environment; clients' last issuance; the last audit verification", arguments: StoreBackend.testedCases)
    func dashboardReads(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let day: TimeInterval = 86_400
            // Noon UTC today, so that "an hour earlier" stays on the same UTC day.
            let today = (Date().timeIntervalSince1970 / day).rounded(.down) * day
            let noon = Date(timeIntervalSince1970: today + day / 2)
            let since = Date(timeIntervalSince1970: today - 2 * day)
            // One request in two formats (one issuance), two more today, one yesterday, one before the window.
            let both = [Self.signature("n1", offer: "A", at: noon), Self.signature("n2", offer: "A", at: noon, format: "jws")]
            _ = try await store.appendAudit([AuditAppend(entry: both[0].auditEntry, signatures: both)], at: noon)
            for (nonce, offer, at, client) in [
                ("n3", "A", noon.addingTimeInterval(-3600), "client:backend"), ("n4", "B", noon, "client:other"), ("n5", "A", noon.addingTimeInterval(-day), "client:backend"),
                ("n6", "A", noon.addingTimeInterval(-5 * day), "client:old"),
            ] {
                let signature = Self.signature(nonce, offer: offer, at: at, client: client)
                _ = try await store.appendAudit([AuditAppend(entry: signature.auditEntry, signatures: [signature])], at: at)
            }
            let perDay = try await store.offerIssuancesPerDay(since: since)
            let todayIndex = Int64(today / day)
            #expect(
                perDay == [
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "A", day: todayIndex - 1, issuances: 1),
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "A", day: todayIndex, issuances: 2),
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "B", day: todayIndex, issuances: 1),
                ], "\(perDay)")
            #expect(OfferIssuanceDay.totals(perDay) == (try await store.offerIssuances(since: since)))
            #expect(OfferIssuanceDay.totals(try await store.offerIssuancesPerDay(since: .distantPast)) == (try await store.offerIssuances(since: nil)))

            let last = try await store.lastIssuances(clients: ["client:backend", "client:other", "client:old", "client:none"], since: since)
            #expect(last == ["client:backend": noon, "client:other": noon], "the old client's only issuance is before the window")
            #expect(try await store.lastIssuances(clients: [], since: since).isEmpty)

            // A window that starts after midnight: its first day is counted from the ledger.
            let halfPastEleven = noon.addingTimeInterval(-1800)
            #expect(
                try await store.offerIssuancesPerDay(since: halfPastEleven) == [
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "A", day: todayIndex, issuances: 1),
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "B", day: todayIndex, issuances: 1),
                ])
            #expect(OfferIssuanceDay.totals(try await store.offerIssuancesPerDay(since: halfPastEleven)) == (try await store.offerIssuances(since: halfPastEleven)))
            #expect(try await store.lastIssuances(clients: ["client:backend"], since: noon.addingTimeInterval(1)).isEmpty, "the roll-up keeps each day's newest time")

            // Withdrawals: one format of the two-format request (the issuance stays), an issuance
            // of A and the only one of client:other. The roll-up still equals the ledger's count.
            #expect(try await store.withdrawIssuedSignatures(nonces: ["n2", "n3", "n4", "never-issued"]) == 3)
            let afterWithdrawal = try await store.offerIssuancesPerDay(since: since)
            #expect(
                afterWithdrawal == [
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "A", day: todayIndex - 1, issuances: 1),
                    OfferIssuanceDay(bundleID: Self.bundle, offerID: "A", day: todayIndex, issuances: 1),
                ], "\(afterWithdrawal)")
            #expect(OfferIssuanceDay.totals(try await store.offerIssuancesPerDay(since: .distantPast)) == (try await store.offerIssuances(since: nil)))
            #expect(try await store.lastIssuances(clients: ["client:backend", "client:other"], since: since) == ["client:backend": noon])

            // A copy into a new store of the same engine has the same roll-up, equal to its ledger.
            try await StoreFixture.with(backend) { copy in
                _ = try await StoreCopy.copy(from: store, to: copy.store)
                let copied = try await copy.store.offerIssuancesPerDay(since: .distantPast)
                #expect(copied == (try await store.offerIssuancesPerDay(since: .distantPast)))
                #expect(OfferIssuanceDay.totals(copied) == (try await copy.store.offerIssuances(since: nil)))
                #expect(try await copy.store.lastIssuances(clients: ["client:backend", "client:old"], since: .distantPast) == ["client:backend": noon, "client:old": noon.addingTimeInterval(-5 * day)])
            }

            func receipt(_ uuid: String, type: String, environment: String = "Production", at: Date) -> AppleHistoryUpdate {
                AppleHistoryUpdate(
                    notification: AppleNotificationReceipt(
                        notificationUUID: uuid, bundleID: Self.bundle, environment: environment, notificationType: type, subtype: nil, originalTransactionID: "1000",
                        signedDate: at, receivedAt: at),
                    source: "notification")
            }
            for update in [
                receipt("u1", type: "DID_RENEW", at: noon), receipt("u2", type: "DID_RENEW", at: noon.addingTimeInterval(60)),
                receipt("u3", type: "OFFER_REDEEMED", at: noon.addingTimeInterval(-day)), receipt("u4", type: "DID_RENEW", at: noon.addingTimeInterval(-9 * day)),
                receipt("u5", type: "TEST", environment: "Sandbox", at: noon.addingTimeInterval(-9 * day)),
            ] {
                _ = try await store.recordAppleHistory(update, at: noon)
            }
            let notifications = try await store.appleNotificationsPerDay(since: since)
            #expect(
                notifications == [
                    AppleNotificationDay(bundleID: Self.bundle, environment: "Production", notificationType: "DID_RENEW", day: todayIndex, received: 2),
                    AppleNotificationDay(bundleID: Self.bundle, environment: "Production", notificationType: "OFFER_REDEEMED", day: todayIndex - 1, received: 1),
                ], "\(notifications)")
            #expect(try await store.lastAppleNotificationReceived(bundleID: Self.bundle, environment: "Production") == noon.addingTimeInterval(60))
            #expect(try await store.lastAppleNotificationReceived(bundleID: Self.bundle, environment: "Sandbox") == noon.addingTimeInterval(-9 * day))
            #expect(try await store.lastAppleNotificationReceived(bundleID: "com.example.other", environment: "Production") == nil)

            #expect(try await store.lastAuditVerification() == nil)
            let first = AuditVerificationRecord(verifiedAt: Date(timeIntervalSince1970: 1_790_000_000.5), recordsChecked: 5, throughSequence: 5, headHash: "abc")
            try await store.recordAuditVerification(first)
            #expect(try await store.lastAuditVerification() == first)
            let second = AuditVerificationRecord(verifiedAt: Date(timeIntervalSince1970: 1_790_000_100), recordsChecked: 6, throughSequence: 6, headHash: "def")
            try await store.recordAuditVerification(second)
            #expect(try await store.lastAuditVerification() == second, "replaced, not added")
            #expect(try await store.verifiedChain().isIntact, "the dashboard's writes never touch the chain")
        }
    }
}
