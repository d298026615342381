import Foundation
import TestChildProcess
import Testing

/// The launcher every test module uses for child processes: statuses, signals, input and output,
/// timeouts, working directory, and no descriptors leaking into the child.
@Suite struct ChildProcessTests {
    @Test func exitStatusesAndSignalsAreReported() async throws {
        #expect(try await ChildProcess.run("/bin/sh", ["-c", "exit 3"], timeout: .seconds(30)).status == 3)
        #expect(try await ChildProcess.run("/bin/sh", ["-c", "true"], timeout: .seconds(30)).status == 0)
        #expect(try await ChildProcess.run("/bin/sh", ["-c", "kill -9 $$"], timeout: .seconds(30)).status == -9)
    }

    @Test func inputAndBothOutputsArriveWhole() async throws {
        // A megabyte on stdout is more than a pipe holds: the reader threads must drain it.
        let result = try await ChildProcess.run(
            "/bin/sh", ["-c", "cat; head -c 1000000 /dev/zero; echo oops >&2"], stdin: Data("hello".utf8), timeout: .seconds(30))
        #expect(result.status == 0)
        #expect(result.stdout.count == 5 + 1_000_000)
        #expect(result.stdout.prefix(5) == Data("hello".utf8))
        #expect(result.stderrText == "oops\n")
        #expect(try await ChildProcess.run("/bin/sh", ["-c", "wc -c"], timeout: .seconds(30)).stdoutText.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
    }

    /// Threads of the test process block signals; the child must not inherit that mask.
    @Test func terminateEndsAChildAndATimeoutStopsAHungOne() async throws {
        let sleeper = try ChildProcess.spawn("/bin/sleep", ["30"], captureOutput: false)
        #expect(sleeper.isRunning)
        sleeper.terminate()
        #expect(await sleeper.exited().status == -15)

        let start = ContinuousClock.now
        let hung = try await ChildProcess.run("/bin/sleep", ["300"], timeout: .milliseconds(300))
        #expect(hung.status == -15)
        #expect(ContinuousClock.now - start < .seconds(120), "the timeout did not stop the child")
    }

    @Test func theChildStartsInTheGivenDirectoryAndInheritsNoOtherDescriptor() async throws {
        let directory = FileManager.default.temporaryDirectory.resolvingSymlinksInPath().path
        #expect(try await ChildProcess.run("/bin/sh", ["-c", "pwd -P"], currentDirectory: directory, timeout: .seconds(30)).stdoutText == directory + "\n")
        // A descriptor this process opened without close-on-exec (as a library might): the child
        // must not have it (a leaked pipe of another child would keep that child's reader
        // waiting for an end of file).
        let leaked = open("/dev/null", O_RDONLY)
        try #require(leaked > 2)
        defer { close(leaked) }
        let check = try await ChildProcess.run("/bin/sh", ["-c", "if [ -e /proc/$$/fd/\(leaked) ]; then echo open; else echo closed; fi"], timeout: .seconds(30))
        #expect(check.stdoutText == "closed\n")
    }

    /// Waiting for children holds none of the concurrency pool's threads: with more children
    /// waited for than the pool has threads (one a core), other work still runs at once. Waiting
    /// on the pool instead stalled every server under test while the CLI tests ran.
    @Test func waitingForChildrenLeavesTheConcurrencyPoolFree() async throws {
        let children = ProcessInfo.processInfo.activeProcessorCount + 2
        let (other, firstChildEnded) = try await withThrowingTaskGroup(of: ContinuousClock.Instant.self) { group in
            for _ in 0..<children {
                group.addTask {
                    let result = try await ChildProcess.run("/bin/sleep", ["20"], timeout: .seconds(120))
                    #expect(result.status == 0)
                    return ContinuousClock.now
                }
            }
            // Time for every child's wait to start (and, were it blocking, to take every thread).
            try await Task.sleep(for: .milliseconds(500))
            let other = await Task.detached { ContinuousClock.now }.value
            var ended: [ContinuousClock.Instant] = []
            for try await instant in group { ended.append(instant) }
            return (other, try #require(ended.min()))
        }
        #expect(other < firstChildEnded, "other work waited until a child ended")
    }

    @Test func aMissingExecutableIsAnError() {
        #expect(throws: ChildProcess.Failure.self) { try ChildProcess.spawn("/nonexistent/tool", []) }
    }
}
