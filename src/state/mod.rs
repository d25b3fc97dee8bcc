//! Durable state in the state directory: the kernel log position and the open incidents.
//!
//! Every write is atomic (temporary file, fsync, rename, fsync of the directory: see
//! [`atomic`]), so a crash at any instant leaves either the old or the new content, never a torn
//! file. Files are [`STATE_FILE_MODE`]. The directory belongs to one daemon at a time ([`lock`]).
//! Every state file is opened through [`file`], which refuses (and sets aside) anything that is
//! not a regular file of the daemon's own, and the directory itself is refused at start-up when
//! others could plant such things in it ([`UnsafeStateDir`]).

pub mod atomic;
pub mod file;
pub mod lock;
pub mod save_rule;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use atomic::{
    log_write_error, write_atomic, write_atomic_as, write_atomic_many, write_failures, Durability,
    STATE_FILE_MODE,
};
pub use lock::StateLock;

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Where reading the kernel log stopped: the boot and the last sequence number handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    #[serde(with = "boot_hex")]
    pub boot_id: [u8; 16],
    pub last_seq: u64,
}

mod boot_hex {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(b: &[u8; 16], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::hex(b))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 16], D::Error> {
        let s = String::deserialize(d)?;
        super::parse_boot_id(&s).ok_or_else(|| serde::de::Error::custom("bad boot_id"))
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses a boot id as `/proc/sys/kernel/random/boot_id` prints it (a UUID) or as 32 hex digits.
pub fn parse_boot_id(s: &str) -> Option<[u8; 16]> {
    let digits: Vec<u8> = s.trim().bytes().filter(|b| *b != b'-').collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let t = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(t, 16).ok()?;
    }
    Some(out)
}

/// The current boot's id. `boot_id_path` is a seam for tests.
pub fn current_boot_id(boot_id_path: &Path) -> anyhow::Result<[u8; 16]> {
    let s = fs::read_to_string(boot_id_path)
        .with_context(|| format!("reading {}", boot_id_path.display()))?;
    parse_boot_id(&s).with_context(|| format!("{}: not a boot id: {s:?}", boot_id_path.display()))
}

/// The state directory, locked for this process (see [`lock`]) for as long as a clone lives.
#[derive(Debug, Clone)]
pub struct StateDir {
    dir: PathBuf,
    _lock: Arc<StateLock>,
}

/// Largest state file we read back; anything bigger is not ours.
pub const MAX_STATE_FILE: u64 = 64 << 20;

/// A state directory others could write to, refused at start-up (exit status 78: a restart cannot
/// fix it). Whoever can write there can plant a FIFO, a link or a forged position for the daemon
/// to trust, so it is refused as ssh refuses a key file others can write.
#[derive(Debug, thiserror::Error)]
#[error(
    "state directory {} is {why}: refusing to use it, since whoever can write there can plant \
     files the daemon trusts; make it the service account's own, mode 0700 (chown, chmod 0700), \
     or remove it and let xidwatch create it",
    dir.display()
)]
pub struct UnsafeStateDir {
    pub dir: PathBuf,
    pub why: String,
}

/// Why `meta`, the state directory's, makes it unsafe to use, if it does: writable by group or
/// others, or not owned by this process's effective uid `euid`.
pub fn unsafe_dir_reason(meta: &fs::Metadata, euid: u32) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode() & 0o7777;
    if !meta.is_dir() {
        return Some("not a directory".to_string());
    }
    if meta.uid() != euid {
        return Some(format!(
            "owned by uid {}, not by this daemon's uid {euid}",
            meta.uid()
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!("mode {mode:04o}, writable by group or others"));
    }
    None
}

/// The daemon's status snapshot in the state directory (written by `daemon::control`). Named
/// here, in the room that owns the directory, so the state code needs no higher room for it.
pub const DAEMON_STATUS_FILE: &str = "status.json";
/// The alert stage's status snapshot in the state directory (written by `alert::dispatch`).
pub const ALERT_STATUS_FILE: &str = "alert-status.json";

/// Names in the state directory the daemon only writes (by rename), checked at start-up (see
/// [`file::tidy`]); the ones it reads are checked at every read.
const WRITTEN_ONLY: [&str; 2] = [DAEMON_STATUS_FILE, ALERT_STATUS_FILE];

