import HTTPTypes
import Logging
import NIOCore
import NIOHTTPTypes

/// Closes a connection whose client keeps the server waiting: an open connection must deliver a
/// complete request (head and body) within `timeout` of starting to wait for one, that is, of
/// the connection opening, of the previous response being written, or of a request's head
/// arriving while an earlier request is still being answered.
///
/// Rule: the deadline is set when the server starts waiting for the client and is never moved
/// by bytes arriving, so a client that trickles a header or body a byte at a time is closed on
/// time like one that sends nothing. While every request received is complete and being
/// answered, no deadline runs (the server, not the client, is the slow one then).
///
/// Why a handler of our own: Hummingbird's `idleTimeout` restarts its timer on every request
/// part read, so a body sent a few bytes at a time (each within the timeout) keeps a connection,
/// and a request handler waiting on it, open without end.
final class RequestDeadlineHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let timeout: TimeAmount
    private let onTimeout: @Sendable () -> Void
    /// Requests whose head was read and whose response end was not written yet.
    private var requestsInProgress = 0
    /// A request head was read and its end was not.
    private var readingRequest = false
    /// When the current wait for the client ends; nil while the server is not waiting for it.
    private var waitEnds: NIODeadline?
    /// The one timer of the connection: it fires at or before `waitEnds` and, finding a later
    /// `waitEnds`, sets itself again. A wait that ends before the timer fires leaves it running,
    /// so a keep-alive connection costs one timer per `timeout`, not a timer scheduled and
    /// cancelled for every request (about 6,500 instructions a request).
    private var timer: Scheduled<Void>?

    /// - Parameter onTimeout: called (on the event loop) for every connection closed for its deadline.
    init(timeout: TimeAmount, onTimeout: @escaping @Sendable () -> Void) {
        self.timeout = timeout
        self.onTimeout = onTimeout
    }

    /// The server is waiting for the client: a request is partly read, or none is in progress.
    private var waitingForClient: Bool { readingRequest || requestsInProgress == 0 }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { update(context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        cancelTimer()
    }

    func channelActive(context: ChannelHandlerContext) {
        update(context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelTimer()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(var head):
            requestsInProgress += 1
            readingRequest = true
            // The operator's views and /admin limit wrong tokens per address (see `OperatorToken`):
            // they learn it from this header, which the caller cannot set. It is removed from
            // every request (whatever its path: the router also takes `//metrics` for
            // `/metrics`), and set only on those paths, so the signing path pays one scan of its
            // header names and no address formatting.
            let operatorPath = head.path.map(OperatorToken.isOperatorPath) ?? false
            if operatorPath || head.headerFields.contains(OperatorToken.peerField) {
                head.headerFields[OperatorToken.peerField] = nil
                if operatorPath {
                    head.headerFields[OperatorToken.peerField] = context.channel.remoteAddress?.ipAddress ?? "unknown"
                }
                update(context)
                context.fireChannelRead(wrapInboundOut(.head(head)))
                return
            }
        case .body:
            break
        case .end:
            readingRequest = false
        }
        update(context)
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) {
            requestsInProgress = max(0, requestsInProgress - 1)
            update(context)
        }
        context.write(data, promise: promise)
    }

    /// Starts a wait when the server begins waiting for the client (its end `timeout` from now),
    /// ends it when the server stops waiting.
    private func update(_ context: ChannelHandlerContext) {
        if waitingForClient {
            guard waitEnds == nil, context.channel.isActive else { return }
            let ends = NIODeadline.now() + timeout
            waitEnds = ends
            if timer == nil { arm(context, at: ends) }
        } else {
            waitEnds = nil
        }
    }

    /// Sets the timer for `deadline`; when it fires it closes the connection if the wait it
    /// finds has ended by then, and otherwise sets itself for that wait's end.
    private func arm(_ context: ChannelHandlerContext, at deadline: NIODeadline) {
        timer = context.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) {
            self.timer = nil
            guard let ends = self.waitEnds, self.waitingForClient, context.channel.isActive else { return }
            if ends <= NIODeadline.now() {
                self.onTimeout()
                context.close(promise: nil)
            } else {
                self.arm(context, at: ends)
            }
        }
    }

    private func cancelTimer() {
        timer?.cancel()
        timer = nil
        waitEnds = nil
    }
}

@available(*, unavailable)
extension RequestDeadlineHandler: Sendable {}
