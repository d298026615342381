import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How the small files kept outside the database are read and replaced: the last signed
/// checkpoint (``LastCheckpointFile``) and the registry's version (``RegistryVersionFile``). Each
/// is a floor the database cannot lower, so each must be read as it is or refused, never taken
/// for absent while something is there, and never waited on.
///
/// Rules:
/// - The path names the file itself: a symbolic link there is refused (`conflict`), for reading,
///   writing and removing alike. A replacement renames a new file over the path, which would
///   replace a link rather than the file it names, and following a link would let whoever can
///   write the directory (for the defaults beside a SQLite store: the database's writers) point
///   the service's writes and removals at another file.
/// - Nothing at the path, in a directory that exists, is "no file yet". Anything else that stops
///   the read is an error: a missing or unsearchable directory. (An unmounted volume is an empty
///   directory: keep these files in a subdirectory of the volume, so that an unmounted volume
///   shows as a missing directory.)
/// - Only a regular file is opened: its type is checked before the open (a FIFO or a device at
///   the path is neither waited on nor opened), the open neither blocks nor follows a link, and
///   the opened file must be the one checked (a replacement landing in between is read again, up
///   to three times). At most `limit` bytes are read.
/// - A replacement is a temporary file in the same directory, written and synced, renamed over
///   the path, then the directory synced so the rename survives a crash (best effort: a file
///   system that cannot sync a directory is not refused, and the caller is told nothing).
///   Replacements that only move forward compare and replace under one lock per path in this
///   process (``raise(_:what:limit:to:isAhead:)``); two processes are not serialised.
enum FloorFile {
    /// The refusal of a symbolic link at a floor file's path.
    static func linkRefused(_ path: String, what: String) -> StoreError {
        StoreError(.conflict, "\(what) '\(path)' is a symbolic link: offer-signer replaces this file whole (which would replace the link), so give the path of the file itself")
    }

    /// Refuses what `lstat` found at the path unless it is a regular file.
    private static func requireRegularFile(_ status: stat, _ path: String, what: String) throws(StoreError) {
        if status.st_mode & S_IFMT == S_IFLNK { throw linkRefused(path, what: what) }
        guard status.st_mode & S_IFMT == S_IFREG else {
            throw StoreError(.conflict, "\(what) '\(path)' is not a regular file: it is written by offer-signer (replaced whole, mode 600)")
        }
    }

    /// The file's directory (`.` for a bare name).
    private static func directory(of path: String) -> String {
        let directory = (path as NSString).deletingLastPathComponent
        return directory.isEmpty ? "." : directory
    }

    /// A hidden, unique name beside the file (`.<name>.<UUID>.<suffix>`), for a temporary or a probe.
    private static func sibling(of path: String, _ suffix: String) -> String {
        directory(of: path) + "/." + (path as NSString).lastPathComponent + ".\(UUID().uuidString).\(suffix)"
    }

    /// The file's bytes; nil when there is nothing at the path. `what` names the file in errors
    /// ("the checkpoint file").
    static func read(_ path: String, what: String, limit: Int) throws(StoreError) -> Data? {
        for _ in 1...3 {
            if let data = try readOnce(path, what: what, limit: limit) { return data }
        }
        throw StoreError(.unavailable, "\(what) '\(path)' was replaced while it was read, three times: try again")
    }

