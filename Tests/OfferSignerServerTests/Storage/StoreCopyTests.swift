import Foundation
import OfferSignerCore
import OfferSignerStorage
import Synchronization
import Testing

@testable import OfferSignerServer

/// `store copy` at the library level: SQLite → PostgreSQL → SQLite keeps every key, client,
/// ledger row, audit record and checkpoint exactly, and the head hash.
@Suite("Store copy between engines")
struct StoreCopyTests {
    /// Every record, ledger row, checkpoint and the registry of `store`.
    /// Every row of every table of Apple's history.
    static func appleHistory(_ store: any OfferSignerStore) async throws -> [String: [[StoreValue]]] {
        var tables: [String: [[StoreValue]]] = [:]
        for table in AppleHistorySchema.tables {
            var rows: [[StoreValue]] = []
            while true {
                let page = try await store.appleHistoryRows(table: table, offset: rows.count, limit: 2)
                if page.isEmpty { break }
                rows += page
            }
            tables[table] = rows
        }
        return tables
    }

    static func everything(_ store: any OfferSignerStore) async throws -> (StoreCopyRegistry, [AuditRecord], [IssuedSignatureRecord], [AuditCheckpoint], String) {
        var records: [AuditRecord] = []
        while true {
            let page = try await store.auditRecords(after: records.last?.sequence ?? 0, limit: 10_000)
            if page.isEmpty { break }
            records += page
        }
        var ledger: [IssuedSignatureRecord] = []
        while true {
            let position = ledger.last.map { LedgerPosition(auditSequence: $0.auditSequence, nonce: $0.signature.nonce) }
            let page = try await store.ledger(after: position, limit: 10_000)
            if page.isEmpty { break }
            ledger += page
        }
        return (try await store.copyRegistry(), records, ledger, try await store.checkpoints(), try await store.auditHead().hash)
    }

