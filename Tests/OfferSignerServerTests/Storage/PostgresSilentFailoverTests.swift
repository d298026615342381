import Foundation
import Logging
import OfferSignerStorage
import PostgresNIO
import TestPostgres
import Testing

@testable import OfferSignerPostgres

/// A database that stops answering without closing its connections (a failover that moved its
/// address, a dropped NAT entry): PostgresNIO does not give up a query it sent, so the store must
/// close a connection whose operation outlived its deadline, or a pool of such connections keeps
/// it down for as long as TCP retries (about 15 minutes), though the database answers again.
@Suite("PostgreSQL connections that stop answering without a reset")
struct PostgresSilentFailoverTests {
    /// Runs set-up that can outlast the 2 s operation timeout while the full suite loads the
    /// machine (its first minute most): opening the store (migrations, first connections), filling
    /// the pool. Tried again, 2 s apart, up to ten times; only set-up, never what the test checks.
    static func settingUp<T>(_ body: () async throws -> T) async throws -> T {
        for _ in 1..<10 {
            do {
                return try await body()
            } catch {
                try await Task.sleep(for: .seconds(2))
            }
        }
        return try await body()
    }

    @Test("Connections frozen mid-use are closed at their deadlines, and the store answers through new ones within seconds")
    func frozenConnectionsAreReplaced() async throws {
        try StoreFixture.postgresAvailableOrSkip()
        try await TestPostgres.withDatabase { database in
            let proxy = try await FreezableProxy.start(to: database.configuration.host, port: database.configuration.port)
            var configuration = database.configuration
            configuration.host = "127.0.0.1"
            configuration.port = proxy.port
            configuration.poolSize = 4
            configuration.operationTimeout = .seconds(2)
            let store = try await Self.settingUp {
                try await PostgresStore.open(configuration: configuration, logger: StoreFixture.quietLogger)
            }
            do {
                // Every place of the pool holds a connection through the proxy.
                try await Self.settingUp {
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for _ in 0..<configuration.poolSize {
                            group.addTask {
                                try await store.transaction("filling the pool") { connection, logger in
                                    try await connection.run("SELECT pg_sleep(0.5)", logger: logger)
                                }
                            }
                        }
                        try await group.waitForAll()
                    }
                }
                let before = proxy.connectionCount
                #expect(before >= configuration.poolSize, "the pool opened \(before) connections")

                proxy.freezeExisting()
                let start = ContinuousClock.now
                var failures: [any Error] = []
                var answered = false
                // Without closing, every read waits on a frozen connection, then for a place in a
                // pool whose connections never come back: no answer within this minute.
                while ContinuousClock.now - start < .seconds(60) {
                    do {
                        _ = try await store.auditHead()
                        answered = true
                        break
                    } catch {
                        failures.append(error)
                    }
                }
                #expect(answered, "the store answered again after \(failures.count) failures: \(failures.suffix(2))")
                #expect(!failures.isEmpty, "the first reads met a frozen connection")
                #expect(failures.allSatisfy { ($0 as? StoreError)?.code == .unavailable }, "store errors, each within its deadline: \(failures)")
                #expect(proxy.connectionCount > before, "new connections replaced the frozen ones")
            } catch {
                await store.close()
                await proxy.stop()
                throw error
            }
            await store.close()
            await proxy.stop()
        }
    }
}
