import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Logging
import NIOCore
import NIOSSL
import OfferSignerPostgres
import PostgresNIO
import Synchronization
import TestChildProcess

/// A PostgreSQL server for the tests, and a fresh database per test.
///
/// Where the server comes from, in order:
/// 1. `OFFER_SIGNER_TEST_POSTGRES_URL` (a superuser or a role allowed to CREATE DATABASE; its
///    server must ask for passwords, or the wrong-password tests fail);
/// 2. PostgreSQL's server binaries (`/usr/lib/postgresql/*/bin`, or `initdb` and `pg_ctl` on
///    PATH): a throw-away cluster is started once per test process in a temporary directory
///    (as the `postgres` user when running as root), on a free loopback port, with SCRAM
///    password authentication over TCP; it is stopped at process exit, and clusters left behind
///    by test processes that died are stopped and removed before a new one starts;
/// 3. neither: ``unavailableReason`` says why. With `CI` set, ``database()`` then throws (the
///    tests fail: "PostgreSQL is required in CI: apt-get install -y postgresql"); otherwise tests
///    skip their PostgreSQL cases with that reason (``isEnabled`` is false).
public enum TestPostgres {
    public static let requiredInCI = "PostgreSQL is required in CI: apt-get install -y postgresql"

    /// The role and password of the throw-away cluster (a test password, nothing else).
    static let clusterUser = "postgres"
    static let clusterPassword = "offer-signer-test-password"

    public struct Unavailable: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// The admin connection: where to create databases.
    struct Server: Sendable {
        var configuration: PostgresStoreConfiguration
    }

    /// Where the server comes from, found cheaply (environment and file checks; nothing started).
    enum Source: Sendable {
        case url(PostgresStoreConfiguration)
        case binaries(String)
        case none(String)
    }

    private static let source: Source = findSource()
    private static let startup = ClusterStartup()

    /// Why no PostgreSQL is available, nil when one is (or can be started).
    public static var unavailableReason: String? {
        if case .none(let reason) = source { return reason }
        return nil
    }

    /// Whether PostgreSQL tests should run: a server is available, or CI demands one (and the
    /// tests then fail with ``requiredInCI``).
    public static var isEnabled: Bool { unavailableReason == nil || isCI }

    public static var isCI: Bool {
        guard let value = ProcessInfo.processInfo.environment["CI"] else { return false }
        return !value.isEmpty && value != "0" && value.lowercased() != "false"
    }

    /// A fresh, empty database on the test server.
    public struct Database: Sendable {
        /// `postgres://…/name?sslmode=disable`, password included (a test password).
        public var url: String
        public var name: String
        /// The same URL without the password (for tests that pass it another way).
        public var urlWithoutPassword: String
        public var password: String?
        public var configuration: PostgresStoreConfiguration

        /// The URL with `password` in place of the real one.
        public func url(password: String) -> String {
            Self.url(configuration, password: password)
        }

        static func url(_ configuration: PostgresStoreConfiguration, password: String?) -> String {
            var allowed = CharacterSet.alphanumerics
            allowed.insert(charactersIn: "-._~")
            let user = configuration.username.addingPercentEncoding(withAllowedCharacters: allowed) ?? configuration.username
            let secret = password.map { ":" + ($0.addingPercentEncoding(withAllowedCharacters: allowed) ?? $0) } ?? ""
            let host = configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
            return "postgres://\(user)\(secret)@\(host):\(configuration.port)/\(configuration.database)?sslmode=\(configuration.tlsMode.rawValue)"
        }

        /// Drops the database (closing any connection still on it).
        public func drop() async {
            try? await TestPostgres.execute("DROP DATABASE IF EXISTS \"\(name)\" WITH (FORCE)")
        }
    }

    /// Creates a fresh database; drop it with ``Database/drop()`` (or use ``withDatabase(_:)``).
    public static func database() async throws -> Database {
        let server = try await self.server()
        let name = "test_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "")
        try await execute("CREATE DATABASE \"\(name)\"")
        var configuration = server.configuration
        configuration.database = name
        // The whole suite runs in parallel on a shared machine: the concurrency pool and the
        // disk stall for tens of seconds at times, so the stores tests open wait much longer
        // than a service would before giving up (the timeouts themselves have tests of their own).
        configuration.operationTimeout = .seconds(180)
        configuration.connectTimeout = .seconds(60)
        return Database(
            url: Database.url(configuration, password: configuration.password), name: name,
            urlWithoutPassword: Database.url(configuration, password: nil), password: configuration.password, configuration: configuration)
    }

