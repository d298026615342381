import SwiftASN1
import X509

/// Apple's marker extensions on the App Store signing chain.
public enum AppleCertificateMarkers {
    /// 1.2.840.113635.100.6.11.1: present on the leaf that signs App Store JWS.
    public static let leaf: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 11, 1]
    /// 1.2.840.113635.100.6.2.1: present on the Apple Worldwide Developer Relations intermediate.
    public static let intermediate: ASN1ObjectIdentifier = [1, 2, 840, 113_635, 100, 6, 2, 1]
}

/// Verifier policy: the chain is exactly leaf → intermediate → trusted root, the leaf carries
/// `AppleCertificateMarkers.leaf` and the intermediate `AppleCertificateMarkers.intermediate` as
/// extensions (any criticality), as Apple's app-store-server-library requires.
struct AppleMarkerOIDPolicy: VerifierPolicy, Sendable {
    static let failurePrefix = "AppleMarkerOIDPolicy: "

    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = [
        AppleCertificateMarkers.leaf, AppleCertificateMarkers.intermediate,
    ]

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        guard chain.count == 3 else {
            let count = chain.count
            return .failsToMeetPolicy(
                reason: Self.failurePrefix + "chain has \(count) certificates, expected leaf, intermediate and root")
        }
        guard chain[0].extensions[oid: AppleCertificateMarkers.leaf] != nil else {
            return .failsToMeetPolicy(reason: Self.failurePrefix + "leaf lacks OID 1.2.840.113635.100.6.11.1")
        }
        guard chain[1].extensions[oid: AppleCertificateMarkers.intermediate] != nil else {
            return .failsToMeetPolicy(reason: Self.failurePrefix + "intermediate lacks OID 1.2.840.113635.100.6.2.1")
        }
        return .meetsPolicy
    }
}
