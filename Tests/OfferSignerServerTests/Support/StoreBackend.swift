import Foundation
import GRDB
import Logging
import OfferSignerPostgres
import OfferSignerStorage
import TestPostgres
import TestChildProcess
import Testing

/// The two store engines every engine-independent store test runs against.
///
/// PostgreSQL comes from ``TestPostgres``: when none is available, the PostgreSQL cases are
/// left out outside CI (``PostgresAvailabilityTests`` is reported skipped with the reason) and
/// fail in CI.
enum StoreBackend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite
    case postgres

    var testDescription: String { rawValue }

    /// The backends the store tests run on: PostgreSQL too whenever it is available or CI
    /// demands it. When it is left out, ``PostgresAvailabilityTests`` is reported as skipped with
    /// the reason (a cancelled parameterized case would be reported as passed).
    static var testedCases: [StoreBackend] { TestPostgres.isEnabled ? allCases : [.sqlite] }
}

/// Makes the PostgreSQL cases' absence visible: skipped, with the reason, when no PostgreSQL is
/// available outside CI; otherwise a fresh database answers.
@Suite("PostgreSQL for the store tests")
struct PostgresAvailabilityTests {
    @Test(
        "The PostgreSQL cases of the store suites run",
        .enabled(if: TestPostgres.isEnabled, Comment(rawValue: "PostgreSQL cases skipped: \(TestPostgres.unavailableReason ?? "")")))
    func postgresCasesRun() async throws {
        let found = try await TestPostgres.withDatabase { database in
            try await TestPostgres.scalar("SELECT COUNT(*) FROM pg_database WHERE datname = '\(database.name)'")
        }
        #expect(found == 1)
    }
}

/// A fresh, empty store of one backend, with raw SQL for checks and injected faults.
final class StoreFixture: Sendable {
    let backend: StoreBackend
    let store: any OfferSignerStore
    /// SQLite: the temporary directory holding the file.
    let directory: URL?
    /// PostgreSQL: the fresh database.
    let database: TestPostgres.Database?

    var sqlitePath: String? { directory?.appendingPathComponent("store.sqlite").path }

    private init(backend: StoreBackend, store: any OfferSignerStore, directory: URL?, database: TestPostgres.Database?) {
        self.backend = backend
        self.store = store
        self.directory = directory
        self.database = database
    }

    static func postgresAvailableOrSkip() throws {
        guard let reason = TestPostgres.unavailableReason else { return }
        if TestPostgres.isCI { throw TestPostgres.Unavailable(description: "\(TestPostgres.requiredInCI) (\(reason))") }
        try Test.cancel("PostgreSQL case skipped: \(reason)")
    }

    static func make(_ backend: StoreBackend, poolSize: Int = 4) async throws -> StoreFixture {
        switch backend {
        case .sqlite:
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-store-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let store = try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path)
            return StoreFixture(backend: backend, store: store, directory: directory, database: nil)
        case .postgres:
            try postgresAvailableOrSkip()
            let database = try await TestPostgres.database()
            var configuration = database.configuration
            configuration.poolSize = poolSize
            do {
                let store = try await PostgresStore.open(configuration: configuration, logger: Self.quietLogger)
                return StoreFixture(backend: backend, store: store, directory: nil, database: database)
            } catch {
                await database.drop()
                throw error
            }
        }
    }

    static var quietLogger: Logger {
        var logger = Logger(label: "offer-signer-test")
        logger.logLevel = .warning
        return logger
    }

    /// Runs `body` on a fresh store of `backend`, then closes and removes it.
    static func with<T>(_ backend: StoreBackend, poolSize: Int = 4, _ body: (StoreFixture) async throws -> T) async throws -> T {
        let fixture = try await make(backend, poolSize: poolSize)
        do {
            let result = try await body(fixture)
            await fixture.cleanUp()
            return result
        } catch {
            await fixture.cleanUp()
            throw error
        }
    }

    /// Another instance on the same store (PostgreSQL: its own pool, as a second server would have).
    func openAnother(poolSize: Int = 4) async throws -> any OfferSignerStore {
        switch backend {
        case .sqlite:
            return try SQLiteStore(path: sqlitePath!)
        case .postgres:
            var configuration = database!.configuration
            configuration.poolSize = poolSize
            return try await PostgresStore.open(configuration: configuration, logger: Self.quietLogger)
        }
    }

    func cleanUp() async {
        await store.close()
        if let directory { try? FileManager.default.removeItem(at: directory) }
        if let database { await database.drop() }
    }

    /// Runs SQL behind the store's back (the statement must be valid on both engines).
    func execute(_ sql: String) async throws {
        switch backend {
        case .sqlite:
            // The serving process writes too (audit commits, the readiness write test): wait for it.
            var configuration = Configuration()
            configuration.busyMode = .timeout(10)
            try await DatabaseQueue(path: sqlitePath!, configuration: configuration).write { db in try db.execute(sql: sql) }
        case .postgres:
            try await TestPostgres.execute(sql, database: database!.name)
        }
    }

    func count(_ table: String, where condition: String = "TRUE") async throws -> Int {
        switch backend {
        case .sqlite:
            return try await DatabaseQueue(path: sqlitePath!).read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM \(table) WHERE \(condition)") ?? -1
            }
        case .postgres:
            return Int(try await TestPostgres.scalar("SELECT COUNT(*) FROM \(table) WHERE \(condition)", database: database!.name) ?? -1)
        }
    }

    /// Makes every ledger insert with this offer ID fail (a fault in the middle of a batch).
    func refuseLedgerRows(offerID: String) async throws {
        switch backend {
        case .sqlite:
            try await execute("CREATE TRIGGER refuse_offer BEFORE INSERT ON issued_signatures WHEN NEW.offer_id = '\(offerID)' BEGIN SELECT RAISE(ABORT, 'simulated failure'); END;")
        case .postgres:
            try await execute("""
                CREATE FUNCTION refuse_offer() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN IF NEW.offer_id = '\(offerID)' THEN RAISE EXCEPTION 'simulated failure'; END IF; RETURN NEW; END $$
                """)
            try await execute("CREATE TRIGGER refuse_offer BEFORE INSERT ON issued_signatures FOR EACH ROW EXECUTE FUNCTION refuse_offer()")
        }
    }
}

extension OfferSignerStore {
    /// The whole chain verified against the store's own checkpoints.
    func verifiedChain() async throws -> AuditVerificationReport {
        try await verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in })
    }
}

