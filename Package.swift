// swift-tools-version:6.2
import PackageDescription

/// Settings shared by every target: Swift 6 language mode (strict concurrency) plus
/// the upcoming features that keep imports and existentials explicit.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "offer-signer",
    platforms: [.macOS(.v15), .iOS(.v15), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
    products: [
        .executable(name: "offer-signer", targets: ["offer-signer"]),
        .library(name: "OfferSignerCore", targets: ["OfferSignerCore"]),
        .library(name: "OfferSignerServer", targets: ["OfferSignerServer"]),
        // For the fuzz targets in Fuzz/ (a package of their own), which can only use products.
        .library(name: "OfferSignerEvidence", targets: ["OfferSignerEvidence"]),
    ],
    dependencies: [
        // The app-side client: a package of its own (Client/), used here by the integration tests.
        .package(path: "Client"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.8.0"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        // NIOHTTPTypes: the request parts Hummingbird's HTTP/1 pipeline carries (the request deadline handler).
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
    ],
    targets: [
        // Signing core: payloads, signers, verifiers, key parsing, typed errors. swift-crypto only.
        .target(
            name: "OfferSignerCore",
            dependencies: [.product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSettings
        ),
        // Storage: protocols and the embedded SQLite implementation.
        .target(
            name: "OfferSignerStorage",
            dependencies: [
                "OfferSignerCore",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // Storage on PostgreSQL: several instances share one store. Depends on the protocols in
        // OfferSignerStorage, never the other way round.
        .target(
            name: "OfferSignerPostgres",
            dependencies: [
                "OfferSignerCore",
                "OfferSignerStorage",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // The HTTP service as a library: `buildApplication(configuration:)`.
        .target(
            name: "OfferSignerServer",
            dependencies: [
                "OfferSignerCore",
                "OfferSignerStorage",
                "OfferSignerEligibility",
                "OfferSignerEvidence",
                "AppStoreServerAPI",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // The ops CLI. One file per subcommand; logic lives in the libraries.
        .executableTarget(
            name: "offer-signer",
            dependencies: [
                "AppStoreServerAPI",
                "OfferSignerCore",
                "OfferSignerStorage",
                "OfferSignerPostgres",
                "OfferSignerServer",
                "OfferSignerEligibility",
                "OfferSignerEvidence",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // `swift run -c release offer-signer-store-benchmark`: the audit commit path alone (see
        // Scripts/benchmark.sh for the whole service). Not a product.
        .executableTarget(
            name: "offer-signer-store-benchmark",
            dependencies: ["OfferSignerCore", "OfferSignerStorage", "OfferSignerPostgres"],
            swiftSettings: strictSettings
        ),
        // Win-back eligibility: offer catalog, rules and their pure evaluation over verified history.
        .target(
            name: "OfferSignerEligibility",
            swiftSettings: strictSettings
        ),
        // Verification of Apple-signed JWS evidence (x5c chain to Apple Root CA - G3).
        .target(
            name: "OfferSignerEvidence",
            dependencies: [
                "OfferSignerEligibility",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // Apple's word on a customer's history: an App Store Server API client (ES256 JWT auth,
        // paged transaction history, subscription statuses), bounded in time, retries, connections
        // and failures; every signed item verified by OfferSignerEvidence.
        .target(
            name: "AppStoreServerAPI",
            dependencies: [
                "OfferSignerCore",
                "OfferSignerEvidence",
                "OfferSignerEligibility",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"),
            ],
            swiftSettings: strictSettings
        ),

        .testTarget(
            name: "OfferSignerCoreTests",
            dependencies: ["OfferSignerCore", "TestChildProcess", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "OfferSignerCLITests",
            dependencies: ["OfferSignerCore", "TestChildProcess", "TestPostgres", .product(name: "Crypto", package: "swift-crypto")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "OfferSignerServerTests",
            dependencies: [
                "OfferSignerServer",
                "TestChildProcess",
                "TestPostgres",
                "AppleTestChain",
                "FakeAppStoreServerAPI",
                "AppStoreServerAPI",
                "OfferSignerStorage",
                "OfferSignerPostgres",
                "OfferSignerCore",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                "OfferSignerEligibility",
                "OfferSignerEvidence",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "OfferSignerEligibilityTests",
            dependencies: [
                "AppleTestChain",
                "OfferSignerEligibility",
                "OfferSignerEvidence",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // Test-only: child processes through posix_spawn (Foundation's Process.run() can crash the
        // test process on Linux with Swift 6.3.1). Used by every test module that starts a child.
        .target(
            name: "TestChildProcess",
            path: "Tests/TestChildProcess",
            swiftSettings: strictSettings
        ),
        // Test-only: a PostgreSQL server for the tests (OFFER_SIGNER_TEST_POSTGRES_URL, or a
        // throw-away cluster started once per test process) and a fresh database per test.
        .target(
            name: "TestPostgres",
            dependencies: [
                "TestChildProcess",
                "OfferSignerPostgres",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ],
            path: "Tests/TestPostgres",
            swiftSettings: strictSettings
        ),
        // Test-only: a stand-in for Apple's App Store signing chain (root, intermediate and leaf
        // with Apple's marker OIDs) that signs JWS like the App Store. One copy for every test target.
        .target(
            name: "AppleTestChain",
            dependencies: [
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            path: "Tests/AppleTestChain",
            swiftSettings: strictSettings
        ),
        // Test-only: a fake App Store Server API (a real HTTP server on loopback) that signs with
        // AppleTestChain and checks the client's JWT as Apple does.
        .target(
            name: "FakeAppStoreServerAPI",
            dependencies: [
                "AppleTestChain",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "Tests/FakeAppStoreServerAPI",
            swiftSettings: strictSettings
        ),
        // The App Store Server API client against a fake Apple API: a real HTTP server on loopback.
        .testTarget(
            name: "AppStoreServerAPITests",
            dependencies: [
                "AppStoreServerAPI",
                "AppleTestChain",
                "FakeAppStoreServerAPI",
                "OfferSignerCore",
                "OfferSignerEvidence",
                "OfferSignerEligibility",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "X509", package: "swift-certificates"),
            ],
            swiftSettings: strictSettings
        ),
        // The client package's own tests (Client/Tests), compiled again here so the root `swift test`
        // (all CI runs) runs them: SwiftPM builds the tests of the root package only, never a
        // dependency's. Same sources, same module names; the client itself comes in as the
        // product of the path package, exactly as an app gets it.
        .target(
            name: "StoreKitShim",
            path: "Client/Tests/StoreKitShim",
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "OfferSignerClientStoreKitTests",
            dependencies: [.product(name: "OfferSignerClient", package: "Client"), "StoreKitShim"],
            path: "Client/Tests/OfferSignerClientStoreKitTests",
            swiftSettings: strictSettings + [.define("OFFER_SIGNER_CLIENT_STOREKIT_TESTS")]
        ),
        .testTarget(
            name: "OfferSignerClientTests",
            dependencies: [.product(name: "OfferSignerClient", package: "Client")],
            path: "Client/Tests/OfferSignerClientTests",
            swiftSettings: strictSettings
        ),
        // The client helper over URLSession against a real server on loopback (no mocks).
        .testTarget(
            name: "OfferSignerClientIntegrationTests",
            dependencies: [
                .product(name: "OfferSignerClient", package: "Client"),
                "TestChildProcess",
                "AppleTestChain",
                "OfferSignerServer",
                "OfferSignerStorage",
                "OfferSignerCore",
                "OfferSignerEligibility",
                "OfferSignerEvidence",
                .product(name: "HummingbirdTesting", package: "hummingbird"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ],
            swiftSettings: strictSettings
        ),
    ]
)
