//! Opening a file of the state directory without trusting what is found there.
//!
//! Whoever could once write to the state directory may have left something that is not a state
//! file under a state file's name: a FIFO (a plain `open(2)` for reading waits forever for a
//! writer, and a daemon stuck in `open` does not even hear SIGTERM), a symbolic link (the daemon,
//! often root, would read or write through it, say its pid into `/etc/shadow`), a directory, a
//! device, a socket, or a file of another user's. So every state file is opened here, with
//! `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` (a link is not followed, a FIFO does not block), and
//! used only once `fstat` on the open descriptor says it is a regular file owned by this
//! process's effective uid. The type is looked at with `lstat` before the open too, so a device
//! node is never opened at all (opening some devices does something).
//!
//! What fails the check is refused with a message naming the path and what it is. The daemon
//! ([`Reader::Owner`]) then sets it aside (renames the entry itself, never what it points to, to
//! `NAME.refused-<unix time>`) and goes on as if the file were missing: it starts afresh and
//! writes a proper file at the next save. Another process reading the daemon's files (`xidwatch
//! status`, `xidwatch gpus`, often as another user: [`Reader::Visitor`]) only refuses: it moves
//! nothing and does not ask for its own uid.

use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// Flags of every open of a state file (see the module doc).
pub const OPEN_FLAGS: libc::c_int = libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;

/// Who reads the state file, which decides what is done with one that is not what it should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reader {
    /// The daemon, which owns the state directory: anything but its own regular file is set
    /// aside and the daemon goes on with a fresh one.
    Owner,
    /// Another process (`xidwatch status`, `xidwatch gpus`): anything but a regular file is an
    /// error naming it; nothing is moved, and the owner is not asked for (root reads the service
    /// account's files).
    Visitor,
}

/// What stands at a state file's name when it is not a state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAStateFile {
    Symlink,
    Fifo,
    Directory,
    CharDevice,
    BlockDevice,
    Socket,
    /// Some other kind of file.
    Other,
    /// A regular file, but another user's.
    Foreign {
        uid: u32,
        euid: u32,
    },
}

impl std::fmt::Display for NotAStateFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAStateFile::Symlink => f.write_str("a symbolic link"),
            NotAStateFile::Fifo => f.write_str("a FIFO (named pipe)"),
            NotAStateFile::Directory => f.write_str("a directory"),
            NotAStateFile::CharDevice => f.write_str("a character device"),
            NotAStateFile::BlockDevice => f.write_str("a block device"),
            NotAStateFile::Socket => f.write_str("a socket"),
            NotAStateFile::Other => f.write_str("not a regular file"),
            NotAStateFile::Foreign { uid, euid } => {
                write!(f, "owned by uid {uid}, not by this daemon's uid {euid}")
            }
        }
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// What is wrong with `meta` (from `lstat` or `fstat`) for a state file read by `who`, if
/// anything.
pub fn judge(meta: &Metadata, who: Reader) -> Option<NotAStateFile> {
    let t = meta.file_type();
    let kind = if t.is_symlink() {
        NotAStateFile::Symlink
    } else if t.is_fifo() {
        NotAStateFile::Fifo
    } else if t.is_dir() {
        NotAStateFile::Directory
    } else if t.is_char_device() {
        NotAStateFile::CharDevice
    } else if t.is_block_device() {
        NotAStateFile::BlockDevice
    } else if t.is_socket() {
        NotAStateFile::Socket
    } else if !t.is_file() {
        NotAStateFile::Other
    } else {
        let euid = euid();
        if who == Reader::Owner && meta.uid() != euid {
            return Some(NotAStateFile::Foreign {
                uid: meta.uid(),
                euid,
            });
        }
        return None;
    };
    Some(kind)
}

/// A state file refused: what it is, and where it was moved (for the owner).
#[derive(Debug)]
pub struct Refused {
    pub path: PathBuf,
    pub what: NotAStateFile,
    pub moved_to: Option<PathBuf>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {}, not a state file of this daemon's: refused",
            self.path.display(),
            self.what
        )?;
        if let Some(to) = &self.moved_to {
            write!(
                f,
                ", set aside as {}; going on with a fresh one",
                to.display()
            )?;
        }
        Ok(())
    }
}

fn refused_error(r: &Refused) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, r.to_string())
}

/// The outcome of [`open_checked`].
#[derive(Debug)]
pub enum Opened {
    File(File),
    Missing,
    /// Not opened (or opened and closed again): see [`Refused`]. Nothing was moved.
    Refused(Refused),
}

/// How a state file is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    /// Read and write, created (with the given mode) when missing: the lock file.
    ReadWriteCreate(u32),
}

