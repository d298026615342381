import Foundation
import OfferSignerCore
import OfferSignerStorage
import Testing

@testable import OfferSignerServer

/// Attacks on redemption matching, on SQLite and PostgreSQL (see `OfferRedemption` and
/// `IssuanceEnvironmentSchema`): a declared environment never keeps a redemption from matching
/// (so nobody who can ask for a signature can raise the leaked-key warning), a proved one is
/// strict; a match on the customer's token comes before one on the original transaction; two
/// requests in one millisecond never use each other up.
extension AppleHistoryStoreTests {
    static let otherToken = "11111111-2222-4333-8444-555555555555"

    /// One signing request's issuance (legacy format) with the subscription and environment it keeps.
    static func issuance(
        _ nonce: String, token: String?, original: String? = nil, environment: String?, declared: Bool = false, at: Date
    ) -> AuditAppend {
        var append = signature(nonce, token: token, at: at)
        append.signatures[0].originalTransactionID = original
        append.signatures[0].environment = environment
        append.signatures[0].environmentIsDeclared = declared
        append.entry = append.signatures[0].auditEntry
        return append
    }

    static func candidate(_ transactionID: String, token: String?, original: String = "1000", environment: String, at: Date) -> RedemptionCandidate {
        var candidate = redemption(transactionID, token: token, at: at)
        candidate.originalTransactionID = original
        candidate.environment = environment
        return candidate
    }

    /// Records the candidates (as a fetched history states them) and returns what was recorded, in order.
    static func record(_ candidates: [RedemptionCandidate], in store: any OfferSignerStore, at time: Date) async throws -> [OfferRedemption] {
        guard case .recorded(let redemptions) = try await store.recordAppleHistory(AppleHistoryUpdate(redemptions: candidates, source: "history"), at: time)
        else {
            Issue.record("not recorded")
            return []
        }
        return redemptions
    }