    /// One read: nil when a replacement landed between the check and the open (read again),
    /// `.some(nil)` when there is no file yet.
    private static func readOnce(_ path: String, what: String, limit: Int) throws(StoreError) -> Data?? {
        var checked = stat()
        guard lstat(path, &checked) == 0 else {
            let code = errno
            if code == ENOENT {
                var parentStatus = stat()
                let parent = directory(of: path)
                guard stat(parent, &parentStatus) == 0, parentStatus.st_mode & S_IFMT == S_IFDIR else {
                    throw StoreError(.unavailable, "\(what) '\(path)' is in a directory that does not exist ('\(parent)'; an unmounted volume?)")
                }
                return .some(nil)
            }
            throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
        }
        try requireRegularFile(checked, path, what: what)
        guard checked.st_size <= limit else { throw StoreError(.conflict, "\(what) '\(path)' is larger than \(limit) bytes") }
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT || code == ELOOP { return nil }
            throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
        }
        defer { close(fd) }
        var opened = stat()
        guard fstat(fd, &opened) == 0 else { throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))") }
        guard opened.st_dev == checked.st_dev, opened.st_ino == checked.st_ino else { return nil }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return .some(data) }
            guard count > 0 else {
                if errno == EINTR { continue }
                throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))")
            }
            data.append(contentsOf: buffer[0..<count])
            guard data.count <= limit else { throw StoreError(.conflict, "\(what) '\(path)' is larger than \(limit) bytes") }
        }
    }

    /// One lock per path, serialising this process's forward-only replacements (compare, then
    /// replace) of that file.
    private static let locks = Mutex([String: PathLock]())

    private final class PathLock: Sendable {
        let mutex = Mutex(())
    }

    /// Replaces the file with `bytes` unless `isAhead` says what it holds (nil: no file yet)
    /// already goes as far; the compare and the replacement run under one lock in this process.
    static func raise(_ path: String, what: String, limit: Int, to bytes: [UInt8], isAhead: (Data?) throws(StoreError) -> Bool) throws(StoreError) {
        let lock = locks.withLock { locks in
            if let lock = locks[path] { return lock }
            let lock = PathLock()
            locks[path] = lock
            return lock
        }
        try lock.mutex.withLock { _ throws(StoreError) in
            if try isAhead(try read(path, what: what, limit: limit)) { return }
            try replace(path, with: bytes, what: what)
        }
    }

    /// Replaces the file with `bytes` (mode 600).
    static func replace(_ path: String, with bytes: [UInt8], what: String) throws(StoreError) {
        var existing = stat()
        if lstat(path, &existing) == 0, existing.st_mode & S_IFMT == S_IFLNK { throw linkRefused(path, what: what) }
        let temporary = sibling(of: path, "tmp")
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StoreError(.unavailable, "cannot write \(what) '\(path)': \(String(cString: strerror(errno)))") }
        var written = 0
        var failure: Int32 = 0
        while written < bytes.count {
            let count = bytes.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + written, $0.count - written) }
            if count > 0 {
                written += count
            } else if count < 0, errno == EINTR {
                continue
            } else {
                failure = count < 0 ? errno : EIO
                break
            }
        }
        if failure == 0, fsync(fd) != 0 { failure = errno }
        close(fd)
        if failure == 0, rename(temporary, path) != 0 { failure = errno }
        guard failure == 0 else {
            unlink(temporary)
            throw StoreError(.unavailable, "cannot write \(what) '\(path)': \(String(cString: strerror(failure)))")
        }
        let directoryFD = open(directory(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
    }

    /// Throws unless the file can be replaced: anything already at the path must be a regular file
    /// (not a link) this process can write (its type checked first: a FIFO or a device is not
    /// opened; `conflict` otherwise), and a file made in its directory (then removed) stands for
    /// the replacement (`unavailable` if it cannot be).
    static func checkWritable(_ path: String, what: String) throws(StoreError) {
        var status = stat()
        if lstat(path, &status) == 0 {
            try requireRegularFile(status, path, what: what)
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW)
            guard fd >= 0 else { throw StoreError(.unavailable, "\(what) '\(path)' is not writable: \(String(cString: strerror(errno)))") }
            close(fd)
            // A file mounted on its own (a single-file bind mount, a Kubernetes subPath) cannot
            // be renamed over: every replacement would fail with EBUSY. A hard link into its
            // directory tells, as the kernel judges by mount, not by device: EXDEV. (Any other
            // failure, a file system without hard links, says nothing and passes.)
            let linkProbe = sibling(of: path, "link")
            if link(path, linkProbe) == 0 {
                unlink(linkProbe)
            } else if errno == EXDEV {
                throw StoreError(.unavailable, "\(what) '\(path)' is a mount point of its own (a single-file mount): it is replaced by renaming a new file over it, which a mount point refuses; mount its directory instead")
            }
        }
        let probe = sibling(of: path, "probe")
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StoreError(.unavailable, "\(what) '\(path)' cannot be written (its directory): \(String(cString: strerror(errno)))")
        }
        close(fd)
        unlink(probe)
    }
}
