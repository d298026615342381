import Foundation
#if canImport(Glibc)
import Glibc
#endif
import TestChildProcess

/// A PostgreSQL cluster of one test's own, which the test may stop (`-m immediate`: a crash, as
/// far as clients can tell) and start again on the same port. For outage tests only; other tests
/// use TestPostgres's shared server.
///
/// Rule: the cluster is removed by `remove()`; trust authentication on loopback (it exists for
/// seconds, listens on 127.0.0.1 only, and holds test data). Its first start tries up to three
/// free ports (another test's random pick may take one before the server binds it), as
/// TestPostgres's shared cluster does, stopping a server a failed try left running; a restart
/// uses the port the first start got. A cluster that could not be made is stopped and removed.
final class ControlledPostgres: Sendable {
    let binaries: String
    let directory: String
    let port: Int
    let asPostgres: Bool

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// The server binaries, or nil (the test is then skipped like other PostgreSQL tests).
    static var binaries: String? {
        let versions = (try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql"))?.compactMap { Int($0) }.sorted(by: >) ?? []
        return versions.map { "/usr/lib/postgresql/\($0)/bin" }.first { FileManager.default.isExecutableFile(atPath: "\($0)/pg_ctl") }
    }

    var url: String { "postgres://postgres@127.0.0.1:\(port)/postgres?sslmode=disable" }

    /// Creates and starts the cluster; `initdb` and `pg_ctl` are waited for on a thread of their
    /// own, never on one of the concurrency pool's.
    init(binaries: String) async throws {
        let asPostgres = getuid() == 0
        let directory = "/tmp/offer-signer-outage-pg-\(getpid())-\(UUID().uuidString.prefix(8).lowercased())"
        self.binaries = binaries
        self.asPostgres = asPostgres
        self.directory = directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        if asPostgres, let entry = getpwnam("postgres") {
            _ = chown(directory, entry.pointee.pw_uid, entry.pointee.pw_gid)
        }
        do {
            try await Self.run(binaries, "initdb", ["-D", "\(directory)/data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"], asPostgres: asPostgres, timeout: .seconds(120))
            var started: Int?
            var failures: [String] = []
            for _ in 0..<3 where started == nil {
                let candidate = try LoopbackPort.free()
                do {
                    try await Self.run(binaries, "pg_ctl", Self.startArguments(directory: directory, port: candidate), asPostgres: asPostgres, timeout: .seconds(90))
                    started = candidate
                } catch {
                    failures.append("port \(candidate): \(error)")
                    // A start that timed out may have left its server running: stopped before the next try.
                    try? await onOwnThread { try Self.stopIfRunning(binaries, directory: directory, asPostgres: asPostgres) }
                }
            }
            guard let started else { throw Failure(description: "PostgreSQL did not start on three ports: \(failures.joined(separator: "; "))") }
            port = started
        } catch {
            try? await onOwnThread { try Self.stopIfRunning(binaries, directory: directory, asPostgres: asPostgres) }
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// Stops the cluster at once if its server runs (its `postmaster.pid` exists), blocking the
    /// calling thread (an immediate stop takes a fraction of a second).
    private static func stopIfRunning(_ binaries: String, directory: String, asPostgres: Bool) throws {
        guard FileManager.default.fileExists(atPath: "\(directory)/data/postmaster.pid") else { return }
        try runBlocking(binaries, "pg_ctl", stopArguments(directory: directory), asPostgres: asPostgres, timeout: .seconds(40))
    }

    /// Starts the stopped server again, on the port of its first start.
    func start() async throws {
        try await run("pg_ctl", Self.startArguments(directory: directory, port: port), timeout: .seconds(90))
    }

    private static func startArguments(directory: String, port: Int) -> [String] {
        ["-D", "\(directory)/data", "-l", "\(directory)/server.log", "-w", "-t", "60",
         "-o", "-p \(port) -k \(directory) -c listen_addresses=127.0.0.1 -c max_connections=200", "start"]
    }

    /// An immediate stop: no shutdown checkpoint, clients see their connections drop.
    private static func stopArguments(directory: String) -> [String] {
        ["-D", "\(directory)/data", "-m", "immediate", "-w", "-t", "30", "stop"]
    }

    /// Stops the server at once, without a shutdown checkpoint: clients see their connections drop.
    func stopImmediately() async throws {
        try await run("pg_ctl", Self.stopArguments(directory: directory), timeout: .seconds(40))
    }

    /// Runs one SQL statement as the superuser, through psql on the cluster's socket.
    func sql(_ statement: String) async throws {
        try await run("psql", ["-h", directory, "-p", String(port), "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", statement], timeout: .seconds(30))
    }

    /// Stops the server if it runs and deletes the cluster; blocks the calling thread (for a
    /// `defer`).
    func remove() {
        try? Self.stopIfRunning(binaries, directory: directory, asPostgres: asPostgres)
        try? FileManager.default.removeItem(atPath: directory)
    }

    private func run(_ tool: String, _ arguments: [String], timeout: Duration) async throws {
        try await Self.run(binaries, tool, arguments, asPostgres: asPostgres, timeout: timeout)
    }

    private static func run(_ binaries: String, _ tool: String, _ arguments: [String], asPostgres: Bool, timeout: Duration) async throws {
        try await onOwnThread { try runBlocking(binaries, tool, arguments, asPostgres: asPostgres, timeout: timeout) }
    }

    private static func runBlocking(_ binaries: String, _ tool: String, _ arguments: [String], asPostgres: Bool, timeout: Duration) throws {
        let executable = "\(binaries)/\(tool)"
        let result =
            asPostgres
            ? try ChildProcess.run("/usr/sbin/runuser", ["-u", "postgres", "--", executable] + arguments, currentDirectory: "/tmp", timeout: timeout)
            : try ChildProcess.run(executable, arguments, timeout: timeout)
        guard result.status == 0 else {
            throw Failure(description: "\(tool) \(arguments.joined(separator: " ")) failed (\(result.status)): \(result.stderrText.suffix(1500))")
        }
    }
}
