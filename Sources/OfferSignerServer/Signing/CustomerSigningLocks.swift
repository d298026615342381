import OfferSignerStorage

/// One-at-a-time access per customer (bundle ID and appAccountToken) for signing under
/// eligibility rules, inside one process.
///
/// Rule: a signature whose eligibility depends on our ledger (`waitBetweenOffersMonths`,
/// `maxRedemptions` count the signatures already issued) is decided and committed while no other
/// such request for the same customer is between its ledger read and the end of its decision (for
/// an issuance, its commit). Without it,
/// concurrent requests all read the ledger before any of them commits, and all pass: twelve
/// parallel requests got twelve signatures for an offer allowed once a year. Across processes on
/// one database, the store's lock (`StoreLock.customer`) is taken inside this one, so a process
/// never holds two database connections waiting for the same customer.
///
/// Waiters are served in arrival order, each for at most the time it is given. Other customers,
/// and signing without rules, never wait. The lock is held for one ledger read and the decision,
/// and for an issuance the signing and its one commit (the decision's record with the
/// signatures'); the record of a decision without a signature (a refusal, an eligible request that
/// could not be signed, a Retention Messaging answer without an offer) is committed after the lock
/// is given back (it adds nothing to the ledger; see `SigningController.answer` and
/// `RetentionController.answerWithoutOffer`).
typealias CustomerSigningLocks = InProcessLocks

extension InProcessLocks {
    /// The key for a customer of an app.
    static func key(bundleID: String, appAccountToken: String) -> String { "\(bundleID)\n\(appAccountToken)" }
}
