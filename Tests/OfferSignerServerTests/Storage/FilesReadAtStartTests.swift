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
    /// Pipes are named as the shell's `<(…)` names them on Linux: `/proc/self/fd/N`.
    static let hasProcFD = FileManager.default.fileExists(atPath: "/proc/self/fd")

    /// A pipe's path as the shell's `<(…)` gives it (`/proc/self/fd/N`, a link owned by this
    /// user); the write end stays open unless `closeWriter`, and both ends are closed once.
    static func withPipe<T>(closeWriter: Bool = false, _ body: (_ path: String, _ writeEnd: Int32) throws -> T) throws -> T {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        if closeWriter {
            close(ends[1])
            ends[1] = -1
        }
        defer {
            close(ends[0])
            if ends[1] >= 0 { close(ends[1]) }
        }
        return try body("/proc/self/fd/\(ends[0])", ends[1])
    }

    @Test("A pipe whose writer never finishes is refused at the deadline, with what it wrote unread; its writer still open", .enabled(if: hasProcFD))
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

    @Test("A pipe written in parts, then closed, is read whole, however slowly its writer writes within the deadline", .enabled(if: hasProcFD))
    func slowPipeIsReadWhole() throws {
        var ends: [Int32] = [0, 0]
        try #require(pipe(&ends) == 0)
        let writeEnd = ends[1]
        let written = DispatchSemaphore(value: 0)
        let writer = Thread {
            for part in ["first ", "second ", "third"] {
                Thread.sleep(forTimeInterval: 0.2)
                _ = part.withCString { write(writeEnd, $0, strlen($0)) }
            }
            close(writeEnd)
            written.signal()
        }
        writer.start()
        // The read end is closed only once the writer is done, whatever the read did.
        defer {
            written.wait()
            close(ends[0])
        }
        let data = try PrivateFile.read("/proc/self/fd/\(ends[0])", pipeDeadline: .seconds(30))
        #expect(String(decoding: data, as: UTF8.self) == "first second third")
    }

    @Test("A pipe that ends empty (its program wrote nothing) and a named FIFO no program writes are refused as an empty pipe, at once", .enabled(if: hasProcFD))
    func emptyPipes() throws {
        try Self.withPipe(closeWriter: true) { path, _ in
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

    @Test("The checkpoint and registry files are read only as regular files: a FIFO, a directory, a device or an oversized file is refused at once, a link to nothing is an error; nothing at the path is no file yet", arguments: [
        "fifo", "directory", "device", "oversized", "link to nothing", "missing",
    ])
    func floorFilesAreRegularFiles(_ form: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("floor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        for (name, read) in [
            ("served.checkpoint", { (path: String) throws(StoreError) -> Bool in try LastCheckpointFile(path: path).read() != nil }),
            ("served.registry", { (path: String) throws(StoreError) -> Bool in try RegistryVersionFile(path: path).read() != nil }),
        ] {
            let path = directory.appendingPathComponent(name).path
            switch form {
            case "fifo": try #require(mkfifo(path, 0o600) == 0)
            case "directory": try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            case "device": try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: "/dev/zero")  // read without end, if opened
            case "oversized":
                try #require(FileManager.default.createFile(atPath: path, contents: Data(count: (1 << 20) + 1), attributes: [.posixPermissions: 0o600]))
            case "link to nothing": try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: directory.appendingPathComponent("unmounted/\(name)").path)
            default: break
            }
            let started = ContinuousClock.now
            do {
                let found = try read(path)
                #expect(form == "missing" && !found, "a \(form) at \(name) was read as \(found ? "a file" : "no file")")
            } catch {
                #expect(form != "missing", "\(error)")
                let expected: (StoreError.Code, String) =
                    switch form {
                    case "oversized": (.conflict, "larger than")
                    case "link to nothing": (.unavailable, "a symbolic link to nothing")
                    default: (.conflict, "not a regular file")
                    }
                #expect(error.code == expected.0, "\(form) at \(name): \(error)")
                #expect("\(error)".contains(expected.1) && "\(error)".contains(path), "\(form) at \(name): \(error)")
            }
            #expect(ContinuousClock.now - started < .seconds(5), "a \(form) at \(name) was waited on")
        }
    }

    @Test("The checkpoint file's writable check refuses a FIFO or a device at its path without opening it; a replacement leaves a regular 0600 file and no temporary", arguments: ["fifo", "device", "file"])
    func checkpointFileWritableCheck(_ form: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("floor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("served.checkpoint").path
        let file = LastCheckpointFile(path: path)
        switch form {
        case "fifo": try #require(mkfifo(path, 0o600) == 0)
        case "device": try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: "/dev/zero")
        default:
            try file.checkWritable()
            try RegistryVersionFile(path: path).record(7)
            try RegistryVersionFile(path: path).record(9)
            #expect(try RegistryVersionFile(path: path).read() == 9)
            let attributes = try FileManager.default.attributesOfItem(atPath: path)
            #expect(attributes[.type] as? FileAttributeType == .typeRegular)
            #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["served.checkpoint"])
            return
        }
        #expect(throws: StoreError.self) { try file.checkWritable() }
        do {
            try file.checkWritable()
        } catch {
            #expect(error.code == .unavailable && "\(error)".contains("not a regular file"), "\(error)")
        }
    }
}
