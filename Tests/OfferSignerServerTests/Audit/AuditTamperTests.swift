import Foundation
import GRDB
import OfferSignerCore
import OfferSignerStorage
import TestChildProcess
import Testing

/// A small deterministic generator (SplitMix64), so a failing mutation can be replayed.
struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Ways to tamper with a chain, and the first bad record each one implies.
enum Tamper: CaseIterable, Sendable, CustomStringConvertible {
    case editBody, editKind, editTime, delete, swap, insert, truncate, rewrite

    var description: String {
        switch self {
        case .editBody: "edit body"
        case .editKind: "edit kind"
        case .editTime: "edit time"
        case .delete: "delete"
        case .swap: "swap two"
        case .insert: "insert forged"
        case .truncate: "truncate tail"
        case .rewrite: "edit and recompute all hashes"
        }
    }
}

/// Builds chains and applies mutations to them in memory.
enum ChainFactory {
    static let start = Date(timeIntervalSince1970: 1_790_000_000)

    static func chain(count: Int) -> [AuditRecord] {
        var records: [AuditRecord] = []
        records.reserveCapacity(count)
        var previous = AuditChain.genesisHash
        for index in 0..<count {
            let sequence = Int64(index + 1)
            let time = Date(timeIntervalSince1970: start.timeIntervalSince1970 + Double(index / 10))
            let kind = index % 97 == 0 ? "key.activated" : "signature.issued"
            let body = #"{"client":"load","offerID":"WINBACK50","nonce":"\#(UUID(uuid: uuidBytes(index)).uuidString.lowercased())"}"#
            let hash = AuditChain.hash(previousHash: previous, sequence: sequence, recordedAt: time, kind: kind, body: body)
            records.append(AuditRecord(sequence: sequence, recordedAt: time, kind: kind, body: body, previousHash: previous, hash: hash))
            previous = hash
        }
        return records
    }

    private static func uuidBytes(_ index: Int) -> uuid_t {
        let value = UInt64(index)
        return (0, 0, 0, 0, 0, 0, 0, 0, UInt8(value >> 56 & 0xFF), UInt8(value >> 48 & 0xFF), UInt8(value >> 40 & 0xFF), UInt8(value >> 32 & 0xFF),
            UInt8(value >> 24 & 0xFF), UInt8(value >> 16 & 0xFF), UInt8(value >> 8 & 0xFF), UInt8(value & 0xFF))
    }

    static func rehash(_ record: inout AuditRecord) {
        record.hash = AuditChain.hash(previousHash: record.previousHash, sequence: record.sequence, recordedAt: record.recordedAt, kind: record.kind, body: record.body)
    }

