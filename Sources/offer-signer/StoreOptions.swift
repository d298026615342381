import ArgumentParser
import Foundation
import OfferSignerStorage

/// `--store PATH` (or `OFFER_SIGNER_STORE`): the SQLite file.
struct StoreOptions: ParsableArguments {
    @Option(name: .long, help: "The store (SQLite file). Env: OFFER_SIGNER_STORE.")
    var store: String?

    var path: String? { store ?? Environment.value("OFFER_SIGNER_STORE") }

    /// Opens the store, which must exist already (commands other than `serve` never create one).
    func open(mustExist: Bool = true) throws -> SQLiteStore {
        guard let path else { throw ValidationError("give --store PATH (or set OFFER_SIGNER_STORE)") }
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

    func load() throws -> MasterKey {
        if let path = masterKeyFile ?? Environment.value("OFFER_SIGNER_MASTER_KEY_FILE") {
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
    /// Rule: a secret file (a .p8, a master key) must not be readable or writable by group or
    /// others; the message says how to fix it.
    static func read(_ path: String, what: String) throws -> String {
        guard FileManager.default.fileExists(atPath: path) else { throw CLIFailure("\(what) '\(path)' does not exist") }
        guard let attributes = try? FileManager.default.attributesOfItem(atPath: path),
            let permissions = (attributes[.posixPermissions] as? NSNumber)?.intValue
        else { throw CLIFailure("cannot read the permissions of \(what) '\(path)'") }
        if permissions & 0o077 != 0 {
            let mode = String(permissions & 0o777, radix: 8)
            throw CLIFailure("\(what) '\(path)' is readable by group or others (mode \(mode)); restrict it with `chmod 600 \(path)`")
        }
        return try CLI.readText(path, what: what)
    }
}