    @Test("Attack: a user declares Xcode or Sandbox and redeems in Production: the declared issuance is matched, never reported redeemed without a signature", arguments: StoreBackend.testedCases)
    func declaredEnvironmentNeverExcludes(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            _ = try await store.appendAudit(
                [
                    Self.issuance("declared-xcode", token: Self.token, environment: "Xcode", declared: true, at: purchase.addingTimeInterval(-600)),
                    Self.issuance("declared-sandbox", token: Self.otherToken, environment: "Sandbox", declared: true, at: purchase.addingTimeInterval(-500)),
                ], at: purchase.addingTimeInterval(-400))
            // The ledger and the audit record say the environment was only declared.
            let ledger = try await store.ledger(after: nil, limit: 10)
            #expect(ledger.map(\.signature.environmentIsDeclared) == [true, true])
            let audited = try await store.auditRecords(after: 0, limit: 10).filter { $0.kind == "signature.issued" }
            #expect(audited.allSatisfy { $0.body.contains(#""environmentDeclared":true"#) }, "\(audited.map(\.body))")

            let redemptions = try await Self.record(
                [
                    Self.candidate("5001", token: Self.token, environment: "Production", at: purchase),
                    Self.candidate("5002", token: Self.otherToken, original: "2000", environment: "Production", at: purchase),
                ], in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.matched, .matched])
            #expect(redemptions.map(\.signatureIssuedAt) == [purchase.addingTimeInterval(-600), purchase.addingTimeInterval(-500)])
        }
    }

    @Test("A declared environment orders the candidates: a Sandbox redemption takes the Sandbox-declared issuance over a newer Production-declared one", arguments: StoreBackend.testedCases)
    func declaredEnvironmentOrders(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            _ = try await store.appendAudit(
                [
                    Self.issuance("sandbox", token: Self.token, environment: "Sandbox", declared: true, at: purchase.addingTimeInterval(-600)),
                    Self.issuance("production", token: Self.token, environment: "Production", declared: true, at: purchase.addingTimeInterval(-300)),
                ], at: purchase.addingTimeInterval(-200))
            let sandbox = try await Self.record([Self.candidate("5101", token: Self.token, environment: "Sandbox", at: purchase)], in: store, at: purchase)
            #expect(sandbox.map(\.signatureIssuedAt) == [purchase.addingTimeInterval(-600)])
            let production = try await Self.record(
                [Self.candidate("5102", token: Self.token, environment: "Production", at: purchase.addingTimeInterval(60))], in: store, at: purchase)
            #expect(production.map(\.signatureIssuedAt) == [purchase.addingTimeInterval(-300)])
            // Both used up: a third redemption matches nothing.
            let third = try await Self.record(
                [Self.candidate("5103", token: Self.token, environment: "Sandbox", at: purchase.addingTimeInterval(120))], in: store, at: purchase)
            #expect(third.map(\.state) == [.unmatched])
        }
    }

    @Test("A proved environment is strict: a Sandbox redemption does not use up a proved Production issuance, a Production one does", arguments: StoreBackend.testedCases)
    func provedEnvironmentIsStrict(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            _ = try await store.appendAudit(
                [Self.issuance("proved", token: Self.token, original: "1000", environment: "Production", at: purchase.addingTimeInterval(-600))],
                at: purchase.addingTimeInterval(-500))
            #expect(try await store.ledger(after: nil, limit: 10).map(\.signature.environmentIsDeclared) == [false])
            let redemptions = try await Self.record(
                [
                    Self.candidate("5201", token: Self.token, environment: "Sandbox", at: purchase),
                    Self.candidate("5202", token: Self.token, environment: "Production", at: purchase.addingTimeInterval(60)),
                ], in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.unmatched, .matched])
        }
    }

    @Test("Attack: another account redeeming the same original transaction does not take the customer's issuance: a token match comes first", arguments: StoreBackend.testedCases)
    func tokenMatchComesFirst(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            // The customer's issuance, and a newer one of another account that recorded the same subscription.
            _ = try await store.appendAudit(
                [
                    Self.issuance("mine", token: Self.token, original: "1000", environment: "Production", at: purchase.addingTimeInterval(-600)),
                    Self.issuance("theirs", token: Self.otherToken, original: "1000", environment: "Production", at: purchase.addingTimeInterval(-300)),
                ], at: purchase.addingTimeInterval(-200))
            let redemptions = try await Self.record(
                [
                    Self.candidate("5301", token: Self.token, environment: "Production", at: purchase),
                    Self.candidate("5302", token: Self.otherToken, environment: "Production", at: purchase.addingTimeInterval(60)),
                ], in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.matched, .matched])
            #expect(redemptions.map(\.signatureIssuedAt) == [purchase.addingTimeInterval(-600), purchase.addingTimeInterval(-300)])
        }
    }

    @Test("Attack: one Apple ID, two app accounts: an issuance to A keeping the subscription the request proved is matched by its redemption under B's token, not reported without a signature", arguments: StoreBackend.testedCases)
    func secondAppAccountMatchesByProvedSubscription(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            // As `UserSigningPolicy` keeps it: A's token, S proved by A's transaction of S.
            _ = try await store.appendAudit(
                [Self.issuance("proved", token: Self.token, original: "4700", environment: "Production", at: purchase.addingTimeInterval(-600))],
                at: purchase.addingTimeInterval(-500))
            let redemptions = try await Self.record(
                [
                    Self.candidate("5501", token: Self.otherToken, original: "4700", environment: "Production", at: purchase),
                    Self.candidate("5502", token: Self.otherToken, original: "4700", environment: "Production", at: purchase.addingTimeInterval(60)),
                ], in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.matched, .unmatched], "matched once; a second redemption of it is one without a signature")
        }
    }

    @Test("Two requests of one customer in the same millisecond are two issuances (a request is its consecutive audit records, one per format): two redemptions match both, a third neither request's other format", arguments: StoreBackend.testedCases)
    func sameCustomerSameMillisecondRequestsAreTwo(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            let issued = purchase.addingTimeInterval(-600)
            func request(_ name: String, offer: String, formats: [String]) -> [AuditAppend] {
                SigningController.signatureAppends(formats.map { format in
                    IssuedSignature(
                        nonce: "\(name)-\(format)", issuedAt: issued, client: "backend", bundleID: Self.bundle, productID: "pro.monthly", offerID: offer,
                        appAccountToken: Self.token, keyID: "KEY1234567", format: format, originalTransactionID: "1000", environment: "Production")
                })
            }
            // As the signing endpoint commits them: two two-format requests, two one-format ones, all in one millisecond and one commit.
            _ = try await store.appendAudit(
                request("first", offer: "retain_50", formats: ["legacy", "jws"]) + request("second", offer: "retain_50", formats: ["legacy", "jws"])
                    + request("third", offer: "winback_1", formats: ["jws"]) + request("fourth", offer: "winback_1", formats: ["jws"]),
                at: purchase.addingTimeInterval(-500))
            let ledger = try await store.ledger(after: nil, limit: 10)
            #expect(ledger.count == 6)
            #expect(Set(ledger.map(\.auditSequence)).count == 6, "each row under its own audit record")
            let audited = try await store.auditRecords(after: 0, limit: 20).filter { $0.kind == "signature.issued" }
            #expect(audited.count == 6, "every signature keeps its own audit record")

            var candidates = (0..<3).map { Self.candidate("560\($0)", token: Self.token, environment: "Production", at: purchase.addingTimeInterval(Double($0) * 60)) }
            for index in 0..<3 {
                var winBack = Self.candidate("570\(index)", token: Self.token, environment: "Production", at: purchase.addingTimeInterval(Double(index) * 60))
                winBack.offerID = "winback_1"
                candidates.append(winBack)
            }
            let redemptions = try await Self.record(candidates, in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.matched, .matched, .unmatched, .matched, .matched, .unmatched])
            #expect(Set(redemptions.compactMap(\.issuanceSequence)).count == 4, "each request matched once")
        }
    }

    @Test("Two requests in one millisecond for different customers (no token: by original transaction; or one per environment) never use each other up", arguments: StoreBackend.testedCases)
    func sameMillisecondIssuancesAreApart(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let purchase = Self.base
            let issued = purchase.addingTimeInterval(-600)
            _ = try await store.appendAudit(
                [
                    Self.issuance("no-token-a", token: nil, original: "7001", environment: "Production", at: issued),
                    Self.issuance("no-token-b", token: nil, original: "7002", environment: "Production", at: issued),
                    Self.issuance("token-production", token: Self.token, environment: "Production", at: issued),
                    Self.issuance("token-sandbox", token: Self.token, environment: "Sandbox", at: issued),
                ], at: purchase.addingTimeInterval(-500))
            let redemptions = try await Self.record(
                [
                    Self.candidate("5401", token: nil, original: "7001", environment: "Production", at: purchase),
                    Self.candidate("5402", token: nil, original: "7002", environment: "Production", at: purchase),
                    Self.candidate("5403", token: Self.token, original: "7003", environment: "Production", at: purchase),
                    Self.candidate("5404", token: Self.token, original: "7003", environment: "Sandbox", at: purchase),
                ], in: store, at: purchase)
            #expect(redemptions.map(\.state) == [.matched, .matched, .matched, .matched])
            #expect(Set(redemptions.compactMap(\.issuanceSequence)).count == 4, "each its own issuance")
        }
    }
}
