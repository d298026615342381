import OfferSignerCore
import OfferSignerStorage
import PostgresNIO

/// The two statements that append an audit group, as prepared statements of fixed text.
///
/// Rule: a group of any size is bound as one array per column and inserted with `unnest`, so the
/// statement's text never changes: each connection parses and plans it once, and PostgreSQL then
/// only executes it. (A multi-row `VALUES` list has a new text for every group size, and was
/// parsed and planned on every commit: at one entry a group, most of PostgreSQL's CPU.)
enum AuditGroupColumns {
    /// `unnest` of the six audit columns, `audit_log (seq, recorded_at, kind, body, previous_hash,
    /// hash)`, from the parameters starting at `first`.
    static func auditRows(from first: Int) -> String {
        let p = (first..<first + 6).map { "$\($0)" }
        return "unnest(\(p[0])::int8[], \(p[1])::int8[], \(p[2])::text[], \(p[3])::text[], \(p[4])::text[], \(p[5])::text[])"
    }

    /// `unnest` of the thirteen ledger columns, `issued_signatures (nonce, audit_seq, issued_at,
    /// client, bundle_id, product_id, offer_id, app_account_token, key_id, format,
    /// original_transaction_id, environment, environment_declared)`, from the parameters starting
    /// at `first`.
    static func ledgerRows(from first: Int) -> String {
        let p = (first..<first + 13).map { "$\($0)" }
        return "unnest(\(p[0])::text[], \(p[1])::int8[], \(p[2])::int8[], \(p[3])::text[], \(p[4])::text[], "
            + "\(p[5])::text[], \(p[6])::text[], \(p[7])::text[], \(p[8])::text[], \(p[9])::text[], \(p[10])::text[], \(p[11])::text[], "
            + "\(p[12])::int8[])"
    }

    /// The roll-up's UPSERT (see ``IssuanceRollUp``): `unnest` of six arrays (day, bundle, offer,
    /// client, issued, newest time), one element per day, app, offer and client of the group,
    /// from the parameters starting at `first`; `condition` is the SELECT's WHERE.
    static func rollUp(from first: Int, condition: String) -> String {
        let p = (first..<first + 6).map { "$\($0)" }
        return "INSERT INTO offer_issuance_days (day, bundle_id, offer_id, client, issued, last_issued_at) "
            + "SELECT * FROM unnest(\(p[0])::int8[], \(p[1])::text[], \(p[2])::text[], \(p[3])::text[], \(p[4])::int8[], \(p[5])::int8[]) WHERE \(condition) "
            + "ON CONFLICT (day, bundle_id, offer_id, client) DO UPDATE SET issued = offer_issuance_days.issued + excluded.issued, "
            + "last_issued_at = GREATEST(offer_issuance_days.last_issued_at, excluded.last_issued_at)"
    }

    static let auditColumns = "audit_log (seq, recorded_at, kind, body, previous_hash, hash)"
    static let ledgerColumns =
        "issued_signatures (nonce, audit_seq, issued_at, client, bundle_id, product_id, offer_id, app_account_token, key_id, format, original_transaction_id, "
        + "environment, environment_declared)"

    /// Appends the group's 25 column arrays (six audit, thirteen ledger, six roll-up) to `binds`.
    static func append(records: [AuditRecord], signatures: [(IssuedSignature, Int64)], to binds: inout PostgresBindings) {
        binds.append(records.map(\.sequence))
        binds.append(records.map(\.recordedAt.unixMilliseconds))
        binds.append(records.map(\.kind))
        binds.append(records.map(\.body))
        binds.append(records.map(\.previousHash))
        binds.append(records.map(\.hash))
        binds.append(signatures.map(\.0.nonce))
        binds.append(signatures.map(\.1))
        binds.append(signatures.map(\.0.issuedAt.unixMilliseconds))
        binds.append(signatures.map(\.0.client))
        binds.append(signatures.map(\.0.bundleID))
        binds.append(signatures.map(\.0.productID))
        binds.append(signatures.map(\.0.offerID))
        binds.append(NullableTextArray(signatures.map(\.0.appAccountToken)))
        binds.append(signatures.map(\.0.keyID))
        binds.append(signatures.map(\.0.format))
        binds.append(NullableTextArray(signatures.map(\.0.originalTransactionID)))
        binds.append(NullableTextArray(signatures.map(\.0.environment)))
        binds.append(signatures.map { Int64($0.0.environmentIsDeclared ? 1 : 0) })
        // The roll-up: the group aggregated here, one row per day, app, offer and client.
        let days = IssuanceRollUp.aggregate(signatures.lazy.map(\.0))
        binds.append(days.map(\.day.day))
        binds.append(days.map(\.day.bundleID))
        binds.append(days.map(\.day.offerID))
        binds.append(days.map(\.day.client))
        binds.append(days.map(\.issued))
        binds.append(days.map(\.lastIssuedAt))
    }
}