impl StateDir {
    /// Opens (creating, mode 0700) the state directory and locks it: a second daemon on the
    /// same directory gets [`LockError::Busy`] naming the first one's pid. An existing directory
    /// writable by others or owned by another user is refused ([`UnsafeStateDir`]), before
    /// anything in it is touched.
    pub fn open(dir: &Path) -> anyhow::Result<StateDir> {
        fs::create_dir_all(dir)
            .with_context(|| format!("creating state directory {}", dir.display()))?;
        let meta = fs::metadata(dir)
            .with_context(|| format!("reading the state directory {}", dir.display()))?;
        if let Some(why) = unsafe_dir_reason(&meta, file::euid()) {
            return Err(UnsafeStateDir {
                dir: dir.to_path_buf(),
                why,
            }
            .into());
        }
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
        }
        let lock = StateLock::acquire(dir)?;
        sweep_temp_files(dir);
        for name in WRITTEN_ONLY {
            if let Err(e) = file::tidy(&dir.join(name)) {
                tracing::warn!("{e}");
            }
        }
        Ok(StateDir {
            dir: dir.to_path_buf(),
            _lock: Arc::new(lock),
        })
    }

    pub fn load_position(&self) -> anyhow::Result<Option<Position>> {
        self.load_json("position.json")
    }

    pub fn save_position(&self, p: &Position) -> anyhow::Result<()> {
        self.save_json("position.json", p)
    }

    /// Reads a JSON state file; a missing file is `None`, a corrupt one an error naming it.
    /// Anything but the daemon's own regular file is set aside and read as missing
    /// ([`file::open_read`]).
    pub fn load_json<T: for<'de> Deserialize<'de>>(&self, name: &str) -> anyhow::Result<Option<T>> {
        let path = self.dir.join(name);
        let Some(bytes) = file::read_bounded(&path, MAX_STATE_FILE, file::Reader::Owner)? else {
            return Ok(None);
        };
        let v = serde_json::from_slice(&bytes)
            .with_context(|| format!("{}: corrupt state file", path.display()))?;
        Ok(Some(v))
    }

    /// Writes a JSON state file atomically, mode [`STATE_FILE_MODE`].
    pub fn save_json<T: Serialize>(&self, name: &str, value: &T) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(value).context("serialising state")?;
        Ok(write_atomic(&self.dir.join(name), &bytes, STATE_FILE_MODE)?)
    }
}

/// Removes temporary files a crash left in the state directory and its subdirectories (the
/// outbox, the reports). Only the lock holder calls it, so no live writer's file is removed.
fn sweep_temp_files(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_dir() {
            let Ok(sub) = fs::read_dir(e.path()) else {
                continue;
            };
            for f in sub.flatten() {
                if atomic::is_temp_name(&f.file_name().to_string_lossy()) {
                    let _ = fs::remove_file(f.path());
                }
            }
        // `status.tmp` and friends: the fixed names older versions used.
        } else if atomic::is_temp_name(&name) || name.ends_with(".tmp") {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_round_trips_and_corruption_is_named() {
        let t = tempfile::tempdir().unwrap();
        let s = StateDir::open(t.path()).unwrap();
        assert_eq!(s.load_position().unwrap(), None);
        let p = Position {
            boot_id: parse_boot_id("5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f").unwrap(),
            last_seq: 42,
        };
        s.save_position(&p).unwrap();
        assert_eq!(s.load_position().unwrap(), Some(p));
        fs::write(t.path().join("position.json"), b"{torn").unwrap();
        let e = format!("{:#}", s.load_position().unwrap_err());
        assert!(e.contains("position.json") && e.contains("corrupt"), "{e}");
    }

    #[test]
    fn a_directory_others_can_write_is_refused_before_anything_in_it_is_touched() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("state");
        fs::create_dir(&dir).unwrap();
        for mode in [0o777, 0o770, 0o702] {
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode)).unwrap();
            let e = StateDir::open(&dir).unwrap_err();
            assert!(e.downcast_ref::<UnsafeStateDir>().is_some());
            let e = format!("{e:#}");
            assert!(
                e.contains(&dir.display().to_string()) && e.contains(&format!("mode {mode:04o}")),
                "{e}"
            );
            assert!(!dir.join(lock::LOCK_FILE).exists(), "nothing created in it");
        }
        // Readable by others is not writable by them: used (and tightened to 0700).
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        drop(StateDir::open(&dir).unwrap());
        // A planted FIFO at a name only ever written is set aside at the start.
        let status = dir.join(DAEMON_STATUS_FILE);
        let c = std::ffi::CString::new(status.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let s = StateDir::open(&dir).unwrap();
        assert!(fs::symlink_metadata(&status).is_err(), "set aside");
        // And one at a name that is read: read as missing, set aside, written whole next time.
        let pos = dir.join("position.json");
        let c = std::ffi::CString::new(pos.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(s.load_position().unwrap(), None);
        let p = Position {
            boot_id: [1; 16],
            last_seq: 9,
        };
        s.save_position(&p).unwrap();
        assert_eq!(s.load_position().unwrap(), Some(p));
    }

    #[test]
    fn state_files_are_private_and_the_directory_is_exclusive() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("status.tmp"), b"left by a crash").unwrap();
        fs::create_dir(t.path().join("alert-reports")).unwrap();
        let report_tmp = t.path().join("alert-reports/.x.txt.77.0.tmp");
        fs::write(&report_tmp, b"half").unwrap();
        fs::write(t.path().join("alert-reports/x.txt"), b"whole").unwrap();
        let s = StateDir::open(t.path()).unwrap();
        assert!(!t.path().join("status.tmp").exists(), "swept at open");
        assert!(!report_tmp.exists(), "swept at open");
        assert!(t.path().join("alert-reports/x.txt").exists());
        s.save_position(&Position {
            boot_id: [7; 16],
            last_seq: 1,
        })
        .unwrap();
        s.save_json("incidents.json", &[1, 2]).unwrap();
        for f in ["position.json", "incidents.json", lock::LOCK_FILE] {
            let mode = fs::metadata(t.path().join(f)).unwrap().mode() & 0o777;
            assert_eq!(mode & 0o137, 0, "{f} is {mode:o}");
        }
        let e = format!("{:#}", StateDir::open(t.path()).unwrap_err());
        assert!(e.contains("in use by another xidwatch"), "{e}");
        drop(s);
        StateDir::open(t.path()).unwrap();
    }
}
