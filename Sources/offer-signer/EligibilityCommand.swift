import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerEligibility
import OfferSignerEvidence
import OfferSignerServer

/// `offer-signer eligibility …`.
struct EligibilityCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "eligibility",
        abstract: "Win-back eligibility, offline.",
        subcommands: [EligibilityCheckCommand.self]
    )
}

/// `offer-signer eligibility check`: the service's decision, offline, for support and ops.
struct EligibilityCheckCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "check",
        abstract: "Decide offer eligibility offline from an offers catalog and a customer's evidence file.",
        discussion: """
            The evidence file is what the app sends: {"signedTransactions": [...], "signedRenewalInfos": [...]} \
            (StoreKit jwsRepresentation strings). Every JWS is verified against Apple Root CA - G3 (or --apple-root). \
            Without --store, the ledger of signatures this service issued is not consulted. \
            Exit 0 when every offer is eligible, 1 when one is not, 2 when the input cannot be read.
            """
    )

    @Option(help: "Offers catalog (JSON).")
    var offers: String
    @Option(help: "Evidence file (JSON).")
    var evidence: String
    @Option(name: .customLong("apple-root"), help: "A PEM root certificate (repeatable; default: Apple Root CA - G3).")
    var appleRoots: [String] = []
    @Option(help: "The app's bundle ID (default: the catalog's only bundle).")
    var bundleID: String?
    @Option(name: .customLong("offer-id"), help: "An offer to decide (repeatable; default: every offer of the bundle).")
    var offerIDs: [String] = []
    @Option(help: "Evaluate at this time (ISO 8601, e.g. 2026-11-01T00:00:00Z; default: now).")
    var now: String?
    @Flag(help: "Print JSON.")
    var json = false

    func run() async throws {
        let decisions: [EligibilityDecision]
        do {
            guard let configuration = try EligibilityFiles.load(offers: offers, appleRoots: appleRoots) else { throw CLIFailure("no catalog") }
            var time = Date()
            if let now {
                guard let parsed = try? Date(now, strategy: .iso8601) else { throw CLIFailure("--now '\(now)' is not an ISO 8601 time like 2026-11-01T00:00:00Z") }
                time = parsed
            }
            let bundles = Set(configuration.catalog.offers.map(\.bundleID))
            guard let bundleID = bundleID ?? (bundles.count == 1 ? bundles.first : nil) else {
                throw CLIFailure("the catalog covers several apps (\(bundles.sorted().joined(separator: ", "))); give --bundle-id")
            }
            let evidenceData = try CLI.readInput(evidence)
            let files = try EvidenceFile.decode(evidenceData)
            var offers = configuration.catalog.offers.filter { $0.bundleID == bundleID }
            if !offerIDs.isEmpty {
                offers = try offerIDs.map { id in
                    guard let offer = configuration.catalog.offer(id: id, bundleID: bundleID) else { throw CLIFailure("'\(id)' is not an offer of \(bundleID) in the catalog") }
                    return offer
                }
            }
            let verifier = AppleSignedDataVerifier(
                trustedRoots: configuration.trustedRoots, bundleID: bundleID,
                environments: configuration.catalog.appSettings(bundleID: bundleID).environments)
            let verified = await verifier.verify(signedTransactions: files.signedTransactions, signedRenewalInfos: files.signedRenewalInfos, now: time)
            let evaluator = EligibilityEvaluator(catalog: configuration.catalog)
            decisions = offers.map { evaluator.evaluate($0, evidence: verified, ledger: [], now: time) }
        } catch {
            CLI.printError("\(error)")
            throw ExitCode(2)
        }
        if json {
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
            encoder.dateEncodingStrategy = .iso8601
            print(String(decoding: try encoder.encode(decisions), as: UTF8.self))
        } else {
            for decision in decisions {
                let reasons = decision.reasons.map(\.rawValue).joined(separator: ", ")
                var line = "\(decision.offerID): \(decision.eligible ? "eligible" : "not eligible")"
                if !reasons.isEmpty { line += " (\(reasons))" }
                if let from = decision.eligibleFrom { line += ", eligible from \(from.formatted(.iso8601))" }
                print(line)
                for failure in decision.evidenceFailures { print("  evidence: \(failure)") }
            }
        }
        if decisions.contains(where: { !$0.eligible }) { throw ExitCode(1) }
    }
}

/// The evidence file: what the app sends.
struct EvidenceFile: Decodable {
    var signedTransactions: [String]
    var signedRenewalInfos: [String]

    static func decode(_ data: Data) throws -> EvidenceFile {
        struct Raw: Decodable {
            var signedTransactions: [String]?
            var signedRenewalInfos: [String]?
        }
        do {
            let raw = try JSONDecoder().decode(Raw.self, from: data)
            return EvidenceFile(signedTransactions: raw.signedTransactions ?? [], signedRenewalInfos: raw.signedRenewalInfos ?? [])
        } catch {
            throw CLIFailure("evidence: \(DocumentDecoding.describe(error))")
        }
    }
}

/// Loads `--offers` and `--apple-root` files into an eligibility configuration.
enum EligibilityFiles {
    static func load(offers: String?, appleRoots: [String]) throws -> EligibilityConfiguration? {
        guard let offers else {
            if !appleRoots.isEmpty { throw ValidationError("--apple-root needs --offers") }
            return nil
        }
        guard let data = FileManager.default.contents(atPath: offers) else { throw CLIFailure("offers catalog '\(offers)' does not exist or cannot be read") }
        let pems = try appleRoots.map { try CLI.readText($0, what: "root certificate") }
        do {
            return try EligibilityConfiguration(catalogJSON: data, trustedRootPEMs: pems)
        } catch {
            throw CLIFailure("\(offers): \(error.message)")
        }
    }
}
