import Foundation
import OfferSignerEligibility
import Testing

/// Apple's open sets of values are coded as the bare value, as in Apple's payloads and in the
/// histories the store already holds.
@Suite("Apple's open-set values")
struct AppleOpenSetValueTests {
    struct Holder: Codable, Equatable {
        var offerType: AppleOfferType
        var reason: AppleTransactionReason
        var ownership: AppleOwnershipType
    }

    @Test("Coded as the bare value; values Apple adds later decode")
    func bareValues() throws {
        let json = #"{"offerType":7,"ownership":"PURCHASED","reason":"SOMETHING_NEW"}"#
        let decoded = try JSONDecoder().decode(Holder.self, from: Data(json.utf8))
        #expect(decoded == Holder(offerType: AppleOfferType(rawValue: 7), reason: AppleTransactionReason(rawValue: "SOMETHING_NEW"), ownership: .purchased))
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        #expect(String(decoding: try encoder.encode(decoded), as: UTF8.self) == json)
    }
}
