import HTTPTypes
import OfferSignerCore

/// One kind of problem the service reports: a stable `code`, the HTTP status it always comes
/// with, and what it means and what the caller should do about it.
///
/// Rule: its problem `type` is the relative URI `/problems/<code>` (RFC 9457 §3.1.1), resolved
/// against the service that sent it, which answers `GET /problems/<code>` with this entry. So
/// the type can never point at a domain someone else controls.
public struct ProblemType: Sendable, Equatable {
    /// Stable, machine-readable code (`snake_case`); never changes meaning.
    public let code: String
    /// The HTTP status every problem of this type is sent with.
    public let status: HTTPResponse.Status
    /// A short summary of the type (the problem document's `title`).
    public let title: String
    /// What happened.
    public let meaning: String
    /// What the caller should do.
    public let action: String

    /// The problem document's `type`: a relative URI the service itself resolves.
    public var uri: String { "/problems/\(code)" }

    /// This entry as the JSON `GET /problems/<code>` answers.
    public var json: String {
        var writer = JSONObjectWriter()
        writer.field("type", uri)
        writer.field("code", code)
        writer.field("title", title)
        writer.field("status", Int64(status.code))
        writer.field("meaning", meaning)
        writer.field("action", action)
        return writer.finish()
    }
}

/// Every problem code the HTTP service can send, in one table: the problem documents take their
/// `title` from it, `GET /problems/<code>` serves it, and a test checks that `Docs/Errors.md`
/// lists every entry and that every code the sources throw is in it.
public enum ProblemCatalog {
    public static let all: [ProblemType] = [
        // 400: the request itself is wrong; resending it unchanged fails again.
        ProblemType(
            code: "bad_request", status: .badRequest, title: "Unreadable HTTP request",
            meaning: "the HTTP layer could not read the request (before any endpoint looked at it)",
            action: "fix the request; `detail` says what was wrong"),
        ProblemType(
            code: "invalid_query", status: .badRequest, title: "Invalid query parameter",
            meaning: "a query parameter has a value the route does not take (e.g. `/admin/offers?days=` other than 30 or 90); `detail` names it",
            action: "use one of the values `detail` lists"),
        ProblemType(
            code: "malformed_json", status: .badRequest, title: "Body is not a JSON object",
            meaning: "the body is not valid JSON, or not a JSON object",
            action: "send one JSON object, UTF-8, as the endpoint's schema describes"),
        ProblemType(
            code: "missing_field", status: .badRequest, title: "Required member missing",
            meaning: "a required member is absent; `detail` names it",
            action: "add the member"),
        ProblemType(
            code: "wrong_type", status: .badRequest, title: "Member of the wrong type",
            meaning: "a member has the wrong JSON type (a number for a string, say); `detail` names it",
            action: "send the type the schema gives"),
        ProblemType(
            code: "unknown_field", status: .badRequest, title: "Unknown member",
            meaning: "the body has a member the endpoint does not know (often a misspelling, such as `appAcountToken`); refused so a misspelt token never yields an unbound signature",
            action: "fix the member's name or remove it"),
        ProblemType(
            code: "duplicate_field", status: .badRequest, title: "Member named twice",
            meaning: "one object names a member twice (even through an escape); refused rather than resolved by picking one value. `field` names it",
            action: "send each member once"),
        ProblemType(
            code: "body_incomplete", status: .badRequest, title: "Body cut off",
            meaning: "the connection closed before the request body's end (a client that stopped sending, or one closed by `--idle-timeout-seconds`), or, on Apple's endpoints, the body did not arrive within 5 s",
            action: "send the whole body within the idle timeout; retry on a new connection"),
        ProblemType(
            code: "unknown_format", status: .badRequest, title: "Unknown signature format",
            meaning: "`formats` is empty, names something other than `legacy`, `jws` and `intro-eligibility`, or mixes `intro-eligibility` with the others",
            action: "ask for `[\"legacy\"]`, `[\"jws\"]` or both, or `[\"intro-eligibility\"]` alone"),
        ProblemType(
            code: "unknown_bundle", status: .badRequest, title: "Unknown app",
            meaning: "`bundleID` is not an app this service has a key for",
            action: "check the bundle ID, or import a key for the app (`offer-signer keys import`)"),
        ProblemType(
            code: "bundle_required", status: .badRequest, title: "Bundle ID required",
            meaning: "the service signs for several apps and the request does not say which",
            action: "send `bundleID`"),
        ProblemType(
            code: "invalid_app_account_token", status: .badRequest, title: "appAccountToken is not a UUID",
            meaning: "`appAccountToken` is not a UUID (any case is accepted); `field` names it",
            action: "send the UUID the purchase will carry as its appAccountToken"),
        ProblemType(
            code: "field_empty", status: .badRequest, title: "Empty member",
            meaning: "a required string member is empty; `field` names it",
            action: "send a value"),
        ProblemType(
            code: "field_too_long", status: .badRequest, title: "Member too long",
            meaning: "a string member is longer than its limit; `field` names it",
            action: "send the identifier App Store Connect shows, which fits"),
        ProblemType(
            code: "field_invalid_character", status: .badRequest, title: "Invalid character in a member",
            meaning: "a member holds a control or invisible format character (U+2063 among them) or leading or trailing whitespace; `field` names it (or its path, such as `evidence.signedTransactions`)",
            action: "send the identifier exactly as App Store Connect shows it"),
        ProblemType(
            code: "unknown_environment", status: .badRequest, title: "Unknown environment",
            meaning: "`environment` is not one of Apple's `Production`, `Sandbox`, `Xcode` and `LocalTesting` (spelt as Apple spells them)",
            action: "send StoreKit's `AppTransaction.environment` as Apple spells it, or leave the member out"),
        ProblemType(
            code: "app_account_token_empty", status: .badRequest, title: "Empty appAccountToken",
            meaning: "`appAccountToken` is an empty or whitespace-only string; refused so a client that meant a token never gets a signature bound to no one",
            action: "send the customer's UUID, or leave the member out"),
        ProblemType(
            code: "evidence_required", status: .badRequest, title: "Eligibility evidence required",
            meaning: "the catalog offer has eligibility rules, and the request carries no evidence",
            action: "send `evidence.signedTransactions` and `evidence.signedRenewalInfos` from StoreKit"),
        ProblemType(
            code: "transaction_id_required", status: .badRequest, title: "Transaction ID required",
            meaning: "the catalog offer is decided on Apple's history (`historySource` `apple`, or `apple-then-client` without evidence), or a user JWT asked for a JWS, and the request names no transaction of the customer",
            action: "send `transactionID` (any of the customer's, for example `Transaction.originalID`)"),
        ProblemType(
            code: "product_not_in_offer", status: .badRequest, title: "Offer does not apply to this product",
            meaning: "the offers catalog says this offer is not for the requested product",
            action: "ask for the offer with one of its products (see the offers catalog)"),
        ProblemType(
            code: "unknown_offer", status: .badRequest, title: "Unknown offer",
            meaning: "an eligibility question names an offer that is not in the app's offers catalog",
            action: "ask about offers the catalog has, or add the offer to it"),
        ProblemType(
            code: "too_much_evidence", status: .badRequest, title: "Too much evidence",
            meaning: "the evidence holds more JWS than the service accepts (1000)",
            action: "send the subscription group's transactions only"),
        // 401, 403: who is asking.
        ProblemType(
            code: "notification_unverified", status: .badRequest, title: "Notification not signed by Apple",
            meaning: "an App Store Server Notification's `signedPayload`, or a JWS inside it, did not verify (chain to Apple's root, Apple's marker OIDs, ES256 signature, readable payload); nothing was stored. The same answer whatever app the payload names: nothing is compared with the configuration before the signature verified",
            action: "nothing, if it was not Apple; otherwise check the trusted roots (`--apple-root` is for tests only)"),
        ProblemType(
            code: "retention_request_unverified", status: .badRequest, title: "Retention request not signed by Apple",
            meaning: "a Retention Messaging request's `signedPayload` did not verify (chain to Apple's root, marker OIDs, ES256, readable `DecodedRealtimeRequestBody`); nothing was signed. The same answer whatever app the payload names: nothing is compared with the configuration before the signature verified",
            action: "nothing, if it was not Apple; otherwise check the trusted roots"),
        ProblemType(
            code: "retention_request_stale", status: .badRequest, title: "Retention request too old",
            meaning: "the request was signed longer ago than the service answers (5 minutes), or more than a minute ahead of its clock; nothing was signed",
            action: "nothing: Apple shows its default message; check the server's clock if this is frequent"),
        ProblemType(
            code: "unauthorized", status: .unauthorized, title: "Missing or invalid credentials",
            meaning: "no `Authorization: Bearer`, or an unknown or revoked API key, or a user JWT that does not verify; comes with `WWW-Authenticate: Bearer`",
            action: "send a valid API key or user JWT; do not retry unchanged"),
        ProblemType(
            code: "bundle_not_allowed", status: .forbidden, title: "Client not allowed for this app",
            meaning: "the API client is limited to other apps (`clients create --bundle-id`)",
            action: "use a client made for this app"),
        ProblemType(
            code: "retention_request_foreign", status: .forbidden, title: "Retention request for another app",
            meaning: "a verified request's `appAppleId` is not the `appAppleID` of a catalog app with a `retention` plan (in Sandbox, where Apple does not check it, a request naming no catalog app goes to the one app with a plan), or its environment is not one the app accepts; nothing was signed",
            action: "set the app's `appAppleID`, `environments` and `retention` in the offers catalog, or point Apple's realtime URL at the right service"),
        ProblemType(
            code: "token_binding_mismatch", status: .forbidden, title: "Someone else's appAccountToken",
            meaning: "a user JWT asked for an appAccountToken other than the user's own",
            action: "send the user's own token, or leave `appAccountToken` out (it defaults to the user's)"),
        ProblemType(
            code: "intro_eligibility_not_allowed", status: .forbidden, title: "Introductory-offer eligibility for API clients only",
            meaning: "a user JWT asked for an `intro-eligibility` signature, which overrides Apple's own decision and is signed for the app's backend only",
            action: "ask for it from your backend, with an API key"),
        ProblemType(
            code: "host_not_loopback", status: .forbidden, title: "Not addressed to loopback",
            meaning: "under `--dev`, the request's `Host` is not `localhost`, `127.0.0.1` or `[::1]` (with the server's port): refused so a web page re-pointed at 127.0.0.1 (DNS rebinding) cannot use the unauthenticated dev server",
            action: "call the dev server as http://localhost:PORT or http://127.0.0.1:PORT"),
        ProblemType(
            code: "cross_site_request", status: .forbidden, title: "Cross-site dashboard form",
            meaning: "`POST /admin/login` or `/admin/logout` came from another site: `Sec-Fetch-Site` is `cross-site`, or `Origin` is not the server's own (login and logout CSRF)",
            action: "sign in and out from the dashboard's own pages; behind a proxy, keep the `Host` header the browser sent"),
        ProblemType(
            code: "offer_not_in_catalog", status: .forbidden, title: "Offer not available to end users",
            meaning: "a user JWT asked for an offer the offers catalog does not name for the app (end users get catalogued offers only; without `--offers`, none)",
            action: "ask for a catalogued offer; operators: add the offer to the catalog, or sign it from a backend with an API key"),
        ProblemType(
            code: "transaction_not_owned", status: .forbidden, title: "Transaction not shown to be the user's",
            meaning: "a user JWT asked for a JWS naming a `transactionID` that no Apple-signed data carrying the user's appAccountToken ties to the user (the request's evidence, or Apple's history of that transaction)",
            action: "send the user's own transaction ID with its signed transaction as `evidence`; purchases must carry the user's appAccountToken"),
        ProblemType(
            code: "not_eligible", status: .forbidden, title: "Customer not eligible",
            meaning: "the customer's verified history does not meet the offer's eligibility rules; `reasons` (and `eligibleFrom`, when a wait ends) say why. No signature was made",
            action: "do not show the offer (or show it from `eligibleFrom`); see Docs/Eligibility.md for the reasons"),
        // 404, 405: the route.
        ProblemType(
            code: "not_found", status: .notFound, title: "No such route",
            meaning: "no route has this path, or `/problems/<code>` names no problem code",
            action: "check the path against `GET /openapi.yaml`"),
        ProblemType(
            code: "eligibility_not_configured", status: .notFound, title: "Eligibility not configured",
            meaning: "the eligibility endpoint was called, but the service runs without an offers catalog",
            action: "start the service with `--offers FILE`"),
        ProblemType(
            code: "method_not_allowed", status: .methodNotAllowed, title: "Method not allowed",
            meaning: "the path exists, but not with this method; `Allow` lists the methods it takes",
            action: "use a method from `Allow`"),
        // 413, 415, 422: the body as a whole.
        ProblemType(
            code: "retention_request_replayed", status: .conflict, title: "Retention request answered before",
            meaning: "a request with this `requestIdentifier` was answered before (Apple makes a new one per request); nothing was signed",
            action: "nothing: a replay of a captured request gets no second signature"),
        ProblemType(
            code: "body_too_large", status: .contentTooLarge, title: "Body too large",
            meaning: "the body is larger than the endpoint takes: `--max-body-bytes` for signing and eligibility (1 MiB by default), 256 KiB for a notification, 64 KiB for a Retention Messaging request",
            action: "send less (with eligibility evidence: only the subscription group's transactions)"),
        ProblemType(
            code: "unsupported_media_type", status: .unsupportedMediaType, title: "Body must be JSON",
            meaning: "`Content-Type` is not `application/json`; `Accept` says what is (Apple's endpoints, `/v1/apple/*`, take any)",
            action: "send `Content-Type: application/json`"),
        ProblemType(
            code: "issuer_id_missing", status: .unprocessableContent, title: "Key has no issuer ID",
            meaning: "the JWS format was asked for, but the app's active key was imported without `--issuer-id`",
            action: "ask for `legacy` only, or have the operator import the key again with `--issuer-id`"),
        // 429: too often.
        ProblemType(
            code: "rate_limited", status: .tooManyRequests, title: "Rate limit exceeded",
            meaning: "too many requests for this caller, or too many signatures or eligibility questions for this appAccountToken; `Retry-After` (header) and `retryAfter` (member) give seconds",
            action: "wait `Retry-After` seconds, then retry"),
        // 500, 503: the service.
        ProblemType(
            code: "internal_error", status: .internalServerError, title: "Internal error",
            meaning: "an unexpected error, the service's fault; `detail` names nothing internal, the server log has the rest under the request ID",
            action: "retry later; operators: look up `requestID` in the log"),
        ProblemType(
            code: "no_active_key", status: .serviceUnavailable, title: "No active signing key",
            meaning: "no signing key is configured, or the app has none active",
            action: "retry later; operators: `offer-signer keys import` or `keys activate`"),
        ProblemType(
            code: "audit_unavailable", status: .serviceUnavailable, title: "Audit log unavailable",
            meaning: "the audit record could not be committed, so no signature was issued",
            action: "retry later; operators: check the store's disk and the server log"),
        ProblemType(
            code: "store_unavailable", status: .serviceUnavailable, title: "Store unavailable",
            meaning: "the store failed, or did not answer within `--store-timeout-ms`; nothing was issued",
            action: "retry after `Retry-After`; operators: check the database (reachable, primary, not read-only)"),
        ProblemType(
            code: "overloaded", status: .serviceUnavailable, title: "Too many requests at once",
            meaning: "an unauthenticated Apple endpoint (`/v1/apple/notifications`, `/v1/apple/retention`) already handles as many requests as it takes at once; nothing was read or stored",
            action: "retry after `Retry-After` (Apple retries notifications itself)"),
        ProblemType(
            code: "customer_busy", status: .serviceUnavailable, title: "Customer busy",
            meaning: "another request for the same customer was still being decided (eligibility rules are decided one request at a time per customer, across instances); nothing was issued",
            action: "retry after `Retry-After`"),
        ProblemType(
            code: "not_ready", status: .serviceUnavailable, title: "Not ready",
            meaning: "`GET /readyz`: the store does not answer, or an app has no usable active key; `detail` lists what is wrong",
            action: "keep traffic away until ready; operators: fix what `detail` lists"),
    ]

    private static let byCode: [String: ProblemType] = Dictionary(all.map { ($0.code, $0) }, uniquingKeysWith: { first, _ in first })

    /// The entry for `code`, or nil if the service never sends it.
    public static func type(for code: String) -> ProblemType? { byCode[code] }
}
