import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Logging
import OfferSignerCore
@testable import OfferSignerPostgres
import OfferSignerStorage
import TestPostgres
import Testing

@testable import OfferSignerServer

/// The rules of `OfferSignerStore` that do not depend on the engine, checked on SQLite and on
/// PostgreSQL alike: the key registry, clients, the master key, audited changes, checkpoints,
/// verification and the group committer.
@Suite("Store conformance: the same rules on SQLite and PostgreSQL")
struct StoreConformanceTests {
    static func importKey(_ store: any OfferSignerStore, _ masterKey: MasterKey, id: String, bundle: String = "com.example.app") async throws -> SigningKeyRecord {
        let key = try InAppPurchaseKey.generateForDevelopment(keyID: id)
        return try await KeyRegistry.importKey(key, bundleID: bundle, issuerID: nil, development: true, into: store, masterKey: masterKey, actor: "test", reason: "conformance")
    }

    @Test("Keys: first import is active, later ones ready; activation retires the previous key; refusals; every change audited", arguments: StoreBackend.testedCases)
    func keyLifecycle(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            let versionBefore = try await store.registryVersion()
            let first = try await Self.importKey(store, masterKey, id: "KEYAAAAAA1")
            let second = try await Self.importKey(store, masterKey, id: "KEYAAAAAA2")
            let other = try await Self.importKey(store, masterKey, id: "KEYBBBBBB1", bundle: "com.example.other")
            #expect(first.state == .active && second.state == .ready && other.state == .active)
            #expect(try await store.registryVersion() == versionBefore + 3)

            await #expect { _ = try await Self.importKey(store, masterKey, id: "KEYAAAAAA1") } throws: { ($0 as? StoreError)?.code == .duplicate }

            let activated = try await store.transitionKey(keyID: "KEYAAAAAA2", to: .active, actor: "ops", reason: "rotation", force: false, authenticator: masterKey.registryRows)
            #expect(activated.state == .active && activated.activatedAt != nil)
            let keys = try await store.listKeys()
            #expect(keys.map(\.keyID) == ["KEYAAAAAA1", "KEYAAAAAA2", "KEYBBBBBB1"], "import order")
            #expect(keys.first { $0.keyID == "KEYAAAAAA1" }?.state == .retired)
            #expect(keys.allSatisfy { $0.sealedPrivateKey.count > 0 })
            #expect(keys[0].sealedPrivateKey == first.sealedPrivateKey, "sealed bytes are stored as they are")

            await #expect { _ = try await store.transitionKey(keyID: "KEYAAAAAA2", to: .retired, actor: "ops", reason: nil, force: false, authenticator: masterKey.registryRows) } throws: {
                ($0 as? StoreError)?.code == .conflict
            }
            await #expect { _ = try await store.transitionKey(keyID: "NOSUCHKEY1", to: .active, actor: "ops", reason: nil, force: false, authenticator: masterKey.registryRows) } throws: {
                ($0 as? StoreError)?.code == .notFound
            }
            let revoked = try await store.transitionKey(keyID: "KEYAAAAAA1", to: .revoked, actor: "ops", reason: "leaked", force: false, authenticator: masterKey.registryRows)
            #expect(revoked.state == .revoked && revoked.revokedAt != nil)
            await #expect { _ = try await store.transitionKey(keyID: "KEYAAAAAA1", to: .active, actor: "ops", reason: nil, force: false, authenticator: masterKey.registryRows) } throws: {
                ($0 as? StoreError)?.code == .conflict
            }

            let snapshot = try await store.registrySnapshot()
            #expect(snapshot.version == (try await store.registryVersion()))
            #expect(snapshot.keys == (try await store.listKeys()))

            let records = try await store.auditRecords(after: 0, limit: 100)
            #expect(records.map(\.kind) == ["key.imported", "key.imported", "key.imported", "key.activated", "key.revoked"])
            #expect(records[3].body.contains(#""previousActiveKeyID":"KEYAAAAAA1""#) && records[3].body.contains(#""reason":"rotation""#))
            #expect(try await store.verifiedChain().isIntact)
        }
    }

    @Test("Clients: created, listed, refused twice by name, revoked once; the master key binds on first use", arguments: StoreBackend.testedCases)
    func clientsAndMasterKey(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            try await store.bindMasterKey(masterKey)
            try await store.bindMasterKey(masterKey)
            await #expect { try await store.bindMasterKey(MasterKey.generate().key) } throws: { ($0 as? StoreError)?.code == .masterKeyMismatch }

            let created = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: ["com.example.app", "com.example.other"], actor: "ops", masterKey: masterKey)
            _ = try await APIClientCredentials.create(in: store, name: "all-apps", bundleIDs: [], actor: "ops", masterKey: masterKey)
            await #expect { _ = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "ops", masterKey: masterKey) } throws: {
                ($0 as? StoreError)?.code == .duplicate
            }
            let listed = try await store.listClients()
            #expect(Set(listed.map(\.name)) == ["backend", "all-apps"])
            #expect(listed.first { $0.name == "backend" } == created.client.withMillisecondTimes)
            #expect(listed.first { $0.name == "all-apps" }?.bundleIDs == [])

            let revoked = try await store.revokeClient(name: "backend", actor: "ops", authenticator: masterKey.registryRows)
            #expect(revoked.isRevoked)
            await #expect { _ = try await store.revokeClient(name: "backend", actor: "ops", authenticator: masterKey.registryRows) } throws: { ($0 as? StoreError)?.code == .conflict }
            await #expect { _ = try await store.revokeClient(name: "nobody", actor: "ops", authenticator: masterKey.registryRows) } throws: { ($0 as? StoreError)?.code == .notFound }
            #expect(try await store.listClients().first { $0.name == "backend" }?.isRevoked == true)
            #expect(try await store.auditRecords(after: 0, limit: 10).map(\.kind) == ["client.created", "client.created", "client.revoked"])
        }
    }

    @Test("Checkpoints: one signing key; the same checkpoint twice is no change, another head hash a conflict; verify matches them", arguments: StoreBackend.testedCases)
    func checkpoints(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            #expect(try await store.auditSigningPublicKey() == nil)
            let key = try await store.auditSigningKey(masterKey: masterKey)
            #expect(try await store.auditSigningKey(masterKey: masterKey).publicKey == key.publicKey)
            #expect(try await store.auditSigningPublicKey() == key.publicKey)

            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(5), at: Date())
            let checkpoint = try #require(try await AuditCheckpointing.create(in: store, masterKey: masterKey))
            #expect(checkpoint.sequence == 5)
            #expect(try await AuditCheckpointing.create(in: store, masterKey: masterKey) == nil, "nothing new to vouch for")
            #expect(try await store.appendCheckpoint(checkpoint) == false)
            let forged = key.checkpoint(sequence: 5, headHash: String(repeating: "a", count: 64))
            await #expect { _ = try await store.appendCheckpoint(forged) } throws: { ($0 as? StoreError)?.code == .conflict }

            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(3), at: Date())
            _ = try await AuditCheckpointing.create(in: store, masterKey: masterKey)
            #expect(try await store.checkpoints().map(\.sequence) == [5, 8])
            #expect(try await store.latestCheckpoint()?.sequence == 8)
            let report = try await store.verifiedChain()
            #expect(report.isIntact && report.checkpointsMatched == 2 && report.coveredThrough == 8, "\(report)")
        }
    }

    @Test("The notification catch-up's watermark: none at first, set per app and environment, never moved back; the recovery lock is exclusive", arguments: StoreBackend.testedCases)
    func notificationRecoveryWatermark(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            #expect(try await store.notificationRecoveryWatermark(bundleID: "com.example.app", environment: "Production") == nil)
            let first = Date(timeIntervalSince1970: 1_790_000_000)
            try await store.setNotificationRecoveryWatermark(bundleID: "com.example.app", environment: "Production", recoveredUntil: first, at: first)
            #expect(try await store.notificationRecoveryWatermark(bundleID: "com.example.app", environment: "Production") == first)
            #expect(try await store.notificationRecoveryWatermark(bundleID: "com.example.app", environment: "Sandbox") == nil)
            try await store.setNotificationRecoveryWatermark(
                bundleID: "com.example.app", environment: "Production", recoveredUntil: first.addingTimeInterval(-60), at: first)
            #expect(try await store.notificationRecoveryWatermark(bundleID: "com.example.app", environment: "Production") == first, "never back")
            // The run's time moves on even when the watermark is held.
            #expect(try await store.notificationRecoveryLastRun(bundleID: "com.example.app", environment: "Sandbox") == nil)
            try await store.setNotificationRecoveryWatermark(
                bundleID: "com.example.app", environment: "Production", recoveredUntil: first, at: first.addingTimeInterval(3600))
            #expect(try await store.notificationRecoveryLastRun(bundleID: "com.example.app", environment: "Production") == first.addingTimeInterval(3600))
            #expect(try await store.notificationRecoveryWatermark(bundleID: "com.example.app", environment: "Production") == first)
            #expect(try await store.appleNotificationReceivedAt(notificationUUID: "nothing-stored") == nil)

            let lock = StoreLock.notificationRecovery(bundleID: "com.example.app", environment: "Production")
            _ = try await store.withExclusiveLock(lock, timeout: .seconds(5)) {
                await #expect { _ = try await store.withExclusiveLock(lock, timeout: .milliseconds(200)) {} } throws: {
                    ($0 as? StoreError)?.code == .timeout
                }
            }
        }
    }

    @Test("An edited record is named by verification, and no checkpoint is signed over it", arguments: StoreBackend.testedCases)
    func editedRecordIsNamed(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let masterKey = MasterKey.generate().key
            // Bound before the first record, as every writer does (the audit-signing key row is made then).
            try await store.bindMasterKey(masterKey)
            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(10), at: Date())
            _ = try await AuditCheckpointing.create(in: store, masterKey: masterKey)
            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(5), at: Date())
            try await fixture.execute(#"UPDATE audit_log SET body = '{"n":2}' WHERE seq = 12"#)
            let report = try await store.verifiedChain()
            #expect(report.firstBadRecord == 12, "\(report)")
            await #expect { _ = try await AuditCheckpointing.create(in: store, masterKey: masterKey) } throws: { ($0 as? StoreError)?.code == .conflict }
        }
    }

    @Test("The group committer: a reused nonce fails its own request only; the others of its group are committed", arguments: StoreBackend.testedCases)
    func committerIsolatesAReusedNonce(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            let used = AuditAppendTests.signature(token: nil)
            _ = try await store.appendAudit([AuditAppend(entry: used.auditEntry, signatures: [used])], at: Date())
            let committer = AuditCommitter(
                store: store, batchLimit: 512, commitDelay: .milliseconds(50), metrics: ServerMetrics(), logger: StoreFixture.quietLogger)
            let running = Task { try await committer.run() }
            let outcomes = await withTaskGroup(of: Bool.self) { group in
                for index in 0..<12 {
                    let signature = index == 5 ? AuditAppendTests.signature(nonce: used.nonce, token: nil) : AuditAppendTests.signature(token: nil)
                    group.addTask {
                        do {
                            _ = try await committer.commit(AuditAppend(entry: signature.auditEntry, signatures: [signature]))
                            return true
                        } catch {
                            return false
                        }
                    }
                }
                var results: [Bool] = []
                for await outcome in group { results.append(outcome) }
                return results
            }
            committer.stop()
            try await running.value
            #expect(outcomes.filter { $0 }.count == 11 && outcomes.filter { !$0 }.count == 1)
            #expect(try await fixture.count("issued_signatures") == 12)
            let report = try await store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 12, "\(report)")
        }
    }

    @Test("Groups with and without appAccountTokens keep each ledger row's token (none stays none) and its record's sequence", arguments: StoreBackend.testedCases)
    func groupsKeepEachRowsToken(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let store = fixture.store
            // The first group finds no head known to the store (PostgreSQL: the locking path),
            // the second appends on the head the first left (PostgreSQL: the one-statement path).
            let groups = [["token-a", nil, "token-b"], [nil, "token-c"]].map { $0.map { AuditAppendTests.signature(token: $0) } }
            for group in groups {
                _ = try await store.appendAudit(group.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }, at: Date())
            }
            let written = groups.flatMap { $0 }
            let rows = try await store.ledger(after: nil, limit: 100).sorted { $0.auditSequence < $1.auditSequence }
            #expect(rows.map(\.auditSequence) == [1, 2, 3, 4, 5])
            #expect(rows.map(\.signature.nonce) == written.map(\.nonce))
            #expect(rows.map(\.signature.appAccountToken) == written.map(\.appAccountToken))
            #expect(try await store.issuedSignatures(appAccountToken: "token-b", bundleID: "com.example.app").map(\.auditSequence) == [3])
            let report = try await store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 5, "\(report)")
        }
    }

    @Test("Two instances append concurrently to one chain: no gap, no fork, every ledger row has its record", arguments: StoreBackend.testedCases)
    func twoInstancesOneChain(backend: StoreBackend) async throws {
        try await StoreFixture.with(backend) { fixture in
            let second = try await fixture.openAnother()
            let stores: [any OfferSignerStore] = [fixture.store, second]
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, store) in stores.enumerated() {
                    for worker in 0..<4 {
                        group.addTask {
                            for round in 0..<15 {
                                let signatures = (0..<3).map { _ in AuditAppendTests.signature(token: "\(index)-\(worker)-\(round)") }
                                _ = try await store.appendAudit(signatures.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }, at: Date())
                            }
                        }
                    }
                }
                try await group.waitForAll()
            }
            await second.close()
            let report = try await fixture.store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 2 * 4 * 15 * 3, "\(report)")
            #expect(try await fixture.count("issued_signatures") == 2 * 4 * 15 * 3)
            #expect(try await fixture.store.auditHead().count == 360)
        }
    }
}

