import Foundation
import OfferSignerStorage
import TestChildProcess
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The files read when the service starts that are not the store: a secret through a pipe
/// (``PrivateFile``) and the last-checkpoint file (``LastCheckpointFile``). Neither may hang a
/// start or pass on something that is not what it should be. (How the CLI words the refusals:
/// `ServeFaultTests.secretFiles`.) Tests that wait on a pipe wait on a thread of their own, not
/// one of the concurrency pool's.
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

    /// A character device like /dev/zero (read without end, if opened) at `path`; where this
    /// process may not make devices (no root, no CAP_MKNOD), a Unix socket, the other kind of
    /// file that is neither regular nor a directory nor a pipe.
    static func makeDevice(at path: String) throws {
        if mknod(path, S_IFCHR | 0o600, 0x105) == 0 { return }  // major 1, minor 5 (glibc's makedev, a macro)
        let socket = Glibc.socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        try #require(socket >= 0)
        defer { close(socket) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        try #require(bytes.count < MemoryLayout.size(ofValue: address.sun_path))
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        try #require(bound == 0, "bind: errno \(errno)")
    }

    @Test("A pipe whose writer never finishes is refused at the deadline, with what it wrote unread; its writer still open", .enabled(if: hasProcFD))
    func pipeWithoutAnEnd() async throws {
        // Asserted here, not on the thread (which runs outside the test's task).
        let (wrote, outcome, waited) = try await onOwnThread {
            try Self.withPipe { path, writeEnd in
                let wrote = write(writeEnd, "part of a secret", 16)
                let started = ContinuousClock.now
                let outcome = Result { () throws(PrivateFile.Refusal) in try PrivateFile.read(path, pipeDeadline: .milliseconds(600)) }
                return (wrote, outcome, ContinuousClock.now - started)
            }
        }
        #expect(wrote == 16)
        #expect(throws: PrivateFile.Refusal.pipeNotEnded(after: .milliseconds(600))) { try outcome.get() }
        #expect(waited >= .milliseconds(550) && waited < .seconds(10), "waited \(waited)")
    }

    @Test("A pipe written in parts, then closed, is read whole, however slowly its writer writes within the deadline", .enabled(if: hasProcFD))
    func slowPipeIsReadWhole() async throws {
        let text = try await onOwnThread {
            var ends: [Int32] = [0, 0]
            guard pipe(&ends) == 0 else { return "pipe() failed: errno \(errno)" }
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
            return String(decoding: try PrivateFile.read("/proc/self/fd/\(ends[0])", pipeDeadline: .seconds(30)), as: UTF8.self)
        }
        #expect(text == "first second third")
    }

    @Test("A pipe that ends empty (its program wrote nothing) and a named FIFO no program writes are refused as an empty pipe, at once", .enabled(if: hasProcFD))
    func emptyPipes() throws {
        _ = try Self.withPipe(closeWriter: true) { path, _ in
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

    @Test("The checkpoint and registry files are read only as regular files: a FIFO, a directory, a device, a symbolic link or an oversized file is refused at once, a missing directory is an error; nothing at the path is no file yet", arguments: [
        "fifo", "directory", "device", "oversized", "missing directory", "link to a file", "link to a missing file", "missing",
    ])
    func floorFilesAreRegularFiles(_ form: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("floor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        for (name, read) in [
            ("served.checkpoint", { (path: String) throws(StoreError) -> Bool in try LastCheckpointFile(path: path).read() != nil }),
            ("served.registry", { (path: String) throws(StoreError) -> Bool in try RegistryVersionFile(path: path).read() != nil }),
        ] {
            var path = directory.appendingPathComponent(name).path
            switch form {
            case "fifo": try #require(mkfifo(path, 0o600) == 0)
            case "directory": try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            case "device": try Self.makeDevice(at: path)
            case "oversized":
                try #require(FileManager.default.createFile(atPath: path, contents: Data(count: (1 << 20) + 1), attributes: [.posixPermissions: 0o600]))
            case "missing directory": path = directory.appendingPathComponent("unmounted/\(name)").path
            case "link to a file":
                try #require(FileManager.default.createFile(atPath: path + ".real", contents: Data("x".utf8), attributes: [.posixPermissions: 0o600]))
                try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: name + ".real")
            case "link to a missing file": try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: "volume-\(name)")
            default: break
            }
            let started = ContinuousClock.now
            let none = form == "missing"
            do {
                let found = try read(path)
                #expect(none && !found, "a \(form) at \(name) was read as \(found ? "a file" : "no file")")
            } catch {
                #expect(!none, "\(form) at \(name): \(error)")
                let expected: (StoreError.Code, String) =
                    switch form {
                    case "oversized": (.conflict, "larger than")
                    case "missing directory": (.unavailable, "a directory that does not exist")
                    case "link to a file", "link to a missing file": (.conflict, "is a symbolic link")
                    default: (.conflict, "not a regular file")
                    }
                #expect(error.code == expected.0, "\(form) at \(name): \(error)")
                #expect("\(error)".contains(expected.1) && "\(error)".contains(path), "\(form) at \(name): \(error)")
            }
            #expect(ContinuousClock.now - started < .seconds(5), "a \(form) at \(name) was waited on")
        }
    }

    @Test("A floor file's writable check refuses a FIFO, a device or a symbolic link at its path without opening it, and a write a link; a replacement moves only forward and leaves a regular 0600 file and no temporary", arguments: ["fifo", "device", "link", "file"])
    func floorFileReplacement(_ form: String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("floor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("served.registry").path
        let file = RegistryVersionFile(path: path)
        switch form {
        case "fifo": try #require(mkfifo(path, 0o600) == 0)
        case "device": try Self.makeDevice(at: path)
        case "link":
            // Planted by whoever can write the directory: the service's writes must not follow it.
            let elsewhere = directory.appendingPathComponent("elsewhere")
            try #require(FileManager.default.createFile(atPath: elsewhere.path, contents: Data("not the service's\n".utf8), attributes: [.posixPermissions: 0o600]))
            try FileManager.default.createSymbolicLink(atPath: path, withDestinationPath: "elsewhere")
            do {
                try file.record(3)
                Issue.record("a write went through a symbolic link")
            } catch {
                #expect(error.code == .conflict && "\(error)".contains("is a symbolic link"), "\(error)")
            }
            #expect(try String(contentsOf: elsewhere, encoding: .utf8) == "not the service's\n")
            #expect(try FileManager.default.destinationOfSymbolicLink(atPath: path) == "elsewhere")
        default:
            try file.checkWritable()
            try file.record(7)
            try file.checkWritable()  // an existing file, opened for writing
            try file.record(9)
            try file.record(8)  // behind: not written
            #expect(try file.read() == 9)
            let attributes = try FileManager.default.attributesOfItem(atPath: path)
            #expect(attributes[.type] as? FileAttributeType == .typeRegular)
            #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
            #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["served.registry"])
            return
        }
        do {
            try file.checkWritable()
            Issue.record("a \(form) passed the writable check")
        } catch {
            #expect(error.code == .conflict && "\(error)".contains(form == "link" ? "is a symbolic link" : "not a regular file"), "\(error)")
        }
    }

    @Test("A floor file mounted on its own (a single-file bind mount: every rename over it fails) is refused by the writable check, saying to mount its directory")
    func singleFileMountIsRefused() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("floor-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: directory) }
        let source = directory.appendingPathComponent("host-file")
        let path = directory.appendingPathComponent("served.checkpoint")
        for file in [source, path] {
            try #require(FileManager.default.createFile(atPath: file.path, contents: Data(), attributes: [.posixPermissions: 0o600]))
        }
        guard getuid() == 0, let mounted = try? await ChildProcess.run("/bin/mount", ["--bind", source.path, path.path], timeout: .seconds(20)), mounted.status == 0
        else {
            Issue.record(Comment(rawValue: "no bind mount here (needs root and CAP_SYS_ADMIN): the single-file mount is not tested"), severity: .warning)
            return
        }
        let outcome = Result { () throws(StoreError) in try LastCheckpointFile(path: path.path).checkWritable() }
        let unmounted = try await ChildProcess.run("/bin/umount", ["-l", path.path], timeout: .seconds(20))
        #expect(unmounted.status == 0, "the bind mount at \(path.path) stayed: \(unmounted.stderrText)")
        #expect(throws: StoreError.self) { try outcome.get() }
        if case .failure(let error) = outcome {
            #expect(error.code == .unavailable && "\(error)".contains("mount point of its own") && "\(error)".contains("mount its directory"), "\(error)")
        }
        // Unmounted, the same file passes.
        try LastCheckpointFile(path: path.path).checkWritable()
    }
}
