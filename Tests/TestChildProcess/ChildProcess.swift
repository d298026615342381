import Dispatch
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Child processes for the tests, started with `posix_spawn` rather than Foundation's `Process`.
///
/// Why: on Linux, Swift 6.3.1's `Process.run()` lists `/proc/self/fd` with a read that can run
/// past glibc's directory buffer and crash the whole test process now and then (fixed upstream in
/// swift-corelibs-foundation #5472; seen here in a full CI run). `posix_spawn` needs no such
/// listing: the child closes every descriptor from 3 up itself (`closefrom`), so no child
/// inherits another's pipes, and launches need no lock.
///
/// Rules: the child starts with an empty signal mask and default handlers (threads of this
/// process block signals; a child must still die on SIGTERM); its stdin is the given bytes or
/// /dev/null; its output is captured or discarded, never shared with the test process.
public final class ChildProcess: Sendable {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// How a child ended: its exit status, or minus the signal that killed it
    /// (``unknownStatus`` if it could not be waited for).
    public struct Result: Sendable {
        public var status: Int32
        public var stdout: Data
        public var stderr: Data
        public var stdoutText: String { String(decoding: stdout, as: UTF8.self) }
        public var stderrText: String { String(decoding: stderr, as: UTF8.self) }
    }

    public let pid: pid_t
    private let ended = Mutex<Int32?>(nil)
    private let stdoutDrain: Drain?
    private let stderrDrain: Drain?

    private init(pid: pid_t, stdoutDrain: Drain?, stderrDrain: Drain?) {
        self.pid = pid
        self.stdoutDrain = stdoutDrain
        self.stderrDrain = stderrDrain
    }

    /// Starts `executable` (an absolute path) with `arguments`.
    ///
    /// - Parameters:
    ///   - environment: the child's whole environment; nil passes this process's.
    ///   - stdin: bytes the child reads on standard input; nil gives it /dev/null.
    ///   - currentDirectory: where the child starts; nil keeps this process's.
    ///   - captureOutput: true collects stdout and stderr (see ``waitForExit()``); false sends
    ///     both to /dev/null.
    public static func spawn(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, stdin: Data? = nil,
        currentDirectory: String? = nil, captureOutput: Bool = true
    ) throws -> ChildProcess {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }

        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

        // Standard input: a private temporary file (no pipe to feed, so no deadlock however much
        // the child writes before reading), removed once the child has opened it.
        var stdinFile: String?
        defer { if let stdinFile { unlink(stdinFile) } }
        if let stdin {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-child-stdin-\(UUID().uuidString)").path
            guard FileManager.default.createFile(atPath: path, contents: stdin, attributes: [.posixPermissions: 0o600]) else {
                throw Failure(description: "cannot write the child's standard input to \(path)")
            }
            stdinFile = path
            posix_spawn_file_actions_addopen(&actions, 0, path, O_RDONLY, 0)
        } else {
            posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        }

        // The parent keeps only the read ends, and only once the child is running.
        var pipes: [(read: Int32, write: Int32)] = []
        var started = false
        defer {
            for pipe in pipes {
                close(pipe.write)
                if !started { close(pipe.read) }
            }
        }
        if captureOutput {
            for target in [Int32(1), 2] {
                var ends: [Int32] = [-1, -1]
                guard pipe(&ends) == 0 else { throw Failure(description: "pipe() failed: \(String(cString: strerror(errno)))") }
                _ = fcntl(ends[0], F_SETFD, FD_CLOEXEC)
                _ = fcntl(ends[1], F_SETFD, FD_CLOEXEC)
                pipes.append((ends[0], ends[1]))
                posix_spawn_file_actions_adddup2(&actions, ends[1], target)
            }
        } else {
            posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        guard GlibcExtensions.addCloseFrom(&actions, 3) == 0 else { throw Failure(description: "posix_spawn_file_actions_addclosefrom_np failed") }
        if let currentDirectory {
            guard GlibcExtensions.addChdir(&actions, currentDirectory) == 0 else {
                throw Failure(description: "posix_spawn_file_actions_addchdir_np failed")
            }
        }

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        let environmentPairs = (environment ?? ProcessInfo.processInfo.environment).map { "\($0.key)=\($0.value)" }
        let envp = environmentPairs.map { strdup($0) } + [nil]
        defer { for pointer in envp { free(pointer) } }

        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
        guard spawned == 0 else {
            throw Failure(description: "cannot start \(executable): \(String(cString: strerror(spawned)))")
        }
        started = true
        let drains = pipes.map { Drain(descriptor: $0.read) }
        return ChildProcess(pid: pid, stdoutDrain: drains.first, stderrDrain: drains.last)
    }

