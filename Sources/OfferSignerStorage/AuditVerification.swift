import Crypto
import Foundation
import OfferSignerCore

/// Checkpoints from one source and the key that signed them.
public struct AuditCheckpointSet: Sendable {
    /// Where they come from, for messages ("checkpoints file 'x.jsonl'", "the store").
    public var origin: String
    /// The key trusted for this source; nil when the source has checkpoints but no key.
    public var publicKey: AuditSigningPublicKey?
    public var checkpoints: [AuditCheckpoint]

    public init(origin: String, publicKey: AuditSigningPublicKey?, checkpoints: [AuditCheckpoint]) {
        self.origin = origin
        self.publicKey = publicKey
        self.checkpoints = checkpoints
    }
}

/// What a verification found.
public struct AuditVerificationReport: Sendable, Equatable, CustomStringConvertible {
    /// Records whose links and hashes checked out, from the first.
    public var recordsChecked: Int64
    /// The hash of the last record checked.
    public var headHash: String
    /// The first bad record (or the first missing one), nil when none was found.
    public var firstBadRecord: Int64?
    /// Why `firstBadRecord` is bad.
    public var reason: String?
    /// When the chain was rewritten (hashes recomputed), the proof only bounds where: the
    /// first bad record is in this range (`firstBadRecord` is its start).
    public var suspectRange: ClosedRange<Int64>?
    /// Problems with the checkpoints themselves (bad signatures, replaced keys, disagreement).
    public var checkpointProblems: [String]
    /// Valid checkpoints the chain matched.
    public var checkpointsMatched: Int
    /// The highest sequence a matched checkpoint vouches for (0 when none).
    public var coveredThrough: Int64

    public var isIntact: Bool { firstBadRecord == nil && checkpointProblems.isEmpty }

    public var description: String {
        var lines: [String] = []
        if let firstBadRecord {
            lines.append("broken: record \(firstBadRecord): \(reason ?? "")")
        }
        lines += checkpointProblems.map { "broken: \($0)" }
        if isIntact {
            var line = "intact: \(recordsChecked) records, head \(headHash)"
            if checkpointsMatched > 0 {
                line += "; \(checkpointsMatched) signed checkpoint(s) matched, covering records 1…\(coveredThrough)"
                if recordsChecked > coveredThrough { line += " (\(recordsChecked - coveredThrough) newer record(s) not covered yet)" }
            } else {
                line += "; no signed checkpoint covers it (a recomputed chain would not be detected)"
            }
            lines.append(line)
        }
        return lines.joined(separator: "\n")
    }
}

/// Pure verification of an audit chain against signed checkpoints.
///
/// Rules:
/// - every record must follow the previous one (sequence + 1), link to its hash and hash to its
///   own content (see ``AuditChain``);
/// - every checkpoint must be validly signed by its source's key, and the record at its
///   sequence must have its head hash (else the chain was rewritten after it was signed);
/// - the chain must be at least as long as the longest checkpoint (else its tail was cut).
///
/// The first bad record is named exactly for edited, deleted, reordered and inserted records and
/// for a truncated tail; for a chain whose hashes were recomputed, the checkpoints bound it
/// to the records after the last matching checkpoint (``AuditVerificationReport/suspectRange``).
public enum AuditVerification {
    /// Verifies records (in stored order, from the first) against checkpoints.
    public static func verify(records: some Sequence<AuditRecord>, checkpoints: [AuditCheckpointSet]) -> AuditVerificationReport {
        var verifier = Verifier(checkpoints: checkpoints)
        for record in records {
            guard verifier.check(record) else { break }
        }
        return verifier.finish()
    }

    /// Verifies with one trusted key.
    public static func verify(records: some Sequence<AuditRecord>, checkpoints: [AuditCheckpoint], publicKey: AuditSigningPublicKey) -> AuditVerificationReport {
        verify(records: records, checkpoints: [AuditCheckpointSet(origin: "checkpoints", publicKey: publicKey, checkpoints: checkpoints)])
    }

    /// The streaming form: feed records in stored order, then call ``finish()``.
    public struct Verifier: Sendable {
        /// Valid checkpoints by ascending sequence.
        private var expected: [(sequence: Int64, headHash: String, origin: String)] = []
        private var nextExpected = 0
        private var checkpointProblems: [String] = []
        private var matched = 0
        private var coveredThrough: Int64 = 0

