import ArgumentParser
import Crypto
import Foundation
import OfferSignerCore

/// An error the CLI reports as `Error: <message>` with a non-zero exit status.
struct CLIFailure: Error, CustomStringConvertible {
    var message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}

enum CLI {
    /// Reads a text file, with a message that names the path on failure.
    static func readText(_ path: String, what: String) throws -> String {
        guard FileManager.default.fileExists(atPath: path) else {
            throw CLIFailure("\(what) '\(path)' does not exist")
        }
        guard let data = FileManager.default.contents(atPath: path) else {
            throw CLIFailure("\(what) '\(path)' cannot be read (check its permissions)")
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw CLIFailure("\(what) '\(path)' is not UTF-8 text")
        }
        return text
    }

    /// Reads standard input or a file.
    static func readInput(_ path: String?) throws -> Data {
        if let path {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw CLIFailure("input file '\(path)' does not exist or cannot be read")
            }
            return data
        }
        return FileHandle.standardInput.readDataToEndOfFile()
    }

    /// Loads the verification key from `--key-file` (a .p8) or `--public-key` (a PEM public key).
    static func verificationKey(keyFile: String?, publicKeyFile: String?) throws -> P256.Signing.PublicKey {
        do {
            if let keyFile {
                return try InAppPurchaseKey.parsePrivateKey(pem: readText(keyFile, what: "key file")).publicKey
            }
            if let publicKeyFile {
                return try InAppPurchaseKey.parseVerificationKey(pem: readText(publicKeyFile, what: "public key file"))
            }
        } catch let error as OfferSignerError {
            throw CLIFailure("\(keyFile ?? publicKeyFile ?? "key"): \(error.message)")
        }
        throw ValidationError("give --key-file or --public-key")
    }

    static func printError(_ message: String) {
        FileHandle.standardError.write(Data("error: \(message)\n".utf8))
    }

    static func printNote(_ message: String) {
        FileHandle.standardError.write(Data("\(message)\n".utf8))
    }

    static func printLine(_ data: Data) {
        FileHandle.standardOutput.write(data + Data("\n".utf8))
    }
}

/// `--key-file` or `--public-key`: where the verification key comes from.
struct VerificationKeyOptions: ParsableArguments {
    @Option(name: .long, help: "A .p8 private key; its public half verifies.")
    var keyFile: String?

    @Option(name: .long, help: "A PEM public key ('-----BEGIN PUBLIC KEY-----').")
    var publicKey: String?

    func validate() throws {
        if (keyFile == nil) == (publicKey == nil) {
            throw ValidationError("give exactly one of --key-file and --public-key")
        }
    }

    func load() throws -> P256.Signing.PublicKey {
        try CLI.verificationKey(keyFile: keyFile, publicKeyFile: publicKey)
    }
}
