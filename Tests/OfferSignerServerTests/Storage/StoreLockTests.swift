import Foundation
import OfferSignerPostgres
import OfferSignerStorage
import Synchronization
import TestPostgres
import Testing

/// The store's exclusive locks between two instances of one PostgreSQL store (each with its own
/// pool, as two servers would have): a waiter that runs out of time is refused, and never runs
/// its body without the lock.
@Suite("Store locks between instances")
struct StoreLockTests {
    @Test("A customer lock held by one instance refuses another's wait with a timeout, and is free again once released")
    func lockTimeoutRefusesTheWaiter() async throws {
        try await StoreFixture.with(.postgres) { fixture in
            let other = try await fixture.openAnother()
            let lock = StoreLock.customer(bundleID: "com.example.app", appAccountToken: "6b29fc40-ca47-1067-b31d-00dd010662da")
            let (held, holding) = AsyncStream.makeStream(of: Void.self)
            let (release, releasing) = AsyncStream.makeStream(of: Void.self)
            let holder = Task {
                try await fixture.store.withExclusiveLock(lock, timeout: .seconds(30)) {
                    holding.yield()
                    for await _ in release {}
                }
            }
            for await _ in held { break }

            let bodyRan = Atomic<Bool>(false)
            await #expect {
                try await other.withExclusiveLock(lock, timeout: .milliseconds(300)) { bodyRan.store(true, ordering: .relaxed) }
            } throws: { error in
                (error as? StoreError)?.code == .timeout
            }
            #expect(bodyRan.load(ordering: .relaxed) == false, "the waiter ran its body without the lock")

            releasing.finish()
            try await holder.value
            let ran = try await other.withExclusiveLock(lock, timeout: .seconds(30)) { true }
            #expect(ran)
            await other.close()
        }
    }

    @Test("Three times as many requests as the pool has connections, each holding its customer lock and reading inside it: all go through")
    func customerLocksLeaveConnectionsForTheirBodies() async throws {
        try await StoreFixture.with(.postgres, poolSize: 4) { fixture in
            let store = fixture.store
            let start = ContinuousClock.now
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<12 {
                    group.addTask {
                        let token = "00000000-0000-4000-8000-\(String(format: "%012d", index))"
                        try await store.withExclusiveLock(.customer(bundleID: "com.example.app", appAccountToken: token), timeout: .seconds(30)) {
                            // What a signing request does under its lock: read the ledger, then commit.
                            _ = try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app")
                            _ = try await store.appendAudit([AuditAppend(entry: AuditEntry(kind: "test.note", body: #"{"n":\#(index)}"#))], at: Date())
                        }
                    }
                }
                try await group.waitForAll()
            }
            #expect(ContinuousClock.now - start < .seconds(30), "no request waited out the lock timeout")
            #expect(try await store.auditHead().count == 12)
        }
    }

    @Test("A customer lock's body reads on the lock's own connection: with every other connection of the pool taken, it reads the ledger and the stored history at once")
    func customerLockBodyReadsOnItsConnection() async throws {
        try await StoreFixture.with(.postgres, poolSize: 4) { fixture in
            let store = fixture.store
            let database = fixture.database!.name
            // Three of the four connections taken: one holds the checkpoint writer's lock, two
            // wait for it on the server.
            let (held, holding) = AsyncStream.makeStream(of: Void.self)
            let (release, releasing) = AsyncStream.makeStream(of: Void.self)
            let holder = Task {
                try await store.withExclusiveLock(.auditCheckpointWriter, timeout: .seconds(60)) {
                    holding.yield()
                    for await _ in release {}
                }
            }
            for await _ in held { break }
            let waiters = (0..<2).map { _ in Task { try await store.withExclusiveLock(.auditCheckpointWriter, timeout: .seconds(60)) {} } }
            let waitDeadline = ContinuousClock.now + .seconds(30)
            while try await TestPostgres.scalar("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND NOT granted", database: database) != 2 {
                #expect(ContinuousClock.now < waitDeadline, "the two waiters never waited on the server")
                if ContinuousClock.now >= waitDeadline { break }
                try await Task.sleep(for: .milliseconds(20))
            }
            // Whatever happens below, the pool is given back after 10 s.
            let watchdog = Task {
                try? await Task.sleep(for: .seconds(10))
                releasing.finish()
            }

            let token = "6b29fc40-ca47-1067-b31d-00dd010662da"
            let start = ContinuousClock.now
            let (ledger, version, history) = try await store.withExclusiveLock(.customer(bundleID: "com.example.app", appAccountToken: token), timeout: .seconds(30)) {
                (
                    try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app"),
                    try await store.appleHistoryVersion(bundleID: "com.example.app", environment: "Production", transactionID: "2000000000000001"),
                    try await store.appleHistory(bundleID: "com.example.app", environment: "Production", transactionID: "2000000000000001")
                )
            }
            #expect(ContinuousClock.now - start < .seconds(5), "the body's reads waited for a pooled connection")
            #expect(ledger.isEmpty && version == nil && history == nil)

            releasing.finish()
            watchdog.cancel()
            try await holder.value
            for waiter in waiters { try await waiter.value }
            // Outside a lock, the same reads take pooled connections as before.
            #expect(try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app").isEmpty)
        }
    }

    @Test("A store that keeps its pool open (as `serve` does) opens every connection at once, with no request")
    func servingStoreOpensItsPool() async throws {
        try StoreFixture.postgresAvailableOrSkip()
        try await TestPostgres.withDatabase { database in
            var configuration = database.configuration
            configuration.poolSize = 6
            configuration.keepsPoolOpen = true
            let store = try await PostgresStore.open(configuration: configuration, logger: StoreFixture.quietLogger)
            let sql = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()"
            let deadline = ContinuousClock.now + .seconds(30)
            var open: Int64 = 0
            while ContinuousClock.now < deadline {
                open = try await TestPostgres.scalar(sql) ?? 0
                if open >= 6 { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(open == 6, "connections open: \(open)")
            await store.close()
        }
    }

    @Test("Every customer lock is released after its body, whether the body returned, threw, or its wait ran out: no connection goes back to the pool holding one")
    func locksAreReleasedWhateverTheBodyDid() async throws {
        try await StoreFixture.with(.postgres, poolSize: 6) { fixture in
            let store = fixture.store
            let database = fixture.database!.name
            struct BodyFailed: Error {}
            try await withThrowingTaskGroup(of: Void.self) { group in
                for index in 0..<30 {
                    group.addTask {
                        // Three customers, so some requests wait for others' locks; a third of the
                        // waits are too short to last.
                        let token = "00000000-0000-4000-8000-\(String(format: "%012d", index % 3))"
                        let timeout: Duration = index % 3 == 2 ? .milliseconds(5) : .seconds(30)
                        do {
                            try await store.withExclusiveLock(.customer(bundleID: "com.example.app", appAccountToken: token), timeout: timeout) {
                                _ = try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app")
                                try await Task.sleep(for: .milliseconds(10))
                                if index % 2 == 0 { throw BodyFailed() }
                            }
                        } catch is BodyFailed {
                        } catch let error as StoreError where error.code == .timeout {
                        }
                    }
                }
                try await group.waitForAll()
            }
            let deadline = ContinuousClock.now + .seconds(10)
            var held: Int64? = nil
            while ContinuousClock.now < deadline {
                held = try await TestPostgres.scalar("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", database: database)
                if held == 0 { break }
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(held == 0, "advisory locks still held after every body ended: \(held ?? -1)")
            // And every customer can be locked again at once.
            for index in 0..<3 {
                let token = "00000000-0000-4000-8000-\(String(format: "%012d", index))"
                #expect(try await store.withExclusiveLock(.customer(bundleID: "com.example.app", appAccountToken: token), timeout: .seconds(2)) { true })
            }
        }
    }

    @Test("A customer lock whose connection is cut (pg_terminate_backend) fails its body's next read at once, and the store goes on with its pool whole")
    func lostLockConnectionFailsTheBody() async throws {
        try await StoreFixture.with(.postgres, poolSize: 4) { fixture in
            let store = fixture.store
            let database = fixture.database!.name
            let token = "6b29fc40-ca47-1067-b31d-00dd010662da"
            let lock = StoreLock.customer(bundleID: "com.example.app", appAccountToken: token)
            let failedRead = Mutex<Duration?>(nil)
            await #expect(throws: StoreError.self) {
                try await store.withExclusiveLock(lock, timeout: .seconds(30)) {
                    _ = try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app")
                    let cut = try await TestPostgres.scalar(
                        "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND granted", database: database)
                    #expect(cut == 1)
                    try await Task.sleep(for: .milliseconds(200))
                    let start = ContinuousClock.now
                    defer { failedRead.withLock { $0 = ContinuousClock.now - start } }
                    _ = try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app")
                }
            }
            let took = try #require(failedRead.withLock { $0 })
            #expect(took < .seconds(5), "the read on the lost connection took \(took)")
            // The pool of four lets one customer lock be held at a time: a place lost with the
            // connection would leave none.
            for _ in 0..<5 {
                let issuances = try await store.withExclusiveLock(lock, timeout: .seconds(10)) {
                    try await store.ledgerIssuances(appAccountToken: token, bundleID: "com.example.app")
                }
                #expect(issuances.isEmpty)
            }
        }
    }

    @Test("A wait for a customer lock that runs out just as the lock is granted leaves no lock behind (the server keeps a lock granted as lock_timeout fires)")
    func lockGrantedAsTheWaitRunsOutIsReleased() async throws {
        try await StoreFixture.with(.postgres, poolSize: 4) { fixture in
            let waiter = fixture.store
            let holder = try await fixture.openAnother()
            let database = fixture.database!.name
            let lock = StoreLock.customer(bundleID: "com.example.app", appAccountToken: "6b29fc40-ca47-1067-b31d-00dd010662da")
            let countHeld = "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            var timeouts = 0
            for round in 0..<300 {
                let (held, holding) = AsyncStream.makeStream(of: Void.self)
                // The holder lets go about when the waiter's 30 ms run out.
                let holderTask = Task {
                    try await holder.withExclusiveLock(lock, timeout: .seconds(30)) {
                        holding.yield()
                        try await Task.sleep(for: .microseconds(25_000 + (round % 10) * 1_000))
                    }
                }
                for await _ in held { break }
                do {
                    try await waiter.withExclusiveLock(lock, timeout: .milliseconds(30)) {}
                } catch let error as StoreError where error.code == .timeout {
                    timeouts += 1
                }
                try await holderTask.value
                // Once both are done, no one holds it.
                let deadline = ContinuousClock.now + .seconds(5)
                var count = try await TestPostgres.scalar(countHeld, database: database)
                while count != 0 && ContinuousClock.now < deadline {
                    try await Task.sleep(for: .milliseconds(10))
                    count = try await TestPostgres.scalar(countHeld, database: database)
                }
                #expect(count == 0, "round \(round): the lock is still held after both let go")
                if count != 0 { break }
            }
            #expect(timeouts > 0, "no wait ran out: the race was never tried")
            await holder.close()
        }
    }
}
