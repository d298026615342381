import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A file that must be its owner's alone (a key, a token, a password), read so that what is
/// checked is what is read.
///
/// Rule: the file is opened once, its mode is checked with `fstat` on that descriptor and its
/// bytes are read through it; group and others must have no access at all (0600 and 0400 pass;
/// 0640, 0604, 0620 and 0610 do not). A symbolic link (a Kubernetes secret volume's, say) is
/// judged by its target, and a file swapped after the check is never read. The CLI words the
/// refusals (`SecretFile` in `offer-signer`).
public enum PrivateFile {
    public enum Refusal: Error, Sendable, Equatable {
        case missing
        case unreadable(reason: String)
        case notARegularFile
        /// Group or others have some access; `mode` is the permission bits.
        case sharedWithOthers(mode: Int)
        case tooLarge(limit: Int)
    }

    /// The file's bytes, at most `limit` of them.
    public static func read(_ path: String, limit: Int = 1 << 20) throws(Refusal) -> Data {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT || code == ENOTDIR { throw .missing }
            throw .unreadable(reason: String(cString: strerror(code)))
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0 else { throw .unreadable(reason: String(cString: strerror(errno))) }
        guard status.st_mode & S_IFMT == S_IFREG else { throw .notARegularFile }
        let permissions = Int(status.st_mode & 0o777)
        guard permissions & 0o077 == 0 else { throw .sharedWithOthers(mode: permissions) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = buffer.withUnsafeMutableBytes { Foundation.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { return data }
            guard count > 0 else {
                if errno == EINTR { continue }
                throw .unreadable(reason: String(cString: strerror(errno)))
            }
            data.append(contentsOf: buffer[0..<count])
            guard data.count <= limit else { throw .tooLarge(limit: limit) }
        }
    }
}
