import AppleTestChain
import Foundation
import HummingbirdTesting
import OfferSignerClient
import OfferSignerServer
import Testing

/// `eligibility(offerIDs:evidence:...)` against the real server, with evidence signed by a test
/// chain shaped like Apple's and trusted by the server.
@Suite("OfferSignerClient asks a real server about eligibility")
struct ClientEligibilityTests {
    @Test("Decisions with reasons: eligible, no history, subscribed, then, once redeemed, redeemed too recently with eligibleFrom")
    func decisions() async throws {
        let chain = try TestAppleChain()
        let server = try await WinBack.server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let lapsed = try WinBack.evidence(chain)
        let subscribed = try WinBack.evidence(chain, lapsedMonths: -1)
        let counter = CallCounter()
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter)

            // A lapsed subscriber: eligible for both offers.
            let eligible = try await signer.eligibility(offerIDs: ["wb1", "goodwill"], evidence: lapsed, appAccountToken: WinBack.token)
            #expect(Set(eligible.decisions.map(\.offerID)) == ["wb1", "goodwill"])
            #expect(eligible.decision(for: "wb1")?.eligible == true, "\(eligible)")
            #expect(eligible.decision(for: "goodwill")?.eligible == true)
            #expect(Set(eligible.eligibleOfferIDs) == ["wb1", "goodwill"])

            // All offers when none are named; no history means no win-back.
            let empty = try await signer.eligibility(evidence: PurchaseEvidence(), appAccountToken: WinBack.token)
            let noHistory = try #require(empty.decision(for: "wb1"))
            #expect(!noHistory.eligible)
            #expect(noHistory.reasons.contains("no_history"), "\(noHistory.reasons)")
            #expect(empty.decision(for: "goodwill")?.eligible == true)

            // Still subscribed.
            let active = try await signer.eligibility(offerIDs: ["wb1"], evidence: subscribed, appAccountToken: WinBack.token)
            #expect(active.decisions.count == 1)
            #expect(active.decision(for: "wb1")?.eligible == false)
            #expect(active.decision(for: "wb1")?.reasons.contains("currently_subscribed") == true, "\(active)")

            // Signed, the payment sheet cancelled: still eligible (the same attempt may be retried).
            _ = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "wb1", appAccountToken: WinBack.token, evidence: lapsed)
            let retry = try await signer.eligibility(offerIDs: ["wb1"], evidence: lapsed, appAccountToken: WinBack.token)
            #expect(retry.decision(for: "wb1")?.eligible == true, "\(retry)")
            // Redeemed (the app's evidence shows it): not eligible until a date the server computed.
            let redeemed = try WinBack.evidence(chain, redeemedLast: true)
            let after = try await signer.eligibility(offerIDs: ["wb1"], evidence: redeemed, appAccountToken: WinBack.token)
            let decision = try #require(after.decision(for: "wb1"))
            #expect(!decision.eligible)
            #expect(decision.reasons == ["redeemed_too_recently"])
            let eligibleFrom = try #require(decision.eligibleFrom, "eligibleFrom parsed from the server's RFC 3339 text")
            #expect(eligibleFrom > Date().addingTimeInterval(280 * 86_400), "\(eligibleFrom)")  // 12 months from the redemption's end, 2 months ago
            #expect(eligibleFrom < Date().addingTimeInterval(400 * 86_400), "\(eligibleFrom)")

            // An unknown offer is a bad request.
            let unknown = await clientError { try await signer.eligibility(offerIDs: ["nope"], evidence: lapsed) }
            guard case .invalidRequest(let problem) = unknown else { Issue.record("\(String(describing: unknown))"); return }
            #expect(problem.code == "unknown_offer")
        }
        #expect(await counter.count == 7)
    }

    @Test("Without a catalog the service answers 404 eligibility_not_configured: .invalidRequest")
    func notConfigured() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: CallCounter())
            let error = await clientError { try await signer.eligibility(evidence: PurchaseEvidence()) }
            guard case .invalidRequest(let problem) = error else { Issue.record("\(String(describing: error))"); return }
            #expect(problem.status == 404)
            #expect(problem.code == "eligibility_not_configured")
        }
    }
}
