import Foundation

/// The last checkpoint a deployment signed, kept outside the database: by default a file beside
/// the master key (`<master-key-file>.checkpoint`), so someone who can write the database but
/// not the master key's directory cannot make it forget what it signed.
///
/// Rules: the file is a checkpoints export (``AuditCheckpointsFile``) with the audit-signing
/// public key and one checkpoint, so `audit verify --checkpoints` reads it too; it is replaced
/// atomically (``FloorFile``: a temporary file in the same directory, synced, renamed, then the
/// directory synced), mode 600; it only moves forward (a checkpoint of fewer records than the
/// one it holds is not written).
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

    /// Throws unless this process can replace the file (``FloorFile``): an existing file must be
    /// a regular file (`conflict` otherwise) opened for writing, and a file made in its directory
    /// (then removed) stands for the atomic replacement (`unavailable` if either cannot be). The
    /// service checks it at start, so an unwritable file stops it there rather than leaving its
    /// checkpoints in the database only.
    public func checkWritable() throws(StoreError) {
        try FloorFile.checkWritable(path, what: "the checkpoint file")
    }

    /// Removes the file; nothing there is not an error.
    public func remove() throws(StoreError) {
        guard unlink(path) == 0 || errno == ENOENT else {
            throw StoreError(.unavailable, "cannot remove the checkpoint file '\(path)': \(String(cString: strerror(errno)))")
        }
    }

    /// The largest checkpoint file read: one key and one checkpoint take about 1 KiB.
    static let sizeLimit = 1 << 20

    /// What the file holds; nil when there is nothing at its path (read as ``FloorFile`` reads:
    /// a regular file only, never a link, never waited on; a missing directory is an error, not
    /// "no file").
    public func read() throws(StoreError) -> AuditCheckpointsFile? {
        guard let data = try FloorFile.read(path, what: "the checkpoint file", limit: Self.sizeLimit) else { return nil }
        return try parse(data)
    }

    private func parse(_ data: Data) throws(StoreError) -> AuditCheckpointsFile {
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
        let text = AuditCheckpointsFile(publicKey: publicKey, checkpoints: [checkpoint]).text
        try FloorFile.raise(path, what: "the checkpoint file", limit: Self.sizeLimit, to: Array(text.utf8)) { held throws(StoreError) in
            guard let held, let last = try parse(held).checkpoints.max(by: { $0.sequence < $1.sequence }) else { return false }
            return last.sequence > checkpoint.sequence
        }
    }
}
