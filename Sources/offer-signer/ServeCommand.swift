import ArgumentParser
import Crypto
import Foundation
import Hummingbird
import Logging
import NIOCore
import AppStoreServerAPI
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage

/// `offer-signer serve`: runs the signing service.
///
/// Every option can also be set in the environment (the name is given in its help); a flag
/// wins over the environment, which wins over the default.
struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the signing service.",
        discussion: """
            With --dev: a local SQLite store and a development key (NOT issued by Apple) are created under \
            ./.offer-signer-dev, the server binds 127.0.0.1 only and does not require authentication.
            """
    )

    @Flag(help: "Development mode: local store, generated development key, loopback only, no authentication.")
    var dev = false
    @Option(help: "Address to bind. Env: OFFER_SIGNER_HOST. Default 127.0.0.1.")
    var host: String?
    @Option(help: "Port. Env: OFFER_SIGNER_PORT. Default 8080.")
    var port: Int?
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var checkpointFileOptions: CheckpointFileOptions
    @OptionGroup var registryFileOptions: RegistryFileOptions
    @Option(help: "Largest body of a signing or eligibility request, in bytes (1024-67108864; Apple's endpoints have limits of their own). Env: OFFER_SIGNER_MAX_BODY_BYTES. Default 1048576 (evidence of a long-time subscriber needs room).")
    var maxBodyBytes: Int?
    @Option(help: "Requests per second per API client or user (0: no limit). Env: OFFER_SIGNER_CLIENT_RATE. Default 200.")
    var clientRate: Double?
    @Option(help: "Burst per API client or user (at least 1). Env: OFFER_SIGNER_CLIENT_BURST. Default 400.")
    var clientBurst: Double?
    @Option(help: "Signatures per second per appAccountToken (0: no limit). Env: OFFER_SIGNER_TOKEN_RATE. Default 1.")
    var tokenRate: Double?
    @Option(help: "Burst per appAccountToken (at least 1). Env: OFFER_SIGNER_TOKEN_BURST. Default 10.")
    var tokenBurst: Double?
    @Option(help: "JWKS file with the ES256/RS256 keys of your auth server, for end-user JWTs. Env: OFFER_SIGNER_JWT_JWKS.")
    var jwtJwks: String?
    @Option(help: "File with an HS256 secret (at least 32 bytes) for end-user JWTs. Env: OFFER_SIGNER_JWT_HS256_SECRET_FILE.")
    var jwtHs256SecretFile: String?
    @Option(help: "Required JWT iss. Env: OFFER_SIGNER_JWT_ISSUER.")
    var jwtIssuer: String?
    @Option(help: "Required JWT aud. Env: OFFER_SIGNER_JWT_AUDIENCE.")
    var jwtAudience: String?
    @Option(help: "JWT claim holding the user's appAccountToken (end-user JWTs need this or --jwt-sub-namespace, not both). Env: OFFER_SIGNER_JWT_TOKEN_CLAIM.")
    var jwtTokenClaim: String?
    @Option(help: "Namespace UUID: the appAccountToken is UUIDv5(namespace, sub) (end-user JWTs need this or --jwt-token-claim, not both). Env: OFFER_SIGNER_JWT_SUB_NAMESPACE.")
    var jwtSubNamespace: String?
    @Option(help: "File with the operator token (at least 32 characters, chmod 600): GET /readyz?detail with 'Authorization: Bearer <token>' shows why the instance is not ready. Without it, the details are in the log only. Env: OFFER_SIGNER_OPERATOR_TOKEN_FILE.")
    var operatorTokenFile: String?
    @Option(help: "File with the admin token (at least 32 characters, chmod 600; not the operator token): turns on the operator's dashboard at /admin (Authorization: Bearer <token>, or sign in at /admin/login). Without it, /admin answers 404. Env: OFFER_SIGNER_ADMIN_TOKEN_FILE.")
    var adminTokenFile: String?
    @Option(help: "Offers catalog (JSON) with win-back eligibility rules; see offers.example.json. Env: OFFER_SIGNER_OFFERS.")
    var offers: String?
    @Option(name: .customLong("apple-root"), help: "A PEM root certificate Apple-signed evidence must chain to (repeatable; default: the bundled Apple Root CA - G3). For tests. Env: OFFER_SIGNER_APPLE_ROOTS (paths separated by ':').")
    var appleRoots: [String] = []
    @Option(help: "Every this many seconds, ask Apple's Get Notification History for notifications the service missed and store them (needs --offers; the instances on one store share the work). Env: OFFER_SIGNER_NOTIFICATION_RECOVERY_INTERVAL. Default: off.")
    var notificationRecoveryInterval: Double?
    @Option(help: "Sign an audit checkpoint after this many new audit records. Env: OFFER_SIGNER_CHECKPOINT_EVERY_RECORDS. Default 10000.")
    var checkpointEveryRecords: Int?
    @Option(help: "…or after this many seconds, whichever comes first (only when the chain grew). Env: OFFER_SIGNER_CHECKPOINT_EVERY_SECONDS. Default 300.")
    var checkpointEverySeconds: Double?
    @Option(help: "While busy (the last audit group commit held 8 or more signatures), hold the next one back up to this many milliseconds after the previous one started, or until 24 are waiting, so busy periods commit fewer, larger groups (less CPU per signature). 0 turns it off. Env: OFFER_SIGNER_AUDIT_COMMIT_DELAY_MS. Default 1.5.")
    var auditCommitDelayMs: Double?
    @Option(help: "Close a connection that has not delivered a complete request (headers and body) this many seconds after it opened or its previous response was sent: idle keep-alive connections, and clients that send a request slowly or only in part. More than 0, at most 86400. Env: OFFER_SIGNER_IDLE_TIMEOUT_SECONDS. Default 30.")
    var idleTimeoutSeconds: Double?
    @Option(help: "Longest a request waits for the store (audit commit, ledger read, customer lock, readiness ping) before it is answered 503 with nothing issued. Env: OFFER_SIGNER_STORE_TIMEOUT_MS. Default 3000.")
    var storeTimeoutMs: Int?
    @Option(help: "Longest one decision asks Apple's App Store Server API (pages, retries and Sandbox fallback together), for offers with historySource apple. Env: OFFER_SIGNER_APPLE_API_TIME_BUDGET_MS. Default 2000.")
    var appleAPITimeBudgetMs: Int?
    @Option(help: "Most connections to each App Store Server API host; at most half as many lookups ask Apple at once. Env: OFFER_SIGNER_APPLE_API_CONNECTIONS. Default 64.")
    var appleAPIConnections: Int?
    @Option(help: "How long a history fetched from Apple is served from memory (0: not at all). Env: OFFER_SIGNER_APPLE_API_CACHE_SECONDS. Default 60.")
    var appleAPICacheSeconds: Int?
    @Option(help: "Deadline of an answer to Apple's Retention Messaging request, from arrival to last byte (Apple's sandbox performance test expects about 700 ms; no documented production limit); past it, the product's fallback is answered and nothing is counted. Env: OFFER_SIGNER_RETENTION_BUDGET_MS. Default 500.")
    var retentionBudgetMs: Int?
    @Option(help: "Most requests each endpoint Apple calls (notifications, Retention Messaging) handles at once; the next is answered 503 overloaded. Set it to at least Apple's maxConcurrentRequests (Initiate Performance Test's PerformanceTestConfig). Env: OFFER_SIGNER_APPLE_ENDPOINT_CONCURRENCY. Default 32.")
    var appleEndpointConcurrency: Int?
    @Option(help: "NIO event loop threads (socket I/O and HTTP parsing; request handling runs on Swift's concurrency pool and the audit writer on its own thread). Env: OFFER_SIGNER_EVENT_LOOP_THREADS. Default: NIO's, one per core.")
    var eventLoopThreads: Int?
    @Option(help: "Bundle ID of the development key (--dev). Default com.example.app.")
    var devBundleID: String = "com.example.app"
    @Option(help: "trace, debug, info, notice, warning, error or critical. Env: OFFER_SIGNER_LOG_LEVEL. Default info.")
    var logLevel: String?

    /// The checkpoint file `serve` keeps (required: see Docs/Audit.md): `--checkpoint-file`, else
    /// beside the master key file, else (the key from `OFFER_SIGNER_MASTER_KEY`) beside a SQLite
    /// store, said in the log; a PostgreSQL store with the key from the environment needs
    /// `--checkpoint-file` (instances on other machines share no directory), or serve refuses.
    func servedCheckpointFile(logger: Logger) throws -> LastCheckpointFile {
        if let file = checkpointFileOptions.resolve(masterKeyFile: dev ? DevelopmentSetup.masterKeyPath : masterKey.path) { return file }
        guard store.location != nil else { throw ValidationError("give --store PATH or URL (or OFFER_SIGNER_STORE), or use --dev") }
        guard let path = store.path else {
            _ = try masterKey.load()  // no master key at all: that error first
            throw ValidationError(
                "with the master key from OFFER_SIGNER_MASTER_KEY and a PostgreSQL store, give --checkpoint-file PATH (or OFFER_SIGNER_CHECKPOINT_FILE): a file, in a directory this instance can write and the database's writers cannot, that keeps the last signed audit checkpoint outside the database")
        }
        let file = LastCheckpointFile.beside(sqliteStore: path)
        logger.notice(
            "the master key comes from the environment: the last signed audit checkpoint is kept in '\(file.path)' beside the store; give --checkpoint-file in a directory the database's writers cannot write for it to protect the audit log against them")
        return file
    }

    func run() async throws {
        let levelName = logLevel ?? Environment.value("OFFER_SIGNER_LOG_LEVEL") ?? "info"
        guard let level = Logger.Level(rawValue: levelName) else { throw ValidationError("--log-level '\(levelName)' is not a log level") }
        LoggingSystem.bootstrap { label in StandardErrorLogHandler(label: label, logLevel: level) }
        var logger = Logger(label: "offer-signer")
        logger.logLevel = level

        try configureEventLoopThreads()
        let auditCommitDelay = try requestedAuditCommitDelay()
        let idleTimeout = try requestedIdleTimeout()
        let maximumBodyBytes = try requestedMaximumBodyBytes()
        let userJWT = try userJWTConfiguration()
        let offersCatalog = offers ?? Environment.value("OFFER_SIGNER_OFFERS")
        if offersCatalog == nil, let given = givenAppleAPISetting() {
            throw ValidationError("\(given): --apple-api-* settings need an offers catalog (--offers FILE): only its offers ask Apple")
        }
        let host = host ?? Environment.value("OFFER_SIGNER_HOST") ?? "127.0.0.1"
        let port = try port ?? Self.number("OFFER_SIGNER_PORT", Int.self) ?? 8080
        // Before the store is opened: a missing checkpoint file is a configuration error.
        let checkpointFile = try servedCheckpointFile(logger: logger)
        // The store is opened (and a new one made) only after every setting below is checked: a
        // refused setting leaves nothing behind. --dev prepares its own development store first.
        let devStorePath: String?
        let masterKey: MasterKey
        if dev {
            guard ["127.0.0.1", "localhost", "::1"].contains(host) else {
                throw ValidationError("--dev binds loopback only; it refuses --host \(host)")
            }
            if store.isPostgres {
                throw ValidationError("--dev keeps a local SQLite store; it does not take a PostgreSQL URL (leave --store out, or give a file path)")
            }
            let setup = try await DevelopmentSetup.prepare(storePath: store.path, bundleID: devBundleID)
            devStorePath = setup.storePath
            masterKey = setup.masterKey
        } else {
            guard store.location != nil else { throw ValidationError("give --store PATH or URL (or OFFER_SIGNER_STORE), or use --dev") }
            devStorePath = nil
            masterKey = try self.masterKey.load()
        }

        var configuration = ServerConfiguration(masterKey: masterKey, logger: logger)
        configuration.checkpointFile = checkpointFile
        // Beside the master key file, or beside the checkpoint file serve keeps (always one):
        // a rollback of the registry before this process starts is refused, by whoever cannot
        // write that file's directory (beside a SQLite store: not its writers; said in the log).
        if let file = registryFileOptions.resolve(masterKeyFile: dev ? DevelopmentSetup.masterKeyPath : self.masterKey.path) {
            configuration.registryFile = file
        } else {
            let file = RegistryVersionFile.beside(checkpointFile: checkpointFile.path)
            configuration.registryFile = file
            logger.notice(
                "the master key comes from the environment: the highest registry manifest version is kept in '\(file.path)' beside the checkpoint file; unless both are in a directory the database's writers cannot write (give --registry-file and --checkpoint-file there), it protects against a rollback only by a writer who reaches the database but not its directory")
        }
        configuration.host = dev ? "127.0.0.1" : host
        configuration.port = port
        configuration.developmentMode = dev
        if let maximumBodyBytes { configuration.maximumBodyBytes = maximumBodyBytes }
        configuration.clientRateLimit = RateLimit(
            perSecond: try clientRate ?? Self.number("OFFER_SIGNER_CLIENT_RATE", Double.self) ?? configuration.clientRateLimit.perSecond,
            burst: try clientBurst ?? Self.number("OFFER_SIGNER_CLIENT_BURST", Double.self) ?? configuration.clientRateLimit.burst)
        configuration.appAccountTokenRateLimit = RateLimit(
            perSecond: try tokenRate ?? Self.number("OFFER_SIGNER_TOKEN_RATE", Double.self) ?? configuration.appAccountTokenRateLimit.perSecond,
            burst: try tokenBurst ?? Self.number("OFFER_SIGNER_TOKEN_BURST", Double.self) ?? configuration.appAccountTokenRateLimit.burst)
        configuration.userJWT = userJWT
        if let path = operatorTokenFile ?? Environment.value("OFFER_SIGNER_OPERATOR_TOKEN_FILE") {
            do {
                configuration.operatorToken = try OperatorToken(try SecretFile.read(path, what: "operator token file").trimmingCharacters(in: .whitespacesAndNewlines))
            } catch let error as ServerConfigurationError {
                throw ValidationError("--operator-token-file: \(error.message)")
            }
        }
        if let path = adminTokenFile ?? Environment.value("OFFER_SIGNER_ADMIN_TOKEN_FILE") {
            do {
                let secret = try SecretFile.read(path, what: "admin token file").trimmingCharacters(in: .whitespacesAndNewlines)
                configuration.adminToken = try AdminToken(secret)
                if configuration.operatorToken?.matches(secret: secret) == true {
                    throw ValidationError("--admin-token-file: the admin token must not be the operator token (give each its own)")
                }
            } catch let error as ServerConfigurationError {
                throw ValidationError("--admin-token-file: \(error.message)")
            }
        }
        if let value = try checkpointEveryRecords ?? Self.number("OFFER_SIGNER_CHECKPOINT_EVERY_RECORDS", Int.self) {
            guard value > 0 else { throw ValidationError("--checkpoint-every-records must be at least 1") }
            configuration.checkpointEveryRecords = value
        }
        if let value = try notificationRecoveryInterval ?? Self.number("OFFER_SIGNER_NOTIFICATION_RECOVERY_INTERVAL", Double.self) {
            guard value >= 1 else { throw ValidationError("--notification-recovery-interval must be at least 1 (seconds)") }
            configuration.notificationRecoveryInterval = .milliseconds(Int64(value * 1000))
        }
        if let value = try checkpointEverySeconds ?? Self.number("OFFER_SIGNER_CHECKPOINT_EVERY_SECONDS", Double.self) {
            guard value > 0 else { throw ValidationError("--checkpoint-every-seconds must be more than 0") }
            configuration.checkpointEvery = .milliseconds(Int64(value * 1000))
        }
        if let auditCommitDelay { configuration.auditCommitDelay = auditCommitDelay }
        if let idleTimeout { configuration.idleTimeout = idleTimeout }
        if let value = try storeTimeoutMs ?? Self.number("OFFER_SIGNER_STORE_TIMEOUT_MS", Int.self) {
            guard (1...600_000).contains(value) else { throw ValidationError("--store-timeout-ms must be between 1 and 600000") }
            configuration.storeTimeout = .milliseconds(value)
        }
        configuration.eligibility = try EligibilityFiles.load(
            offers: offersCatalog,
            appleRoots: appleRoots.isEmpty ? (Environment.value("OFFER_SIGNER_APPLE_ROOTS")?.split(separator: ":").map(String.init) ?? []) : appleRoots)
        if let value = try retentionBudgetMs ?? Self.number("OFFER_SIGNER_RETENTION_BUDGET_MS", Int.self) {
            guard (1...10_000).contains(value) else { throw ValidationError("--retention-budget-ms must be between 1 and 10000") }
            configuration.retention.budget = .milliseconds(value)
        }
        if let value = try appleEndpointConcurrency ?? Self.number("OFFER_SIGNER_APPLE_ENDPOINT_CONCURRENCY", Int.self) {
            guard (1...4096).contains(value) else { throw ValidationError("--apple-endpoint-concurrency must be between 1 and 4096") }
            configuration.appleEndpointConcurrency = value
        }
        if var eligibility = configuration.eligibility {
            try applyAppleAPIOptions(to: &eligibility.appStoreServerAPI)
            configuration.eligibility = eligibility
        }

        try await configuration.check()  // what buildApplication would refuse, before the store is opened
        let opened: any OfferSignerStore
        if let devStorePath {
            do {
                opened = try SQLiteStore(path: devStorePath)
            } catch {
                throw CLIFailure(error.message)
            }
        } else {
            opened = try await store.open(mustExist: false, serving: true, logger: logger)
        }
        let application: any ApplicationProtocol
        do {
            application = try await buildApplication(configuration: configuration, store: opened)
        } catch {
            // Whatever refused the start (the store's master key, its registry, its checkpoints),
            // the store is closed before serve exits.
            await opened.close()
            if let error = error as? StoreError { throw CLIFailure(error.message) }
            throw error
        }
        if let devStorePath { DevelopmentSetup.printWelcome(port: port, storePath: devStorePath) }
        do {
            try await application.runService()
        } catch {
            await opened.close()
            throw error
        }
        await opened.close()
    }

    /// Sizes NIO's process-wide event loop group, which the server uses, when asked to; must run
    /// before anything touches the group. Unset, NIO's default holds (one loop per core, or
    /// `NIO_SINGLETON_GROUP_LOOP_COUNT`). The loops only move bytes and parse HTTP (about a fifth
    /// of the CPU a signature costs); signing runs on Swift's concurrency pool and the audit
    /// writer on its own thread. Measured on 2 cores: one loop instead of two used about 5% less
    /// server CPU per signature but did not raise throughput, so fewer loops suit a server that
    /// shares its cores, and the default stays.
    private func configureEventLoopThreads() throws {
        guard let requested = try eventLoopThreads ?? Self.number("OFFER_SIGNER_EVENT_LOOP_THREADS", Int.self) else { return }
        guard (1...512).contains(requested) else { throw ValidationError("--event-loop-threads must be between 1 and 512") }
        NIOSingletons.groupLoopCountSuggestion = requested
    }

    /// `--apple-api-*`: the App Store Server API client's bounds.
    private func applyAppleAPIOptions(to api: inout AppStoreServerAPIConfiguration) throws {
        if let value = try appleAPITimeBudgetMs ?? Self.number("OFFER_SIGNER_APPLE_API_TIME_BUDGET_MS", Int.self) {
            guard (1...60_000).contains(value) else { throw ValidationError("--apple-api-time-budget-ms must be between 1 and 60000") }
            api.timeBudget = .milliseconds(value)
        }
        if let value = try appleAPIConnections ?? Self.number("OFFER_SIGNER_APPLE_API_CONNECTIONS", Int.self) {
            guard (2...1024).contains(value) else { throw ValidationError("--apple-api-connections must be between 2 and 1024") }
            api.maximumConnectionsPerHost = value
        }
        if let value = try appleAPICacheSeconds ?? Self.number("OFFER_SIGNER_APPLE_API_CACHE_SECONDS", Int.self) {
            guard (0...86_400).contains(value) else { throw ValidationError("--apple-api-cache-seconds must be between 0 and 86400") }
            api.cacheTTL = .seconds(value)
        }
    }

    /// The first `--apple-api-*` setting given, by flag or variable (nil: none), named as given.
    private func givenAppleAPISetting() -> String? {
        let settings: [(flag: String, variable: String, given: Bool)] = [
            ("--apple-api-time-budget-ms", "OFFER_SIGNER_APPLE_API_TIME_BUDGET_MS", appleAPITimeBudgetMs != nil),
            ("--apple-api-connections", "OFFER_SIGNER_APPLE_API_CONNECTIONS", appleAPIConnections != nil),
            ("--apple-api-cache-seconds", "OFFER_SIGNER_APPLE_API_CACHE_SECONDS", appleAPICacheSeconds != nil),
        ]
        for setting in settings {
            if setting.given { return setting.flag }
            if Environment.value(setting.variable) != nil { return setting.variable }
        }
        return nil
    }

    /// The largest request body asked for, checked before anything is opened (see
    /// ``ServerConfiguration/maximumBodyBytesRange``).
    private func requestedMaximumBodyBytes() throws -> Int? {
        guard let value = try maxBodyBytes ?? Self.number("OFFER_SIGNER_MAX_BODY_BYTES", Int.self) else { return nil }
        let range = ServerConfiguration.maximumBodyBytesRange
        guard range.contains(value) else {
            throw ValidationError("--max-body-bytes (OFFER_SIGNER_MAX_BODY_BYTES) must be between \(range.lowerBound) and \(range.upperBound) (bytes); got \(value)")
        }
        return value
    }

    /// The busy-period audit commit delay asked for, checked before anything is opened.
    private func requestedAuditCommitDelay() throws -> Duration? {
        guard let value = try auditCommitDelayMs ?? Self.number("OFFER_SIGNER_AUDIT_COMMIT_DELAY_MS", Double.self) else { return nil }
        guard value >= 0, value <= 1000 else { throw ValidationError("--audit-commit-delay-ms must be between 0 and 1000 (milliseconds)") }
        return .microseconds(Int64((value * 1000).rounded()))
    }

    /// The idle timeout asked for, checked before anything is opened: more than 0 and at most a
    /// day (not a number, infinity, zero or less are refused; a timeout of zero would close
    /// every connection before its request could arrive).
    private func requestedIdleTimeout() throws -> Duration? {
        guard let value = try idleTimeoutSeconds ?? Self.number("OFFER_SIGNER_IDLE_TIMEOUT_SECONDS", Double.self) else { return nil }
        let longest = Double(ServerConfiguration.longestIdleTimeout.components.seconds)
        guard value.isFinite, value > 0, value <= longest else {
            throw ValidationError("--idle-timeout-seconds must be more than 0 and at most \(Int(longest)) (seconds); got \(value)")
        }
        return .microseconds(Int64((value * 1_000_000).rounded(.up)))
    }

    private static func number<T: LosslessStringConvertible>(_ name: String, _ type: T.Type) throws -> T? {
        guard let text = Environment.value(name) else { return nil }
        guard let value = T(text) else { throw ValidationError("\(name)='\(text)' is not a number") }
        return value
    }

    private func userJWTConfiguration() throws -> UserJWTConfiguration? {
        let jwks = jwtJwks ?? Environment.value("OFFER_SIGNER_JWT_JWKS")
        let secretFile = jwtHs256SecretFile ?? Environment.value("OFFER_SIGNER_JWT_HS256_SECRET_FILE")
        guard jwks != nil || secretFile != nil else { return nil }
        guard let issuer = jwtIssuer ?? Environment.value("OFFER_SIGNER_JWT_ISSUER"),
            let audience = jwtAudience ?? Environment.value("OFFER_SIGNER_JWT_AUDIENCE")
        else { throw ValidationError("end-user JWTs need --jwt-issuer and --jwt-audience") }
        // One binding, never a silent choice between two: each gives the same user another
        // appAccountToken.
        let binding: AppAccountTokenBinding
        switch (jwtTokenClaim ?? Environment.value("OFFER_SIGNER_JWT_TOKEN_CLAIM"), jwtSubNamespace ?? Environment.value("OFFER_SIGNER_JWT_SUB_NAMESPACE")) {
        case (let claim?, nil):
            binding = .claim(claim)
        case (nil, let namespace?):
            guard let uuid = UUID.parse(namespace) else { throw ValidationError("--jwt-sub-namespace '\(namespace)' is not a UUID") }
            binding = .subjectUUIDv5(namespace: uuid)
        case (_?, _?):
            throw ValidationError(
                "end-user JWTs take one of --jwt-token-claim and --jwt-sub-namespace (or their variables), not both: each binds the user to another appAccountToken. Earlier versions used the claim and ignored the namespace; to keep your users' appAccountTokens, keep the claim and remove the namespace")
        case (nil, nil):
            throw ValidationError("end-user JWTs need --jwt-token-claim NAME or --jwt-sub-namespace UUID to bind the appAccountToken")
        }
        return UserJWTConfiguration(
            jwksJSON: try jwks.map { try CLI.readText($0, what: "JWKS file") },
            hs256Secret: try secretFile.map { try SecretFile.read($0, what: "JWT secret file").trimmingCharacters(in: .whitespacesAndNewlines) },
            issuer: issuer, audience: audience, binding: binding)
    }
}

