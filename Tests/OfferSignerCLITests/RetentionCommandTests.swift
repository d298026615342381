import Foundation
import Testing

/// `offer-signer retention simulate` and `offer-signer offers report` on a real store file.
@Suite struct RetentionCommandTests {
    static var exampleCatalog: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("../../offers.example.json").standardizedFileURL.path
    }

    @Test("retention simulate: no history in the store, so the product's fallback, and why; signs nothing")
    func simulateWithoutHistory() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("RETAINKEY1", file: try fixture.key("RETAINKEY1")) + ["--development"]), "keys import")
            let arguments = [
                "retention", "simulate", "--store", fixture.store.path, "--offers", Self.exampleCatalog, "--original-transaction-id", "2000000001",
                "--product-id", "com.example.app.premium.monthly",
            ]
            let text = try await run(arguments)
            try expectSuccess(text, "simulate")
            #expect(text.stdout.contains("answer: alternateProduct"), "\(text.stdout)")
            #expect(text.stdout.contains("history: none"))
            #expect(text.stdout.contains("no offer: history_unavailable"))
            let json = try jsonObject(try await run(arguments + ["--json"]).stdout)
            #expect(json["answer"] as? String == "alternateProduct")
            let alternate = (json["body"] as? [String: Any])?["alternateProduct"] as? [String: Any]
            #expect(alternate?["messageIdentifier"] as? String == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e50", "the default message")
            let german = try jsonObject(try await run(arguments + ["--json", "--user-locale", "de-DE"]).stdout)
            #expect(((german["body"] as? [String: Any])?["alternateProduct"] as? [String: Any])?["messageIdentifier"] as? String == "8c1b9d2e-5f4a-4c3b-9e2d-1a0b7c6d5e51", "de-DE: the de message")
            #expect(try await sqlite(fixture.store, "SELECT COUNT(*) FROM issued_signatures").trimmingCharacters(in: .whitespacesAndNewlines) == "0")

            expectCleanFailure(try await run(arguments + ["--environment", "Xcode"]), mentions: ["Production or Sandbox"])
            expectCleanFailure(try await run(arguments + ["--ask-apple"]), mentions: ["master-key-file"])
        }
    }

    @Test("offers report: an empty store reports nothing; a bad --since is refused")
    func reportOnEmptyStore() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("REPORTKEY1", file: try fixture.key("REPORTKEY1")) + ["--development"]), "keys import")
            let text = try await run(["offers", "report", "--store", fixture.store.path])
            try expectSuccess(text, "report")
            #expect(text.stdout == "no offers issued or redeemed\n")
            #expect(try await run(["offers", "report", "--store", fixture.store.path, "--json"]).stdout == "[]\n")
            expectCleanFailure(try await run(["offers", "report", "--store", fixture.store.path, "--since", "yesterday"]), mentions: ["ISO 8601"])
        }
    }
}
