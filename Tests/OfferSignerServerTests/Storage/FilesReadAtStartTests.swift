import Foundation
import OfferSignerStorage
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The files read when the service starts that are not the store: a secret through a pipe
/// (``PrivateFile``) and the last-checkpoint file (``LastCheckpointFile``). Neither may hang a
/// start or pass on something that is not what it should be. (How the CLI words the refusals:
/// `ServeFaultTests.secretFiles`.)
@Suite("Files read at start: pipes end or are refused, the checkpoint file is a regular file")
struct FilesReadAtStartTests {
    /// A pipe's path as the shell's `<(…)` gives it: `/proc/self/fd/N`, a link owned by this user.
    static func withPipe<T>(_ body: (_ path: String, _ writeEnd: Int32) throws -> T) throws -> T {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer {
            close(ends[0])
            if ends[1] >= 0 { close(ends[1]) }
        }
        return try body("/proc/self/fd/\(ends[0])", ends[1])
    }

    @Test("A pipe whose writer never finishes is refused at the deadline, with what it wrote unread; its writer still open")
    func pipeWithoutAnEnd() throws {
        try Self.withPipe { path, writeEnd in
            #expect(write(writeEnd, "part of a secret", 16) == 16)
            let started = ContinuousClock.now
            #expect(throws: PrivateFile.Refusal.pipeNotEnded(after: .milliseconds(600))) {
                try PrivateFile.read(path, pipeDeadline: .milliseconds(600))
            }
            let waited = ContinuousClock.now - started
            #expect(waited >= .milliseconds(550) && waited < .seconds(10), "waited \(waited)")
        }
    }

    @Test("A pipe written in parts, then closed, is read whole, however slowly its writer writes within the deadline")
    func slowPipeIsReadWhole() async throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        defer { close(ends[0]) }
        let writeEnd = ends[1]
        let writer = Thread {
            for part in ["first ", "second ", "third"] {
                Thread.sleep(forTimeInterval: 0.2)
                _ = part.withCString { write(writeEnd, $0, strlen($0)) }
            }
            close(writeEnd)
        }
        writer.start()
        let data = try PrivateFile.read("/proc/self/fd/\(ends[0])", pipeDeadline: .seconds(30))
        #expect(String(decoding: data, as: UTF8.self) == "first second third")
    }

    @Test("A pipe that ends empty (its program failed) and a named FIFO no program writes are refused as an empty pipe, at once")
    func emptyPipes() throws {
        try Self.withPipe { path, writeEnd in
            close(writeEnd)
            #expect(throws: PrivateFile.Refusal.emptyPipe) { try PrivateFile.read(path) }
        }
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("fifo-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let fifo = directory.appendingPathComponent("token").path
        try #require(mkfifo(fifo, 0o600) == 0)
        let started = ContinuousClock.now
        #expect(throws: PrivateFile.Refusal.emptyPipe) { try PrivateFile.read(fifo) }
        #expect(ContinuousClock.now - started < .seconds(5))
    }

    @Test("The checkpoint file is read only as a regular file: a FIFO, a directory or an oversized file is refused at once; a missing one is none", arguments: [
        "fifo", "directory", "oversized", "missing",
    ])
    func checkpointFileIsARegularFile(_ form: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("checkpoint-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("served.checkpoint").path
        switch form {
        case "fifo": try #require(mkfifo(path, 0o600) == 0)
        case "directory": try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        case "oversized":
            try #require(FileManager.default.createFile(atPath: path, contents: Data(count: (1 << 20) + 1), attributes: [.posixPermissions: 0o600]))
        default: break
        }
        let file = LastCheckpointFile(path: path)
        let started = ContinuousClock.now
        if form == "missing" {
            #expect(try file.read() == nil)
            return
        }
        do {
            _ = try file.read()
            Issue.record("a \(form) was read as a checkpoint file")
        } catch {
            #expect(error.code == .conflict, "\(error)")
            #expect("\(error)".contains(form == "oversized" ? "larger than" : "not a regular file"), "\(error)")
        }
        #expect(ContinuousClock.now - started < .seconds(5), "a \(form) was waited on")
    }
}
