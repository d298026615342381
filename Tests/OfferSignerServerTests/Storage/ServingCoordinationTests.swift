import Dispatch
import Foundation
import GRDB
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import OfferSignerServer
import OfferSignerStorage
import Synchronization
import TestChildProcess
import Testing

/// What makes instances behave as one service, on the SQLite store: bounded waits on the store
/// (503, never a hang, and signing again once the store is back), one checkpoint interval for
/// every instance on one store, and the scope of rate limits in /metrics.
@Suite("Serving coordination (SQLite)", .serialized)
struct ServingCoordinationTests {
    static let body = #"{"productID":"p","offerID":"o"}"#

    @Test("A store that does not answer: 503 audit_unavailable within the store timeout, no signature; 201 again once it answers")
    func storeTimeoutFailsClosedAndRecovers() async throws {
        // SQLite's own wait for a lock (its busy timeout) is 60 s here, so a request that the
        // 300 ms store timeout did not end would wait for the blocker, which lets go only after
        // the answer: a wait under 10 s is the store timeout's doing, whatever the machine's load.
        let server = try await TestServer(busyTimeout: 60) { configuration in configuration.storeTimeout = .milliseconds(300) }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        // Another connection holds the write lock: every commit waits (up to SQLite's busy timeout).
        var blockerConfiguration = Configuration()
        blockerConfiguration.busyMode = .timeout(30)  // waits for a commit of the server's in progress
        let blocker = try DatabaseQueue(path: server.directory.appendingPathComponent("store.sqlite").path, configuration: blockerConfiguration)
        try await server.live { client in
            // Signing works before the store is blocked (retried: with a 300 ms store timeout, a
            // machine loaded by the other suites can make a commit late).
            let warmUpDeadline = ContinuousClock.now + .seconds(30)
            var first = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret).status
            while first != .created && ContinuousClock.now < warmUpDeadline {
                try await Task.sleep(for: .milliseconds(100))
                first = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret).status
            }
            #expect(first == .created)
            // The blocking transaction holds a thread of its own, not one of the concurrency
            // pool's (which the server under test needs).
            let held = DispatchSemaphore(value: 0)
            let release = DispatchSemaphore(value: 0)
            let holding = Mutex(false)
            Thread {
                try? blocker.inDatabase { db in
                    try db.inTransaction(.immediate) {
                        holding.withLock { $0 = true }
                        held.signal()
                        release.wait()
                        return .rollback
                    }
                }
                held.signal()  // also when the transaction could not begin
            }.start()
            // Let go of the lock however this test ends.
            defer { release.signal() }
            _ = try await onOwnThread { held.wait(timeout: .now() + 60) }
            try #require(holding.withLock { $0 }, "the blocking transaction did not begin")
            let start = ContinuousClock.now
            let refused = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret)
            let waited = ContinuousClock.now - start
            expectProblem(refused, .serviceUnavailable, "audit_unavailable")
            #expect(waited >= .milliseconds(250) && waited < .seconds(10), "a request waited \(waited) for a store that did not answer")
            release.signal()
            // Back: signing resumes without a restart (the stuck commit finishes first). Within
            // about a second here; the bound allows for a machine loaded by the other suites.
            let deadline = ContinuousClock.now + .seconds(30)
            var status = HTTPResponse.Status.serviceUnavailable
            while status != .created && ContinuousClock.now < deadline {
                status = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret).status
                if status != .created { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(status == .created)
        }
        // Every 201 has its audit record: the ledger holds no signature without one.
        let records = try await server.store.auditRecords(after: 0, limit: 1000)
        let signed = records.filter { $0.kind == "signature.issued" }
        let ledger = try server.issuedCount()
        #expect(signed.count >= 2 && signed.count == ledger)
    }

    @Test("Two instances on one store keep one checkpoint interval between them, not one each")
    func oneCheckpointIntervalForTheDeployment() async throws {
        let server = try await TestServer { configuration in
            configuration.checkpointEveryRecords = 1_000_000
            configuration.checkpointEvery = .milliseconds(400)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let second = try await buildApplication(configuration: server.configuration, store: server.store)
        let checkpoints = try await server.live { first in
            try await second.test(.live) { other in
                // 3 s of signing on both: the chain grows all the time.
                let end = ContinuousClock.now + .seconds(3)
                var turn = 0
                while ContinuousClock.now < end {
                    let client: any TestClientProtocol = turn.isMultiple(of: 2) ? first : other
                    #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret).status == .created)
                    turn += 1
                    try await Task.sleep(for: .milliseconds(20))
                }
                return try await server.store.checkpoints()
            }
        }
        // About one per 400 ms for the deployment (each instance alone would also make one per
        // 400 ms, twice as many in all); none closer than the interval to the one before.
        // At least one, and (a loaded machine may make fewer) never closer than the interval.
        #expect(checkpoints.count >= 1 && checkpoints.count <= 9, "\(checkpoints.count) checkpoints in 3 s")
        for (earlier, later) in zip(checkpoints, checkpoints.dropFirst()) {
            let gap = later.createdAt.timeIntervalSince(earlier.createdAt)
            #expect(gap >= 0.399, "checkpoints \(earlier.sequence) and \(later.sequence) are \(gap) s apart")
        }
    }

    @Test("/metrics says rate limits are per instance, with the configured rates")
    func rateLimitScopeInMetrics() async throws {
        let server = try await TestServer { configuration in
            configuration.clientRateLimit = RateLimit(perSecond: 200, burst: 400)
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 1, burst: 10)
        }
        defer { server.cleanUp() }
        try await server.live { client in
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).text
            #expect(metrics.contains(#"offer_signer_rate_limit_per_second{limit="client",scope="instance"} 200"#), "\(metrics)")
            #expect(metrics.contains(#"offer_signer_rate_limit_per_second{limit="app_account_token",scope="instance"} 1"#))
            #expect(metrics.contains(#"offer_signer_rate_limit_burst{limit="client",scope="instance"} 400"#))
            #expect(metrics.contains("enforced per instance: with N instances the effective limit is N times this"))
        }
    }
}
