import NIOCore
import NIOPosix
import Synchronization

/// A TCP proxy on loopback whose connections can be frozen: a frozen connection forwards nothing
/// more in either direction and is never closed, which is how a database that vanished without a
/// reset looks to its clients (a failover that moved its address, a dropped NAT entry: no RST, so
/// TCP retries for about 15 minutes). Connections made after a freeze are forwarded normally, as
/// to the database at its new address.
final class FreezableProxy: Sendable {
    /// The port the proxy listens on (127.0.0.1).
    let port: Int
    private let listener: any Channel
    private let group: MultiThreadedEventLoopGroup
    private let registry: Registry

    /// Every pair made so far.
    private final class Registry: Sendable {
        let pairs = Mutex<[Pair]>([])
    }

    /// One client connection and its connection to the target.
    final class Pair: Sendable {
        let frozen = Atomic<Bool>(false)
        let channels = Mutex<[any Channel]>([])
    }

    private init(port: Int, listener: any Channel, group: MultiThreadedEventLoopGroup, registry: Registry) {
        self.port = port
        self.listener = listener
        self.group = group
        self.registry = registry
    }

    /// Starts a proxy to `host`:`targetPort`.
    static func start(to host: String, port targetPort: Int) async throws -> FreezableProxy {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let registry = Registry()
        let listener = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            // Nothing is read from a client before its connection to the target is up.
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { inbound in
                let pair = Pair()
                registry.pairs.withLock { $0.append(pair) }
                let toTarget = Relay(pair: pair)
                return ClientBootstrap(group: inbound.eventLoop)
                    .channelInitializer { outbound in
                        outbound.pipeline.addHandler(Relay(pair: pair, partner: inbound))
                    }
                    .connect(host: host, port: targetPort)
                    .flatMap { outbound in
                        toTarget.partner = outbound
                        pair.channels.withLock { $0 = [inbound, outbound] }
                        return inbound.pipeline.addHandler(toTarget).map { inbound.read() }
                    }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
        return FreezableProxy(port: listener.localAddress?.port ?? 0, listener: listener, group: group, registry: registry)
    }

    /// Freezes every connection open now; later ones are forwarded.
    func freezeExisting() {
        for pair in registry.pairs.withLock({ $0 }) { pair.frozen.store(true, ordering: .sequentiallyConsistent) }
    }

    /// Connections opened through the proxy so far.
    var connectionCount: Int { registry.pairs.withLock { $0.count } }

    func stop() async {
        for pair in registry.pairs.withLock({ $0 }) {
            for channel in pair.channels.withLock({ $0 }) { try? await channel.close() }
        }
        try? await listener.close()
        try? await group.shutdownGracefully()
    }

    /// Forwards what one side reads to the other, until the pair is frozen (then drops it, and
    /// never closes the other side).
    private final class Relay: ChannelInboundHandler, @unchecked Sendable {
        // Both channels of a pair run on one event loop, so `partner` is only touched there.
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        let pair: Pair
        var partner: (any Channel)?

        init(pair: Pair, partner: (any Channel)? = nil) {
            self.pair = pair
            self.partner = partner
        }

        func channelActive(context: ChannelHandlerContext) {
            context.read()
            context.fireChannelActive()
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard !pair.frozen.load(ordering: .sequentiallyConsistent), let partner else { return }
            partner.writeAndFlush(unwrapInboundIn(data), promise: nil)
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            context.read()
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !pair.frozen.load(ordering: .sequentiallyConsistent) { partner?.close(promise: nil) }
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
