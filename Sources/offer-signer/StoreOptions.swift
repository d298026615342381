import ArgumentParser
import Foundation
import Logging
import OfferSignerPostgres
import OfferSignerStorage

/// `--store PATH|URL` (or `OFFER_SIGNER_STORE`): a SQLite file, or a PostgreSQL URL
/// (`postgres://user[:password]@host[:port]/database?sslmode=…`), with the PostgreSQL password
/// from the URL, `PGPASSWORD` or `--store-password-file`, and the pool size.
///
/// Rule: the PostgreSQL password never appears in a message; the URL is shown redacted.
struct StoreOptions: ParsableArguments {
    @Option(name: .long, help: "The store: a SQLite file, or a PostgreSQL URL postgres://user@host[:port]/database?sslmode=disable|prefer|require|verify-full. Env: OFFER_SIGNER_STORE.")
    var store: String?

    @Option(name: .long, help: "PostgreSQL: a file holding the password (mode 600), used when neither the URL nor PGPASSWORD gives one. Env: OFFER_SIGNER_STORE_PASSWORD_FILE.")
    var storePasswordFile: String?

    @Option(name: .long, help: "PostgreSQL: connections in the pool (4-1000). Env: OFFER_SIGNER_STORE_POOL_SIZE. Default 10.")
    var storePoolSize: Int?

    /// What `--store` (or the environment) names: a path or a URL.
    var location: String? { store ?? Environment.value("OFFER_SIGNER_STORE") }

    /// The SQLite path, nil when the store is a PostgreSQL URL or not given.
    var path: String? {
        guard let location, !PostgresStoreConfiguration.isPostgresURL(location) else { return nil }
        return location
    }

    /// Whether the store is a PostgreSQL URL.
    var isPostgres: Bool { location.map(PostgresStoreConfiguration.isPostgresURL) ?? false }

    /// The PostgreSQL configuration for `url`: password sources and pool size applied.
    func postgresConfiguration(url: String) throws -> PostgresStoreConfiguration {
        var poolSize = PostgresStoreConfiguration.defaultPoolSize
        if let storePoolSize {
            poolSize = storePoolSize
        } else if let text = Environment.value("OFFER_SIGNER_STORE_POOL_SIZE") {
            guard let value = Int(text) else { throw ValidationError("OFFER_SIGNER_STORE_POOL_SIZE='\(text)' is not a number") }
            poolSize = value
        }
        return try Self.postgresConfiguration(
            url: url, passwordFile: storePasswordFile ?? Environment.value("OFFER_SIGNER_STORE_PASSWORD_FILE"), poolSize: poolSize)
    }

    /// The PostgreSQL configuration for `url`, the password from the URL, else `PGPASSWORD`, else `passwordFile`.
    static func postgresConfiguration(url: String, passwordFile: String?, poolSize: Int) throws -> PostgresStoreConfiguration {
        let passwordFileContents = try passwordFile.map { try SecretFile.read($0, what: "store password file") }
        do {
            return try PostgresStoreConfiguration(
                url: url, environment: ProcessInfo.processInfo.environment, passwordFileContents: passwordFileContents, poolSize: poolSize)
        } catch {
            throw CLIFailure(error.message)
        }
    }

    /// Opens the store. A SQLite store must exist already unless `mustExist` is false (commands
    /// other than `serve`, `keys import` and `clients create` never create one); a PostgreSQL
    /// database must exist, and its tables are created or migrated on open.
    /// `serving`: the PostgreSQL pool is opened whole and kept open (see
    /// `PostgresStoreConfiguration.keepsPoolOpen`).
    func open(mustExist: Bool = true, serving: Bool = false, logger: Logger = Logger(label: "offer-signer.store")) async throws -> any OfferSignerStore {
        guard let location else { throw ValidationError("give --store PATH or URL (or set OFFER_SIGNER_STORE)") }
        if PostgresStoreConfiguration.isPostgresURL(location) {
            var configuration = try postgresConfiguration(url: location)
            configuration.keepsPoolOpen = serving
            return try await Self.open(postgres: configuration, logger: logger)
        }
        if storePasswordFile != nil || storePoolSize != nil {
            throw ValidationError("--store-password-file and --store-pool-size apply to a PostgreSQL store only; '\(location)' is a SQLite file")
        }
        return try Self.open(sqlite: location, mustExist: mustExist)
    }

