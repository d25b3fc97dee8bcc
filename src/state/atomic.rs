//! The one way xidwatch replaces a file: every state file, outbox entry, report, status snapshot
//! and installed file goes through [`write_atomic`] (or its batched and unsynced forms below,
//! which take the same steps).
//!
//! Why each step: a temporary file with a name no other writer can choose (two writers of one
//! file must not truncate each other's half-written copy), fsync before the rename (otherwise a
//! crash can leave the new name pointing at an empty file), rename (readers see the old file or
//! the new one, never half of one), fsync of the directory (otherwise a crash can forget the
//! rename). A failure at any step removes the temporary file, so a full disk leaves no litter.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Mode of every file in the state directory: the service account reads and writes, its group
/// (operators running `xidwatch status`) reads, nobody else.
pub const STATE_FILE_MODE: u32 = 0o640;

/// Suffix of temporary files; a start-up sweep may remove `.<name>.*.tmp` left by a crash.
pub const TMP_SUFFIX: &str = ".tmp";

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A sibling of `path` that no other writer (thread or process) chooses.
fn temp_name(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        )
    })?;
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(path.with_file_name(format!(
        ".{}.{}.{n}{TMP_SUFFIX}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Creates the temporary file: `O_CREAT | O_EXCL | O_NOFOLLOW`, so a link planted at its name
/// (the names are predictable: pid and a counter) is never followed, and nothing that was there
/// is ever written; `O_CLOEXEC`, so no runbook child inherits it.
fn create_temp(tmp: &Path, mode: u32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(tmp)
}

/// Opens a directory to flush it. `O_DIRECTORY`: a FIFO at its name must not block the writer.
fn open_dir(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
}

/// Replaces `path` with `bytes`, durably, with exactly `mode` (see the module doc).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_atomic_with(path, mode, |f| f.write_all(bytes))
}

/// [`write_atomic`] with the content produced by `fill`. Also the seam the tests use to make a
/// write fail the way a full disk does.
pub fn write_atomic_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    replace(path, mode, Durability::Synced, fill)
}

/// The steps of the module doc; the flushes only when `durability` asks for them.
fn replace(
    path: &Path,
    mode: u32,
    durability: Durability,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let synced = durability == Durability::Synced;
    let tmp = temp_name(path)?;
    let step = |what: &str, p: &Path, e: io::Error| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
    };
    let mut f = create_temp(&tmp, mode).map_err(|e| step("creating", &tmp, e))?;
    let written = (|| {
        // The umask may have taken bits away; the caller asked for exactly this mode.
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| step("setting the mode of", &tmp, e))?;
        fill(&mut f).map_err(|e| step("writing", path, e))?;
        if synced {
            f.sync_all().map_err(|e| step("syncing", path, e))?;
        }
        drop(f);
        fs::rename(&tmp, path).map_err(|e| step("renaming into place", path, e))
    })();
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if !synced {
        return Ok(());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    open_dir(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| step("syncing the directory", dir, e))
}

/// How a file may be replaced: [`Durability::Synced`] for what a promise rests on,
/// [`Durability::Atomic`] (no fsync) for copies people read, such as the readable reports, where a
/// crash may lose the newest one but never leaves half of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    Synced,
    Atomic,
}

/// Replaces several files of one directory durably with one flush of the filesystem instead of
/// one per file: each temporary file is written, the filesystem is flushed once (`syncfs`),
/// each is renamed into place and the directory is flushed once. A burst of new alerts then
/// costs a few milliseconds, not a few per alert. Each file ends up old or new, never torn; on
/// failure every temporary file is removed.
pub fn write_atomic_many(dir: &Path, files: &[(String, Vec<u8>)], mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    if files.is_empty() {
        return Ok(());
    }
    let mut temps = Vec::with_capacity(files.len());
    let written = (|| {
        for (name, bytes) in files {
            let path = dir.join(name);
            let tmp = temp_name(&path)?;
            let mut f = create_temp(&tmp, mode)?;
            temps.push((tmp, path));
            f.set_permissions(fs::Permissions::from_mode(mode))?;
            f.write_all(bytes)?;
        }
        let d = open_dir(dir)?;
        // SAFETY: syncfs on a valid, open descriptor of this directory.
        if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        for (tmp, path) in &temps {
            fs::rename(tmp, path)?;
        }
        d.sync_all()
    })();
    if let Err(e) = written {
        for (tmp, _) in &temps {
            let _ = fs::remove_file(tmp);
        }
        return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display())));
    }
    Ok(())
}

/// [`write_atomic`] without the flushes when `durability` allows it.
pub fn write_atomic_as(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> io::Result<()> {
    replace(path, mode, durability, |f| f.write_all(bytes))
}

/// Whether `name` is a temporary file [`write_atomic`] left behind (only a crash can do that).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(TMP_SUFFIX)
}