    /// Runs `body` with a fresh database and drops it afterwards.
    public static func withDatabase<T>(_ body: (Database) async throws -> T) async throws -> T {
        let database = try await database()
        do {
            let result = try await body(database)
            await database.drop()
            return result
        } catch {
            await database.drop()
            throw error
        }
    }

    /// Runs one statement (on `database`, else the admin database).
    public static func execute(_ sql: String, database: String? = nil) async throws {
        _ = try await scalar(sql, database: database)
    }

    /// Runs one statement and returns the first column of its first row as an integer (nil when
    /// there is no row or it is NULL).
    public static func scalar(_ sql: String, database: String? = nil) async throws -> Int64? {
        let connection = try await connect(database: database)
        var value: Int64?
        do {
            let rows = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: Logger(label: "test-postgres")).collect()
            if let row = rows.first {
                value = try row.decode(Int64?.self)
            }
        } catch {
            try? await connection.close()
            throw Unavailable(description: "'\(sql)' failed: \(String(reflecting: error))")
        }
        try await connection.close()
        return value
    }

    /// Runs statements in order on one connection of its own and returns the first column of
    /// every row of the last as text, one line each (for example `PREPARE`, then `EXPLAIN
    /// EXECUTE`).
    public static func text(_ statements: [String], database: String? = nil) async throws -> String {
        let connection = try await connect(database: database)
        var lines: [String] = []
        for (index, sql) in statements.enumerated() {
            do {
                let rows = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: Logger(label: "test-postgres")).collect()
                if index == statements.count - 1 {
                    for row in rows { lines.append(try row.decode(String.self)) }
                }
            } catch {
                try? await connection.close()
                throw Unavailable(description: "'\(sql)' failed: \(String(reflecting: error))")
            }
        }
        try await connection.close()
        return lines.joined(separator: "\n")
    }

    /// A connection of its own to `database` (else the admin database).
    static func connect(database: String?) async throws -> PostgresConnection {
        let server = try await self.server()
        let tls: PostgresConnection.Configuration.TLS
        switch server.configuration.tlsMode {
        case .disable:
            tls = .disable
        case .prefer, .require, .verifyFull:
            var settings = TLSConfiguration.makeClientConfiguration()
            settings.certificateVerification = .none
            let context = try NIOSSLContext(configuration: settings)
            tls = server.configuration.tlsMode == .prefer ? .prefer(context) : .require(context)
        }
        var configuration = PostgresConnection.Configuration(
            host: server.configuration.host, port: server.configuration.port, username: server.configuration.username,
            password: server.configuration.password, database: database ?? server.configuration.database, tls: tls)
        configuration.options.connectTimeout = .seconds(10)
        return try await PostgresConnection.connect(configuration: configuration, id: 1, logger: Logger(label: "test-postgres"))
    }

    /// A transaction held open on a connection of its own, for example to hold a lock, until
    /// ``release()`` commits it and closes the connection.
    public struct HeldTransaction: Sendable {
        let connection: PostgresConnection

        public func release() async throws {
            do {
                _ = try await connection.query("COMMIT", logger: Logger(label: "test-postgres")).collect()
            } catch {
                try? await connection.close()
                throw error
            }
            try await connection.close()
        }
    }

    /// Opens a transaction on `database`, runs `sql` in it (for example `LOCK TABLE …`) and
    /// holds it open.
    public static func holdLock(_ sql: String, database: String) async throws -> HeldTransaction {
        let connection = try await connect(database: database)
        do {
            _ = try await connection.query("BEGIN", logger: Logger(label: "test-postgres")).collect()
            _ = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: Logger(label: "test-postgres")).collect()
        } catch {
            try? await connection.close()
            throw Unavailable(description: "'\(sql)' failed: \(String(reflecting: error))")
        }
        return HeldTransaction(connection: connection)
    }

    // MARK: - Finding or starting the server

    /// The server: the URL's, or the throw-away cluster, started on first use on a thread of its
    /// own (initdb and pg_ctl block for seconds; the concurrency pool must not wait on them).
    static func server() async throws -> Server {
        switch source {
        case .url(let configuration):
            return Server(configuration: configuration)
        case .none(let reason):
            throw Unavailable(description: isCI ? "\(requiredInCI) (\(reason))" : reason)
        case .binaries(let binaries):
            return try await startup.server(binaries: binaries)
        }
    }

    private static func findSource() -> Source {
        let environment = ProcessInfo.processInfo.environment
        if let url = environment["OFFER_SIGNER_TEST_POSTGRES_URL"], !url.isEmpty {
            do {
                return .url(try PostgresStoreConfiguration(url: url, environment: environment))
            } catch {
                return .none("OFFER_SIGNER_TEST_POSTGRES_URL: \(error)")
            }
        }
        guard let binaries = findBinaries() else {
            return .none("no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/*/bin or on PATH, and OFFER_SIGNER_TEST_POSTGRES_URL is not set; apt-get install -y postgresql")
        }
        return .binaries(binaries)
    }

    private static func findBinaries() -> String? {
        let fileManager = FileManager.default
        var candidates: [String] = []
        if let versions = try? fileManager.contentsOfDirectory(atPath: "/usr/lib/postgresql") {
            let sorted = versions.compactMap { Int($0) }.sorted(by: >)
            candidates += sorted.map { "/usr/lib/postgresql/\($0)/bin" }
        }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        candidates += path.split(separator: ":").map(String.init)
        return candidates.first { directory in
            fileManager.isExecutableFile(atPath: "\(directory)/initdb") && fileManager.isExecutableFile(atPath: "\(directory)/pg_ctl")
        }
    }
}