/// Moves the head from `expected` to the group's last record and inserts the group, only if the
/// head is still `expected`; its one row is how many head rows moved (1, or 0 when another
/// writer had moved it, and then nothing was written). See
/// `PostgresStore.appendAuditOnKnownHead`.
struct GroupOnKnownHead: PostgresPreparedStatement {
    static let name = "offer_signer_audit_group_on_known_head_v4"
    static let sql = """
        WITH head AS (UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1 AND seq = $3 AND hash = $4 RETURNING seq), \
        audit AS (INSERT INTO \(AuditGroupColumns.auditColumns) SELECT * FROM \(AuditGroupColumns.auditRows(from: 5)) \
        WHERE EXISTS (SELECT 1 FROM head)), \
        ledger AS (INSERT INTO \(AuditGroupColumns.ledgerColumns) SELECT * FROM \(AuditGroupColumns.ledgerRows(from: 11)) \
        WHERE EXISTS (SELECT 1 FROM head)), \
        days AS (\(AuditGroupColumns.rollUp(from: 24, condition: "EXISTS (SELECT 1 FROM head)"))) \
        SELECT count(*) FROM head
        """
    typealias Row = Int64

    let bindings: PostgresBindings

    init(records: [AuditRecord], signatures: [(IssuedSignature, Int64)], head: (sequence: Int64, hash: String), expected: (Int64, String)) {
        var binds = PostgresBindings(capacity: 29)
        binds.append(head.sequence)
        binds.append(head.hash)
        binds.append(expected.0)
        binds.append(expected.1)
        AuditGroupColumns.append(records: records, signatures: signatures, to: &binds)
        bindings = binds
    }

    func makeBindings() -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws -> Int64 { try row.decode(Int64.self) }
}

/// Inserts the group and moves the head to its last record, inside a transaction that holds the
/// head's row lock. See `PostgresStore.appendAudit(_:_:_:at:)`.
struct GroupOnLockedHead: PostgresPreparedStatement {
    static let name = "offer_signer_audit_group_on_locked_head_v4"
    static let sql = """
        WITH audit AS (INSERT INTO \(AuditGroupColumns.auditColumns) SELECT * FROM \(AuditGroupColumns.auditRows(from: 3))), \
        ledger AS (INSERT INTO \(AuditGroupColumns.ledgerColumns) SELECT * FROM \(AuditGroupColumns.ledgerRows(from: 9))), \
        days AS (\(AuditGroupColumns.rollUp(from: 22, condition: "true"))) \
        UPDATE audit_head SET seq = $1, hash = $2 WHERE id = 1
        """
    typealias Row = ()

    let bindings: PostgresBindings

    init(records: [AuditRecord], signatures: [(IssuedSignature, Int64)], head: (sequence: Int64, hash: String)) {
        var binds = PostgresBindings(capacity: 27)
        binds.append(head.sequence)
        binds.append(head.hash)
        AuditGroupColumns.append(records: records, signatures: signatures, to: &binds)
        bindings = binds
    }

    func makeBindings() -> PostgresBindings { bindings }
    func decodeRow(_ row: PostgresRow) throws {}
}

/// A `text[]` whose elements may be NULL (PostgresNIO encodes arrays of non-optional elements
/// only), in PostgreSQL's binary array format: one dimension, lower bound 1, a NULL element as
/// length -1.
struct NullableTextArray: PostgresNonThrowingEncodable {
    let elements: [String?]

    init(_ elements: [String?]) { self.elements = elements }

    static var psqlType: PostgresDataType { .textArray }
    static var psqlFormat: PostgresFormat { .binary }

    func encode<JSONEncoder: PostgresJSONEncoder>(into buffer: inout ByteBuffer, context: PostgresEncodingContext<JSONEncoder>) {
        buffer.writeInteger(elements.isEmpty ? 0 : 1, as: Int32.self)  // dimensions
        buffer.writeInteger(elements.contains(nil) ? 1 : 0, as: Int32.self)  // has NULLs
        buffer.writeInteger(PostgresDataType.text.rawValue)
        guard !elements.isEmpty else { return }
        buffer.writeInteger(Int32(elements.count))  // length of the dimension
        buffer.writeInteger(1, as: Int32.self)  // its lower bound
        for element in elements {
            guard let element else {
                buffer.writeInteger(-1, as: Int32.self)
                continue
            }
            buffer.writeInteger(Int32(element.utf8.count))
            buffer.writeString(element)
        }
    }
}
