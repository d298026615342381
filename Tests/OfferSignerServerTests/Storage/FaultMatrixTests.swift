import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import Logging
import OfferSignerCore
import OfferSignerServer
import TestChildProcess
import Testing

@testable import OfferSignerStorage

#if canImport(Glibc)
import Glibc
#endif

/// A real store in a directory of the test's choosing (a tmpfs it mounted, or a plain temporary
/// directory), with one key and one API client, and the configuration to serve it.
struct FaultFixture {
    let directory: URL
    let storePath: String
    let store: SQLiteStore
    let key: InAppPurchaseKey
    let secret: String
    let configuration: ServerConfiguration

    init(directory: URL) async throws {
        self.directory = directory
        storePath = directory.appendingPathComponent("store.sqlite").path
        store = try SQLiteStore(path: storePath)
        let masterKey = MasterKey.generate().key
        var logger = Logger(label: "offer-signer-fault-test")
        logger.logLevel = .critical  // the faults are expected; their log lines would only be noise here
        var configuration = ServerConfiguration(masterKey: masterKey, logger: logger)
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.registryPollInterval = .milliseconds(50)
        configuration.clientRateLimit = .unlimited
        configuration.appAccountTokenRateLimit = .unlimited
        configuration.operatorToken = TestServer.operatorToken
        configuration.readinessInterval = .milliseconds(100)
        self.configuration = configuration
        key = try InAppPurchaseKey.generateForDevelopment(keyID: "FAULTKEY01")
        _ = try await KeyRegistry.importKey(key, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
        secret = try await APIClientCredentials.create(in: store, name: "backend", bundleIDs: [], actor: "test", masterKey: masterKey).secret
    }

    /// Runs the real server on loopback for the duration of `test`.
    func live<Value: Sendable>(_ test: @escaping @Sendable (any TestClientProtocol) async throws -> Value) async throws -> Value {
        let application = try await buildApplication(configuration: configuration, store: store)
        return try await application.test(.live, test)
    }

    /// Signs one legacy offer; a 201's signature must verify with the key. Returns the status,
    /// the problem code of a refusal, and the nonce of an issued signature.
    func sign(_ client: any TestClientProtocol, sourceLocation: SourceLocation = #_sourceLocation) async throws -> (status: HTTPResponse.Status, code: String?, nonce: String?) {
        let token = UUID().uuidString.lowercased()
        let response = try await client.postJSON(
            "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)","formats":["legacy"]}"#, bearer: secret)
        guard response.status == .created else {
            #expect(response.json["legacy"] == nil, "a refusal carried a signature", sourceLocation: sourceLocation)
            return (response.status, response.json["code"] as? String, nil)
        }
        let legacy = try #require(response.json["legacy"] as? [String: Any], sourceLocation: sourceLocation)
        let document = LegacySignatureDocument(
            bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: token,
            keyID: try #require(legacy["keyID"] as? String), nonce: try #require(legacy["nonce"] as? String),
            timestamp: try #require(legacy["timestamp"] as? Int64), signature: try #require(legacy["signature"] as? String))
        #expect(SignatureDocument.legacy(document).verify(with: key.publicKey) == .valid, sourceLocation: sourceLocation)
        return (response.status, nil, document.nonce)
    }

    /// Signs `count` offers and requires each to be issued; returns their nonces.
    func signExpectingSuccess(_ client: any TestClientProtocol, count: Int, sourceLocation: SourceLocation = #_sourceLocation) async throws -> [String] {
        var nonces: [String] = []
        for _ in 0..<count {
            let outcome = try await sign(client, sourceLocation: sourceLocation)
            try #require(outcome.status == .created, "signing answered \(outcome.status) \(outcome.code ?? "")", sourceLocation: sourceLocation)
            nonces.append(try #require(outcome.nonce, sourceLocation: sourceLocation))
        }
        return nonces
    }

    /// Signs `count` offers during a fault and requires each to be refused with 503 `code`.
    func signExpectingRefusal(_ client: any TestClientProtocol, count: Int, code: String = "audit_unavailable", sourceLocation: SourceLocation = #_sourceLocation) async throws {
        for _ in 0..<count {
            let outcome = try await sign(client, sourceLocation: sourceLocation)
            #expect(outcome.status == .serviceUnavailable && outcome.code == code, "during the fault, signing answered \(outcome.status) \(outcome.code ?? "")", sourceLocation: sourceLocation)
            #expect(outcome.nonce == nil, "a signature was issued during the fault", sourceLocation: sourceLocation)
        }
    }
}

/// `/readyz` in the operator's view (`?detail`, with the operator token; a load balancer sees the
/// same status without the detail).
struct Readiness: Sendable {
    var status: HTTPResponse.Status
    var code: String?
    var detail: String

    var isReady: Bool { status == .ok }

    static func check(_ client: any TestClientProtocol) async throws -> Readiness {
        let response = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
        let json = response.json
        return Readiness(status: response.status, code: json["code"] as? String, detail: json["detail"] as? String ?? response.text)
    }

    /// Polls every 100 ms until readiness is `ready` (no other traffic), for at most `within`.
    static func wait(_ client: any TestClientProtocol, untilReady ready: Bool, within: Duration) async throws -> (readiness: Readiness, after: Duration) {
        let start = ContinuousClock.now
        var last = try await check(client)
        while last.isReady != ready && ContinuousClock.now - start < within {
            try await Task.sleep(for: .milliseconds(100))
            last = try await check(client)
        }
        return (last, ContinuousClock.now - start)
    }

    /// Requires `/readyz` to stay 503 `not_ready`, its detail mentioning `mentions`, for `period`
    /// (polled every 250 ms, with no signing traffic: the committer's own write test runs).
    static func expectNotReady(_ client: any TestClientProtocol, for period: Duration, mentions: [String], sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let start = ContinuousClock.now
        print("readyz during the fault: \(try await check(client).detail)")
        repeat {
            let readiness = try await check(client)
            #expect(readiness.status == .serviceUnavailable && readiness.code == "not_ready", "readyz: \(readiness.status) \(readiness.detail)", sourceLocation: sourceLocation)
            for fragment in mentions {
                #expect(readiness.detail.contains(fragment), "readyz detail does not mention '\(fragment)': \(readiness.detail)", sourceLocation: sourceLocation)
            }
            try await Task.sleep(for: .milliseconds(250))
        } while ContinuousClock.now - start < period
    }
}

/// Checks, on the store after the server stopped, that every signature handed out (a 201) has
/// its ledger row and its audit record, that the ledger holds nothing else (nothing refused
/// during the fault was recorded as issued), and that the audit chain is intact.
func expectEverySignatureRecorded(_ nonces: [String], storePath: String, sourceLocation: SourceLocation = #_sourceLocation) async throws {
    let queue = try DatabaseQueue(path: storePath)
    let (ledger, audited) = try await queue.read { db -> ([String], Set<String>) in
        let ledger = try String.fetchAll(db, sql: "SELECT nonce FROM issued_signatures")
        let bodies = try String.fetchAll(db, sql: """
            SELECT audit_log.body FROM issued_signatures JOIN audit_log ON audit_log.seq = issued_signatures.audit_seq
            WHERE audit_log.kind = 'signature.issued'
            """)
        let audited = Set(ledger.filter { nonce in bodies.contains { $0.contains(nonce) } })
        return (ledger, audited)
    }
    #expect(Set(ledger) == Set(nonces) && ledger.count == nonces.count, "ledger \(ledger.count) rows, \(nonces.count) signatures handed out", sourceLocation: sourceLocation)
    #expect(Set(nonces).isSubset(of: audited), "signatures without their audit record: \(Set(nonces).subtracting(audited))", sourceLocation: sourceLocation)
    let report = try await SQLiteStore(path: storePath).verifyAudit()
    #expect(report.isIntact, "the audit chain is not intact after the fault", sourceLocation: sourceLocation)
}

/// Mounting for the tests (root only): a tmpfs of a given size, unmounted whatever happens.
enum TestMount {
    /// Set to 1 to test the fallback used where mounting is not allowed.
    static let refuseVariable = "OFFER_SIGNER_TEST_NO_MOUNT"

    /// Mounts a tmpfs of `size` (say "2m") at `directory`; returns why not when it cannot.
    static func mountTmpfs(at directory: URL, size: String) -> String? {
        if ProcessInfo.processInfo.environment[refuseVariable] == "1" { return "\(refuseVariable)=1" }
        guard getuid() == 0 else { return "not root (uid \(getuid()))" }
        guard let result = try? ChildProcess.run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size),mode=0700", "tmpfs", directory.path], timeout: .seconds(20)) else {
            return "mount could not be started"
        }
        return result.status == 0 ? nil : "mount failed (status \(result.status)): \(result.stderrText.trimmingCharacters(in: .whitespacesAndNewlines))"
    }

    /// Unmounts `directory`; detaches it lazily when files on it are still open (the store the
    /// server had), so it never stays mounted.
    static func unmount(_ directory: URL) {
        if (try? ChildProcess.run("/bin/umount", [directory.path], timeout: .seconds(20)))?.status == 0 { return }
        let lazy = try? ChildProcess.run("/bin/umount", ["-l", directory.path], timeout: .seconds(20))
        if lazy?.status != 0 { Issue.record("could not unmount the test tmpfs at \(directory.path): \(lazy?.stderrText ?? "umount did not run")") }
    }

    /// Says loudly that a fault was simulated rather than produced for real: printed, and
    /// recorded as a warning issue, which the test report shows without failing the test.
    static func announceFallback(_ text: String, sourceLocation: SourceLocation = #_sourceLocation) {
        print("FAULT MATRIX FALLBACK: \(text)")
        Issue.record(Comment(rawValue: "fault matrix fallback: \(text)"), severity: .warning, sourceLocation: sourceLocation)
    }
}

/// Fills the filesystem holding `path` with one file until writes fail with ENOSPC; returns the bytes written.
func fillFilesystem(with path: String) -> Int {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard descriptor >= 0 else { return 0 }
    defer { close(descriptor) }
    var total = 0
    let chunk = [UInt8](repeating: 0xA5, count: 64 * 1024)
    for size in [64 * 1024, 4096, 512, 1] {
        while true {
            let written = chunk.withUnsafeBytes { write(descriptor, $0.baseAddress, size) }
            guard written > 0 else { break }
            total += written
        }
    }
    fsync(descriptor)
    return total
}

/// Sets or clears the immutable attribute (`chattr +i`/`-i`); returns chattr's complaint on failure.
@discardableResult
func setImmutable(_ on: Bool, _ paths: [String]) -> String? {
    guard let result = try? ChildProcess.run("/usr/bin/chattr", [on ? "+i" : "-i"] + paths, timeout: .seconds(20)) else { return "chattr could not be started" }
    return result.status == 0 ? nil : "chattr failed (status \(result.status)): \(result.stderrText.trimmingCharacters(in: .whitespacesAndNewlines))"
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

func temporaryTestDirectory(_ name: String) throws -> URL {
    let directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-\(name)-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    return directory
}

/// Storage faults while serving, each on a real server with a real SQLite store: signing
/// answers 503 and hands out no signature without its audit record, `/readyz` answers 503 for
/// as long as the fault lasts, and the service recovers by itself, without signing traffic,
/// once the fault is gone (where that is possible).
@Suite("Fault matrix: full disk, read-only store, removed store directory", .serialized)
struct FaultMatrixTests {
    @Test("Disk full: 503 and not ready while the store's filesystem is full; ready and signing again by itself once space is freed")
    func diskFull() async throws {
        let directory = try temporaryTestDirectory("disk-full")
        let mountRefusal = TestMount.mountTmpfs(at: directory, size: "2m")
        defer {
            if mountRefusal == nil { TestMount.unmount(directory) }
            try? FileManager.default.removeItem(at: directory)
        }
        if let mountRefusal {
            TestMount.announceFallback(
                "disk full was NOT produced on a real tmpfs (\(mountRefusal)); SQLite's PRAGMA max_page_count on the writer connection produces the same SQLITE_FULL instead")
        }
        let fixture = try await FaultFixture(directory: directory)
        let filler = directory.appendingPathComponent("filler").path
        let nonces = try await fixture.live { client in
            var nonces = try await fixture.signExpectingSuccess(client, count: 3)
            #expect(try await Readiness.check(client).isReady)

            // A reader holds the log at its snapshot (as `offer-signer audit verify` on a live
            // store would), so SQLite cannot start the log over in the space it already has: once
            // that is used up, every commit needs new space. Without it, how many commits a full
            // disk still takes depends on when a checkpoint last let the log start over.
            var pinConfiguration = Configuration()
            pinConfiguration.allowsUnsafeTransactions = true
            let pin = try DatabaseQueue(path: fixture.storePath, configuration: pinConfiguration)
            try pin.inDatabase { db in
                try db.execute(sql: "BEGIN DEFERRED TRANSACTION")
                _ = try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM audit_log")
            }
            if mountRefusal == nil {
                let filled = fillFilesystem(with: filler)
                print("disk full: filled the 2 MiB tmpfs with \(filled) bytes")
            } else {
                // Capped at its current size, the store fails as soon as a commit needs a new page.
                try await fixture.store.onWriterConnection { db in
                    let pages = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
                    _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(pages)")
                }
            }
            // Commits go on (durably: each of these signatures is checked in the store below)
            // while they fit in space the store already has; the first that needs more fails.
            var refused = false
            var issuedOnFullDisk = 0
            for _ in 0..<200 where !refused {
                let outcome = try await fixture.sign(client)
                if let nonce = outcome.nonce {
                    nonces.append(nonce)
                    issuedOnFullDisk += 1
                } else {
                    #expect(outcome.status == .serviceUnavailable && outcome.code == "audit_unavailable", "\(outcome.status) \(outcome.code ?? "")")
                    refused = true
                }
            }
            try #require(refused, "a full store still took 200 signatures")
            print("disk full: \(issuedOnFullDisk) signatures still fitted in the store's space before the first 503")
            try await fixture.signExpectingRefusal(client, count: 3)
            try await Readiness.expectNotReady(client, for: .seconds(2), mentions: ["audit commits are failing", "full"])

            // Space freed: ready again through the committer's write test alone, then signing.
            if mountRefusal == nil {
                try FileManager.default.removeItem(atPath: filler)
            } else {
                try await fixture.store.onWriterConnection { db in _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = 4294967294") }
            }
            let (readiness, after) = try await Readiness.wait(client, untilReady: true, within: .seconds(10))
            #expect(readiness.isReady, "still not ready 10 s after space was freed: \(readiness.detail)")
            print(String(format: "disk full: ready again %.2f s after space was freed, without signing traffic", after.seconds))
            try pin.inDatabase { db in try db.execute(sql: "ROLLBACK") }
            nonces += try await fixture.signExpectingSuccess(client, count: 3)
            return nonces
        }
        try await expectEverySignatureRecorded(nonces, storePath: fixture.storePath)
    }

    @Test("Read-only store: permission bits do not stop a running server (nothing lost); an immutable store gives 503 and not ready, and recovers by itself")
    func readOnlyStore() async throws {
        // Not on a tmpfs: tmpfs ignores the immutable attribute for descriptors already open
        // (measured on Linux 6.18); ext4 and most disk filesystems honour it.
        let directory = try temporaryTestDirectory("read-only")
        let fixture = try await FaultFixture(directory: directory)
        // The database file and its log, which SQLite writes with write(2). Not the -shm file: SQLite
        // maps it into memory, and a write to a mapped page of an immutable file is a SIGBUS that
        // kills the process (ext4 refuses to make the page writable again once it was written
        // back): a fault no process can answer with a 503, listed in Docs/Operations.md.
        let files = [fixture.storePath, fixture.storePath + "-wal"]
        defer {
            setImmutable(false, files)
            try? FileManager.default.removeItem(at: directory)
        }
        let nonces = try await fixture.live { client in
            var nonces = try await fixture.signExpectingSuccess(client, count: 2)

            // chmod 0444 while serving: the writer's descriptors were opened read-write and stay
            // so (for root and everyone else alike), so signing goes on and every record lands.
            for file in files { try FileManager.default.setAttributes([.posixPermissions: 0o444], ofItemAtPath: file) }
            nonces += try await fixture.signExpectingSuccess(client, count: 2)
            #expect(try await Readiness.check(client).isReady)
            for file in files { try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: file) }

            // A store that really refuses writes: the immutable attribute fails writes through
            // open descriptors too (EPERM), root's included.
            let immutableRefusal = getuid() == 0 ? setImmutable(true, files) : "not root (uid \(getuid())): chattr +i needs CAP_LINUX_IMMUTABLE"
            if let immutableRefusal {
                TestMount.announceFallback(
                    "the store files were NOT made immutable (\(immutableRefusal)); PRAGMA query_only on the writer connection refuses writes as a read-only store does instead")
                try await fixture.store.onWriterConnection { db in try db.execute(sql: "PRAGMA query_only = ON") }
            }
            try await fixture.signExpectingRefusal(client, count: 3)
            try await Readiness.expectNotReady(client, for: .seconds(2), mentions: ["audit commits are failing"])

            if immutableRefusal == nil {
                #expect(setImmutable(false, files) == nil)
            } else {
                try await fixture.store.onWriterConnection { db in try db.execute(sql: "PRAGMA query_only = OFF") }
            }
            let (readiness, after) = try await Readiness.wait(client, untilReady: true, within: .seconds(10))
            #expect(readiness.isReady, "still not ready 10 s after the store was writable again: \(readiness.detail)")
            print(String(format: "read-only store: ready again %.2f s after writes were allowed, without signing traffic", after.seconds))
            nonces += try await fixture.signExpectingSuccess(client, count: 3)
            return nonces
        }
        try await expectEverySignatureRecorded(nonces, storePath: fixture.storePath)
    }

    @Test("Store directory removed while serving: detected (503, not ready, for good), no crash, nothing signed into the lost files")
    func storeDirectoryRemoved() async throws {
        let parent = try temporaryTestDirectory("removed")
        defer { try? FileManager.default.removeItem(at: parent) }
        let directory = parent.appendingPathComponent("store-directory")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let fixture = try await FaultFixture(directory: directory)
        // Moved rather than deleted, so the test can read what was committed: for the server the
        // path is gone exactly as after `rm -rf`, and its open descriptors still work.
        let movedAway = parent.appendingPathComponent("moved-away")
        let nonces = try await fixture.live { client in
            let nonces = try await fixture.signExpectingSuccess(client, count: 2)
            try FileManager.default.moveItem(at: directory, to: movedAway)

            try await fixture.signExpectingRefusal(client, count: 3)
            try await Readiness.expectNotReady(client, for: .seconds(2), mentions: ["audit commits are failing", "removed or replaced"])
            #expect(try await client.execute(uri: "/healthz", method: .get).status == .ok, "the process is alive and answering")

            // An empty directory in its place changes nothing: the store is not there, and
            // nothing creates an empty one where it was.
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try await Readiness.expectNotReady(client, for: .seconds(2), mentions: ["removed or replaced"])
            try await fixture.signExpectingRefusal(client, count: 2)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path).isEmpty, "something was created where the store was")
            return nonces
        }
        try await expectEverySignatureRecorded(nonces, storePath: movedAway.appendingPathComponent("store.sqlite").path)
    }
}
