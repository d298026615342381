import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Plain TCP sockets to a server on 127.0.0.1, for tests that must control exactly which bytes
/// reach the server and when (half-sent requests, trickled bytes, idle connections), and
/// one-shot HTTP/1.1 requests on a fresh connection each (no client-side connection reuse).
enum RawSocket {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// A blocking TCP connection to 127.0.0.1:`port`; reads time out after `receiveTimeout`.
    static func connect(port: Int, receiveTimeout: Duration = .seconds(30)) throws -> Int32 {
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socketFD >= 0 else { throw Failure(description: "socket() failed: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr = in_addr(s_addr: inet_addr("127.0.0.1"))
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let error = errno
            close(socketFD)
            throw Failure(description: "connect() to 127.0.0.1:\(port) failed: errno \(error)")
        }
        let (seconds, attoseconds) = receiveTimeout.components
        var timeout = timeval(tv_sec: Int(seconds), tv_usec: Int(attoseconds / 1_000_000_000_000))
        setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return socketFD
    }

    /// Sends all of `bytes` (never raising SIGPIPE); false when the connection refused them.
    @discardableResult
    static func send(_ socketFD: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(socketFD, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 && errno == EINTR { continue }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }

    @discardableResult
    static func send(_ socketFD: Int32, _ text: String) -> Bool { send(socketFD, Array(text.utf8)) }

    /// Reads until the server closes the connection (or the receive timeout passes).
    static func readToEnd(_ socketFD: Int32) -> [UInt8] {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(socketFD, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { break }
            received.append(contentsOf: buffer[0..<count])
        }
        return received
    }

    /// A response read off a socket.
    struct Response {
        var status: Int
        var headers: [String: String]
        var body: String

        var json: [String: Any] {
            (try? JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: Any]) ?? [:]
        }
    }

    /// The bytes of one HTTP/1.1 request to 127.0.0.1:`port` with `Connection: close`.
    static func requestBytes(port: Int, method: String, path: String, headers: [String: String] = [:], body: String = "") -> [UInt8] {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\nContent-Length: \(body.utf8.count)\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        return Array((head + "\r\n" + body).utf8)
    }

    /// One request on a connection of its own (`Connection: close`), read to the end.
    static func request(
        port: Int, method: String, path: String, headers: [String: String] = [:], body: String = "", timeout: Duration = .seconds(30)
    ) throws -> Response {
        let socketFD = try connect(port: port, receiveTimeout: timeout)
        defer { close(socketFD) }
        guard send(socketFD, requestBytes(port: port, method: method, path: path, headers: headers, body: body)) else {
            throw Failure(description: "the server refused the request's bytes")
        }
        return try parse(readToEnd(socketFD))
    }

    /// Parses a response with a `Content-Length` body.
    static func parse(_ bytes: [UInt8]) throws -> Response {
        let text = String(decoding: bytes, as: UTF8.self)
        guard let split = text.range(of: "\r\n\r\n") else { throw Failure(description: "no complete response head in \(text.prefix(200).debugDescription)") }
        let lines = text[..<split.lowerBound].components(separatedBy: "\r\n")
        let statusParts = lines[0].split(separator: " ")
        guard statusParts.count >= 2, let status = Int(statusParts[1]) else { throw Failure(description: "bad status line \(lines[0].debugDescription)") }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return Response(status: status, headers: headers, body: String(text[split.upperBound...]))
    }
}