    /// Applies `tamper` at random positions; returns the mutated records, the first bad record
    /// the verifier must name and (for rewrites) the record actually edited.
    static func mutate(
        _ original: [AuditRecord], _ tamper: Tamper, checkpointSequences: [Int64], using random: inout SeededGenerator
    ) -> (records: [AuditRecord], firstBad: Int64, edited: Int64) {
        var records = original
        let count = records.count
        switch tamper {
        case .editBody:
            let index = Int.random(in: 0..<count, using: &random)
            records[index].body = records[index].body.replacingOccurrences(of: "WINBACK50", with: "WINBACK99")
            return (records, Int64(index + 1), Int64(index + 1))
        case .editKind:
            let index = Int.random(in: 0..<count, using: &random)
            records[index].kind = records[index].kind == "signature.issued" ? "signature.revoked" : "signature.issued"
            return (records, Int64(index + 1), Int64(index + 1))
        case .editTime:
            let index = Int.random(in: 0..<count, using: &random)
            records[index].recordedAt = records[index].recordedAt.addingTimeInterval(Double(Int.random(in: 1...86_400_000, using: &random)) / 1000)
            return (records, Int64(index + 1), Int64(index + 1))
        case .delete:
            let index = Int.random(in: 0..<count, using: &random)
            records.remove(at: index)
            return (records, Int64(index + 1), Int64(index + 1))
        case .swap:
            let first = Int.random(in: 0..<(count - 1), using: &random)
            let second = Int.random(in: (first + 1)..<count, using: &random)
            if Bool.random(using: &random) {
                // Rows swap places (each keeps its sequence number).
                records.swapAt(first, second)
            } else {
                // Contents swap (each position keeps its sequence number, as an SQL UPDATE would).
                let a = records[first], b = records[second]
                records[first] = AuditRecord(sequence: a.sequence, recordedAt: b.recordedAt, kind: b.kind, body: b.body, previousHash: b.previousHash, hash: b.hash)
                records[second] = AuditRecord(sequence: b.sequence, recordedAt: a.recordedAt, kind: a.kind, body: a.body, previousHash: a.previousHash, hash: a.hash)
            }
            return (records, Int64(first + 1), Int64(first + 1))
        case .insert:
            // A well-formed forgery at position `index`: it links to the record before it and its
            // own hash is right; the records after it are renumbered.
            let index = Int.random(in: 0..<count, using: &random)
            let previous = index == 0 ? AuditChain.genesisHash : records[index - 1].hash
            var forged = AuditRecord(
                sequence: Int64(index + 1), recordedAt: records[index].recordedAt, kind: "signature.issued",
                body: #"{"client":"forger","offerID":"FREE100"}"#, previousHash: previous, hash: "")
            rehash(&forged)
            for later in index..<count { records[later].sequence += 1 }
            records.insert(forged, at: index)
            return (records, Int64(index + 1), Int64(index + 1))
        case .truncate:
            let keep = Int.random(in: 0..<count, using: &random)
            records.removeSubrange(keep...)
            return (records, Int64(keep + 1), Int64(keep + 1))
        case .rewrite:
            let index = Int.random(in: 0..<count, using: &random)
            records[index].body = records[index].body.replacingOccurrences(of: "WINBACK50", with: "FREE100")
            for later in index..<count {
                if later > index { records[later].previousHash = records[later - 1].hash }
                rehash(&records[later])
            }
            // The checkpoints can only bound it: bad from the record after the last checkpoint
            // below the edit.
            let covered = checkpointSequences.filter { $0 < Int64(index + 1) }.max() ?? 0
            return (records, covered + 1, Int64(index + 1))
        }
    }
}

@Suite("Tamper-evident audit: pure verification against signed checkpoints")
struct AuditTamperTests {
    static let recordCount = 10_000
    static let checkpointEvery = 1_000

    static func signedCheckpoints(for records: [AuditRecord], key: AuditSigningKey) -> [AuditCheckpoint] {
        records.filter { $0.sequence % Int64(checkpointEvery) == 0 || $0.sequence == Int64(records.count) }
            .map { key.checkpoint(sequence: $0.sequence, headHash: $0.hash, at: ChainFactory.start) }
    }

    @Test("An intact chain verifies, with every checkpoint matched")
    func intact() {
        let records = ChainFactory.chain(count: Self.recordCount)
        let key = AuditSigningKey.generate()
        let checkpoints = Self.signedCheckpoints(for: records, key: key)
        let report = AuditVerification.verify(records: records, checkpoints: checkpoints, publicKey: key.publicKey)
        #expect(report.isIntact, "\(report)")
        #expect(report.recordsChecked == Int64(Self.recordCount))
        #expect(report.checkpointsMatched == checkpoints.count)
        #expect(report.coveredThrough == Int64(Self.recordCount))
        #expect(report.headHash == records.last?.hash)
        #expect(report.description.hasPrefix("intact: 10000 records"))
    }

