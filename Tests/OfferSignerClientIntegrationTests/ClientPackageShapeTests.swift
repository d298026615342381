import Foundation
import TestChildProcess
import Testing

/// What an app gets when it adds the client: the package in Client/ alone (no dependencies), with
/// StoreKit 2's floors. Checked the way SwiftPM sees it, on a throw-away app package that depends on
/// the client by path, and on the client's own imports.
@Suite("An app that adds OfferSignerClient resolves nothing else, with the client's floors")
struct ClientPackageShapeTests {
    static let packageRoot = URL(fileURLWithPath: PythonTestEnvironment.packageRoot)
    static let clientPackage = packageRoot.appendingPathComponent("Client")
    /// The toolchain the project builds with (CI and this machine), else `swift` on PATH.
    static let swift: String? = {
        if FileManager.default.isExecutableFile(atPath: "/opt/swift/usr/bin/swift") { return "/opt/swift/usr/bin/swift" }
        return (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":").map { "\($0)/swift" }
            .first { FileManager.default.isExecutableFile(atPath: $0) }
    }()

    /// The app's manifest: floors no higher than the client's, one product dependency on it.
    static func appManifest(clientPath: String) -> String {
        """
        // swift-tools-version:6.0
        import PackageDescription

        let package = Package(
            name: "ThrowAwayApp",
            platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
            dependencies: [.package(path: "\(clientPath)")],
            targets: [
                .target(name: "ThrowAwayApp", dependencies: [.product(name: "OfferSignerClient", package: "Client")]),
            ]
        )
        """
    }

    /// Runs `swift package <arguments>` in `directory` with its own scratch path (the tests'
    /// `.build` is locked by `swift test` itself) and no network: `--disable-automatic-resolution`
    /// is not used, since resolving is what is checked; a path-only graph needs no network.
    static func swiftPackage(_ arguments: [String], in directory: URL, scratch: URL) async throws -> ChildProcess.Result {
        let swift = try #require(swift)
        let command = ["package", "--scratch-path", scratch.path] + arguments
        return try await onOwnThread {
            try ChildProcess.run(swift, command, currentDirectory: directory.path, timeout: .seconds(240))
        }
    }

