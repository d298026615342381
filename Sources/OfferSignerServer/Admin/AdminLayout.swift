import Crypto
import Foundation

/// The dashboard's pages.
public enum AdminPage: String, CaseIterable, Sendable {
    case offers, retention, apple, keys, clients

    var title: String {
        switch self {
        case .offers: "Offers"
        case .retention: "Retention Messaging"
        case .apple: "Apple"
        case .keys: "Keys and audit"
        case .clients: "Clients"
        }
    }

    var path: String { "/admin/" + rawValue }
}

/// The shell of every dashboard page: XHTML (well-formed XML), one inline stylesheet allowed by
/// its hash in the Content-Security-Policy, no script, nothing fetched from anywhere, a viewport
/// for phones.
///
/// Rule: the policy is `default-src 'none'` with only the stylesheet's hash, `img-src 'self'
/// data:`, `form-action 'self'`, `frame-ancestors 'none'` and `base-uri 'none'`, so a page can
/// load nothing, run nothing, post nowhere else and be framed by nobody, whatever text it shows.
public enum AdminLayout {
    static let stylesheet: StaticString = """
        :root{color-scheme:light dark;--fg:#1d1d1f;--bg:#fff;--muted:#6e6e73;--line:#d2d2d7;--warn:#b00020;--ok:#1a7f37}
        @media (prefers-color-scheme:dark){:root{--fg:#f5f5f7;--bg:#161618;--muted:#a1a1a6;--line:#3a3a3c;--warn:#ff6b6b;--ok:#4cc26b}}
        *{box-sizing:border-box}body{margin:0;font:15px/1.45 -apple-system,system-ui,sans-serif;color:var(--fg);background:var(--bg)}
        header{display:flex;flex-wrap:wrap;gap:.5rem 1rem;align-items:center;padding:.75rem 1rem;border-bottom:1px solid var(--line)}
        header strong{margin-right:auto}nav a{margin-right:.75rem;color:inherit}nav a[aria-current]{font-weight:600}
        header form{margin:0}main{padding:1rem;max-width:1100px;margin:0 auto}h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}
        .table{overflow-x:auto}table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
        th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid var(--line);white-space:nowrap}td.n,th.n{text-align:right}
        .muted,.empty{color:var(--muted)}.warn{color:var(--warn);font-weight:600}.ok{color:var(--ok)}
        .alert{border:2px solid var(--warn);padding:.75rem 1rem;border-radius:8px;margin:1rem 0}
        svg.chart{width:100%;height:auto;max-width:720px;display:block;margin:.5rem 0}
        svg.chart text{font-size:11px;fill:var(--muted)}svg.chart .grid{stroke:var(--line)}svg.chart .limit{stroke:var(--warn);stroke-dasharray:4 3;stroke-width:2}
        .s0{fill:#0a84ff}.s1{fill:#30d158}.s2{fill:#ff9f0a}.s3{fill:#bf5af2}.s4{fill:#ff453a}.s5{fill:#64d2ff}
        .active{fill:#30d158}.ready{fill:#0a84ff}.retired{fill:#8e8e93}.revoked{fill:#ff453a}.event{fill:var(--fg)}
        form.login{display:flex;flex-direction:column;gap:.6rem;max-width:24rem}input,button{font:inherit;padding:.4rem .6rem}
        footer{padding:1rem;color:var(--muted);font-size:.85rem;text-align:center}
        @media (max-width:600px){body{font-size:14px}main{padding:.6rem}th,td{padding:.25rem .35rem}}
        """

    /// `'sha256-…'` of the stylesheet, as the policy names it.
    static let styleHash: String = "'sha256-" + Data(SHA256.hash(data: Data(stylesheet.description.utf8))).base64EncodedString() + "'"

    /// The Content-Security-Policy of every dashboard page (and the HTML report file's meta element).
    public static let contentSecurityPolicy =
        "default-src 'none'; style-src \(styleHash); img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    /// A whole page. `navigation`: the page links and the sign-out button (not in the report file).
    static func document(title: String, page: String, navigation: AdminPage?, generatedAt: Date, body: [HTML], standalone: Bool = false) -> String {
        var header: [HTML] = [.element("strong", text: "offer-signer")]
        if let navigation {
            header.append(
                .element(
                    "nav", [("aria-label", "Dashboard")],
                    AdminPage.allCases.map { page in
                        .element("a", [("href", page.path), ("aria-current", page == navigation ? "page" : nil)], text: page.title)
                    }))
            header.append(.element("form", [("method", "post"), ("action", "/admin/logout")], [.element("button", [("type", "submit")], text: "Sign out")]))
        }
        var head: [HTML] = [
            .element("meta", [("charset", "utf-8")], []),
            .element("meta", [("name", "viewport"), ("content", "width=device-width, initial-scale=1")], []),
            .element("meta", [("name", "referrer"), ("content", "no-referrer")], []),
        ]
        // A file opened from disk has no response headers: the same policy as a meta element.
        if standalone { head.append(.element("meta", [("http-equiv", "Content-Security-Policy"), ("content", contentSecurityPolicy)], [])) }
        head += [.element("title", text: "\(title) · offer-signer"), .style(stylesheet)]
        let html = HTML.element(
            "html", [("xmlns", "http://www.w3.org/1999/xhtml"), ("lang", "en")],
            [
                .element("head", head),
                .element(
                    "body",
                    [
                        .element("header", header),
                        .element("main", [("data-page", page)], [.element("h1", text: title)] + body),
                        .element("footer", text: "Generated \(AdminFormat.time(generatedAt)) · times in UTC"),
                    ]),
            ])
        return "<!DOCTYPE html>\n" + html.markup + "\n"
    }

    /// A table: header cells, then rows (numeric columns, by index, right-aligned).
    static func table(_ headers: [String], _ rows: [[HTML]], numeric: Set<Int> = []) -> HTML {
        .element(
            "div", [("class", "table")],
            [
                .element(
                    "table",
                    [
                        .element("thead", [.element("tr", headers.enumerated().map { .element("th", [("class", numeric.contains($0.offset) ? "n" : nil)], text: $0.element) })]),
                        .element(
                            "tbody",
                            rows.map { row in
                                .element("tr", row.enumerated().map { .element("td", [("class", numeric.contains($0.offset) ? "n" : nil)], [$0.element]) })
                            }),
                    ]),
            ])
    }

    static func empty(_ text: String) -> HTML { .element("p", [("class", "empty")], text: text) }
}
