/// A failure of the signing core, with a stable machine-readable ``Code``.
///
/// Modelled on swift-certificates' `CertificateError`: the ``code`` is stable and safe to
/// switch on or to send to clients; ``message`` is a one-line human explanation. Neither
/// ever contains key material.
public struct OfferSignerError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A stable, machine-readable identifier of the kind of failure (`snake_case`).
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        public var description: String { rawValue }

        /// The key file is not PEM text at all.
        public static let keyNotPEM = Code(rawValue: "key_not_pem")
        /// The PEM holds an encrypted private key; App Store Connect issues unencrypted PKCS#8.
        public static let keyEncrypted = Code(rawValue: "key_encrypted")
        /// The PEM holds something other than a PKCS#8 private key (SEC1, PKCS#1, a certificate…).
        public static let keyNotPKCS8 = Code(rawValue: "key_not_pkcs8")
        /// The key is not an elliptic-curve key (RSA, Ed25519…).
        public static let keyUnsupportedAlgorithm = Code(rawValue: "key_unsupported_algorithm")
        /// The key is an EC key on a curve other than P-256.
        public static let keyUnsupportedCurve = Code(rawValue: "key_unsupported_curve")
        /// The PEM's Base64 or DER content is damaged.
        public static let keyMalformed = Code(rawValue: "key_malformed")
        /// The payload names a key ID other than the signing key's.
        public static let keyIDMismatch = Code(rawValue: "key_id_mismatch")
        /// A required field is empty.
        public static let fieldEmpty = Code(rawValue: "field_empty")
        /// A field is longer than its limit.
        public static let fieldTooLong = Code(rawValue: "field_too_long")
        /// A field holds a control character, an invisible format character (U+2063 among
        /// them) or leading/trailing whitespace.
        public static let fieldInvalidCharacter = Code(rawValue: "field_invalid_character")
        /// The appAccountToken is not a UUID.
        public static let invalidAppAccountToken = Code(rawValue: "invalid_app_account_token")
        /// The nonce is not a UUID.
        public static let invalidNonce = Code(rawValue: "invalid_nonce")
        /// The timestamp is not plausible UNIX milliseconds.
        public static let timestampOutOfRange = Code(rawValue: "timestamp_out_of_range")
        /// A signature document (JSON) is malformed, has a missing or mistyped field.
        public static let documentMalformed = Code(rawValue: "document_malformed")
    }

    /// What kind of failure this is.
    public var code: Code
    /// The input field concerned, when there is one (e.g. `productID`).
    public var field: String?
    /// A one-line explanation for an operator. Never contains key material.
    public var message: String

    public init(code: Code, field: String? = nil, message: String) {
        self.code = code
        self.field = field
        self.message = message
    }

    public var description: String { message }
}
