import Crypto
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HummingbirdTesting
import OfferSignerClient
import OfferSignerCore
import OfferSignerServer
import TestChildProcess
import Testing

/// The client against the real server on loopback, and what it gets back checked by Apple's own
/// library (app-store-server-library 3.1.2 with PyJWT, through Tests/Interop/apple_oracle.py): the
/// JWS the app passes to StoreKit verifies with the key's public half and carries Apple's claims.
@Suite("The client's JWS, from the real server, verifies with Apple's Python library")
struct ClientAppleInteropTests {
    static let oracleScript = URL(fileURLWithPath: PythonTestEnvironment.packageRoot).appendingPathComponent("Tests/Interop/apple_oracle.py")
    static let token = UUID(uuidString: "6B29FC40-CA47-1067-B31D-00DD010662DA")!

    static func oracle(_ cases: [[String: Any]]) async throws -> [[String: Any]] {
        let python = try await PythonTestEnvironment.shared().python
        let input = try JSONSerialization.data(withJSONObject: cases)
        let result = try await onOwnThread {
            try ChildProcess.run(python, [oracleScript.path], stdin: input, timeout: .seconds(300))
        }
        try #require(result.status == 0, "apple_oracle.py exited \(result.status): \(result.stderrText)")
        return try #require(try JSONSerialization.jsonObject(with: result.stdout) as? [[String: Any]])
    }

    @Test("Promotional offer (default formats: JWS) and intro eligibility: verified by PyJWT with Apple's claims; the purchase plan passes that JWS on")
    func roundTrip() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let key = try #require(server.keys["com.example.app"])
        let (offer, intro) = try await server.live { client in
            let signer = try makeClient(port: try client.boundPort(), token: secret, counter: CallCounter())
            let offer = try await signer.signPromotionalOffer(
                productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: Self.token, transactionID: "2000000123")
            let intro = try await signer.signIntroductoryOfferEligibility(
                productID: "pro.monthly", allowIntroductoryOffer: true, transactionID: "2000000123")
            return (offer, intro)
        }
        // The default on this platform is the JWS form alone.
        #expect(offer.legacy == nil)
        let jws = try #require(offer.jws)
        // What StoreKit would get: that very JWS.
        let plan = try offer.purchasePlan(now: Date(), capabilities: .current)
        #expect(plan.method == .compactJWS(jws.compactJWS))
        #expect(plan.appAccountToken == Self.token)

        let publicPEM = key.publicKey.pemRepresentation
        let results = try await Self.oracle([
            ["op": "jws-verify", "publicKeyPEM": publicPEM, "audience": "promotional-offer", "compactJWS": jws.compactJWS],
            ["op": "jws-verify", "publicKeyPEM": publicPEM, "audience": "introductory-offer-eligibility", "compactJWS": intro.compactJWS],
            // A stranger's key must not verify it.
            ["op": "jws-verify", "publicKeyPEM": try InAppPurchaseKey.generateForDevelopment(keyID: "STRANGER01").publicKey.pemRepresentation,
             "audience": "promotional-offer", "compactJWS": jws.compactJWS],
        ])
        let promotional = results[0]
        #expect(promotional["valid"] as? Bool == true, "\(promotional)")
        let claims = try #require(promotional["claims"] as? [String: Any])
        #expect(claims["bid"] as? String == "com.example.app")
        #expect(claims["productId"] as? String == "pro.monthly")
        #expect(claims["offerIdentifier"] as? String == "WINBACK50")
        #expect(claims["transactionId"] as? String == "2000000123")
        #expect(claims["iss"] as? String == TestServer.issuerID)
        #expect((promotional["header"] as? [String: Any])?["kid"] as? String == key.keyID)

        let eligibility = results[1]
        #expect(eligibility["valid"] as? Bool == true, "\(eligibility)")
        let introClaims = try #require(eligibility["claims"] as? [String: Any])
        #expect(introClaims["allowIntroductoryOffer"] as? Bool == true)
        #expect(introClaims["transactionId"] as? String == "2000000123")
        #expect(introClaims["productId"] as? String == "pro.monthly")
        #expect(intro.allowIntroductoryOffer && intro.transactionID == "2000000123" && intro.keyID == key.keyID)

        #expect(results[2]["valid"] as? Bool == false)
    }

    @Test("intro-eligibility: refused for a user JWT (403), without allowIntroductoryOffer (400), and mixed with other formats (400)")
    func introEligibilityRules() async throws {
        let server = try await TestServer { $0.userJWT = UserJWT.configuration }
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "app-backend")
        let jwt = try UserJWT.token(appAccountToken: Self.token)
        try await server.live { client in
            let port = try client.boundPort()
            let user = try makeClient(port: port, token: jwt, counter: CallCounter())
            let refused = await clientError {
                try await user.signIntroductoryOfferEligibility(productID: "pro.monthly", allowIntroductoryOffer: true, transactionID: "2000000123")
            }
            guard case .forbidden(let problem) = refused else { Issue.record("\(String(describing: refused))"); return }
            #expect(problem.code == "intro_eligibility_not_allowed")

            // Raw bodies the client never sends, from the app's backend.
            for (body, code) in [
                (#"{"productID":"pro.monthly","offerID":"intro","formats":["intro-eligibility"],"transactionID":"2000000123"}"#, "missing_field"),
                (#"{"productID":"pro.monthly","offerID":"intro","formats":["intro-eligibility"],"allowIntroductoryOffer":true}"#, "missing_field"),
                (#"{"productID":"pro.monthly","offerID":"intro","formats":["jws","intro-eligibility"],"transactionID":"1","allowIntroductoryOffer":true}"#, "unknown_format"),
                (#"{"productID":"pro.monthly","offerID":"intro","formats":["jws"],"allowIntroductoryOffer":true}"#, "bad_request"),
            ] {
                var request = URLRequest(url: try #require(URL(string: "http://127.0.0.1:\(port)/v1/offers/signatures")))
                request.httpMethod = "POST"
                request.httpBody = Data(body.utf8)
                request.setValue("application/json", forHTTPHeaderField: "Content-Type")
                request.setValue("Bearer \(secret)", forHTTPHeaderField: "Authorization")
                let (data, response) = try await URLSession(configuration: .ephemeral).data(for: request)
                #expect((response as? HTTPURLResponse)?.statusCode == 400, "\(body)")
                let problem = try JSONSerialization.jsonObject(with: data) as? [String: Any]
                #expect(problem?["code"] as? String == code, "\(body): \(String(decoding: data, as: UTF8.self))")
            }
        }
    }
}