extension APIClientRecord {
    /// The record with its times cut to milliseconds, as the stores keep them.
    var withMillisecondTimes: APIClientRecord {
        var copy = self
        copy.createdAt = Date(timeIntervalSince1970: Double(createdAt.unixMilliseconds) / 1000)
        copy.revokedAt = revokedAt.map { Date(timeIntervalSince1970: Double($0.unixMilliseconds) / 1000) }
        return copy
    }
}

/// What only PostgreSQL has: schema versions shared by instances, read-only servers after a
/// failover, unreachable servers, passwords.
@Suite("PostgreSQL store: schema, failures and secrets", .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct PostgresStoreTests {
    @Test("Instances that open together migrate exactly once; a newer schema is refused with a clear message")
    func migrationsAndNewerSchema() async throws {
        try await TestPostgres.withDatabase { database in
            let stores = try await withThrowingTaskGroup(of: PostgresStore.self) { group in
                for _ in 0..<4 { group.addTask { try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger) } }
                var opened: [PostgresStore] = []
                for try await store in group { opened.append(store) }
                return opened
            }
            for store in stores { await store.close() }
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM schema_migrations", database: database.name) == Int64(PostgresStore.schemaVersion))
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM registry", database: database.name) == 1)

            let newer = PostgresStore.schemaVersion + 1
            try await TestPostgres.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (\(newer), 0)", database: database.name)
            await #expect {
                _ = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            } throws: { error in
                (error as? StoreError)?.message.contains(
                    "database schema version \(newer) is newer than this offer-signer knows (\(PostgresStore.schemaVersion)); upgrade offer-signer") == true
            }
        }
    }

    @Test("A lookup by transaction ID uses the primary key, in the generic plan of the history-version statement, before the table has statistics (a fresh deployment)")
    func transactionLookupUsesThePrimaryKey() async throws {
        try await TestPostgres.withDatabase { database in
            let store = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            await store.close()
            // One app's transactions, never analyzed (autovacuum off for the table, so it cannot
            // analyze them meanwhile): every row has the same bundle and environment.
            try await TestPostgres.execute("ALTER TABLE apple_transactions SET (autovacuum_enabled = off)", database: database.name)
            try await TestPostgres.execute(
                """
                INSERT INTO apple_transactions (bundle_id, environment, transaction_id, original_transaction_id, signed_date, decoded, jws)
                SELECT 'com.example.app', 'Production', (600000000 + n)::text, (600000000 + n - n % 6)::text, 0, '{}', 'x'
                FROM generate_series(1, 3000) AS n
                """, database: database.name)
            #expect(try await TestPostgres.scalar("SELECT reltuples::bigint FROM pg_class WHERE relname = 'apple_transactions'", database: database.name) == -1)
            // The statement the store prepares, in the generic plan PostgreSQL settles on after a
            // few executions.
            let plan = try await TestPostgres.text(
                [
                    "SET plan_cache_mode = force_generic_plan",
                    "PREPARE version(text, text, text) AS \(HistoryVersionLookup.sql)",
                    "EXPLAIN EXECUTE version('com.example.app', 'Production', '600000005')",
                ], database: database.name)
            #expect(plan.contains("apple_transactions_pkey"), "\(plan)")
            #expect(!plan.contains("apple_transactions_by_"), "\(plan)")
        }
    }

    @Test("The one-statement history read finds a subscription's items by index, before the tables have statistics (a fresh deployment)")
    func historyReadUsesTheIndexes() async throws {
        try await TestPostgres.withDatabase { database in
            let store = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            await store.close()
            // One app's subscriptions, never analyzed (autovacuum off, so it cannot analyze them
            // meanwhile): every row has the same bundle and environment, six transactions each.
            for table in ["apple_subscriptions", "apple_transactions", "apple_renewal_infos"] {
                try await TestPostgres.execute("ALTER TABLE \(table) SET (autovacuum_enabled = off)", database: database.name)
            }
            for insert in [
                """
                INSERT INTO apple_transactions (bundle_id, environment, transaction_id, original_transaction_id, signed_date, decoded, jws)
                SELECT 'com.example.app', 'Production', (600000000 + n)::text, (600000000 + n - n % 6)::text, 0, '{}', 'x'
                FROM generate_series(0, 2999) AS n
                """,
                """
                INSERT INTO apple_subscriptions (bundle_id, environment, original_transaction_id, complete, updated_at)
                SELECT 'com.example.app', 'Production', (600000000 + n * 6)::text, 0, 0 FROM generate_series(0, 499) AS n
                """,
                """
                INSERT INTO apple_renewal_infos (bundle_id, environment, original_transaction_id, signed_date, decoded, jws)
                SELECT 'com.example.app', 'Production', (600000000 + n * 6)::text, 0, '{}', 'x' FROM generate_series(0, 499) AS n
                """,
            ] {
                try await TestPostgres.execute(insert, database: database.name)
            }
            #expect(try await TestPostgres.scalar("SELECT reltuples::bigint FROM pg_class WHERE relname = 'apple_transactions'", database: database.name) == -1)
            // The statement as the store sends it: planned with its values.
            let plan = try await TestPostgres.text(
                [
                    "SET plan_cache_mode = force_custom_plan",
                    "PREPARE history(text, text, text) AS \(PostgresStore.historyReadSQL)",
                    "EXPLAIN EXECUTE history('com.example.app', 'Production', '600000009')",
                ], database: database.name)
            #expect(!plan.contains("Seq Scan"), "\(plan)")
            #expect(!plan.contains("Join Filter") && !plan.contains("Filter:"), "items filtered from a wider scan: \(plan)")
            #expect(plan.contains("apple_transactions_by_original"), "\(plan)")
            #expect(plan.contains("apple_renewal_infos_pkey"), "\(plan)")
            // And it reads that subscription: its six transactions and its renewal info.
            let store2 = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            let history = try #require(try await store2.appleHistory(bundleID: "com.example.app", environment: "Production", transactionID: "600000009"))
            #expect(history.subscription.originalTransactionID == "600000006")
            #expect(Set(history.transactions.map(\.key)) == Set((6...11).map { String(600000000 + $0) }))
            #expect(history.renewalInfos.count == 1)
            await store2.close()
        }
    }

    @Test("The one-statement append writes a group only on the head it names: on a moved head nothing, on the current head all of it")
    func oneStatementAppendOnKnownHead() async throws {
        try await TestPostgres.withDatabase { database in
            let store = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            let first = AuditAppendTests.signature(token: "token-a")
            let written = try await store.appendAudit([AuditAppend(entry: first.auditEntry, signatures: [first])], at: Date())
            let head = (written[0].sequence, written[0].hash)
            let group = [AuditAppendTests.signature(token: nil), AuditAppendTests.signature(token: "token-b")]
            let (records, signatures) = PostgresStore.chained(group.map { AuditAppend(entry: $0.auditEntry, signatures: [$0]) }, on: head, at: Date())
            func append(expecting expected: (Int64, String)) async throws -> Bool {
                try await store.boundedOnConnection("test append") { connection in
                    try await PostgresStore.appendAuditOnKnownHead(connection, StoreFixture.quietLogger, records: records, signatures: signatures, expected: expected)
                }
            }
            #expect(try await append(expecting: (0, AuditChain.genesisHash)) == false)
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM audit_log", database: database.name) == 1)
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM issued_signatures", database: database.name) == 1)
            #expect(try await append(expecting: head) == true)
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM audit_log", database: database.name) == 3)
            #expect(try await TestPostgres.scalar("SELECT COUNT(*) FROM issued_signatures WHERE app_account_token IS NULL", database: database.name) == 1)
            #expect(try await store.auditHead().count == 3)
            let report = try await store.verifiedChain()
            #expect(report.isIntact && report.recordsChecked == 3, "\(report)")
            await store.close()
        }
    }

    @Test("A connection whose audit statement failed (here: its preparation timed out on a lock) is not used again: appends succeed once the lock is gone")
    func failedPreparationDoesNotStick() async throws {
        try await TestPostgres.withDatabase { database in
            try await TestPostgres.execute("ALTER DATABASE \"\(database.name)\" SET lock_timeout = '300ms'")
            let store = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            // One append, so the store knows the head: the appends below all take the one-statement
            // path, each on a connection of its own that has never prepared that statement.
            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(1), at: Date())
            let locked = try await TestPostgres.holdLock("LOCK TABLE audit_log IN ACCESS EXCLUSIVE MODE", database: database.name)
            let started = ContinuousClock.now
            let failures = await withTaskGroup(of: Bool.self) { group in
                for _ in 0..<8 {
                    group.addTask { (try? await store.appendAudit(AuditServiceLifecycleTests.entries(1), at: Date())) == nil }
                }
                var failed = 0
                for await didFail in group where didFail { failed += 1 }
                return failed
            }
            #expect(failures == 8)
            // Each failed at its lock timeout; none waited for the operation timeout (180 s here),
            // as a query written to a connection closed on the way would.
            #expect(started.duration(to: .now) < .seconds(90))
            try await locked.release()
            for _ in 0..<12 {
                _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(1), at: Date())
            }
            #expect(try await store.auditHead().count == 13)
            await store.close()
        }
    }

    @Test("A read-only server (as after a failover) fails appends with store_unavailable naming SQLSTATE 25006; reads go on")
    func readOnlyServer() async throws {
        try await TestPostgres.withDatabase { database in
            let store = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            let masterKey = MasterKey.generate().key
            _ = try await store.auditSigningKey(masterKey: masterKey)
            _ = try await store.appendAudit(AuditServiceLifecycleTests.entries(1), at: Date())
            await store.close()
            try await TestPostgres.execute("ALTER DATABASE \"\(database.name)\" SET default_transaction_read_only = on")
            let readOnly = try await PostgresStore.open(configuration: database.configuration, logger: StoreFixture.quietLogger)
            await #expect {
                _ = try await readOnly.appendAudit(AuditServiceLifecycleTests.entries(1), at: Date())
            } throws: { error in
                guard let error = error as? StoreError else { return false }
                return error.code == .unavailable && error.message.contains("read-only") && error.message.contains("25006")
            }
            #expect(try await readOnly.auditHead().count == 1)
            // What is stored already is only read: the master key binds and the audit-signing key opens.
            try await readOnly.bindMasterKey(masterKey)
            _ = try await readOnly.auditSigningKey(masterKey: masterKey)
            await readOnly.close()
        }
    }

    @Test("A refused connection fails the open at once, naming the server but not the password")
    func refusedConnection() async throws {
        // Port 9 (discard): nothing listens on loopback, so the connection is refused. A long
        // operation timeout: the refusal comes at once, but the first seconds of a full test run
        // keep two cores so busy that a 15 s timeout has fired before the refusal was handled.
        let configuration = try PostgresStoreConfiguration(
            url: "postgres://offer:sekrit-password-123@127.0.0.1:9/db?sslmode=disable", operationTimeout: .seconds(120))
        await #expect {
            _ = try await PostgresStore.open(configuration: configuration, logger: StoreFixture.quietLogger)
        } throws: { error in
            guard let error = error as? StoreError else { return false }
            return error.code == .unavailable && !error.message.contains("sekrit-password-123") && error.message.contains("127.0.0.1:9")
                && error.message.contains("cannot connect")
        }
    }

    @Test("A server that accepts connections but never answers fails calls within the operation timeout; nothing hangs")
    func silentServerIsBounded() async throws {
        let listener = try SilentListener()
        defer { listener.close() }
        let configuration = try PostgresStoreConfiguration(
            url: "postgres://offer:sekrit-password-123@127.0.0.1:\(listener.port)/db?sslmode=disable", operationTimeout: .seconds(2),
            connectTimeout: .seconds(1))
        let start = ContinuousClock.now
        await #expect {
            _ = try await PostgresStore.open(configuration: configuration, logger: StoreFixture.quietLogger)
        } throws: { error in
            guard let error = error as? StoreError else { return false }
            return error.code == .unavailable && !error.message.contains("sekrit-password-123")
        }
        // Bounded by the 2 s operation timeout; the limit leaves room for the concurrency pool
        // stalling while the whole suite runs on a shared machine (a hang never ends).
        #expect(ContinuousClock.now - start < .seconds(150))
    }

    @Test("A wrong password fails with the server's message, which never holds the password")
    func wrongPassword() async throws {
        try StoreFixture.postgresAvailableOrSkip()
        try await TestPostgres.withDatabase { database in
            let wrong = "not-the-password-\(UUID().uuidString)"
            let configuration = try PostgresStoreConfiguration(url: database.url(password: wrong))
            // Asked again (up to three times) when the connection itself timed out, as it can
            // while the whole suite loads the machine: the server's answer is what is checked.
            var refusal: StoreError?
            for attempt in 1...3 {
                do {
                    _ = try await PostgresStore.open(configuration: configuration, logger: StoreFixture.quietLogger)
                    Issue.record("a wrong password opened the store")
                    return
                } catch let error as StoreError {
                    refusal = error
                    if error.message.contains("Connect timeout") && attempt < 3 { continue }
                    break
                }
            }
            let error = try #require(refusal)
            #expect(error.code == .unavailable)
            #expect(!error.message.contains(wrong), "the password is in the message")
            #expect(error.message.contains("password authentication failed"), "\(error.message)")
        }
    }
}

/// A loopback port whose connections the kernel accepts and nobody ever answers: a hung server.
final class SilentListener: Sendable {
    let descriptor: Int32
    let port: Int

    init() throws {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw StoreError(.unavailable, "socket() failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(descriptor, 16) == 0 else { throw StoreError(.unavailable, "bind/listen failed") }
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(descriptor, $0, &length) }
        }
        self.descriptor = descriptor
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    func close() { _ = Glibc.close(descriptor) }
}
