import ArgumentParser
import Foundation
import OfferSignerCore

/// `offer-signer sign`: mints one signature and prints it as a JSON object.
struct SignCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sign",
        abstract: "Sign a promotional offer and print one JSON object whose field names match StoreKit's argument labels."
    )

    @Option(help: "The In-App Purchase key (.p8).")
    var keyFile: String
    @Option(help: "The key's ID in App Store Connect.")
    var keyID: String
    @Option(help: "The app's bundle ID.")
    var bundleID: String
    @Option(help: "The subscription's product ID.")
    var productID: String
    @Option(help: "The promotional offer's ID (not used by intro-eligibility).")
    var offerID: String?
    @Option(help: "The UUID the purchase will carry as appAccountToken (any case; signed in lowercase).")
    var appAccountToken: String?
    @Option(help: "legacy, jws or intro-eligibility.")
    var format: SignatureFormat = .legacy
    @Option(help: "Issuer ID from App Store Connect (jws, intro-eligibility).")
    var issuerID: String?
    @Option(help: "Any transaction ID of the customer (jws: optional; intro-eligibility: required).")
    var transactionID: String?
    @Option(help: "true or false (intro-eligibility).")
    var allowIntroductoryOffer: Bool?
    @Option(help: "The nonce UUID (legacy; default: a fresh one).")
    var nonce: String?
    @Option(help: "UNIX time in milliseconds (legacy; default: now).")
    var timestamp: Int64?

    func validate() throws {
        func refuse(_ option: String, _ value: Any?, unless formats: [SignatureFormat]) throws {
            if value != nil && !formats.contains(format) {
                throw ValidationError("\(option) does not apply to --format \(format.rawValue); it applies to \(formats.map(\.rawValue).joined(separator: ", "))")
            }
        }
        try refuse("--app-account-token", appAccountToken, unless: [.legacy])
        try refuse("--nonce", nonce, unless: [.legacy])
        try refuse("--timestamp", timestamp, unless: [.legacy])
        try refuse("--issuer-id", issuerID, unless: [.jws, .introEligibility])
        try refuse("--transaction-id", transactionID, unless: [.jws, .introEligibility])
        try refuse("--allow-introductory-offer", allowIntroductoryOffer, unless: [.introEligibility])
        try refuse("--offer-id", offerID, unless: [.legacy, .jws])
        switch format {
        case .legacy, .jws:
            if offerID == nil { throw ValidationError("--offer-id is required for --format \(format.rawValue)") }
            if format == .jws && issuerID == nil { throw ValidationError("--issuer-id is required for --format jws") }
        case .introEligibility:
            if issuerID == nil { throw ValidationError("--issuer-id is required for --format intro-eligibility") }
            if transactionID == nil { throw ValidationError("--transaction-id is required for --format intro-eligibility") }
            if allowIntroductoryOffer == nil { throw ValidationError("--allow-introductory-offer true|false is required for --format intro-eligibility") }
        }
    }

    func run() throws {
        let pem = try CLI.readText(keyFile, what: "key file")
        do {
            let key = try InAppPurchaseKey(keyID: keyID, pemRepresentation: pem)
            let signer = PromotionalOfferSigner(key: key)
            let document: SignatureDocument
            switch format {
            case .legacy:
                let token = try OfferFieldValidator.parseAppAccountToken(appAccountToken ?? "")
                var nonceValue = UUID()
                if let nonce { nonceValue = try OfferFieldValidator.parseNonce(nonce) }
                let payload = try PromotionalOfferPayload(
                    bundleID: bundleID, keyID: keyID, productID: productID, offerID: offerID ?? "",
                    appAccountToken: token, nonce: nonceValue, timestamp: timestamp ?? Date().unixMilliseconds)
                document = .legacy(LegacySignatureDocument(payload: payload, signature: try signer.legacySignature(for: payload)))
            case .jws:
                let claims = try OfferJWSClaims.promotionalOffer(
                    issuerID: issuerID ?? "", bundleID: bundleID, productID: productID, offerID: offerID ?? "",
                    transactionID: transactionID, issuedAt: Date(), nonce: UUID())
                document = .jws(PromotionalOfferJWSDocument(
                    bundleID: bundleID, productID: productID, offerID: offerID ?? "", keyID: keyID,
                    transactionID: transactionID, compactJWS: signer.compactJWS(for: claims)))
            case .introEligibility:
                let claims = try OfferJWSClaims.introductoryOfferEligibility(
                    issuerID: issuerID ?? "", bundleID: bundleID, productID: productID,
                    allowIntroductoryOffer: allowIntroductoryOffer ?? false, transactionID: transactionID ?? "",
                    issuedAt: Date(), nonce: UUID())
                document = .introductoryOfferEligibility(IntroductoryOfferEligibilityDocument(
                    bundleID: bundleID, productID: productID, keyID: keyID, transactionID: transactionID ?? "",
                    allowIntroductoryOffer: allowIntroductoryOffer ?? false, compactJWS: signer.compactJWS(for: claims)))
            }
            CLI.printLine(document.jsonData())
        } catch {
            throw CLIFailure(error.code.rawValue.hasPrefix("key_") ? "\(keyFile): \(error.message)" : error.message)
        }
    }
}

extension SignatureFormat: ExpressibleByArgument {}