/// How often a failing write is logged at most: a full disk fails every write, and hundreds of
/// identical lines a second would fill what little space is left and bury the first cause.
pub const WRITE_ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// Rate limit for one kind of repeated error: the first is logged, then at most one per
/// `every`, each saying how many were not logged in between. Plain values, so it is tested
/// without a clock.
#[derive(Debug)]
pub struct LogLimit {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    pub const fn new(every: Duration) -> LogLimit {
        LogLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` when this occurrence is to be logged, `n` being how many were held back since
    /// the last one logged; `None` when it is to be counted only.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// The process-wide limits, one per kind of write (`what`: "position", "status", "outbox"...).
static WRITE_ERRORS: Mutex<Vec<(&'static str, LogLimit)>> = Mutex::new(Vec::new());

/// Every failed state write since the process started, logged or not.
static WRITE_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many state writes have failed since the process started (status and metrics show it:
/// the log says so only now and then).
pub fn write_failures() -> u64 {
    WRITE_FAILURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Logs a failed state write at error level, rate-limited per `what` (see
/// [`WRITE_ERROR_LOG_EVERY`]). Returns whether it was logged.
pub fn log_write_error(what: &'static str, err: &dyn std::fmt::Display) -> bool {
    WRITE_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let admitted = {
        let mut all = WRITE_ERRORS.lock().unwrap_or_else(|p| p.into_inner());
        let i = match all.iter().position(|(w, _)| *w == what) {
            Some(i) => i,
            None => {
                all.push((what, LogLimit::new(WRITE_ERROR_LOG_EVERY)));
                all.len() - 1
            }
        };
        all[i].1.admit(Instant::now())
    };
    match admitted {
        Some(0) => tracing::error!("{err}"),
        Some(n) => {
            tracing::error!("{err} ({n} more {what} write failures not logged since the last)")
        }
        None => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn replaces_the_file_with_the_mode_asked_for() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("status.json");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        write_atomic(&p, b"new", STATE_FILE_MODE).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(names(d.path()), ["status.json"]);
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_litter() {
        // The failure is injected where a full disk fails: inside the data write, after the
        // temporary file was created. (A real tiny filesystem needs root to mount.)
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("position.json");
        fs::write(&p, b"old").unwrap();
        let e = write_atomic_with(&p, STATE_FILE_MODE, |f| {
            f.write_all(b"half")?;
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), None, "wrapped with the path");
        let text = e.to_string();
        assert!(
            text.contains("position.json") && text.contains("No space left"),
            "{text}"
        );
        assert_eq!(fs::read(&p).unwrap(), b"old");
        assert_eq!(names(d.path()), ["position.json"]);
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gone").join("x.json");
        let e = write_atomic(&p, b"x", STATE_FILE_MODE).unwrap_err();
        assert!(e.to_string().contains("x.json"), "{e}");
    }

    #[test]
    fn concurrent_writers_of_one_file_do_not_collide() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("status.json");
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let p = &p;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(p, &[t; 4096], STATE_FILE_MODE).unwrap();
                    }
                });
            }
        });
        let b = fs::read(&p).unwrap();
        assert_eq!(b.len(), 4096);
        assert!(b.iter().all(|x| *x == b[0]), "one writer's content, whole");
        assert_eq!(names(d.path()), ["status.json"]);
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("precious");
        fs::write(&target, b"precious").unwrap();
        let p = d.path().join("position.json");
        // The next temporary name this process will use for `p`.
        let next = TMP_COUNTER.load(Ordering::Relaxed);
        for n in next..next + 64 {
            let name = format!(".position.json.{}.{n}{TMP_SUFFIX}", std::process::id());
            std::os::unix::fs::symlink(&target, d.path().join(name)).unwrap();
        }
        // Each planted name tried fails the write (other tests take numbers meanwhile, so how
        // many is not known); none is written through.
        let mut written = false;
        for _ in 0..=64 {
            match write_atomic(&p, b"new", STATE_FILE_MODE) {
                Ok(()) => {
                    written = true;
                    break;
                }
                Err(e) => assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}"),
            }
        }
        assert!(written);
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(
            fs::read(&target).unwrap(),
            b"precious",
            "not written through"
        );
    }

    #[test]
    fn temp_names_are_recognised() {
        let t = temp_name(Path::new("/s/0000000000000001.json")).unwrap();
        assert!(is_temp_name(&t.file_name().unwrap().to_string_lossy()));
        assert!(!is_temp_name("0000000000000001.json"));
    }

    #[test]
    fn a_storm_of_errors_is_logged_once_a_minute_with_the_count() {
        let mut l = LogLimit::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(l.admit(t0), Some(0));
        let logged = (1..=1000u64)
            .filter(|i| l.admit(t0 + Duration::from_millis(*i * 15)).is_some())
            .count();
        assert_eq!(logged, 0, "15 s of errors after the first: none logged");
        assert_eq!(l.admit(t0 + Duration::from_secs(61)), Some(1000));
        assert_eq!(l.admit(t0 + Duration::from_secs(62)), None);
    }

    #[test]
    fn the_process_wide_limit_logs_the_first_only() {
        let e = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(log_write_error("unit-test", &e));
        assert!((0..500).all(|_| !log_write_error("unit-test", &e)));
        assert!(log_write_error("unit-test-other", &e));
    }
}
