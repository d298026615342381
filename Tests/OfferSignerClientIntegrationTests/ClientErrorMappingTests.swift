import AppleTestChain
import Foundation
import HummingbirdTesting
import OfferSignerClient
import OfferSignerServer
import OfferSignerStorage
import Testing

/// Each `OfferSignerClientError` case, produced by what the real server actually answers.
@Suite("OfferSignerClient maps the real server's error answers")
struct ClientErrorMappingTests {
    static let token = UUID(uuidString: "6b29fc40-ca47-1067-b31d-00dd010662da")!

    @Test("401: no token, a wrong token and a revoked key are .unauthorized, without retries")
    func unauthorized() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let (none, wrong, eligibilityNone) = (CallCounter(), CallCounter(), CallCounter())
        try await server.live { client in
            let port = try client.boundPort()
            let anonymous = try makeClient(port: port, token: nil, counter: none)
            let error = await clientError {
                try await anonymous.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            }
            guard case .unauthorized = error else { Issue.record("no token: \(String(describing: error))"); return }
            #expect(error?.httpStatus == 401)

            let wrongKey = try makeClient(port: port, token: secret + "x", counter: wrong)
            let wrongError = await clientError {
                try await wrongKey.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            }
            guard case .unauthorized = wrongError else { Issue.record("wrong token: \(String(describing: wrongError))"); return }

            let eligibilityError = await clientError {
                try await makeClient(port: port, token: nil, counter: eligibilityNone).eligibility(evidence: PurchaseEvidence())
            }
            guard case .unauthorized = eligibilityError else { Issue.record("eligibility: \(String(describing: eligibilityError))"); return }

            // Revoked while the app runs: the next call is unauthorized.
            let valid = try makeClient(port: port, token: secret, counter: CallCounter())
            _ = try await valid.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            _ = try await server.store.revokeClient(name: "app-backend", actor: "test", authenticator: server.masterKey.registryRows)
            // The server learns of the revocation at its next registry poll (every 50 ms here, later
            // on a loaded machine): wait for it with a call that signs nothing.
            let revokedBy = ContinuousClock.now + .seconds(10)
            while ContinuousClock.now < revokedBy {
                do {
                    _ = try await valid.eligibility(evidence: PurchaseEvidence())
                } catch let error as OfferSignerClientError {
                    if case .unauthorized = error { break }
                } catch {}
                try await Task.sleep(for: .milliseconds(20))
            }
            let revokedError = await clientError {
                try await valid.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            }
            guard case .unauthorized = revokedError else { Issue.record("revoked: \(String(describing: revokedError))"); return }
        }
        #expect(await none.count == 1)
        #expect(await wrong.count == 1)
        #expect(await eligibilityNone.count == 1)
        #expect(try server.issuedCount() == 1)
    }

    @Test("403 not_eligible: .notEligible with the server's whole answer (no history, unverified evidence with its failures, redeemed too recently with eligibleFrom)")
    func notEligible() async throws {
        let chain = try TestAppleChain()
        let server = try await WinBack.server(chain)
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let key = try #require(server.keys["com.example.app"])
        let goodEvidence = try WinBack.evidence(chain)
        let foreignEvidence = try WinBack.evidence(try TestAppleChain(rootName: "Not Apple"))
        let counter = CallCounter()
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter)
            func sign(_ evidence: PurchaseEvidence?) async throws -> SignedPromotionalOffer {
                try await signer.signPromotionalOffer(
                    productID: "pro.monthly", offerID: "wb1", appAccountToken: WinBack.token, formats: [.legacy], evidence: evidence)
            }

            let noHistory = await clientError { try await sign(PurchaseEvidence()) }
            guard case .notEligible(let noHistoryAnswer) = noHistory else { Issue.record("no history: \(String(describing: noHistory))"); return }
            #expect(noHistoryAnswer.reasons.contains("no_history"), "\(noHistoryAnswer)")
            #expect(noHistoryAnswer.historySource == .client, "\(noHistoryAnswer)")
            #expect(noHistory?.httpStatus == 403)

            let unverified = await clientError { try await sign(foreignEvidence) }
            guard case .notEligible(let unverifiedAnswer) = unverified else { Issue.record("foreign chain: \(String(describing: unverified))"); return }
            #expect(unverifiedAnswer.reasons.contains("evidence_unverified"), "\(unverifiedAnswer)")
            // Which items failed, and why, reach the app (the server's evidenceFailures).
            #expect(!unverifiedAnswer.evidenceFailures.isEmpty, "\(unverifiedAnswer)")
            #expect(unverifiedAnswer.evidenceFailures.allSatisfy { ["signedTransaction", "signedRenewalInfo"].contains($0.source) && !$0.code.isEmpty })

            // An offer with rules and no evidence at all is a bad request, not a refusal.
            let missing = await clientError { try await sign(nil) }
            guard case .invalidRequest(let problem) = missing else { Issue.record("no evidence: \(String(describing: missing))"); return }
            #expect(problem.status == 400)
            #expect(problem.code == "evidence_required")

            // Eligible: signed and verifiable. The same customer once redeemed: redeemed too recently.
            let offer = try await sign(goodEvidence)
            try ClientSigningTests.expectLegacyVerifies(offer, key: key)
            let redeemedEvidence = try WinBack.evidence(chain, redeemedLast: true)
            let again = await clientError { try await sign(redeemedEvidence) }
            guard case .notEligible(let againAnswer) = again else { Issue.record("second: \(String(describing: again))"); return }
            #expect(againAnswer.reasons == ["redeemed_too_recently"])
            let eligibleFrom = try #require(againAnswer.eligibleFrom, "eligibleFrom reached the app")
            #expect(eligibleFrom > Date().addingTimeInterval(300 * 86_400), "\(eligibleFrom)")
        }
        // 403s and 400s are not retried: one attempt per call.
        #expect(await counter.count == 5)
        #expect(try server.issuedCount() == 1)
    }

    @Test("403 other than not_eligible (token binding mismatch, bundle not allowed): .forbidden with the problem")
    func forbidden() async throws {
        let server = try await TestServer(bundles: ["com.example.app", "com.example.other"]) { $0.userJWT = UserJWT.configuration }
        defer { server.cleanUp() }
        let jwt = try UserJWT.token(appAccountToken: Self.token)
        let limitedSecret = try await server.createClient(name: "app-only", bundleIDs: ["com.example.app"])
        let counter = CallCounter()
        try await server.live { client in
            let port = try client.boundPort()
            let user = try makeClient(port: port, token: jwt, counter: counter)
            let mismatch = await clientError {
                try await user.signPromotionalOffer(
                    productID: "pro.monthly", offerID: "WINBACK50",
                    appAccountToken: UUID(uuidString: "11111111-2222-3333-4444-555555555555")!, bundleID: "com.example.app")
            }
            guard case .forbidden(let problem) = mismatch else { Issue.record("mismatch: \(String(describing: mismatch))"); return }
            #expect(problem.status == 403)
            #expect(problem.code == "token_binding_mismatch")
            #expect(problem.detail?.isEmpty == false)

            let backend = try makeClient(port: port, token: limitedSecret, counter: CallCounter())
            let otherApp = await clientError {
                try await backend.signPromotionalOffer(
                    productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, bundleID: "com.example.other")
            }
            guard case .forbidden(let bundleProblem) = otherApp else { Issue.record("bundle: \(String(describing: otherApp))"); return }
            #expect(bundleProblem.code == "bundle_not_allowed")
        }
        #expect(await counter.count == 1)
        #expect(try server.issuedCount() == 0)
    }

    @Test("429 with Retry-After: .rateLimited(retryAfter:), never retried by the client")
    func rateLimited() async throws {
        let server = try await TestServer { configuration in
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 0.01, burst: 1)
        }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let counter = CallCounter()
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter, retryPolicy: quickRetries(5))
            _ = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            let limited = await clientError {
                try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            }
            guard case .rateLimited(let retryAfter) = limited else { Issue.record("\(String(describing: limited))"); return }
            let seconds = try #require(retryAfter, "the server's Retry-After reached the app")
            #expect(seconds >= 1)
            #expect(seconds <= 100)  // 1 token at 0.01/s
            #expect(limited?.httpStatus == 429)
        }
        #expect(await counter.count == 2, "the 429 was not retried")
        #expect(try server.issuedCount() == 1)
    }

    @Test("413 body_too_large: .invalidRequest with the problem, not retried (signatures and eligibility)")
    func bodyTooLarge() async throws {
        let server = try await TestServer { $0.maximumBodyBytes = 2048 }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let counter = CallCounter()
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter)
            let large = await clientError {
                try await signer.signPromotionalOffer(
                    productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token,
                    transactionID: String(repeating: "7", count: 3_000))
            }
            guard case .invalidRequest(let problem) = large else { Issue.record("signature: \(String(describing: large))"); return }
            #expect(problem.status == 413)
            #expect(problem.code == "body_too_large")
            #expect(large?.httpStatus == 413)

            let evidence = PurchaseEvidence(signedTransactions: Array(repeating: String(repeating: "a", count: 500) + ".b.c", count: 8))
            let largeEvidence = await clientError { try await signer.eligibility(evidence: evidence) }
            guard case .invalidRequest(let evidenceProblem) = largeEvidence else {
                Issue.record("eligibility: \(String(describing: largeEvidence))"); return
            }
            #expect(evidenceProblem.status == 413)
            #expect(evidenceProblem.code == "body_too_large")

            // Other 4xx map the same way, e.g. 400 unknown_bundle.
            let unknownBundle = await clientError {
                try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: nil, bundleID: "com.unknown")
            }
            guard case .invalidRequest(let bundleProblem) = unknownBundle else { Issue.record("bundle: \(String(describing: unknownBundle))"); return }
            #expect(bundleProblem.status == 400)
            #expect(bundleProblem.code == "unknown_bundle")
        }
        #expect(await counter.count == 3)
        #expect(try server.issuedCount() == 0)
    }

    @Test("503 audit_unavailable: retried per the policy, then .server(problem) and no signature")
    func auditUnavailable() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let counter = CallCounter()
        try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: counter, retryPolicy: quickRetries(3))
            _ = try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token)
            #expect(await counter.count == 1)
            // The store refuses audit writes from now on (as a full or failing disk would).
            try server.execute("CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_log BEGIN SELECT RAISE(ABORT, 'simulated'); END;")
            var returned: SignedPromotionalOffer?
            let failure = await clientError {
                returned = try await signer.signPromotionalOffer(
                    productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, formats: [.legacy, .jws])
                return returned
            }
            #expect(returned == nil, "no signature came back")
            guard case .server(let problem) = failure else { Issue.record("\(String(describing: failure))"); return }
            #expect(problem.status == 503)
            #expect(problem.code == "audit_unavailable")
            #expect(failure?.httpStatus == 503)
        }
        // 1 success + 3 attempts at the failing request (the first and two retries).
        #expect(await counter.count == 4)
        #expect(try server.issuedCount() == 1)
    }
}
