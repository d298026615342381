import Foundation
import Logging
import OfferSignerStorage

/// Everything the service needs, passed in (never read from globals). `offer-signer serve`
/// builds it from flags and environment; tests build it directly.
public struct ServerConfiguration: Sendable {
    /// Address to bind. `--dev` forces 127.0.0.1.
    public var host: String = "127.0.0.1"
    /// Port to bind; 0 picks a free port (tests).
    public var port: Int = 8080
    /// Development mode: no authentication (loopback only).
    public var developmentMode: Bool = false
    /// Unseals private keys at rest.
    public var masterKey: MasterKey
    /// Largest accepted request body, in bytes (413 above it). Evidence of a long-time
    /// subscriber (a JWS per renewal) needs room.
    public var maximumBodyBytes: Int = 1024 * 1024
    /// The values `maximumBodyBytes` may take (`buildApplication` refuses others): at least 1 KiB
    /// (a signing request's fields), at most 64 MiB (a body is read whole into memory before it
    /// is parsed).
    public static let maximumBodyBytesRange = 1024...(64 * 1024 * 1024)
    /// Apple's Retention Messaging endpoint (`POST /v1/apple/retention`): time budget and freshness.
    public var retention = RetentionConfiguration()
    /// Largest App Store Server Notification body accepted (Apple's are a few KiB per JWS, and one
    /// holds three JWS at most).
    public static let maximumNotificationBytes = 256 * 1024
    /// Most requests each unauthenticated Apple endpoint (`/v1/apple/notifications`,
    /// `/v1/apple/retention`: a limit each) verifies and handles at once, once their bodies are
    /// in; beyond it they answer 503 `overloaded` with `Retry-After` (see `ConcurrencyGate`).
    public var appleEndpointConcurrency: Int = 32
    /// Longest the Apple endpoints wait for a request's body, before taking their gate; past it,
    /// 400 `body_incomplete` and the connection is closed (Apple sends a few KiB at once).
    public var appleEndpointBodyDeadline: Duration = .seconds(5)
    /// How often the store is checked for `/readyz` (in the background; see `ReadinessMonitor`).
    public var readinessInterval: Duration = .seconds(1)
    /// The operator token (`--operator-token-file`): opens `GET /readyz?detail`. Without one, the
    /// details are in the log only.
    public var operatorToken: OperatorToken?
    /// The admin token (`--admin-token-file`): opens the operator's dashboard (`/admin`). Without
    /// one, every `/admin` path answers 404.
    public var adminToken: AdminToken?
    /// Win-back eligibility rules; nil signs every offer as before.
    public var eligibility: EligibilityConfiguration?
    /// Token bucket per API client / user: sustained requests per second and burst.
    public var clientRateLimit: RateLimit = RateLimit(perSecond: 200, burst: 400)
    /// Token bucket per appAccountToken: sustained signatures per second and burst.
    public var appAccountTokenRateLimit: RateLimit = RateLimit(perSecond: 1, burst: 10)
    /// End-user JWT authentication, when configured.
    public var userJWT: UserJWTConfiguration?
    /// How often the scheduled notification catch-up asks Apple's Get Notification History for
    /// what was missed (``NotificationCatchUp``); nil: never. Needs the offers catalog.
    public var notificationRecoveryInterval: Duration?
    /// How often redemptions left unplaced (Apple could not be asked when they arrived) are asked
    /// about again (``RedemptionPlacer``). Needs the offers catalog.
    public var redemptionPlacementRetryInterval: Duration = .seconds(900)
    /// How often running servers look for key and client changes.
    public var registryPollInterval: Duration = .milliseconds(250)
    /// Most audit entries committed in one transaction (group commit).
    public var auditBatchLimit: Int = 512
    /// While busy (the last group commit held at least 8 entries), the next group commit starts
    /// no sooner than this after the previous one started, unless 24 entries are waiting before
    /// then: busy periods commit fewer, larger groups, and each commit's fixed cost (a sync, the
    /// log pages every group rewrites) is shared by more signatures. An idle or lightly loaded
    /// service commits each request at once. Zero turns it off.
    public var auditCommitDelay: Duration = .microseconds(1500)
    /// Longest a request waits for the store (an audit commit, a ledger read, a customer lock, the
    /// readiness ping) before it is answered 503 with nothing issued: a database that is down,
    /// restarting or failing over never makes a request hang.
    public var storeTimeout: Duration = .seconds(3)
    /// A signed audit checkpoint is written after this many new records…
    public var checkpointEveryRecords: Int = 10_000
    /// …or after this long, whichever comes first (only when the chain grew), and on shutdown.
    public var checkpointEvery: Duration = .seconds(300)
    /// Where the last checkpoint this deployment signed is kept outside the database (see
    /// ``LastCheckpointFile``). `serve` always gives one: `--checkpoint-file`, else
    /// `<master-key-file>.checkpoint`, else (master key from the environment, SQLite store)
    /// `<store>.checkpoint`; with a PostgreSQL store and the key from the environment it must be
    /// given. Given, it must be writable at start (else the application is not built) and is
    /// moved forward to the store's newest verified checkpoint. Nil (library use, tests): only
    /// the store keeps it.
    public var checkpointFile: LastCheckpointFile?
    /// Where the highest registry manifest version seen is kept outside the database (see
    /// ``RegistryVersionFile``); `serve` uses `<master-key-file>.registry` unless told otherwise.
    /// Nil: only this process remembers it (a rollback before its start is not detected).
    public var registryFile: RegistryVersionFile?
    /// A connection must deliver a complete request (head and body) within this long of the
    /// server starting to wait for one (the connection opening, or the previous response
    /// written), or it is closed; so idle keep-alive connections and clients that send a request
    /// slowly, or only part of it, cannot hold connections open. Must be more than zero.
    public var idleTimeout: Duration = .seconds(30)
    /// The longest idle timeout accepted: a day.
    public static let longestIdleTimeout: Duration = .seconds(86_400)
    public var logger: Logger

