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
/// - A symbolic link at the path (to a file on a volume of its own, say) is resolved once, and
///   the file it names is what is read, checked and replaced: a replacement never turns the link
///   into a file of its own.
/// - Nothing at the (resolved) path, in a directory that exists, is "no file yet". Anything else
///   that stops the read is an error: a missing or unsearchable directory, a loop. (An
///   unmounted volume is an empty directory: keep these files in a subdirectory of the volume,
///   so that an unmounted volume shows as a missing directory.)
/// - Only a regular file is opened: its type is checked before the open (a FIFO or a device at
///   the path is neither waited on nor opened), the open neither blocks nor follows a link, and
///   the opened file must be the one checked (a replacement landing in between is read again).
///   At most `limit` bytes are read.
/// - A replacement is a temporary file in the same directory, written and synced, renamed over
///   the path, then the directory synced so the rename survives a crash (best effort: a file
///   system that cannot sync a directory is not refused, and the caller is told nothing).
///   Replacements that only move forward compare and replace under one lock per process
///   (``raise(_:what:limit:to:isAhead:)``); two processes are not serialised.
enum FloorFile {
    /// `path` with a symbolic link at its end followed (up to eight in a row), as it names a file
    /// to read or replace; a relative link is taken from its own directory.
    static func resolved(_ path: String) -> String {
        var current = path
        for _ in 0..<8 {
            var status = stat()
            guard lstat(current, &status) == 0, status.st_mode & S_IFMT == S_IFLNK else { return current }
            var target = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
            let count = readlink(current, &target, target.count - 1)
            guard count > 0 else { return current }
            let link = String(decoding: target[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            current = link.hasPrefix("/") ? link : ((current as NSString).deletingLastPathComponent as NSString).appendingPathComponent(link)
        }
        return current
    }

    /// The file's bytes; nil when there is nothing at the path. `what` names the file in errors
    /// ("the checkpoint file").
    static func read(_ path: String, what: String, limit: Int) throws(StoreError) -> Data? {
        let target = resolved(path)
        var attempt = 0
        while true {
            attempt += 1
            if let data = try readOnce(target, named: path, what: what, limit: limit, lastAttempt: attempt == 3) { return data }
            if attempt == 3 { return nil }
        }
    }

    /// One read of the resolved `target`: nil when a replacement landed between the check and
    /// the open (unless `lastAttempt`, then an error) or when there is no file yet.
    private static func readOnce(_ target: String, named path: String, what: String, limit: Int, lastAttempt: Bool) throws(StoreError) -> Data?? {
        var checked = stat()
        guard lstat(target, &checked) == 0 else {
            let code = errno
            if code == ENOENT {
                var directory = stat()
                let parent = (target as NSString).deletingLastPathComponent
                guard stat(parent.isEmpty ? "." : parent, &directory) == 0, directory.st_mode & S_IFMT == S_IFDIR else {
                    throw StoreError(.unavailable, "\(what) '\(path)' is in a directory that does not exist ('\(parent)'; an unmounted volume?)")
                }
                return .some(nil)
            }
            throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
        }
        guard checked.st_mode & S_IFMT == S_IFREG else {
            throw StoreError(.conflict, "\(what) '\(path)' is not a regular file: it is written by offer-signer (replaced whole, mode 600)")
        }
        guard checked.st_size <= limit else { throw StoreError(.conflict, "\(what) '\(path)' is larger than \(limit) bytes") }
        let fd = open(target, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW)
        guard fd >= 0 else {
            let code = errno
            if (code == ENOENT || code == ELOOP), !lastAttempt { return nil }
            throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(code)))")
        }
        defer { close(fd) }
        var opened = stat()
        guard fstat(fd, &opened) == 0 else { throw StoreError(.unavailable, "cannot read \(what) '\(path)': \(String(cString: strerror(errno)))") }
        guard opened.st_dev == checked.st_dev, opened.st_ino == checked.st_ino else {
            if !lastAttempt { return nil }
            throw StoreError(.unavailable, "\(what) '\(path)' was replaced while it was read, three times: try again")
        }
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

    /// Serialises this process's forward-only replacements (compare, then replace).
    private static let raising = Mutex(())

    /// Replaces the file with `bytes` unless `isAhead` says what it holds (nil: no file yet)
    /// already goes as far; the compare and the replacement run under one lock in this process.
    static func raise(_ path: String, what: String, limit: Int, to bytes: [UInt8], isAhead: (Data?) throws(StoreError) -> Bool) throws(StoreError) {
        try raising.withLock { _ throws(StoreError) in
            if try isAhead(try read(path, what: what, limit: limit)) { return }
            try replace(path, with: bytes, what: what)
        }
    }

    /// Replaces the file with `bytes` (mode 600).
    static func replace(_ path: String, with bytes: [UInt8], what: String) throws(StoreError) {
        let target = resolved(path)
        let directory = (target as NSString).deletingLastPathComponent
        let temporary = (directory.isEmpty ? "." : directory) + "/." + (target as NSString).lastPathComponent + ".\(UUID().uuidString).tmp"
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
        if failure == 0, rename(temporary, target) != 0 { failure = errno }
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

    /// Throws unless the file can be replaced: anything already at the (resolved) path must be a
    /// regular file this process can write (its type checked first: a FIFO or a device is not
    /// opened; `conflict` otherwise), and a file made in its directory (then removed) stands for
    /// the replacement (`unavailable` if it cannot be).
    static func checkWritable(_ path: String, what: String) throws(StoreError) {
        let target = resolved(path)
        var status = stat()
        if lstat(target, &status) == 0 {
            guard status.st_mode & S_IFMT == S_IFREG else {
                throw StoreError(.conflict, "\(what) '\(path)' is not a regular file: it is written by offer-signer (replaced whole, mode 600)")
            }
            let fd = open(target, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW)
            guard fd >= 0 else { throw StoreError(.unavailable, "\(what) '\(path)' is not writable: \(String(cString: strerror(errno)))") }
            close(fd)
        }
        let directory = (target as NSString).deletingLastPathComponent
        let probe = (directory.isEmpty ? "." : directory) + "/." + (target as NSString).lastPathComponent + ".\(UUID().uuidString).probe"
        let fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw StoreError(.unavailable, "\(what) '\(path)' cannot be written (its directory): \(String(cString: strerror(errno)))")
        }
        close(fd)
        unlink(probe)
    }
}
