import Foundation

/// One `-----BEGIN LABEL----- … -----END LABEL-----` block, read tolerantly: CRLF or CR
/// line endings, a byte-order mark, surrounding and trailing whitespace and a missing final
/// newline are all accepted.
struct PEMDocument {
    var label: String
    var headers: [String]
    var der: [UInt8]

    enum Failure: Error {
        case notPEM
        case unterminated(label: String)
        case badBase64(label: String)
    }

    init(text: String) throws(Failure) {
        var normalized = text.replacingOccurrences(of: "\r\n", with: "\n").replacingOccurrences(of: "\r", with: "\n")
        if normalized.hasPrefix("\u{FEFF}") { normalized.removeFirst() }
        let lines = normalized.split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.trimmingCharacters(in: .whitespaces) }

        guard let beginIndex = lines.firstIndex(where: { $0.hasPrefix("-----BEGIN ") && $0.hasSuffix("-----") }) else {
            throw .notPEM
        }
        let beginLine = lines[beginIndex]
        let label = String(beginLine.dropFirst("-----BEGIN ".count).dropLast("-----".count))
        guard let endIndex = lines[(beginIndex + 1)...].firstIndex(of: "-----END \(label)-----") else {
            throw .unterminated(label: label)
        }
        var headers: [String] = []
        var base64 = ""
        for line in lines[(beginIndex + 1)..<endIndex] where !line.isEmpty {
            if line.contains(":") {
                headers.append(line)
            } else {
                base64 += line
            }
        }
        guard let data = Data(base64Encoded: base64), !data.isEmpty else { throw .badBase64(label: label) }
        self.label = label
        self.headers = headers
        self.der = Array(data)
    }

    /// Renders DER as PEM with 64-column lines and a final newline.
    static func render(label: String, der: some Sequence<UInt8>) -> String {
        let base64 = Data(der).base64EncodedString()
        var lines = ["-----BEGIN \(label)-----"]
        var index = base64.startIndex
        while index < base64.endIndex {
            let end = base64.index(index, offsetBy: 64, limitedBy: base64.endIndex) ?? base64.endIndex
            lines.append(String(base64[index..<end]))
            index = end
        }
        lines.append("-----END \(label)-----")
        return lines.joined(separator: "\n") + "\n"
    }
}
