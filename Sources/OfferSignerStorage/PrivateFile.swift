import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A file that must be its owner's alone (a key, a token, a password), read so that what is
/// checked is what is read.
///
/// Rules:
/// - The file is opened once (without blocking, without becoming a controlling terminal), its
///   type, owner and mode are checked with `fstat` on that descriptor, and its bytes are read
///   through it: a file swapped after the check is never read.
/// - It is a regular file or a pipe (`<(vault …)`), owned by this process's user or by root, and
///   group and others have no access at all (0600 and 0400 pass; 0640, 0604, 0620 and 0610 do
///   not): PostgreSQL's rule for its key files ("owned by the database user or root"), without
///   its 0640-for-root exception.
/// - A symbolic link at the path (a Kubernetes secret volume's, say) is followed only when the
///   link itself is owned by this process's user or by root, and is still the same link once
///   opened; a path that was no link is opened with `O_NOFOLLOW` and must be the same file.
///   This is best effort: links higher up the path are not checked, and whoever can write a
///   directory on the path can replace the file, so keep secrets in directories only the
///   service's user or root can write.
/// - A pipe is read to its end, waiting at most `pipeDeadline` (30 s by default) for the program
///   writing it to finish, so a start-up never hangs on a `vault` that does not return; a pipe
///   that ends with nothing in it (its program wrote nothing, or a named FIFO no program writes)
///   is refused as such, not passed on as an empty secret.
///
/// The CLI words the refusals (`SecretFile` in `offer-signer`).
public enum PrivateFile {
    public enum Refusal: Error, Sendable, Equatable {
        case missing
        case unreadable(reason: String)
        case notARegularFile
        /// Owned by a user other than this process's or root (the link itself, when `link`).
        case foreignOwner(uid: UInt32, link: Bool)
        /// Group or others have some access; `mode` is the permission bits.
        case sharedWithOthers(mode: Int)
        case tooLarge(limit: Int)
        /// A pipe that ended without a byte.
        case emptyPipe
        /// A pipe still open, with no end of file, `pipeDeadline` after it was opened.
        case pipeNotEnded(after: Duration)
    }

    /// The file's bytes, at most `limit` of them.
    public static func read(_ path: String, limit: Int = 1 << 20, pipeDeadline: Duration = .seconds(30)) throws(Refusal) -> Data {
        let opened = ContinuousClock.now
        let me = geteuid()
        var before = stat()
        let named = lstat(path, &before) == 0
        let isLink = named && before.st_mode & S_IFMT == S_IFLNK
        if isLink, before.st_uid != me, before.st_uid != 0 { throw .foreignOwner(uid: before.st_uid, link: true) }
        // O_NONBLOCK: a FIFO without a writer is opened at once (and read as empty) rather than
        // waited on, and a pipe's reads wait in poll, bounded by `pipeDeadline`. A regular
        // file's reads ignore it.
        // O_NOFOLLOW when the path was no link: a link swapped in after the lstat is not followed.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (isLink ? 0 : O_NOFOLLOW))
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { throw .missing }
            if code == ELOOP { throw .unreadable(reason: "it became a symbolic link while it was opened") }
            throw .unreadable(reason: String(cString: strerror(code)))
        }
        defer { close(fd) }
        if isLink {
            // The link the owner check saw must still be the one at the path (a narrowing, not a
            // closing, of the race: keep secrets in a directory no one else can write).
            var after = stat()
            guard lstat(path, &after) == 0, after.st_dev == before.st_dev, after.st_ino == before.st_ino, after.st_uid == before.st_uid else {
                throw .unreadable(reason: "the symbolic link changed while it was opened")
            }
        }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw .unreadable(reason: String(cString: strerror(errno))) }
        if named, !isLink, status.st_dev != before.st_dev || status.st_ino != before.st_ino {
            throw .unreadable(reason: "it was replaced while it was opened")
        }
        let type = status.st_mode & S_IFMT
        guard type == S_IFREG || type == S_IFIFO else { throw .notARegularFile }
        guard status.st_uid == me || status.st_uid == 0 else { throw .foreignOwner(uid: status.st_uid, link: false) }
        let permissions = Int(status.st_mode & 0o777)
        guard permissions & 0o077 == 0 else { throw .sharedWithOthers(mode: permissions) }
        if type == S_IFIFO {
            // Opening /dev/fd/N duplicates the descriptor on some systems (macOS), dropping the
            // open's O_NONBLOCK: set it on the pipe itself, so its reads wait in poll only.
            let flags = fcntl(fd, F_GETFL)
            guard flags >= 0, fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0 else { throw .unreadable(reason: String(cString: strerror(errno))) }
        }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count == 0 {
                if type == S_IFIFO, data.isEmpty { throw .emptyPipe }
                return data
            }
            guard count > 0 else {
                let code = errno
                if code == EINTR { continue }
                guard code == EAGAIN || code == EWOULDBLOCK else { throw .unreadable(reason: String(cString: strerror(code))) }
                // A pipe whose writer has not written or finished yet: wait for it, not past the deadline.
                let left = pipeDeadline - (ContinuousClock.now - opened)
                guard left > .zero else { throw .pipeNotEnded(after: pipeDeadline) }
                let wait = min(left, .seconds(3600))
                let milliseconds = wait.components.seconds * 1000 + wait.components.attoseconds / 1_000_000_000_000_000 + 1
                var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
                guard poll(&descriptor, 1, Int32(clamping: milliseconds)) >= 0 || errno == EINTR else {
                    throw .unreadable(reason: String(cString: strerror(errno)))
                }
                continue
            }
            data.append(contentsOf: buffer[0..<count])
            guard data.count <= limit else { throw .tooLarge(limit: limit) }
        }
    }
}
