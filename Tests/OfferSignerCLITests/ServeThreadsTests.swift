import Foundation
import TestChildProcess
import Testing

/// `serve --event-loop-threads`: the running server has exactly that many NIO event loop
/// threads (Linux names them `NIO-SGLTN-…` in /proc), and bad values are refused before
/// anything starts.
@Suite struct ServeThreadsTests {
    /// Names of the threads of a running process.
    static func threadNames(of pid: Int32) -> [String] {
        let tasks = "/proc/\(pid)/task"
        guard let ids = try? FileManager.default.contentsOfDirectory(atPath: tasks) else { return [] }
        return ids.compactMap { id in
            (try? String(contentsOfFile: "\(tasks)/\(id)/comm", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    /// Starts `serve` on a free loopback port, waits until its event loop group is up, and
    /// returns how many event loop threads it has.
    static func eventLoopThreads(_ extraArguments: [String], environment: [String: String] = [:]) async throws -> Int {
        try await serveThreadNames(extraArguments, environment: environment).filter { $0.hasPrefix("NIO-SGLTN") }.count
    }

    /// The names of a running `serve`'s threads, once its event loops are up (and, with
    /// `until`, once the names satisfy it, or 30 s have passed).
    static func serveThreadNames(_ extraArguments: [String], environment: [String: String] = [:], until settled: (([String]) -> Bool)? = nil) async throws -> [String] {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("THREADS001", file: try fixture.key("THREADS001")) + ["--development"]), "keys import")

            // Without the developer's own NIO settings, plus the case's.
            var serveEnvironment = childEnvironment([:]).filter { !$0.key.hasPrefix("NIO_") }
            serveEnvironment.merge(environment) { _, new in new }
            let process = try ChildProcess.spawn(
                try CLIExecutable.url().path,
                ["serve", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path, "--port", "0"] + extraArguments,
                environment: serveEnvironment, captureOutput: false)
            return try await process.stopped {
                // The group starts all its threads at once, before the server binds; give a loaded
                // machine plenty of time to get there, then a moment for every name to be set.
                let deadline = Date().addingTimeInterval(30)
                var loops: [String] = []
                while Date() < deadline, process.isRunning {
                    loops = threadNames(of: process.pid).filter { $0.hasPrefix("NIO-SGLTN") }
                    if !loops.isEmpty { break }
                    try await Task.sleep(for: .milliseconds(50))
                }
                try #require(process.isRunning, "serve exited with status \(process.statusIfEnded() ?? 0)")
                try #require(!loops.isEmpty, "no NIO-SGLTN thread appeared within 30 s; threads: \(threadNames(of: process.pid))")
                try await Task.sleep(for: .milliseconds(500))
                // Services start beside the event loops, so on a loaded machine a service's thread
                // can come up after them: wait for what the caller looks for, within the deadline.
                var names = threadNames(of: process.pid)
                while let settled, !settled(names), Date() < deadline, process.isRunning {
                    try await Task.sleep(for: .milliseconds(50))
                    names = threadNames(of: process.pid)
                }
                return names
            }
        }
    }

    @Test func theFlagSetsTheNumberOfEventLoopThreads() async throws {
        #expect(try await Self.eventLoopThreads(["--event-loop-threads", "1"]) == 1)
        #expect(try await Self.eventLoopThreads(["--event-loop-threads", "3"]) == 3)
        #expect(try await Self.eventLoopThreads([], environment: ["OFFER_SIGNER_EVENT_LOOP_THREADS": "2"]) == 2)
    }

    @Test func theAuditWriterThreadIsNamedForTheKernel() async throws {
        let names = try await Self.serveThreadNames(["--event-loop-threads", "1"]) { $0.contains("audit-committer") }
        #expect(names.filter { $0 == "audit-committer" }.count == 1, "threads: \(names)")
    }

    @Test func withoutTheFlagNIOsDefaultAndItsOwnSettingHold() async throws {
        #expect(try await Self.eventLoopThreads([]) == ProcessInfo.processInfo.activeProcessorCount)
        #expect(try await Self.eventLoopThreads([], environment: ["NIO_SINGLETON_GROUP_LOOP_COUNT": "3"]) == 3)
    }

    /// `serve --FLAG=value`, and `serve` with `variable=value`, both exit cleanly with a message
    /// naming the setting (the variable when the value is not a number), before creating a store.
    static func expectRefusedBeforeAnythingStarts(flag: String, variable: String, value: String, isNumber: Bool) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let serve = ["serve", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path]
            expectCleanFailure(try await run(serve + ["--\(flag)=\(value)"]), mentions: [flag])
            expectCleanFailure(try await run(serve, environment: [variable: value]), mentions: [isNumber ? flag : variable])
            #expect(!FileManager.default.fileExists(atPath: fixture.store.path), "serve created the store before refusing")
        }
    }

    @Test(arguments: ["0", "-1", "513", "two"])
    func badValuesAreRefusedBeforeAnythingStarts(_ value: String) async throws {
        try await Self.expectRefusedBeforeAnythingStarts(
            flag: "event-loop-threads", variable: "OFFER_SIGNER_EVENT_LOOP_THREADS", value: value, isNumber: value != "two")
    }

    @Test(arguments: ["0", "-1", "1023", "67108865", "big"])
    func badBodyLimitsAreRefusedBeforeAnythingStarts(_ value: String) async throws {
        try await Self.expectRefusedBeforeAnythingStarts(
            flag: "max-body-bytes", variable: "OFFER_SIGNER_MAX_BODY_BYTES", value: value, isNumber: value != "big")
    }

    @Test(arguments: ["-1", "1000.5", "nan", "soon"])
    func badAuditCommitDelaysAreRefusedBeforeAnythingStarts(_ value: String) async throws {
        try await Self.expectRefusedBeforeAnythingStarts(
            flag: "audit-commit-delay-ms", variable: "OFFER_SIGNER_AUDIT_COMMIT_DELAY_MS", value: value, isNumber: value != "soon")
    }
}