/// Opens `path` as the module doc says, moving nothing. The one open of a state file.
pub fn open_checked(path: &Path, access: Access, who: Reader) -> io::Result<Opened> {
    let ctx = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let refused = |what| {
        Opened::Refused(Refused {
            path: path.to_path_buf(),
            what,
            moved_to: None,
        })
    };
    // Before the open, so that a FIFO, a socket or a device is never opened at all.
    match fs::symlink_metadata(path) {
        Ok(m) => {
            if let Some(what) = judge(&m, who) {
                return Ok(refused(what));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if access == Access::Read {
                return Ok(Opened::Missing);
            }
        }
        Err(e) => return Err(ctx(e)),
    }
    let mut opts = OpenOptions::new();
    opts.read(true).custom_flags(OPEN_FLAGS);
    if let Access::ReadWriteCreate(mode) = access {
        opts.write(true).create(true).truncate(false).mode(mode);
    }
    let file = match opts.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Opened::Missing),
        // Swapped between the lstat and the open: ELOOP for a link (O_NOFOLLOW), ENXIO for a
        // socket or a FIFO without a reader, EISDIR for a directory. Look again to say which.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ELOOP | libc::ENXIO | libc::EISDIR)
            ) =>
        {
            return match fs::symlink_metadata(path).ok().and_then(|m| judge(&m, who)) {
                Some(what) => Ok(refused(what)),
                None => Err(ctx(e)),
            };
        }
        Err(e) => return Err(ctx(e)),
    };
    // The descriptor's own word is the one that counts.
    let meta = file.metadata().map_err(ctx)?;
    if let Some(what) = judge(&meta, who) {
        return Ok(refused(what));
    }
    // A regular file ignores O_NONBLOCK; cleared all the same, so the descriptor behaves as any
    // other file's wherever it is handed.
    // SAFETY: fcntl on a descriptor this function owns.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(Opened::File(file))
}

/// Renames what is at `path` (the entry itself: a link is not followed) out of the way, to
/// `NAME.refused-<unix time>` (with `-N` added if that is taken), and returns the new name.
pub fn set_aside(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        )
    })?;
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.refused-{secs}", name.to_string_lossy());
    for n in 0..1000u32 {
        let to = path.with_file_name(if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        if fs::symlink_metadata(&to).is_ok() {
            continue;
        }
        return fs::rename(path, &to).map(|()| to).map_err(|e| {
            io::Error::new(e.kind(), format!("setting aside {}: {e}", path.display()))
        });
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("setting aside {}: too many refused copies", path.display()),
    ))
}

/// Sets a refused file aside (see [`set_aside`]) and logs it as a warning.
pub fn set_aside_and_log(mut r: Refused) -> io::Result<Refused> {
    r.moved_to = Some(set_aside(&r.path)?);
    tracing::warn!("{r}");
    Ok(r)
}

/// Opens a state file for reading: `None` when it is missing or (for the owner) was refused and
/// set aside; an error naming the path when a visitor finds something that is not a state file.
pub fn open_read(path: &Path, who: Reader) -> io::Result<Option<File>> {
    match open_checked(path, Access::Read, who)? {
        Opened::File(f) => Ok(Some(f)),
        Opened::Missing => Ok(None),
        Opened::Refused(r) if who == Reader::Owner => {
            set_aside_and_log(r)?;
            Ok(None)
        }
        Opened::Refused(r) => Err(refused_error(&r)),
    }
}

/// Reads a whole state file of at most `max` bytes (see [`open_read`] for `None`); a larger one
/// is an error naming it.
pub fn read_bounded(path: &Path, max: u64, who: Reader) -> io::Result<Option<Vec<u8>>> {
    let Some(f) = open_read(path, who)? else {
        return Ok(None);
    };
    let mut buf = Vec::new();
    f.take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", path.display())))?;
    if buf.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: larger than {max} bytes, too large for a state file",
                path.display()
            ),
        ));
    }
    Ok(Some(buf))
}

/// Opens (creating, `mode`) a state file the daemon keeps open for reading and writing, such as
/// the lock file. Anything else at its name is set aside (logged) first.
pub fn open_owned_rw(path: &Path, mode: u32) -> io::Result<File> {
    // Twice at most: once more after setting aside what was there.
    for _ in 0..2 {
        match open_checked(path, Access::ReadWriteCreate(mode), Reader::Owner)? {
            Opened::File(f) => return Ok(f),
            Opened::Missing => {}
            Opened::Refused(r) => {
                set_aside_and_log(r)?;
            }
        }
    }
    Err(io::Error::other(format!(
        "{}: something keeps appearing at this name; not opened",
        path.display()
    )))
}

