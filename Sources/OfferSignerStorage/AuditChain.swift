import Crypto
import Foundation
import OfferSignerCore

/// The hash chain of the audit log.
///
/// Rule: record N's hash is SHA-256 over `previousHash \n sequence \n recordedAt(ms) \n kind
/// \n body`, and its `previousHash` is record N-1's hash (64 zeros for the first record), so
/// editing, deleting, inserting or reordering any record breaks every later link unless all
/// later hashes are recomputed — which signed checkpoints then expose.
public enum AuditChain {
    /// The `previousHash` of the first record.
    public static let genesisHash = String(repeating: "0", count: 64)

    public static func hash(previousHash: String, sequence: Int64, recordedAt: Date, kind: String, body: String) -> String {
        AuditVerification.hash(previousHash: previousHash, sequence: sequence, recordedAtMillis: recordedAt.unixMilliseconds, kind: kind, body: body)
    }

    /// The first problem found while walking a chain, or nil when it is intact.
    public struct Break: Sendable, Equatable, CustomStringConvertible {
        /// The sequence number of the first bad record (or where one is missing).
        public var sequence: Int64
        public var reason: String
        public var description: String { "record \(sequence): \(reason)" }
    }

    /// Walks records in order and checks each link; feed it every record from the first.
    public struct Walker: Sendable {
        public private(set) var expectedSequence: Int64 = 1
        public private(set) var headHash = AuditChain.genesisHash
        public private(set) var firstBreak: Break?

        public init() {}

        /// The number of records checked so far.
        public var count: Int64 { expectedSequence - 1 }

        /// Checks the next record; returns false once a break has been found.
        @discardableResult
        public mutating func check(_ record: AuditRecord) -> Bool {
            guard firstBreak == nil else { return false }
            if record.sequence != expectedSequence {
                let reason = record.sequence > expectedSequence
                    ? "missing: the chain jumps from \(expectedSequence - 1) to \(record.sequence) (records deleted)"
                    : "out of order: sequence \(record.sequence) follows \(expectedSequence - 1)"
                firstBreak = Break(sequence: expectedSequence, reason: reason)
                return false
            }
            if record.previousHash != headHash {
                firstBreak = Break(sequence: record.sequence, reason: "previousHash does not match the hash of record \(record.sequence - 1) (a record before it was changed, removed or inserted)")
                return false
            }
            let recomputed = AuditChain.hash(previousHash: record.previousHash, sequence: record.sequence, recordedAt: record.recordedAt, kind: record.kind, body: record.body)
            if recomputed != record.hash {
                firstBreak = Break(sequence: record.sequence, reason: "hash does not match its content (the record was edited)")
                return false
            }
            headHash = record.hash
            expectedSequence += 1
            return true
        }
    }
}
