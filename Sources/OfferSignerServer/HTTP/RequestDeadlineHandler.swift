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
    private var deadline: Scheduled<Void>?

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
        cancelDeadline()
    }

    func channelActive(context: ChannelHandlerContext) {
        update(context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        cancelDeadline()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(var head):
            requestsInProgress += 1
            readingRequest = true
            // The operator's views limit wrong tokens per address (see `OperatorToken`): they
            // learn it from this header, which the caller cannot set.
            if let path = head.path, OperatorToken.isOperatorPath(path) {
                head.headerFields[OperatorToken.peerField] = nil
                head.headerFields[OperatorToken.peerField] = context.channel.remoteAddress?.ipAddress ?? "unknown"
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

    /// Starts the deadline when the server begins waiting for the client, cancels it when it stops.
    private func update(_ context: ChannelHandlerContext) {
        if waitingForClient {
            guard deadline == nil, context.channel.isActive else { return }
            deadline = context.eventLoop.assumeIsolated().scheduleTask(in: timeout) {
                self.deadline = nil
                guard self.waitingForClient else { return }
                self.onTimeout()
                context.close(promise: nil)
            }
        } else {
            cancelDeadline()
        }
    }

    private func cancelDeadline() {
        deadline?.cancel()
        deadline = nil
    }
}

@available(*, unavailable)
extension RequestDeadlineHandler: Sendable {}
