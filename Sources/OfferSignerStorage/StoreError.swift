/// A storage failure with a stable code.
public struct StoreError: Error, Sendable, Equatable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// The store cannot be opened, read or written (missing, read-only, disk full…).
        public static let unavailable = Code(rawValue: "store_unavailable")
        /// The store did not answer, or a lock was not free, within the time allowed.
        public static let timeout = Code(rawValue: "store_timeout")
        /// The thing named does not exist.
        public static let notFound = Code(rawValue: "not_found")
        /// The thing exists already (key ID, client name, nonce).
        public static let duplicate = Code(rawValue: "duplicate")
        /// The operation is not allowed in the current state.
        public static let conflict = Code(rawValue: "conflict")
        /// The master key cannot open this store's sealed keys.
        public static let masterKeyMismatch = Code(rawValue: "master_key_mismatch")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