/// Starts the throw-away cluster once, on a thread of its own; every caller awaits the outcome.
final class ClusterStartup: Sendable {
    private enum State {
        case idle
        case starting([CheckedContinuation<TestPostgres.Server, any Error>])
        case finished(Result<TestPostgres.Server, TestPostgres.Unavailable>)
    }
    private let state = Mutex(State.idle)

    func server(binaries: String) async throws -> TestPostgres.Server {
        try await withCheckedThrowingContinuation { continuation in
            let (finished, startNow) = state.withLock { state -> (Result<TestPostgres.Server, TestPostgres.Unavailable>?, Bool) in
                switch state {
                case .idle:
                    state = .starting([continuation])
                    return (nil, true)
                case .starting(var waiting):
                    waiting.append(continuation)
                    state = .starting(waiting)
                    return (nil, false)
                case .finished(let result):
                    return (result, false)
                }
            }
            if let finished { continuation.resume(with: finished.mapError { $0 as any Error }) }
            guard startNow else { return }
            let thread = Thread { [self] in
                let result: Result<TestPostgres.Server, TestPostgres.Unavailable>
                do {
                    result = .success(try ThrowAwayCluster.start(binaries: binaries))
                } catch let error as TestPostgres.Unavailable {
                    result = .failure(error)
                } catch {
                    result = .failure(TestPostgres.Unavailable(description: "cannot start a PostgreSQL cluster: \(error)"))
                }
                let waiting = state.withLock { state -> [CheckedContinuation<TestPostgres.Server, any Error>] in
                    guard case .starting(let waiting) = state else { return [] }
                    state = .finished(result)
                    return waiting
                }
                for continuation in waiting { continuation.resume(with: result.mapError { $0 as any Error }) }
            }
            thread.start()
        }
    }
}

/// The throw-away cluster: started once per test process, stopped at exit.
enum ThrowAwayCluster {
    static let directoryPrefix = "offer-signer-test-pg-"
    /// The cluster to stop at exit (set once).
    static let running = Mutex<(binaries: String, directory: String, asPostgres: Bool)?>(nil)