    @Test(
        "swift package resolve / show-dependencies / dump-package on a throw-away app: the client alone, no checkouts, floors iOS 15 macOS 12 tvOS 15 watchOS 8 visionOS 1",
        .enabled(if: swift != nil, "needs the swift driver"),
        .timeLimit(.minutes(10))
    )
    func throwAwayAppResolvesTheClientAlone() async throws {
        let work = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-app-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: work) }
        let app = work.appendingPathComponent("ThrowAwayApp")
        let scratch = work.appendingPathComponent("scratch")
        try FileManager.default.createDirectory(at: app.appendingPathComponent("Sources/ThrowAwayApp"), withIntermediateDirectories: true)
        try Self.appManifest(clientPath: Self.clientPackage.path).write(to: app.appendingPathComponent("Package.swift"), atomically: true, encoding: .utf8)
        try "import OfferSignerClient\n".write(to: app.appendingPathComponent("Sources/ThrowAwayApp/App.swift"), atomically: true, encoding: .utf8)

        // Resolve: succeeds, and fetches nothing (no repositories, no checkouts, no pins).
        let resolve = try await Self.swiftPackage(["resolve"], in: app, scratch: scratch)
        try #require(resolve.status == 0, "swift package resolve failed: \(resolve.stderrText)")
        for folder in ["checkouts", "repositories"] {
            let contents = (try? FileManager.default.contentsOfDirectory(atPath: scratch.appendingPathComponent(folder).path)) ?? []
            #expect(contents.isEmpty, "\(folder): \(contents)")
        }
        let resolved = app.appendingPathComponent("Package.resolved")
        if let data = FileManager.default.contents(atPath: resolved.path) {
            let pins = (try JSONSerialization.jsonObject(with: data) as? [String: Any])?["pins"] as? [Any] ?? []
            #expect(pins.isEmpty, "Package.resolved pins \(pins)")
        }

        // The graph as SwiftPM reports it: the app, the client under it, nothing under the client.
        let show = try await Self.swiftPackage(["show-dependencies", "--format", "json"], in: app, scratch: scratch)
        try #require(show.status == 0, "show-dependencies failed: \(show.stderrText)")
        let graph = try #require(try JSONSerialization.jsonObject(with: show.stdout) as? [String: Any], "\(show.stdoutText)")
        let dependencies = try #require(graph["dependencies"] as? [[String: Any]])
        #expect(dependencies.count == 1, "\(dependencies)")
        let client = try #require(dependencies.first)
        #expect((client["name"] as? String) == "OfferSignerClient", "\(client)")
        #expect((client["dependencies"] as? [Any] ?? []).isEmpty, "the client depends on \(client["dependencies"] ?? "")")

        // The client's own manifest: its floors, its one product, no dependencies.
        let dump = try await Self.swiftPackage(["dump-package"], in: Self.clientPackage, scratch: work.appendingPathComponent("client-scratch"))
        try #require(dump.status == 0, "dump-package failed: \(dump.stderrText)")
        let manifest = try #require(try JSONSerialization.jsonObject(with: dump.stdout) as? [String: Any])
        #expect((manifest["dependencies"] as? [Any] ?? []).isEmpty)
        let platforms = try #require(manifest["platforms"] as? [[String: Any]])
        let floors = Dictionary(uniqueKeysWithValues: platforms.compactMap { entry -> (String, String)? in
            guard let name = entry["platformName"] as? String, let version = entry["version"] as? String else { return nil }
            return (name, version)
        })
        #expect(floors == ["ios": "15.0", "macos": "12.0", "tvos": "15.0", "watchos": "8.0", "visionos": "1.0"], "\(floors)")
        let products = try #require(manifest["products"] as? [[String: Any]])
        #expect(products.compactMap { $0["name"] as? String } == ["OfferSignerClient"])
        #expect(products.first?["targets"] as? [String] == ["OfferSignerClient"])
        let targets = try #require(manifest["targets"] as? [[String: Any]])
        let library = try #require(targets.first { $0["name"] as? String == "OfferSignerClient" })
        #expect((library["dependencies"] as? [Any] ?? []).isEmpty, "\(library)")
    }

    @Test("The client's sources import Foundation (and FoundationNetworking, StoreKit, UIKit where they exist) only")
    func sourceImports() throws {
        let directory = Self.clientPackage.appendingPathComponent("Sources/OfferSignerClient")
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".swift") }
        #expect(!files.isEmpty)
        // StoreKitShim appears only under OFFER_SIGNER_CLIENT_STOREKIT_TESTS (the Linux test
        // build); OfferSignerClient is the module itself as seen from that test build.
        let allowed: Set<String> = ["Foundation", "FoundationNetworking", "StoreKit", "UIKit", "StoreKitShim", "OfferSignerClient"]
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

    @Test("Every StoreKit-facing source is symlinked into the shim test target, so Linux compiles it")
    func storeKitFilesAreSymlinked() throws {
        let sources = Self.clientPackage.appendingPathComponent("Sources/OfferSignerClient")
        let tests = Self.clientPackage.appendingPathComponent("Tests/OfferSignerClientStoreKitTests")
        let storeKitFiles = try FileManager.default.contentsOfDirectory(atPath: sources.path).filter { $0.hasSuffix("+StoreKit.swift") }
        #expect(storeKitFiles.count >= 2)
        for file in storeKitFiles {
            let link = try FileManager.default.destinationOfSymbolicLink(atPath: tests.appendingPathComponent(file).path)
            #expect(link == "../../Sources/OfferSignerClient/\(file)")
        }
    }
}
