import Foundation
import Synchronization

/// What this instance answered to Retention Messaging since it started, for the operator's
/// dashboard (`/admin/retention`): answers per product and type, fallbacks by reason, and the
/// latencies of the latest answers. In memory and per instance (as `/metrics`): a restart starts
/// from nothing, and with several instances each shows its own.
///
/// Rule: bounded whatever the traffic: at most ``maximumProducts`` product IDs (the catalog's; an
/// unknown product is counted as `other`), and the latencies of the last ``latencySamples``
/// answers. Recording is one short lock per answer, on the Retention Messaging path only.
final class RetentionActivity: Sendable {
    static let maximumProducts = 200
    static let latencySamples = 4096

    struct Snapshot: Sendable {
        /// Per product ID, per answer type (`promotionalOffer`, `alternateProduct`, `message`, `nothing`).
        var answers: [String: [String: Int64]] = [:]
        /// Fallbacks (answers without an offer) by reason.
        var fallbacks: [String: Int64] = [:]
        /// Latencies in seconds, oldest first, of the latest answers.
        var latencies: [Double] = []
        var total: Int64 { answers.values.reduce(0) { $0 + $1.values.reduce(0, +) } }
    }

    private struct State {
        var answers: [String: [String: Int64]] = [:]
        var fallbacks: [String: Int64] = [:]
        var ring: [Double] = []
        var next = 0
    }

    private let state = Mutex(State())

    /// One answer: its product, type, fallback reason (nil for an offer) and time from arrival.
    func record(productID: String, type: String, fallbackReason: String?, latency: Duration) {
        let seconds = Double(latency.components.seconds) + Double(latency.components.attoseconds) / 1e18
        state.withLock { state in
            let product = state.answers[productID] != nil || state.answers.count < Self.maximumProducts ? productID : "other"
            state.answers[product, default: [:]][type, default: 0] += 1
            if let fallbackReason { state.fallbacks[fallbackReason, default: 0] += 1 }
            if state.ring.count < Self.latencySamples {
                state.ring.append(seconds)
            } else {
                state.ring[state.next] = seconds
            }
            state.next = (state.next + 1) % Self.latencySamples
        }
    }

    func snapshot() -> Snapshot {
        state.withLock { state in
            let latencies = state.ring.count < Self.latencySamples ? state.ring : Array(state.ring[state.next...] + state.ring[..<state.next])
            return Snapshot(answers: state.answers, fallbacks: state.fallbacks, latencies: latencies)
        }
    }
}
