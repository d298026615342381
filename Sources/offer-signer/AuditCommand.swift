import ArgumentParser
import Foundation
import OfferSignerStorage

/// `offer-signer audit …`: check and read the tamper-evident audit log.
struct AuditCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "audit",
        abstract: "Verify, read and export the hash-chained audit log.",
        subcommands: [AuditVerifyCommand.self, AuditTailCommand.self, AuditExportCommand.self, AuditCheckpointsCommand.self]
    )
}

/// `offer-signer audit tail`.
struct AuditTailCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "tail", abstract: "Print the last audit records; --follow keeps printing new ones.")
    @OptionGroup var store: StoreOptions
    @Option(name: [.customShort("n"), .long], help: "How many records to show first.")
    var count: Int = 20
    @Flag(help: "Keep printing records as they are written.")
    var follow = false
    @Flag(help: "One JSON object per line.")
    var json = false

    func run() async throws {
        let store = try await store.open()
        let head = try await store.auditHead().count
        var last = max(0, head - Int64(max(0, count)))
        repeat {
            let records = try await store.auditRecords(after: last, limit: 1000)
            for record in records { print(json ? record.jsonLine : AuditFormatting.line(record)) }
            last = records.last?.sequence ?? last
            if follow && records.isEmpty { try await Task.sleep(for: .milliseconds(500)) }
        } while follow
    }
}

/// `offer-signer audit export`.
struct AuditExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "export", abstract: "Write audit records as JSON lines (for a SIEM).")
    @OptionGroup var store: StoreOptions
    @Option(help: "Only records at or after this time (ISO 8601, e.g. 2026-11-01T00:00:00Z).")
    var since: String?

    func validate() throws {
        if let since, (try? Date(since, strategy: .iso8601)) == nil {
            throw ValidationError("--since '\(since)' is not an ISO 8601 time like 2026-11-01T00:00:00Z")
        }
    }

    func run() async throws {
        let sinceDate = since.flatMap { try? Date($0, strategy: .iso8601) }
        let store = try await store.open()
        var last: Int64 = 0
        while true {
            let records = try await store.auditRecords(after: last, limit: 5000)
            guard let tail = records.last else { break }
            for record in records where sinceDate.map({ record.recordedAt >= $0 }) ?? true { print(record.jsonLine) }
            last = tail.sequence
        }
    }
}

enum AuditFormatting {
    static func line(_ record: AuditRecord) -> String {
        "#\(record.sequence)  \(KeyRegistry.timestamp(record.recordedAt) ?? "")  \(record.kind)  \(record.body)"
    }
}
