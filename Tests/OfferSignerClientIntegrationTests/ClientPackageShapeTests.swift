import Foundation
#if canImport(Glibc)
import Glibc
#endif
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
        let output = scratch.appendingPathExtension("json")
        let errors = scratch.appendingPathExtension("err")
        _ = FileManager.default.createFile(atPath: output.path, contents: nil)
        _ = FileManager.default.createFile(atPath: errors.path, contents: nil)
        defer {
            try? FileManager.default.removeItem(at: scratch)
            try? FileManager.default.removeItem(at: output)
            try? FileManager.default.removeItem(at: errors)
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["swift", "package", "--scratch-path", scratch.path, "describe", "--type", "json"]
        process.currentDirectoryURL = packageRoot
        process.standardOutput = try FileHandle(forWritingTo: output)
        process.standardError = try FileHandle(forWritingTo: errors)
        process.standardInput = FileHandle.nullDevice
        try withProcessLaunchLock { try process.run() }
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
        process.waitUntilExit()
        let stderr = String(decoding: (try? Data(contentsOf: errors)) ?? Data(), as: UTF8.self)
        try #require(process.terminationStatus == 0, "swift package describe failed: \(stderr)")
        let json = try JSONSerialization.jsonObject(with: Data(contentsOf: output))
        return try #require(json as? [String: Any], "describe printed no JSON object: \(stderr)")
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

/// Foundation's `Process.run()` on Linux is not safe while another thread of this test process
/// launches a child (a full run crashed inside it). Every test module launches through this
/// process-wide lock: an `flock` on one file, opened close-on-exec so no child inherits it.
func withProcessLaunchLock<Result>(_ body: () throws -> Result) rethrows -> Result {
    let descriptor = open("/tmp/offer-signer-tests-process-launch.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0o600)
    if descriptor >= 0 { flock(descriptor, LOCK_EX) }
    defer {
        if descriptor >= 0 {
            flock(descriptor, LOCK_UN)
            close(descriptor)
        }
    }
    return try body()
}
