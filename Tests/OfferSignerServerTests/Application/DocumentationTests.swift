import Foundation
import Testing
import TestChildProcess

/// The README stays a front door (small), and no relative link in it or in `Docs/` is broken:
/// every linked file exists, and every `#anchor` names a heading of the linked Markdown file.
@Suite struct DocumentationTests {
    static let packageRoot = URL(fileURLWithPath: PythonTestEnvironment.packageRoot)

    static func markdownFiles() throws -> [URL] {
        let docs = packageRoot.appendingPathComponent("Docs")
        let names = try FileManager.default.contentsOfDirectory(atPath: docs.path).filter { $0.hasSuffix(".md") }.sorted()
        return [packageRoot.appendingPathComponent("README.md")] + names.map { docs.appendingPathComponent($0) }
    }

    /// The text outside fenced code blocks.
    static func prose(_ markdown: String) -> String {
        var inFence = false
        return markdown.split(separator: "\n", omittingEmptySubsequences: false).filter { line in
            if line.hasPrefix("```") { inFence.toggle(); return false }
            return !inFence
        }.joined(separator: "\n")
    }

    /// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens.
    static func anchor(_ heading: String) -> String {
        String(heading.lowercased().unicodeScalars.compactMap { scalar -> Character? in
            if scalar == " " { return "-" }
            if CharacterSet.alphanumerics.contains(scalar) || scalar == "-" || scalar == "_" { return Character(scalar) }
            return nil
        })
    }

    static func anchors(of markdown: String) -> Set<String> {
        Set(prose(markdown).split(separator: "\n").filter { $0.hasPrefix("#") }.map { line in
            anchor(line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces))
        })
    }

    @Test("README.md is at most 16 KiB")
    func readmeIsSmall() throws {
        let size = try #require(FileManager.default.attributesOfItem(atPath: Self.packageRoot.appendingPathComponent("README.md").path)[.size] as? Int)
        #expect(size <= 16384, "README.md is \(size) bytes; move depth into Docs/")
    }

    @Test("Every relative link in README.md and Docs/*.md resolves, anchors included")
    func relativeLinksResolve() throws {
        let link = try NSRegularExpression(pattern: #"\]\(([^)\s]+)\)"#)
        var checked = 0
        for file in try Self.markdownFiles() {
            let text = Self.prose(try String(contentsOf: file, encoding: .utf8))
            for match in link.matches(in: text, range: NSRange(text.startIndex..., in: text)) {
                guard let range = Range(match.range(at: 1), in: text) else { continue }
                let target = String(text[range])
                if target.contains("://") || target.hasPrefix("mailto:") { continue }
                checked += 1
                let parts = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                let linked = parts[0].isEmpty ? file : URL(fileURLWithPath: parts[0], relativeTo: file.deletingLastPathComponent()).standardizedFileURL
                #expect(FileManager.default.fileExists(atPath: linked.path), "\(file.lastPathComponent): link '\(target)' points at nothing")
                if parts.count == 2, linked.pathExtension == "md", let linkedText = try? String(contentsOf: linked, encoding: .utf8) {
                    #expect(Self.anchors(of: linkedText).contains(parts[1]), "\(file.lastPathComponent): link '\(target)' names no heading of \(linked.lastPathComponent)")
                }
            }
        }
        #expect(checked > 20, "the link scan found too few links")
    }

    @Test("Anchors follow GitHub's rules")
    func anchorRules() {
        #expect(Self.anchor("`explain` findings") == "explain-findings")
        #expect(Self.anchor("Goals (current)") == "goals-current")
        #expect(Self.anchor("`offer-signer serve`") == "offer-signer-serve")
    }
}
