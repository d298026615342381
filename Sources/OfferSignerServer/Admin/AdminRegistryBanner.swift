import Foundation

/// The warning at the top of every dashboard page when what the pages read from the store is not
/// what the server serves: the registry manifest does not verify (the last verified registry
/// keeps serving), rows were left out because their MAC does not verify, or the audit
/// checkpointer refuses to sign.
///
/// Rule: the pages show the store's rows as read; this banner, and the "not served" mark of a
/// row the serving ``KeyRing`` does not hold, say where they are not to be trusted.
struct AdminRegistryBanner: Sendable {
    var manifestProblem: String?
    var rejectedRows: [String]
    var checkpointRefusal: String?

    static let notServed = "not served (MAC/manifest does not verify)"

    /// The banner, nil when there is nothing to warn about.
    var html: HTML? {
        var items: [HTML] = []
        if let manifestProblem {
            items.append(.element("li", [("data-problem", "manifest")], text: "Registry manifest refused, the last verified registry keeps serving: \(manifestProblem)"))
        }
        if !rejectedRows.isEmpty {
            items.append(
                .element(
                    "li", [("data-problem", "rejected-rows")],
                    text: "\(rejectedRows.count) registry row(s) left out, their MAC does not verify: \(rejectedRows.joined(separator: ", "))"))
        }
        if let checkpointRefusal {
            items.append(.element("li", [("data-problem", "checkpoint")], text: "The audit checkpointer refuses to sign: \(checkpointRefusal)"))
        }
        guard !items.isEmpty else { return nil }
        return .element(
            "div", [("class", "warn"), ("role", "alert"), ("data-banner", "registry")],
            [
                .element("p", text: "What these pages read from the store is not all verified (see /readyz?detail):"),
                .element("ul", items),
            ])
    }

    /// `document` with `banner` first in its `main` element.
    static func insert(_ banner: HTML, into document: String) -> String {
        guard let main = document.range(of: "<main"), let end = document[main.upperBound...].firstIndex(of: ">") else { return document }
        var result = document
        result.insert(contentsOf: banner.markup, at: result.index(after: end))
        return result
    }

    /// A table cell: "yes", or the warning that the serving ring does not hold the row.
    static func servedCell(_ served: Bool) -> HTML {
        served
            ? .element("span", [("data-served", "true")], text: "yes")
            : .element("span", [("class", "warn"), ("data-served", "false")], text: notServed)
    }
}
