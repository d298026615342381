import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif
import TestChildProcess
import TestPostgres
import Testing

/// The CLI against a PostgreSQL URL: errors that never show the password, URL mistakes named,
/// and a schema newer than the binary refused.
extension StoreCommandTests {
    /// Nested in ``StoreCommandTests`` so it runs serialized with it (see there).
    @Suite("store commands on PostgreSQL: passwords, URLs and schema versions", .enabled(if: TestPostgres.isEnabled, "no PostgreSQL: apt-get install -y postgresql, or set OFFER_SIGNER_TEST_POSTGRES_URL"))
    struct PostgresCommandTests {
        @Test("A wrong password fails cleanly, and the password appears nowhere in the output")
        func wrongPasswordIsNeverEchoed() async throws {
            try await TestPostgres.withDatabase { database in
                let wrong = "wrong-\(UUID().uuidString)"
                for arguments in [["keys", "list"], ["clients", "list"], ["audit", "verify"], ["audit", "export"]] {
                    let result = try await run(arguments + ["--store", database.url(password: wrong)])
                    expectCleanFailure(result, mentions: ["password authentication failed"])
                    #expect(!(result.stdout + result.stderr).contains(wrong), "\(arguments): the password was echoed: \(result.stderr)")
                    #expect((result.stdout + result.stderr).contains("***"), "the URL is shown redacted: \(result.stderr)")
                }
                // The right password from PGPASSWORD or a password file instead of the URL.
                let password = try #require(database.password)
                let viaEnvironment = try await run(["clients", "list", "--store", database.urlWithoutPassword], environment: ["PGPASSWORD": password])
                try expectSuccess(viaEnvironment, "clients list with PGPASSWORD")
                try await withTemporaryDirectory { directory in
                    let file = directory.appendingPathComponent("pgpassword")
                    try writeFile(password + "\n", to: file, mode: 0o600)
                    try expectSuccess(try await run(["keys", "list", "--store", database.urlWithoutPassword, "--store-password-file", file.path]), "keys list with a password file")
                    try expectSuccess(try await run(["keys", "list"], environment: ["OFFER_SIGNER_STORE": database.urlWithoutPassword, "OFFER_SIGNER_STORE_PASSWORD_FILE": file.path]))
                    try writeFile(password, to: file, mode: 0o644)
                    let loose = try await run(["keys", "list", "--store", database.urlWithoutPassword, "--store-password-file", file.path])
                    expectCleanFailure(loose, mentions: ["chmod 600"])
                    #expect(!(loose.stdout + loose.stderr).contains(password))
                }
            }
        }

        @Test("Malformed URLs, unknown sslmodes and bad pool sizes are named without echoing the password")
        func urlMistakes() async throws {
            let secret = "hunter2-\(UUID().uuidString.prefix(8))"
            let cases: [(url: String, extra: [String], mentions: [String])] = [
                ("postgres://user:\(secret)@localhost:5432/db?sslmode=sometimes", [], ["sslmode", "sometimes"]),
                ("postgres://user:\(secret)@localhost:99999/db", [], ["port"]),
                ("postgres://user:\(secret)@localhost:5432", [], ["database"]),
                ("postgres://:\(secret)@localhost/db", [], ["user"]),
                ("postgresql://user:\(secret)@localhost/db?application=x", [], ["application"]),
                ("postgres://user:\(secret)@localhost/db", ["--store-pool-size", "0"], ["pool size"]),
                // Not a PostgreSQL URL, so not taken as one, nor as a file name shown whole.
                ("postgresql+psycopg://user:\(secret)@localhost/db", [], ["'postgresql+psycopg://…'", "neither a SQLite file path"]),
                ("jdbc:postgresql://user:\(secret)@localhost/db", [], ["'jdbc:postgresql://…'"]),
            ]
            for (url, extra, mentions) in cases {
                let result = try await run(["keys", "list", "--store", url] + extra)
                expectCleanFailure(result, mentions: mentions)
                #expect(!(result.stdout + result.stderr).contains(secret), "\(url): \(result.stderr)")
            }
        }

        @Test("A database whose schema is newer than this binary is refused with a clear message")
        func newerSchemaIsRefused() async throws {
            try await TestPostgres.withDatabase { database in
                try expectSuccess(try await run(["clients", "list", "--store", database.url]))
                try await TestPostgres.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 0)", database: database.name)
                let refused = try await run(["clients", "list", "--store", database.url])
                expectCleanFailure(refused, mentions: ["database schema version 999 is newer than this offer-signer knows", "upgrade offer-signer"])
            }
        }

