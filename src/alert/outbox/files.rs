//! The outbox's files in the state directory, through the state room's write and read helpers:
//! written whole and durably, read only when they are the daemon's own.

use std::io;
use std::path::Path;

/// An alert's file name: its sequence number, zero-padded so names sort in order.
pub(super) fn file_name(seq: u64) -> String {
    format!("{seq:016}.json")
}

/// Writes `bytes` to `dir/name` atomically and durably, readable by the service and its group
/// only (the state directory's one write helper).
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    crate::state::write_atomic(&dir.join(name), bytes, crate::state::STATE_FILE_MODE)
}

pub(super) fn write_batch(dir: &Path, files: &[(String, Vec<u8>)]) -> io::Result<()> {
    crate::state::write_atomic_many(dir, files, crate::state::STATE_FILE_MODE)
}

/// The outbox directory, a real one of the daemon's own: a link there would send the alerts
/// somewhere else, so anything else at its name is set aside (see [`crate::state::file`]).
pub(super) fn create_private_dir(dir: &Path) -> io::Result<()> {
    crate::state::file::ensure_private_dir(dir, 0o700)
}

/// Reads an outbox file; a FIFO, a link or another user's file at its name is set aside (logged)
/// and read as missing, so the outbox goes on without it.
pub(super) fn read_entry(path: &Path) -> io::Result<Option<Vec<u8>>> {
    crate::state::file::read_bounded(
        path,
        crate::state::MAX_STATE_FILE,
        crate::state::file::Reader::Owner,
    )
}
