import Foundation
import HTTPTypes
import HummingbirdTesting
import OfferSignerServer
import OfferSignerStorage
import Testing

@Suite("The server's periodic signed audit checkpoints", .serialized)
struct AuditCheckpointerTests {
    @Test("A checkpoint every N records, and a final one on graceful shutdown covering the head")
    func everyRecordsAndShutdown() async throws {
        let server = try await TestServer { configuration in
            configuration.checkpointEveryRecords = 10
            configuration.checkpointEvery = .seconds(600)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            for _ in 0..<25 {
                #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            }
            // Within a tick (1 s) of the chain growing by 10, a checkpoint covers it: so, once
            // writes stop, fewer than 10 records are left uncovered. (Where the checkpoints fall
            // depends on when the ticks land; an exact position would make the test flaky.)
            try await Task.sleep(for: .milliseconds(1500))
            let checkpoints = try await server.store.checkpoints()
            let headCount = try await server.store.auditHead().count
            #expect(headCount == 27)
            #expect(!checkpoints.isEmpty)
            #expect(headCount - (checkpoints.last?.sequence ?? 0) < 10, "head \(headCount), checkpoints \(checkpoints.map(\.sequence))")
            for _ in 0..<3 {
                #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            }
        }
        let head = try await server.store.auditHead()
        let latest = try #require(try await server.store.latestCheckpoint())
        #expect(latest.sequence == head.count, "the final checkpoint covers every record written")
        #expect(latest.headHash == head.hash)
        let key = try #require(try await server.store.auditSigningPublicKey())
        #expect(key.isValidSignature(of: latest))
        let report = try await server.store.verifyAudit()
        #expect(report.isIntact, "\(report)")
        #expect(report.coveredThrough == head.count)
        // Checkpoints add nothing to the chain itself, and no key material appears in it.
        let records = try await server.store.auditRecords(after: 0, limit: 1000)
        #expect(records.count == 2 + 28)  // key import, client creation, 28 signatures
        #expect(!records.contains { $0.body.contains("PRIVATE KEY") })
    }

    @Test("A checkpoint after the interval when the chain grew, none while it does not")
    func everyInterval() async throws {
        let server = try await TestServer { configuration in
            configuration.checkpointEveryRecords = 1_000_000
            configuration.checkpointEvery = .milliseconds(300)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            // A checkpoint covers the head once the interval has passed: waited for (up to 30 s),
            // not assumed after a fixed time (on CI's loaded cores the checkpointer ran later than
            // 1.2 s). A slow machine may also have checkpointed the two records written before the
            // signature, when the request took longer than the interval.
            let head = try await server.store.auditHead()
            let start = ContinuousClock.now
            var first = try await server.store.checkpoints()
            while first.last?.sequence != head.count && ContinuousClock.now - start < .seconds(30) {
                try await Task.sleep(for: .milliseconds(100))
                first = try await server.store.checkpoints()
            }
            #expect((1...2).contains(first.count), "\(first.map(\.sequence))")
            #expect(first.last?.sequence == head.count, "\(first.map(\.sequence)), head \(head.count)")
            try await Task.sleep(for: .milliseconds(1000))
            #expect(try await server.store.checkpoints() == first, "no new checkpoint while nothing is written")
        }
    }
}
