import Foundation
import OfferSignerStorage

/// Where and how to reach the PostgreSQL store, parsed from a URL
/// `postgres://user[:password]@host[:port]/database[?sslmode=…&sslrootcert=…]` (`postgresql://`
/// too).
///
/// Rules:
/// - The password comes from the URL, else `PGPASSWORD` in the given environment, else the
///   password file's contents handed in by the caller; never from anywhere global.
/// - The password never appears in ``redactedDescription``, in ``description`` or in any error
///   this type throws (a malformed URL is described by what is wrong with it, never echoed).
/// - `sslmode`: `disable` (plain TCP), `prefer` (TLS when the server offers it, unverified),
///   `require` (TLS, certificate not verified), `verify-full` (TLS, certificate chain and host
///   name verified, against `sslrootcert` when given, else the system's roots). Anything else is
///   refused. Without `sslmode` the mode is `verify-full`, except for a loopback host
///   (`localhost`, 127.0.0.0/8, `::1`) or a Unix socket directory (a host starting with `/`),
///   where it is `prefer`: libpq's default `prefer` lets an active attacker on the network
///   downgrade the connection to plain TCP and read the password. `require` stays possible, and
///   is warned about when the store opens (see ``weakTLSWarning``).
public struct PostgresStoreConfiguration: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    public enum TLSMode: String, Sendable, Equatable, CaseIterable {
        case disable
        case prefer
        case require
        case verifyFull = "verify-full"
    }

    public var host: String
    public var port: Int
    public var username: String
    public var password: String?
    public var database: String
    public var tlsMode: TLSMode
    /// A PEM file of CA certificates to verify the server against (`sslrootcert`), for `verify-full`.
    public var rootCertificatePath: String?
    /// Connections the store's pool may open (4 to 1000).
    public var poolSize: Int
    /// Whether the pool opens all its connections at once and keeps them open while idle (`serve`
    /// does; a command that makes a few calls opens them as it needs them). PostgresNIO opens at
    /// most 20 connections at a time and none for a request that queued meanwhile: a burst of
    /// more requests than that, each holding a customer lock while it waits for an audit commit
    /// queued behind them, would wait until timeouts freed connections. An open pool never has
    /// to open connections for a burst.
    public var keepsPoolOpen = false
    /// How long any one store operation may take before it fails with `StoreError.unavailable`.
    public var operationTimeout: Duration
    /// How long opening one connection may take.
    public var connectTimeout: Duration

    public static let defaultPoolSize = 10
    public static let defaultPort = 5432

    /// Whether `text` is a PostgreSQL URL (rather than a SQLite path).
    public static func isPostgresURL(_ text: String) -> Bool {
        let lower = text.lowercased()
        return lower.hasPrefix("postgres://") || lower.hasPrefix("postgresql://")
    }

    /// A problem with the URL or the settings; its message never contains the password.
    public struct InvalidConfiguration: Error, Sendable, Equatable, CustomStringConvertible {
        public var message: String
        public var description: String { message }
        init(_ message: String) { self.message = message }
    }

    /// Parses `url`.
    /// - Parameters:
    ///   - environment: where `PGPASSWORD` is looked up when the URL has no password.
    ///   - passwordFileContents: the password file's contents (trailing newline trimmed), used when
    ///     neither the URL nor `PGPASSWORD` gives one.
    public init(
        url: String, environment: [String: String] = [:], passwordFileContents: String? = nil, poolSize: Int = Self.defaultPoolSize,
        operationTimeout: Duration = .seconds(15), connectTimeout: Duration = .seconds(5)
    ) throws(InvalidConfiguration) {
        let malformed = "the store URL is not a valid PostgreSQL URL (postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require|verify-full])"
        let lower = url.lowercased()
        let rest: Substring
        if lower.hasPrefix("postgresql://") {
            rest = url.dropFirst("postgresql://".count)
        } else if lower.hasPrefix("postgres://") {
            rest = url.dropFirst("postgres://".count)
        } else {
            throw InvalidConfiguration("\(malformed): it must start with postgres:// or postgresql://")
        }
        let (main, query) = Self.split(rest, at: "?", last: false)
        guard let slash = main.firstIndex(of: "/") else { throw InvalidConfiguration("\(malformed): it names no database (…/database)") }
        let authority = main[main.startIndex..<slash]
        let path = main[main.index(after: slash)...]
        guard let at = authority.lastIndex(of: "@") else { throw InvalidConfiguration("\(malformed): it names no user (user@host)") }
        let userInfo = authority[authority.startIndex..<at]
        let hostPort = authority[authority.index(after: at)...]

        let (userPart, passwordPart) = Self.split(userInfo, at: ":", last: false)
        guard let user = Self.percentDecoded(userPart), !user.isEmpty else { throw InvalidConfiguration("\(malformed): the user name is empty or badly percent-encoded") }
        var password: String?
        if let passwordPart {
            guard let decoded = Self.percentDecoded(passwordPart) else { throw InvalidConfiguration("\(malformed): the password is badly percent-encoded") }
            password = decoded
        }

        var host: String
        var portText: Substring?
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else { throw InvalidConfiguration("\(malformed): an IPv6 host needs a closing ]") }
            host = String(hostPort[hostPort.index(after: hostPort.startIndex)..<close])
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw InvalidConfiguration("\(malformed): unexpected text after the IPv6 host") }
                portText = after.dropFirst()
            }
        } else {
            let (hostPart, port) = Self.split(hostPort, at: ":", last: true)
            host = String(hostPart)
            portText = port
        }
        guard !host.isEmpty else { throw InvalidConfiguration("\(malformed): it names no host") }
        var port = Self.defaultPort
        if let portText {
            guard let value = Int(portText), (1...65535).contains(value) else {
                throw InvalidConfiguration("\(malformed): the port must be a number from 1 to 65535")
            }
            port = value
        }
        guard let database = Self.percentDecoded(path), !database.isEmpty, !database.contains("/") else {
            throw InvalidConfiguration("\(malformed): it names no database (…/database)")
        }

        var tlsMode = Self.isLocal(host: host) ? TLSMode.prefer : .verifyFull
        var rootCertificatePath: String?
        if let query, !query.isEmpty {
            for parameter in query.split(separator: "&", omittingEmptySubsequences: true) {
                let (namePart, valuePart) = Self.split(parameter, at: "=", last: false)
                guard let name = Self.percentDecoded(namePart), let value = valuePart.flatMap({ Self.percentDecoded($0) }) else {
                    throw InvalidConfiguration("\(malformed): a query parameter is not name=value")
                }
                switch name {
                case "sslmode":
                    guard let mode = TLSMode(rawValue: value) else {
                        throw InvalidConfiguration("the store URL's sslmode '\(value)' is not supported; use disable, prefer, require or verify-full")
                    }
                    tlsMode = mode
                case "sslrootcert":
                    rootCertificatePath = value
                default:
                    throw InvalidConfiguration("the store URL's parameter '\(name)' is not supported; the supported ones are sslmode and sslrootcert")
                }
            }
        }
        if rootCertificatePath != nil && tlsMode != .verifyFull {
            throw InvalidConfiguration("the store URL gives sslrootcert, which only sslmode=verify-full uses")
        }
        // Four at least: one listens for registry changes, a request holds its customer lock (and
        // reads) on another, the audit commit it waits for needs a third, and the audit
        // checkpoint writer (its lock, then its write) or a readiness check the fourth.
        guard poolSize >= 4 && poolSize <= 1000 else { throw InvalidConfiguration("the store pool size must be from 4 to 1000; got \(poolSize)") }

        if password == nil, let fromEnvironment = environment["PGPASSWORD"], !fromEnvironment.isEmpty {
            password = fromEnvironment
        }
        if password == nil, let passwordFileContents {
            let trimmed = passwordFileContents.hasSuffix("\r\n")
                ? String(passwordFileContents.dropLast(2))
                : passwordFileContents.hasSuffix("\n") ? String(passwordFileContents.dropLast()) : passwordFileContents
            guard !trimmed.isEmpty else { throw InvalidConfiguration("the store password file is empty") }
            password = trimmed
        }

        self.host = host
        self.port = port
        self.username = user
        self.password = password
        self.database = database
        self.tlsMode = tlsMode
        self.rootCertificatePath = rootCertificatePath
        self.poolSize = poolSize
        self.operationTimeout = operationTimeout
        self.connectTimeout = connectTimeout
    }

    /// The URL without its password (`***` where one was given), for logs and messages.
    public var redactedDescription: String {
        let hostText = host.contains(":") ? "[\(host)]" : host
        var text = "postgres://\(Self.percentEncoded(username))"
        if password != nil { text += ":***" }
        text += "@\(hostText):\(port)/\(Self.percentEncoded(database))?sslmode=\(tlsMode.rawValue)"
        if let rootCertificatePath { text += "&sslrootcert=\(Self.percentEncoded(rootCertificatePath))" }
        return text
    }

    public var description: String { redactedDescription }
    public var debugDescription: String { redactedDescription }

    /// What `dump` and debuggers show: every setting, the password as "redacted".
    public var customMirror: Mirror {
        Mirror(self, children: [
            "host": host, "port": port, "username": username, "password": password == nil ? "none" : "redacted", "database": database,
            "tlsMode": tlsMode.rawValue, "rootCertificatePath": rootCertificatePath as Any, "poolSize": poolSize,
            "operationTimeout": operationTimeout, "connectTimeout": connectTimeout,
        ])
    }

    /// Whether `host` is reached without crossing a network: a loopback name or address, or a
    /// Unix socket directory.
    public static func isLocal(host: String) -> Bool {
        let lower = host.lowercased()
        return lower == "localhost" || lower.hasSuffix(".localhost") || lower == "::1" || lower == "[::1]" || isIPv4Loopback(lower) || host.hasPrefix("/")
    }

    /// An IPv4 address in 127.0.0.0/8 written as one (four decimal parts of 0–255): a DNS name
    /// such as `127.db.example.net` is not loopback, and gets the remote default.
    static func isIPv4Loopback(_ host: String) -> Bool {
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4, parts[0] == "127" else { return false }
        return parts.allSatisfy { part in part.count <= 3 && !part.isEmpty && part.allSatisfy(\.isASCII) && UInt8(part) != nil }
    }

    /// What to warn about at start, when the connection to a database across the network can be
    /// read or altered by someone on the path (nil for `verify-full`, or a local host).
    public var weakTLSWarning: String? {
        guard tlsMode != .verifyFull, !Self.isLocal(host: host) else { return nil }
        switch tlsMode {
        case .require:
            return "sslmode=require encrypts the connection to \(host) but does not verify the server's certificate: an active attacker on the path can impersonate the database and read the password and every record; use sslmode=verify-full (with sslrootcert for a private CA)"
        case .prefer, .disable:
            return "sslmode=\(tlsMode.rawValue) lets an attacker on the path to \(host) read the password and every record; use sslmode=verify-full (with sslrootcert for a private CA)"
        case .verifyFull:
            return nil
        }
    }

    /// Splits at the first (or last) `separator`; the second part is nil when there is none.
    private static func split(_ text: Substring, at separator: Character, last: Bool) -> (Substring, Substring?) {
        guard let index = last ? text.lastIndex(of: separator) : text.firstIndex(of: separator) else { return (text, nil) }
        return (text[text.startIndex..<index], text[text.index(after: index)...])
    }

    private static func percentDecoded(_ text: Substring) -> String? {
        String(text).removingPercentEncoding
    }

    private static func percentEncoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~/")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}
