//! One daemon per state directory.
//!
//! Two daemons on one state directory would read the kernel log twice, page twice and overwrite
//! each other's position and outbox. The first one holds an exclusive `flock(2)` on
//! `<state_dir>/xidwatch.lock` for its whole life and writes its pid there; a second one fails
//! at once with an error naming that pid. The kernel drops the lock when the process ends,
//! however it ends, so a crash never leaves a stale lock behind (a stale pid in the file is
//! harmless: only the lock counts).

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Name of the lock file in the state directory.
pub const LOCK_FILE: &str = "xidwatch.lock";

/// Held for as long as the daemon runs; dropping it releases the directory.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    #[cfg_attr(not(test), allow(dead_code))]
    path: PathBuf,
}

/// Why the state directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "state directory {dir} is in use by another xidwatch ({holder}); stop it first, or give \
         this one its own [state] dir"
    )]
    Busy { dir: PathBuf, holder: String },
    #[error("locking the state directory: {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl StateLock {
    /// Takes the lock on `dir` (which must exist) without waiting.
    pub fn acquire(dir: &Path) -> Result<StateLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        // Not truncated on open: the holder's pid must survive until we know we are the holder.
        // Through the state file check: a link here must not carry the pid to its target (the
        // daemon is often root), nor a FIFO hold the start-up forever.
        let mut file =
            super::file::open_owned_rw(&path, super::atomic::STATE_FILE_MODE).map_err(io_err)?;
        // SAFETY: a valid open descriptor for the duration of the call.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(io_err(e));
            }
            let mut text = String::new();
            let _ = file.take(64).read_to_string(&mut text);
            let holder = match text.trim().parse::<u32>() {
                Ok(pid) => format!("pid {pid}"),
                Err(_) => "pid not known yet".to_string(),
            };
            return Err(LockError::Busy {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        (|| {
            file.set_len(0)?;
            file.rewind()?;
            writeln!(file, "{}", std::process::id())
        })()
        .map_err(io_err)?;
        Ok(StateLock { _file: file, path })
    }

    #[cfg(test)]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let d = tempfile::tempdir().unwrap();
        let first = StateLock::acquire(d.path()).unwrap();
        // flock locks belong to the open file, so a second open in this process conflicts too.
        let e = StateLock::acquire(d.path()).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(e.contains(&d.path().display().to_string()), "{e}");
        drop(first);
        let again = StateLock::acquire(d.path()).unwrap();
        assert!(again.path().ends_with(LOCK_FILE));
    }
}
