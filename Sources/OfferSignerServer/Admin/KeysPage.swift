import Foundation
import OfferSignerStorage

/// The Keys and audit page (`/admin/keys`): each app's signing keys with their states and a
/// rotation timeline, the audit chain's head, the last signed checkpoint, and when `audit verify`
/// last passed.
///
/// Rules: never key material: key IDs, states, times, origins and the public key's fingerprint
/// only (no PEM, no sealed private key, no row MAC). The rows are the store's as read, not
/// verified: a row the serving ``KeyRing`` does not hold (its MAC or the registry manifest does
/// not verify) is marked "not served". The audit verification line is what `offer-signer audit
/// verify` recorded in the store, which nothing signs.
struct AdminKeysPage: Sendable {
    var keys: [SigningKeyRecord]
    var auditCount: Int64
    var auditHash: String
    var checkpoint: AuditCheckpoint?
    var lastVerification: AuditVerificationRecord?
    /// Key IDs the serving key ring holds.
    var served: Set<String>
    var generatedAt: Date

    static func load(store: any OfferSignerStore, served: Set<String>, now: Date) async throws -> AdminKeysPage {
        let head = try await store.auditHead()
        return AdminKeysPage(
            keys: try await store.listKeys(), auditCount: head.count, auditHash: head.hash, checkpoint: try await store.latestCheckpoint(),
            lastVerification: try await store.lastAuditVerification(), served: served, generatedAt: now)
    }

    func page() -> String {
        var body: [HTML] = [.element("h2", text: "Signing keys")]
        if keys.isEmpty {
            body.append(AdminLayout.empty("No key yet: offer-signer keys import or keys generate."))
        } else {
            let lanes = keys.sorted { ($0.bundleID, $0.importedAt) < ($1.bundleID, $1.importedAt) }.map { key in
                AdminChart.Lane(name: key.keyID, segments: segments(key), events: events(key))
            }
            if let chart = AdminChart.timeline(label: "Key rotation timeline (ready, active, retired, revoked)", lanes: lanes, now: generatedAt) {
                body.append(chart)
            }
            body.append(
                AdminLayout.table(
                    ["app", "key ID", "state", "served", "issuer ID", "origin", "fingerprint", "imported", "activated", "retired", "revoked"],
                    keys.sorted { ($0.bundleID, $0.importedAt) < ($1.bundleID, $1.importedAt) }.map { key in
                        [
                            .text(key.bundleID), .element("span", [("data-key", key.keyID)], text: key.keyID),
                            .element("span", [("class", key.state == .revoked ? "warn" : key.state == .active ? "ok" : nil), ("data-state", key.state.rawValue)], text: key.state.rawValue),
                            AdminRegistryBanner.servedCell(served.contains(key.keyID)),
                            .text(key.issuerID ?? "–"), .text(key.origin), .text(key.fingerprint), .text(AdminFormat.time(key.importedAt)),
                            .text(AdminFormat.time(key.activatedAt)), .text(AdminFormat.time(key.retiredAt)), .text(AdminFormat.time(key.revokedAt)),
                        ]
                    }))
            let bundles = Set(keys.map(\.bundleID))
            let withoutActive = bundles.filter { bundle in !keys.contains { $0.bundleID == bundle && $0.state == .active } }.sorted()
            if !withoutActive.isEmpty {
                body.append(.element("p", [("class", "warn")], text: "No active key (nothing is signed) for: \(withoutActive.joined(separator: ", "))"))
            }
        }
        body.append(.element("h2", text: "Audit log"))
        body.append(
            AdminLayout.table(
                ["", ""],
                [
                    [.text("records (head sequence)"), .element("span", [("data-audit", "count")], text: String(auditCount))],
                    [.text("head hash"), .element("code", [("data-audit", "hash")], text: auditHash)],
                    [.text("last signed checkpoint"), .element("span", [("data-audit", "checkpoint")], text: checkpoint.map { "#\($0.sequence)" } ?? "none")],
                    [.text("checkpoint signed at"), .text(AdminFormat.time(checkpoint?.createdAt))],
                    [.text("records since the checkpoint"), .text(String(auditCount - (checkpoint?.sequence ?? 0)))],
                    [.text("checkpoint key fingerprint"), .text(checkpoint?.keyFingerprint ?? "–")],
                    [
                        .text("audit verify last passed (recorded by the CLI in the store, not signed)"),
                        .element(
                            "span", [("data-audit", "verified")],
                            text: lastVerification.map { "\(AdminFormat.time($0.verifiedAt)) (\($0.recordsChecked) records, through #\($0.throughSequence))" } ?? "never recorded"),
                    ],
                ]))
        if lastVerification == nil {
            body.append(.element("p", [("class", "muted")], text: "offer-signer audit verify records each intact run in the store; run it (e.g. daily from cron) to see it here."))
        }
        return AdminLayout.document(title: AdminPage.keys.title, page: AdminPage.keys.rawValue, navigation: .keys, generatedAt: generatedAt, body: body)
    }

    private func segments(_ key: SigningKeyRecord) -> [(start: Date, end: Date, className: String, title: String)] {
        var segments: [(start: Date, end: Date, className: String, title: String)] = []
        let end = key.revokedAt ?? generatedAt
        let activeFrom = key.activatedAt
        let retiredFrom = key.retiredAt
        let readyEnd = activeFrom ?? retiredFrom ?? end
        if readyEnd > key.importedAt { segments.append((key.importedAt, readyEnd, "ready", "\(key.keyID) ready from \(AdminFormat.time(key.importedAt))")) }
        if let activeFrom {
            let activeEnd = retiredFrom ?? end
            segments.append((activeFrom, max(activeFrom, activeEnd), "active", "\(key.keyID) active from \(AdminFormat.time(activeFrom))"))
        }
        if let retiredFrom { segments.append((retiredFrom, max(retiredFrom, end), "retired", "\(key.keyID) retired from \(AdminFormat.time(retiredFrom))")) }
        if segments.isEmpty { segments.append((key.importedAt, max(key.importedAt, end), key.state.rawValue, "\(key.keyID) \(key.state.rawValue)")) }
        return segments
    }

    private func events(_ key: SigningKeyRecord) -> [(time: Date, title: String)] {
        var events: [(time: Date, title: String)] = [(key.importedAt, "\(key.keyID) imported \(AdminFormat.time(key.importedAt))")]
        if let revoked = key.revokedAt { events.append((revoked, "\(key.keyID) revoked \(AdminFormat.time(revoked))")) }
        return events
    }
}
