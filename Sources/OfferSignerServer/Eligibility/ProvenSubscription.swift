/// The customer's subscription an issuance records, as Apple-signed data proved it: Apple's
/// history, the app's verified evidence, or the transaction an end user's JWS request proves.
/// Redemptions match an issuance by its appAccountToken or by this subscription, only in its
/// environment (see `OfferRedemption`).
struct ProvenSubscription: Sendable, Hashable {
    /// Apple's `originalTransactionId`.
    var originalTransactionID: String
    /// The environment, as Apple spells it (`AppleEnvironment.rawValue`).
    var environment: String
}
