import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Logging
import Synchronization
import TestChildProcess
import Testing

@testable import OfferSignerServer

#if canImport(Glibc)
import Glibc
#endif

/// Attacks by a caller with no credential at all, on the real server over loopback.
@Suite("Attacks by an unauthenticated caller: DNS rebinding, enumeration, log flooding", .serialized)
struct UnauthenticatedCallerTests {
    /// One request with exactly the `Host` given (RawSocket.request always sends its own).
    static func request(port: Int, host: String, body: String) throws -> RawSocket.Response {
        let socket = try RawSocket.connect(port: port)
        defer { close(socket) }
        let text = "POST /v1/offers/signatures HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        guard RawSocket.send(socket, text) else { throw RawSocket.Failure(description: "send failed") }
        return try RawSocket.parse(RawSocket.readToEnd(socket))
    }

    @Test("DNS rebinding against serve --dev: a page at evil.example re-pointed at 127.0.0.1 gets 403 host_not_loopback; loopback names sign")
    func devRefusesForeignHost() async throws {
        let server = try await TestServer { $0.developmentMode = true }
        defer { server.cleanUp() }
        try await server.live { client in
            let port = try #require(client.port)
            let body = #"{"productID":"pro.monthly","offerID":"WINBACK50","appAccountToken":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#
            for host in ["evil.example:\(port)", "evil.example", "127.0.0.1.evil.example:\(port)", "localhost.evil.example", "[::2]:\(port)"] {
                let refused = try await onOwnThread { try Self.request(port: port, host: host, body: body) }
                #expect(refused.status == 403, "\(host): \(refused.body)")
                #expect(refused.json["code"] as? String == "host_not_loopback", "\(host)")
            }
            for host in ["127.0.0.1:\(port)", "localhost:\(port)", "LOCALHOST", "[::1]:\(port)"] {
                let signed = try await onOwnThread { try Self.request(port: port, host: host, body: body) }
                #expect(signed.status == 201, "\(host): \(signed.body)")
            }
        }
        #expect(try server.issuedCount() == 4)
        #expect(DevelopmentHostMiddleware<BasicRequestContextForTests>.isLoopback("localhost:8080", port: 8080))
        #expect(!DevelopmentHostMiddleware<BasicRequestContextForTests>.isLoopback("localhost:8081", port: 8080))
        #expect(!DevelopmentHostMiddleware<BasicRequestContextForTests>.isLoopback(nil, port: 0))
    }