/// What `serve --dev` sets up on a fresh clone.
enum DevelopmentSetup {
    static let directory = ".offer-signer-dev"
    static let masterKeyPath = "\(directory)/master.key"
    static let keyID = "DEVKEY0001"

    static func prepare(storePath: String?, bundleID: String) async throws -> (storePath: String, masterKey: MasterKey) {
        let manager = FileManager.default
        if !manager.fileExists(atPath: directory) {
            try manager.createDirectory(atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        let masterKeyPath = Self.masterKeyPath
        let masterKey: MasterKey
        if manager.fileExists(atPath: masterKeyPath) {
            masterKey = try MasterKey(text: try SecretFile.read(masterKeyPath, what: "development master key"))
        } else {
            let generated = MasterKey.generate()
            try KeyFileWriter.writePrivate(generated.base64 + "\n", to: masterKeyPath, overwrite: false)
            masterKey = generated.key
        }
        let path = storePath ?? "\(directory)/offer-signer.sqlite"
        let store = try SQLiteStore(path: path)
        try await store.bindMasterKey(masterKey)
        let snapshot = try await store.registrySnapshot()
        if !snapshot.rowsAuthenticated || (snapshot.manifest == nil && !snapshot.manifestEntries.isEmpty) {
            // A development store made by an earlier offer-signer: upgraded in place (its only
            // master key is the local one beside it, and its audit log is a development one).
            _ = try await StoreAuthentication.run(
                store: store, masterKey: masterKey, checkpointFile: LastCheckpointFile.beside(masterKeyFile: masterKeyPath),
                registryFile: RegistryVersionFile.beside(masterKeyFile: masterKeyPath), trustExistingChain: true, actor: "serve --dev")
            CLI.printNote("upgraded the development store: its key and client rows now carry MACs under the development master key")
        }
        if try await store.listKeys().isEmpty {
            let key = try InAppPurchaseKey.generateForDevelopment(keyID: keyID)
            _ = try await KeyRegistry.importKey(
                key, bundleID: bundleID, issuerID: UUID().uuidString.lowercased(), development: true, into: store, masterKey: masterKey,
                actor: "serve --dev", reason: "development key generated on first start (not issued by Apple)",
                authenticator: try RegistryVersionFile.beside(masterKeyFile: masterKeyPath).authenticator(masterKey))
            try await RegistryVersionFile.beside(masterKeyFile: masterKeyPath).recordCurrent(of: store, masterKey: masterKey)
            try KeyFileWriter.writePrivate(key.pkcs8PEMRepresentation, to: "\(directory)/\(keyID).p8", overwrite: true)
            try key.publicKey.pemRepresentation.write(toFile: "\(directory)/\(keyID).pub.pem", atomically: true, encoding: .utf8)
        }
        return (path, masterKey)
    }

    static func printWelcome(port: Int, storePath: String) {
        CLI.printNote("""

            offer-signer is running in DEVELOPMENT mode: no authentication, 127.0.0.1 only.
            Store: \(storePath). Development key \(keyID) (NOT issued by Apple; StoreKit rejects its signatures).
            Public key: \(directory)/\(keyID).pub.pem

            Try it:
              curl -s -X POST http://127.0.0.1:\(port)/v1/offers/signatures \\
                -H 'Content-Type: application/json' \\
                -d '{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"\(UUID().uuidString.lowercased())","formats":["legacy","jws"]}'

            """)
    }
}
