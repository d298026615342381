import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Loopback TCP ports for servers the tests start as child processes (`serve`, PostgreSQL).
///
/// Rule: a port is chosen **outside the kernel's ephemeral range**
/// (`/proc/sys/net/ipv4/ip_local_port_range`, 32768–60999 on Debian). Asking the kernel for a free
/// port (`bind` to port 0) returns one from that range, and between closing that socket and the
/// child's own `bind` any of the run's other tests may be given the same port, by its own port-0
/// server or as the local end of an outgoing connection (a full CI run saw `serve` exit for a port
/// taken meanwhile). Outside the range the kernel never hands a port out by itself, so only another
/// test choosing at random in the same thousands of ports could collide.
public enum LoopbackPort {
    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// A port on 127.0.0.1 that nothing is bound to now, outside the ephemeral range, and not one
    /// of `excluding` (ports chosen before and not bound yet).
    public static func free(excluding: Set<Int> = []) throws -> Int {
        let candidates = candidateRange()
        for _ in 0..<200 {
            let port = Int.random(in: candidates)
            if !excluding.contains(port), isBindable(port) { return port }
        }
        throw Failure(description: "no free loopback port in \(candidates) after 200 tries")
    }

    /// The ports to choose from: those below the ephemeral range down to 10000 or, when the range
    /// starts too low for that, those above it. (A machine whose ephemeral range covers nearly all
    /// ports, `1024 65535` say, leaves none outside it: then any port is a candidate, and the race
    /// this type avoids is back, as with port 0.)
    static func candidateRange() -> ClosedRange<Int> {
        var ephemeral = 32768...60999
        if let text = try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8) {
            let bounds = text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).compactMap { Int($0) }
            if bounds.count == 2, bounds[0] <= bounds[1] { ephemeral = bounds[0]...bounds[1] }
        }
        if ephemeral.lowerBound - 1 >= 10000 + 1000 { return 10000...(ephemeral.lowerBound - 1) }
        if ephemeral.upperBound + 1 <= 65535 - 1000 { return (ephemeral.upperBound + 1)...65535 }
        return 1024...65535
    }

    /// Whether 127.0.0.1:`port` can be bound now (without `SO_REUSEADDR`, so a port with a
    /// connection in TIME_WAIT counts as taken too).
    static func isBindable(_ port: Int) -> Bool {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { return false }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        return bound == 0
    }
}