    static func open(postgres configuration: PostgresStoreConfiguration, logger: Logger) async throws -> any OfferSignerStore {
        do {
            return try await PostgresStore.open(configuration: configuration, logger: logger)
        } catch let error as StoreError {
            throw CLIFailure("cannot open store \(configuration.redactedDescription): \(error.message)")
        }
    }

    /// Rule: a location that looks like a URL but is not a PostgreSQL one is refused, never taken
    /// as a file name, and only its scheme is shown (the rest may hold a password).
    static func open(sqlite path: String, mustExist: Bool) throws -> any OfferSignerStore {
        if let schemeEnd = path.range(of: "://") {
            let scheme = path[..<schemeEnd.lowerBound]
            throw CLIFailure("the store '\(scheme)://…' is neither a SQLite file path nor a postgres:// or postgresql:// URL")
        }
        if mustExist && !FileManager.default.fileExists(atPath: path) {
            throw CLIFailure("store '\(path)' does not exist; `offer-signer serve --store \(path)` or `keys import` creates it")
        }
        do {
            return try SQLiteStore(path: path)
        } catch {
            throw CLIFailure(error.message)
        }
    }
}

/// `--master-key-file PATH` (or `OFFER_SIGNER_MASTER_KEY_FILE`, or the key itself in
/// `OFFER_SIGNER_MASTER_KEY`): the AES-256 key that seals private keys in the store.
struct MasterKeyOptions: ParsableArguments {
    @Option(name: .long, help: "File holding the 32-byte master key (Base64 or hex) that seals keys in the store. Env: OFFER_SIGNER_MASTER_KEY_FILE, or the key itself in OFFER_SIGNER_MASTER_KEY.")
    var masterKeyFile: String?

    /// The master key's file, when it comes from one.
    var path: String? { masterKeyFile ?? Environment.value("OFFER_SIGNER_MASTER_KEY_FILE") }

    /// Whether a master key is given at all (a file or the environment).
    var isGiven: Bool { path != nil || Environment.value("OFFER_SIGNER_MASTER_KEY") != nil }

    func load() throws -> MasterKey {
        if let path {
            do {
                return try MasterKey(text: try SecretFile.read(path, what: "master key file"))
            } catch let error as StoreError {
                throw CLIFailure("\(path): \(error.message)")
            }
        }
        if let text = Environment.value("OFFER_SIGNER_MASTER_KEY") {
            do {
                return try MasterKey(text: text)
            } catch {
                throw CLIFailure("OFFER_SIGNER_MASTER_KEY: \(error.message)")
            }
        }
        throw ValidationError("give --master-key-file PATH (or set OFFER_SIGNER_MASTER_KEY_FILE or OFFER_SIGNER_MASTER_KEY); create one with `openssl rand -base64 32 > master.key && chmod 600 master.key`")
    }
}

/// `--checkpoint-file PATH` (or `OFFER_SIGNER_CHECKPOINT_FILE`): where the last signed audit
/// checkpoint is kept outside the database; by default `<master-key-file>.checkpoint` when the
/// master key comes from a file (see `LastCheckpointFile`).
struct CheckpointFileOptions: ParsableArguments {
    @Option(help: "The file that keeps the last signed audit checkpoint outside the database. Env: OFFER_SIGNER_CHECKPOINT_FILE. Default: <master-key-file>.checkpoint; for serve with the key in OFFER_SIGNER_MASTER_KEY, <store>.checkpoint beside a SQLite store (a PostgreSQL store needs this option then).")
    var checkpointFile: String?

    /// The file to use, nil when neither it nor a master key file is given.
    func resolve(masterKeyFile: String?) -> LastCheckpointFile? {
        if let path = checkpointFile ?? Environment.value("OFFER_SIGNER_CHECKPOINT_FILE") { return LastCheckpointFile(path: path) }
        return masterKeyFile.map(LastCheckpointFile.beside(masterKeyFile:))
    }
}

/// `--registry-file PATH` (or `OFFER_SIGNER_REGISTRY_FILE`): where the highest registry manifest
/// version seen is kept outside the database; by default `<master-key-file>.registry` when the
/// master key comes from a file (see `RegistryVersionFile`).
struct RegistryFileOptions: ParsableArguments {
    @Option(help: "The file that keeps the highest registry manifest version seen outside the database (a rollback of the registry below it is refused). Env: OFFER_SIGNER_REGISTRY_FILE. Default: <master-key-file>.registry; for serve with the key in OFFER_SIGNER_MASTER_KEY, beside its checkpoint file.")
    var registryFile: String?

