import Foundation
import OfferSignerStorage

/// The Clients page (`/admin/clients`): each API client's name, ID, bundles, creation, last
/// signature (within 90 days) and revocation.
///
/// Rules: never a secret: no secret hash, no row MAC. The rows are the store's as read, not
/// verified: a client the serving ``KeyRing`` does not hold (its MAC or the registry manifest
/// does not verify) is marked "not served" (it cannot authenticate).
struct AdminClientsPage: Sendable {
    static let lastUseDays = 90

    var clients: [APIClientRecord]
    var lastUse: [String: Date]
    /// Client IDs the serving key ring holds.
    var served: Set<String>
    var generatedAt: Date

    /// The ledger's `client` column for an API client (`Principal.identity`).
    static func ledgerName(_ client: APIClientRecord) -> String { "client:\(client.name)" }

    static func load(store: any OfferSignerStore, served: Set<String>, now: Date) async throws -> AdminClientsPage {
        let clients = try await store.listClients()
        let since = now.addingTimeInterval(-Double(lastUseDays) * 86_400)
        return AdminClientsPage(clients: clients, lastUse: try await store.lastIssuances(clients: clients.map(ledgerName), since: since), served: served, generatedAt: now)
    }

    func page() -> String {
        var body: [HTML] = []
        if clients.isEmpty {
            body.append(AdminLayout.empty("No API client yet: offer-signer clients create."))
        } else {
            let active = clients.filter { !$0.isRevoked }.count
            body.append(.element("p", [], text: "\(active) active, \(clients.count - active) revoked."))
            body.append(
                AdminLayout.table(
                    ["name", "client ID", "served", "bundles", "created", "last signature (\(Self.lastUseDays) days)", "revoked"],
                    clients.sorted { ($0.isRevoked ? 1 : 0, $0.name) < ($1.isRevoked ? 1 : 0, $1.name) }.map { client in
                        let last = lastUse[Self.ledgerName(client)]
                        return [
                            .element("span", [("data-client", client.name)], text: client.name), .text(client.clientID), AdminRegistryBanner.servedCell(served.contains(client.clientID)),
                            .text(client.bundleIDs.isEmpty ? "all" : client.bundleIDs.joined(separator: ", ")), .text(AdminFormat.time(client.createdAt)),
                            .element("span", [("data-last-use", last.map { AdminFormat.time($0) } ?? "")], text: last.map { "\(AdminFormat.time($0)) (\(AdminFormat.age($0, now: generatedAt)))" } ?? "none"),
                            .element("span", [("class", client.isRevoked ? "warn" : nil)], text: client.revokedAt.map { AdminFormat.time($0) } ?? "–"),
                        ]
                    }))
        }
        return AdminLayout.document(title: AdminPage.clients.title, page: AdminPage.clients.rawValue, navigation: .clients, generatedAt: generatedAt, body: body)
    }
}
