/// The OpenAPI 3.1 description of the whole HTTP API, served at `GET /openapi.yaml`.
/// `OpenAPIConformanceTests` keeps it true to the routes; CI runs schemathesis against it.
public enum OpenAPIDocument {
    public static let yaml = #"""
    openapi: 3.1.0
    info:
      title: offer-signer
      version: 1.0.0
      description: |
        Signs Apple StoreKit promotional offers with an App Store Connect In-App Purchase key.
        Every error is an RFC 9457 problem document (application/problem+json) with a stable `code`.
      license:
        name: Apache-2.0
        identifier: Apache-2.0
    servers:
      - url: http://127.0.0.1:8080
    security:
      - bearer: []
    paths:
      /v1/offers/signatures:
        post:
          operationId: createSignature
          summary: Sign a promotional offer
          description: |
            Signs the offer with the bundle's active key in each requested format. The audit record of every
            signature is committed durably before the response is sent; if it cannot be, the answer is 503 and
            no signature is returned. Without `--dev`, send `Authorization: Bearer <API key or user JWT>`.
          security:
            - bearer: []
            - {}
          requestBody:
            required: true
            content:
              application/json:
                schema:
                  $ref: '#/components/schemas/SignatureRequest'
          responses:
            '201':
              description: Signed.
              headers:
                X-Request-ID:
                  $ref: '#/components/headers/RequestID'
              content:
                application/json:
                  schema:
                    $ref: '#/components/schemas/SignatureResponse'
            '400': {$ref: '#/components/responses/Problem'}
            '401': {$ref: '#/components/responses/Problem'}
            '403': {$ref: '#/components/responses/Problem'}
            '413': {$ref: '#/components/responses/Problem'}
            '415': {$ref: '#/components/responses/Problem'}
            '422': {$ref: '#/components/responses/Problem'}
            '429': {$ref: '#/components/responses/RateLimited'}
            '503': {$ref: '#/components/responses/Problem'}
      /v1/offers/eligibility:
        post:
          operationId: checkEligibility
          summary: Decide which catalog offers a customer qualifies for
          description: |
            Evaluates each offer's rules on the customer's history, as the offer's historySource says: the
            Apple-signed evidence the app sends (client; x5c chain to Apple Root CA - G3, Apple's marker OIDs,
            ES256, bundle), Apple's own history of the customer named by transactionID, from the App Store
            Server API (apple), or Apple's and, when Apple cannot answer, the app's evidence (apple-then-client);
            and on the signatures this service issued to the customer. Nothing is signed. Needs an offers
            catalog (`serve --offers FILE`).
          security:
            - bearer: []
            - {}
          requestBody:
            required: true
            content:
              application/json:
                schema:
                  $ref: '#/components/schemas/EligibilityRequest'
          responses:
            '200':
              description: One decision per offer.
              headers:
                X-Request-ID:
                  $ref: '#/components/headers/RequestID'
              content:
                application/json:
                  schema:
                    $ref: '#/components/schemas/EligibilityResponse'
            '400': {$ref: '#/components/responses/Problem'}
            '401': {$ref: '#/components/responses/Problem'}
            '403': {$ref: '#/components/responses/Problem'}
            '404': {$ref: '#/components/responses/Problem'}
            '413': {$ref: '#/components/responses/Problem'}
            '415': {$ref: '#/components/responses/Problem'}
            '429': {$ref: '#/components/responses/RateLimited'}
            '503': {$ref: '#/components/responses/Problem'}
      /v1/apple/notifications:
        post:
          operationId: receiveAppleNotification
          summary: App Store Server Notifications V2 (Apple calls this)
          description: |
            Apple's body, `{"signedPayload": "<JWS>"}`. No credentials: the payload's x5c chain to Apple Root CA - G3,
            Apple's marker OIDs and ES256 signature make it authentic, and every JWS inside is verified too; only
            what fails that is refused. A verified notification for an app this service does not serve, an
            environment the app does not accept or, in Production, another App Apple ID than the catalog's is
            answered 200 `ignored` and not stored. Stored once per notificationUUID (a repeat answers 200
            `duplicate`); redemptions of promotional offers are matched to their signatures and audited (`offer.redeemed`).
            Any Content-Type is accepted (Apple does not document the header).
            Each Apple endpoint verifies at most 32 requests at once, once their bodies are in (a body must arrive within 5 s, else 400 `body_incomplete`); beyond, 503 `overloaded` with `Retry-After`.
          security:
            - {}
          requestBody:
            required: true
            content:
              application/json:
                schema:
                  type: object
                  required: [signedPayload]
                  properties:
                    signedPayload: {type: string, minLength: 1}
          responses:
            '200':
              description: Verified and durably stored (or stored before, or not for this service).
              headers:
                X-Request-ID:
                  $ref: '#/components/headers/RequestID'
              content:
                application/json:
                  schema:
                    type: object
                    required: [status, notificationUUID]
                    properties:
                      status: {type: string, enum: [recorded, duplicate, ignored]}
                      notificationUUID: {type: string}
            '400': {$ref: '#/components/responses/Problem'}
            '413': {$ref: '#/components/responses/Problem'}
            '503': {$ref: '#/components/responses/Problem'}
      /v1/apple/retention:
        post:
          operationId: getRetentionMessage
          summary: Apple's Retention Messaging "Get Retention Message" (Apple calls this)
          description: |
            Apple's body, `{"signedPayload": "<JWS of DecodedRealtimeRequestBody>"}`, verified like all Apple-signed
            data before anything else; the app is the catalog app with that `appAppleID` (in Sandbox, where Apple
            does not check it, else the one app with a plan) and a `retention` plan. Answers Apple's
            RealtimeResponseBody with exactly one member: a promotional offer the subscriber is eligible for (signed,
            audited), else the product's fallback, in the request's `userLocale`; 204 when there is none. One
            deadline (500 ms by default) covers the whole answer: past it, the fallback. Stale (over 5 minutes) and
            replayed requests are refused. Any Content-Type is accepted. Needs an offers catalog (404
            `eligibility_not_configured` otherwise).
            Each Apple endpoint verifies at most 32 requests at once, once their bodies are in (a body must arrive within 5 s, else 400 `body_incomplete`); beyond, 503 `overloaded` with `Retry-After`.
          security:
            - {}
          requestBody:
            required: true
            content:
              application/json:
                schema:
                  type: object
                  required: [signedPayload]
                  properties:
                    signedPayload: {type: string, minLength: 1}
          responses:
            '200':
              description: The retention message to show.
              content:
                application/json:
                  schema:
                    type: object
                    minProperties: 1
                    maxProperties: 1
                    properties:
                      message:
                        type: object
                        required: [messageIdentifier]
                        properties:
                          messageIdentifier: {type: string}
                      alternateProduct:
                        type: object
                        required: [messageIdentifier, productId]
                        properties:
                          messageIdentifier: {type: string}
                          productId: {type: string}
                          billingPlanType: {type: string, enum: [BILLED_UPFRONT, MONTHLY]}
                      promotionalOffer:
                        type: object
                        required: [messageIdentifier]
                        properties:
                          messageIdentifier: {type: string}
                          promotionalOfferSignatureV2: {type: string}
                          promotionalOfferSignatureV1:
                            type: object
                            required: [encodedSignature, productId, nonce, timestamp, keyId, offerIdentifier]
                            properties:
                              encodedSignature: {type: string}
                              productId: {type: string}
                              nonce: {type: string}
                              timestamp: {type: integer}
                              keyId: {type: string}
                              offerIdentifier: {type: string}
                              appAccountToken: {type: string}
            '204':
              description: Nothing to show (Apple shows the default message).
            '400': {$ref: '#/components/responses/Problem'}
            '403': {$ref: '#/components/responses/Problem'}
            '404': {$ref: '#/components/responses/Problem'}
            '409': {$ref: '#/components/responses/Problem'}
            '413': {$ref: '#/components/responses/Problem'}
            '503': {$ref: '#/components/responses/Problem'}
      /healthz:
        get:
          operationId: health
          summary: Liveness
          security: []
          responses:
            '200':
              description: The process is up.
              content:
                application/json:
                  schema:
                    type: object
                    required: [status]
                    properties:
                      status: {type: string, const: ok}
      /readyz:
        get:
          operationId: readiness
          summary: Readiness (store reachable, a usable key for each app, audit commits getting through)
          description: |
            Answered from the state a background check keeps (the store is checked every second, never per request).
            Without credentials: the status alone. With `?detail` and `Authorization: Bearer <operator token>`
            (`--operator-token-file`): the problems, registry version, number of apps and last store check (401
            without the token; 429 for a while after too many wrong tokens from one address).
          security:
            - {}
            - operator: []
          parameters:
            - name: detail
              in: query
              required: false
              allowEmptyValue: true
              schema: {type: string}
          responses:
            '200':
              description: Ready to sign.
              content:
                application/json:
                  schema:
                    type: object
                    required: [status]
                    properties:
                      status: {type: string, const: ready}
                      problems: {type: array, items: {type: string}}
                      registryVersion: {type: integer}
                      apps: {type: integer}
                      storeCheckedAt: {type: string}
                      registryRowsRejected: {type: integer, description: 'Key and client rows left out because their MAC under the master key does not verify (with ?detail)'}
                      registryManifestVerified: {type: boolean, description: 'The last registry read matched its manifest; false: the last verified registry keeps serving (with ?detail)'}
                      registryManifestProblem: {type: string, description: 'Why the last registry read was refused: rows added, deleted or restored outside offer-signer, or a rollback (with ?detail)'}
                      auditCheckpointRefused: {type: boolean, description: 'The audit checkpointer refuses to sign: the chain does not extend the last signed checkpoint, or the audit-signing key row is missing or replaced (with ?detail)'}
            '401': {$ref: '#/components/responses/Problem'}
            '429': {$ref: '#/components/responses/Problem'}
            '503': {$ref: '#/components/responses/Problem'}
      /metrics:
        get:
          operationId: metrics
          summary: Prometheus metrics (operator token required)
          description: |
            Its labels name apps, offers and keys, so it needs `Authorization: Bearer <operator token>`
            (`--operator-token-file`); 401 otherwise, and 429 (`rate_limited`) for a while after too many
            wrong tokens from one address.
          security:
            - operator: []
          responses:
            '200':
              description: Prometheus text exposition format.
              content:
                text/plain:
                  schema: {type: string}
            '401': {$ref: '#/components/responses/Problem'}
            '429': {$ref: '#/components/responses/Problem'}
      /openapi.yaml:
        get:
          operationId: openapi
          summary: This document
          security: []
          responses:
            '200':
              description: OpenAPI 3.1 document.
              content:
                application/yaml:
                  schema: {type: string}
      /problems/{code}:
        get:
          operationId: problemType
          summary: What a problem code means
          description: |
            A problem document's `type` is `/problems/<code>`, relative to this service; this answers what the code
            means, the HTTP status it comes with and what the caller should do. 404 `not_found` for a code the
            service never sends.
          security: []
          parameters:
            - name: code
              in: path
              required: true
              schema: {type: string}
          responses:
            '200':
              description: The problem type.
              content:
                application/json:
                  schema:
                    $ref: '#/components/schemas/ProblemType'
            '404': {$ref: '#/components/responses/Problem'}
    """# + AdminOpenAPI.paths + #"""
    components:
      securitySchemes:
        bearer:
          type: http
          scheme: bearer
          description: An API key (`os_…`, from `offer-signer clients create`) or an end-user JWT from the app's auth server.
        operator:
          type: http
          scheme: bearer
          description: The operator token (`--operator-token-file`), for `GET /readyz?detail` and `GET /metrics`.
        admin:
          type: http
          scheme: bearer
          description: The admin token (`--admin-token-file`), for the dashboard (`/admin`); browsers use the session cookie of `POST /admin/login`.
      headers:
        RequestID:
          description: The request's ID, also in the server log.
          schema: {type: string}
      responses:
        AdminPage:
          description: A dashboard page (XHTML, inline SVG charts, no script).
          content:
            text/html:
              schema: {type: string}
        AdminRedirect:
          description: See `Location`.
          headers:
            Location:
              required: true
              schema: {type: string}
        Problem:
          description: An RFC 9457 problem document.
          headers:
            X-Request-ID:
              $ref: '#/components/headers/RequestID'
          content:
            application/problem+json:
              schema:
                $ref: '#/components/schemas/Problem'
        RateLimited:
          description: Rate limit exceeded.
          headers:
            Retry-After:
              description: Seconds until a request may succeed.
              required: true
              schema: {type: string, pattern: '^[0-9]+$'}
            X-Request-ID:
              $ref: '#/components/headers/RequestID'
          content:
            application/problem+json:
              schema:
                $ref: '#/components/schemas/Problem'
      schemas:
        Identifier:
          type: string
          minLength: 1
          maxLength: 255
          description: At most 255 UTF-8 bytes, no control or invisible characters, no surrounding whitespace.
        UUID:
          type: string
          pattern: '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$'
        SignatureRequest:
          type: object
          additionalProperties: false
          required: [productID, offerID]
          properties:
            productID: {$ref: '#/components/schemas/Identifier'}
            offerID: {$ref: '#/components/schemas/Identifier'}
            appAccountToken:
              description: The UUID the purchase will carry (any case; signed in lowercase). With a user JWT it must be the user's own, and defaults to it.
              $ref: '#/components/schemas/UUID'
            bundleID:
              description: Required when the service signs for more than one app.
              $ref: '#/components/schemas/Identifier'
            formats:
              type: array
              minItems: 1
              items: {type: string, enum: [legacy, jws, intro-eligibility]}
              default: [legacy]
              description: |
                legacy and/or jws; or intro-eligibility alone (API clients only, 403 intro_eligibility_not_allowed for a
                user JWT), which needs transactionID and allowIntroductoryOffer and answers introEligibility.
            allowIntroductoryOffer:
              type: boolean
              description: With formats [intro-eligibility] only (required there), the decision the signature carries.
            environment:
              type: string
              enum: [Production, Sandbox, Xcode, LocalTesting]
              description: |
                The App Store environment the client declares its customer is in (StoreKit's AppTransaction.environment),
                as Apple spells it (400 unknown_environment otherwise). Not verified: stored on the issuance marked declared,
                where it only orders the issuances a redemption may match (its own environment first) and never keeps a
                redemption from matching; an environment proven by Apple-signed history or evidence takes its place, and
                is strict.
            transactionID:
              description: |
                Any transaction ID of the customer (e.g. Transaction.originalID): put in the JWS (optional, recommended
                by Apple), and the customer's handle at Apple for offers whose historySource is apple or
                apple-then-client (400 transaction_id_required without it).
              $ref: '#/components/schemas/Identifier'
            evidence:
              description: |
                Required for offers with eligibility rules decided on the app's evidence (historySource client, the
                default; 400 evidence_required), used by apple-then-client when Apple cannot answer. 403 not_eligible
                with reasons when the customer does not qualify.
              $ref: '#/components/schemas/PurchaseEvidence'
        PurchaseEvidence:
          type: object
          additionalProperties: false
          description: StoreKit's jwsRepresentation strings, signed by Apple.
          properties:
            signedTransactions:
              type: array
              items: {type: string}
            signedRenewalInfos:
              type: array
              items: {type: string}
        EligibilityRequest:
          type: object
          additionalProperties: false
          properties:
            bundleID: {$ref: '#/components/schemas/Identifier'}
            appAccountToken: {$ref: '#/components/schemas/UUID'}
            offerIDs:
              type: array
              items: {$ref: '#/components/schemas/Identifier'}
              description: 'Default: every catalog offer of the bundle.'
            evidence:
              description: Needed by offers with rules decided on the app's evidence (400 evidence_required).
              $ref: '#/components/schemas/PurchaseEvidence'
            transactionID:
              description: Any transaction ID of the customer; needed by offers decided on Apple's history (400 transaction_id_required).
              $ref: '#/components/schemas/Identifier'
        EligibilityResponse:
          type: object
          additionalProperties: false
          required: [bundleID, appAccountToken, decisions]
          properties:
            bundleID: {type: string}
            appAccountToken: {type: [string, 'null']}
            decisions:
              type: array
              items: {$ref: '#/components/schemas/EligibilityDecision'}
        EligibilityDecision:
          type: object
          additionalProperties: false
          required: [offerID, eligible, reasons]
          properties:
            offerID: {type: string}
            eligible: {type: boolean}
            reasons:
              type: array
              items:
                type: string
                enum: [evidence_unverified, history_unavailable, app_account_token_mismatch, environment_mismatch, no_history, currently_subscribed, auto_renew_on, not_subscribed, paid_too_short, lapsed_too_recently, lapsed_too_long_ago, redeemed_too_recently, max_redemptions, refunded, family_shared, billing_retry, storefront_excluded, apple_win_back_available]
            eligibleFrom:
              type: string
              format: date-time
              description: When the waiting period that blocks the offer ends.
            evidenceFailures:
              type: array
              items:
                type: object
                required: [source, index, code, message]
                properties:
                  source: {type: string}
                  index: {type: integer}
                  code: {type: string}
                  message: {type: string}
            historySource:
              type: string
              enum: [apple, client, none]
              description: Whose history decided (absent for offers without rules); none when Apple could not answer and nothing else could decide.
        SignatureResponse:
          type: object
          additionalProperties: false
          required: [bundleID, productID, offerID, appAccountToken, expiresAt]
          properties:
            bundleID: {type: string}
            productID: {type: string}
            offerID: {type: string}
            appAccountToken:
              type: [string, 'null']
              description: Lowercase UUID signed for, or null. Bound into the legacy signature; not covered by the JWS, which has no token claim.
            legacy:
              type: object
              additionalProperties: false
              required: [keyID, nonce, timestamp, signature]
              properties:
                keyID: {type: string}
                nonce: {type: string, description: Lowercase UUID.}
                timestamp: {type: integer, description: UNIX time in milliseconds.}
                signature: {type: string, description: Standard Base64 of the DER ECDSA P-256 signature.}
            jws:
              type: object
              additionalProperties: false
              required: [keyID, compactJWS]
              properties:
                keyID: {type: string}
                compactJWS: {type: string}
            introEligibility:
              type: object
              additionalProperties: false
              required: [keyID, compactJWS, transactionID, allowIntroductoryOffer]
              description: For StoreKit's Product.PurchaseOption.introductoryOfferEligibility(compactJWS:).
              properties:
                keyID: {type: string}
                compactJWS: {type: string}
                transactionID: {type: string}
                allowIntroductoryOffer: {type: boolean}
            expiresAt:
              type: string
              format: date-time
              description: When StoreKit stops accepting the signature (24 hours after it was made).
        ProblemType:
          type: object
          additionalProperties: false
          required: [type, code, title, status, meaning, action]
          properties:
            type: {type: string, format: uri-reference}
            code: {type: string}
            title: {type: string}
            status: {type: integer}
            meaning: {type: string, description: What happened.}
            action: {type: string, description: What the caller should do.}
        Problem:
          type: object
          required: [type, title, status, detail, code]
          properties:
            type:
              type: string
              format: uri-reference
              description: '`/problems/<code>`, relative to this service: GET it for what the code means.'
            title: {type: string, description: The problem type's summary.}
            status: {type: integer}
            detail: {type: string}
            code: {type: string, description: Stable machine-readable code.}
            field:
              type: string
              description: With field_empty, field_too_long, field_invalid_character and duplicate_field, the member's name or path (evidence.signedTransactions).
            requestID: {type: string}
            retryAfter: {type: integer}
            reasons:
              type: array
              items: {type: string}
              description: With code not_eligible, the eligibility reasons.
            historySource:
              type: string
              enum: [apple, client, none]
              description: With code not_eligible, whose history decided.
            eligibleFrom:
              type: string
              format: date-time
            evidenceFailures:
              type: array
              description: With code not_eligible, the evidence items the service could not use.
              items:
                type: object
                required: [source, index, code, message]
                properties:
                  source: {type: string}
                  index: {type: integer}
                  code: {type: string}
                  message: {type: string}
    """#
}
