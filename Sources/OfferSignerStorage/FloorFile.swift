import Foundation

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
/// - Nothing at the path (or a path through a non-directory) is "no file yet". Anything else that
///   stops the read is an error: an unsearchable directory, a symbolic link to nothing (a volume
///   not mounted), a loop.
/// - Only a regular file is opened: its type is checked before the open (a FIFO or a device at
///   the path is neither waited on nor opened), the open does not block, and the opened file must
///   be the one checked. At most `limit` bytes are read.
/// - A replacement is a temporary file in the same directory, written and synced, renamed over
///   the path, then the directory synced so the rename survives a crash (best effort: a file
///   system that cannot sync a directory is not refused, and the caller is told nothing).
enum FloorFile {
    /// The file's bytes; nil when there is nothing at the path. `what` names the file in errors
    /// ("the checkpoint file").
    static func read(_ path: String, what: String, limit: Int) throws(StoreError) -> Data? {
        var named = stat()
        guard lstat(path, &named) == 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { return nil }
            throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
        }
        var checked = named
        if named.st_mode & S_IFMT == S_IFLNK {
            guard stat(path, &checked) == 0 else {
                let code = errno
                if code == ENOENT { throw StoreError(.unavailable, "\(what) '\(path)' is a symbolic link to nothing (is its volume mounted?)") }
                throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
            }
        }
        guard checked.st_mode & S_IFMT == S_IFREG else {
            throw StoreError(.conflict, "\(what) '\(path)' is not a regular file: it is written by offer-signer (replaced whole, mode 600)")
        }
        guard checked.st_size <= limit else { throw StoreError(.conflict, "\(what) '\(path)' is larger than \(limit) bytes") }
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var opened = stat()
        guard fstat(fd, &opened) == 0 else { throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))") }
        guard opened.st_dev == checked.st_dev, opened.st_ino == checked.st_ino else {
            throw StoreError(.unavailable, "\(what) '\(path)' was replaced while it was read: try again")
        }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return data }
            guard count > 0 else {
                if errno == EINTR { continue }
                throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))")
            }
            data.append(contentsOf: buffer[0..<count])
            guard data.count <= limit else { throw StoreError(.conflict, "\(what) '\(path)' is larger than \(limit) bytes") }
        }
    }

    /// Replaces the file with `bytes` (mode 600).
    static func replace(_ path: String, with bytes: [UInt8], what: String) throws(StoreError) {
        let directory = (path as NSString).deletingLastPathComponent
        let temporary = (directory.isEmpty ? "." : directory) + "/." + (path as NSString).lastPathComponent + ".\(UUID().uuidString).tmp"
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
        let directoryFD = open(directory.isEmpty ? "." : directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
    }

    /// Throws `unavailable` unless the file can be replaced: a file made in its directory (then
    /// removed) stands for the replacement, and anything already at the path must be a regular
    /// file this process can write (checked by type first: a FIFO or a device is not opened).
    static func checkWritable(_ path: String, what: String) throws(StoreError) {
        var status = stat()
        if stat(path, &status) == 0 {
            guard status.st_mode & S_IFMT == S_IFREG else {
                throw StoreError(.unavailable, "\(what) '\(path)' is not writable: it is not a regular file")
            }
            let fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)
            guard fd >= 0 else { throw StoreError(.unavailable, "\(what) '\(path)' is not writable: \(String(cString: strerror(errno)))") }
            close(fd)
        }
        let directory = (path as NSString).deletingLastPathComponent
        let probe = (directory.isEmpty ? "." : directory) + "/." + (path as NSString).lastPathComponent + ".\(UUID().uuidString).probe"
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StoreError(.unavailable, "\(what) '\(path)' cannot be written (its directory): \(String(cString: strerror(errno)))")
        }
        close(fd)
        unlink(probe)
    }
}
