import ArgumentParser
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import OfferSignerCore

/// `offer-signer keys generate`: writes a development P-256 key as a PKCS#8 `.p8`.
struct KeysGenerateCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "generate",
        abstract: "Write a P-256 PKCS#8 .p8 key for development and tests (NOT issued by Apple: StoreKit rejects its signatures).",
        discussion: "The file is created with mode 0600. Use real keys from App Store Connect (Users and Access › Integrations › In-App Purchase) in production."
    )

    @Option(help: "The key ID to print beside the key (App Store Connect key IDs are 10 characters).")
    var keyID: String

    @Option(help: "Where to write the .p8 file.")
    var output: String

    @Flag(help: "Overwrite an existing file.")
    var force = false

    func run() throws {
        let key: InAppPurchaseKey
        do {
            key = try InAppPurchaseKey.generateForDevelopment(keyID: keyID)
        } catch {
            throw CLIFailure(error.message)
        }
        try KeyFileWriter.writePrivate(key.pkcs8PEMRepresentation, to: output, overwrite: force)
        CLI.printNote("""
            Wrote development key '\(keyID)' to \(output) (mode 0600).
            It is NOT issued by Apple: StoreKit rejects signatures made with it. For tests and local development only.
            Public key SHA-256: \(key.publicKeyFingerprint)
            """)
    }
}

enum KeyFileWriter {
    /// Writes secret text to a new file created with mode 0600 by `open(2)` itself, so it is
    /// never group- or world-readable, not even for an instant.
    static func writePrivate(_ text: String, to path: String, overwrite: Bool) throws {
        if FileManager.default.fileExists(atPath: path) {
            guard overwrite else { throw CLIFailure("'\(path)' already exists; pass --force to overwrite it") }
            guard unlink(path) == 0 else { throw CLIFailure("cannot replace '\(path)': \(String(cString: strerror(errno)))") }
        }
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard descriptor >= 0 else { throw CLIFailure("cannot create '\(path)': \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        guard written == bytes.count, fsync(descriptor) == 0 else {
            throw CLIFailure("cannot write '\(path)': \(String(cString: strerror(errno)))")
        }
    }
}
