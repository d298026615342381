import Foundation
import OfferSignerCore
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// Apple's history and offer redemptions in the store: the same rules on SQLite and PostgreSQL.
@Suite("Store conformance: Apple's history and redemptions on SQLite and PostgreSQL")
struct AppleHistoryStoreTests {
    static let bundle = "com.example.app"
    static let token = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
    static let base = Date(timeIntervalSince1970: 1_790_000_000)

    static func receipt(_ uuid: String, original: String = "1000", type: String = "DID_RENEW", subtype: String? = nil) -> AppleNotificationReceipt {
        AppleNotificationReceipt(
            notificationUUID: uuid, bundleID: bundle, environment: "Production", notificationType: type, subtype: subtype,
            originalTransactionID: original, signedDate: base, receivedAt: base)
    }

    static func transaction(_ id: String, original: String = "1000", signedAt: Date, decoded: String = "{}") -> AppleSignedItem {
        AppleSignedItem(bundleID: bundle, environment: "Production", key: id, originalTransactionID: original, signedDate: signedAt, decoded: decoded, jws: "jws-\(id)")
    }

    static func subscription(_ original: String = "1000", environment: String = "Production") -> AppleSubscriptionKey {
        AppleSubscriptionKey(bundleID: bundle, environment: environment, originalTransactionID: original)
    }

    static func signature(
        _ nonce: String, offer: String = "retain_50", token: String? = Self.token, at: Date, client: String = "backend", format: String = "legacy"
    ) -> AuditAppend {
        let signature = IssuedSignature(
            nonce: nonce, issuedAt: at, client: client, bundleID: bundle, productID: "pro.monthly", offerID: offer, appAccountToken: token, keyID: "KEY1234567",
            format: format)
        return AuditAppend(entry: signature.auditEntry, signatures: [signature])
    }

    static func redemption(_ transactionID: String, offer: String = "retain_50", token: String? = Self.token, at: Date) -> RedemptionCandidate {
        RedemptionCandidate(
            transactionID: transactionID, originalTransactionID: "1000", bundleID: bundle, environment: "Production", productID: "pro.monthly",
            offerID: offer, appAccountToken: token, purchaseDate: at)
    }

