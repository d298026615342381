import Foundation
#if canImport(Glibc)
import Glibc
#endif
import TestChildProcess
import Testing

/// What apps ship depends on nothing but Foundation: checked on the package as SwiftPM sees it
/// (`swift package describe`) and on the client's own imports.
@Suite("The OfferSignerClient target depends on nothing outside Foundation")
struct ClientPackageShapeTests {
    /// The package root: three levels up from this file (Tests/<target>/<file>).
    static let packageRoot = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    static var swiftIsAvailable: Bool {
        (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").contains { directory in
            FileManager.default.isExecutableFile(atPath: "\(directory)/swift")
        }
    }

    /// Runs `swift package describe --type json` on the package.
    ///
    /// With a scratch path of its own: `swift test` holds the lock on `.build` while the tests
    /// run, so `describe` on the default scratch path would wait for this very process forever.
    /// `describe` reads the manifest only (no dependency resolution), so a fresh scratch
    /// directory costs nothing.
    static func describe() async throws -> [String: Any] {
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-describe-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: scratch) }
        let process = try ChildProcess.spawn(
            "/usr/bin/env", ["swift", "package", "--scratch-path", scratch.path, "describe", "--type", "json"], currentDirectory: packageRoot.path)
        // Never hang the test run: give up after two minutes.
        let deadline = Date().addingTimeInterval(120)
        while process.isRunning {
            if Date() > deadline {
                process.terminate()
                Issue.record("swift package describe did not finish within 120 s")
                break
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        let result = process.waitForExit()
        try #require(result.status == 0, "swift package describe failed: \(result.stderrText)")
        let json = try JSONSerialization.jsonObject(with: result.stdout)
        return try #require(json as? [String: Any], "describe printed no JSON object: \(result.stderrText)")
    }

    @Test(
        "swift package describe: the OfferSignerClient target has no target or product dependencies",
        .enabled(if: swiftIsAvailable, "needs the swift driver on PATH"),
        .timeLimit(.minutes(3))
    )
    func describedDependencies() async throws {
        let package = try await Self.describe()
        let targets = try #require(package["targets"] as? [[String: Any]])
        let client = try #require(targets.first { $0["name"] as? String == "OfferSignerClient" })
        #expect(client["type"] as? String == "library")
        #expect((client["target_dependencies"] as? [String] ?? []).isEmpty, "\(client)")
        #expect((client["product_dependencies"] as? [String] ?? []).isEmpty, "\(client)")
        #expect(client.keys.filter { $0.hasSuffix("dependencies") }.allSatisfy { ((client[$0] as? [Any]) ?? []).isEmpty }, "\(client)")
        // The product apps add is that target alone.
        let products = try #require(package["products"] as? [[String: Any]])
        let product = try #require(products.first { $0["name"] as? String == "OfferSignerClient" })
        #expect(product["targets"] as? [String] == ["OfferSignerClient"])
        // Sanity: describe does report dependencies where there are some.
        let server = try #require(targets.first { $0["name"] as? String == "OfferSignerServer" })
        #expect((server["product_dependencies"] as? [String])?.contains("Hummingbird") == true)
    }

    @Test("The client's sources import Foundation (and FoundationNetworking, StoreKit where they exist) only")
    func sourceImports() throws {
        let directory = Self.packageRoot.appendingPathComponent("Sources/OfferSignerClient")
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".swift") }
        #expect(!files.isEmpty)
        // StoreKitShim appears only under OFFER_SIGNER_CLIENT_STOREKIT_TESTS (the Linux test
        // build); OfferSignerClient is the module itself as seen from that test build.
        let allowed: Set<String> = ["Foundation", "FoundationNetworking", "StoreKit", "StoreKitShim", "OfferSignerClient"]
        for file in files {
            let text = try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
            for line in text.split(separator: "\n") {
                let trimmed = line.trimmingCharacters(in: .whitespaces)
                guard trimmed.hasPrefix("import ") || trimmed.hasPrefix("@_exported import ") || trimmed.hasPrefix("@testable import ") else { continue }
                let words = trimmed.split(separator: " ")
                let module = String(words.last ?? "").split(separator: ".").first.map(String.init) ?? ""
                #expect(allowed.contains(module), "\(file): \(trimmed)")
            }
        }
    }
}