        @Test("store copy through the binary: SQLite → PostgreSQL → SQLite keeps keys, clients, the chain and checkpoints; a non-empty target is refused")
        func storeCopyRoundTrip() async throws {
            try await withStoreFixture(.sqlite) { fixture in
                try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
                try expectSuccess(try await run(fixture.importArguments("K2", file: try fixture.key("K2"))))
                try expectSuccess(try await fixture.transition("activate", "K2"))
                try expectSuccess(try await run(["clients", "create", "--store", fixture.storeArgument, "--master-key-file", fixture.masterKey.path, "--name", "backend"]))
                try expectSuccess(try await run(["audit", "checkpoints", "create", "--store", fixture.storeArgument, "--master-key-file", fixture.masterKey.path]))
                try expectSuccess(try await run(["clients", "revoke", "--store", fixture.storeArgument, "--master-key-file", fixture.masterKey.path, "--name", "backend"]))
                func everything(_ store: String) async throws -> [String] {
                    var outputs: [String] = []
                    for arguments in [["keys", "list", "--json"], ["clients", "list", "--json"], ["audit", "export"], ["audit", "checkpoints", "export"]] {
                        let result = try await run(arguments + ["--store", store])
                        try expectSuccess(result, arguments.joined(separator: " "))
                        outputs.append(result.stdout)
                    }
                    return outputs
                }
                let before = try await everything(fixture.storeArgument)

                try await TestPostgres.withDatabase { database in
                    let there = try await run(["store", "copy", "--from", fixture.storeArgument, "--to", database.url])
                    try expectSuccess(there, "store copy to PostgreSQL")
                    let heads = there.stdout.split(separator: "\n").filter { $0.hasPrefix("source head:") || $0.hasPrefix("target head:") }
                    #expect(heads.count == 2 && heads[0].dropFirst("source head:".count) == heads[1].dropFirst("target head:".count), "\(there.stdout)")
                    #expect(heads.first?.contains(" 5 ") == true, "\(there.stdout)")
                    #expect(!(there.stdout + there.stderr).contains(database.password ?? "\u{0}"), "the password was echoed")
                    #expect(try await everything(database.url) == before)
                    let verified = try await run(["audit", "verify", "--store", database.url])
                    try expectSuccess(verified)
                    #expect(verified.stdout.contains("intact: 5 records") && verified.stdout.contains("1 signed checkpoint(s) matched"), "\(verified.stdout)")

                    let again = try await run(["store", "copy", "--from", fixture.storeArgument, "--to", database.url])
                    expectCleanFailure(again, mentions: ["not empty"])
                    #expect(try await everything(database.url) == before, "a refused copy changes nothing")

                    let back = fixture.directory.appendingPathComponent("back.sqlite").path
                    try expectSuccess(try await run(["store", "copy", "--from", database.url, "--to", back]), "store copy back to SQLite")
                    #expect(try await everything(back) == before)
                    expectCleanFailure(try await run(["store", "copy", "--from", database.url, "--to", back]), mentions: ["exists"])
                }
            }
        }

        @Test("serve on a PostgreSQL URL: ready, signs with the audit record in the database, and leaves a final checkpoint on SIGTERM")
        func serveOnPostgres() async throws {
            try await withStoreFixture(.postgres) { fixture in
                try expectSuccess(try await run(fixture.importArguments("SERVEPG001", file: try fixture.key("SERVEPG001")) + ["--development"]), "keys import")
                let created = try await run(["clients", "create", "--store", fixture.storeArgument, "--master-key-file", fixture.masterKey.path, "--name", "backend", "--json"])
                try expectSuccess(created)
                let secret = try #require(try jsonObject(created.stdout.trimmingCharacters(in: .newlines))["secret"] as? String)
                let port = try LoopbackPort.free()
                let server = try ChildProcess.spawn(
                    try CLIExecutable.url().path,
                    ["serve", "--store", fixture.storeArgument, "--store-pool-size", "4", "--master-key-file", fixture.masterKey.path, "--port", "\(port)"],
                    environment: childEnvironment([:]), captureOutput: true)
                var stopped = false
                defer { if !stopped { server.terminateInBackground() } }

                let base = "http://127.0.0.1:\(port)"
                var ready = false
                let deadline = Date().addingTimeInterval(60)
                while !ready, Date() < deadline, server.isRunning {
                    ready = (try? await Self.request("\(base)/readyz").status) == 200
                    if !ready { try await Task.sleep(for: .milliseconds(200)) }
                }
                try #require(ready, "serve did not become ready within 60 s")
                let signed = try await Self.request(
                    "\(base)/v1/offers/signatures", method: "POST", bearer: secret,
                    body: #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#)
                #expect(signed.status == 201, "\(signed.body)")
                let legacy = try #require(try jsonObject(signed.body)["legacy"] as? [String: Any])
                let nonce = try #require(legacy["nonce"] as? String)

                server.terminate()
                let ended = await server.exited(timeout: .seconds(60))
                stopped = true
                #expect(ended.status == 0, "serve exited \(ended.status): \(ended.stderrText.suffix(2000))")
                #expect(!ended.stderrText.contains(fixture.database?.password ?? "\u{0}"), "the password was logged")

                let export = try await run(["audit", "export", "--store", fixture.storeArgument])
                try expectSuccess(export)
                #expect(export.stdout.contains(nonce), "the signature's audit record is in the database")
                let verified = try await run(["audit", "verify", "--store", fixture.storeArgument])
                try expectSuccess(verified)
                #expect(verified.stdout.hasPrefix("intact: 3 records") && verified.stdout.contains("covering records 1…3"), "\(verified.stdout)")
            }
        }

        static func request(_ url: String, method: String = "GET", bearer: String? = nil, body: String? = nil) async throws -> (status: Int, body: String) {
            var request = URLRequest(url: try #require(URL(string: url)))
            request.httpMethod = method
            request.timeoutInterval = 30
            if let bearer { request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization") }
            if let body {
                request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                request.httpBody = Data(body.utf8)
            }
            let (data, response) = try await URLSession.shared.data(for: request)
            return ((response as? HTTPURLResponse)?.statusCode ?? 0, String(decoding: data, as: UTF8.self))
        }
    }
}
