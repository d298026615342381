import Foundation
import Logging
import Synchronization
import Testing

@testable import OfferSignerServer

@Suite struct StandardErrorLogHandlerTests {
    /// Counts how often it is rendered into text.
    final class RenderCounter: CustomStringConvertible, Sendable {
        let renders = Atomic<Int>(0)
        var description: String {
            renders.add(1, ordering: .relaxed)
            return "5951ae5423b30a17"
        }
    }

    /// Hummingbird sets a request ID on every request's logger; at `warning` nothing prints it,
    /// so it must never be rendered.
    @Test func metadataIsRenderedOnlyForLinesThatAreWritten() {
        let counter = RenderCounter()
        var logger = Logger(label: "offer-signer-test") { StandardErrorLogHandler(label: $0, logLevel: .warning, metadataProvider: nil) }
        logger[metadataKey: "hb.request.id"] = .stringConvertible(counter)
        logger[metadataKey: "other"] = "value"
        logger.info("signature issued")
        logger.debug("detail")
        #expect(counter.renders.load(ordering: .relaxed) == 0)
    }

    @Test func linesKeepStreamLogHandlersFormat() {
        var handler = StandardErrorLogHandler(label: "offer-signer", logLevel: .info, metadataProvider: nil)
        handler[metadataKey: "hb.request.id"] = "abc"
        handler[metadataKey: "bundle_id"] = "com.example.app"
        let line = handler.line(for: LogEvent(
            level: .warning, message: "audit commit slow", metadata: ["bundle_id": "com.example.other", "key_id": "K1"],
            source: "OfferSignerServer", file: #fileID, function: #function, line: #line))
        let pattern = #/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} warning offer-signer: bundle_id=com\.example\.other hb\.request\.id=abc key_id=K1 \[OfferSignerServer\] audit commit slow\n$/#
        #expect(line.wholeMatch(of: pattern) != nil, "\(line.debugDescription)")
    }
}
