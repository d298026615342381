import Foundation

/// A reader for the strict subset of YAML that `Deploy/prometheus/offer-signer-alerts.yml` keeps
/// to (so no YAML package is needed): two-space block indentation, block mappings and block
/// sequences (`- key: value` items), comments on lines of their own, and scalars that are either
/// plain (no `: `, ` #`, no leading indicator character) or single-quoted (`''` for a quote).
/// Anything else (tabs, flow collections, anchors, tags, block scalars, double quotes) is an error
/// naming the line, not a guess.
enum StrictYAMLSubset {
    struct Failure: Error, CustomStringConvertible {
        let line: Int
        let message: String
        var description: String { "line \(line): \(message)" }
    }

    private struct Token {
        var line: Int
        var indent: Int
        var text: String
        /// The line began with `- `: it starts a sequence item at `itemIndent`.
        var itemIndent: Int?
    }

    /// The document as nested `[String: Any]`, `[Any]` and `String`.
    static func parse(_ source: String) throws -> Any {
        var tokens: [Token] = []
        for (index, raw) in source.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = index + 1
            if raw.contains("\t") { throw Failure(line: line, message: "a tab") }
            let text = raw.drop(while: { $0 == " " })
            if text.isEmpty || text.hasPrefix("#") { continue }
            if text.hasSuffix(" ") { throw Failure(line: line, message: "trailing space") }
            let indent = raw.count - text.count
            guard indent % 2 == 0 else { throw Failure(line: line, message: "indentation of \(indent) spaces is not a multiple of 2") }
            if text.hasPrefix("- ") {
                tokens.append(Token(line: line, indent: indent + 2, text: String(text.dropFirst(2)), itemIndent: indent))
            } else if text == "-" {
                throw Failure(line: line, message: "an empty sequence item")
            } else {
                tokens.append(Token(line: line, indent: indent, text: String(text), itemIndent: nil))
            }
        }
        guard let first = tokens.first else { throw Failure(line: 1, message: "an empty document") }
        guard first.indent == 0 else { throw Failure(line: first.line, message: "the document does not start at column 0") }
        var position = 0
        let value = try node(&tokens, &position, indent: 0)
        if position < tokens.count { throw Failure(line: tokens[position].line, message: "unexpected indentation") }
        return value
    }

    private static func node(_ tokens: inout [Token], _ position: inout Int, indent: Int) throws -> Any {
        if tokens[position].itemIndent == indent {
            var items: [Any] = []
            while position < tokens.count, tokens[position].itemIndent == indent {
                tokens[position].itemIndent = nil
                items.append(try mapping(&tokens, &position, indent: indent + 2))
            }
            return items
        }
        return try mapping(&tokens, &position, indent: indent)
    }

    private static func mapping(_ tokens: inout [Token], _ position: inout Int, indent: Int) throws -> [String: Any] {
        var result: [String: Any] = [:]
        while position < tokens.count, tokens[position].indent == indent, tokens[position].itemIndent == nil {
            let token = tokens[position]
            let key: Substring
            let rest: Substring
            if token.text.hasSuffix(":") {
                key = token.text.dropLast()
                rest = ""
            } else if let separator = token.text.range(of: ": ") {
                key = token.text[..<separator.lowerBound]
                rest = token.text[separator.upperBound...]
            } else {
                throw Failure(line: token.line, message: "not 'key: value' or 'key:'")
            }
            guard !key.isEmpty, key.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" || $0 == "-" }) else {
                throw Failure(line: token.line, message: "the key '\(key)' is not a plain word")
            }
            guard result[String(key)] == nil else { throw Failure(line: token.line, message: "the key '\(key)' repeats") }
            position += 1
            if rest.isEmpty {
                guard position < tokens.count, tokens[position].indent > indent || tokens[position].itemIndent == indent else {
                    throw Failure(line: token.line, message: "'\(key):' has no value")
                }
                let childIndent = tokens[position].itemIndent ?? tokens[position].indent
                guard childIndent == indent || childIndent == indent + 2 else {
                    throw Failure(line: tokens[position].line, message: "indented by more than 2 spaces")
                }
                result[String(key)] = try node(&tokens, &position, indent: childIndent)
            } else {
                result[String(key)] = try scalar(rest, line: token.line)
            }
        }
        return result
    }

    private static func scalar(_ text: Substring, line: Int) throws -> String {
        if text.hasPrefix("'") {
            guard text.count >= 2, text.hasSuffix("'") else { throw Failure(line: line, message: "an unterminated single-quoted string") }
            let inner = text.dropFirst().dropLast()
            guard !inner.replacingOccurrences(of: "''", with: "").contains("'") else {
                throw Failure(line: line, message: "a lone quote inside a single-quoted string (write '')")
            }
            return inner.replacingOccurrences(of: "''", with: "'")
        }
        guard let first = text.first, !"{}[]&*!|>\"%@`#,?-".contains(first) else {
            throw Failure(line: line, message: "a plain scalar may not start with '\(text.first.map(String.init) ?? "")': quote it with single quotes")
        }
        guard !text.contains(": "), !text.contains(" #") else { throw Failure(line: line, message: "a plain scalar with ': ' or ' #': quote it") }
        return String(text)
    }
}

/// The metric names a PromQL expression reads: what is left once string literals, label matchers
/// (`{…}`), ranges and subqueries (`[…]`), grouping label lists (`by (…)`, `on (…)`, …), function
/// and aggregation names (an identifier followed by `(`), keywords and numbers are taken away.
enum PromQLMetricNames {
    private static let keywords: Set<String> = [
        "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan", "Inf", "NaN",
    ]

    static func names(in expression: String) -> Set<String> {
        var text = expression
        text = replacing(#""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"#, in: text)
        text = replacing(#"\{[^{}]*\}"#, in: text)
        text = replacing(#"\[[^\[\]]*\]"#, in: text)
        text = replacing(#"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)"#, in: text)
        let identifier = try! NSRegularExpression(pattern: #"(?<![A-Za-z0-9_:.$])[A-Za-z_:][A-Za-z0-9_:]*(?![A-Za-z0-9_:])"#)
        var names: Set<String> = []
        for match in identifier.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
            guard let range = Range(match.range, in: text) else { continue }
            let name = String(text[range])
            // A name followed by `(` is a function or an aggregation.
            let after = text[range.upperBound...].drop(while: { $0 == " " })
            if after.first == "(" || keywords.contains(name) { continue }
            names.insert(name)
        }
        return names
    }

    private static func replacing(_ pattern: String, in text: String) -> String {
        let regex = try! NSRegularExpression(pattern: pattern)
        var current = text
        // Nested-free patterns: repeat until nothing changes (e.g. `{…}` inside a range).
        while true {
            let next = regex.stringByReplacingMatches(in: current, range: NSRange(current.startIndex..., in: current), withTemplate: " ")
            if next == current { return current }
            current = next
        }
    }
}
