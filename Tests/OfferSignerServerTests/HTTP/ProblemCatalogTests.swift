import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import OfferSignerCore
import OfferSignerEligibility
@testable import OfferSignerServer
import Testing
import TestChildProcess

/// The problem codes: one table in the code (``ProblemCatalog``), the codes the sources throw,
/// `GET /problems/<code>`, and `Docs/Errors.md` must all say the same.
@Suite struct ProblemCatalogTests {
    static let packageRoot = URL(fileURLWithPath: PythonTestEnvironment.packageRoot)

    static func read(_ relativePath: String) throws -> String {
        try String(contentsOf: packageRoot.appendingPathComponent(relativePath), encoding: .utf8)
    }

    static func matches(_ pattern: String, in text: String) throws -> [[String]] {
        let regex = try NSRegularExpression(pattern: pattern)
        return regex.matches(in: text, range: NSRange(text.startIndex..., in: text)).map { match in
            (1..<match.numberOfRanges).map { index in Range(match.range(at: index), in: text).map { String(text[$0]) } ?? "" }
        }
    }

    /// Every `code` the server's sources name, with the status it is thrown with.
    static func thrownCodes() throws -> [(code: String, status: HTTPResponse.Status, file: String)] {
        let folder = packageRoot.appendingPathComponent("Sources/OfferSignerServer")
        var found: [(String, HTTPResponse.Status, String)] = []
        let statuses: [String: HTTPResponse.Status] = [
            "badRequest": .badRequest, "unauthorized": .unauthorized, "forbidden": .forbidden, "notFound": .notFound,
            "methodNotAllowed": .methodNotAllowed, "conflict": .conflict, "contentTooLarge": .contentTooLarge, "unsupportedMediaType": .unsupportedMediaType,
            "unprocessableContent": .unprocessableContent, "tooManyRequests": .tooManyRequests,
            "internalServerError": .internalServerError, "serviceUnavailable": .serviceUnavailable,
        ]
        // The sources are in folders by feature: every Swift file below the target's folder.
        let enumerator = try #require(FileManager.default.enumerator(atPath: folder.path))
        let names = enumerator.compactMap { $0 as? String }.filter { $0.hasSuffix(".swift") && !$0.hasSuffix("ProblemCatalog.swift") }.sorted()
        #expect(names.count > 20, "the server's sources were not found under \(folder.path)")
        for name in names {
            let text = try String(contentsOf: folder.appendingPathComponent(name), encoding: .utf8)
            // `APIProblem(.status, code: "x"` (possibly across a line break) and `.badRequest("x"`.
            for groups in try matches(#"APIProblem\(\s*\.([A-Za-z]+),\s*code:\s*"([a-z_]+)""#, in: text) {
                let status = try #require(statuses[groups[0]], "\(name): status .\(groups[0]) is not in this test's table")
                found.append((groups[1], status, name))
            }
            for groups in try matches(#"APIProblem\.badRequest\(\s*"([a-z_]+)""#, in: text) { found.append((groups[0], .badRequest, name)) }
        }
        return found
    }

    @Test("Every code the server's sources throw is in the catalog, with the status it is thrown with")
    func thrownCodesAreCatalogued() throws {
        let thrown = try Self.thrownCodes()
        #expect(thrown.count > 30, "the source scan found too little: \(thrown.map(\.code))")
        for (code, status, file) in thrown {
            let entry = ProblemCatalog.type(for: code)
            #expect(entry != nil, "\(file) throws '\(code)', which ProblemCatalog does not list")
            #expect(entry == nil || entry?.status == status, "\(file) throws '\(code)' with \(status.code), the catalog says \(entry?.status.code ?? 0)")
        }
        // And the catalog lists nothing the service cannot send.
        let sent = Set(thrown.map(\.code)).union(APIProblem.requestFieldCodes.map(\.rawValue))
        for entry in ProblemCatalog.all {
            #expect(sent.contains(entry.code), "ProblemCatalog lists '\(entry.code)', which no source throws")
        }
        #expect(Set(ProblemCatalog.all.map(\.code)).count == ProblemCatalog.all.count, "a code is listed twice")
        for entry in ProblemCatalog.all {
            #expect(entry.code.allSatisfy { $0.isLowercase || $0 == "_" }, "'\(entry.code)' is not snake_case")
            #expect(!entry.title.isEmpty && !entry.meaning.isEmpty && !entry.action.isEmpty)
        }
    }

    /// The rows of the Markdown table in Docs/Errors.md whose first cell is a code: code → row.
    static func documentedRows() throws -> [String: String] {
        var rows: [String: String] = [:]
        for line in try read("Docs/Errors.md").split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            guard let first = cells.first, first.hasPrefix("`"), first.hasSuffix("`") else { continue }
            rows[String(first.dropFirst().dropLast())] = String(line)
        }
        return rows
    }