    @Test("1,000 random mutations of a 10,000-record chain are all detected, naming the first bad record")
    func randomMutations() async throws {
        let records = ChainFactory.chain(count: Self.recordCount)
        let key = AuditSigningKey.generate()
        let checkpoints = Self.signedCheckpoints(for: records, key: key)
        let sequences = checkpoints.map(\.sequence)
        let publicKey = key.publicKey
        let workers = 4
        let perWorker = 1_000 / workers
        // Each worker is seconds of CPU without a suspension point: on threads of their own, so
        // they never hold the concurrency pool's threads (two on a 2-core machine) that every
        // server under test in the suite needs.
        let results = try await withThrowingTaskGroup(of: [(Tamper, Int64, Int64, AuditVerificationReport)].self) { group in
            for worker in 0..<workers {
                group.addTask {
                    try await onOwnThread {
                        var random = SeededGenerator(seed: 0xA0D1_7000 + UInt64(worker))
                        var results: [(Tamper, Int64, Int64, AuditVerificationReport)] = []
                        for round in 0..<perWorker {
                            let tamper = Tamper.allCases[(worker * perWorker + round) % Tamper.allCases.count]
                            let mutated = ChainFactory.mutate(records, tamper, checkpointSequences: sequences, using: &random)
                            let report = AuditVerification.verify(records: mutated.records, checkpoints: checkpoints, publicKey: publicKey)
                            results.append((tamper, mutated.firstBad, mutated.edited, report))
                        }
                        return results
                    }
                }
            }
            return try await group.reduce(into: []) { $0 += $1 }
        }
        #expect(results.count == 1_000)
        var detected = 0
        var byKind: [String: Int] = [:]
        for (tamper, firstBad, edited, report) in results {
            byKind[tamper.description, default: 0] += 1
            guard !report.isIntact else {
                Issue.record("\(tamper) at \(edited) was not detected: \(report)")
                continue
            }
            detected += 1
            #expect(report.firstBadRecord == firstBad, "\(tamper) at \(edited): expected record \(firstBad), got \(report)")
            #expect(report.checkpointProblems.isEmpty, "\(tamper): \(report.checkpointProblems)")
            if tamper == .rewrite {
                #expect(report.suspectRange?.contains(edited) == true, "rewrite at \(edited): \(report)")
            }
        }
        #expect(detected == 1_000)
        #expect(byKind.count == Tamper.allCases.count)
    }

    @Test("Without a checkpoint covering it, a recomputed chain cannot be told apart (why checkpoints go off the machine)")
    func rewriteNeedsCheckpoints() {
        var records = ChainFactory.chain(count: 50)
        records[9].body = #"{"forged":true}"#
        for index in 9..<records.count {
            if index > 9 { records[index].previousHash = records[index - 1].hash }
            ChainFactory.rehash(&records[index])
        }
        let key = AuditSigningKey.generate()
        #expect(AuditVerification.verify(records: records, checkpoints: [], publicKey: key.publicKey).isIntact)
        // A checkpoint signed before the edit (of record 8) does not cover record 10 either…
        let original = ChainFactory.chain(count: 50)
        let early = key.checkpoint(sequence: 8, headHash: original[7].hash)
        #expect(AuditVerification.verify(records: records, checkpoints: [early], publicKey: key.publicKey).isIntact)
        // …one of record 20 does.
        let later = key.checkpoint(sequence: 20, headHash: original[19].hash)
        let report = AuditVerification.verify(records: records, checkpoints: [early, later], publicKey: key.publicKey)
        #expect(report.firstBadRecord == 9)
        #expect(report.suspectRange == 9...20)
    }

    @Test("A forged record inserted exactly at a checkpoint's position is named, not taken for a rewrite")
    func insertAtCheckpoint() {
        let original = ChainFactory.chain(count: 100)
        let key = AuditSigningKey.generate()
        let checkpoints = [40, 50, 100].map { key.checkpoint(sequence: Int64($0), headHash: original[$0 - 1].hash) }
        var records = original
        var forged = AuditRecord(sequence: 50, recordedAt: records[49].recordedAt, kind: "signature.issued", body: "{}", previousHash: records[48].hash, hash: "")
        ChainFactory.rehash(&forged)
        for index in 49..<records.count { records[index].sequence += 1 }
        records.insert(forged, at: 49)
        let report = AuditVerification.verify(records: records, checkpoints: checkpoints, publicKey: key.publicKey)
        #expect(report.firstBadRecord == 50, "\(report)")
        #expect(report.suspectRange == nil)
        // The same forgery as the last record before the end of the data is still caught.
        let cut = Array(records.prefix(50))
        #expect(AuditVerification.verify(records: cut, checkpoints: checkpoints, publicKey: key.publicKey).firstBadRecord == 41)
    }

