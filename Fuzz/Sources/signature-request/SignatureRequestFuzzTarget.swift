import Foundation
@_spi(Fuzzing) import OfferSignerServer

/// libFuzzer target: arbitrary bytes as a `POST /v1/offers/signatures` body.
///
/// Feeds each input to the three readers the server uses and cross-checks them; any crash, hang
/// or broken rule is a finding:
/// - the plain reader, the decoder path and the duplicate-member scan never crash;
/// - when the plain reader accepts a body, the decoder path accepts it with the same values,
///   and the scan finds no duplicate (the plain reader refuses repeated members);
/// - when the scan finds a duplicate, the decoder path refuses the body with `duplicate_field`;
/// - every refusal of the decoder path has one of the documented codes.
@_cdecl("LLVMFuzzerTestOneInput")
public func signatureRequestFuzzTarget(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let body = Data(bytes: start, count: count)
    let plain = SignatureRequestReaders.plainReader(body)
    let decoded = SignatureRequestReaders.decoder(body)
    let duplicate = SignatureRequestReaders.firstDuplicateMember(body)

    if let plain {
        switch decoded {
        case .success(let fields):
            guard fields == plain else {
                fatalError("the plain reader read {\(plain)} but the decoder read {\(fields)}")
            }
        case .failure(let refusal):
            fatalError("the plain reader accepted the body as {\(plain)} but the decoder refused it: \(refusal.code): \(refusal.detail)")
        }
        guard duplicate == nil else {
            fatalError("the plain reader accepted a body in which the duplicate scan found '\(duplicate!)' twice")
        }
    }
    if let duplicate {
        guard case .failure(let refusal) = decoded, refusal.code == "duplicate_field" else {
            fatalError("the duplicate scan found '\(duplicate)' twice but the decoder path answered \(decoded)")
        }
    }
    if case .failure(let refusal) = decoded {
        let documented: Set<String> = ["malformed_json", "duplicate_field", "unknown_field", "missing_field", "wrong_type"]
        guard documented.contains(refusal.code) else {
            fatalError("the decoder path refused with the undocumented code '\(refusal.code)': \(refusal.detail)")
        }
    }
    return 0
}