    /// The file to use, nil when neither it nor a master key file is given.
    func resolve(masterKeyFile: String?) -> RegistryVersionFile? {
        if let path = registryFile ?? Environment.value("OFFER_SIGNER_REGISTRY_FILE") { return RegistryVersionFile(path: path) }
        return masterKeyFile.map(RegistryVersionFile.beside(masterKeyFile:))
    }

    /// The master key's registry authenticator, refusing a change onto a registry older than the file's version.
    func authenticator(_ masterKey: MasterKey, masterKeyFile: String?) throws -> RegistryRowAuthenticator {
        do {
            return try resolve(masterKeyFile: masterKeyFile)?.authenticator(masterKey) ?? masterKey.registryRows
        } catch {
            throw CLIFailure("\(error)")
        }
    }

    /// After a change: records the store's manifest version in the file (when it verifies).
    func recordChange(of store: any OfferSignerStore, _ masterKey: MasterKey, masterKeyFile: String?) async {
        guard let file = resolve(masterKeyFile: masterKeyFile) else { return }
        do {
            try await file.recordCurrent(of: store, masterKey: masterKey)
        } catch {
            CLI.printNote("warning: the change is made, but the registry file '\(file.path)' was not updated: \(error)")
        }
    }
}

/// `--actor` and `--reason`, recorded in the audit log with every operation.
struct ActorOptions: ParsableArguments {
    @Option(help: "Who performs the operation (default: the OS user).")
    var actor: String?

    @Option(help: "Why (recorded in the audit log).")
    var reason: String?

    var resolvedActor: String {
        actor ?? Environment.value("USER") ?? Environment.value("LOGNAME") ?? "uid:\(getuid())"
    }
}

enum Environment {
    static func value(_ name: String) -> String? {
        guard let value = ProcessInfo.processInfo.environment[name], !value.isEmpty else { return nil }
        return value
    }
}

/// Reads files that hold secrets, refusing ones that others can read.
enum SecretFile {
    /// Rule: a secret file (a .p8, a master key, a token, a password) is a regular file or a pipe,
    /// owned by this process's user or root, that gives group and others no access at all; a
    /// symbolic link is followed when it is owned by this process's user or root (``PrivateFile``).
    /// The message says how to fix a refusal.
    static func read(_ path: String, what: String) throws -> String {
        let data: Data
        do {
            data = try PrivateFile.read(path)
        } catch {
            switch error {
            case .missing: throw CLIFailure("\(what) '\(path)' does not exist")
            case .unreadable(let reason): throw CLIFailure("\(what) '\(path)' cannot be read (check its permissions): \(reason)")
            case .notARegularFile: throw CLIFailure("\(what) '\(path)' is not a regular file (nor a pipe)")
            case .foreignOwner(let uid, let link):
                throw CLIFailure(
                    "\(what) '\(path)' \(link ? "is a symbolic link owned" : "is owned") by uid \(uid), neither this process's user (uid \(geteuid())) nor root: give it to this user (`chown\(link ? " -h" : "") \(geteuid()) \(path)`) or run as its owner")
            case .sharedWithOthers(let mode):
                throw CLIFailure(
                    "\(what) '\(path)' is readable, writable or executable by group or others (mode \(String(mode, radix: 8))); a secret file must be its owner's alone: restrict it with `chmod 600 \(path)`")
            case .tooLarge(let limit): throw CLIFailure("\(what) '\(path)' is larger than \(limit) bytes: not a secret file")
            case .emptyPipe:
                throw CLIFailure("\(what) '\(path)' is a pipe that ended with nothing in it: the program writing it failed or wrote nothing (a named FIFO: no program was writing it)")
            case .pipeNotEnded(let after):
                throw CLIFailure("\(what) '\(path)' is a pipe with no end after \(after.components.seconds) s: the program writing it has not finished (a secret is read to its end)")
            }
        }
        guard let text = String(data: data, encoding: .utf8) else { throw CLIFailure("\(what) '\(path)' is not UTF-8 text") }
        return text
    }
}
