import Foundation
import TestChildProcess
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `serve` at start: an unreadable master key file stops it with a clear message and a
/// non-zero exit; `--idle-timeout-seconds` (or `OFFER_SIGNER_IDLE_TIMEOUT_SECONDS`) is checked
/// before anything starts and closes idle connections on the running server.
@Suite struct ServeFaultTests {
    /// A store with one key, and the `serve` arguments for it.
    static func fixture(in directory: URL) async throws -> (fixture: StoreFixture, serve: [String]) {
        let fixture = try StoreFixture(in: directory)
        try expectSuccess(try await run(fixture.importArguments("SERVEKEY01", file: try fixture.key("SERVEKEY01")) + ["--development"]), "keys import")
        return (fixture, ["serve", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path])
    }

    @Test("An unreadable master key file: serve refuses to start, says which file and why, exits non-zero")
    func unreadableMasterKeyFile() async throws {
        try await withTemporaryDirectory { directory in
            let (fixture, serve) = try await Self.fixture(in: directory)
            let result: (status: Int32, stdout: String, stderr: String)
            if getuid() == 0 {
                // Root reads a file whatever its mode, so the server runs as nobody, for whom the
                // key file (root's, mode 0600) cannot be read: the failure an operator meets.
                result = try await runTool(
                    URL(fileURLWithPath: "/usr/bin/setpriv"),
                    ["--reuid=65534", "--regid=65534", "--clear-groups", "--", try CLIExecutable.url().path] + serve + ["--port", "0"])
            } else {
                try FileManager.default.setAttributes([.posixPermissions: 0], ofItemAtPath: fixture.masterKey.path)
                result = try await run(serve + ["--port", "0"])
            }
            expectCleanFailure(result, mentions: ["master key file", fixture.masterKey.path, "cannot be read"])
            #expect(!result.stderr.contains(fixture.masterKeyText), "the message shows the key")
        }
    }

