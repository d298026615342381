import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import HummingbirdTesting
import OfferSignerClient
import Testing

@Suite("OfferSignerClient network failures")
struct ClientTransportTests {
    @Test("A closed port is .transport after the retries")
    func closedPort() async throws {
        // A port the real server listened on a moment ago and no longer does.
        let server = try await TestServer()
        defer { server.cleanUp() }
        let port = try await server.live { client in try client.boundPort() }

        let counter = CallCounter()
        let signer = try makeClient(port: port, token: "unused", counter: counter, retryPolicy: quickRetries(2))
        let error = await clientError {
            try await signer.signPromotionalOffer(productID: "pro.monthly", offerID: "WINBACK50", appAccountToken: nil)
        }
        guard case .transport(let underlying) = error else { Issue.record("\(String(describing: error))"); return }
        #expect(error?.httpStatus == nil)
        if let urlError = underlying as? URLError {
            #expect(urlError.code == .cannotConnectToHost || urlError.code == .networkConnectionLost, "\(urlError)")
        }
        #expect(await counter.count == 2, "transport errors are retried")

        let eligibilityError = await clientError {
            try await makeClient(port: port, token: nil, counter: CallCounter(), retryPolicy: .none).eligibility(evidence: PurchaseEvidence())
        }
        guard case .transport = eligibilityError else { Issue.record("\(String(describing: eligibilityError))"); return }
    }
}
