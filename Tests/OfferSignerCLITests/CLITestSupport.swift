import Crypto
import Dispatch
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import TestChildProcess
import Testing

// Helpers shared by the CLI tests: find the real `offer-signer` executable that `swift test`
// built, run it as a subprocess, give every test its own temporary directory, and run the
// `openssl` / `sqlite3` command-line tools for fixtures and tampering.

/// Where the `offer-signer` executable is.
enum CLIExecutable {
    /// The environment variable that overrides the search (an absolute path).
    static let overrideVariable = "OFFER_SIGNER_CLI_EXECUTABLE"

    private static let located: Result<URL, LocateError> = locate()

    struct LocateError: Error, CustomStringConvertible {
        var searched: [String]
        var description: String {
            "the 'offer-signer' executable was not found. `swift test` builds it next to the test bundle; "
                + "run `swift build --build-tests` first, or set \(CLIExecutable.overrideVariable) to its path. Looked at:\n  "
                + searched.joined(separator: "\n  ")
        }
    }

    /// The executable, or an error that lists every place looked at.
    static func url() throws -> URL {
        try located.get()
    }

    private static func locate() -> Result<URL, LocateError> {
        let fileManager = FileManager.default
        var candidates: [URL] = []
        if let explicit = ProcessInfo.processInfo.environment[overrideVariable], !explicit.isEmpty {
            candidates.append(URL(fileURLWithPath: explicit))
        }
        // 1. Beside the running test binary (Linux: `.build/<triple>/debug/<pkg>PackageTests.xctest`;
        //    macOS: `.build/debug/<pkg>PackageTests.xctest/Contents/MacOS/<pkg>PackageTests`).
        var directories: [URL] = []
        if let executable = Bundle.main.executableURL {
            directories.append(executable.resolvingSymlinksInPath().deletingLastPathComponent())
        }
        directories.append(Bundle.main.bundleURL.resolvingSymlinksInPath())
        if let first = CommandLine.arguments.first, !first.isEmpty {
            directories.append(URL(fileURLWithPath: first).resolvingSymlinksInPath().deletingLastPathComponent())
        }
        for directory in directories {
            var current = directory.standardizedFileURL
            for _ in 0..<4 {  // the directory itself and up to three parents (the macOS bundle layout)
                candidates.append(current.appendingPathComponent("offer-signer"))
                current = current.deletingLastPathComponent()
            }
        }
        // 2. The package's default build directory, found from this source file.
        var root = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while root.path != "/" && !fileManager.fileExists(atPath: root.appendingPathComponent("Package.swift").path) {
            root = root.deletingLastPathComponent()
        }
        candidates.append(root.appendingPathComponent(".build/debug/offer-signer"))

        var seen = Set<String>()
        let unique = candidates.filter { seen.insert($0.path).inserted }
        for candidate in unique {
            var isDirectory: ObjCBool = false
            if fileManager.fileExists(atPath: candidate.path, isDirectory: &isDirectory), !isDirectory.boolValue,
                fileManager.isExecutableFile(atPath: candidate.path)
            {
                return .success(candidate)
            }
        }
        return .failure(LocateError(searched: unique.map(\.path)))
    }
}

/// How long one CLI invocation may take before the test kills it.
let cliTimeout: Duration = .seconds(60)

/// Runs the real `offer-signer` with `args`.
///
/// - `stdin`: the bytes standard input carries (from a temporary file, so a child that exits
///   without reading cannot SIGPIPE the test process); nil gives `/dev/null`.
/// - `environment`: added to the test process's environment, from which every
///   `OFFER_SIGNER_*` variable is removed first so the developer's settings never leak in.
/// - `status`: the exit status; when the process died from a signal (a crash), minus the
///   signal number, so `status > 0` means "a clean non-zero exit".
///
/// Children start through ``ChildProcess`` (posix_spawn), never Foundation's `Process`, and are
/// waited for on a thread of their own: a test blocked in the wait on one of the concurrency pool's
/// threads (two on a 2-core machine) would stall every server the suite runs beside it.
@discardableResult
func run(_ args: [String], stdin: Data? = nil, environment: [String: String] = [:], cwd: URL? = nil) async throws
    -> (status: Int32, stdout: String, stderr: String)
{
    try await runTool(CLIExecutable.url(), args, stdin: stdin, environment: environment, cwd: cwd)
}