/// For the names the daemon only ever writes (by rename, which replaces a FIFO or a link rather
/// than following it, but fails on a directory): anything but the daemon's own regular file is
/// set aside at start-up, so the first write finds the way clear and the operator is told.
pub fn tidy(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) => match judge(&m, Reader::Owner) {
            Some(what) => set_aside_and_log(Refused {
                path: path.to_path_buf(),
                what,
                moved_to: None,
            })
            .map(drop),
            None => Ok(()),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

/// Makes sure `dir`, a subdirectory of the state directory, is a real directory of the daemon's
/// own (a symbolic link there would send the outbox somewhere else), creating it with `mode`.
/// Anything else at its name is set aside (logged) first.
pub fn ensure_private_dir(dir: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if let Ok(m) = fs::symlink_metadata(dir) {
        let wrong = if m.file_type().is_dir() {
            (m.uid() != euid()).then_some(NotAStateFile::Foreign {
                uid: m.uid(),
                euid: euid(),
            })
        } else {
            match judge(&m, Reader::Owner) {
                // A regular file where a directory belongs.
                None => Some(NotAStateFile::Other),
                w => w,
            }
        };
        match wrong {
            Some(what) => {
                set_aside_and_log(Refused {
                    path: dir.to_path_buf(),
                    what,
                    moved_to: None,
                })?;
            }
            None => return Ok(()),
        }
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    fn refused_names(dir: &Path, name: &str) -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{name}.refused-")))
            .collect()
    }

    #[test]
    fn a_regular_file_of_ours_is_read() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("position.json");
        assert!(read_bounded(&p, 10, Reader::Owner).unwrap().is_none());
        fs::write(&p, b"{}").unwrap();
        for who in [Reader::Owner, Reader::Visitor] {
            assert_eq!(read_bounded(&p, 10, who).unwrap().unwrap(), b"{}");
        }
        let e = read_bounded(&p, 1, Reader::Owner).unwrap_err().to_string();
        assert!(
            e.contains("position.json") && e.contains("larger than 1"),
            "{e}"
        );
    }

    #[test]
    fn a_fifo_is_refused_without_blocking_and_set_aside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("incidents.json");
        mkfifo(&p);
        // A visitor: an error naming it, nothing moved.
        let e = read_bounded(&p, 1 << 20, Reader::Visitor)
            .unwrap_err()
            .to_string();
        assert!(e.contains("incidents.json") && e.contains("FIFO"), "{e}");
        assert!(p.exists());
        // The owner: set aside, read as missing.
        assert!(read_bounded(&p, 1 << 20, Reader::Owner).unwrap().is_none());
        assert!(fs::symlink_metadata(&p).is_err(), "moved");
        let aside = refused_names(d.path(), "incidents.json");
        assert_eq!(aside.len(), 1, "{aside:?}");
        let m = fs::symlink_metadata(d.path().join(&aside[0])).unwrap();
        assert!(m.file_type().is_fifo(), "the FIFO itself was moved");
    }

    #[test]
    fn a_symlink_is_not_followed_and_the_link_itself_is_set_aside() {
        let d = tempfile::tempdir().unwrap();
        let target = d.path().join("precious");
        fs::write(&target, b"precious").unwrap();
        let p = d.path().join("xidwatch.lock");
        std::os::unix::fs::symlink(&target, &p).unwrap();
        match open_checked(&p, Access::Read, Reader::Owner).unwrap() {
            Opened::Refused(r) => {
                assert_eq!(r.what, NotAStateFile::Symlink);
                assert!(r.to_string().contains("symbolic link"), "{r}");
            }
            o => panic!("{o:?}"),
        }
        let mut f = open_owned_rw(&p, 0o640).unwrap();
        f.write_all(b"1234\n").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"precious", "target untouched");
        assert!(fs::symlink_metadata(&p).unwrap().file_type().is_file());
        let aside = refused_names(d.path(), "xidwatch.lock");
        assert_eq!(aside.len(), 1, "{aside:?}");
        let m = fs::symlink_metadata(d.path().join(&aside[0])).unwrap();
        assert!(m.file_type().is_symlink());
    }

    #[test]
    fn a_directory_is_refused_and_set_aside() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("history.json");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("inside"), b"x").unwrap();
        let e = read_bounded(&p, 10, Reader::Visitor)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("history.json") && e.contains("a directory"),
            "{e}"
        );
        assert!(read_bounded(&p, 10, Reader::Owner).unwrap().is_none());
        let aside = refused_names(d.path(), "history.json");
        assert_eq!(aside.len(), 1);
        assert!(
            d.path().join(&aside[0]).join("inside").exists(),
            "moved whole"
        );
        // A second one in the same second gets a name of its own.
        fs::create_dir(&p).unwrap();
        tidy(&p).unwrap();
        assert_eq!(refused_names(d.path(), "history.json").len(), 2);
        assert!(!p.exists());
    }

    #[test]
    fn a_linked_subdirectory_is_replaced_by_a_private_one() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = d.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        let outbox = d.path().join("alert-outbox");
        std::os::unix::fs::symlink(&elsewhere, &outbox).unwrap();
        ensure_private_dir(&outbox, 0o700).unwrap();
        let m = fs::symlink_metadata(&outbox).unwrap();
        assert!(m.file_type().is_dir() && m.mode() & 0o077 == 0);
        assert_eq!(refused_names(d.path(), "alert-outbox").len(), 1);
        ensure_private_dir(&outbox, 0o700).unwrap();
        assert_eq!(refused_names(d.path(), "alert-outbox").len(), 1, "kept");
    }
}
