// swift-tools-version:6.2
import PackageDescription

/// libFuzzer targets for offer-signer's parsers of untrusted input. A package of its own, so the
/// main package's `swift build` and `swift test` never build them: an executable whose only entry
/// point is `LLVMFuzzerTestOneInput` links only with `-sanitize=fuzzer`. Build and run them with
/// `Scripts/fuzz.sh` (see Docs/Operations.md, "Fuzzing").
///
/// Each target is one file compiled with `-parse-as-library` (no top-level code, no `main`: libFuzzer
/// brings its own).
let fuzzSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
    .unsafeFlags(["-parse-as-library"]),
]

let package = Package(
    name: "offer-signer-fuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        // The main package, by path; named so its products resolve whatever the checkout's directory is called.
        .package(name: "offer-signer", path: ".."),
    ],
    targets: [
        // POST /v1/offers/signatures bodies: the plain reader, the decoder path and the duplicate-member
        // scan, cross-checked.
        .executableTarget(
            name: "signature-request",
            dependencies: [.product(name: "OfferSignerServer", package: "offer-signer")],
            path: "Sources/signature-request",
            swiftSettings: fuzzSettings
        ),
        // `.p8` and public-key PEM text (PEMDocument through InAppPurchaseKey's parsers).
        .executableTarget(
            name: "pem-key",
            dependencies: [.product(name: "OfferSignerCore", package: "offer-signer")],
            path: "Sources/pem-key",
            swiftSettings: fuzzSettings
        ),
        // Apple-signed JWS evidence (AppleSignedDataVerifier), arbitrary bytes as the compact JWS.
        .executableTarget(
            name: "apple-signed-data",
            dependencies: [.product(name: "OfferSignerEvidence", package: "offer-signer")],
            path: "Sources/apple-signed-data",
            swiftSettings: fuzzSettings
        ),
    ]
)
