import Crypto
import Foundation
import GRDB
import HTTPTypes
import HummingbirdTesting
import Logging
import NIOCore
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

@Suite("POST /v1/offers/signatures on a real server and a real SQLite store", .serialized)
struct SigningEndpointTests {
    @Test("Legacy and JWS signatures verify against the imported key, and are in ledger and audit")
    func signAndVerify() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let key = try #require(server.keys["com.example.app"])
        try await server.live { client in
            let response = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"6B29FC40-CA47-1067-B31D-00DD010662DA","formats":["legacy","jws"],"transactionID":"2000000123"}"#,
                bearer: secret)
            #expect(response.status == .created, "\(response.text)")
            #expect(response.headers[.contentType] == "application/json")
            let json = response.json
            #expect(json["bundleID"] as? String == "com.example.app")
            #expect(json["appAccountToken"] as? String == "6b29fc40-ca47-1067-b31d-00dd010662da")
            let legacy = try #require(json["legacy"] as? [String: Any])
            let timestamp = try #require(legacy["timestamp"] as? Int64)
            let document = LegacySignatureDocument(
                bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50",
                appAccountToken: "6b29fc40-ca47-1067-b31d-00dd010662da", keyID: try #require(legacy["keyID"] as? String),
                nonce: try #require(legacy["nonce"] as? String), timestamp: timestamp, signature: try #require(legacy["signature"] as? String))
            #expect(SignatureDocument.legacy(document).verify(with: key.publicKey) == .valid)
            let jws = try #require(json["jws"] as? [String: Any])
            let jwsDocument = PromotionalOfferJWSDocument(
                bundleID: "com.example.app", productID: "pro.monthly", offerID: "WINBACK50", keyID: key.keyID,
                transactionID: "2000000123", compactJWS: try #require(jws["compactJWS"] as? String))
            #expect(SignatureDocument.jws(jwsDocument).verify(with: key.publicKey) == .valid)
            // expiresAt is 24 h after the timestamp.
            let expiresAt = try #require(json["expiresAt"] as? String)
            #expect(expiresAt == Date.rfc3339(milliseconds: timestamp + 86_400_000))
            #expect(try Date(expiresAt, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true)).timeIntervalSince1970 * 1000 - Double(timestamp + 86_400_000) < 1)
        }
        // Both signatures are in the ledger and audited, with no secret in the audit log.
        let issued = try await server.store.issuedSignatures(appAccountToken: "6b29fc40-ca47-1067-b31d-00dd010662da", bundleID: "com.example.app")
        #expect(Set(issued.map(\.signature.format)) == ["legacy", "jws"])
        let records = try await server.store.auditRecords(after: 0, limit: 100)
        #expect(records.filter { $0.kind == "signature.issued" }.count == 2)
        for record in records {
            #expect(!record.body.contains(secret))
            #expect(!record.body.contains("PRIVATE KEY"))
        }
    }

    @Test("An introductory-offer eligibility signature's audit record names the transactionID and allowIntroductoryOffer it signed")
    func introEligibilityAudit() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let response = try await client.postJSON(
                "/v1/offers/signatures",
                #"{"productID":"pro.monthly","offerID":"intro","formats":["intro-eligibility"],"transactionID":"2000000456","allowIntroductoryOffer":false}"#,
                bearer: secret)
            #expect(response.status == .created, "\(response.text)")
        }
        let record = try #require(try await server.store.auditRecords(after: 0, limit: 100).last { $0.kind == "signature.issued" })
        let body = try #require(try JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any])
        #expect(body["format"] as? String == "intro-eligibility")
        #expect(body["transactionID"] as? String == "2000000456")
        #expect(body["allowIntroductoryOffer"] as? Bool == false)
    }

    @Test("Legacy is the default format and a token is optional")
    func defaults() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let response = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret)
            #expect(response.status == .created)
            #expect(response.json["legacy"] != nil)
            #expect(response.json["jws"] == nil)
            #expect(response.json["appAccountToken"] is NSNull)
        }
    }

    @Test("1,500 requests at concurrency 32 give 1,500 distinct nonces and an intact audit chain")
    func concurrency() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "load")
        let key = try #require(server.keys["com.example.app"])
        let nonces = try await server.live { client -> [String] in
            let port = try #require(client.port)
            return try await withThrowingTaskGroup(of: [String].self) { group in
                for worker in 0..<32 {
                    let count = 1500 / 32 + (worker < 1500 % 32 ? 1 : 0)
                    group.addTask {
                        try await TestClient.withClient(host: "127.0.0.1", port: port) { connection in
                            var nonces: [String] = []
                            for _ in 0..<count {
                                let token = UUID().uuidString
                                let response = try await connection.post(
                                    "/v1/offers/signatures",
                                    headers: [.contentType: "application/json", .authorization: "Bearer \(secret)"],
                                    body: ByteBuffer(string: #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\#(token)"}"#))
                                guard response.status == .created,
                                    let body = response.body, let json = try JSONSerialization.jsonObject(with: Data(body.readableBytesView)) as? [String: Any],
                                    let legacy = json["legacy"] as? [String: Any], let nonce = legacy["nonce"] as? String,
                                    let signature = legacy["signature"] as? String, let timestamp = legacy["timestamp"] as? Int64
                                else {
                                    Issue.record("unexpected response \(response.status): \(response.body.map { String(buffer: $0) } ?? "")")
                                    continue
                                }
                                let payload = try PromotionalOfferPayload(
                                    bundleID: "com.example.app", keyID: key.keyID, productID: "pro.monthly", offerID: "WINBACK50",
                                    appAccountToken: token, nonce: nonce, timestamp: timestamp)
                                #expect(PromotionalOfferVerifier(publicKey: key.publicKey).verifyLegacy(payload: payload, signature: signature) == .valid)
                                nonces.append(nonce)
                            }
                            return nonces
                        }
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
        }
        #expect(nonces.count == 1500)
        #expect(Set(nonces).count == 1500)
        #expect(try server.issuedCount() == 1500)
        let walker = try await server.store.verifyAuditChain()
        #expect(walker.firstBreak == nil)
        #expect(walker.count == 1500 + 2)  // + key import + client creation
        // Every nonce handed out is in the ledger and in exactly one audit record, and nothing else is.
        let audited = try await server.store.auditRecords(after: 0, limit: 2000)
            .filter { $0.kind == "signature.issued" }
            .compactMap { record in (try? JSONSerialization.jsonObject(with: Data(record.body.utf8)) as? [String: Any])?["nonce"] as? String }
        #expect(audited.count == 1500)
        #expect(Set(audited) == Set(nonces))
        let ledger = try await DatabaseQueue(path: server.store.path).read { db in try String.fetchSet(db, sql: "SELECT nonce FROM issued_signatures") }
        #expect(ledger == Set(nonces))
    }

    struct BadRequest: Sendable, CustomTestStringConvertible {
        var name: String
        var body: String
        var contentType = "application/json"
        var status: HTTPResponse.Status
        var code: String
        var testDescription: String { name }
    }

    static let badRequests: [BadRequest] = [
        BadRequest(name: "malformed JSON", body: #"{"productID": "#, status: .badRequest, code: "malformed_json"),
        BadRequest(name: "not an object", body: #"["productID"]"#, status: .badRequest, code: "malformed_json"),
        BadRequest(name: "wrong type", body: #"{"productID": 42, "offerID": "o"}"#, status: .badRequest, code: "wrong_type"),
        BadRequest(name: "null field", body: #"{"productID": null, "offerID": "o"}"#, status: .badRequest, code: "wrong_type"),
        BadRequest(name: "missing field", body: #"{"productID": "p"}"#, status: .badRequest, code: "missing_field"),
        BadRequest(name: "unknown field", body: #"{"productID": "p", "offerID": "o", "appAcountToken": "x"}"#, status: .badRequest, code: "unknown_field"),
        BadRequest(name: "member named twice", body: #"{"productID": "p", "offerID": "o", "productID": "q"}"#, status: .badRequest, code: "duplicate_field"),
        BadRequest(name: "member named twice, once escaped", body: #"{"appAccountToken": "6b29fc40-ca47-1067-b31d-00dd010662da", "productID": "p", "offerID": "o", "\u0061ppAccountToken": "0ad246b5-54d1-4e1b-88d4-ab934587435f"}"#, status: .badRequest, code: "duplicate_field"),
        BadRequest(name: "invalid UUID", body: #"{"productID": "p", "offerID": "o", "appAccountToken": "not-a-uuid"}"#, status: .badRequest, code: "invalid_app_account_token"),
        BadRequest(name: "empty product", body: #"{"productID": "", "offerID": "o"}"#, status: .badRequest, code: "field_empty"),
        BadRequest(name: "separator in offer", body: "{\"productID\": \"p\", \"offerID\": \"o\u{2063}x\"}", status: .badRequest, code: "field_invalid_character"),
        BadRequest(name: "unknown bundle", body: #"{"productID": "p", "offerID": "o", "bundleID": "com.unknown"}"#, status: .badRequest, code: "unknown_bundle"),
        BadRequest(name: "unknown format", body: #"{"productID": "p", "offerID": "o", "formats": ["carrier-pigeon"]}"#, status: .badRequest, code: "unknown_format"),
        BadRequest(name: "empty formats", body: #"{"productID": "p", "offerID": "o", "formats": []}"#, status: .badRequest, code: "unknown_format"),
        BadRequest(name: "body too large", body: #"{"productID": "p", "offerID": "o", "transactionID": ""# + String(repeating: "x", count: 70_000) + #""}"#, status: .contentTooLarge, code: "body_too_large"),
        BadRequest(name: "form body", body: "productID=p", contentType: "application/x-www-form-urlencoded", status: .unsupportedMediaType, code: "unsupported_media_type"),
        BadRequest(name: "text body", body: "{}", contentType: "text/plain", status: .unsupportedMediaType, code: "unsupported_media_type"),
    ]

    @Test("Every bad input gets its 4xx problem document and nothing is issued", arguments: badRequests)
    func badInput(_ bad: BadRequest) async throws {
        let server = try await TestServer { $0.maximumBodyBytes = 64 * 1024 }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let response = try await client.postJSON("/v1/offers/signatures", bad.body, bearer: secret, contentType: bad.contentType)
            expectProblem(response, bad.status, bad.code)
        }
        #expect(try server.issuedCount() == 0)
    }

    @Test("A largest body outside 1 KiB…64 MiB is refused before the server starts", arguments: [0, -1, 1023, 64 * 1024 * 1024 + 1])
    func unusableBodyLimitsAreRefused(_ limit: Int) async throws {
        let server = try await TestServer { $0.maximumBodyBytes = limit }
        defer { server.cleanUp() }
        await #expect(throws: ServerConfigurationError.self) {
            _ = try await buildApplication(configuration: server.configuration, store: server.store)
        }
        for bound in [ServerConfiguration.maximumBodyBytesRange.lowerBound, ServerConfiguration.maximumBodyBytesRange.upperBound] {
            var configuration = server.configuration
            configuration.maximumBodyBytes = bound
            configuration.logger.logLevel = .critical  // built, never run: its checks are cancelled
            _ = try await buildApplication(configuration: configuration, store: server.store)
        }
    }

    @Test("A member named twice is refused with its path in `field`, on both endpoints that read JSON")
    func duplicateMembers() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let signing = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"p","offerID":"o","formats":["legacy"],"offerID":"other"}"#, bearer: secret)
            expectProblem(signing, .badRequest, "duplicate_field")
            #expect(signing.json["field"] as? String == "offerID")
            #expect((signing.json["detail"] as? String)?.contains("offerID") == true)
            let nested = try await client.postJSON(
                "/v1/offers/signatures", #"{"productID":"p","offerID":"o","evidence":{"signedTransactions":[],"signedTransactions":[]}}"#, bearer: secret)
            expectProblem(nested, .badRequest, "duplicate_field")
            #expect(nested.json["field"] as? String == "evidence.signedTransactions")
            // The eligibility endpoint reads its body the same way (it refuses the duplicate
            // before it would report that no offers are configured).
            let eligibility = try await client.postJSON("/v1/offers/eligibility", #"{"evidence":{},"evidence":{}}"#, bearer: secret)
            expectProblem(eligibility, .badRequest, "duplicate_field")
            #expect(eligibility.json["field"] as? String == "evidence")
        }
        #expect(try server.issuedCount() == 0)
    }

    @Test("Unknown routes are 404 and wrong methods 405, as problem documents")
    func routing() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            expectProblem(try await client.execute(uri: "/v2/nothing", method: .get), .notFound, "not_found")
            let wrongMethod = try await client.execute(uri: "/v1/offers/signatures", method: .get)
            expectProblem(wrongMethod, .methodNotAllowed, "method_not_allowed")
            #expect(wrongMethod.headers[.allow] == "POST")
            expectProblem(try await client.execute(uri: "/healthz", method: .delete), .methodNotAllowed, "method_not_allowed")
        }
    }

    @Test("With several apps, bundleID is required; a client limited to one app cannot sign for another")
    func severalApps() async throws {
        let server = try await TestServer(bundles: ["com.example.one", "com.example.two"])
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "one-only", bundleIDs: ["com.example.one"])
        try await server.live { client in
            expectProblem(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret), .badRequest, "bundle_required")
            expectProblem(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","bundleID":"com.example.two"}"#, bearer: secret), .forbidden, "bundle_not_allowed")
            let response = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","bundleID":"com.example.one"}"#, bearer: secret)
            #expect(response.status == .created)
            #expect((response.json["legacy"] as? [String: Any])?["keyID"] as? String == server.keys["com.example.one"]?.keyID)
        }
        #expect(try server.issuedCount() == 1)
    }

    @Test("Rate limits per client and per appAccountToken answer 429 with Retry-After")
    func rateLimits() async throws {
        let server = try await TestServer { configuration in
            configuration.clientRateLimit = RateLimit(perSecond: 0.01, burst: 5)
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 0.01, burst: 2)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            let body = #"{"productID":"p","offerID":"o","appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#
            #expect(try await client.postJSON("/v1/offers/signatures", body, bearer: secret).status == .created)
            #expect(try await client.postJSON("/v1/offers/signatures", body, bearer: secret).status == .created)
            let limited = try await client.postJSON("/v1/offers/signatures", body, bearer: secret)
            expectProblem(limited, .tooManyRequests, "rate_limited")
            #expect(Int(limited.headers[.retryAfter] ?? "") ?? 0 >= 1)
            // Another token still works until the client's own bucket is empty.
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            let clientLimited = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret)
            expectProblem(clientLimited, .tooManyRequests, "rate_limited")
            #expect(clientLimited.headers[.retryAfter] != nil)
        }
        #expect(try server.issuedCount() == 4)
    }

    @Test("An audit write failure gives 503 and no signature")
    func auditFailure() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret).status == .created)
            // The store refuses writes to the audit log from now on (as a full or failing disk would).
            try server.execute("CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log BEGIN SELECT RAISE(ABORT, 'simulated write failure'); END;")
            let response = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","formats":["legacy","jws"]}"#, bearer: secret)
            expectProblem(response, .serviceUnavailable, "audit_unavailable")
            #expect(!response.text.contains("signature\":"))
            #expect(!response.text.contains("compactJWS"))
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            #expect(metrics.text.contains("audit_commit_failures_total"))
        }
        #expect(try server.issuedCount() == 1)
    }

    @Test("A key activated in the store signs within a second, without restart or failed requests")
    func rotation() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        let newKey = try InAppPurchaseKey.generateForDevelopment(keyID: "ROTATED001")
        _ = try await KeyRegistry.importKey(newKey, bundleID: "com.example.app", issuerID: TestServer.issuerID, development: true, into: server.store, masterKey: server.masterKey, actor: "test", reason: "rotation")
        try await server.live { client in
            let before = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: secret)
            #expect((before.json["legacy"] as? [String: Any])?["keyID"] as? String == "TESTKEY000")
            _ = try await server.store.transitionKey(keyID: "ROTATED001", to: .active, actor: "test", reason: "rotation", force: false, authenticator: server.masterKey.registryRows)
            try await server.waitForRegistry(client)
            let after = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: server.keys.isEmpty ? "" : secret)
            #expect(after.status == .created)
            #expect((after.json["legacy"] as? [String: Any])?["keyID"] as? String == "ROTATED001")
        }
    }
}

@Suite("Health, readiness, metrics and the OpenAPI document")
struct OperationalEndpointTests {
    @Test("healthz, readyz and metrics answer; readyz fails without a usable key")
    func operational() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            let health = try await client.execute(uri: "/healthz", method: .get)
            #expect(health.status == .ok)
            #expect(health.json["status"] as? String == "ok")
            let ready = try await client.execute(uri: "/readyz", method: .get)
            #expect(ready.status == .ok, "\(ready.text)")
            _ = try await client.execute(uri: "/nowhere", method: .get)
            let metrics = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            #expect(metrics.status == .ok)
            #expect(metrics.text.contains("http_requests_total"))
            #expect(metrics.text.contains("http_request_duration_seconds"))
            #expect(metrics.text.contains(#"offer_signer_rejections_total{reason="not_found"} 1"#))
            // Retire the only key: not ready any more.
            _ = try await server.store.transitionKey(keyID: "TESTKEY000", to: .retired, actor: "test", reason: nil, force: true, authenticator: server.masterKey.registryRows)
            try await server.waitForRegistry(client, orNotReady: true)
            expectProblem(try await client.execute(uri: "/readyz", method: .get), .serviceUnavailable, "not_ready")
        }
    }

    @Test("The OpenAPI document names exactly the routes the server has")
    func openAPIMatchesRoutes() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let served = try await server.live { client in try await client.execute(uri: "/openapi.yaml", method: .get).text }
        #expect(served == OpenAPIDocument.yaml)
        // Paths are two-space indented keys under `paths:`; methods four-space keys under them.
        var documented: Set<String> = []
        var currentPath: String?
        var inPaths = false
        for line in OpenAPIDocument.yaml.split(separator: "\n") {
            if line == "paths:" { inPaths = true; continue }
            if inPaths && !line.hasPrefix(" ") { inPaths = false }
            guard inPaths else { continue }
            if line.hasPrefix("  /") { currentPath = String(line.dropFirst(2).dropLast()) }
            if line.hasPrefix("    ") && !line.hasPrefix("     "), let path = currentPath {
                let method = line.trimmingCharacters(in: .whitespaces).dropLast()
                if ["get", "post", "put", "delete", "patch"].contains(String(method)) { documented.insert("\(method.uppercased()) \(path)") }
            }
        }
        let routes = Set(OfferSignerRoutes.all.map { "\($0.method.rawValue) \($0.path)" })
        #expect(documented == routes)
    }
}
