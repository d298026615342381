import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The Python tools some tests drive (Apple's `app-store-server-library` as an interop oracle,
/// `schemathesis` against the OpenAPI document), in a virtual environment the tests provision
/// themselves, so `swift test` needs nothing on the machine beyond Swift and `python3`.
///
/// Rules:
/// - The versions are pinned in one file, `Tests/Interop/requirements.txt`; the environment lives
///   at `.build/test-python/venv-<hash>`, the hash taken over that file and the interpreter
///   (path and version), so a changed pin or a new Python gets a fresh environment.
/// - It is created once and reused. Creation holds an exclusive `flock` on
///   `venv-<hash>.lock`, so the suites and processes `swift test` runs at the same time never
///   race; the completion marker is written last, and a folder without it (a creation that
///   crashed or failed half-way) is removed and created again, never used.
/// - A missing `python3`, or one without its `venv`/`ensurepip` modules, fails with the Debian
///   package to install; a failed `pip install` fails with pip's own output.
public struct PythonTestEnvironment: Sendable {
    /// The environment's root folder.
    public let directory: String
    /// True when this call created the environment, false when it reused a complete one.
    public let created: Bool

    /// The environment's interpreter.
    public var python: String { "\(directory)/bin/python" }

    /// A console script the environment installed (e.g. `schemathesis`).
    public func executable(_ name: String) -> String { "\(directory)/bin/\(name)" }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// The package's root folder (this file is `Tests/TestChildProcess/<name>.swift`).
    public static let packageRoot: String = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path

    /// The pinned requirements of the test tools.
    public static let requirementsFile = "\(packageRoot)/Tests/Interop/requirements.txt"

    /// Where environments live: inside the build folder, which `swift package clean` empties.
    public static let defaultBaseDirectory = "\(packageRoot)/.build/test-python"

    /// The test tools' environment, created on first use. Calls from one process share one
    /// provisioning (later callers wait for the first, off the concurrency pool); other
    /// processes wait on the file lock.
    public static func shared() async throws -> PythonTestEnvironment {
        let task = sharedTask.withLock { task in
            if let task { return task }
            let started = Task {
                try await onOwnThread {
                    try provision(requirements: String(contentsOfFile: requirementsFile, encoding: .utf8), baseDirectory: defaultBaseDirectory)
                }
            }
            task = started
            return started
        }
        return try await task.value
    }

    private static let sharedTask = Mutex<Task<PythonTestEnvironment, any Error>?>(nil)

    /// Creates (or reuses) the environment for `requirements` (pip requirements text; with no
    /// requirement the environment gets no pip either) under `baseDirectory`. Blocks: call it off the concurrency pool.
    public static func provision(requirements: String, baseDirectory: String) throws -> PythonTestEnvironment {
        let python3 = try findPython3()
        let version = try checkInterpreter(python3)
        let key = "python=\(python3)\nversion=\(version)\n\(requirements)"
        let directory = "\(baseDirectory)/venv-\(fnv1a64Hex(key))"

        try FileManager.default.createDirectory(atPath: baseDirectory, withIntermediateDirectories: true)
        let lock = open("\(directory).lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o644)
        guard lock >= 0 else { throw Failure(description: "cannot open \(directory).lock: \(String(cString: strerror(errno)))") }
        defer { close(lock) }
        while flock(lock, LOCK_EX) != 0 {
            guard errno == EINTR else { throw Failure(description: "cannot lock \(directory).lock: \(String(cString: strerror(errno)))") }
        }
        defer { _ = flock(lock, LOCK_UN) }

        let marker = "\(directory)/.offer-signer-complete"
        if let recorded = try? String(contentsOfFile: marker, encoding: .utf8), recorded == key {
            return PythonTestEnvironment(directory: directory, created: false)
        }
        // Not complete: a creation that stopped half-way. Start over.
        if FileManager.default.fileExists(atPath: directory) { try FileManager.default.removeItem(atPath: directory) }

        let requirementLines = requirements.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            .filter { !$0.isEmpty && !$0.hasPrefix("#") }
        // Nothing to install, no pip (ensurepip is most of a creation's time).
        let venvArguments = ["-m", "venv"] + (requirementLines.isEmpty ? ["--without-pip"] : []) + [directory]
        let created = try runAtLowPriority(python3, venvArguments, environment: nil, timeout: .seconds(300))
        guard created.status == 0 else {
            throw Failure(description: "`\(python3) \(venvArguments.joined(separator: " "))` exited \(created.status) (on Debian: apt-get install python3-venv):\n\(created.stdoutText)\(created.stderrText)")
        }
        if !requirementLines.isEmpty {
            var environment = ProcessInfo.processInfo.environment
            environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
            environment["PIP_NO_INPUT"] = "1"
            environment["PYTHONNOUSERSITE"] = "1"
            let installed = try runAtLowPriority(
                "\(directory)/bin/python", ["-m", "pip", "install"] + requirementLines, environment: environment, timeout: .seconds(1200))
            guard installed.status == 0 else {
                throw Failure(description: "pip install \(requirementLines.joined(separator: " ")) exited \(installed.status); pip said:\n\(installed.stdoutText)\(installed.stderrText)")
            }
        }
        guard FileManager.default.createFile(atPath: marker, contents: Data(key.utf8)) else {
            throw Failure(description: "cannot write \(marker)")
        }
        return PythonTestEnvironment(directory: directory, created: true)
    }

    /// Runs a child under `nice -n 10` when `/usr/bin/nice` exists: creating the environment
    /// (ensurepip, pip compiling what it installs) happens while the other tests run, and must
    /// not take the cores from their servers and timers.
    static func runAtLowPriority(_ executable: String, _ arguments: [String], environment: [String: String]?, timeout: Duration) throws -> ChildProcess.Result {
        let nice = "/usr/bin/nice"
        guard access(nice, X_OK) == 0 else {
            return try ChildProcess.run(executable, arguments, environment: environment, timeout: timeout)
        }
        return try ChildProcess.run(nice, ["-n", "10", executable] + arguments, environment: environment, timeout: timeout)
    }

    /// `python3` from `searchPath` (this process's `PATH` by default), as an absolute path
    /// (posix_spawn does not search `PATH`).
    public static func findPython3(searchPath: String? = nil) throws -> String {
        let path = searchPath ?? ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin"
        for folder in path.split(separator: ":") where !folder.isEmpty {
            let candidate = "\(folder)/python3"
            if access(candidate, X_OK) == 0 { return candidate }
        }
        throw Failure(description: "python3 is not on PATH; the Python-driven tests need it (on Debian: apt-get install python3 python3-venv)")
    }

    /// The interpreter's version, once it has shown it can make environments with pip.
    public static func checkInterpreter(_ python3: String) throws -> String {
        let result = try ChildProcess.run(
            python3, ["-c", "import sys, venv, ensurepip; print(sys.version.split()[0])"], timeout: .seconds(60))
        guard result.status == 0 else {
            throw Failure(description: "\(python3) lacks the venv or ensurepip module (on Debian: apt-get install python3-venv): \(result.stderrText)")
        }
        return result.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// 64-bit FNV-1a as 16 hex digits: names the environment after what it was made from
    /// (not a security measure; Foundation on Linux has no SHA-256).
    static func fnv1a64Hex(_ text: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in text.utf8 {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}