    @Test("SQLite → PostgreSQL → SQLite: every record, ledger row, key, client and checkpoint, and the head hash; a non-empty target is refused")
    func roundTrip() async throws {
        try await StoreFixture.with(.sqlite) { original in
            let store = original.store
            let masterKey = MasterKey.generate().key
            _ = try await StoreConformanceTests.importKey(store, masterKey, id: "KEYCOPY001")
            _ = try await StoreConformanceTests.importKey(store, masterKey, id: "KEYCOPY002")
            _ = try await store.transitionKey(keyID: "KEYCOPY002", to: .active, actor: "ops", reason: nil, force: false, authenticator: masterKey.registryRows)
            _ = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: ["com.example.app"], actor: "ops", masterKey: masterKey)
            _ = try await store.revokeClient(name: "backend", actor: "ops", authenticator: masterKey.registryRows)
            // 12,000 signatures (two ledger rows for some, none for notes) in groups, checkpoints along the way.
            for group in 0..<40 {
                var appends: [AuditAppend] = []
                for index in 0..<300 {
                    var signatures = [AuditAppendTests.signature(token: index.isMultiple(of: 3) ? nil : "token-\(group)-\(index % 7)")]
                    if index.isMultiple(of: 50) { signatures.append(AuditAppendTests.signature(token: "pair-\(group)")) }
                    appends.append(AuditAppend(entry: signatures[0].auditEntry, signatures: signatures))
                }
                _ = try await store.appendAudit(appends, at: Date())
                if group.isMultiple(of: 10) { _ = try await AuditCheckpointing.create(in: store, masterKey: masterKey) }
            }
            // Apple's history: a notification, a fetched history, three redemptions (one matched,
            // one unplaced), and the notification catch-up's watermark.
            let base = Date()
            var unplaced = AppleHistoryStoreTests.redemption("1003", at: base.addingTimeInterval(1))
            unplaced.isPlaced = false
            let watermark = Date(timeIntervalSince1970: Double(base.unixMilliseconds / 1000) - 3600)
            try await store.setNotificationRecoveryWatermark(bundleID: AppleHistoryStoreTests.bundle, environment: "Production", recoveredUntil: watermark, at: base)
            // An issuance that keeps the customer's subscription and environment (ledger columns).
            var kept = AppleHistoryStoreTests.signature("copy-n1", at: base.addingTimeInterval(-60))
            kept.signatures[0].originalTransactionID = "1000"
            kept.signatures[0].environment = "Production"
            kept.entry = kept.signatures[0].auditEntry
            // And one whose environment the signing request only declared (`environment_declared`).
            // (Another customer's: the redemptions below stay as they are.)
            var declared = AppleHistoryStoreTests.signature("copy-n2", token: AppleHistoryStoreTests.otherToken, at: base.addingTimeInterval(-60)).signatures[0]
            declared.environment = "Sandbox"
            declared.environmentIsDeclared = true
            kept.signatures.append(declared)
            _ = try await store.appendAudit([kept], at: base)
            #expect(try await store.ledger(after: nil, limit: 100_000).contains { $0.signature.environment == "Production" && $0.signature.originalTransactionID == "1000" })
            #expect(try await store.ledger(after: nil, limit: 100_000).contains { $0.signature.environment == "Sandbox" && $0.signature.environmentIsDeclared })
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    notification: AppleHistoryStoreTests.receipt("copy-uuid", type: "OFFER_REDEEMED", subtype: nil),
                    transactions: [AppleHistoryStoreTests.transaction("1001", signedAt: base), AppleHistoryStoreTests.transaction("1002", signedAt: base)],
                    subscriptions: [AppleHistoryStoreTests.subscription()],
                    redemptions: [
                        AppleHistoryStoreTests.redemption("1001", at: base), AppleHistoryStoreTests.redemption("1002", token: nil, at: base), unplaced,
                    ],
                    source: "notification"),
                at: base)
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    renewalInfos: [AppleSignedItem(bundleID: AppleHistoryStoreTests.bundle, environment: "Sandbox", key: "2000", originalTransactionID: "2000", signedDate: nil, decoded: "{}", jws: "")],
                    subscriptions: [AppleHistoryStoreTests.subscription("2000", environment: "Sandbox")],
                    completeSubscriptions: [AppleHistoryStoreTests.subscription("2000", environment: "Sandbox")], source: "history"),
                at: base)
            _ = try await AuditCheckpointing.create(in: store, masterKey: masterKey)
            let before = try await Self.everything(store)
            let appleBefore = try await Self.appleHistory(store)
            #expect(before.1.count == 12_009 && before.2.count == 12_242 && before.3.count == 5)
            #expect(appleBefore.values.map(\.count).reduce(0, +) == 10, "\(appleBefore)")
            #expect(try await store.offerRedemptions(since: nil).map(\.state) == [.matched, .unmatched, .unplaced])

            try await StoreFixture.with(.postgres) { middle in
                let lines = Mutex<[String]>([])
                let there = try await StoreCopy.copy(from: store, to: middle.store) { line in lines.withLock { $0.append(line) } }
                #expect(there.sourceHead == before.4 && there.targetHead == before.4 && there.report.isIntact)
                #expect(lines.withLock { $0 }.contains("copied 10000 of 12009 audit records"), "progress every 10,000: \(lines.withLock { $0 })")
                #expect(try await Self.appleHistory(middle.store) == appleBefore, "Apple's history and redemptions")
                #expect(try await middle.store.offerRedemptions(since: nil) == (try await store.offerRedemptions(since: nil)))
                #expect(
                    try await middle.store.notificationRecoveryWatermark(bundleID: AppleHistoryStoreTests.bundle, environment: "Production") == watermark,
                    "the catch-up goes on from the source's watermark")
                let inPostgres = try await Self.everything(middle.store)
                #expect(inPostgres.0 == before.0, "registry")
                #expect(inPostgres.1 == before.1, "audit records")
                #expect(inPostgres.2 == before.2, "ledger")
                // The daily roll-up is counted again from the copied ledger: equal to its count.
                // (Not to the source's roll-up: these signatures share one time, so requests
                // identical to the millisecond in different groups count once per group there.)
                let rollUp = try await middle.store.offerIssuancesPerDay(since: .distantPast)
                #expect(OfferIssuanceDay.totals(rollUp) == (try await middle.store.offerIssuances(since: nil)) && !rollUp.isEmpty, "\(rollUp)")
                #expect(inPostgres.3 == before.3, "checkpoints")
                let report = try await middle.store.verifiedChain()
                #expect(report.isIntact && report.checkpointsMatched == 5 && report.headHash == before.4, "\(report)")
                // The copy is bound to the same master key, and its checkpoints cover its head.
                try await middle.store.bindMasterKey(masterKey)
                #expect(try await AuditCheckpointing.create(in: middle.store, masterKey: masterKey) == nil)

                // A non-empty target is refused, and left as it was.
                await #expect {
                    _ = try await StoreCopy.copy(from: store, to: middle.store)
                } throws: { error in
                    (error as? StoreError)?.message.contains("not empty") == true
                }

                try await StoreFixture.with(.sqlite) { back in
                    let summary = try await StoreCopy.copy(from: middle.store, to: back.store)
                    #expect(summary.targetHead == summary.sourceHead)
                    let after = try await Self.everything(back.store)
                    #expect(after.0 == before.0 && after.1 == before.1 && after.2 == before.2 && after.3 == before.3 && after.4 == before.4)
                    #expect(try await back.store.offerIssuancesPerDay(since: .distantPast) == rollUp)
                    #expect(try await Self.appleHistory(back.store) == appleBefore)
                    #expect(try await back.store.notificationRecoveryWatermark(bundleID: AppleHistoryStoreTests.bundle, environment: "Production") == watermark)
                    #expect(try await back.store.unplacedOfferRedemptions(limit: 10).map(\.candidate.transactionID) == ["1003"])
                    // The sealed keys still open with the same master key.
                    try await back.store.bindMasterKey(masterKey)
                    _ = try await back.store.auditSigningKey(masterKey: masterKey)
                }
            }
        }
    }
}
