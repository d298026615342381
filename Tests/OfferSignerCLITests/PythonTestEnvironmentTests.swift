import Foundation
import TestChildProcess
import Testing

/// The tests' own Python environment: several provisionings at once make one environment, and a
/// half-made one is never used. Requirements are empty here (no download, and no pip: creation
/// takes a fraction of a second), so these check the locking and the completion marker; one
/// test checks how a failing pip is reported.
@Suite struct PythonTestEnvironmentTests {
    /// A fresh base folder, removed afterwards.
    static func withBase<T>(_ body: (String) async throws -> T) async throws -> T {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("offer-signer-venv-test-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: base) }
        return try await body(base)
    }

    @Test("Six provisionings started at once make one environment, created once")
    func concurrentProvisioningMakesOneEnvironment() async throws {
        try await Self.withBase { base in
            // Each on a thread of its own with its own descriptor of the lock file: flock excludes
            // them from one another exactly as it excludes two processes.
            let results = try await withThrowingTaskGroup(of: PythonTestEnvironment.self) { group in
                for _ in 0..<6 {
                    group.addTask { try await onOwnThread { try PythonTestEnvironment.provision(requirements: "", baseDirectory: base) } }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(results.count == 6)
            #expect(Set(results.map(\.directory)).count == 1)
            #expect(results.filter(\.created).count == 1)
            let entries = try FileManager.default.contentsOfDirectory(atPath: base).sorted()
            let directory = try #require(results.first?.directory)
            let name = URL(fileURLWithPath: directory).lastPathComponent
            #expect(entries == [name, "\(name).lock"])
            #expect(FileManager.default.fileExists(atPath: "\(directory)/.offer-signer-complete"))
            let python = try await ChildProcess.run(try #require(results.first?.python), ["-c", "import sys; print(sys.prefix)"], timeout: .seconds(60))
            #expect(python.status == 0)
            #expect(python.stdoutText.trimmingCharacters(in: .whitespacesAndNewlines) == directory)
        }
    }

    @Test("An environment without its completion marker is made again, not used")
    func halfMadeEnvironmentIsReplaced() async throws {
        try await Self.withBase { base in
            let first = try await onOwnThread { try PythonTestEnvironment.provision(requirements: "", baseDirectory: base) }
            #expect(first.created)
            let again = try await onOwnThread { try PythonTestEnvironment.provision(requirements: "", baseDirectory: base) }
            #expect(!again.created)
            #expect(again.directory == first.directory)

            // A creation that stopped half-way: the marker is missing, and a leftover file shows
            // whether the folder was reused.
            try FileManager.default.removeItem(atPath: "\(first.directory)/.offer-signer-complete")
            let leftover = "\(first.directory)/leftover-from-a-crash"
            #expect(FileManager.default.createFile(atPath: leftover, contents: Data()))
            let remade = try await onOwnThread { try PythonTestEnvironment.provision(requirements: "", baseDirectory: base) }
            #expect(remade.created)
            #expect(remade.directory == first.directory)
            #expect(!FileManager.default.fileExists(atPath: leftover))
            #expect(FileManager.default.fileExists(atPath: "\(remade.directory)/.offer-signer-complete"))
        }
    }

    @Test("Other requirements get an environment of their own")
    func requirementsNameTheEnvironment() async throws {
        try await Self.withBase { base in
            let plain = try await onOwnThread { try PythonTestEnvironment.provision(requirements: "", baseDirectory: base) }
            let commented = try await onOwnThread { try PythonTestEnvironment.provision(requirements: "# nothing to install\n", baseDirectory: base) }
            #expect(plain.directory != commented.directory)
            #expect(plain.created && commented.created)
        }
    }

    @Test("A failed pip install reports pip's own output, and leaves no environment to reuse")
    func pipFailureShowsPipsOutput() async throws {
        try await Self.withBase { base in
            // A local path that does not exist: pip refuses it without going to the network.
            let requirement = "/nonexistent/offer-signer-test-package"
            let error = await #expect(throws: PythonTestEnvironment.Failure.self) {
                try await onOwnThread { try PythonTestEnvironment.provision(requirements: requirement, baseDirectory: base) }
            }
            let message = try #require(error?.description)
            #expect(message.contains("pip install \(requirement) exited"))
            #expect(message.contains("Invalid requirement"), "pip's own words are missing: \(message)")
            let marked = try FileManager.default.contentsOfDirectory(atPath: base).filter {
                FileManager.default.fileExists(atPath: "\(base)/\($0)/.offer-signer-complete")
            }
            #expect(marked.isEmpty)
        }
    }

    @Test("Without python3, or without its venv module, the failure names the Debian package to install")
    func missingPythonNamesThePackage() async throws {
        let missing = #expect(throws: PythonTestEnvironment.Failure.self) {
            try PythonTestEnvironment.findPython3(searchPath: "/nonexistent-offer-signer-bin")
        }
        #expect(missing?.description.contains("apt-get install python3") == true)

        // An interpreter that cannot import ensurepip, as Debian's python3 without python3-venv.
        try await Self.withBase { base in
            try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
            let fake = "\(base)/python3"
            let script = "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'ensurepip'\" >&2\nexit 1\n"
            // Written by a child process: a file this process held open for writing could be
            // inherited by a process another test forks at that moment, and exec'ing it would
            // then fail with ETXTBSY ("Text file busy").
            let written = try ChildProcess.run("/bin/sh", ["-c", "cat > \"$1\" && chmod 755 \"$1\"", "sh", fake], stdin: Data(script.utf8), timeout: .seconds(30))
            #expect(written.status == 0)
            #expect(try PythonTestEnvironment.findPython3(searchPath: "/nonexistent-offer-signer-bin:\(base)") == fake)
            let noVenv = #expect(throws: PythonTestEnvironment.Failure.self) { try PythonTestEnvironment.checkInterpreter(fake) }
            #expect(noVenv?.description.contains("apt-get install python3-venv") == true)
            #expect(noVenv?.description.contains("No module named 'ensurepip'") == true)
        }
    }
}
