import Foundation
#if canImport(Glibc)
import Glibc
#endif
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
import OfferSignerPostgres
import OfferSignerServer
import OfferSignerStorage
import Synchronization
import TestChildProcess
import TestPostgres
import Testing

/// Two real `offer-signer serve` processes on one PostgreSQL database; one is killed with
/// SIGKILL while both are under load.
@Suite("kill -9 of one instance under load", .serialized, .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
struct PostgresKillTests {
    /// The `offer-signer` executable `swift build --build-tests` put beside the test bundle.
    static func executable() throws -> String {
        var candidates: [String] = []
        if let override = ProcessInfo.processInfo.environment["OFFER_SIGNER_CLI_EXECUTABLE"], !override.isEmpty { candidates.append(override) }
        if let test = Bundle.main.executableURL?.resolvingSymlinksInPath().deletingLastPathComponent() {
            candidates.append(test.appendingPathComponent("offer-signer").path)
        }
        if let first = CommandLine.arguments.first {
            candidates.append(URL(fileURLWithPath: first).resolvingSymlinksInPath().deletingLastPathComponent().appendingPathComponent("offer-signer").path)
        }
        guard let found = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw ControlledPostgres.Failure(description: "offer-signer not found (run swift build --build-tests); looked at \(candidates)")
        }
        return found
    }

    static func waitUntilReady(port: Int, process: ChildProcess) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while ContinuousClock.now < deadline {
            try #require(process.isRunning, "serve on port \(port) exited: \(process.waitForExit().stderrText.suffix(2000))")
            let ready = try? await TestClient.withClient(host: "127.0.0.1", port: port) { try await $0.get("/readyz").status }
            if ready == .ok { return }
            try await Task.sleep(for: .milliseconds(100))
        }
        Issue.record("serve on port \(port) was not ready within 60 s")
    }

    @Test("kill -9 of one instance under load: every 201 a client received has its audit record, the other instance keeps serving, the chain is intact")
    func killOneInstanceUnderLoad() async throws {
        let database = try await TestPostgres.database()
        let store = try await PostgresStore.open(configuration: database.configuration)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-kill-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let (masterKey, masterText) = MasterKey.generate()
        let masterFile = directory.appendingPathComponent("master.key").path
        _ = FileManager.default.createFile(atPath: masterFile, contents: Data(masterText.utf8), attributes: [.posixPermissions: 0o600])
        _ = try await KeyRegistry.importKey(
            try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY000"), bundleID: "com.example.app", issuerID: TestServer.issuerID,
            development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
        let secret = try await APIClientCredentials.create(in: store, name: "load", bundleIDs: [], actor: "test", masterKey: masterKey).secret

        let executable = try Self.executable()
        var environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("OFFER_SIGNER_") }
        environment["OFFER_SIGNER_STORE"] = database.url
        let firstPort = try LoopbackPort.free()
        let ports = [firstPort, try LoopbackPort.free(excluding: [firstPort])]
        let servers = try ports.map { port in
            try ChildProcess.spawn(
                executable,
                ["serve", "--master-key-file", masterFile, "--port", String(port), "--client-rate", "0", "--token-rate", "0", "--log-level", "error"],
                environment: environment, captureOutput: false)
        }
        defer {
            for server in servers { server.terminateInBackground() }
        }
        for (port, server) in zip(ports, servers) { try await Self.waitUntilReady(port: port, process: server) }

        let killed = SharedFlag()
        let stop = SharedFlag()
        // (port, status or nil for a connection that failed, nonce, sent after the kill)
        let results = try await withThrowingTaskGroup(of: [(Int, UInt16?, String?, Bool)].self) { group in
            for worker in 0..<8 {
                group.addTask {
                    let port = ports[worker % 2]
                    var results: [(Int, UInt16?, String?, Bool)] = []
                    while !stop.isSet {
                        let afterKill = killed.isSet
                        do {
                            let (status, text) = try await TestClient.withClient(host: "127.0.0.1", port: port) { connection in
                                let response = try await connection.post(
                                    "/v1/offers/signatures", headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"],
                                    body: ByteBuffer(string: #"{"productID":"p","offerID":"o"}"#))
                                return (response.status.code, response.body.map { String(buffer: $0) } ?? "")
                            }
                            let json = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
                            results.append((port, UInt16(status), (json?["legacy"] as? [String: Any])?["nonce"] as? String, afterKill))
                        } catch {
                            results.append((port, nil, nil, afterKill))
                            try await Task.sleep(for: .milliseconds(20))
                        }
                    }
                    return results
                }
            }
            try await Task.sleep(for: .seconds(2))
            kill(servers[0].pid, SIGKILL)
            _ = await servers[0].exited()
            killed.set()
            try await Task.sleep(for: .seconds(2))
            stop.set()
            return try await group.reduce(into: []) { $0 += $1 }
        }

        let survivorAfterKill = results.filter { $0.0 == ports[1] && $0.3 }
        #expect(!survivorAfterKill.isEmpty && survivorAfterKill.allSatisfy { $0.1 == 201 }, "the other instance kept serving: \(survivorAfterKill.map { $0.1 ?? 0 })")
        #expect(results.filter { $0.0 == ports[0] && !$0.3 }.contains { $0.1 == 201 }, "the killed instance served before the kill")
        let issued = results.compactMap { $0.1 == 201 ? $0.2 : nil }
        let records = try await store.auditRecords(after: 0, limit: 1_000_000)
        var audited: [String: Int] = [:]
        for record in records where record.kind == "signature.issued" {
            if let nonce = (try? JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any])?["nonce"] as? String { audited[nonce, default: 0] += 1 }
        }
        #expect(!issued.isEmpty && issued.allSatisfy { audited[$0] == 1 }, "every 201 a client received has exactly one audit record")
        #expect(try await store.verifyAudit(trusted: nil, progressInterval: 100_000, progress: { _ in }).isIntact)
        await store.close()
        await database.drop()
    }
}