    static func start(binaries: String) throws -> TestPostgres.Server {
        let asPostgres = getuid() == 0
        var owner: (uid: uid_t, gid: gid_t)?
        if asPostgres {
            guard let entry = getpwnam("postgres") else {
                throw TestPostgres.Unavailable(description: "running as root, but there is no 'postgres' user to run the PostgreSQL server as")
            }
            owner = (entry.pointee.pw_uid, entry.pointee.pw_gid)
        }
        removeAbandonedClusters(binaries: binaries, asPostgres: asPostgres)

        let base = "/tmp/\(directoryPrefix)\(getpid())-\(UUID().uuidString.prefix(8).lowercased())"
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        let passwordFile = "\(base)/password"
        guard FileManager.default.createFile(atPath: passwordFile, contents: Data((TestPostgres.clusterPassword + "\n").utf8), attributes: [.posixPermissions: 0o600]) else {
            throw TestPostgres.Unavailable(description: "cannot write \(passwordFile)")
        }
        if let owner {
            guard chown(base, owner.uid, owner.gid) == 0, chown(passwordFile, owner.uid, owner.gid) == 0 else {
                throw TestPostgres.Unavailable(description: "cannot hand \(base) to the postgres user: \(String(cString: strerror(errno)))")
            }
        }
        let data = "\(base)/data"
        try run(
            binaries, "initdb",
            ["-D", data, "-U", TestPostgres.clusterUser, "--pwfile=\(passwordFile)", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync"],
            asPostgres: asPostgres, timeout: .seconds(120))
        running.withLock { $0 = (binaries, base, asPostgres) }
        atexit { ThrowAwayCluster.stopAtExit() }

        // fsync off: the cluster is thrown away with the test process, and a server that stops or
        // crashes (without the machine crashing) loses nothing either way; what its syncs did was
        // queue behind every SQLite test's syncs on the one disk and stall both (connections of a
        // loaded run timed out at 5 s). The store's own settings (synchronous_commit on, per
        // session) are unchanged. Outage tests use a cluster of their own (ControlledPostgres),
        // with PostgreSQL's defaults.
        var lastError: (any Error)?
        for _ in 0..<3 {
            let port = try LoopbackPort.free()
            do {
                try run(
                    binaries, "pg_ctl",
                    ["-D", data, "-l", "\(base)/server.log", "-w", "-t", "60",
                     "-o", "-p \(port) -k \(base) -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c max_connections=300", "start"],
                    asPostgres: asPostgres, timeout: .seconds(90))
                return TestPostgres.Server(configuration: try PostgresStoreConfiguration(
                    url: "postgres://\(TestPostgres.clusterUser):\(TestPostgres.clusterPassword)@127.0.0.1:\(port)/postgres?sslmode=disable"))
            } catch {
                lastError = error
            }
        }
        let log = (try? String(contentsOfFile: "\(base)/server.log", encoding: .utf8)) ?? ""
        throw TestPostgres.Unavailable(description: "cannot start PostgreSQL: \(lastError.map { "\($0)" } ?? "unknown")\n\(log.suffix(2000))")
    }

    static func stopAtExit() {
        guard let cluster = running.withLock({ $0 }) else { return }
        stop(binaries: cluster.binaries, directory: cluster.directory, asPostgres: cluster.asPostgres)
    }

    private static func stop(binaries: String, directory: String, asPostgres: Bool) {
        if FileManager.default.fileExists(atPath: "\(directory)/data/postmaster.pid") {
            _ = try? run(binaries, "pg_ctl", ["-D", "\(directory)/data", "-m", "immediate", "-w", "-t", "30", "stop"], asPostgres: asPostgres, timeout: .seconds(40))
        }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Stops and removes clusters whose test process is gone (killed before its exit handler ran).
    private static func removeAbandonedClusters(binaries: String, asPostgres: Bool) {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/tmp") else { return }
        for entry in entries where entry.hasPrefix(directoryPrefix) {
            let pidText = entry.dropFirst(directoryPrefix.count).prefix { $0 != "-" }
            guard let pid = pid_t(pidText), pid != getpid() else { continue }
            if kill(pid, 0) == 0 || errno == EPERM { continue }
            stop(binaries: binaries, directory: "/tmp/\(entry)", asPostgres: asPostgres)
        }
    }

    private static func run(_ binaries: String, _ tool: String, _ arguments: [String], asPostgres: Bool, timeout: Duration) throws {
        let executable = "\(binaries)/\(tool)"
        let result: ChildProcess.Result
        if asPostgres {
            let runuser = FileManager.default.isExecutableFile(atPath: "/usr/sbin/runuser") ? "/usr/sbin/runuser" : "/sbin/runuser"
            result = try ChildProcess.run(runuser, ["-u", "postgres", "--", executable] + arguments, currentDirectory: "/tmp", timeout: timeout)
        } else {
            result = try ChildProcess.run(executable, arguments, timeout: timeout)
        }
        guard result.status == 0 else {
            throw TestPostgres.Unavailable(description: "\(tool) failed (status \(result.status)): \(result.stderrText.suffix(2000))")
        }
    }
}
