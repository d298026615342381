import Foundation
import OfferSignerCore
import TestChildProcess
import Testing

@testable import OfferSignerStorage

/// The audit committer's write path (`appendAuditBlocking`) on both engines: what it stores
/// must be exactly what was given, and a batch is all or nothing, with the store usable
/// afterwards. (SQLite: its own cached BEGIN/COMMIT and INSERTs bound through the C API;
/// PostgreSQL: one transaction with multi-row INSERTs.)
@Suite("Audit appends: exact values, all or nothing")
struct AuditAppendTests {
    static func signature(nonce: String = UUID.timeOrdered().lowercasedString, token: String?, client: String = "client:backend", offerID: String = "WINBACK50") -> IssuedSignature {
        IssuedSignature(
            nonce: nonce, issuedAt: Date(timeIntervalSince1970: 1_790_000_000.123), client: client, bundleID: "com.example.app",
            productID: "pro.monthly", offerID: offerID, appAccountToken: token, keyID: "KEY0000001", format: "legacy")
    }

    @Test("Every column is stored exactly as given: NULL, empty, non-ASCII and JSON text, and 64-bit numbers", arguments: StoreBackend.testedCases)
    func exactValues(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let token = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
            let unusual = [
                Self.signature(token: token, client: "client:Zürich — 東京 🚀"),
                Self.signature(token: token, client: "", offerID: "o'); DROP TABLE audit_log; --"),
                Self.signature(token: nil),
            ]
            let appends = unusual.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }
                + [AuditAppend(entry: AuditEntry(kind: "note", body: #"{"text":"quote \" backslash \\ newline \n é"}"#))]
            let time = Date(timeIntervalSince1970: 1_790_000_123.456)
            let records = try await onOwnThread { try fixture.store.appendAuditBlocking(appends, at: time) }

            #expect(records.map(\.sequence) == [1, 2, 3, 4])
            let stored = try await fixture.store.auditRecords(after: 0, limit: 10)
            #expect(stored == records, "what was returned is what was stored")
            #expect(stored.map(\.body) == appends.map(\.entry.body))
            #expect(stored.allSatisfy { $0.recordedAt.unixMilliseconds == 1_790_000_123_456 })
            #expect(try await fixture.store.verifiedChain().isIntact)

            let ledger = try await fixture.store.issuedSignatures(appAccountToken: token, bundleID: "com.example.app")
            #expect(ledger.map(\.signature) == [unusual[0], unusual[1]].map { signature in
                var expected = signature
                expected.issuedAt = Date(timeIntervalSince1970: Double(signature.issuedAt.unixMilliseconds) / 1000)
                return expected
            })
            #expect(ledger.map(\.auditSequence) == [1, 2])
            // The NULL token stays NULL (not an empty string).
            #expect(try await fixture.count("issued_signatures", where: "app_account_token IS NULL AND audit_seq = 3") == 1)
        }
    }

    @Test("A reused nonce is refused by name, and nothing of its batch is kept", arguments: StoreBackend.testedCases)
    func duplicateNonce(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let first = Self.signature(token: nil)
            _ = try await onOwnThread { try fixture.store.appendAuditBlocking([AuditAppend(entry: first.auditEntry, signatures: [first])], at: Date()) }

            let fresh = Self.signature(token: nil)
            let again = Self.signature(nonce: first.nonce, token: nil)
            await #expect {
                _ = try await onOwnThread {
                    try fixture.store.appendAuditBlocking(
                        [AuditAppend(entry: fresh.auditEntry, signatures: [fresh]), AuditAppend(entry: again.auditEntry, signatures: [again])], at: Date())
                }
            } throws: { error in
                guard let error = error as? StoreError else { return false }
                return error.code == .duplicate && error.message.contains(first.nonce)
            }
            #expect(try await fixture.count("audit_log") == 1)
            #expect(try await fixture.count("issued_signatures") == 1)

            // The transaction was closed: the next batch commits and chains on record 1.
            let next = try await onOwnThread { try fixture.store.appendAuditBlocking([AuditAppend(entry: fresh.auditEntry, signatures: [fresh])], at: Date()) }
            #expect(next.map(\.sequence) == [2])
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("A failure in the middle of a batch keeps nothing of it; the store goes on afterwards", arguments: StoreBackend.testedCases)
    func failureMidBatch(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            // The third ledger row of the batch fails, after two audit records and two ledger rows were inserted.
            try await fixture.refuseLedgerRows(offerID: "REFUSED")
            let batch = [Self.signature(token: nil), Self.signature(token: nil), Self.signature(token: nil, offerID: "REFUSED")]
            await #expect(throws: StoreError.self) {
                _ = try await onOwnThread { try fixture.store.appendAuditBlocking(batch.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }, at: Date()) }
            }
            #expect(try await fixture.count("audit_log") == 0)
            #expect(try await fixture.count("issued_signatures") == 0)

            let records = try await onOwnThread { try fixture.store.appendAuditBlocking(batch.prefix(2).map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }, at: Date()) }
            #expect(records.map(\.sequence) == [1, 2])
            #expect(try await fixture.count("issued_signatures") == 2)
            #expect(try await fixture.store.verifiedChain().isIntact)
        }
    }

    @Test("Appends from the committer and from the async API interleave into one chain", arguments: StoreBackend.testedCases)
    func interleaved(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            for round in 0..<50 {
                let signature = Self.signature(token: UUID().lowercasedString)
                if round.isMultiple(of: 2) {
                    _ = try await onOwnThread { try fixture.store.appendAuditBlocking([AuditAppend(entry: signature.auditEntry, signatures: [signature])], at: Date()) }
                } else {
                    _ = try await fixture.store.appendAudit([AuditAppend(entry: signature.auditEntry, signatures: [signature])], at: Date())
                }
            }
            let report = try await fixture.store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 50, "\(report)")
            #expect(try await fixture.count("issued_signatures") == 50)
        }
    }
}
