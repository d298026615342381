import Crypto
import Foundation
import GRDB
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// A real store in a temporary directory, with one imported key per bundle and the
/// configuration to run the real server on it.
struct TestServer {
    let directory: URL
    let store: SQLiteStore
    let masterKey: MasterKey
    /// The master key as `--master-key-file` takes it (Base64), for CLI children on this store.
    let masterKeyBase64: String
    var configuration: ServerConfiguration
    var keys: [String: InAppPurchaseKey] = [:]
    static let issuerID = "57246542-96fe-1a63-e053-0824d011072a"
    /// The operator token of test servers (`GET /readyz?detail`).
    static let operatorSecret = "test-operator-token-0123456789abcdef"
    static var operatorToken: OperatorToken { try! OperatorToken(operatorSecret) }

    /// `busyTimeout`: how long the store's SQLite connections wait for another connection's lock
    /// (the store's default unless a test needs a wait it can tell apart from its own bound).
    init(
        bundles: [String] = ["com.example.app"], busyTimeout: TimeInterval = 5, configure: (inout ServerConfiguration) -> Void = { _ in }
    ) async throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-tests-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        store = try SQLiteStore(path: directory.appendingPathComponent("store.sqlite").path, busyTimeout: busyTimeout)
        (masterKey, masterKeyBase64) = MasterKey.generate()
        var logger = Logger(label: "offer-signer-test")
        logger.logLevel = .warning
        configuration = ServerConfiguration(masterKey: masterKey, logger: logger)
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.registryPollInterval = .milliseconds(50)
        configuration.clientRateLimit = .unlimited
        configuration.appAccountTokenRateLimit = .unlimited
        // Generous: the full suite on a shared machine stalls store calls; tests of the bound set their own.
        configuration.storeTimeout = .seconds(60)
        configuration.operatorToken = Self.operatorToken
        configure(&configuration)
        for (index, bundle) in bundles.enumerated() {
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: "TESTKEY\(String(format: "%03d", index))")
            _ = try await KeyRegistry.importKey(key, bundleID: bundle, issuerID: Self.issuerID, development: true, into: store, masterKey: masterKey, actor: "test", reason: nil)
            keys[bundle] = key
        }
    }

    func cleanUp() {
        try? FileManager.default.removeItem(at: directory)
    }

    /// Runs the real server on loopback for the duration of `test`.
    func live<Value: Sendable>(_ test: @escaping @Sendable (any TestClientProtocol) async throws -> Value) async throws -> Value {
        let application = try await buildApplication(configuration: configuration, store: store)
        return try await application.test(.live, test)
    }

    /// Waits until the running server has read the store's registry as it is now, so a key or
    /// client change made through `store` is in force (the server polls the registry every 50 ms
    /// here, later on a loaded machine). Ready means `/readyz?detail` (the operator's view) reports that registry version
    /// (the registry manifest's, see `RegistryManifest`);
    /// `orNotReady` also accepts a 503 (a change that leaves no usable key). At most 10 s.
    func waitForRegistry(_ client: any TestClientProtocol, orNotReady: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let version = try await store.registrySnapshot().manifest?.version ?? 0
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let ready = try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(Self.operatorSecret)"])
            if ready.status == .serviceUnavailable && orNotReady { return }
            if let seen = ready.json["registryVersion"] as? Int, Int64(seen) >= version { return }
            try await Task.sleep(for: .milliseconds(20))
        }
        Issue.record("the server did not read registry version \(version) within 10 s", sourceLocation: sourceLocation)
    }

    func createClient(name: String, bundleIDs: [String] = []) async throws -> String {
        try await APIClientCredentials.create(in: store, name: name, bundleIDs: bundleIDs, actor: "test", masterKey: masterKey).secret
    }

    /// Number of rows in the ledger of issued signatures.
    func issuedCount() throws -> Int {
        let queue = try DatabaseQueue(path: directory.appendingPathComponent("store.sqlite").path)
        return try queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM issued_signatures") ?? 0 }
    }

    /// Runs SQL on the store through a second connection (to simulate failures and tampering).
    func execute(_ sql: String) throws {
        let queue = try DatabaseQueue(path: directory.appendingPathComponent("store.sqlite").path)
        try queue.write { db in try db.execute(sql: sql) }
    }
}

extension TestClientProtocol {
    func postJSON(_ path: String, _ body: String, bearer: String? = nil, contentType: String = "application/json") async throws -> TestResponse {
        var headers: HTTPFields = [.contentType: contentType]
        if let bearer { headers[.authorization] = "Bearer \(bearer)" }
        return try await execute(uri: path, method: .post, headers: headers, body: ByteBuffer(string: body))
    }
}

extension TestResponse {
    var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any]) ?? [:]
    }

    var text: String { String(buffer: body) }
}

/// Checks a response is an RFC 9457 problem document with the expected status and code.
func expectProblem(_ response: TestResponse, _ status: HTTPResponse.Status, _ code: String, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(response.status == status, "body: \(response.text)", sourceLocation: sourceLocation)
    #expect(response.headers[.contentType] == "application/problem+json", sourceLocation: sourceLocation)
    let json = response.json
    #expect(json["code"] as? String == code, "body: \(response.text)", sourceLocation: sourceLocation)
    #expect(json["status"] as? Int == Int(status.code), sourceLocation: sourceLocation)
    #expect(json["type"] as? String == "/problems/\(code)", sourceLocation: sourceLocation)
    #expect(ProblemCatalog.type(for: code)?.status == status, "'\(code)' is not in ProblemCatalog with status \(status.code)", sourceLocation: sourceLocation)
    #expect((json["title"] as? String).map { !$0.isEmpty && $0 == ProblemCatalog.type(for: code)?.title } == true, sourceLocation: sourceLocation)
    #expect((json["detail"] as? String)?.isEmpty == false, sourceLocation: sourceLocation)
    #expect(json["legacy"] == nil && json["jws"] == nil, "a problem never carries a signature", sourceLocation: sourceLocation)
}
