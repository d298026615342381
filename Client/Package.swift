// swift-tools-version:6.0
import PackageDescription

// OfferSignerClient: what apps ship. A package of its own, with no dependencies and the floors
// of StoreKit 2, so that an app adding it resolves nothing else and keeps its own deployment
// targets (the server package at the repository root needs macOS 15 and ~30 packages; none of
// that reaches an app). The root package uses this one by path (`.package(path: "Client")`) and
// compiles the test targets below a second time, so the root `swift test` runs them too.

/// Swift 6 language mode (the tools version) plus the upcoming features the whole project uses.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "OfferSignerClient",
    // StoreKit 2's own floors (Product.purchase(options:) is iOS 15, macOS 12, tvOS 15, watchOS 8;
    // visionOS 1.0 is the first visionOS).
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
    products: [
        .library(name: "OfferSignerClient", targets: ["OfferSignerClient"]),
    ],
    targets: [
        // Foundation (and StoreKit where it exists) only.
        .target(
            name: "OfferSignerClient",
            swiftSettings: strictSettings
        ),
        // Test-only stand-in for the StoreKit API the client uses (Linux has no StoreKit). Not named
        // `StoreKit` so it can never shadow the SDK framework on Apple platforms. OfferSignerClient
        // must never depend on it.
        .target(
            name: "StoreKitShim",
            path: "Tests/StoreKitShim",
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "OfferSignerClientTests",
            dependencies: ["OfferSignerClient"],
            swiftSettings: strictSettings
        ),
        // Compiles the client's StoreKit-facing files (symlinked in) against StoreKitShim and tests
        // them on Linux CI. Compiles to nothing on Apple platforms.
        .testTarget(
            name: "OfferSignerClientStoreKitTests",
            dependencies: ["OfferSignerClient", "StoreKitShim"],
            swiftSettings: strictSettings + [.define("OFFER_SIGNER_CLIENT_STOREKIT_TESTS")]
        ),
    ]
)
