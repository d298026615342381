import Foundation
import TestChildProcess
import Testing

/// The launcher every test module uses for child processes: statuses, signals, input and output,
/// timeouts, working directory, and no descriptors leaking into the child.
@Suite struct ChildProcessTests {
    @Test func exitStatusesAndSignalsAreReported() throws {
        #expect(try ChildProcess.run("/bin/sh", ["-c", "exit 3"], timeout: .seconds(30)).status == 3)
        #expect(try ChildProcess.run("/bin/sh", ["-c", "true"], timeout: .seconds(30)).status == 0)
        #expect(try ChildProcess.run("/bin/sh", ["-c", "kill -9 $$"], timeout: .seconds(30)).status == -9)
    }

    @Test func inputAndBothOutputsArriveWhole() throws {
        // A megabyte on stdout is more than a pipe holds: the reader threads must drain it.
        let result = try ChildProcess.run(
            "/bin/sh", ["-c", "cat; head -c 1000000 /dev/zero; echo oops >&2"], stdin: Data("hello".utf8), timeout: .seconds(30))
        #expect(result.status == 0)
        #expect(result.stdout.count == 5 + 1_000_000)
        #expect(result.stdout.prefix(5) == Data("hello".utf8))
        #expect(result.stderrText == "oops\n")
        #expect(try ChildProcess.run("/bin/sh", ["-c", "wc -c"], timeout: .seconds(30)).stdoutText.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
    }

    /// Threads of the test process block signals; the child must not inherit that mask.
    @Test func terminateEndsAChildAndATimeoutStopsAHungOne() throws {
        let sleeper = try ChildProcess.spawn("/bin/sleep", ["30"], captureOutput: false)
        #expect(sleeper.isRunning)
        sleeper.terminate()
        #expect(sleeper.waitForExit().status == -15)

        let start = ContinuousClock.now
        let hung = try ChildProcess.run("/bin/sleep", ["30"], timeout: .milliseconds(300))
        #expect(hung.status == -15)
        #expect(ContinuousClock.now - start < .seconds(20))
    }

    @Test func theChildStartsInTheGivenDirectoryAndInheritsNoOtherDescriptor() throws {
        let directory = FileManager.default.temporaryDirectory.resolvingSymlinksInPath().path
        #expect(try ChildProcess.run("/bin/sh", ["-c", "pwd -P"], currentDirectory: directory, timeout: .seconds(30)).stdoutText == directory + "\n")
        // A descriptor this process opened without close-on-exec (as a library might): the child
        // must not have it (a leaked pipe of another child would keep that child's reader
        // waiting for an end of file).
        let leaked = open("/dev/null", O_RDONLY)
        try #require(leaked > 2)
        defer { close(leaked) }
        let check = try ChildProcess.run("/bin/sh", ["-c", "if [ -e /proc/$$/fd/\(leaked) ]; then echo open; else echo closed; fi"], timeout: .seconds(30))
        #expect(check.stdoutText == "closed\n")
    }

    @Test func aMissingExecutableIsAnError() {
        #expect(throws: ChildProcess.Failure.self) { try ChildProcess.spawn("/nonexistent/tool", []) }
    }
}
