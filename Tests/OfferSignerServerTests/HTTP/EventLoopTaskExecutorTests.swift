import Dispatch
import Hummingbird
import HummingbirdTesting
import NIOCore
import NIOPosix
import Testing

@testable import OfferSignerServer

/// `EventLoopTaskExecutor` and `EventLoopAffineChannel`: what runs on a connection's event loop,
/// and what does not.
@Suite("Work on the connection's event loop")
struct EventLoopTaskExecutorTests {
    @Test("A task preferring the loop runs there before and after each kind of wait, its child tasks too")
    func preferredWorkStaysOnTheLoop() async throws {
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let executor = EventLoopTaskExecutor(loop)
        let places = try await EventLoopTaskExecutor.$connection.withValue(executor) {
            try await EventLoopTaskExecutor.onConnectionLoop { () async throws -> [Bool] in
                var places = [loop.inEventLoop]
                try await Task.sleep(for: .milliseconds(5))
                places.append(loop.inEventLoop)
                // A wait another thread ends (as the audit committer ends a commit's).
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    DispatchQueue.global().async { continuation.resume() }
                }
                places.append(loop.inEventLoop)
                async let child = loop.inEventLoop
                places.append(await child)
                places.append(await withTaskGroup(of: Bool.self) { tasks in
                    tasks.addTask { loop.inEventLoop }
                    return await tasks.next() ?? false
                })
                return places
            }
        }
        #expect(places == [true, true, true, true, true])
        // Outside the preference, nothing runs on the loop.
        #expect(!loop.inEventLoop)
    }

    @Test("Without a connection (the CLI, a background job), the work runs where it was")
    func withoutAConnectionNothingMoves() async throws {
        #expect(EventLoopTaskExecutor.connection == nil)
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let onLoop = try await EventLoopTaskExecutor.onConnectionLoop { loop.inEventLoop }
        #expect(!onLoop)
    }

    @Test("A served request knows its connection's loop; an unstructured task started on the loop does not run there")
    func servedRequestsKnowTheirLoop() async throws {
        let router = Router()
        router.get("/where") { _, _ -> String in
            guard let connection = EventLoopTaskExecutor.connection else { return "none" }
            let before = connection.eventLoop.inEventLoop
            let (inside, unstructured) = try await EventLoopTaskExecutor.onConnectionLoop {
                (connection.eventLoop.inEventLoop, await Task { connection.eventLoop.inEventLoop }.value)
            }
            return "\(before) \(inside) \(unstructured)"
        }
        let application = Application(
            router: router, server: .eventLoopAffineHTTP1(configuration: .init()), configuration: .init(address: .hostname("127.0.0.1", port: 0)))
        try await application.test(.live) { client in
            for _ in 0..<3 {
                try await client.execute(uri: "/where", method: .get) { response in
                    #expect(response.status == .ok)
                    // The request itself runs on the global pool; the rules' work on the loop.
                    #expect(String(buffer: response.body) == "false true false")
                }
            }
        }
    }
}