    @Test("A master key path that is a directory: serve refuses to start with a clear message")
    func masterKeyPathIsADirectory() async throws {
        try await withTemporaryDirectory { directory in
            let (fixture, _) = try await Self.fixture(in: directory)
            let keyDirectory = directory.appendingPathComponent("key-directory")
            try FileManager.default.createDirectory(at: keyDirectory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
            let result = try await run(["serve", "--store", fixture.store.path, "--master-key-file", keyDirectory.path, "--port", "0"])
            expectCleanFailure(result, mentions: ["master key file", keyDirectory.path])
        }
    }

    @Test("--apple-api-*, --retention-budget-ms and --apple-endpoint-concurrency out of range, or --apple-api-* without an offers catalog, stop serve before it starts", arguments: [
        (["--apple-api-time-budget-ms", "0"], "between 1 and 60000"),
        (["--apple-api-connections", "1"], "between 2 and 1024"),
        (["--apple-api-cache-seconds=-5"], "between 0 and 86400"),
        (["--retention-budget-ms", "0"], "between 1 and 10000"),
        (["--apple-endpoint-concurrency", "0"], "between 1 and 4096"),
        (["--apple-endpoint-concurrency", "4097"], "between 1 and 4096"),
    ])
    func badAppleAPISettings(_ arguments: [String], _ message: String) async throws {
        try await withTemporaryDirectory { directory in
            let (_, serve) = try await Self.fixture(in: directory)
            let catalog = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../offers.example.json").standardizedFileURL.path
            expectCleanFailure(try await run(serve + ["--port", "0", "--offers", catalog] + arguments), mentions: [message])
            if arguments[0].hasPrefix("--apple-api") {
                expectCleanFailure(try await run(serve + ["--port", "0"] + arguments), mentions: ["need an offers catalog"])
            }
        }
    }

    @Test("Every setting serve checks at start stops it before the store is opened: a refused start makes no SQLite file", arguments: [
        (["--store-timeout-ms", "0"], "--store-timeout-ms must be between 1 and 600000"),
        (["--checkpoint-every-records", "0"], "--checkpoint-every-records must be at least 1"),
        (["--checkpoint-every-seconds", "0"], "--checkpoint-every-seconds must be more than 0"),
        (["--notification-recovery-interval", "0.5"], "--notification-recovery-interval must be at least 1"),
        (["--retention-budget-ms", "10001"], "--retention-budget-ms must be between 1 and 10000"),
        (["--apple-endpoint-concurrency", "0"], "--apple-endpoint-concurrency must be between 1 and 4096"),
        (["--operator-token-file", "{dir}/no-operator-token"], "operator token file"),
        (["--admin-token-file", "{dir}/no-admin-token"], "admin token file"),
        (["--offers", "{dir}/no-offers.json"], "no-offers.json"),
        (["--offers", "{catalog}", "--apple-api-connections", "1"], "--apple-api-connections must be between 2 and 1024"),
        (["--client-rate=-1"], "client rate limit cannot be used"),
        (["--token-rate", "5", "--token-burst", "0.5"], "appAccountToken rate limit cannot be used"),
        (["--notification-recovery-interval", "60"], "notification catch-up needs the offers catalog"),
        (["--jwt-jwks", "{dir}/jwks.json", "--jwt-issuer", "https://auth.example.com", "--jwt-audience", "offer-signer", "--jwt-token-claim", "t"],
         "JWKS is not a JSON Web Key Set"),
        (["--port", "70000"], "the port must be between 0 and 65535"),
        (["--checkpoint-file", "{dir}/no-such-directory/served.checkpoint"], "cannot be written"),
        (["--registry-file", "{dir}/garbled.registry"], "does not hold"),
        (["--checkpoint-file", "{dir}/garbled.checkpoint"], "is not a checkpoints export"),
        (["--checkpoint-file", "{dir}/floor", "--registry-file", "{dir}/floor"], "are one file"),
    ])
    func settingsAreCheckedBeforeTheStoreIsMade(_ arguments: [String], _ message: String) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let store = fixture.store.path
            let catalog = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../offers.example.json").standardizedFileURL.path
            try Data("{\"keys\": 7}".utf8).write(to: directory.appendingPathComponent("jwks.json"))
            try Data("not a version\n".utf8).write(to: directory.appendingPathComponent("garbled.registry"))
            try Data("not a checkpoint\n".utf8).write(to: directory.appendingPathComponent("garbled.checkpoint"))
            let given = arguments.map { $0.replacingOccurrences(of: "{dir}", with: directory.path).replacingOccurrences(of: "{catalog}", with: catalog) }
            expectCleanFailure(
                try await run(["serve", "--store", store, "--master-key-file", fixture.masterKey.path, "--port", "0"] + given), mentions: [message])
            #expect(!FileManager.default.fileExists(atPath: store), "serve made the store before refusing \(arguments)")
        }
    }

    /// How a secret file is judged: the operator token file stands for all of them (one
    /// `SecretFile.read`); `--store-timeout-ms 0`, checked after it, says the file was accepted.
    /// `nil` expects acceptance, else the refusal's words.
    @Test("A secret file: a regular file or a pipe, owned by the service's user or root, with no access for group or others; a symbolic link is followed when its owner is the service's user or root", arguments: [
        ("0600", nil), ("0400", nil), ("link to 0600", nil), ("pipe", nil),
        ("0640", "by group or others"), ("0604", "by group or others"), ("0620", "by group or others"), ("0601", "by group or others"),
        ("0610", "by group or others"), ("link to 0644", "by group or others"), ("directory", "not a regular file"),
        ("fifo without a writer", "ended with nothing in it"), ("empty pipe", "ended with nothing in it"),
    ] as [(String, String?)])
    func secretFiles(_ form: String, _ refusal: String?) async throws {
        try await Self.expectSecretFile(form, refusal)
    }

    /// Giving a file or a link to `nobody` needs root: skipped, and shown as skipped, otherwise.
    @Test("A secret file, or the symbolic link at its path, owned by another user than the service's or root is refused, saying how to fix it", .enabled(if: getuid() == 0), arguments: [
        ("owned by nobody", "is owned by uid 65534"), ("link owned by nobody", "is a symbolic link owned by uid 65534"),
    ])
    func secretFilesOfAnotherUser(_ form: String, _ refusal: String) async throws {
        try await Self.expectSecretFile(form, refusal)
    }

    static func expectSecretFile(_ form: String, _ refusal: String?) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let secret = String(repeating: "t", count: 40)
            let file = directory.appendingPathComponent("operator-token")
            let target = directory.appendingPathComponent("..data-operator-token")
            switch form {
            case "directory":
                try FileManager.default.createDirectory(at: file, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
            case "fifo without a writer":  // read at once as empty, never waited on
                #expect(mkfifo(file.path, 0o600) == 0)
            case "pipe", "empty pipe":  // the shell's process substitution (/dev/fd/63, a pipe), written after a second, below
                break
            case let link where link.hasPrefix("link"):
                let mode = link.hasPrefix("link to ") ? Int(link.dropFirst("link to ".count), radix: 8)! : 0o600
                #expect(FileManager.default.createFile(atPath: target.path, contents: Data(secret.utf8), attributes: [.posixPermissions: mode]))
                try FileManager.default.createSymbolicLink(atPath: file.path, withDestinationPath: target.lastPathComponent)
                if link.hasSuffix("nobody") { #expect(lchown(file.path, 65534, 65534) == 0) }
            default:
                let mode = Int(form, radix: 8) ?? 0o600
                #expect(FileManager.default.createFile(atPath: file.path, contents: Data(secret.utf8), attributes: [.posixPermissions: mode]))
                if form.hasSuffix("nobody") { #expect(chown(file.path, 65534, 65534) == 0) }
            }
            let serve = ["serve", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path, "--port", "0", "--store-timeout-ms", "0"]
            // The empty pipe stands for a `vault` that failed: it writes nothing and exits 3.
            let substitution = form == "empty pipe" ? "<(sleep 1; exit 3)" : "<(sleep 1; printf %s \(secret))"
            let result =
                form.hasSuffix("pipe")
                ? try await runTool(
                    URL(fileURLWithPath: "/bin/bash"),
                    ["-c", "exec \"$0\" \"$@\" --operator-token-file \(substitution)", try CLIExecutable.url().path] + serve)
                : try await run(serve + ["--operator-token-file", file.path])
            if let refusal {
                // A pipe's path is the shell's (/dev/fd/N), not the file's.
                let names = form.hasSuffix("pipe") ? ["operator token file", "/dev/fd/"] : ["operator token file", file.path]
                expectCleanFailure(result, mentions: names + [refusal])
            } else {
                expectCleanFailure(result, mentions: ["--store-timeout-ms must be between"])
            }
            #expect(!result.stderr.contains(secret), "the message shows the secret")
        }
    }

    @Test("OFFER_SIGNER_APPLE_API_* without an offers catalog stop serve as their flags do (the variable named), before the store is made", arguments: [
        "OFFER_SIGNER_APPLE_API_TIME_BUDGET_MS", "OFFER_SIGNER_APPLE_API_CONNECTIONS", "OFFER_SIGNER_APPLE_API_CACHE_SECONDS",
    ])
    func appleAPIVariablesWithoutACatalog(_ variable: String) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let store = fixture.store.path
            let serve = ["serve", "--store", store, "--master-key-file", fixture.masterKey.path, "--port", "0"]
            expectCleanFailure(try await run(serve, environment: [variable: "100"]), mentions: [variable, "need an offers catalog"])
            #expect(!FileManager.default.fileExists(atPath: store), "serve made the store before refusing")
        }
    }

    @Test("End-user JWTs with both appAccountToken bindings, or neither, stop serve before the store is made", arguments: [
        (["--jwt-token-claim", "app_account_token", "--jwt-sub-namespace", "6ba7b810-9dad-11d1-80b4-00c04fd430c8"], [String: String](), "keep the claim"),
        (["--jwt-token-claim", "app_account_token"], ["OFFER_SIGNER_JWT_SUB_NAMESPACE": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"], "not both"),
        ([], [:], "need --jwt-token-claim NAME or --jwt-sub-namespace UUID"),
    ])
    func jwtBindingMustBeOne(_ arguments: [String], _ environment: [String: String], _ message: String) async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            let store = fixture.store.path
            let serve = ["serve", "--store", store, "--master-key-file", fixture.masterKey.path]
            let secret = directory.appendingPathComponent("jwt-secret")
            #expect(FileManager.default.createFile(
                atPath: secret.path, contents: Data(String(repeating: "s", count: 40).utf8), attributes: [.posixPermissions: 0o600]))
            let jwt = ["--jwt-hs256-secret-file", secret.path, "--jwt-issuer", "https://auth.example.com", "--jwt-audience", "offer-signer"]
            expectCleanFailure(try await run(serve + ["--port", "0"] + jwt + arguments, environment: environment), mentions: [message])
            #expect(!FileManager.default.fileExists(atPath: store), "serve made the store before refusing")
        }
    }

    @Test("--apple-endpoint-concurrency and OFFER_SIGNER_APPLE_ENDPOINT_CONCURRENCY reach the running server (said in its listening line); 32 without either", arguments: [
        (["--apple-endpoint-concurrency", "96"], [String: String](), "96"),
        ([], ["OFFER_SIGNER_APPLE_ENDPOINT_CONCURRENCY": "7"], "7"),
        ([], [:], "32"),
    ])
    func appleEndpointConcurrencyReachesTheServer(_ arguments: [String], _ environment: [String: String], _ expected: String) async throws {
        try await withTemporaryDirectory { directory in
            let (_, serve) = try await Self.fixture(in: directory)
            let output = try await Self.serveUntilItAccepts(serve + arguments, environment: environment)
            let listening = output.split(separator: "\n").first { $0.contains("offer-signer listening") } ?? ""
            #expect(listening.contains("apple_endpoint_concurrency=\(expected)"), "\(listening)")
        }
    }

    @Test("A registry file serve cannot write (a read-only key mount) does not stop it: it serves, and warns that the registry's floor is kept in memory only", .enabled(if: FileManager.default.fileExists(atPath: "/proc/self")))
    func unwritableRegistryFileIsWarnedAbout() async throws {
        try await withTemporaryDirectory { directory in
            let (_, serve) = try await Self.fixture(in: directory)
            // /proc/self is a directory no process, root included, can make a file in: a
            // registry file there reads as none yet and cannot be written, as on a read-only mount.
            let output = try await Self.serveUntilItAccepts(serve + ["--registry-file", "/proc/self/served.registry"])
            #expect(output.contains("the registry file cannot be written") && output.contains("give --registry-file PATH"), "\(output.suffix(2000))")
        }
    }

    @Test(arguments: ["0", "-1", "nan", "inf", "86401", "soon"])
    func badIdleTimeoutsAreRefusedBeforeAnythingStarts(_ value: String) async throws {
        try await ServeThreadsTests.expectRefusedBeforeAnythingStarts(
            flag: "idle-timeout-seconds", variable: "OFFER_SIGNER_IDLE_TIMEOUT_SECONDS", value: value, isNumber: value != "soon")
    }

    @Test("--idle-timeout-seconds and OFFER_SIGNER_IDLE_TIMEOUT_SECONDS close an idle connection to the running server", arguments: [true, false])
    func idleTimeoutClosesIdleConnections(_ byFlag: Bool) async throws {
        try await withTemporaryDirectory { directory in
            let (_, serve) = try await Self.fixture(in: directory)
            let port = try LoopbackPort.free()
            let process = try ChildProcess.spawn(
                try CLIExecutable.url().path, serve + ["--port", "\(port)"] + (byFlag ? ["--idle-timeout-seconds", "1"] : []),
                environment: childEnvironment(byFlag ? [:] : ["OFFER_SIGNER_IDLE_TIMEOUT_SECONDS": "1"]), captureOutput: true)
            try await process.stopped {
                let socket = try await Self.connectOnceServing(port: port, process: process)
                if socket < 0, !process.isRunning {
                    let ended = await process.exited()
                    Issue.record("serve exited (status \(ended.status)) before accepting connections: \(ended.stderrText.suffix(2000))")
                }
                try #require(socket >= 0, "serve did not accept connections within 60 s (running: \(process.isRunning))")
                defer { close(socket) }
                let opened = ContinuousClock.now
                // The server must close it: wait for end-of-stream, at most 20 s (polled on a thread
                // of its own, not one of the concurrency pool's).
                let closedAfter = try await onOwnThread { [socket] () -> Duration? in
                    var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
                    while ContinuousClock.now - opened < .seconds(20) {
                        guard poll(&descriptor, 1, 100) > 0 else { continue }
                        var byte: UInt8 = 0
                        let count = recv(socket, &byte, 1, Int32(MSG_DONTWAIT))
                        if count == 0 || (count < 0 && errno != EAGAIN && errno != EINTR) { return ContinuousClock.now - opened }
                    }
                    return nil
                }
                let after = try #require(closedAfter, "the idle connection was still open 20 s after it was opened")
                #expect(after >= .milliseconds(950), "closed after \(after), before the 1 s timeout")
            }
        }
    }

    /// A connection to 127.0.0.1:`port` once `process` accepts connections there (a loaded
    /// machine can take a while to start it), or -1 when it exits or 60 s pass first.
    /// Runs `serve` (`arguments`, on a free port) until it accepts a connection, stops it, and
    /// returns what it printed; expects that it accepted one.
    static func serveUntilItAccepts(
        _ arguments: [String], environment: [String: String] = [:], sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> String {
        let port = try LoopbackPort.free()
        let process = try ChildProcess.spawn(
            try CLIExecutable.url().path, arguments + ["--port", "\(port)"], environment: childEnvironment(environment), captureOutput: true)
        let socket = try await process.stopped {
            let socket = try await Self.connectOnceServing(port: port, process: process)
            if socket >= 0 { close(socket) }
            return socket
        }
        let ended = await process.exited(timeout: .seconds(60))
        let output = ended.stdoutText + ended.stderrText
        #expect(socket >= 0, "serve did not accept connections: \(output.suffix(2000))", sourceLocation: sourceLocation)
        return output
    }

    static func connectOnceServing(port: Int, process: ChildProcess) async throws -> Int32 {
        let deadline = ContinuousClock.now + .seconds(60)
        var socket: Int32 = -1
        while socket < 0 && ContinuousClock.now < deadline && process.isRunning {
            socket = connect(port: port)
            if socket < 0 { try await Task.sleep(for: .milliseconds(100)) }
        }
        return socket
    }

    /// A connection to 127.0.0.1:`port`, or -1.
    static func connect(port: Int) -> Int32 {
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socketFD >= 0 else { return -1 }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr = in_addr(s_addr: inet_addr("127.0.0.1"))
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(socketFD)
            return -1
        }
        return socketFD
    }
}
