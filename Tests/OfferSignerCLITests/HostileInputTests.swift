import Foundation
import Testing

/// Inputs an attacker or a broken integration could produce: the CLI must answer with a
/// message and a non-zero exit, never a trap.
@Suite("hostile input: never a crash")
struct HostileInputTests {
    /// A legacy object printed by `sign`, with its timestamp replaced.
    private func document(keyFile: URL, timestamp: String) async throws -> String {
        let signed = try await run(legacySignArguments(keyFile: keyFile))
        try expectSuccess(signed)
        let text = signed.stdout.replacingOccurrences(of: #""timestamp":[0-9]+"#, with: "\"timestamp\":\(timestamp)", options: .regularExpression)
        #expect(text.contains("\"timestamp\":\(timestamp),"))
        return text
    }

    @Test("verify and explain with extreme timestamps", arguments: ["0", "1", "999999999", "1000000000", "-1", "4102444800000", "9223372036854775807", "-9223372036854"])
    func extremeTimestamps(timestamp: String) async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let text = try await document(keyFile: keyFile, timestamp: timestamp)
            let verified = try await run(["verify", "--key-file", keyFile.path], stdin: Data(text.utf8))
            expectCleanFailure(verified, exitCode: 1, mentions: ["timestamp"])
            let explained = try await run(["explain", "--key-file", keyFile.path], stdin: Data(text.utf8))
            expectCleanFailure(explained, exitCode: 1)
        }
    }

    // BUG: LegacySignatureDiagnosis.payloadMutations computes `document.timestamp * 1000`
    // for any timestamp below 10^12, which overflows (a trap, SIGILL) for timestamps below
    // Int64.min / 1000. `explain` then crashes instead of answering.
    @Test("explain with a large negative timestamp answers instead of trapping on overflow")
    func explainNegativeTimestampOverflow() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let text = try await document(keyFile: keyFile, timestamp: "-9000000000000000000")
            let explained = try await run(["explain", "--key-file", keyFile.path], stdin: Data(text.utf8))
            expectCleanFailure(explained, exitCode: 1)
        }
    }

    @Test("a timestamp beyond Int64 is unreadable input (exit 2), not a crash")
    func timestampBeyondInt64() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let text = try await document(keyFile: keyFile, timestamp: "9223372036854775808")
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(text.utf8)), exitCode: 2)
            expectCleanFailure(try await run(["explain", "--key-file", keyFile.path], stdin: Data(text.utf8)), exitCode: 2)
        }
    }

    @Test("verify: malformed compact JWS values exit 1 with a reason", arguments: [
        "", "a.b", "a.b.c.d", "!!!.???.***", "eyJhbGciOiJub25lIn0.e30.", "eyJhbGciOiJFUzI1NiIsImtpZCI6IksifQ.e30.AAAA",
    ])
    func malformedJWS(compact: String) async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let object = #"{"format":"jws","bundleID":"b","productID":"p","offerID":"o","keyID":"K","transactionID":null,"compactJWS":"\#(compact)"}"#
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(object.utf8)), exitCode: 1, mentions: ["invalid"])
        }
    }

    @Test("verify: deeply nested or huge JSON is refused cleanly")
    func pathologicalJSON() async throws {
        try await withTemporaryDirectory { directory in
            let keyFile = try await generateKey(in: directory)
            let nested = String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(nested.utf8)), exitCode: 2)
            let huge = #"{"format":"legacy","bundleID":""# + String(repeating: "x", count: 2_000_000) + #""}"#
            expectCleanFailure(try await run(["verify", "--key-file", keyFile.path], stdin: Data(huge.utf8)), exitCode: 2)
        }
    }

    // BUG: SQLiteStore.record(from:) / key(from:) read columns with GRDB's non-throwing
    // `row[...]` subscript, which traps ("could not decode Optional<Int64> from database
    // value") when a value has the wrong type. `audit tail`, `audit export` and `keys list`
    // then crash on a store whose rows were tampered with — exactly when an operator needs
    // them. (`audit verify` reads through a cursor and reports the break cleanly.)
    @Test("a store with tampered column types: audit verify names the record, and no command crashes")
    func tamperedColumnTypes() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("K1", file: try fixture.key("K1"))))
            try expectSuccess(try await run(["clients", "create", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path, "--name", "backend"]))
            try expectSuccess(try await run(["clients", "create", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path, "--name", "worker"]))
            try await sqlite(fixture.store, "UPDATE audit_log SET recorded_at = 'yesterday' WHERE seq = 2")
            try await sqlite(fixture.store, "UPDATE signing_keys SET imported_at = 'long ago' WHERE key_id = 'K1'")

            let verified = try await run(["audit", "verify", "--store", fixture.store.path])
            expectCleanFailure(verified, exitCode: 1, mentions: ["record 2"])
            for arguments in [["audit", "tail"], ["audit", "tail", "--json"], ["audit", "export"], ["keys", "list"], ["keys", "list", "--json"]] {
                let result = try await run(arguments + ["--store", fixture.store.path])
                #expect(result.status >= 0, "`\(arguments.joined(separator: " "))` was killed by signal \(-result.status): \(result.stderr.prefix(300))")
            }
        }
    }
}