/// Runs any executable the same way as ``run(_:stdin:environment:cwd:)``.
func runTool(_ executable: URL, _ args: [String], stdin: Data? = nil, environment: [String: String] = [:], cwd: URL? = nil) async throws
    -> (status: Int32, stdout: String, stderr: String)
{
    let result = try await ChildProcess.run(
        executable.path, args, environment: childEnvironment(environment), stdin: stdin, currentDirectory: cwd?.path, timeout: cliTimeout)
    return (result.status, result.stdoutText, result.stderrText)
}

/// The test process's environment without any `OFFER_SIGNER_*` variable, plus `extra`.
func childEnvironment(_ extra: [String: String]) -> [String: String] {
    var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OFFER_SIGNER_") }
    environment["SWIFT_BACKTRACE"] = "enable=no"  // a crash still shows as a signal; no slow symbolication
    environment.merge(extra) { _, new in new }
    return environment
}

/// Runs a tool found on PATH (openssl, sqlite3).
@discardableResult
func runOnPath(_ tool: String, _ args: [String], stdin: Data? = nil) async throws -> (status: Int32, stdout: String, stderr: String) {
    try await runTool(URL(fileURLWithPath: "/usr/bin/env"), [tool] + args, stdin: stdin)
}

/// Runs openssl and requires success.
func openssl(_ args: [String], stdin: Data? = nil, sourceLocation: SourceLocation = #_sourceLocation) async throws -> String {
    let result = try await runOnPath("openssl", args, stdin: stdin)
    try #require(result.status == 0, "openssl \(args.joined(separator: " ")) failed: \(result.stderr)", sourceLocation: sourceLocation)
    return result.stdout
}

/// Runs SQL on a SQLite file with the sqlite3 CLI and requires success.
@discardableResult
func sqlite(_ database: URL, _ sql: String, sourceLocation: SourceLocation = #_sourceLocation) async throws -> String {
    let result = try await runOnPath("sqlite3", [database.path, sql])
    try #require(result.status == 0, "sqlite3 failed: \(result.stderr)", sourceLocation: sourceLocation)
    return result.stdout
}

// MARK: - Temporary directories

/// Runs `body` with a fresh, empty directory that is removed afterwards, whatever happens.
func withTemporaryDirectory<T>(_ body: (URL) async throws -> T) async throws -> T {
    let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("offer-signer-cli-tests-\(UUID().uuidString)", isDirectory: true)
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }
    return try await body(directory)
}

// MARK: - Assertions

/// Requires a zero exit, showing stderr when it is not.
func expectSuccess(
    _ result: (status: Int32, stdout: String, stderr: String), _ what: String = "",
    sourceLocation: SourceLocation = #_sourceLocation
) throws {
    try #require(result.status == 0, "\(what) exited \(result.status); stderr: \(result.stderr) stdout: \(result.stdout)", sourceLocation: sourceLocation)
}

/// Checks a refused input: a clean non-zero exit (not a signal), no crash report, and a
/// message that mentions every one of `mentions` (case-insensitive) on stderr or stdout.
func expectCleanFailure(
    _ result: (status: Int32, stdout: String, stderr: String), exitCode: Int32? = nil, mentions: [String] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    guard result.status > 0 else {
        let what = result.status < 0 ? "it was killed by signal \(-result.status) (a crash)" : "it exited 0"
        Issue.record("expected a clean non-zero exit, but \(what); stderr: \(result.stderr.prefix(2000)) stdout: \(result.stdout.prefix(500))", sourceLocation: sourceLocation)
        return
    }
    if let exitCode {
        #expect(result.status == exitCode, "expected exit \(exitCode), got \(result.status); stderr: \(result.stderr) stdout: \(result.stdout)", sourceLocation: sourceLocation)
    }
    expectNoCrashReport(result, sourceLocation: sourceLocation)
    let output = (result.stderr + "\n" + result.stdout).lowercased()
    #expect(!result.stderr.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty || !result.stdout.isEmpty, "no message at all", sourceLocation: sourceLocation)
    for fragment in mentions {
        #expect(output.contains(fragment.lowercased()), "message does not mention '\(fragment)': \(result.stderr)\(result.stdout)", sourceLocation: sourceLocation)
    }
}

