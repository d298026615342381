import ArgumentParser
import Foundation
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage

/// `offer-signer clients …`: API keys for app backends.
struct ClientsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "clients",
        abstract: "Manage API clients (app backends that call the signing endpoint with a bearer API key).",
        subcommands: [ClientsCreateCommand.self, ClientsListCommand.self, ClientsRevokeCommand.self]
    )
}

/// `offer-signer clients create`.
struct ClientsCreateCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "create",
        abstract: "Create an API client and print its secret once (only a hash is stored)."
    )
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var registryFile: RegistryFileOptions
    @OptionGroup var actor: ActorOptions
    @Option(help: "A unique name for the client.")
    var name: String
    @Option(name: .customLong("bundle-id"), help: "A bundle ID the client may sign for (repeatable; default: all).")
    var bundleIDs: [String] = []
    @Flag(help: "Print a JSON object.")
    var json = false

    func run() async throws {
        let masterKey = try masterKey.load()
        let store = try await store.open(mustExist: false)
        do {
            let (client, secret) = try await APIClientCredentials.create(
                in: store, name: name, bundleIDs: bundleIDs, actor: actor.resolvedActor, masterKey: masterKey,
                authenticator: try registryFile.authenticator(masterKey, masterKeyFile: self.masterKey.path))
            await registryFile.recordChange(of: store, masterKey, masterKeyFile: self.masterKey.path)
            if json {
                var writer = JSONObjectWriter()
                writer.field("name", client.name)
                writer.field("clientID", client.clientID)
                writer.field("secret", secret)
                writer.field("bundleIDs", json: "[" + client.bundleIDs.map(JSONObjectWriter.quoted).joined(separator: ",") + "]")
                writer.field("createdAt", KeyRegistry.timestamp(client.createdAt))
                print(writer.finish())
            } else {
                print("created client '\(client.name)' (\(client.clientID))")
                print("secret (shown once; send as 'Authorization: Bearer <secret>'):")
                print(secret)
            }
        } catch let error as StoreError {
            throw CLIFailure(error.message)
        } catch let error as OfferSignerError {
            throw CLIFailure(error.message)
        }
    }
}

/// `offer-signer clients list`.
struct ClientsListCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "List API clients (never their secrets).")
    @OptionGroup var store: StoreOptions
    @Flag(help: "Print a JSON array.")
    var json = false

    func run() async throws {
        let clients = try await store.open().listClients()
        if json {
            let items = clients.map { client in
                var writer = JSONObjectWriter()
                writer.field("name", client.name)
                writer.field("clientID", client.clientID)
                writer.field("bundleIDs", json: "[" + client.bundleIDs.map(JSONObjectWriter.quoted).joined(separator: ",") + "]")
                writer.field("createdAt", KeyRegistry.timestamp(client.createdAt))
                writer.field("revokedAt", KeyRegistry.timestamp(client.revokedAt))
                return writer.finish()
            }
            print("[" + items.joined(separator: ",") + "]")
            return
        }
        for client in clients {
            let scope = client.bundleIDs.isEmpty ? "all apps" : client.bundleIDs.joined(separator: ", ")
            print("\(client.name)  \(client.clientID)  \(scope)  \(client.isRevoked ? "revoked" : "active")")
        }
    }
}

/// `offer-signer clients revoke`.
struct ClientsRevokeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "revoke", abstract: "Revoke an API client; running servers refuse it within a second.")
    @OptionGroup var store: StoreOptions
    @OptionGroup var masterKey: MasterKeyOptions
    @OptionGroup var registryFile: RegistryFileOptions
    @OptionGroup var actor: ActorOptions
    @Option(help: "The client's name.")
    var name: String

    func run() async throws {
        let masterKey = try masterKey.load()
        do {
            let store = try await store.open()
            try await store.bindMasterKey(masterKey)
            let authenticator = try registryFile.authenticator(masterKey, masterKeyFile: self.masterKey.path)
            let client = try await store.revokeClient(name: name, actor: actor.resolvedActor, authenticator: authenticator)
            await registryFile.recordChange(of: store, masterKey, masterKeyFile: self.masterKey.path)
            print("revoked client '\(client.name)' (\(client.clientID))")
        } catch let error as StoreError {
            throw CLIFailure(error.message)
        }
    }
}
