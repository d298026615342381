import Foundation
import HTTPTypes
import HummingbirdTesting
@testable import OfferSignerServer
import OfferSignerStorage
import Testing

/// The dashboard shows the store's rows as read; these tests check it says where they are not
/// what the server serves (``AdminRegistryBanner``).
@Suite("Admin dashboard: registry banner and not-served rows")
struct AdminRegistryBannerTests {
    static func banner(_ page: ParsedPage) -> ParsedPage.Node? {
        page.root?.all("div").first { $0.attributes["data-banner"] == "registry" }
    }

    static func served(_ page: ParsedPage) -> [String] {
        page.root?.all("span").compactMap { $0.attributes["data-served"] } ?? []
    }

    @Test("A client inserted by SQL shows as not served on the Clients page, and every page carries the banner naming the manifest problem; the audit line says it is the CLI's unsigned record", arguments: StoreBackend.testedCases)
    func insertedRowIsNotServed(_ backend: StoreBackend) async throws {
        try await DashboardHarness.run(backend) { h in
            let before = try await h.page("/admin/clients").parsed
            #expect(Self.banner(before) == nil)
            #expect(Self.served(before) == ["true"])
            let keys = try await h.page("/admin/keys")
            #expect(Self.banner(keys.parsed) == nil)
            #expect(Self.served(keys.parsed) == ["true"])
            #expect(keys.response.text.contains("recorded by the CLI in the store, not signed"))

            try await h.apple.fixture.execute(
                "INSERT INTO api_clients (client_id, name, bundle_ids, secret_hash, created_at) VALUES ('evil0001', 'evil', '', '\(String(repeating: "e", count: 64))', 0)")
            try await h.apple.fixture.execute("UPDATE registry SET version = version + 1")
            // The server refuses the registry within its poll interval (50 ms here).
            var banner: ParsedPage.Node?
            let deadline = ContinuousClock.now + .seconds(10)
            while banner == nil, ContinuousClock.now < deadline {
                try await Task.sleep(for: .milliseconds(50))
                banner = Self.banner(try await h.page("/admin/clients").parsed)
            }
            let shown = try #require(banner)
            #expect(shown.all("li").contains { $0.attributes["data-problem"] == "manifest" }, "\(shown.allText)")

            let clients = try await h.page("/admin/clients").parsed
            let rows = clients.root?.all("tr") ?? []
            let evil = try #require(rows.first { $0.allText.contains("evil0001") })
            #expect(evil.all("span").contains { $0.attributes["data-served"] == "false" && $0.allText == AdminRegistryBanner.notServed })
            let backendRow = try #require(rows.first { $0.all("span").contains { $0.attributes["data-client"] == "backend" } })
            #expect(backendRow.all("span").contains { $0.attributes["data-served"] == "true" })
            for path in ["/admin/offers", "/admin/retention", "/admin/apple", "/admin/keys", "/admin/clients"] {
                let page = try await h.page(path).parsed
                #expect(Self.banner(page) != nil, "\(path) has no banner")
            }
        }
    }

    @Test("The banner lists each problem it is given, and nothing when there is none")
    func bannerContent() throws {
        #expect(AdminRegistryBanner(manifestProblem: nil, rejectedRows: [], checkpointRefusal: nil).html == nil)
        let html = try #require(AdminRegistryBanner(manifestProblem: "m <x>", rejectedRows: ["key K1"], checkpointRefusal: "c").html)
        let document = AdminRegistryBanner.insert(html, into: AdminLayout.document(title: "T", page: "p", navigation: nil, generatedAt: Date(), body: []))
        let parsed = ParsedPage(document)
        #expect(parsed.error == nil)
        let banner = try #require(Self.banner(parsed))
        #expect(banner.all("li").map { $0.attributes["data-problem"] ?? "" } == ["manifest", "rejected-rows", "checkpoint"])
        #expect(banner.allText.contains("key K1") && banner.allText.contains("m <x>"))
    }
}