    @Test("Docs/Errors.md has a row for every problem code, with its status, and for no other")
    func errorsDocumentListsEveryCode() throws {
        let rows = try Self.documentedRows()
        for entry in ProblemCatalog.all {
            let row = rows[entry.code]
            #expect(row != nil, "Docs/Errors.md has no row for '\(entry.code)'")
            #expect(row.map { $0.contains("| \(entry.status.code) |") } != false, "Docs/Errors.md gives '\(entry.code)' another status than \(entry.status.code): \(row ?? "")")
        }
    }

    @Test("Docs/Errors.md lists every eligibility reason, evidence failure and explain finding")
    func errorsDocumentListsTheOtherCodes() throws {
        let rows = try Self.documentedRows()
        for reason in EligibilityReason.allCases { #expect(rows[reason.rawValue] != nil, "Docs/Errors.md lacks eligibility reason '\(reason.rawValue)'") }
        for failure in EvidenceFailure.Code.allCases { #expect(rows[failure.rawValue] != nil, "Docs/Errors.md lacks evidence failure '\(failure.rawValue)'") }
        let diagnosis = try Self.read("Sources/OfferSignerCore/LegacySignatureDiagnosis.swift")
        let findings = try Self.matches(#"code: "([a-z_]+)""#, in: diagnosis).map { $0[0] }
            + Self.matches(#""(app_account_token_[a-z_]+)""#, in: diagnosis).map { $0[0] }
        #expect(findings.count >= 12)
        for finding in findings { #expect(rows[finding] != nil, "Docs/Errors.md lacks explain finding '\(finding)'") }
    }

    @Test("GET /problems/<code> describes each code; an unknown one is a 404 problem; POST is a 405")
    func problemTypesAreServed() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            for entry in ProblemCatalog.all {
                let response = try await client.execute(uri: entry.uri, method: .get)
                #expect(response.status == .ok)
                #expect(response.headers[.contentType] == "application/json")
                let json = response.json
                #expect(json["type"] as? String == "/problems/\(entry.code)")
                #expect(json["code"] as? String == entry.code)
                #expect(json["status"] as? Int == Int(entry.status.code))
                #expect(json["title"] as? String == entry.title)
                #expect(json["meaning"] as? String == entry.meaning)
                #expect(json["action"] as? String == entry.action)
            }
            let unknown = try await client.execute(uri: "/problems/no_such_code", method: .get)
            expectProblem(unknown, .notFound, "not_found")
            #expect((unknown.json["detail"] as? String)?.contains("no_such_code") == true)
            let post = try await client.execute(uri: "/problems/not_found", method: .post)
            expectProblem(post, .methodNotAllowed, "method_not_allowed")
            #expect(post.headers[.allow] == "GET")
            expectProblem(try await client.execute(uri: "/problems/", method: .get), .notFound, "not_found")
        }
    }

    @Test("A problem's type resolves, against the service, to its description")
    func problemTypeResolves() async throws {
        let server = try await TestServer { $0.developmentMode = true }
        defer { server.cleanUp() }
        try await server.live { client in
            let refused = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","appAcountToken":"x"}"#)
            expectProblem(refused, .badRequest, "unknown_field")
            let type = try #require(refused.json["type"] as? String)
            let resolved = try #require(URL(string: type, relativeTo: URL(string: "http://127.0.0.1:8080/v1/offers/signatures")))
            #expect(resolved.absoluteString == "http://127.0.0.1:8080/problems/unknown_field")
            let described = try await client.execute(uri: resolved.path, method: .get)
            #expect(described.json["code"] as? String == "unknown_field")
            #expect(described.json["title"] as? String == refused.json["title"] as? String)
        }
    }

    @Test("Route patterns: {code} matches one non-empty segment")
    func routeMethods() {
        #expect(OfferSignerRoutes.methods(allowedOn: "/problems/x") == ["GET"])
        #expect(OfferSignerRoutes.methods(allowedOn: "/problems/") == [])
        #expect(OfferSignerRoutes.methods(allowedOn: "/problems/a/b") == [])
        #expect(OfferSignerRoutes.methods(allowedOn: "/v1/offers/signatures") == ["POST"])
    }
}
