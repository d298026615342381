#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Logging

/// Writes log lines to standard error in swift-log's `StreamLogHandler` format
/// (`<time> <level> <label>: <key=value …> [<source>] <message>`), but formats metadata only
/// for lines that are actually written.
///
/// Rule: setting metadata costs nothing beyond storing it. `StreamLogHandler` renders all of a
/// logger's metadata into text every time a key is set, and Hummingbird sets the request ID
/// on every request's logger, so at `warning` the service paid for formatting every request
/// ID it would never print (about 3% of server CPU under load).
public struct StandardErrorLogHandler: LogHandler {
    public var logLevel: Logger.Level
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?
    private let label: String

    public init(label: String, logLevel: Logger.Level, metadataProvider: Logger.MetadataProvider? = LoggingSystem.metadataProvider) {
        self.label = label
        self.logLevel = logLevel
        self.metadataProvider = metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        Self.emit(line(for: event))
    }

    /// The text written for `event`, newline included. Metadata from the handler, then the
    /// metadata provider, then the log statement (later ones win), then the error if any;
    /// keys sorted.
    func line(for event: LogEvent) -> String {
        var effective = metadata
        if let provided = metadataProvider?.get(), !provided.isEmpty {
            effective.merge(provided) { _, provided in provided }
        }
        if let explicit = event.metadata, !explicit.isEmpty {
            effective.merge(explicit) { _, explicit in explicit }
        }
        if let error = event.error {
            effective["error.message"] = "\(error)"
            effective["error.type"] = "\(String(reflecting: type(of: error)))"
        }
        var line = Self.timestamp()
        line += " \(event.level)"
        if !label.isEmpty { line += " \(label)" }
        line += ":"
        if !effective.isEmpty {
            line += " " + effective.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        line += " [\(event.source)] \(event.message)\n"
        return line
    }

    /// One `write(2)` per line, so lines from concurrent requests never interleave.
    private static func emit(_ line: String) {
        var line = line
        line.withUTF8 { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = write(2, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return
                }
                offset += written
            }
        }
    }

    /// Local time, as `StreamLogHandler` writes it (`2026-11-23T21:40:00+0000`).
    private static func timestamp() -> String {
        var now = time(nil)
        var local = tm()
        localtime_r(&now, &local)
        var buffer = [Int8](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &local)
        return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