    @Test("Forged, altered or foreign checkpoints are reported and not trusted")
    func badCheckpoints() {
        let records = ChainFactory.chain(count: 100)
        let key = AuditSigningKey.generate()
        let good = key.checkpoint(sequence: 100, headHash: records[99].hash)

        var altered = good
        altered.sequence = 101  // claims more records than there are
        let alteredReport = AuditVerification.verify(records: records, checkpoints: [altered], publicKey: key.publicKey)
        #expect(!alteredReport.isIntact)
        #expect(alteredReport.firstBadRecord == nil, "an invalid checkpoint must not be used against the chain")
        #expect(alteredReport.checkpointProblems.first?.contains("signature is invalid") == true, "\(alteredReport)")

        let foreign = AuditSigningKey.generate().checkpoint(sequence: 100, headHash: records[99].hash)
        let foreignReport = AuditVerification.verify(records: records, checkpoints: [foreign], publicKey: key.publicKey)
        #expect(!foreignReport.isIntact)
        #expect(foreignReport.checkpointProblems.first?.contains("another key") == true, "\(foreignReport)")

        #expect(AuditVerification.verify(records: records, checkpoints: [good], publicKey: key.publicKey).isIntact)
    }

    @Test("A checkpoints export round-trips; a wrong fingerprint or garbage is refused")
    func exportFormat() throws {
        let records = ChainFactory.chain(count: 10)
        let key = AuditSigningKey.generate()
        let file = AuditCheckpointsFile(publicKey: key.publicKey, checkpoints: [key.checkpoint(sequence: 10, headHash: records[9].hash)])
        let parsed = try AuditCheckpointsFile(text: file.text)
        #expect(parsed.publicKey == key.publicKey)
        #expect(parsed.checkpoints == file.checkpoints)
        #expect(file.text.split(separator: "\n").first?.contains("BEGIN PUBLIC KEY") == true)
        #expect(!file.text.contains("PRIVATE"))
        #expect(AuditVerification.verify(records: records, checkpoints: parsed.checkpoints, publicKey: parsed.publicKey).isIntact)
        // The canonical signed bytes are stable.
        let canonical = String(decoding: AuditCheckpoint.canonicalBytes(sequence: 7, headHash: "ab", createdAtMillis: 1000, keyFingerprint: "cd"), as: UTF8.self)
        #expect(canonical == #"{"format":"offer-signer.audit-checkpoint.v1","sequence":7,"headHash":"ab","createdAt":1000,"keyFingerprint":"cd"}"#)

        let wrongFingerprint = file.text.replacingOccurrences(of: key.publicKey.fingerprint, with: String(repeating: "0", count: 64))
        #expect(throws: AuditCheckpointsFile.Malformed.self) { try AuditCheckpointsFile(text: wrongFingerprint) }
        #expect(throws: AuditCheckpointsFile.Malformed.self) { try AuditCheckpointsFile(text: "not json\n") }
        #expect(throws: AuditCheckpointsFile.Malformed.self) { try AuditCheckpointsFile(text: "") }
    }
}

/// The six kinds of tampering on a real SQLite file, done with SQL through a second connection.
@Suite("Tamper-evident audit: a real SQLite store mutated behind its back", .serialized)
struct SQLiteAuditTamperTests {
    /// A store with `count` audit records (key import, then signatures), a checkpoint of all of
    /// them exported as the off-machine copy.
    static func makeStore(count: Int = 300) async throws -> (TestServer, AuditCheckpointSet) {
        let server = try await TestServer()
        // Record 1 is the key import.
        var appended = 1
        while appended < count {
            let batch = (0..<min(50, count - appended)).map { index in
                AuditAppend(entry: AuditEntry(kind: "signature.issued", body: #"{"nonce":"\#(appended + index)","offerID":"WINBACK50"}"#))
            }
            _ = try await server.store.appendAudit(batch, at: Date())
            appended += batch.count
        }
        _ = try #require(try await AuditCheckpointing.create(in: server.store, masterKey: server.masterKey))
        let key = try #require(try await server.store.auditSigningPublicKey())
        let exported = AuditCheckpointSet(origin: "export", publicKey: key, checkpoints: try await server.store.checkpoints())
        #expect(try await server.store.verifyAudit(trusted: exported).isIntact)
        return (server, exported)
    }

    static func path(_ server: TestServer) -> String { server.directory.appendingPathComponent("store.sqlite").path }

    @Test("An edited body is named")
    func edit() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        try server.execute("UPDATE audit_log SET body = replace(body, 'WINBACK50', 'FREE100') WHERE seq = 123")
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(report.firstBadRecord == 123, "\(report)")
    }

    @Test("A deleted record is named")
    func delete() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        try server.execute("DELETE FROM audit_log WHERE seq = 77")
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(report.firstBadRecord == 77, "\(report)")
    }