    @Test("Enumeration: /metrics names bundles and offers, so it needs the operator token; unauthenticated errors name no bundle")
    func noEnumeration() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            #expect(try await client.postJSON("/v1/offers/signatures", #"{"productID":"pro.monthly","offerID":"SECRET_OFFER"}"#, bearer: secret).status == .created)
            let anonymous = try await client.execute(uri: "/metrics", method: .get)
            expectProblem(anonymous, .unauthorized, "unauthorized")
            #expect(!anonymous.text.contains("com.example.app") && !anonymous.text.contains("SECRET_OFFER"))
            let wrong = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(secret)"])
            expectProblem(wrong, .unauthorized, "unauthorized")
            let operatorView = try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"])
            #expect(operatorView.status == .ok)
            #expect(operatorView.text.contains("SECRET_OFFER"), "the operator sees the offers")
            // Guessing bundles without a credential: every guess gets the same 401.
            for bundle in ["com.example.app", "com.example.nonexistent"] {
                let guess = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","bundleID":"\#(bundle)"}"#)
                expectProblem(guess, .unauthorized, "unauthorized")
                #expect(!guess.text.contains(bundle))
            }
            let readiness = try await client.execute(uri: "/readyz", method: .get)
            #expect(!readiness.text.contains("com.example.app"))
        }
    }

    /// Collects every log line.
    final class Lines: Sendable {
        let lines = Mutex<[(message: String, metadata: Logger.Metadata)]>([])
    }

    struct CollectingHandler: LogHandler {
        let lines: Lines
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .notice
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            lines.lines.withLock { $0.append((event.message.description, event.metadata ?? [:])) }
        }
    }

    @Test("Log flooding: 300 unauthenticated requests write at most 20 'request refused' lines a second, and the next line says how many were left out")
    func refusalLogIsRateLimited() async throws {
        let lines = Lines()
        let server = try await TestServer { configuration in
            var logger = Logger(label: "offer-signer-test") { _ in CollectingHandler(lines: lines) }
            logger.logLevel = .notice
            configuration.logger = logger
        }
        defer { server.cleanUp() }
        try await server.live { client in
            let start = ContinuousClock.now
            for _ in 0..<300 {
                _ = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#, bearer: "os_guess_\(UUID().uuidString)")
            }
            let seconds = Int((ContinuousClock.now - start).components.seconds) + 1
            let refused = lines.lines.withLock { $0.filter { $0.message == "request refused" } }
            #expect(refused.count <= 20 * (seconds + 1), "\(refused.count) lines in about \(seconds) s")
            #expect(refused.count >= 20)
            // A second later, the next refusal is logged with the count of those left out.
            try await Task.sleep(for: .milliseconds(1100))
            _ = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o"}"#)
            // Nothing is lost from the count: every refusal is either a line or counted in the
            // `suppressed_before` of the next line (however the 301 refusals fell into one-second
            // windows on a loaded machine).
            let all = lines.lines.withLock { $0.filter { $0.message == "request refused" } }
            let suppressed = all.compactMap { $0.metadata["suppressed_before"].map { "\($0)" }.flatMap(Int.init) }.reduce(0, +)
            #expect(all.count + suppressed == 301, "\(all.count) lines, \(suppressed) left out")
            if refused.count < 300 { #expect(suppressed > 0) }
        }
    }

    @Test("Guessing the operator token: after 10 wrong tokens from one address the next are 429 rate_limited; a header naming another address does not help, also on //metrics (which the router takes for /metrics); the right token works while the address is throttled")
    func operatorTokenGuessesAreThrottled() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        try await server.live { client in
            var statuses: [Int] = []
            for index in 0..<40 {
                let path = ["/metrics", "/readyz?detail", "//metrics", "//readyz?detail"][index % 4]
                // The attacker also claims another address in the header the server sets itself.
                let answer = try await client.execute(
                    uri: path, method: .get,
                    headers: [.authorization: "Bearer guess-\(index)-0123456789abcdef0123456789", HTTPField.Name("x-offer-signer-peer")!: "10.0.0.\(index)"])
                statuses.append(Int(answer.status.code))
                if answer.status == .tooManyRequests {
                    #expect(answer.json["code"] as? String == "rate_limited")
                    #expect(answer.headers[.retryAfter] != nil)
                }
            }
            #expect(statuses.prefix(10).allSatisfy { $0 == 401 }, "\(statuses)")
            #expect(statuses.filter { $0 == 429 }.count >= 20, "throttled: \(statuses)")
            // No bearer at all is no guess: still 401, not counted.
            #expect(try await client.execute(uri: "/metrics", method: .get).status == .unauthorized)
            // The address is throttled (a wrong token is refused 429) and the right token still works.
            // An allowance comes back every second, which a loaded machine can take between two
            // requests: a wrong token at //metrics, each naming another address, is answered 429
            // within three tries.
            var throttled = false
            for index in 0..<3 where !throttled {
                let answer = try await client.execute(
                    uri: "//metrics", method: .get,
                    headers: [.authorization: "Bearer guess-x\(index)-0123456789abcdef0123456789", HTTPField.Name("x-offer-signer-peer")!: "10.9.9.\(index)"])
                throttled = answer.status == .tooManyRequests
            }
            #expect(throttled, "a wrong token at //metrics was never refused 429")
            #expect(try await client.execute(uri: "/metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).status == .ok)
            #expect(try await client.execute(uri: "//metrics", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).status == .ok)
            // A right token is not counted against the address.
            for _ in 0..<20 {
                #expect(try await client.execute(uri: "/readyz?detail", method: .get, headers: [.authorization: "Bearer \(TestServer.operatorSecret)"]).status == .ok)
            }
        }
    }

    @Test("The refusal log limiter: at most N a second, then a count of those left out")
    func refusalLogLimiter() {
        let limiter = RefusalLogLimiter(linesPerSecond: 3)
        let start = ContinuousClock.now
        #expect((0..<3).map { _ in limiter.admit(at: start) } == Array(repeating: .log(suppressedBefore: 0), count: 3))
        #expect(limiter.admit(at: start + .milliseconds(500)) == .suppress)
        #expect(limiter.admit(at: start + .milliseconds(900)) == .suppress)
        #expect(limiter.admit(at: start + .seconds(1)) == .log(suppressedBefore: 2))
        #expect(limiter.admit(at: start + .seconds(1)) == .log(suppressedBefore: 0))
    }
}

/// A request context type to name `DevelopmentHostMiddleware`'s static helper.
typealias BasicRequestContextForTests = Hummingbird.BasicRequestContext