    @Test("A notification is recorded once by its UUID: a repeat writes nothing", arguments: StoreBackend.testedCases)
    func notificationIdempotency(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let update = AppleHistoryUpdate(
                notification: Self.receipt("uuid-1"), transactions: [Self.transaction("1001", signedAt: Self.base)], subscriptions: [Self.subscription()],
                source: "notification")
            #expect(try await store.recordAppleHistory(update, at: Self.base) == .recorded(redemptions: []))
            var repeated = update
            repeated.transactions = [Self.transaction("1002", signedAt: Self.base)]
            #expect(try await store.recordAppleHistory(repeated, at: Self.base) == .duplicateNotification)
            let stored = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            #expect(stored.transactions.map(\.key) == ["1001"], "the repeat's transaction was not written")
            #expect(try await fixture.count("apple_notifications") == 1)
            #expect(try await store.isEmpty() == false)
        }
    }

    @Test("Items: a later signedDate replaces, an earlier never does; found by transaction or original ID; completeness only grows", arguments: StoreBackend.testedCases)
    func itemsAndCompleteness(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let newer = Self.base.addingTimeInterval(60)
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    transactions: [Self.transaction("1001", signedAt: newer, decoded: #"{"v":"new"}"#)], subscriptions: [Self.subscription()],
                    completeSubscriptions: [Self.subscription()], source: "history"),
                at: Self.base)
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    notification: Self.receipt("uuid-2"), transactions: [Self.transaction("1001", signedAt: Self.base, decoded: #"{"v":"old"}"#)],
                    renewalInfos: [AppleSignedItem(bundleID: Self.bundle, environment: "Production", key: "1000", originalTransactionID: "1000", signedDate: newer, decoded: #"{"r":1}"#, jws: "r")],
                    subscriptions: [Self.subscription()], source: "notification"),
                at: Self.base)
            let byTransaction = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            let byOriginal = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1000"))
            #expect(byTransaction == byOriginal)
            #expect(byTransaction.transactions.map(\.decoded) == [#"{"v":"new"}"#], "an older statement does not replace a newer one")
            #expect(byTransaction.renewalInfos.map(\.decoded) == [#"{"r":1}"#])
            #expect(byTransaction.isComplete, "a later notification does not make a complete history incomplete")
            #expect(try await store.appleHistory(bundleID: Self.bundle, environment: "Sandbox", transactionID: "1001") == nil)
            #expect(try await store.appleHistory(bundleID: "com.example.other", environment: "Production", transactionID: "1001") == nil)
            #expect(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "9999") == nil)
        }
    }

    @Test("A history read finds every transaction and the renewal info of the subscription, and nothing of another subscription", arguments: StoreBackend.testedCases)
    func historyReadIsTheWholeSubscription(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let renewal = AppleSignedItem(
                bundleID: Self.bundle, environment: "Production", key: "1000", originalTransactionID: "1000", signedDate: nil, decoded: #"{"r":2}"#, jws: "r2")
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    transactions: [
                        Self.transaction("1001", signedAt: Self.base, decoded: #"{"m":1}"#),
                        Self.transaction("1002", signedAt: Self.base.addingTimeInterval(60), decoded: #"{"m":2}"#),
                        Self.transaction("1003", signedAt: Self.base.addingTimeInterval(120), decoded: #"{"m":3}"#),
                        Self.transaction("2001", original: "2000", signedAt: Self.base, decoded: #"{"other":1}"#),
                    ],
                    renewalInfos: [renewal], subscriptions: [Self.subscription(), Self.subscription("2000")], source: "history"),
                at: Self.base)
            let history = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1003"))
            #expect(history.subscription == Self.subscription())
            #expect(history.updatedAt == Self.base)
            #expect(!history.isComplete)
            #expect(Set(history.transactions.map(\.key)) == ["1001", "1002", "1003"])
            #expect(history.transactions.count == 3)
            let second = try #require(history.transactions.first { $0.key == "1002" })
            #expect(second == Self.transaction("1002", signedAt: Self.base.addingTimeInterval(60), decoded: #"{"m":2}"#))
            #expect(history.renewalInfos == [renewal])
            let other = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "2001"))
            #expect(other.transactions.map(\.key) == ["2001"])
            #expect(other.renewalInfos.isEmpty)
        }
    }

    @Test("The same item again is not rewritten; the same signedDate with other bytes replaces it; an older one never does", arguments: StoreBackend.testedCases)
    func sameItemAgainIsNotRewritten(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            // Counts every row update of the two item tables behind the store's back.
            try await fixture.execute("CREATE TABLE item_writes (n INTEGER NOT NULL)")
            try await fixture.execute("INSERT INTO item_writes (n) VALUES (0)")
            for table in ["apple_transactions", "apple_renewal_infos"] {
                switch backend {
                case .sqlite:
                    try await fixture.execute("CREATE TRIGGER count_\(table) AFTER UPDATE ON \(table) BEGIN UPDATE item_writes SET n = n + 1; END;")
                case .postgres:
                    try await fixture.execute("CREATE OR REPLACE FUNCTION count_item_write() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN UPDATE item_writes SET n = n + 1; RETURN NEW; END $$")
                    try await fixture.execute("CREATE TRIGGER count_\(table) AFTER UPDATE ON \(table) FOR EACH ROW EXECUTE FUNCTION count_item_write()")
                }
            }
            func write(_ transaction: AppleSignedItem, renewal: AppleSignedItem) async throws {
                _ = try await store.recordAppleHistory(
                    AppleHistoryUpdate(transactions: [transaction], renewalInfos: [renewal], subscriptions: [Self.subscription()], source: "history"), at: Self.base)
            }
            func renewal(_ decoded: String, jws: String, at date: Date) -> AppleSignedItem {
                AppleSignedItem(bundleID: Self.bundle, environment: "Production", key: "1000", originalTransactionID: "1000", signedDate: date, decoded: decoded, jws: jws)
            }
            let first = Self.transaction("1001", signedAt: Self.base, decoded: #"{"v":1}"#)
            try await write(first, renewal: renewal(#"{"r":1}"#, jws: "r1", at: Self.base))
            try await write(first, renewal: renewal(#"{"r":1}"#, jws: "r1", at: Self.base))
            #expect(try await fixture.count("item_writes", where: "n = 0") == 1, "the same statement again writes no row")
            // The same signedDate, other bytes: the later statement replaces, as before.
            var resigned = first
            resigned.jws = "jws-1001-again"
            try await write(resigned, renewal: renewal(#"{"r":2}"#, jws: "r1", at: Self.base))
            #expect(try await fixture.count("item_writes", where: "n = 2") == 1)
            var stored = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            #expect(stored.transactions.map(\.jws) == ["jws-1001-again"])
            #expect(stored.renewalInfos.map(\.decoded) == [#"{"r":2}"#])
            // An older statement never replaces; a newer one does.
            try await write(
                Self.transaction("1001", signedAt: Self.base.addingTimeInterval(-60), decoded: #"{"v":0}"#),
                renewal: renewal(#"{"r":0}"#, jws: "r0", at: Self.base.addingTimeInterval(-60)))
            #expect(try await fixture.count("item_writes", where: "n = 2") == 1)
            try await write(
                Self.transaction("1001", signedAt: Self.base.addingTimeInterval(60), decoded: #"{"v":1}"#),
                renewal: renewal(#"{"r":2}"#, jws: "r1", at: Self.base.addingTimeInterval(60)))
            #expect(try await fixture.count("item_writes", where: "n = 4") == 1)
            stored = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            #expect(stored.transactions.map(\.signedDate) == [Self.base.addingTimeInterval(60)])
            #expect(stored.transactions.map(\.decoded) == [#"{"v":1}"#])
        }
    }

    @Test("A history's version names its subscription and moves on with every write, even two in one millisecond", arguments: StoreBackend.testedCases)
    func historyVersion(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            #expect(try await store.appleHistoryVersion(bundleID: Self.bundle, environment: "Production", transactionID: "1001") == nil)
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    notification: Self.receipt("uuid-v1"), transactions: [Self.transaction("1001", signedAt: Self.base)], subscriptions: [Self.subscription()],
                    source: "notification"),
                at: Self.base)
            let first = try #require(try await store.appleHistoryVersion(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            #expect(first.subscription == Self.subscription())
            #expect(!first.isComplete)
            #expect(try await store.appleHistoryVersion(bundleID: Self.bundle, environment: "Production", transactionID: "1000") == first, "by original ID too")
            let whole = try #require(try await store.appleHistory(bundleID: Self.bundle, environment: "Production", transactionID: "1001"))
            #expect(whole.updatedAt == first.updatedAt && whole.isComplete == first.isComplete)

            // A second write at the very same time (same millisecond) still moves the version on.
            _ = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    notification: Self.receipt("uuid-v2"), transactions: [Self.transaction("1002", signedAt: Self.base)], subscriptions: [Self.subscription()],
                    completeSubscriptions: [Self.subscription()], source: "notification"),
                at: Self.base)
            let second = try #require(try await store.appleHistoryVersion(bundleID: Self.bundle, environment: "Production", transactionID: "1002"))
            #expect(second.updatedAt > first.updatedAt)
            #expect(second.isComplete)
            #expect(try await store.appleHistoryVersion(bundleID: Self.bundle, environment: "Sandbox", transactionID: "1001") == nil)
        }
    }

    @Test("Redemptions: matched to the latest signature of the same customer and offer within 24 h, audited once; others unmatched", arguments: StoreBackend.testedCases)
    func redemptionMatching(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            _ = try await store.appendAudit(
                [
                    Self.signature("n-old", at: purchase.addingTimeInterval(-30 * 3600)),  // too old
                    Self.signature("n-good", at: purchase.addingTimeInterval(-600)),
                    Self.signature("n-other-offer", offer: "winback_1", at: purchase.addingTimeInterval(-300)),
                    Self.signature("n-other-token", token: "11111111-2222-3333-4444-555555555555", at: purchase.addingTimeInterval(-200)),
                ], at: purchase.addingTimeInterval(-100))
            let headBefore = try await store.auditHead().count
            let update = AppleHistoryUpdate(
                notification: Self.receipt("uuid-3", type: "OFFER_REDEEMED"),
                redemptions: [
                    Self.redemption("2001", at: purchase),
                    Self.redemption("2002", at: purchase.addingTimeInterval(60)),  // the good signature is taken: no match
                    Self.redemption("2003", token: nil, at: purchase),
                ], source: "notification")
            guard case .recorded(let redemptions) = try await store.recordAppleHistory(update, at: purchase.addingTimeInterval(120)) else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.count == 3)
            let matched = try #require(redemptions.first { $0.candidate.transactionID == "2001" })
            #expect(matched.isMatched)
            #expect(matched.signatureIssuedAt == purchase.addingTimeInterval(-600))
            #expect(redemptions.first { $0.candidate.transactionID == "2002" }?.isMatched == false)
            #expect(redemptions.first { $0.candidate.transactionID == "2003" }?.isMatched == false)
            #expect(try await store.auditHead().count == headBefore + 3)
            let audited = try await store.auditRecords(after: headBefore, limit: 10)
            #expect(audited.allSatisfy { $0.kind == "offer.redeemed" })
            let body = try #require(try JSONSerialization.jsonObject(with: Data(audited[0].body.utf8)) as? [String: Any])
            #expect(body["transactionID"] as? String == "2001")
            #expect(body["matched"] as? Bool == true)
            #expect(body["offerID"] as? String == "retain_50")

            // The same transaction again (from a fetched history): nothing new, nothing audited.
            let again = AppleHistoryUpdate(redemptions: [Self.redemption("2001", at: purchase)], source: "history")
            #expect(try await store.recordAppleHistory(again, at: purchase.addingTimeInterval(200)) == .recorded(redemptions: []))
            #expect(try await store.auditHead().count == headBefore + 3)
            #expect(try await fixture.store.verifiedChain().isIntact)

            let all = try await store.offerRedemptions(since: nil)
            #expect(all.map(\.candidate.transactionID).sorted() == ["2001", "2002", "2003"])
            #expect(try await store.offerRedemptions(since: purchase.addingTimeInterval(30)).map(\.candidate.transactionID) == ["2002"])
        }
    }

    @Test("A redemption's window starts where its candidate says; a period that only continues a redemption is recorded only with a signature of its own", arguments: StoreBackend.testedCases)
    func redemptionWindowsAndContinuations(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let renewal = Self.base
            _ = try await store.appendAudit(
                [
                    Self.signature("n-ten-days-before", at: renewal.addingTimeInterval(-10 * 86400)),
                    Self.signature("n-hour-before", offer: "winback_1", at: renewal.addingTimeInterval(-3600)),
                ], at: renewal.addingTimeInterval(-100))
            let headBefore = try await store.auditHead().count
            // An offer that began at a renewal: its signature dates from the period before.
            var began = Self.redemption("3001", at: renewal)
            began.signatureWindowStart = renewal.addingTimeInterval(-31 * 86400)
            // The next periods of a pay-as-you-go offer: one with no signature of its own, and one
            // with a signature for it within 24 h (a new redemption of that offer).
            var continued = Self.redemption("3002", at: renewal.addingTimeInterval(30 * 86400))
            continued.continuesRedemption = true
            var redeemedAgain = Self.redemption("3003", offer: "winback_1", at: renewal)
            redeemedAgain.continuesRedemption = true
            let update = AppleHistoryUpdate(redemptions: [began, continued, redeemedAgain], source: "notification")
            guard case .recorded(let redemptions) = try await store.recordAppleHistory(update, at: renewal.addingTimeInterval(120)) else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.candidate.transactionID) == ["3001", "3003"])
            #expect(redemptions.allSatisfy { $0.isMatched })
            #expect(redemptions.first?.signatureIssuedAt == renewal.addingTimeInterval(-10 * 86400))
            #expect(try await store.auditHead().count == headBefore + 2)
            #expect(try await store.offerRedemptions(since: nil).map(\.candidate.transactionID).sorted() == ["3001", "3003"])
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("Issuances are counted per signing request, not per format", arguments: StoreBackend.testedCases)
    func issuanceCounts(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let at = Self.base
            var jws = Self.signature("n-2", at: at)
            jws.signatures[0].nonce = "n-2-jws"
            jws.signatures[0].format = "jws"
            jws.entry = jws.signatures[0].auditEntry
            _ = try await store.appendAudit([Self.signature("n-1", at: at), jws, Self.signature("n-3", at: at.addingTimeInterval(1)), Self.signature("n-4", offer: "winback_1", at: at)], at: at)
            let counts = try await store.offerIssuances(since: nil)
            #expect(counts == [
                OfferIssuanceCount(bundleID: Self.bundle, offerID: "retain_50", issuances: 2),
                OfferIssuanceCount(bundleID: Self.bundle, offerID: "winback_1", issuances: 1),
            ])
            #expect(try await store.offerIssuances(since: at.addingTimeInterval(0.5)) == [OfferIssuanceCount(bundleID: Self.bundle, offerID: "retain_50", issuances: 1)])

            // The customer's ledger as eligibility rules read it: one per request, oldest first.
            let ledger = try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: Self.bundle)
            #expect(ledger.count == 3)
            #expect(Set(ledger.prefix(2)) == [LedgerIssuance(offerID: "retain_50", issuedAt: at), LedgerIssuance(offerID: "winback_1", issuedAt: at)])
            #expect(ledger.last == LedgerIssuance(offerID: "retain_50", issuedAt: at.addingTimeInterval(1)))
            #expect(try await store.ledgerIssuances(appAccountToken: Self.token, bundleID: "com.example.other").isEmpty)
            #expect(try await store.ledgerIssuances(appAccountToken: "00000000-0000-4000-8000-000000000000", bundleID: Self.bundle).isEmpty)
        }
    }

    @Test("A request signed in two formats is one issuance: a second redemption does not match its other format's record", arguments: StoreBackend.testedCases)
    func siblingFormatsMatchOnce(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let issuedAt = Self.base.addingTimeInterval(-600)
            var jws = Self.signature("pair-jws", at: issuedAt)
            jws.signatures[0].format = "jws"
            jws.entry = jws.signatures[0].auditEntry
            _ = try await store.appendAudit([Self.signature("pair-legacy", at: issuedAt), jws], at: issuedAt)
            let update = AppleHistoryUpdate(
                redemptions: [Self.redemption("3001", at: Self.base), Self.redemption("3002", at: Self.base.addingTimeInterval(60))], source: "history")
            guard case .recorded(let redemptions) = try await store.recordAppleHistory(update, at: Self.base) else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.isMatched) == [true, false])
        }
    }

    @Test("Unplaced redemptions: recorded as such (never unmatched), listed, then placed by a later statement: matched, or removed when only a continuation; audited each time", arguments: StoreBackend.testedCases)
    func unplacedThenPlaced(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let renewal = Self.base
            // Signed two months before the renewal the offer starts at, during a year-long period.
            _ = try await store.appendAudit([Self.signature("n-months-before", at: renewal.addingTimeInterval(-60 * 86400))], at: renewal.addingTimeInterval(-60 * 86400))
            let headBefore = try await store.auditHead().count
            // The estimate (a week's period before) finds nothing: unplaced.
            var estimated = Self.redemption("4001", at: renewal)
            estimated.signatureWindowStart = renewal.addingTimeInterval(-8 * 86400)
            estimated.isPlaced = false
            // A pay-as-you-go period after an unknown one: maybe a continuation, maybe not.
            var maybeContinued = Self.redemption("4002", offer: "winback_1", at: renewal)
            maybeContinued.continuesRedemption = true
            maybeContinued.isPlaced = false
            guard case .recorded(let first) = try await store.recordAppleHistory(
                AppleHistoryUpdate(notification: Self.receipt("uuid-u1"), redemptions: [estimated, maybeContinued], source: "notification"), at: renewal)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(first.map(\.state) == [.unplaced, .unplaced])
            #expect(first.allSatisfy { $0.placedAt == nil })
            #expect(try await store.unplacedOfferRedemptions(limit: 10).map(\.candidate.transactionID) == ["4001", "4002"])
            #expect(try await store.unplacedOfferRedemptions(limit: 1).count == 1)
            let redeemed = try await store.auditRecords(after: headBefore, limit: 10)
            #expect(redeemed.map(\.kind) == ["offer.redeemed", "offer.redeemed"])
            #expect(redeemed.allSatisfy { $0.body.contains(#""unplaced":true"#) && $0.body.contains(#""matched":false"#) })

            // Stated unplaced again (another notification): nothing changes.
            #expect(try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: [estimated], source: "notification"), at: renewal) == .recorded(redemptions: []))

            // Apple's history places both: the offer was redeemed during the year before.
            var placed = estimated
            placed.isPlaced = true
            placed.signatureWindowStart = renewal.addingTimeInterval(-366 * 86400)
            var continued = maybeContinued
            continued.isPlaced = true
            continued.signatureWindowStart = renewal.addingTimeInterval(-86400)
            let placedAt = renewal.addingTimeInterval(600)
            guard case .recorded(let second) = try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: [placed, continued], source: "history"), at: placedAt)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(second.count == 2)
            let matched = try #require(second.first { $0.candidate.transactionID == "4001" })
            #expect(matched.state == .matched)
            #expect(matched.signatureIssuedAt == renewal.addingTimeInterval(-60 * 86400))
            #expect(matched.placedAt == placedAt)
            #expect(second.first { $0.candidate.transactionID == "4002" }?.candidate.continuesRedemption == true)
            let placements = try await store.auditRecords(after: headBefore + 2, limit: 10)
            #expect(placements.map(\.kind) == ["offer.redemption_placed", "offer.redemption_placed"])
            #expect(placements[0].body.contains(#""outcome":"matched""#) && placements[0].body.contains(#""transactionID":"4001""#))
            #expect(placements[1].body.contains(#""outcome":"continues""#))

            // Placed once: a later statement, placed or not, changes nothing.
            #expect(try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: [placed, estimated], source: "history"), at: placedAt) == .recorded(redemptions: []))
            let all = try await store.offerRedemptions(since: nil)
            #expect(all.map(\.candidate.transactionID) == ["4001"], "the continuation was removed")
            #expect(all.first?.state == .matched && all.first?.placedAt == placedAt && all.first?.issuanceSequence == matched.issuanceSequence)
            #expect(try await store.unplacedOfferRedemptions(limit: 10).isEmpty)
            #expect(try await store.auditHead().count == headBefore + 4)
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("A pay-as-you-go period after a lost first one never takes the first one's signature on its estimate: unplaced, then the real first period matches it and the continuation is removed", arguments: StoreBackend.testedCases)
    func payAsYouGoAfterLostFirstPeriod(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let first = Self.base
            let second = first.addingTimeInterval(30 * 86400)
            _ = try await store.appendAudit([Self.signature("n-payg", offer: "payg_3", at: first.addingTimeInterval(-3600))], at: first.addingTimeInterval(-3600))
            // The second monthly period of a pay-as-you-go offer, its first period's notification
            // lost: the estimated window (24 h before an estimated previous start) holds the
            // first period's signature, but the estimate must not match it.
            var continued = Self.redemption("5002", offer: "payg_3", at: second)
            continued.continuesRedemption = true
            continued.isPlaced = false
            continued.signatureWindowStart = first.addingTimeInterval(-86400)
            guard case .recorded(let recorded) = try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: [continued], source: "notification"), at: second)
            else {
                Issue.record("not recorded")
                return
            }
            #expect(recorded.map(\.state) == [.unplaced])
            #expect(recorded.first?.issuanceSequence == nil)
            // Apple's history: the real first period (a new redemption) and the second, placed.
            let firstPeriod = Self.redemption("5001", offer: "payg_3", at: first)
            var placedContinuation = continued
            placedContinuation.isPlaced = true
            guard case .recorded(let placed) = try await store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [firstPeriod, placedContinuation], source: "history"), at: second.addingTimeInterval(600))
            else {
                Issue.record("not recorded")
                return
            }
            let matched = try #require(placed.first { $0.candidate.transactionID == "5001" })
            #expect(matched.state == .matched, "the first period takes its own signature: no false leaked-key warning")
            let all = try await store.offerRedemptions(since: nil)
            #expect(all.map(\.candidate.transactionID) == ["5001"], "one redemption, counted once")
            #expect(all.allSatisfy { $0.state == .matched })
            #expect(try await store.unplacedOfferRedemptions(limit: 10).isEmpty)
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("The report counts each redemption once: matched, unplaced, without a token, or without a signature, adding up to those stored")
    func reportAddsUp() {
        let at = Self.base
        func stored(_ id: String, token: String? = Self.token, matched: Bool = false, unplaced: Bool = false) -> OfferRedemption {
            OfferRedemption(
                candidate: Self.redemption(id, token: token, at: at), issuanceSequence: matched ? 7 : nil, signatureIssuedAt: matched ? at.addingTimeInterval(-60) : nil,
                source: "notification", recordedAt: at, isUnplaced: unplaced)
        }
        let redemptions = [stored("1", matched: true), stored("2", unplaced: true), stored("3", token: nil, unplaced: true), stored("4", token: nil), stored("5")]
        let rows = OfferReport.rows(issuances: [OfferIssuanceCount(bundleID: Self.bundle, offerID: "retain_50", issuances: 3)], redemptions: redemptions)
        #expect(rows.count == 1)
        let row = rows[0]
        #expect(row.matched.count == 1 && row.unplaced == 2 && row.unattributed == 1 && row.unmatched == 1)
        #expect(row.redemptions == Int64(redemptions.count))
        #expect(OfferReport.json(rows).contains(#""redeemedUnplaced":2,"redemptions":5"#))
        let table = OfferReport.table(rows)
        #expect(table.split(separator: "\n")[0].hasSuffix("unplaced"))
        #expect(table.contains("leaked") && table.contains("unplaced redemptions wait"))
    }

    @Test("A retention offer to a subscription without an appAccountToken (issued under otid:<originalTransactionId>) is matched through the original transaction, once", arguments: StoreBackend.testedCases)
    func retentionWithoutTokenMatchesByOriginalTransaction(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            // As RetentionController issues it: the ledger's customer is the subscription.
            var retention = Self.signature("n-retention", token: "otid:1000", at: purchase.addingTimeInterval(-3600), client: "apple-retention")
            retention.signatures[0].originalTransactionID = "1000"
            retention.entry = retention.signatures[0].auditEntry
            _ = try await store.appendAudit([retention, Self.signature("n-other-subscription", token: "otid:2000", at: purchase.addingTimeInterval(-60))], at: purchase)
            guard case .recorded(let redemptions) = try await store.recordAppleHistory(
                AppleHistoryUpdate(
                    redemptions: [Self.redemption("5001", token: nil, at: purchase), Self.redemption("5002", token: nil, at: purchase.addingTimeInterval(60))],
                    source: "notification"),
                at: purchase.addingTimeInterval(120))
            else {
                Issue.record("not recorded")
                return
            }
            #expect(redemptions.map(\.state) == [.matched, .unmatched], "matched once: the second finds the issuance taken")
            #expect(redemptions.first?.signatureIssuedAt == purchase.addingTimeInterval(-3600))
            #expect(redemptions.first?.candidate.appAccountToken == nil)
        }
    }

    @Test("Issuances keep the subscription and environment: a redemption matches by token or original transaction, never across environments", arguments: StoreBackend.testedCases)
    func issuanceEnvironmentAndOriginalTransaction(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            func issuance(_ nonce: String, token: String?, original: String?, environment: String?, at offset: TimeInterval) -> AuditAppend {
                var append = Self.signature(nonce, token: token, at: purchase.addingTimeInterval(offset))
                append.signatures[0].originalTransactionID = original
                append.signatures[0].environment = environment
                append.entry = append.signatures[0].auditEntry
                return append
            }
            _ = try await store.appendAudit(
                [
                    // A Production issuance of subscription 1000 (as Retention Messaging records one).
                    issuance("n-production", token: Self.token, original: "1000", environment: "Production", at: -3600),
                    // A Sandbox issuance of subscription 7000, whose purchases carry no token.
                    issuance("n-sandbox", token: "otid:7000", original: "7000", environment: "Sandbox", at: -1800),
                ], at: purchase)
            let ledger = try await store.issuedSignatures(appAccountToken: Self.token, bundleID: Self.bundle)
            #expect(ledger.first?.signature.environment == "Production" && ledger.first?.signature.originalTransactionID == "1000")

            // A Sandbox redemption of the same customer does not use up the Production issuance.
            var sandbox = Self.redemption("6001", at: purchase)
            sandbox.environment = "Sandbox"
            // A Production redemption of subscription 1000 without a token matches it through the original transaction.
            let noToken = Self.redemption("6002", token: nil, at: purchase.addingTimeInterval(60))
            // Subscription 7000's Production redemption finds no Sandbox issuance; its Sandbox one does.
            var otherProduction = Self.redemption("6003", token: nil, at: purchase)
            otherProduction.originalTransactionID = "7000"
            var otherSandbox = otherProduction
            otherSandbox.transactionID = "6004"
            otherSandbox.environment = "Sandbox"
            guard case .recorded(let redemptions) = try await store.recordAppleHistory(
                AppleHistoryUpdate(redemptions: [sandbox, noToken, otherProduction, otherSandbox], source: "notification"), at: purchase.addingTimeInterval(120))
            else {
                Issue.record("not recorded")
                return
            }
            let states = Dictionary(uniqueKeysWithValues: redemptions.map { ($0.candidate.transactionID, $0.state) })
            #expect(states == ["6001": .unmatched, "6002": .matched, "6003": .unmatched, "6004": .matched])
            #expect(redemptions.first { $0.candidate.transactionID == "6002" }?.signatureIssuedAt == purchase.addingTimeInterval(-3600))
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }
}