    @Test("Two swapped records are named")
    func swap() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        try server.execute("UPDATE audit_log SET seq = -1 WHERE seq = 40; UPDATE audit_log SET seq = 40 WHERE seq = 200; UPDATE audit_log SET seq = 200 WHERE seq = -1")
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(report.firstBadRecord == 40, "\(report)")
    }

    @Test("A well-formed forged record inserted in the middle is named")
    func insert() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        let queue = try DatabaseQueue(path: Self.path(server))
        try await queue.write { db in
            let previous = try #require(try String.fetchOne(db, sql: "SELECT hash FROM audit_log WHERE seq = 149"))
            let millis = try #require(try Int64.fetchOne(db, sql: "SELECT recorded_at FROM audit_log WHERE seq = 150"))
            let body = #"{"nonce":"forged","offerID":"FREE100"}"#
            let hash = AuditChain.hash(previousHash: previous, sequence: 150, recordedAt: Date(timeIntervalSince1970: Double(millis) / 1000), kind: "signature.issued", body: body)
            try db.execute(sql: "UPDATE audit_log SET seq = -seq WHERE seq >= 150")
            try db.execute(sql: "UPDATE audit_log SET seq = 1 - seq WHERE seq < 0")
            try db.execute(sql: "INSERT INTO audit_log VALUES (150, ?, 'signature.issued', ?, ?, ?)", arguments: [millis, body, previous, hash])
        }
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(report.firstBadRecord == 150, "\(report)")
    }

    @Test("A truncated tail is named, even when the store's own checkpoints were removed too")
    func truncate() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        try server.execute("DELETE FROM audit_log WHERE seq >= 251; DELETE FROM audit_checkpoints")
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(report.firstBadRecord == 251, "\(report)")
        // The store alone cannot tell any more: that is why the export goes off the machine.
        #expect(try await server.store.verifyAudit().isIntact)
    }

    @Test("A chain rewritten with recomputed hashes is caught by the exported checkpoint; the service refuses to sign over it")
    func rewrite() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        let queue = try DatabaseQueue(path: Self.path(server))
        try await queue.write { db in
            try db.execute(sql: "UPDATE audit_log SET body = replace(body, 'WINBACK50', 'FREE100') WHERE seq = 222")
            var previous = try #require(try String.fetchOne(db, sql: "SELECT hash FROM audit_log WHERE seq = 221"))
            let rows = try Row.fetchAll(db, sql: "SELECT seq, recorded_at, kind, body FROM audit_log WHERE seq >= 222 ORDER BY seq")
            for row in rows {
                let sequence: Int64 = row["seq"]
                let millis: Int64 = row["recorded_at"]
                let hash = AuditChain.hash(previousHash: previous, sequence: sequence, recordedAt: Date(timeIntervalSince1970: Double(millis) / 1000), kind: row["kind"], body: row["body"])
                try db.execute(sql: "UPDATE audit_log SET previous_hash = ?, hash = ? WHERE seq = ?", arguments: [previous, hash, sequence])
                previous = hash
            }
        }
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(!report.isIntact)
        #expect(report.firstBadRecord == 1, "only one checkpoint (of record 300): everything up to it is suspect; \(report)")
        #expect(report.suspectRange?.contains(222) == true)
        // Signing a new checkpoint over it is refused.
        _ = try await server.store.appendAudit([AuditAppend(entry: AuditEntry(kind: "signature.issued", body: "{}"))], at: Date())
        await #expect(throws: StoreError.self) { _ = try await AuditCheckpointing.create(in: server.store, masterKey: server.masterKey) }
    }

    @Test("A new checkpoint covers exactly the records since the last one, and is refused over an edit, a NULL or a gap among them")
    func checkpointChecksTheNewSegment() async throws {
        // Records 301…400 follow the checkpoint of 300 that makeStore signed.
        func grow(_ server: TestServer) async throws {
            for first in stride(from: 301, to: 401, by: 50) {
                _ = try await server.store.appendAudit(
                    (first..<first + 50).map { AuditAppend(entry: AuditEntry(kind: "signature.issued", body: #"{"nonce":"\#($0)","offerID":"WINBACK50"}"#)) },
                    at: Date())
            }
        }
        do {
            let (server, _) = try await Self.makeStore()
            defer { server.cleanUp() }
            try await grow(server)
            // The walk stops where it is told: through 350 of 400.
            let head = try await server.store.auditHead()
            let anchor = try #require(try await server.store.auditRecords(after: 299, limit: 1).first)
            let partial = try await server.store.continueAuditVerification(
                AuditVerification.Verifier(checkpoints: [], startingAfter: 300, hash: anchor.hash), through: 350)
            #expect(partial.count == 350)
            #expect(partial.finish().headHash == (try await server.store.auditRecords(after: 349, limit: 1).first?.hash))
            let checkpoint = try #require(try await AuditCheckpointing.create(in: server.store, masterKey: server.masterKey))
            #expect(checkpoint.sequence == 400 && checkpoint.headHash == head.hash)
            #expect(try await server.store.verifyAudit().isIntact)
        }
        for (tamper, bad) in [
            ("UPDATE audit_log SET body = replace(body, 'WINBACK50', 'FREE100') WHERE seq = 345", "audit record 345 is bad"),
            ("UPDATE audit_log SET kind = NULL WHERE seq = 360", "audit record 360 is bad: a column is NULL"),
            ("DELETE FROM audit_log WHERE seq = 333", "audit record 333 is bad: missing"),
        ] {
            let (server, _) = try await Self.makeStore()
            defer { server.cleanUp() }
            try await grow(server)
            if tamper.contains("NULL") {
                // audit_log.kind is NOT NULL: put a copy of the table without the constraint in its place.
                try server.execute("""
                    PRAGMA foreign_keys = OFF;
                    CREATE TABLE audit_log_loose (seq INTEGER PRIMARY KEY, recorded_at INTEGER, kind TEXT, body TEXT, previous_hash TEXT, hash TEXT);
                    INSERT INTO audit_log_loose SELECT * FROM audit_log;
                    DROP TABLE audit_log;
                    ALTER TABLE audit_log_loose RENAME TO audit_log;
                    """)
            }
            try server.execute(tamper)
            do {
                _ = try await AuditCheckpointing.create(in: server.store, masterKey: server.masterKey)
                Issue.record("a checkpoint was signed over a tampered segment (\(tamper))")
            } catch let error as StoreError {
                #expect(error.code == .conflict && error.message.contains(bad), "\(tamper): \(error.message)")
            }
            #expect(try await server.store.latestCheckpoint()?.sequence == 300, "nothing newer than the untouched checkpoint")
        }
    }

    @Test("A replaced audit-signing key in the store is reported against the exported one")
    func replacedKey() async throws {
        let (server, exported) = try await Self.makeStore()
        defer { server.cleanUp() }
        let impostor = AuditSigningKey.generate()
        try server.execute("UPDATE audit_signing_key SET public_key_pem = '\(impostor.publicKey.pem)', fingerprint = '\(impostor.publicKey.fingerprint)'")
        let report = try await server.store.verifyAudit(trusted: exported)
        #expect(!report.isIntact)
        #expect(report.checkpointProblems.contains { $0.contains("replaced") }, "\(report)")
        // Its sealed private key no longer matches: the service cannot be made to sign with it.
        await #expect(throws: StoreError.self) { _ = try await server.store.auditSigningKey(masterKey: server.masterKey) }
    }
}