    /// Runs a child to the end: stdout and stderr collected, and SIGTERM (then SIGKILL 5 s
    /// later) if it is still running after `timeout`.
    ///
    /// Blocks the calling thread until the child ends: call it only from a thread of your own
    /// (``onOwnThread(_:)``) or from synchronous code that is not a test body. From async code use
    /// the `async` overload, which waits on a thread of its own: a test waiting here on one of the
    /// two threads of a 2-core machine's concurrency pool stalls every server under test.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, stdin: Data? = nil,
        currentDirectory: String? = nil, timeout: Duration
    ) throws -> Result {
        let child = try spawn(executable, arguments, environment: environment, stdin: stdin, currentDirectory: currentDirectory)
        return child.waitForExit(timeout: timeout)
    }

    /// ``run(_:_:environment:stdin:currentDirectory:timeout:)`` waiting on a thread of its own,
    /// never on one of the concurrency pool's.
    public static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]? = nil, stdin: Data? = nil,
        currentDirectory: String? = nil, timeout: Duration
    ) async throws -> Result {
        try await onOwnThread {
            try run(executable, arguments, environment: environment, stdin: stdin, currentDirectory: currentDirectory, timeout: timeout)
        }
    }

    /// The child's status if it has ended (reaping it), nil while it runs.
    public func statusIfEnded() -> Int32? {
        ended.withLock { ended in
            if let ended { return ended }
            var status: Int32 = 0
            let result = waitpid(pid, &status, WNOHANG)
            if result == -1 && errno != EINTR {
                // Not ours to wait for any more (someone else reaped it): report it as ended
                // rather than let a caller poll forever.
                ended = Self.unknownStatus
                return ended
            }
            guard result == pid else { return nil }
            ended = Self.decode(status)
            return ended
        }
    }

    public var isRunning: Bool { statusIfEnded() == nil }

    /// Waits until the child ends and its output is read to the end.
    ///
    /// Polls rather than blocking in `waitpid` under the lock, so ``terminate()`` (a timeout's
    /// watchdog, say) can still reach the child while this waits. With a `timeout`, sends SIGTERM
    /// once it has passed and SIGKILL 5 s later; the polling loop keeps that time itself, so no
    /// timer of the concurrency pool (which a stalled test could hold) needs to fire.
    ///
    /// Blocks the calling thread: from async code use ``exited(timeout:)``.
    public func waitForExit(timeout: Duration? = nil) -> Result {
        var pause: UInt32 = 1_000
        let clock = ContinuousClock()
        let terminateAt = timeout.map { clock.now + $0 }
        var killAt: ContinuousClock.Instant?
        while true {
            if let status = statusIfEnded() {
                return Result(status: status, stdout: stdoutDrain?.finish() ?? Data(), stderr: stderrDrain?.finish() ?? Data())
            }
            if let terminateAt, killAt == nil, clock.now >= terminateAt {
                terminate()
                killAt = clock.now + .seconds(5)
            }
            if let killAt, clock.now >= killAt {
                signal(SIGKILL)
            }
            usleep(pause)
            pause = min(pause * 2, 20_000)
        }
    }

    /// ``waitForExit(timeout:)`` on a thread of its own, never on one of the concurrency pool's.
    public func exited(timeout: Duration? = nil) async -> Result {
        await withCheckedContinuation { (continuation: CheckedContinuation<Result, Never>) in
            Thread { [self] in continuation.resume(returning: waitForExit(timeout: timeout)) }.start()
        }
    }

    /// Runs `body`, then stops the child with SIGTERM and waits for it to end (on a thread of its
    /// own, see ``exited(timeout:)``), whether `body` returned or threw: the async form of
    /// `defer { terminate(); waitForExit() }`, which would hold a thread of the concurrency pool
    /// for as long as the child takes to shut down.
    public func stopped<T>(after body: () async throws -> T) async throws -> T {
        let outcome: Swift.Result<T, any Error>
        do {
            outcome = .success(try await body())
        } catch {
            outcome = .failure(error)
        }
        terminate()
        _ = await exited(timeout: .seconds(60))
        return try outcome.get()
    }

    /// Sends SIGTERM and reaps the child on a thread of its own, without waiting for it: for a
    /// `defer` in async code, where ``waitForExit(timeout:)`` would hold one of the concurrency
    /// pool's threads for as long as the child takes to shut down.
    public func terminateInBackground() {
        terminate()
        Thread { [self] in _ = waitForExit(timeout: .seconds(60)) }.start()
    }

    /// Sends SIGTERM unless the child has already been reaped.
    public func terminate() { signal(SIGTERM) }

    func signal(_ signal: Int32) {
        ended.withLock { ended in
            if ended == nil { _ = kill(pid, signal) }
        }
    }

    /// The status reported for a child this process could no longer wait for.
    public static let unknownStatus = Int32.min

    /// Exit status, or minus the terminating signal (`WIFEXITED` and friends are macros Swift
    /// does not import).
    static func decode(_ status: Int32) -> Int32 {
        let signal = status & 0x7F
        return signal == 0 ? (status >> 8) & 0xFF : -signal
    }
}

/// Reads one pipe to its end on a thread of its own, so a chatty child never blocks on a full
/// pipe while the test waits for it.
private final class Drain: @unchecked Sendable {
    private var data = Data()
    private let done = DispatchSemaphore(value: 0)

    init(descriptor: Int32) {
        let thread = Thread { [self] in
            var buffer = [UInt8](repeating: 0, count: 65536)
            while true {
                let count = buffer.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
                if count > 0 {
                    data.append(contentsOf: buffer[0..<count])
                } else if count == -1 && errno == EINTR {
                    continue
                } else {
                    break
                }
            }
            close(descriptor)
            done.signal()
        }
        thread.start()
    }

    /// The whole output, once the child has closed its end.
    func finish() -> Data {
        done.wait()
        done.signal()  // later calls return at once
        return data
    }
}

/// glibc functions that Swift's Glibc module does not import (they need `_GNU_SOURCE`),
/// looked up once at run time. Debian 12 has glibc 2.36; both exist since 2.34.
private enum GlibcExtensions {
    typealias AddCloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    typealias AddChdir = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32

    nonisolated(unsafe) static let addCloseFrom: AddCloseFrom = unsafeBitCast(symbol("posix_spawn_file_actions_addclosefrom_np"), to: AddCloseFrom.self)
    nonisolated(unsafe) static let addChdir: AddChdir = unsafeBitCast(symbol("posix_spawn_file_actions_addchdir_np"), to: AddChdir.self)

    private static func symbol(_ name: String) -> UnsafeMutableRawPointer {
        guard let pointer = dlsym(dlopen(nil, RTLD_NOW), name) else {
            preconditionFailure("\(name) is missing from this C library (glibc 2.34 or later needed)")
        }
        return pointer
    }
}
