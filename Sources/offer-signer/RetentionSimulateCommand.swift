import AppStoreServerAPI
import ArgumentParser
import Foundation
import Logging
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerServer
import OfferSignerStorage

/// `offer-signer retention …`.
struct RetentionCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "retention",
        abstract: "Apple's Retention Messaging, offline.",
        subcommands: [RetentionSimulateCommand.self]
    )
}

/// `offer-signer retention simulate`: what `POST /v1/apple/retention` would answer, and why.
struct RetentionSimulateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "simulate",
        abstract: "Print what the Retention Messaging endpoint would answer for a subscription, and why; signs nothing.",
        discussion: """
            The history is the store's (complete, from notifications or an earlier fetch); with --ask-apple and \
            --master-key-file, the App Store Server API is asked when the store has none. With --master-key-file the \
            app's key is checked as the service loads it; without it, the store's key row is taken as it is. Exit 0 \
            when an answer was decided, 1 when the input cannot be used.
            """
    )

    @OptionGroup var store: StoreOptions
    @Option(help: "Offers catalog (JSON) with apps.<bundle>.retention.")
    var offers: String
    @Option(help: "The subscription's originalTransactionId.")
    var originalTransactionID: String
    @Option(help: "The subscription's product ID (the request's productId).")
    var productID: String
    @Option(help: "The app's bundle ID (default: the catalog's only app with a retention plan).")
    var bundleID: String?
    @Option(help: "Production or Sandbox. Default Production.")
    var environment: String = "Production"
    @Option(help: "The customer's locale (the request's userLocale, e.g. en-US): chooses the message of a plan with per-locale messages. Default: the plan's default message.")
    var userLocale: String?
    @Option(help: "Decide at this time (ISO 8601; default: now).")
    var now: String?
    @Flag(help: "Ask Apple's App Store Server API when the store has no complete history (needs the master key).")
    var askApple = false
    @OptionGroup var masterKey: MasterKeyOptions
    @Option(name: .customLong("apple-root"), help: "A PEM root certificate Apple's answers must chain to (repeatable; default: Apple Root CA - G3).")
    var appleRoots: [String] = []
    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        guard let configuration = try EligibilityFiles.load(offers: offers, appleRoots: appleRoots) else { throw CLIFailure("no catalog") }
        let catalog = configuration.catalog
        guard let environment = AppleEnvironment(rawValue: environment), environment == .production || environment == .sandbox else {
            throw ValidationError("--environment must be Production or Sandbox")
        }
        var time = Date()
        if let now {
            guard let parsed = try? Date(now, strategy: .iso8601) else { throw ValidationError("--now '\(now)' is not an ISO 8601 time like 2026-11-01T00:00:00Z") }
            time = parsed
        }
        let planned = catalog.apps.values.filter { $0.retention != nil }
        guard let app = bundleID.map({ catalog.appSettings(bundleID: $0) }) ?? (planned.count == 1 ? planned.first : nil) else {
            throw CLIFailure(planned.isEmpty ? "the catalog has no app with a retention plan (apps.<bundle>.retention)" : "several apps have a retention plan; give --bundle-id")
        }
        let key: MasterKey? = askApple || masterKey.isGiven ? try masterKey.load() : nil
        let opened = try await store.open()
        var apple: (client: AppStoreServerAPIClient, credentials: AppStoreServerAPICredentials?)?
        do {
            if let key {
                let client = try AppStoreServerAPIClient(
                    configuration: configuration.appStoreServerAPI, trustedRoots: configuration.trustedRoots,
                    metrics: .none, logger: Logger(label: "offer-signer.retention"))
                let active = try await opened.listKeys().first { $0.bundleID == app.bundleID && $0.state == .active }
                let credentials = try active.flatMap { record -> AppStoreServerAPICredentials? in
                    guard let issuerID = record.issuerID else { return nil }
                    let pem = try key.open(record.sealedPrivateKey, context: record.keyID)
                    return AppStoreServerAPICredentials(
                        key: try InAppPurchaseKey(keyID: record.keyID, pemRepresentation: pem), issuerID: issuerID,
                        bundleID: app.bundleID)
                }
                apple = (client, credentials)
            }
            let outcome = try await RetentionSimulation.simulate(
                store: opened, catalog: catalog, app: app, originalTransactionID: originalTransactionID, productID: productID,
                environment: environment, now: time, apple: apple, trustedRoots: configuration.trustedRoots, masterKey: key, userLocale: userLocale)
            try? await apple?.client.shutdown()
            await opened.close()
            print(json ? Self.json(outcome) : Self.text(outcome), terminator: "")
        } catch {
            try? await apple?.client.shutdown()
            await opened.close()
            switch error {
            case let error as StoreError: throw CLIFailure(error.message)
            case let error as RetentionSimulation.RegistryRefused: throw CLIFailure(error.description)
            default: throw error
            }
        }
    }

    static func text(_ outcome: RetentionSimulation.Outcome) -> String {
        var lines = ["answer: \(outcome.answer)"]
        if let json = outcome.json { lines.append("body: \(json)") }
        lines.append("history: \(outcome.historySource)")
        for tried in outcome.decision?.tried ?? [] {
            lines.append("offer \(tried.offerID): \(tried.eligible ? "eligible" : "not eligible (\(tried.reasons.map(\.rawValue).joined(separator: ", ")))")")
        }
        if let reason = outcome.fallbackReason { lines.append("no offer: \(reason)") }
        if outcome.answer == "promotionalOffer" || ["no_active_key", "issuer_id_missing"].contains(outcome.fallbackReason) {
            lines.append(outcome.keyChecked ? "key: checked with the master key" : "key: the store's row, not checked (give --master-key-file to check it as the service loads it)")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    static func json(_ outcome: RetentionSimulation.Outcome) -> String {
        var writer = JSONObjectWriter()
        writer.field("answer", outcome.answer)
        if let json = outcome.json { writer.field("body", json: json) }
        writer.field("historySource", outcome.historySource)
        let tried = (outcome.decision?.tried ?? []).map { decision in
            var item = JSONObjectWriter()
            item.field("offerID", decision.offerID)
            item.field("eligible", decision.eligible)
            item.field("reasons", json: "[" + decision.reasons.map { JSONObjectWriter.quoted($0.rawValue) }.joined(separator: ",") + "]")
            return item.finish()
        }
        writer.field("decisions", json: "[" + tried.joined(separator: ",") + "]")
        if let reason = outcome.fallbackReason { writer.field("fallbackReason", reason) }
        writer.field("keyChecked", outcome.keyChecked)
        return writer.finish() + "\n"
    }
}
