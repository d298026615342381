import FakeAppStoreServerAPI
import Foundation
import HTTPTypes
import HummingbirdTesting
import NIOCore
import OfferSignerCore
@testable import OfferSignerServer
import OfferSignerStorage
import Testing

/// The operator's dashboard (`/admin`) on the real server: off unless configured, refused
/// without its credential, and each page rendered from a store filled through the real
/// endpoints, well-formed, with the figures of `offers report` and of the audit itself, and no
/// secret anywhere (SQLite and PostgreSQL).
@Suite("Operator's dashboard (/admin)", .serialized)
struct AdminDashboardTests {
    static let pages = ["/admin/offers", "/admin/offers?days=90", "/admin/retention", "/admin/apple", "/admin/keys", "/admin/clients"]

    @Test("Without --admin-token-file every /admin path answers 404, as if it did not exist")
    func offUnlessConfigured() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            for path in ["/admin", "/admin/login"] + Self.pages {
                expectProblem(try await client.execute(uri: path, method: .get, headers: [.authorization: "Bearer \(DashboardHarness.adminSecret)"]), .notFound, "not_found")
            }
            expectProblem(try await client.postJSON("/admin/login", "token=\(DashboardHarness.adminSecret)", contentType: "application/x-www-form-urlencoded"), .notFound, "not_found")
            expectProblem(try await client.execute(uri: "/admin/logout", method: .post), .notFound, "not_found")
        }
    }

    @Test("Refused without the admin token (the operator token, a wrong or tampered one, a logged-out session); a browser signs in with an HttpOnly, SameSite=Strict session cookie holding no token; guesses are limited per address, the right token always gets in")
    func credential() async throws {
        let server = try await TestServer { $0.adminToken = try! AdminToken(DashboardHarness.adminSecret) }
        defer { server.cleanUp() }
        try await server.live { client in
            for path in ["/admin"] + Self.pages {
                expectProblem(try await client.execute(uri: path, method: .get), .unauthorized, "unauthorized")
                expectProblem(
                    try await client.execute(uri: path, method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]), .unauthorized, "unauthorized")
            }
            // A browser: 401 with a page that links to the sign-in form.
            let browser = try await client.execute(uri: "/admin/offers", method: .get, headers: [.accept: "text/html,application/xhtml+xml"])
            #expect(browser.status == .unauthorized)
            #expect(browser.headers[.contentType] == "text/html; charset=utf-8")
            #expect(ParsedPage(browser.text).root?.all("a").contains { $0.attributes["href"] == "/admin/login" } == true, "\(browser.text)")
            #expect(!browser.text.contains("<script"))

            let form = try await client.execute(uri: "/admin/login", method: .get)
            #expect(form.status == .ok)
            let parsedForm = ParsedPage(form.text)
            #expect(parsedForm.error == nil)
            #expect(parsedForm.root?.all("input").contains { $0.attributes["name"] == "token" && $0.attributes["type"] == "password" } == true)

            let wrong = try await client.postJSON("/admin/login", "token=not-the-token", contentType: "application/x-www-form-urlencoded")
            #expect(wrong.status == .unauthorized)
            #expect(wrong.headers[.setCookie] == nil)

            let escaped = DashboardHarness.adminSecret.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            let signedIn = try await client.postJSON("/admin/login", "token=\(escaped)", contentType: "application/x-www-form-urlencoded")
            #expect(signedIn.status == .seeOther, "\(signedIn.text)")
            #expect(signedIn.headers[.location] == "/admin/offers")
            let cookie = try #require(signedIn.headers[.setCookie])
            for attribute in ["HttpOnly", "SameSite=Strict", "Path=/admin"] { #expect(cookie.contains(attribute), "\(cookie)") }
            #expect(!cookie.contains(DashboardHarness.adminSecret) && !cookie.contains(escaped), "the cookie never holds the token")
            let session = String(cookie.split(separator: ";")[0])
            let withCookie = try await client.execute(uri: "/admin/keys", method: .get, headers: [.cookie: session])
            #expect(withCookie.status == .ok, "\(withCookie.text)")
            #expect(withCookie.headers[.contentSecurityPolicy]?.hasPrefix("default-src 'none'") == true)
            #expect(withCookie.headers[.cacheControl] == "no-store")
            let redirect = try await client.execute(uri: "/admin", method: .get, headers: [.cookie: session])
            #expect(redirect.status == .seeOther && redirect.headers[.location] == "/admin/offers")

            // A session whose MAC does not verify, or that expired, is refused.
            // Its expiry moved a day later: the MAC no longer matches.
            let parts = session.dropFirst("offer_signer_admin=".count).split(separator: ".")
            let expiry = try #require(Int64(parts[0]))
            let tampered = "offer_signer_admin=\(expiry + 86_400).\(parts[1]).\(parts[2])"
            #expect(try await client.execute(uri: "/admin/keys", method: .get, headers: [.cookie: tampered]).status == .unauthorized)
            let token = try AdminToken(DashboardHarness.adminSecret)
            let old = token.newSession(now: Date().addingTimeInterval(-AdminToken.sessionLifetime - 60))
            #expect(try await client.execute(uri: "/admin/keys", method: .get, headers: [.cookie: "offer_signer_admin=\(old)"]).status == .unauthorized)

            let out = try await client.execute(uri: "/admin/logout", method: .post, headers: [.cookie: session])
            #expect(out.status == .seeOther)
            #expect(out.headers[.setCookie]?.contains("Max-Age=0") == true)
            #expect(try await client.execute(uri: "/admin/keys", method: .get, headers: [.cookie: session]).status == .unauthorized, "a logged-out session is refused")

            // Guessing: after the allowance, 429 even for the right token; a signed-in browser still gets in.
            let fresh = try await client.postJSON("/admin/login", "token=\(escaped)", contentType: "application/x-www-form-urlencoded")
            let freshSession = String(try #require(fresh.headers[.setCookie]).split(separator: ";")[0])
            var statuses: [Int] = []
            for index in 0..<12 {
                statuses.append(try await client.execute(uri: "/admin/offers", method: .get, headers: [.authorization: "Bearer wrong-\(index)"]).status.code)
            }
            #expect(statuses.contains(429), "\(statuses)")
            // An allowance comes back every 6 s, which a loaded machine can take between two
            // requests: each check below comes straight after a guess answered 429, and a guess
            // it makes is answered 429 within three tries (one allowance back at most, so never
            // 401 three times while the address is throttled).
            func spendAllowances() async throws {
                for index in 0..<12 {
                    let status = try await client.execute(uri: "/admin/offers", method: .get, headers: [.authorization: "Bearer again-\(index)"]).status
                    if status == .tooManyRequests { return }
                }
                Issue.record("12 more wrong tokens were never answered 429")
            }
            func expectThrottled(_ what: String, _ guess: (Int) async throws -> TestResponse) async throws {
                try await spendAllowances()
                for attempt in 0..<3 {
                    let answer = try await guess(attempt)
                    if answer.status == .tooManyRequests {
                        expectProblem(answer, .tooManyRequests, "rate_limited")
                        return
                    }
                }
                Issue.record("\(what): three wrong tokens in a row after a 429, none answered 429")
            }
            // The address is throttled: a wrong token (also at //admin/..., with a spoofed address header) is 429 ...
            try await expectThrottled("//admin/offers with a spoofed address") { attempt in
                try await client.execute(
                    uri: "//admin/offers", method: .get,
                    headers: [.authorization: "Bearer wrong-x\(attempt)", HTTPField.Name("x-offer-signer-peer")!: "10.1.2.\(attempt)"])
            }
            try await expectThrottled("the login form") { attempt in
                try await client.postJSON("/admin/login", "token=wrong\(attempt)", contentType: "application/x-www-form-urlencoded")
            }
            // ... while the right token is always admitted, by header and by form.
            #expect(try await client.execute(uri: "/admin/offers", method: .get, headers: [.authorization: "Bearer \(DashboardHarness.adminSecret)"]).status == .ok)
            #expect(try await client.postJSON("/admin/login", "token=\(escaped)", contentType: "application/x-www-form-urlencoded").status == .seeOther)
            #expect(try await client.execute(uri: "/admin/offers", method: .get, headers: [.cookie: freshSession]).status == .ok)
            // Another scheme (a protecting proxy's Basic) is no guess and does not hide the cookie.
            #expect(
                try await client.execute(uri: "/admin/offers", method: .get, headers: [.cookie: freshSession, .authorization: "Basic dXNlcjpwYXNz"]).status == .ok)
            #expect(try await client.execute(uri: "/admin/offers", method: .get, headers: [.authorization: "Basic dXNlcjpwYXNz"]).status == .unauthorized)
            expectProblem(
                try await client.execute(uri: "/admin/offers?days=7", method: .get, headers: [.cookie: freshSession]), .badRequest, "invalid_query")
        }
    }

    @Test("POST /admin/login and /admin/logout refuse a cross-site form (Sec-Fetch-Site cross-site, or a foreign Origin) with 403 cross_site_request; a same-origin form signs in")
    func crossSiteFormsAreRefused() async throws {
        let server = try await TestServer { $0.adminToken = try! AdminToken(DashboardHarness.adminSecret) }
        defer { server.cleanUp() }
        try await server.live { client in
            let escaped = DashboardHarness.adminSecret.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
            let form: HTTPFields = [.contentType: "application/x-www-form-urlencoded"]
            for (name, value) in [("Sec-Fetch-Site", "cross-site"), ("Origin", "https://attacker.example"), ("Origin", "null")] {
                var headers = form
                headers[HTTPField.Name(name)!] = value
                for path in ["/admin/login", "/admin/logout"] {
                    let answer = try await client.execute(uri: path, method: .post, headers: headers, body: ByteBuffer(string: "token=\(escaped)"))
                    expectProblem(answer, .forbidden, "cross_site_request")
                    #expect(answer.headers[.setCookie] == nil)
                }
            }
            var sameOrigin = form
            sameOrigin[HTTPField.Name("Sec-Fetch-Site")!] = "same-origin"
            let signedIn = try await client.execute(uri: "/admin/login", method: .post, headers: sameOrigin, body: ByteBuffer(string: "token=\(escaped)"))
            #expect(signedIn.status == .seeOther, "\(signedIn.text)")
            #expect(try await client.execute(uri: "/admin/logout", method: .post, headers: sameOrigin).status == .seeOther)
        }
    }

    @Test("Each page renders from a store filled through the real endpoints; its markup parses; the Offers page equals offers report --json, the keys page the audit's own figures; no secret appears", arguments: StoreBackend.testedCases)
    func pagesFromRealTraffic(_ backend: StoreBackend) async throws {
        try await DashboardHarness.run(backend) { h in
            // Signatures through POST /v1/offers/signatures: two customers, one of whom redeems.
            let redeemer = "7e3fb20b-4cdb-47cc-936d-99d65f608138"
            for token in [redeemer, "11111111-aaaa-4aaa-8aaa-000000000001"] {
                let signed = try await h.client.postJSON(
                    "/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"promo_50","appAccountToken":"\#(token)","formats":["legacy","jws"]}"#,
                    bearer: h.clientSecret)
                #expect(signed.status == .created, "\(signed.text)")
            }
            // Redemptions through Apple's notification endpoint: one matched, one signed elsewhere, one without a token.
            for (id, token) in [("400000009001", redeemer), ("400000009002", "22222222-bbbb-4bbb-8bbb-000000000002"), ("400000009003", nil)] as [(String, String?)] {
                let answer = try await h.client.postJSON(
                    "/v1/apple/notifications", try h.offerRedeemed(transactionID: id, offerID: "promo_50", token: token, purchasedAt: Date().addingTimeInterval(2)))
                #expect(answer.status == .ok, "\(answer.text)")
            }
            // Retention Messaging: an eligible subscriber gets the offer, an ineligible one the fallback.
            let loyal = h.apple.subscriber(months: 6, id: "730000001", token: "66666666-aaaa-4aaa-8aaa-000730000001")
            try await h.apple.notify(loyal)
            #expect(RetentionHarness.members(try await h.apple.post(try h.apple.request(loyal.originalTransactionID))) == ["promotionalOffer"])
            let recent = h.apple.subscriber(months: 2, id: "730000002", token: "66666666-aaaa-4aaa-8aaa-000730000002")
            try await h.apple.notify(recent)
            #expect(RetentionHarness.members(try await h.apple.post(try h.apple.request(recent.originalTransactionID))) == ["alternateProduct"])
            // A key rotation through the store, as `keys import` and `keys activate` do it.
            let next = try InAppPurchaseKey.generateForDevelopment(keyID: "DASHKEY002")
            _ = try await KeyRegistry.importKey(
                next, bundleID: RetentionHarness.bundleID, issuerID: TestServer.issuerID, development: true, into: h.store, masterKey: h.masterKey, actor: "test",
                reason: nil)
            _ = try await h.store.transitionKey(keyID: "DASHKEY002", to: .active, actor: "test", reason: "rotation", force: false, authenticator: h.masterKey.registryRows)

            var pages: [String: String] = [:]
            for path in Self.pages {
                let (response, parsed) = try await h.page(path)
                pages[path] = response.text
                #expect(response.headers[.contentType] == "text/html; charset=utf-8")
                let policy = try #require(response.headers[.contentSecurityPolicy])
                for directive in ["default-src 'none'", "img-src 'self' data:", "form-action 'self'", "frame-ancestors 'none'", "style-src 'sha256-"] {
                    #expect(policy.contains(directive), "\(policy)")
                }
                #expect(!response.text.contains("<script") && !response.text.contains(" src=") && !response.text.contains("<link"), "no script, nothing fetched")
                #expect(!response.text.contains(" style=\""), "no inline style attribute (the policy allows only the stylesheet's hash)")
                #expect(parsed.root?.all("meta").contains { $0.attributes["name"] == "viewport" } == true)
                let expected = String(path.dropFirst("/admin/".count).prefix { $0 != "?" })
                #expect(parsed.page == expected, "\(path)")
                for chart in parsed.charts { #expect(!parsed.dataMarks(chart).isEmpty, "\(path): a chart without a data mark") }
            }
            for path in ["/admin/offers", "/admin/retention", "/admin/apple", "/admin/keys"] {
                #expect(!ParsedPage(pages[path] ?? "").charts.isEmpty, "\(path) has a chart")
            }

            // Offers: the page's figures are offers report --json's for the page's window.
            let offers = ParsedPage(pages["/admin/offers"] ?? "")
            let sinceText = try #require(offers.attributed("data-since").first?.attributes["data-since"])
            let since = try #require(try? Date(sinceText, strategy: .iso8601))
            let report = OfferReport.rows(issuances: try await h.store.offerIssuances(since: since), redemptions: try await h.store.offerRedemptions(since: since))
            let json = try #require(try JSONSerialization.jsonObject(with: Data(OfferReport.json(report).utf8)) as? [[String: Any]])
            let rows = offers.attributed("data-offer")
            #expect(rows.count == json.count && !json.isEmpty)
            for item in json {
                let row = try #require(rows.first { $0.attributes["data-offer"] == item["offerID"] as? String && $0.attributes["data-bundle"] == item["bundleID"] as? String })
                func cell(_ field: String) -> String? { row.all { $0.attributes["data-field"] == field }.first?.allText }
                for field in ["issued", "redeemed", "redeemedWithoutSignature", "redeemedWithoutAppAccountToken", "redeemedUnplaced"] {
                    #expect(cell(field) == (item[field] as? Int).map(String.init), "\(field)")
                }
                #expect(cell("conversion") == (item["conversion"] as? Double).map { String(format: "%.4f", $0) } ?? "–")
                #expect(cell("medianSecondsToRedemption") == (item["medianSecondsToRedemption"] as? Int).map { "\($0) s" } ?? "–")
            }
            let promo = try #require(json.first { $0["offerID"] as? String == "promo_50" })
            #expect(promo["issued"] as? Int == 2 && promo["redeemed"] as? Int == 1 && promo["redeemedWithoutSignature"] as? Int == 1)
            #expect(offers.attributed("data-alert", "key-leak").count == 1, "a redemption without our signature is flagged")
            // The report file (offers report --html) is the same page, self-contained.
            let file = try await AdminOffersReport.load(store: h.store, days: 30).standaloneFile()
            let parsedFile = ParsedPage(file)
            #expect(parsedFile.error == nil)
            #expect(parsedFile.root?.all("meta").contains { $0.attributes["http-equiv"] == "Content-Security-Policy" } == true)
            #expect(parsedFile.attributed("data-offer").map { $0.allText } == rows.map { $0.allText })
            #expect(parsedFile.root?.all("a").isEmpty == true, "no link into a server")

            // Retention: both answers, per product, with latencies.
            let retention = ParsedPage(pages["/admin/retention"] ?? "")
            #expect(retention.root?.allText.contains("pro.monthly") == true)
            #expect(retention.attributed("data-percentile").count == 4)

            // Apple: the notifications just received; the app's Production feed has no gap.
            let apple = ParsedPage(pages["/admin/apple"] ?? "")
            #expect(apple.root?.allText.contains("OFFER_REDEEMED") == true)
            #expect(apple.root?.allText.contains("DID_RENEW") == true)
            #expect(apple.attributed("data-gap", "false").count == 1, "Production heard today; Sandbox never")

            // Keys and audit: the audit's own figures.
            try await h.store.recordAuditVerification(
                AuditVerificationRecord(verifiedAt: Date(), recordsChecked: 1, throughSequence: 1, headHash: "x"))
            let (_, keys) = try await h.page("/admin/keys")
            let head = try await h.store.auditHead()
            let shownCount = try #require(keys.attributed("data-audit", "count").first?.allText)
            #expect(Int64(shownCount).map { $0 >= head.count - 5 && $0 <= head.count } == true, "the head when the page was read")
            let checkpoint = try await h.store.latestCheckpoint()
            #expect(keys.attributed("data-audit", "checkpoint").first?.allText == checkpoint.map { "#\($0.sequence)" } ?? "none")
            #expect(keys.attributed("data-audit", "verified").first?.allText.contains("1 records") == true)
            var states: [String: String] = [:]
            for row in keys.root?.all("tr") ?? [] {
                guard let keyID = row.all(where: { $0.attributes["data-key"] != nil }).first?.attributes["data-key"],
                    let state = row.all(where: { $0.attributes["data-state"] != nil }).first?.attributes["data-state"]
                else { continue }
                states[keyID] = state
            }
            #expect(states == ["DASHKEY001": "retired", "DASHKEY002": "active"], "\(states)")
            #expect(keys.charts.first.map { keys.dataMarks($0).count >= 2 } == true, "a lane per key")
            let headAfter = try await h.store.auditHead()
            #expect(keys.attributed("data-audit", "hash").first?.allText == headAfter.hash || headAfter.count != head.count)

            // Clients: the API client, with its last signature.
            let clients = ParsedPage(pages["/admin/clients"] ?? "")
            #expect(clients.attributed("data-client", "backend").count == 1)
            #expect(clients.attributed("data-last-use").first?.attributes["data-last-use"]?.isEmpty == false)

            // No secret on any page.
            let privatePEM = h.apple.key.pkcs8PEMRepresentation
            let pemBody = privatePEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
            let listed = try await h.store.listKeys()
            var secrets: [String] = [h.clientSecret, h.clientHash, DashboardHarness.adminSecret, h.masterKeyBase64, String(pemBody.prefix(40)), "PRIVATE KEY", "PUBLIC KEY"]
            for key in listed {
                secrets.append(key.sealedPrivateKey.base64EncodedString())
                secrets.append(String(key.publicKeyPEM.split(separator: "\n").dropFirst().first ?? "-"))
                if let mac = key.registryMAC { secrets.append(mac) }
            }
            var texts = pages
            texts["offers report --html"] = file
            for (path, text) in texts {
                for secret in secrets where !secret.isEmpty {
                    #expect(!text.contains(secret), "\(path) shows a secret (\(secret.prefix(6))…)")
                }
            }
        }
    }
}
