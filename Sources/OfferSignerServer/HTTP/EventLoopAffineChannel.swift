import HummingbirdCore
import Logging
import NIOCore

/// Makes each connection's event loop known to the work its requests do
/// (``EventLoopTaskExecutor/connection``), so work with many waits in a row can run there.
///
/// Rule: the task that reads a connection's requests and answers them (Hummingbird's
/// `handle(value:logger:)`) carries, as a task-local value, an executor for the event loop the
/// connection's socket is on. Nothing moves by itself: a request still runs on the global
/// concurrent pool unless its handler asks for the loop (``EventLoopTaskExecutor/onConnectionLoop(_:)``).
///
/// Why opt-in: with every request on its loop (`withTaskExecutorPreference` around the whole
/// connection), a decision on stored history was about 15% faster and an Apple lookup about 8%
/// cheaper, but plain signing lost about 6% at saturation (each hop back to the generic executor
/// looks the preference up under the task's status lock), measured with
/// `../shared/bench/compare.sh` and `Scripts/benchmark-stored-history.sh` (Docs/Performance.md).
struct EventLoopAffineChannel<Base: ServerChildChannel>: ServerChildChannel {
    typealias Value = Base.Value

    let base: Base

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        base.setup(channel: channel, logger: logger)
    }

    func handle(value: Value, logger: Logger) async {
        await EventLoopTaskExecutor.$connection.withValue(EventLoopTaskExecutor(value.channel.eventLoop)) {
            await base.handle(value: value, logger: logger)
        }
    }
}

extension EventLoopAffineChannel: HTTPChannelHandler where Base: HTTPChannelHandler {
    var responder: HTTPChannelHandler.Responder { base.responder }
}

/// A `TaskExecutor` that runs each job on one NIO event loop, in the order enqueued.
///
/// Rule: a task preferring it (SE-0417), its child tasks and the default actors it calls run on
/// the loop's thread, before and after every suspension, whichever thread resumes them; an
/// unstructured `Task {}` it starts does not (it runs on the global pool). Work that blocks a
/// thread there blocks the connection's loop: only the stores' bounded point reads do.
final class EventLoopTaskExecutor: TaskExecutor {
    /// The executor of the event loop of the connection whose request this task serves; nil
    /// outside a request (the CLI, background services).
    @TaskLocal static var connection: EventLoopTaskExecutor?

    /// Runs `body` preferring the current connection's event loop; outside a request, where it is.
    static func onConnectionLoop<T: Sendable>(_ body: () async throws -> T) async throws -> T {
        guard let executor = connection else { return try await body() }
        return try await withTaskExecutorPreference(executor, operation: body)
    }

    let eventLoop: any EventLoop

    init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
        }
    }
}

extension HTTPServerBuilder {
    /// HTTP/1.1 with each connection served on its own event loop (``EventLoopAffineChannel``).
    static func eventLoopAffineHTTP1(configuration: HTTP1Channel.Configuration) -> HTTPServerBuilder {
        .init { responder in
            EventLoopAffineChannel(base: HTTP1Channel(responder: responder, configuration: configuration))
        }
    }
}
