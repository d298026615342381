import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The last checkpoint a deployment signed, kept outside the database: by default a file beside
/// the master key (`<master-key-file>.checkpoint`), so someone who can write the database but
/// not the master key's directory cannot make it forget what it signed.
///
/// Rules: the file is a checkpoints export (``AuditCheckpointsFile``) with the audit-signing
/// public key and one checkpoint, so `audit verify --checkpoints` reads it too; it is replaced
/// atomically (a temporary file in the same directory, synced, renamed, then the directory
/// synced), mode 600; it only moves forward (a checkpoint of fewer records than the one it holds
/// is not written).
public struct LastCheckpointFile: Sendable {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    /// The default location for a master key read from `masterKeyFile`.
    public static func beside(masterKeyFile: String) -> LastCheckpointFile {
        LastCheckpointFile(path: masterKeyFile + ".checkpoint")
    }

    /// The default location beside a SQLite store (`<store>.checkpoint`), used by `serve` when
    /// the master key comes from the environment and no `--checkpoint-file` is given.
    public static func beside(sqliteStore path: String) -> LastCheckpointFile {
        LastCheckpointFile(path: path + ".checkpoint")
    }

    /// Throws `unavailable` unless this process can write the file: an existing file is opened
    /// for writing, and a file made in its directory (then removed) stands for the atomic
    /// replacement. The service checks it at start, so an unwritable file stops it there rather
    /// than leaving its checkpoints in the database only.
    public func checkWritable() throws(StoreError) {
        if FileManager.default.fileExists(atPath: path) {
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)  // a FIFO without a reader: ENXIO, not a wait
            guard fd >= 0 else { throw StoreError(.unavailable, "the checkpoint file '\(path)' is not writable: \(String(cString: strerror(errno)))") }
            close(fd)
        }
        let directory = (path as NSString).deletingLastPathComponent
        let probe = (directory.isEmpty ? "." : directory) + "/." + (path as NSString).lastPathComponent + ".\(UUID().uuidString).probe"
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else {
            throw StoreError(.unavailable, "the checkpoint file '\(path)' cannot be written (its directory): \(String(cString: strerror(errno)))")
        }
        close(fd)
        unlink(probe)
    }

    /// The largest checkpoint file read: one key and one checkpoint take about 1 KiB.
    static let sizeLimit = 1 << 20

    /// What the file holds; nil when there is no file yet.
    ///
    /// Rule: only a regular file of at most ``sizeLimit`` bytes is read, through one descriptor
    /// opened without blocking: a FIFO or a device at the path is refused at once, never waited on
    /// or read without end.
    public func read() throws(StoreError) -> AuditCheckpointsFile? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { return nil }
            throw StoreError(.unavailable, "cannot read the checkpoint file '\(path)': \(String(cString: strerror(code)))")
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else {
            throw StoreError(.unavailable, "cannot read the checkpoint file '\(path)': \(String(cString: strerror(errno)))")
        }
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw StoreError(.conflict, "the checkpoint file '\(path)' is not a regular file: it is written by offer-signer (replaced whole, mode 600)")
        }
        guard status.st_size <= Self.sizeLimit else {
            throw StoreError(.conflict, "the checkpoint file '\(path)' is larger than \(Self.sizeLimit) bytes: not a checkpoints export")
        }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { break }
            guard count > 0 else {
                if errno == EINTR { continue }
                throw StoreError(.unavailable, "cannot read the checkpoint file '\(path)': \(String(cString: strerror(errno)))")
            }
            data.append(contentsOf: buffer[0..<count])
            guard data.count <= Self.sizeLimit else {
                throw StoreError(.conflict, "the checkpoint file '\(path)' is larger than \(Self.sizeLimit) bytes: not a checkpoints export")
            }
        }
        do {
            return try AuditCheckpointsFile(text: String(decoding: data, as: UTF8.self))
        } catch {
            throw StoreError(.conflict, "the checkpoint file '\(path)' is not a checkpoints export: \(error)")
        }
    }

    /// The last checkpoint the file holds, if any.
    public func lastCheckpoint() throws(StoreError) -> AuditCheckpoint? {
        try read()?.checkpoints.max { $0.sequence < $1.sequence }
    }

    /// Replaces the file with `checkpoint` (unless it holds a later one).
    public func write(_ checkpoint: AuditCheckpoint, publicKey: AuditSigningPublicKey) throws(StoreError) {
        if let last = try lastCheckpoint(), last.sequence > checkpoint.sequence { return }
        let text = AuditCheckpointsFile(publicKey: publicKey, checkpoints: [checkpoint]).text
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = (directory.isEmpty ? "." : directory) + "/." + (path as NSString).lastPathComponent + ".\(UUID().uuidString).tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        guard fd >= 0 else { throw StoreError(.unavailable, "cannot write the checkpoint file '\(path)': \(String(cString: strerror(errno)))") }
        let bytes = Array(text.utf8)
        let written = bytes.withUnsafeBytes { Foundation.write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        close(fd)
        guard written == bytes.count, synced, rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw StoreError(.unavailable, "cannot write the checkpoint file '\(path)': \(reason)")
        }
        // The rename is durable once the directory is synced: a crash then cannot bring back the
        // file's earlier checkpoint. Best effort: some file systems refuse to sync a directory.
        let directoryFD = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
    }
}
