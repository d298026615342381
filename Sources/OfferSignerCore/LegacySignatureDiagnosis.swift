import Crypto
import Foundation

/// A known way of getting a legacy promotional-offer signature wrong.
public struct SigningMistake: Sendable, Hashable, CustomStringConvertible {
    /// Stable identifier, e.g. `nonce_uppercase`.
    public var code: String
    /// What the signer did, and what it should do instead.
    public var explanation: String

    public var description: String { explanation }
}

/// Finds out why a legacy promotional-offer signature does not verify, by re-checking it
/// under each known mistake and naming the one that makes it verify.
///
/// Mistakes tested: nonce or appAccountToken not lowercased; timestamp in seconds instead
/// of milliseconds (or the other way round); another key ID or bundle ID (case variants,
/// empty, and any candidates given); appAccountToken signed though absent from the object,
/// or the reverse when a candidate token is given; a separator other than U+2063; raw r‖s
/// instead of DER; base64url instead of standard Base64. Single mistakes are tried first,
/// then pairs. When none explains the signature, it was made by another key or over other
/// fields.
public struct LegacySignatureDiagnosis: Sendable {
    /// The verdict.
    public enum Verdict: Sendable, Equatable {
        /// The signature verifies as it is.
        case valid
        /// The signature verifies once these mistakes are assumed.
        case mistakes([SigningMistake])
        /// The signature does not verify under any known mistake.
        case unexplained(String)
    }

    public let publicKey: P256.Signing.PublicKey
    public var candidateKeyIDs: [String]
    public var candidateBundleIDs: [String]
    public var candidateAppAccountTokens: [String]

    public init(publicKey: P256.Signing.PublicKey, candidateKeyIDs: [String] = [], candidateBundleIDs: [String] = [], candidateAppAccountTokens: [String] = []) {
        self.publicKey = publicKey
        self.candidateKeyIDs = candidateKeyIDs
        self.candidateBundleIDs = candidateBundleIDs
        self.candidateAppAccountTokens = candidateAppAccountTokens
    }

    private struct Fields {
        var values: [String]  // bundleID, keyID, productID, offerID, token, nonce, timestamp
        var separator = PromotionalOfferPayload.separator
        var bytes: Data { Data(values.joined(separator: separator).utf8) }
    }

    private struct Mutation {
        var mistake: SigningMistake
        var group: String
        var apply: (inout Fields) -> Void
    }

    private struct SignatureReading {
        var mistake: SigningMistake?
        var signature: P256.Signing.ECDSASignature
    }

    /// Diagnoses a legacy signature document.
    public func diagnose(_ document: LegacySignatureDocument) -> Verdict {
        if case .valid = SignatureDocument.legacy(document).verify(with: publicKey) {
            return .valid
        }
        let readings = signatureReadings(document.signature)
        if readings.isEmpty {
            return .unexplained("signature is neither Base64 nor base64url of a DER or raw r‖s ECDSA signature")
        }
        let canonical = Fields(values: [
            document.bundleID, document.keyID, document.productID, document.offerID,
            (document.appAccountToken ?? "").lowercased(), document.nonce.lowercased(), String(document.timestamp),
        ])
        let mutations = payloadMutations(document)

        func verifies(_ fields: Fields) -> SignatureReading? {
            let digestInput = fields.bytes
            return readings.first { publicKey.isValidSignature($0.signature, for: digestInput) }
        }
        func report(_ payloadMistakes: [SigningMistake], _ reading: SignatureReading) -> Verdict {
            let all = payloadMistakes + (reading.mistake.map { [$0] } ?? [])
            return all.isEmpty ? .valid : .mistakes(all)
        }

        if let reading = verifies(canonical) {
            if let encodingMistake = reading.mistake { return .mistakes([encodingMistake]) }
            // The signature matches the payload, yet the document did not verify: a field fails
            // validation (e.g. a timestamp in seconds), and StoreKit would refuse it too.
            let reason = if case .invalid(let reason) = SignatureDocument.legacy(document).verify(with: publicKey) { reason } else { "a field is invalid" }
            return .mistakes([SigningMistake(code: "invalid_field", explanation: "the signature matches, but StoreKit will refuse the object: \(reason)")])
        }
        for mutation in mutations {
            var fields = canonical
            mutation.apply(&fields)
            if let reading = verifies(fields) { return report([mutation.mistake], reading) }
        }
        for (index, first) in mutations.enumerated() {
            for second in mutations[(index + 1)...] where second.group != first.group {
                var fields = canonical
                first.apply(&fields)
                second.apply(&fields)
                if let reading = verifies(fields) { return report([first.mistake, second.mistake], reading) }
            }
        }
        return .unexplained("the signature matches no known mistake: it was made by another key, or over other fields (product ID, offer ID, nonce, timestamp or token values differ from the object's)")
    }

