import Foundation
import Testing
import TestChildProcess

@_spi(Fuzzing) import OfferSignerServer

/// The `@_spi(Fuzzing)` entry points the `signature-request` fuzz target uses (Fuzz/), over the
/// committed seed corpus and regression inputs: they answer as the server's readers do, and the
/// fuzz target's cross-check holds for every committed input without a fuzz build.
@Suite struct SignatureRequestReadersForFuzzingTests {
    static let repositoryRoot = URL(fileURLWithPath: PythonTestEnvironment.packageRoot)

    static func committedInputs() throws -> [URL] {
        var inputs: [URL] = []
        for folder in ["Fuzz/Corpus/signature-request", "Fuzz/Regressions/signature-request"] {
            let directory = repositoryRoot.appendingPathComponent(folder)
            guard FileManager.default.fileExists(atPath: directory.path) else { continue }
            inputs += try FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)
                .filter { !$0.lastPathComponent.hasPrefix(".") && $0.pathExtension != "md" }
        }
        return inputs.sorted { $0.path < $1.path }
    }

    @Test func theSeedCorpusIsThere() throws {
        #expect(try Self.committedInputs().count >= 10)
    }

    @Test func everyCommittedInputPassesTheFuzzTargetsCrossCheck() throws {
        for input in try Self.committedInputs() {
            let body = try Data(contentsOf: input)
            let name = input.lastPathComponent
            let decoded = SignatureRequestReaders.decoder(body)
            let duplicate = SignatureRequestReaders.firstDuplicateMember(body)
            if let plain = SignatureRequestReaders.plainReader(body) {
                #expect(decoded == .success(plain), "\(name)")
                #expect(duplicate == nil, "\(name)")
            }
            if duplicate != nil {
                #expect((try? decoded.get()) == nil, "\(name)")
                if case .failure(let refusal) = decoded { #expect(refusal.code == "duplicate_field", "\(name)") }
            }
        }
    }

    @Test func theEntryPointsAnswerAsTheReadersDo() throws {
        let plain = Data(#"{"productID":"pro.monthly","offerID":"WINBACK50","formats":["jws"]}"#.utf8)
        let read = try #require(SignatureRequestReaders.plainReader(plain))
        #expect(read.productID == "pro.monthly")
        #expect(read.offerID == "WINBACK50")
        #expect(read.formats == ["jws"])
        #expect(SignatureRequestReaders.decoder(plain) == .success(read))

        let duplicate = Data(#"{"productID":"a","offerID":"o","evidence":{"signedTransactions":[],"signedTransactions":[]}}"#.utf8)
        #expect(SignatureRequestReaders.plainReader(duplicate) == nil)
        #expect(SignatureRequestReaders.firstDuplicateMember(duplicate) == "evidence.signedTransactions")
        guard case .failure(let refusal) = SignatureRequestReaders.decoder(duplicate) else {
            Issue.record("a body with a duplicate member was decoded")
            return
        }
        #expect(refusal.code == "duplicate_field")

        let unknown = Data(#"{"productID":"a","offerID":"o","appAcountToken":"x"}"#.utf8)
        guard case .failure(let unknownRefusal) = SignatureRequestReaders.decoder(unknown) else {
            Issue.record("a body with an unknown member was decoded")
            return
        }
        #expect(unknownRefusal.code == "unknown_field")
    }
}
