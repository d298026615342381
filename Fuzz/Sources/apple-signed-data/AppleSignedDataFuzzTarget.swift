import Dispatch
import Foundation
import OfferSignerEvidence

/// libFuzzer target: arbitrary bytes as the compact JWS of an Apple-signed transaction and
/// renewal info (`evidence.signedTransactions` / `signedRenewalInfos` in a request), through
/// `AppleSignedDataVerifier` with its default trust (Apple Root CA - G3).
///
/// Rules checked besides "never crashes": both verifications fail — a fuzzer cannot make data
/// that chains to Apple's root and carries a valid ES256 signature, so a success is a forged
/// verification — and each failure has a message.
@_cdecl("LLVMFuzzerTestOneInput")
public func appleSignedDataFuzzTarget(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    verifyBoth(String(decoding: UnsafeRawBufferPointer(start: start, count: count), as: UTF8.self))
    return 0
}

/// Runs once before the first input. The verifier is process-wide, as in the server, and its
/// first use initialises lazy globals (`Certificate.appleRootCAG3`, the chain policies' tables)
/// that live until exit; so the whole path runs once here, on a JWS whose chain is Apple's root
/// three times, and no input pays for (or is blamed for) that one-time work.
/// (`Fuzz/lsan-suppressions.txt` says why the root's key still needs a leak suppression.)
@_cdecl("LLVMFuzzerInitialize")
public func appleSignedDataFuzzInitialize(
    _ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>
) -> CInt {
    let root = AppleRootCA.g3PEM.split(separator: "\n").filter { !$0.hasPrefix("-----") }.joined()
    func base64URL(_ text: String) -> String {
        Data(text.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
    let header = base64URL(#"{"alg":"ES256","x5c":["\#(root)","\#(root)","\#(root)"]}"#)
    let payload = base64URL(#"{"bundleId":"com.example.app","signedDate":1700000000000,"environment":"Sandbox"}"#)
    let signature = String(repeating: "A", count: 86)
    verifyBoth("\(header).\(payload).\(signature)")
    verifyBoth("..")
    return 0
}

private let verifier = AppleSignedDataVerifier(bundleID: "com.example.app", environment: nil)

/// A fixed time inside Apple Root CA - G3's validity, so runs are reproducible.
private let now = Date(timeIntervalSince1970: 1_790_000_000)

private func verifyBoth(_ jws: String) {
    let finished = DispatchSemaphore(value: 0)
    Task {
        switch await verifier.verifyTransaction(jws, now: now) {
        case .success(let transaction):
            fatalError("verified a transaction no one signed: \(transaction)")
        case .failure(let failure):
            precondition(!failure.message.isEmpty, "a transaction failure (\(failure.code)) without a message")
        }
        switch await verifier.verifyRenewalInfo(jws, now: now) {
        case .success(let info):
            fatalError("verified a renewal info no one signed: \(info)")
        case .failure(let failure):
            precondition(!failure.message.isEmpty, "a renewal info failure (\(failure.code)) without a message")
        }
        finished.signal()
    }
    finished.wait()
}
