import Crypto
import Foundation
import HTTPTypes
import HummingbirdTesting
import JWTKit
import NIOCore
import OfferSignerCore
import OfferSignerServer
import OfferSignerStorage
import Testing

/// Claims an app's auth server would put in a user's JWT.
struct AppUserClaims: JWTPayload {
    var iss: IssuerClaim?
    var aud: AudienceClaim?
    var exp: ExpirationClaim?
    var nbf: NotBeforeClaim?
    var sub: SubjectClaim?
    var accountToken: String?

    enum CodingKeys: String, CodingKey {
        case iss, aud, exp, nbf, sub
        case accountToken = "https://example.com/app_account_token"
    }

    func verify(using algorithm: some JWTAlgorithm) async throws {}

    static func valid(token: String? = "6b29fc40-ca47-1067-b31d-00dd010662da", expires: Date = Date().addingTimeInterval(600)) -> AppUserClaims {
        AppUserClaims(
            iss: "https://auth.example.com", aud: "offer-signer", exp: ExpirationClaim(value: expires), nbf: nil,
            sub: "user-42", accountToken: token)
    }
}

@Suite("Authentication: API keys and end-user JWTs", .serialized)
struct AuthenticationTests {
    static let hsSecret = "a-shared-secret-of-at-least-32-bytes!!"
    static let body = #"{"productID":"pro.monthly","offerID":"WINBACK50"}"#
    /// End users get catalogued offers only: the offers these tests sign, without rules.
    static var catalog: EligibilityConfiguration {
        try! EligibilityConfiguration(
            catalogJSON: Data(
                #"""
                {"offers": [
                  {"offerID": "WINBACK50", "bundleID": "com.example.app", "productIDs": ["pro.monthly"], "subscriptionGroupID": "G1", "kind": "any"},
                  {"offerID": "o", "bundleID": "com.example.app", "productIDs": ["p"], "subscriptionGroupID": "G1", "kind": "any"}
                ]}
                """#.utf8), trustedRootPEMs: [])
    }

    func hsServer(binding: AppAccountTokenBinding = .claim("https://example.com/app_account_token")) async throws -> TestServer {
        try await TestServer { configuration in
            configuration.eligibility = Self.catalog
            configuration.userJWT = UserJWTConfiguration(
                jwksJSON: nil, hs256Secret: Self.hsSecret, issuer: "https://auth.example.com", audience: "offer-signer", binding: binding)
        }
    }

    func hsToken(_ claims: AppUserClaims) async throws -> String {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: Self.hsSecret), digestAlgorithm: .sha256)
        return try await keys.sign(claims)
    }

    @Test("No credentials, a wrong key and a revoked key get 401 and nothing is issued")
    func apiKeyNegatives() async throws {
        let server = try await TestServer()
        defer { server.cleanUp() }
        let secret = try await server.createClient(name: "backend")
        try await server.live { client in
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body), .unauthorized, "unauthorized")
            let noAuth = try await client.postJSON("/v1/offers/signatures", Self.body)
            #expect(noAuth.headers[.wwwAuthenticate] == "Bearer")
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret + "x"), .unauthorized, "unauthorized")
            let forged = "os_" + secret.dropFirst(3).split(separator: "_")[0] + "_" + String(repeating: "A", count: 43)
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: forged), .unauthorized, "unauthorized")
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: "os_nobody_x"), .unauthorized, "unauthorized")
            var headers: HTTPFields = [.contentType: "application/json", .authorization: "Basic dXNlcjpwYXNz"]
            expectProblem(try await client.execute(uri: "/v1/offers/signatures", method: .post, headers: headers, body: ByteBuffer(string: Self.body)), .unauthorized, "unauthorized")
            #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret).status == .created)
            _ = try await server.store.revokeClient(name: "backend", actor: "test", authenticator: server.masterKey.registryRows)
            try await server.waitForRegistry(client)
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: secret), .unauthorized, "unauthorized")
            headers[.authorization] = nil
        }
        #expect(try server.issuedCount() == 1)
    }

    @Test("A valid user JWT signs for the user's own appAccountToken, filled in when omitted")
    func userJWT() async throws {
        let server = try await hsServer()
        defer { server.cleanUp() }
        let token = try await hsToken(.valid())
        try await server.live { client in
            let omitted = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: token)
            #expect(omitted.status == .created, "\(omitted.text)")
            #expect(omitted.json["appAccountToken"] as? String == "6b29fc40-ca47-1067-b31d-00dd010662da")
            let same = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","appAccountToken":"6B29FC40-CA47-1067-B31D-00DD010662DA"}"#, bearer: token)
            #expect(same.status == .created)
            let other = try await client.postJSON("/v1/offers/signatures", #"{"productID":"p","offerID":"o","appAccountToken":"11111111-2222-3333-4444-555555555555"}"#, bearer: token)
            expectProblem(other, .forbidden, "token_binding_mismatch")
        }
        #expect(try server.issuedCount() == 2)
    }

    @Test("Expired, wrong-audience, wrong-issuer, not-yet-valid, alg none and algorithm-confusion JWTs get 401")
    func jwtNegatives() async throws {
        let server = try await hsServer()
        defer { server.cleanUp() }
        var wrongAudience = AppUserClaims.valid()
        wrongAudience.aud = "someone-else"
        var wrongIssuer = AppUserClaims.valid()
        wrongIssuer.iss = "https://evil.example.com"
        var notYet = AppUserClaims.valid()
        notYet.nbf = NotBeforeClaim(value: Date().addingTimeInterval(3600))
        var noExpiry = AppUserClaims.valid()
        noExpiry.exp = nil
        let valid = try await hsToken(.valid())
        let parts = valid.split(separator: ".")
        let noneHeader = Encoding.base64URL(Data(#"{"alg":"none","typ":"JWT"}"#.utf8))
        // Algorithm confusion: an RS256/ES256 header over an HMAC signature.
        let confusedHeader = Encoding.base64URL(Data(#"{"alg":"ES256","typ":"JWT"}"#.utf8))
        let tokens = [
            try await hsToken(.valid(expires: Date().addingTimeInterval(-3600))),
            try await hsToken(wrongAudience),
            try await hsToken(wrongIssuer),
            try await hsToken(notYet),
            try await hsToken(noExpiry),
            "\(noneHeader).\(parts[1]).",
            "\(noneHeader).\(parts[1]).\(parts[2])",
            "\(confusedHeader).\(parts[1]).\(parts[2])",
            "\(parts[0]).\(parts[1]).\(Encoding.base64URL(Data(repeating: 1, count: 32)))",
            "not.a.jwt",
        ]
        try await server.live { client in
            for token in tokens {
                expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: token), .unauthorized, "unauthorized")
            }
        }
        #expect(try server.issuedCount() == 0)
    }

    /// A compact JWS with exactly this header and these claims (as JSON text, so members can be
    /// repeated), signed with `sign` over the signing input.
    static func jws(header: String, claims: String, sign: (Data) throws -> Data) rethrows -> String {
        let input = Encoding.base64URL(Data(header.utf8)) + "." + Encoding.base64URL(Data(claims.utf8))
        return input + "." + Encoding.base64URL(try sign(Data(input.utf8)))
    }

    static func claimsJSON(sub: String = "user-42", extra: String = "") -> String {
        let exp = Int(Date().addingTimeInterval(600).timeIntervalSince1970)
        return #"{"iss":"https://auth.example.com","aud":"offer-signer","exp":\#(exp),"sub":"\#(sub)"\#(extra),"https://example.com/app_account_token":"6b29fc40-ca47-1067-b31d-00dd010662da"}"#
    }

    static func ecJWK(_ key: P256.Signing.PrivateKey, kid: String) -> String {
        let raw = key.publicKey.x963Representation
        return #"{"kty":"EC","crv":"P-256","x":"\#(Encoding.base64URL(raw[1...32]))","y":"\#(Encoding.base64URL(raw[33...64]))","kid":"\#(kid)","use":"sig"}"#
    }

    @Test("Each JWT alg is pinned to the key that checks it; headers and claims with a member named twice get 401")
    func jwtKeysArePinned() async throws {
        let first = P256.Signing.PrivateKey()
        let second = P256.Signing.PrivateKey()
        // Keys without "alg" (as some identity providers publish them), next to a shared secret.
        let jwks = #"{"keys":[\#(Self.ecJWK(first, kid: "auth-1")),\#(Self.ecJWK(second, kid: "auth-2"))]}"#
        let server = try await TestServer { configuration in
            configuration.eligibility = Self.catalog
            configuration.userJWT = UserJWTConfiguration(
                jwksJSON: jwks, hs256Secret: Self.hsSecret, issuer: "https://auth.example.com", audience: "offer-signer",
                binding: .claim("https://example.com/app_account_token"))
        }
        defer { server.cleanUp() }
        let es256: @Sendable (P256.Signing.PrivateKey) -> @Sendable (Data) throws -> Data = { key in { input in try key.signature(for: input).rawRepresentation } }
        let hs256: @Sendable (Data) -> Data = { input in Data(HMAC<SHA256>.authenticationCode(for: input, using: SymmetricKey(data: Data(Self.hsSecret.utf8)))) }
        let claims = Self.claimsJSON()
        let valid = try Self.jws(header: #"{"alg":"ES256","kid":"auth-1","typ":"JWT"}"#, claims: claims, sign: es256(first))
        let refused = try [
            // The shared secret behind a public-key header: an unknown kid, a key of the JWKS.
            Self.jws(header: #"{"alg":"ES256","kid":"nope","typ":"JWT"}"#, claims: claims, sign: hs256),
            Self.jws(header: #"{"alg":"RS256","kid":"auth-1","typ":"JWT"}"#, claims: claims, sign: hs256),
            // Signed by the other key of the JWKS than its kid names.
            Self.jws(header: #"{"alg":"ES256","kid":"auth-2","typ":"JWT"}"#, claims: claims, sign: es256(first)),
            // No kid, and two ES256 keys to choose from.
            Self.jws(header: #"{"alg":"ES256","typ":"JWT"}"#, claims: claims, sign: es256(first)),
            // A header read one way by the alg check and another by the verifier.
            Self.jws(header: #"{"alg":"ES384","kid":"auth-1","alg":"ES256"}"#, claims: claims, sign: es256(first)),
            Self.jws(header: #"{"alg":"ES256","kid":"auth-1","kid":"auth-2"}"#, claims: claims, sign: es256(first)),
            // Claims read one way here and another by other parsers.
            Self.jws(header: #"{"alg":"HS256","typ":"JWT"}"#, claims: Self.claimsJSON(extra: #","sub":"someone-else""#), sign: hs256),
            Self.jws(header: #"{"alg":"HS256","kid":7}"#, claims: claims, sign: hs256),
        ]
        try await server.live { client in
            #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: valid).status == .created)
            for token in refused {
                expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: token), .unauthorized, "unauthorized")
            }
            // The refused tokens changed nothing: the valid ones still pass, with either key kind.
            #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: valid).status == .created)
            let shared = Self.jws(header: #"{"alg":"HS256","typ":"JWT"}"#, claims: claims, sign: hs256)
            #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: shared).status == .created)
            let other = try Self.jws(header: #"{"alg":"ES256","kid":"auth-2"}"#, claims: claims, sign: es256(second))
            #expect(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: other).status == .created)
        }
        #expect(try server.issuedCount() == 4)
    }

    @Test("The server refuses to start with a short HS256 secret or a JWKS key it cannot pin")
    func unusableJWTConfigurations() async throws {
        let key = Self.ecJWK(P256.Signing.PrivateKey(), kid: "auth-1")
        let configurations: [(String?, String?, String)] = [
            (nil, "", "0 bytes"),
            (nil, String(repeating: "s", count: 31), "31 bytes"),
            (#"{"keys":[\#(key),\#(key)]}"#, nil, "two keys with kid 'auth-1'"),
            (#"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","kid":"ed"}]}"#, nil, "'ed'"),
            (#"{"keys":[{"kty":"EC","crv":"P-384","x":"AA","y":"AA","kid":"p384"}]}"#, nil, "'p384'"),
            (#"{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","kid":"ps","alg":"PS256"}]}"#, nil, "'ps'"),
            (#"{"keys":[]}"#, nil, "at least one key"),
            (#"{"keys":[{"kty":"EC","crv":"P-256","kid":"a","kid":"b"}]}"#, nil, "twice"),
        ]
        for (jwks, secret, mentions) in configurations {
            let server = try await TestServer { configuration in
                configuration.eligibility = Self.catalog
            configuration.userJWT = UserJWTConfiguration(
                    jwksJSON: jwks, hs256Secret: secret, issuer: "https://auth.example.com", audience: "offer-signer",
                    binding: .claim("https://example.com/app_account_token"))
            }
            defer { server.cleanUp() }
            await #expect {
                try await server.live { _ in }
            } throws: { error in
                guard let error = error as? ServerConfigurationError else { return false }
                return error.message.contains(mentions)
            }
        }
    }

    @Test("ES256 JWTs from a JWKS, bound by UUIDv5 of sub")
    func jwksAndUUIDv5() async throws {
        let cryptoKey = P256.Signing.PrivateKey()
        let signingKey = try ES256PrivateKey(pem: cryptoKey.pemRepresentation)
        let raw = cryptoKey.publicKey.x963Representation
        let x = Encoding.base64URL(raw[1...32])
        let y = Encoding.base64URL(raw[33...64])
        let jwks = #"{"keys":[{"kty":"EC","crv":"P-256","x":"\#(x)","y":"\#(y)","kid":"auth-1","alg":"ES256","use":"sig"}]}"#
        let namespace = UUID(uuidString: "6ba7b811-9dad-11d1-80b4-00c04fd430c8")!
        let server = try await TestServer { configuration in
            configuration.eligibility = Self.catalog
            configuration.userJWT = UserJWTConfiguration(
                jwksJSON: jwks, hs256Secret: nil, issuer: "https://auth.example.com", audience: "offer-signer",
                binding: .subjectUUIDv5(namespace: namespace))
        }
        defer { server.cleanUp() }
        let keys = JWTKeyCollection()
        await keys.add(ecdsa: signingKey, kid: "auth-1")
        let token = try await keys.sign(AppUserClaims.valid(token: nil), kid: "auth-1")
        // An HS256 token "signed" with the public JWK as secret must not pass.
        let confusion = JWTKeyCollection()
        await confusion.add(hmac: HMACKey(from: jwks), digestAlgorithm: .sha256)
        let confused = try await confusion.sign(AppUserClaims.valid(token: nil))
        try await server.live { client in
            let response = try await client.postJSON("/v1/offers/signatures", Self.body, bearer: token)
            #expect(response.status == .created, "\(response.text)")
            #expect(response.json["appAccountToken"] as? String == UUIDv5.make(namespace: namespace, name: "user-42").uuidString.lowercased())
            expectProblem(try await client.postJSON("/v1/offers/signatures", Self.body, bearer: confused), .unauthorized, "unauthorized")
        }
    }

    @Test("UUIDv5 matches RFC 9562's example (DNS namespace, www.example.com)")
    func uuidV5KnownAnswer() {
        let dns = UUID(uuidString: "6ba7b810-9dad-11d1-80b4-00c04fd430c8")!
        #expect(UUIDv5.make(namespace: dns, name: "www.example.com").uuidString.lowercased() == "2ed6657d-e927-568b-95e1-2665a8aea6a2")
    }
}