/// Fails when stderr looks like a Swift runtime trap or a crash backtrace.
func expectNoCrashReport(_ result: (status: Int32, stdout: String, stderr: String), sourceLocation: SourceLocation = #_sourceLocation) {
    for marker in ["Fatal error", "Program crashed", "Backtrace", "Stack dump", "Precondition failed", "Assertion failed", "Segmentation fault"] {
        #expect(!result.stderr.contains(marker), "stderr contains '\(marker)': \(result.stderr)", sourceLocation: sourceLocation)
    }
}

// MARK: - JSON

/// Parses one JSON object.
func jsonObject(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
    let value = try JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed])
    return try #require(value as? [String: Any], "not a JSON object: \(text)", sourceLocation: sourceLocation)
}

/// Parses a JSON array of objects.
func jsonArray(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> [[String: Any]] {
    let value = try JSONSerialization.jsonObject(with: Data(text.utf8))
    return try #require(value as? [[String: Any]], "not a JSON array of objects: \(text)", sourceLocation: sourceLocation)
}

/// The keys of a JSON object's top level, in the order they appear in the text.
func topLevelKeys(ofJSONObject text: String) -> [String] {
    var keys: [String] = []
    var depth = 0
    var inString = false, escaped = false, stringIsKey = false, expectingKey = false
    var current = ""
    for character in text {
        if inString {
            if escaped {
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "\"" {
                inString = false
                if stringIsKey { keys.append(current) }
                continue
            }
            current.append(character)
            continue
        }
        switch character {
        case "{", "[":
            depth += 1
            expectingKey = character == "{" && depth == 1
        case "}", "]":
            depth -= 1
        case ",":
            expectingKey = depth == 1
        case "\"":
            inString = true
            current = ""
            stringIsKey = expectingKey
            expectingKey = false
        default:
            break
        }
    }
    return keys
}

/// Decodes unpadded base64url.
func base64URLDecode(_ text: some StringProtocol) -> Data? {
    var standard = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
    while standard.utf8.count % 4 != 0 { standard += "=" }
    return Data(base64Encoded: standard)
}

/// Encodes unpadded base64url.
func base64URLEncode(_ data: Data) -> String {
    var text = data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
    while text.hasSuffix("=") { text.removeLast() }
    return text
}

/// Whether `text` is a lowercase 8-4-4-4-12 UUID.
func isLowercaseUUID(_ text: String) -> Bool {
    UUID(uuidString: text) != nil && text == text.lowercased() && text.count == 36
}

// MARK: - Keys

/// Writes a development key with `keys generate` and returns its path.
func generateKey(in directory: URL, keyID: String = "TESTKEY001", name: String = "key.p8", sourceLocation: SourceLocation = #_sourceLocation) async throws -> URL {
    let path = directory.appendingPathComponent(name)
    let result = try await run(["keys", "generate", "--key-id", keyID, "--output", path.path])
    try expectSuccess(result, "keys generate", sourceLocation: sourceLocation)
    return path
}

/// The private key in a .p8 file, read in-process with swift-crypto.
func loadPrivateKey(_ path: URL) throws -> P256.Signing.PrivateKey {
    try P256.Signing.PrivateKey(pemRepresentation: String(contentsOf: path, encoding: .utf8))
}

/// Writes text to a file with the given POSIX mode.
func writeFile(_ text: String, to url: URL, mode: Int = 0o600) throws {
    try Data(text.utf8).write(to: url)
    try FileManager.default.setAttributes([.posixPermissions: mode], ofItemAtPath: url.path)
}

/// A file's POSIX permission bits.
func posixMode(_ url: URL) throws -> Int {
    let attributes = try FileManager.default.attributesOfItem(atPath: url.path)
    return try #require((attributes[.posixPermissions] as? NSNumber)?.intValue) & 0o777
}