        private var expectedSequence: Int64
        private var headHash: String
        private var previousHeadHash: String
        private var firstBad: Int64?
        private var reason: String?
        private var suspectRange: ClosedRange<Int64>?
        /// A checkpoint mismatch at `sequence`, judged with the next record: when that one links
        /// past it, the record at the checkpoint was inserted rather than the chain rewritten.
        private var pendingRewrite: (from: Int64, sequence: Int64, origin: String)?

        /// Count of records that checked out.
        public var count: Int64 { expectedSequence - 1 }

        /// - Parameters:
        ///   - checkpoints: sources in order of trust (the off-machine copy first).
        ///   - sequence, hash: where the walk starts (0 and the genesis hash for a whole chain).
        public init(checkpoints: [AuditCheckpointSet], startingAfter sequence: Int64 = 0, hash: String = AuditChain.genesisHash) {
            expectedSequence = sequence + 1
            headHash = hash
            previousHeadHash = ""
            var bySequence: [Int64: (headHash: String, origin: String)] = [:]
            for set in checkpoints {
                for checkpoint in set.checkpoints {
                    guard let key = set.publicKey else {
                        checkpointProblems.append("\(set.origin) holds checkpoint \(checkpoint.sequence) but no audit-signing key to check it")
                        continue
                    }
                    guard key.isValidSignature(of: checkpoint) else {
                        let why = checkpoint.keyFingerprint == key.fingerprint ? "its signature is invalid (the checkpoint was altered)" : "it is signed by another key (\(checkpoint.keyFingerprint))"
                        checkpointProblems.append("checkpoint \(checkpoint.sequence) in \(set.origin): \(why)")
                        continue
                    }
                    if let existing = bySequence[checkpoint.sequence] {
                        if existing.headHash != checkpoint.headHash {
                            checkpointProblems.append("checkpoint \(checkpoint.sequence) in \(set.origin) disagrees with \(existing.origin) about the head hash")
                        }
                        continue
                    }
                    bySequence[checkpoint.sequence] = (checkpoint.headHash, set.origin)
                }
            }
            expected = bySequence.filter { $0.key > sequence }.map { (sequence: $0.key, headHash: $0.value.headHash, origin: $0.value.origin) }
                .sorted { $0.sequence < $1.sequence }
        }

        /// Checks the next record; returns false once a problem has been found.
        @discardableResult
        public mutating func check(_ record: AuditRecord) -> Bool {
            check(
                sequence: record.sequence, recordedAtMillis: record.recordedAt.unixMilliseconds, kind: record.kind, body: record.body,
                previousHash: record.previousHash, hash: record.hash)
        }

        /// Checks the next record, given as its stored columns.
        @discardableResult
        public mutating func check(sequence: Int64, recordedAtMillis: Int64, kind: String, body: String, previousHash: String, hash: String) -> Bool {
            guard firstBad == nil else { return false }
            if let pending = pendingRewrite {
                if sequence == expectedSequence && previousHash != headHash && previousHash == previousHeadHash {
                    fail(sequence - 1, "record \(sequence - 1) was inserted: record \(sequence) links to record \(sequence - 2), not to it")
                } else {
                    failRewrite(pending)
                }
                return false
            }
            if sequence != expectedSequence {
                if sequence > expectedSequence {
                    fail(expectedSequence, "missing: the chain jumps from \(expectedSequence - 1) to \(sequence) (deleted or moved)")
                } else {
                    fail(expectedSequence, "out of order: sequence \(sequence) where \(expectedSequence) belongs (records moved or duplicated)")
                }
                return false
            }
            if previousHash != headHash {
                if previousHash == previousHeadHash {
                    fail(sequence - 1, "record \(sequence - 1) was inserted: record \(sequence) links to record \(sequence - 2), not to it")
                } else {
                    fail(sequence, "its previousHash is not the hash of record \(sequence - 1) (it was moved, replaced or its link edited)")
                }
                return false
            }
            let recomputed = AuditVerification.hash(previousHash: previousHash, sequence: sequence, recordedAtMillis: recordedAtMillis, kind: kind, body: body)
            if recomputed != hash {
                fail(sequence, "its hash does not match its content (time, kind or body edited)")
                return false
            }
            previousHeadHash = headHash
            headHash = hash
            expectedSequence += 1
            if nextExpected < expected.count && expected[nextExpected].sequence == sequence {
                let checkpoint = expected[nextExpected]
                guard checkpoint.headHash == hash else {
                    pendingRewrite = (coveredThrough + 1, sequence, checkpoint.origin)
                    return true
                }
                matched += 1
                coveredThrough = sequence
                nextExpected += 1
            }
            return true
        }