    public init(masterKey: MasterKey, logger: Logger = Logger(label: "offer-signer")) {
        self.masterKey = masterKey
        self.logger = logger
    }
}

/// A token-bucket rate: `perSecond` sustained, `burst` at once. A rate of 0 disables the limit.
public struct RateLimit: Sendable, Equatable {
    public var perSecond: Double
    public var burst: Double

    public init(perSecond: Double, burst: Double) {
        self.perSecond = perSecond
        self.burst = burst
    }

    public static let unlimited = RateLimit(perSecond: 0, burst: 0)
    public var isUnlimited: Bool { perSecond <= 0 }

    /// The slowest refill accepted: one request about every 11.6 days.
    public static let minimumPerSecond = 0.000_001

    /// Why this limit cannot be used, or nil when it can.
    ///
    /// Rule: `perSecond` is 0 (no limit) or a finite rate of at least `minimumPerSecond`, and
    /// then `burst` is finite and at least 1. Anything else would refuse every request forever
    /// (a burst under 1), never limit (not a number), or overflow the `Retry-After` computation.
    public var problem: String? {
        if perSecond == 0 { return nil }  // (negative rates are refused below, though `isUnlimited` treats them as 0)
        guard perSecond.isFinite, perSecond >= Self.minimumPerSecond else {
            return "rate \(perSecond) is not 0 (no limit) or a number of requests per second of at least \(Self.minimumPerSecond)"
        }
        guard burst.isFinite, burst >= 1 else { return "burst \(burst) is not a number of requests of at least 1" }
        return nil
    }
}

/// A server configuration that cannot be used (a rate limit, the JWT keys, the offers catalog or
/// its root certificates), with what is wrong with it.
public struct ServerConfigurationError: Error, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// How end-user JWTs from the app's own auth server are checked and bound to an
/// appAccountToken.
public struct UserJWTConfiguration: Sendable {
    /// A JWKS document (JSON) with ES256/RS256 public keys.
    public var jwksJSON: String?
    /// An HS256 shared secret: at least `minimumHS256SecretBytes` bytes (RFC 7518 §3.2: a key
    /// of at least the hash's size), or the server refuses to start.
    public var hs256Secret: String?
    /// The shortest HS256 secret accepted, in bytes of UTF-8.
    public static let minimumHS256SecretBytes = 32
    /// Required `iss`.
    public var issuer: String
    /// Required `aud` (one of the token's audiences).
    public var audience: String
    /// How the user's appAccountToken is found.
    public var binding: AppAccountTokenBinding
    /// Clock tolerance for `exp` and `nbf`, in seconds.
    public var leewaySeconds: Double = 30

    public init(jwksJSON: String?, hs256Secret: String?, issuer: String, audience: String, binding: AppAccountTokenBinding) {
        self.jwksJSON = jwksJSON
        self.hs256Secret = hs256Secret
        self.issuer = issuer
        self.audience = audience
        self.binding = binding
    }
}

/// Where a user's appAccountToken comes from.
public enum AppAccountTokenBinding: Sendable, Equatable {
    /// A claim of the JWT holding the UUID.
    case claim(String)
    /// UUIDv5 (RFC 9562) of the JWT's `sub` in this namespace.
    case subjectUUIDv5(namespace: UUID)
}
