import AppStoreServerAPI
import ArgumentParser
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage

/// What the commands that call Apple's App Store Server API share: the store (its active key of
/// the app, with its issuer ID, sealed under the master key: the same credentials `serve` uses),
/// the offers catalog (the app's `appAppleID`, environments and API URL overrides), the app and
/// the environment.
struct AppleAPIOptions: ParsableArguments {
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @Option(help: "Offers catalog (JSON), as given to serve: the app's appAppleID, environments and App Store Server API URLs.")
    var offers: String
    @Option(help: "The app's bundle ID (default: the only app with an active key).")
    var bundleID: String?
    @Option(help: "Production or Sandbox. Default Production.")
    var environment: String = "Production"
    @Option(name: .customLong("apple-root"), help: "A PEM root certificate Apple's signed data must chain to (repeatable; default: Apple Root CA - G3).")
    var appleRoots: [String] = []

    /// Opens the store, finds the app's credentials and makes a client; the caller closes the session.
    func open(label: String) async throws -> AppleAPISession {
        guard let configuration = try EligibilityFiles.load(offers: offers, appleRoots: appleRoots) else { throw CLIFailure("no catalog") }
        guard let environment = AppleEnvironment(rawValue: environment), environment == .production || environment == .sandbox else {
            throw ValidationError("--environment must be Production or Sandbox")
        }
        let key = try masterKey.load()
        let opened = try await store.open()
        do {
            let keys = try await opened.listKeys()
            let active = keys.filter { $0.state == .active }
            let bundle: String
            if let bundleID {
                bundle = bundleID
            } else {
                let bundles = Set(active.map(\.bundleID))
                guard bundles.count == 1, let only = bundles.first else {
                    throw CLIFailure(bundles.isEmpty ? "the store has no active key" : "the store has keys of several apps; give --bundle-id")
                }
                bundle = only
            }
            guard let record = active.first(where: { $0.bundleID == bundle }) else {
                throw CLIFailure("\(bundle) has no active key in the store (keys import --bundle-id \(bundle) --issuer-id …)")
            }
            guard let issuerID = record.issuerID, !issuerID.isEmpty else {
                throw CLIFailure("the active key of \(bundle) has no issuer ID; Apple's API needs one (keys import --issuer-id)")
            }
            let pem: String
            do {
                pem = try key.open(record.sealedPrivateKey, context: record.keyID)
            } catch {
                throw CLIFailure("cannot open the key of \(bundle) with this master key")
            }
            let credentials = AppStoreServerAPICredentials(
                key: try InAppPurchaseKey(keyID: record.keyID, pemRepresentation: pem), issuerID: issuerID, bundleID: bundle)
            var api = configuration.appStoreServerAPI
            // An operator's command, not a request an app waits for: Apple may take its time.
            api.timeBudget = max(api.timeBudget, .seconds(30))
            let client = try AppStoreServerAPIClient(
                configuration: api, trustedRoots: configuration.trustedRoots, metrics: .none, logger: Logger(label: label))
            return AppleAPISession(
                store: opened, configuration: configuration, app: configuration.catalog.appSettings(bundleID: bundle), environment: environment,
                credentials: credentials, client: client, servedBundles: Set(keys.map(\.bundleID)))
        } catch {
            await opened.close()
            if let error = error as? AppStoreServerAPIConfigurationError { throw CLIFailure(error.description) }
            if let error = error as? StoreError { throw CLIFailure(error.message) }
            throw error
        }
    }
}

/// An open store and an App Store Server API client for one app and environment.
struct AppleAPISession {
    let store: any OfferSignerStore
    let configuration: EligibilityConfiguration
    let app: AppStoreAppSettings
    let environment: AppleEnvironment
    let credentials: AppStoreServerAPICredentials
    let client: AppStoreServerAPIClient
    let servedBundles: Set<String>

    func close() async {
        try? await client.shutdown()
        await store.close()
    }
}

/// `--since` / `--until` style times: ISO 8601 (`2026-11-01T00:00:00Z`) or a date (`2026-11-01`, UTC).
enum CLITime {
    static func parse(_ text: String, option: String) throws -> Date {
        if let date = try? Date(text, strategy: .iso8601) { return date }
        if let date = try? Date(text + "T00:00:00Z", strategy: .iso8601) { return date }
        throw ValidationError("\(option) '\(text)' is not an ISO 8601 time like 2026-11-01T00:00:00Z or a date like 2026-11-01")
    }
}
