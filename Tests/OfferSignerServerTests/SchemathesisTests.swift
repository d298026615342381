import Foundation
#if canImport(Glibc)
import Glibc
#endif
import HummingbirdTesting
import OfferSignerServer
import Testing

/// Runs schemathesis (PyPI; `.ci/run` installs it) against `/openapi.yaml` of a running
/// server: no 5xx, and every response conforms to the schema.
@Suite("schemathesis against the live OpenAPI document")
struct SchemathesisTests {
    @Test("No server error and no response that breaks the schema", .timeLimit(.minutes(10)))
    func fuzz() async throws {
        let server = try await TestServer { configuration in
            configuration.developmentMode = true
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 5, burst: 5)
        }
        defer { server.cleanUp() }
        let (status, output) = try await server.live { client -> (Int32, String) in
            let port = try #require(client.port)
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = [
                "schemathesis", "run", "http://127.0.0.1:\(port)/openapi.yaml",
                "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
                "--max-examples", "60", "--generation-deterministic", "--request-timeout", "10", "--no-color",
            ]
            var environment = ProcessInfo.processInfo.environment
            environment["SCHEMATHESIS_HOOKS"] = nil
            process.environment = environment
            let output = Pipe()
            process.standardOutput = output
            process.standardError = output
            try withProcessLaunchLock { try process.run() }
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: data, as: UTF8.self))
        }
        #expect(status == 0, "schemathesis failed (is `pip install schemathesis` done?):\n\(output)")
    }
}

/// Foundation's `Process.run()` on Linux is not safe while another thread of this test process
/// launches a child (a full run crashed inside it). Every test module launches through this
/// process-wide lock: an `flock` on one file, opened close-on-exec so no child inherits it.
func withProcessLaunchLock<Result>(_ body: () throws -> Result) rethrows -> Result {
    let descriptor = open("/tmp/offer-signer-tests-process-launch.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
    if descriptor >= 0 { flock(descriptor, LOCK_EX) }
    defer {
        if descriptor >= 0 {
            flock(descriptor, LOCK_UN)
            close(descriptor)
        }
    }
    return try body()
}