    private func signatureReadings(_ text: String) -> [SignatureReading] {
        var readings: [SignatureReading] = []
        let base64URL = SigningMistake(code: "base64url_signature", explanation: "the signature is base64url (with '-' and '_' or no padding); StoreKit wants standard Base64")
        let raw = SigningMistake(code: "raw_signature", explanation: "the signature is raw r‖s (64 bytes, as in JWS); the legacy signature must be DER-encoded")
        let rawAndURL = SigningMistake(code: "raw_base64url_signature", explanation: "the signature is raw r‖s in base64url (JWS style); the legacy signature must be DER-encoded, in standard Base64")
        if let bytes = Encoding.decodeBase64(text) {
            if let der = try? P256.Signing.ECDSASignature(derRepresentation: bytes) { readings.append(SignatureReading(mistake: nil, signature: der)) }
            if bytes.count == 64, let rawSignature = try? P256.Signing.ECDSASignature(rawRepresentation: bytes) {
                readings.append(SignatureReading(mistake: raw, signature: rawSignature))
            }
        } else if let bytes = Encoding.decodeBase64URL(text) {
            if let der = try? P256.Signing.ECDSASignature(derRepresentation: bytes) { readings.append(SignatureReading(mistake: base64URL, signature: der)) }
            if bytes.count == 64, let rawSignature = try? P256.Signing.ECDSASignature(rawRepresentation: bytes) {
                readings.append(SignatureReading(mistake: rawAndURL, signature: rawSignature))
            }
        }
        return readings
    }

    private func payloadMutations(_ document: LegacySignatureDocument) -> [Mutation] {
        var mutations: [Mutation] = []
        let token = document.appAccountToken ?? ""
        if document.nonce.uppercased() != document.nonce.lowercased() {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "nonce_uppercase", explanation: "the nonce was signed in uppercase; sign it in lowercase (Swift's UUID().uuidString is uppercase)"),
                group: "nonce", apply: { $0.values[5] = document.nonce.uppercased() }))
        }
        if !token.isEmpty {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "app_account_token_uppercase", explanation: "the appAccountToken was signed in uppercase; sign it in lowercase"),
                group: "token", apply: { $0.values[4] = token.uppercased() }))
            mutations.append(Mutation(
                mistake: SigningMistake(code: "app_account_token_not_signed", explanation: "the signature was made with an empty appAccountToken, but the object carries one: sign the token the purchase will use"),
                group: "token", apply: { $0.values[4] = "" }))
        }
        for candidate in candidateAppAccountTokens where candidate.lowercased() != token.lowercased() {
            mutations.append(Mutation(
                mistake: SigningMistake(code: token.isEmpty ? "app_account_token_missing" : "app_account_token_other", explanation: "the signature was made with appAccountToken '\(candidate.lowercased())', which the object does not carry: pass the same token to the purchase"),
                group: "token", apply: { $0.values[4] = candidate.lowercased() }))
        }
        if document.timestamp >= OfferFieldValidator.minimumTimestamp {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "timestamp_seconds", explanation: "the timestamp was signed in seconds (\(document.timestamp / 1000)); StoreKit wants milliseconds"),
                group: "timestamp", apply: { $0.values[6] = String(document.timestamp / 1000) }))
        } else if document.timestamp >= 0, case (let milliseconds, false) = document.timestamp.multipliedReportingOverflow(by: 1000) {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "timestamp_seconds_in_object", explanation: "the object's timestamp is in seconds though milliseconds (\(milliseconds)) were signed; send milliseconds"),
                group: "timestamp", apply: { $0.values[6] = String(milliseconds) }))
        }
        var keyIDs = candidateKeyIDs + [document.keyID.uppercased(), document.keyID.lowercased(), ""]
        keyIDs.removeAll { $0 == document.keyID }
        for keyID in unique(keyIDs) {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "other_key_id", explanation: keyID.isEmpty ? "the signature was made with an empty key ID; sign with the key ID from App Store Connect" : "the signature was made with key ID '\(keyID)', not '\(document.keyID)': the keyID sent to StoreKit must be the one signed"),
                group: "keyID", apply: { $0.values[1] = keyID }))
        }
        var bundleIDs = candidateBundleIDs + [document.bundleID.lowercased(), ""]
        bundleIDs.removeAll { $0 == document.bundleID }
        for bundleID in unique(bundleIDs) {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "other_bundle_id", explanation: bundleID.isEmpty ? "the signature was made with an empty bundle ID" : "the signature was made for bundle ID '\(bundleID)', not '\(document.bundleID)'"),
                group: "bundleID", apply: { $0.values[0] = bundleID }))
        }
        let separators: [(String, String)] = [
            ("\u{2064}", "U+2064 INVISIBLE PLUS"), ("\u{2062}", "U+2062 INVISIBLE TIMES"), ("\u{200B}", "U+200B ZERO WIDTH SPACE"),
            ("", "nothing"), (",", "','"), ("|", "'|'"), (":", "':'"), (".", "'.'"), (" ", "a space"), ("\n", "a newline"), ("\\u2063", "the six characters '\\u2063'"),
        ]
        for (separator, name) in separators {
            mutations.append(Mutation(
                mistake: SigningMistake(code: "wrong_separator", explanation: "the fields were joined with \(name); join them with U+2063 INVISIBLE SEPARATOR"),
                group: "separator", apply: { $0.separator = separator }))
        }
        return mutations
    }

    private func unique(_ values: [String]) -> [String] {
        var seen = Set<String>()
        return values.filter { seen.insert($0).inserted }
    }
}
