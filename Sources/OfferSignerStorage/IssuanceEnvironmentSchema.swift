/// Whether an issuance's environment was proved or only declared: the ledger column
/// `issued_signatures.environment_declared` (0 proved or none, 1 declared), added with SQLite
/// "v10-redemption-placement-attempts" and PostgreSQL migration 11; the same statements in both.
///
/// Rule (see `OfferRedemption`): an environment the server proved from Apple's signature (Apple's
/// history, the app's verified evidence, a Retention Messaging request) is strict, so a Sandbox
/// redemption never uses up a Production issuance. An environment the signing request only
/// declared (not verified) never keeps a redemption from matching: it only orders the
/// candidates, the same environment first. Otherwise anyone who can ask for a signature could
/// declare another environment than the one they redeem in and have their redemption reported as
/// made without a signature (the leaked-key warning). Rows written before the column existed
/// carry a proved environment or none (0).
public enum IssuanceEnvironmentSchema {
    public static let statements: [String] = [
        "ALTER TABLE issued_signatures ADD COLUMN environment_declared BIGINT NOT NULL DEFAULT 0"
    ]
}
