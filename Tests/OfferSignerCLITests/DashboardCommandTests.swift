import Foundation
#if canImport(FoundationXML)
import FoundationXML
#endif
import Testing

/// `offer-signer offers report --html FILE` and the record `audit verify` leaves for the
/// dashboard, on a real store file.
@Suite struct DashboardCommandTests {
    @Test("offers report --html writes the Offers page as one well-formed, self-contained file; bad combinations are refused")
    func reportFile() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("HTMLKEY001", file: try fixture.key("HTMLKEY001")) + ["--development"]), "keys import")
            let file = directory.appendingPathComponent("offers.html")
            try expectSuccess(try await run(["offers", "report", "--store", fixture.store.path, "--html", file.path, "--days", "90"]), "report --html")
            let text = try String(contentsOf: file, encoding: .utf8)
            let parser = XMLParser(data: Data(text.utf8))
            #expect(parser.parse(), "well-formed: \(parser.parserError.map { "\($0)" } ?? "")")
            #expect(text.contains(#"<main data-page="offers">"#))
            #expect(text.contains(#"<p class="empty">"#), "an empty store: the empty state")
            #expect(text.contains(#"http-equiv="Content-Security-Policy""#) && text.contains("default-src &#39;none&#39;"))
            #expect(!text.contains("<script") && !text.contains(" src="))
            expectCleanFailure(try await run(["offers", "report", "--store", fixture.store.path, "--html", file.path, "--days", "7"]), mentions: ["--days", "30, 90"])
            expectCleanFailure(try await run(["offers", "report", "--store", fixture.store.path, "--html", file.path, "--json"]), mentions: ["--html", "--json"])
            expectCleanFailure(try await run(["offers", "report", "--store", fixture.store.path, "--days", "30"]), mentions: ["--days is for --html"])
        }
    }

    @Test("audit verify records its intact run in the store (for the dashboard's keys page)")
    func verifyIsRecorded() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("VERIFYKEY1", file: try fixture.key("VERIFYKEY1")) + ["--development"]), "keys import")
            #expect(try await sqlite(fixture.store, "SELECT COUNT(*) FROM meta WHERE name = 'last_audit_verification'").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
            try expectSuccess(try await run(["audit", "verify", "--store", fixture.store.path]), "audit verify")
            let value = try await sqlite(fixture.store, "SELECT value FROM meta WHERE name = 'last_audit_verification'").trimmingCharacters(in: .whitespacesAndNewlines)
            let parts = value.split(separator: "|")
            #expect(parts.count == 4 && parts[1] == "1" && parts[2] == "1", "one record (key.imported) checked: \(value)")
        }
    }

    @Test("serve --admin-token-file refuses a short token, a file others can read, and the operator token's secret, before it serves")
    func adminTokenFileRefusals() async throws {
        try await withTemporaryDirectory { directory in
            let fixture = try StoreFixture(in: directory)
            try expectSuccess(try await run(fixture.importArguments("SERVEKEY01", file: try fixture.key("SERVEKEY01")) + ["--development"]), "keys import")
            let serve = ["serve", "--store", fixture.store.path, "--master-key-file", fixture.masterKey.path, "--port", "0"]
            let short = directory.appendingPathComponent("short-token")
            try writeFile("too-short\n", to: short)
            expectCleanFailure(try await run(serve + ["--admin-token-file", short.path]), mentions: ["--admin-token-file", "at least 32 characters"])
            let secret = String(repeating: "s", count: 40)
            let open = directory.appendingPathComponent("open-token")
            try writeFile(secret, to: open, mode: 0o644)
            expectCleanFailure(try await run(serve + ["--admin-token-file", open.path]), mentions: ["by group or others", "chmod 600"])
            let admin = directory.appendingPathComponent("admin-token")
            let operatorFile = directory.appendingPathComponent("operator-token")
            try writeFile(secret, to: admin)
            try writeFile(secret + "\n", to: operatorFile)
            expectCleanFailure(
                try await run(serve + ["--admin-token-file", admin.path, "--operator-token-file", operatorFile.path]), mentions: ["must not be the operator token"])
        }
    }
}