        /// Records a record that cannot be read at all (at `sequence`, or where the next one belongs).
        public mutating func reject(sequence: Int64?, reason: String) {
            guard firstBad == nil else { return }
            if let pending = pendingRewrite {
                failRewrite(pending)
                return
            }
            fail(min(sequence ?? expectedSequence, expectedSequence), reason)
        }

        private mutating func failRewrite(_ pending: (from: Int64, sequence: Int64, origin: String)) {
            suspectRange = pending.from...pending.sequence
            fail(pending.from, "the chain was rewritten: record \(pending.sequence)'s hash differs from the one signed in the checkpoint of \(pending.sequence) records (\(pending.origin)); every record from \(pending.from) to \(pending.sequence) is suspect (hashes recomputed after an edit, insertion or deletion)")
        }

        private mutating func fail(_ sequence: Int64, _ why: String) {
            firstBad = sequence
            reason = why
        }

        /// The report. Call after the last record (or after ``check`` returned false).
        public func finish() -> AuditVerificationReport {
            var copy = self
            if let pending = copy.pendingRewrite, copy.firstBad == nil { copy.failRewrite(pending) }
            var firstBad = copy.firstBad
            var reason = copy.reason
            let suspectRange = copy.suspectRange
            if firstBad == nil, nextExpected < expected.count, let longest = expected.last {
                firstBad = count + 1
                reason = "missing: the chain ends at record \(count) but a signed checkpoint (\(longest.origin)) vouches for \(longest.sequence) records; records \(count + 1)…\(longest.sequence) were removed"
            }
            return AuditVerificationReport(
                recordsChecked: count, headHash: headHash, firstBadRecord: firstBad, reason: reason, suspectRange: suspectRange,
                checkpointProblems: checkpointProblems, checkpointsMatched: matched, coveredThrough: coveredThrough)
        }
    }

    /// ``AuditChain/hash(previousHash:sequence:recordedAt:kind:body:)`` from the stored
    /// millisecond time. The header (`previousHash \n sequence \n recordedAt \n kind \n`) is
    /// written as UTF-8 into one stack buffer, decimals included, and hashed with the body in
    /// place: no `String` built for it (that cost about 3,000 instructions a record).
    public static func hash(previousHash: String, sequence: Int64, recordedAtMillis: Int64, kind: String, body: String) -> String {
        var hasher = SHA256()
        var previousHash = previousHash
        var kind = kind
        previousHash.withUTF8 { previous in
            kind.withUTF8 { kind in
                // 20 digits and a sign at most per decimal, four newlines.
                withUnsafeTemporaryAllocation(of: UInt8.self, capacity: previous.count + kind.count + 2 * 21 + 4) { header in
                    var position = 0
                    func append(_ bytes: UnsafeBufferPointer<UInt8>) {
                        guard let source = bytes.baseAddress, let target = header.baseAddress else { return }
                        (target + position).initialize(from: source, count: bytes.count)
                        position += bytes.count
                    }
                    func appendDecimal(_ value: Int64) {
                        if value < 0 { header[position] = UInt8(ascii: "-"); position += 1 }
                        var magnitude = value.magnitude
                        var digits = 1
                        var scale: UInt64 = 1
                        while magnitude / scale >= 10 { scale *= 10; digits += 1 }
                        for _ in 0..<digits {
                            header[position] = UInt8(ascii: "0") + UInt8(magnitude / scale)
                            magnitude %= scale
                            scale /= 10
                            position += 1
                        }
                    }
                    let newline = UInt8(ascii: "\n")
                    append(previous)
                    header[position] = newline; position += 1
                    appendDecimal(sequence)
                    header[position] = newline; position += 1
                    appendDecimal(recordedAtMillis)
                    header[position] = newline; position += 1
                    append(kind)
                    header[position] = newline; position += 1
                    hasher.update(bufferPointer: UnsafeRawBufferPointer(start: header.baseAddress, count: position))
                }
            }
        }
        var body = body
        body.withUTF8 { hasher.update(bufferPointer: UnsafeRawBufferPointer($0)) }
        return Encoding.hex(hasher.finalize())
    }
}
