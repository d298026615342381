// The audit commit path on its own: appends signature audit entries, shaped as the service
// writes them, to a throw-away SQLite store in group commits of a fixed size, on one thread,
// with the store's maintenance (passive WAL checkpoints) running beside it as in `serve`.
// It prints the appending thread's CPU time per entry and per commit, so a change to the
// commit path can be compared without HTTP, signing and wrk sharing the machine.
//
//   swift run -c release offer-signer-store-benchmark [ENTRIES] [BATCH] [TOKENS]
//
// Defaults: 200,000 entries, 13 per commit (the server's mean group at saturation on the
// reference machine), 8,192 distinct appAccountTokens (as Scripts/benchmark.sh).
//
// With OFFER_SIGNER_BENCH_POSTGRES_URL set to an empty PostgreSQL database, the same appends go
// to a PostgresStore instead (each group commit: one transaction that locks the chain head once).
import Foundation
import OfferSignerCore
import OfferSignerPostgres
import OfferSignerStorage
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

@main
enum StoreBenchmark {
    static func threadCPUSeconds() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }

    static func fail(_ message: String) -> Never {
        FileHandle.standardError.write(Data("error: \(message)\n".utf8))
        exit(2)
    }

    static func main() async throws {
        let arguments = CommandLine.arguments.dropFirst().map { Int($0) }
        guard arguments.allSatisfy({ ($0 ?? 0) > 0 }) else { fail("usage: offer-signer-store-benchmark [ENTRIES] [BATCH] [TOKENS] (positive whole numbers)") }
        let entries = arguments.count > 0 ? arguments[0]! : 200_000
        let batchSize = arguments.count > 1 ? arguments[1]! : 13
        let tokenCount = arguments.count > 2 ? arguments[2]! : 8192

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-store-benchmark-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let store: any OfferSignerStore
        let engine: String
        if let url = ProcessInfo.processInfo.environment["OFFER_SIGNER_BENCH_POSTGRES_URL"], !url.isEmpty {
            let configuration: PostgresStoreConfiguration
            do {
                configuration = try PostgresStoreConfiguration(url: url, environment: ProcessInfo.processInfo.environment, poolSize: 4)
            } catch {
                fail("OFFER_SIGNER_BENCH_POSTGRES_URL: \(error)")
            }
            store = try await PostgresStore.open(configuration: configuration)
            guard try await store.isEmpty() else { fail("the PostgreSQL database \(configuration.redactedDescription) is not empty") }
            engine = "postgres"
        } else {
            store = try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path)
            engine = "sqlite"
        }
        try await store.prepareForServing()

        let tokens = (0..<tokenCount).map { _ in UUID().lowercasedString }

        // Maintenance beside the writer, about every second, as StoreMaintenance does in `serve`.
        let stop = Atomic<Bool>(false)
        let maintenance = Task {
            while !stop.load(ordering: .relaxed) {
                try? await Task.sleep(for: .seconds(1))
                try? await store.performMaintenance()
            }
        }

        @Sendable func batch(_ count: Int, from index: Int) -> [AuditAppend] {
            (0..<count).map { offset in
                let now = Date()
                let signature = IssuedSignature(
                    nonce: UUID.timeOrdered(at: now).lowercasedString, issuedAt: now, client: "client:bench", bundleID: "com.example.bench",
                    productID: "com.example.bench.monthly", offerID: "BENCH_OFFER", appAccountToken: tokens[(index + offset) % tokens.count],
                    keyID: "BENCH00001", format: "legacy")
                return AuditAppend(entry: signature.auditEntry, signatures: [signature])
            }
        }

        // The writer owns a thread, as the server's audit committer does.
        let result = await withCheckedContinuation { (continuation: CheckedContinuation<(wall: Double, cpu: Double, commits: Int), Never>) in
            let thread = Thread {
                let wallStart = Date()
                let cpuStart = threadCPUSeconds()
                var written = 0
                var commits = 0
                while written < entries {
                    let count = min(batchSize, entries - written)
                    do {
                        _ = try store.appendAuditBlocking(batch(count, from: written), at: Date())
                    } catch {
                        fail("append failed: \(error)")
                    }
                    written += count
                    commits += 1
                }
                continuation.resume(returning: (Date().timeIntervalSince(wallStart), threadCPUSeconds() - cpuStart, commits))
            }
            thread.start()
        }
        stop.store(true, ordering: .relaxed)
        maintenance.cancel()

        let walkStart = Date()
        let report = try await store.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in })
        guard report.isIntact, report.recordsChecked == Int64(entries) else { fail("the audit chain is not intact: \(report)") }
        print("STORE engine=\(engine) " + String(
            format: "entries=%d batch=%d commits=%d wall_s=%.2f entries_per_s=%.0f writer_cpu_us_per_entry=%.2f writer_cpu_us_per_commit=%.1f verify_s=%.2f",
            entries, batchSize, result.commits, result.wall, Double(entries) / result.wall, result.cpu * 1e6 / Double(entries),
            result.cpu * 1e6 / Double(result.commits), Date().timeIntervalSince(walkStart)))
        await store.close()
    }
}
