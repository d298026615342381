import Foundation

/// A seeded generator (SplitMix64) so property-test failures can be replayed: the seed is
/// in the failure message.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    let seed: UInt64

    init(seed: UInt64 = UInt64.random(in: 1...UInt64.max)) {
        self.seed = seed
        self.state = seed
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A random identifier: ASCII letters, digits, dots, dashes, underscores, and now and then
    /// non-ASCII letters, 1 to `maxLength` characters, never with invisible characters or
    /// surrounding whitespace.
    mutating func identifier(maxLength: Int = 40) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") + ["é", "ß", "日", "🙂", "ø"]
        let length = Int.random(in: 1...maxLength, using: &self)
        return String((0..<length).map { _ in alphabet.randomElement(using: &self)! })
    }

    /// A UUID string in random case.
    mutating func uuidInRandomCase() -> String {
        let uuid = UUID().uuidString
        return String(uuid.map { Bool.random(using: &self) ? Character($0.lowercased()) : $0 })
    }
}
