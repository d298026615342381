import HTTPTypes
import Hummingbird

/// Under `--dev` (no authentication, loopback only), a request must name the server by a loopback
/// name in `Host`: `localhost`, `127.0.0.1` or `[::1]`, with the server's port when it has one
/// fixed (403 `host_not_loopback` otherwise, before any route runs).
///
/// Rule: binding loopback alone does not keep a web page out. A page on `evil.example` whose name
/// the attacker re-points at 127.0.0.1 (DNS rebinding) is same-origin with the dev server for the
/// browser, and could sign offers; its requests carry `Host: evil.example:8080`, which this refuses.
struct DevelopmentHostMiddleware<Context: RequestContext>: RouterMiddleware {
    /// The configured port (0: picked at start, so any port is accepted).
    let port: Int

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard Self.isLoopback(request.head.authority, port: port) else {
            throw APIProblem(
                .forbidden, code: "host_not_loopback",
                detail: "--dev answers only requests addressed to localhost, 127.0.0.1 or [::1]")
        }
        return try await next(request, context)
    }

    /// Whether `host` (a `Host` value: name and optional port) names this server on loopback.
    static func isLoopback(_ host: String?, port: Int) -> Bool {
        guard let host else { return false }
        let name: Substring
        let portText: Substring?
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            name = host[...close]
            let rest = host[host.index(after: close)...]
            guard rest.isEmpty || rest.hasPrefix(":") else { return false }
            portText = rest.isEmpty ? nil : rest.dropFirst()
        } else if let colon = host.firstIndex(of: ":") {
            name = host[..<colon]
            portText = host[host.index(after: colon)...]
        } else {
            name = host[...]
            portText = nil
        }
        guard ["localhost", "127.0.0.1", "[::1]"].contains(name.lowercased()) else { return false }
        guard let portText else { return true }
        guard let given = Int(portText) else { return false }
        return port == 0 || given == port
    }
}
