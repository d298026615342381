// Test only: scripting StoreKit's answers to purchases, and recording what the client asked.
import Foundation

/// Which purchase entry point the client called.
public enum PurchaseEntryPoint: Sendable, Hashable {
    /// `Product.purchase(options:)`.
    case options
    /// `Product.purchase(confirmIn:options:)` with a `UIScene` (visionOS).
    case confirmInScene
}

/// One purchase call as StoreKit received it.
public struct PurchaseCall: Sendable {
    public var entryPoint: PurchaseEntryPoint
    public var options: Set<Product.PurchaseOption>
}

/// StoreKit's answers, one per purchase call in order (the last one repeats), and the calls made.
public final class PurchaseScript: Sendable {
    public enum Answer: Sendable {
        case result(Product.PurchaseResult)
        case error(Product.PurchaseError)
    }

    private let state: LockedState<(answers: [Answer], calls: [PurchaseCall])>

    public init(_ answers: [Answer]) {
        precondition(!answers.isEmpty, "script at least one answer")
        state = LockedState((answers, []))
    }

    /// The calls made so far.
    public var calls: [PurchaseCall] { state.withLock { $0.calls } }

    func run(_ call: PurchaseCall) async throws -> Product.PurchaseResult {
        let answer = state.withLock { state -> Answer in
            state.calls.append(call)
            return state.answers.count > 1 ? state.answers.removeFirst() : state.answers[0]
        }
        switch answer {
        case .result(let result): return result
        case .error(let error): throw error
        }
    }
}

/// Records `Transaction.finish()` calls.
public final class FinishLog: Sendable, Hashable {
    private let state = LockedState<[UInt64]>([])

    public init() {}

    /// The IDs of the transactions finished, in order.
    public var finished: [UInt64] { state.withLock { $0 } }

    func record(_ id: UInt64) { state.withLock { $0.append(id) } }

    public static func == (lhs: FinishLog, rhs: FinishLog) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
}

/// A value behind an `NSLock` (the shim keeps the client's platform floors, below `Mutex`'s).
final class LockedState<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: Value

    init(_ value: Value) { self.value = value }

    func withLock<Result>(_ body: (inout Value) throws -> Result) rethrows -> Result {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
