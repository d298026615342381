import AppStoreServerAPI
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import HummingbirdTesting
import OfferSignerServer
import TestChildProcess
import Testing

/// Runs schemathesis (from the tests' own Python environment, ``PythonTestEnvironment``, pinned
/// in `Tests/Interop/requirements.txt`) against `/openapi.yaml` of a running server: no 5xx,
/// and every response conforms to the schema.
@Suite("schemathesis against the live OpenAPI document")
struct SchemathesisTests {
    static let catalog = #"""
        {"apps": {"com.example.app": {"appStoreServerAPI": {"productionURL": "http://127.0.0.1:1/production"}}},
         "offers": [
          {"offerID": "wb_client", "bundleID": "com.example.app", "productIDs": ["p"], "subscriptionGroupID": "G", "kind": "win-back", "rules": {}},
          {"offerID": "wb_apple", "bundleID": "com.example.app", "productIDs": ["p"], "subscriptionGroupID": "G", "kind": "win-back",
           "historySource": "apple-then-client", "rules": {}},
          {"offerID": "any", "bundleID": "com.example.app", "productIDs": ["p"], "subscriptionGroupID": "G", "kind": "any"}
        ]}
        """#

    @Test("No server error and no response that breaks the schema", .timeLimit(.minutes(30)))
    func fuzz() async throws {
        let schemathesis = try await PythonTestEnvironment.shared().executable("schemathesis")
        let server = try await TestServer { configuration in
            configuration.developmentMode = true
            configuration.appAccountTokenRateLimit = RateLimit(perSecond: 5, burst: 5)
            // Decisions of every history source, so their answers are checked against the schema
            // too; Apple's API is a closed loopback port (history_unavailable, quickly).
            var eligibility = try! EligibilityConfiguration(catalogJSON: Data(Self.catalog.utf8), trustedRootPEMs: [])
            eligibility.appStoreServerAPI.timeBudget = .milliseconds(200)
            configuration.eligibility = eligibility
        }
        defer { server.cleanUp() }
        let (status, output) = try await server.live { client -> (Int32, String) in
            let port = try #require(client.port)
            var environment = ProcessInfo.processInfo.environment
            environment["SCHEMATHESIS_HOOKS"] = nil
            let result = try await onOwnThread { [environment] in
                try ChildProcess.run(
                    schemathesis,
                    [
                        "run", "http://127.0.0.1:\(port)/openapi.yaml",
                        "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance",
                        "--max-examples", "60", "--generation-deterministic", "--request-timeout", "10", "--no-color",
                    ],
                    environment: environment, timeout: .seconds(540))
            }
            return (result.status, result.stdoutText + result.stderrText)
        }
        #expect(status == 0, "schemathesis failed:\n\(output)")
    }
}
