import Foundation
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// A database writer without the master key who installs a trigger (or rule) that quietly undoes
/// the CLI's registry writes: the change must fail loudly, write no manifest, and leave no audit
/// record of a change that did not happen (the whole transaction rolls back). Real triggers on
/// both stores. Docs/Security.md names these tests (the registry manifest).
@Suite("Attacks by a database writer: triggers that undo registry changes", .serialized)
struct RegistryTriggerAttackTests {
    typealias Target = DatabaseWriterAttackTests.Target

    /// Revokes `leaver` with the attack installed, and checks the refusal and that nothing changed.
    /// (A DO INSTEAD NOTHING rule makes PostgreSQL itself refuse the UPDATE … RETURNING the
    /// store uses to count the rows changed: refused too, with PostgreSQL's message.)
    static func revokeIsRefused(_ target: Target, installing attack: [String], namesTampering: Bool = true) async throws {
        _ = try await APIClientCredentials.create(in: target.store, name: "leaver", bundleIDs: [], actor: "test", masterKey: target.masterKey)
        let before = try await target.store.registrySnapshot()
        let manifest = try #require(before.manifest)
        for statement in attack { try await target.attack(statement) }
        let error = await #expect(throws: StoreError.self) {
            _ = try await target.store.revokeClient(name: "leaver", actor: "ops", authenticator: target.masterKey.registryRows)
        }
        if namesTampering { #expect(error?.description.contains("tampered") == true, "\(String(describing: error))") }
        let after = try await target.store.registrySnapshot()
        #expect(after.manifest == manifest, "no manifest written")
        #expect(RegistryManifest.problem(stored: after.manifest, entries: after.manifestEntries, authenticator: target.masterKey.registryRows) == nil)
        #expect(after.clients.first { $0.name == "leaver" }?.revokedAt == nil)
        #expect(try await target.fixture.count("audit_log", where: "kind = 'client.revoked'") == 0, "no false client.revoked record")
        // The server starts on the last verified registry.
        _ = try await buildApplication(configuration: target.configuration, store: target.store)
    }

    @Test("A trigger that ignores the revoking UPDATE: clients revoke fails, no manifest, no audit record", arguments: StoreBackend.testedCases)
    func ignoredUpdate(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            switch backend {
            case .sqlite:
                try await Self.revokeIsRefused(target, installing: ["CREATE TRIGGER undo BEFORE UPDATE ON api_clients BEGIN SELECT RAISE(IGNORE); END"])
            case .postgres:
                try await Self.revokeIsRefused(target, installing: [
                    "CREATE FUNCTION undo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
                    "CREATE TRIGGER undo BEFORE UPDATE ON api_clients FOR EACH ROW EXECUTE FUNCTION undo()",
                ])
            }
        }
    }

    @Test("A trigger that keeps the old row (BEFORE UPDATE returning OLD; SQLite: AFTER UPDATE restoring it): clients revoke fails", arguments: StoreBackend.testedCases)
    func restoredRow(backend: StoreBackend) async throws {
        try await Target.with(backend) { target in
            switch backend {
            case .sqlite:
                try await Self.revokeIsRefused(target, installing: [
                    """
                    CREATE TRIGGER undo AFTER UPDATE ON api_clients WHEN NEW.revoked_at IS NOT NULL BEGIN
                    UPDATE api_clients SET revoked_at = OLD.revoked_at, registry_mac = OLD.registry_mac WHERE client_id = NEW.client_id; END
                    """
                ])
            case .postgres:
                try await Self.revokeIsRefused(target, installing: [
                    "CREATE FUNCTION undo() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$",
                    "CREATE TRIGGER undo BEFORE UPDATE ON api_clients FOR EACH ROW EXECUTE FUNCTION undo()",
                ])
            }
        }
    }

    @Test("PostgreSQL: a DO INSTEAD NOTHING rule on api_clients: clients revoke fails")
    func insteadNothingRule() async throws {
        try StoreFixture.postgresAvailableOrSkip()
        try await Target.with(.postgres) { target in
            try await Self.revokeIsRefused(target, installing: ["CREATE RULE undo AS ON UPDATE TO api_clients DO INSTEAD NOTHING"], namesTampering: false)
        }
    }
}
