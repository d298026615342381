import Crypto
import OfferSignerCore

/// libFuzzer target: arbitrary bytes as `.p8` / public-key PEM text (what `keys import`,
/// `verify --public-key` and `sign --key-file` read), through `PEMDocument` and
/// `InAppPurchaseKey`'s parsers.
///
/// Rules checked besides "never crashes":
/// - a parsed private key round-trips: its PKCS#8 PEM parses back to the same key;
/// - a parsed public key round-trips through its PEM;
/// - `parseVerificationKey` agrees with `parsePrivateKey` / `parsePublicKey` on the same text.
@_cdecl("LLVMFuzzerTestOneInput")
public func pemKeyFuzzTarget(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let text = String(decoding: UnsafeRawBufferPointer(start: start, count: count), as: UTF8.self)

    let privateKey = try? InAppPurchaseKey.parsePrivateKey(pem: text)
    if let privateKey {
        guard let again = try? InAppPurchaseKey.parsePrivateKey(pem: privateKey.pemRepresentation),
            again.rawRepresentation == privateKey.rawRepresentation
        else {
            fatalError("a parsed private key does not parse back from its own PKCS#8 PEM")
        }
    }
    let publicKey = try? InAppPurchaseKey.parsePublicKey(pem: text)
    if let publicKey {
        guard let again = try? InAppPurchaseKey.parsePublicKey(pem: publicKey.pemRepresentation),
            again.rawRepresentation == publicKey.rawRepresentation
        else {
            fatalError("a parsed public key does not parse back from its own PEM")
        }
    }
    let verificationKey = try? InAppPurchaseKey.parseVerificationKey(pem: text)
    let expected = text.contains("-----BEGIN PUBLIC KEY-----") ? publicKey : privateKey?.publicKey
    guard verificationKey?.rawRepresentation == expected?.rawRepresentation else {
        fatalError("parseVerificationKey disagrees with parsePrivateKey/parsePublicKey on the same text")
    }
    return 0
}
