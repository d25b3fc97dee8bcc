//! Following `/dev/kmsg` on a dedicated thread.
//!
//! The device is opened non-blocking and waited on with `poll(2)`, so a quiet log costs no CPU and
//! the thread still notices a stop request within half a second. Each `read(2)` returns exactly
//! one record. `EPIPE` means the ring buffer overwrote our position; the next read returns the
//! oldest record still held, and the jump in sequence numbers says how many were lost.
//!
//! Why not a kmsg crate such as `rmesg`: its readers hand back parsed entries and poll on a timer;
//! what we need is the raw record (sequence number, facility, continuation fields), the
//! difference between `EPIPE` and a quiet log, and a wait that costs nothing. That is one `read`
//! and one `poll`, so it lives here, next to our own record parser.
//!
//! A regular file of records (one per line) is followed too, by polling its end every few tens of
//! milliseconds: tests and drills use that, production never does.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::mpsc::Sender;

use super::record::{parse_record, KmsgRecord};

/// What the follower hands to the pipeline.
#[derive(Debug)]
pub enum KmsgEvent {
    /// A record; `at_startup` when it was already in the buffer when xidwatch started.
    Record { rec: KmsgRecord, at_startup: bool },
    /// Records lost before we could read them: a sequence gap or `EPIPE`.
    Overrun {
        lost: u64,
        next_seq: u64,
        at_startup: bool,
    },
    /// A record that did not parse, with the reason; it is counted and skipped.
    Malformed(String),
    /// Everything that was in the buffer at start-up has been read.
    CaughtUp,
    /// The source failed for good.
    Failed(String),
}

/// Largest record the kernel produces (CONSOLE_EXT_LOG_MAX) with room to spare.
const RECORD_BUF: usize = 16 * 1024;
/// Poll interval for regular files (tests and drills only).
const FILE_POLL: Duration = Duration::from_millis(10);

/// Opens the kernel log, explaining the usual permission problem in words an operator can act on.
pub fn open(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.kind() == io::ErrorKind::PermissionDenied {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: permission denied: reading the kernel log needs root or CAP_SYSLOG \
                         (kernel.dmesg_restrict=1); run as the installed service, or with sudo",
                        path.display()
                    ),
                )
            } else {
                io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        })
}

/// Starts the follower thread. `resume_after`: the last sequence number already handled in this
/// boot (records up to it are skipped); `None` on the first start in a boot, when the whole
/// buffer is read once.
pub fn spawn(
    path: PathBuf,
    file: File,
    resume_after: Option<u64>,
    tx: Sender<KmsgEvent>,
    stop: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    let is_char = file.metadata()?.file_type().is_char_device();
    std::thread::Builder::new()
        .name("kmsg".into())
        .spawn(move || {
            let mut st = Follow {
                last: resume_after,
                startup: true,
                tx,
            };
            let res = if is_char {
                st.device(file, &stop)
            } else {
                st.regular(file, &stop)
            };
            if let Err(e) = res {
                let _ = st
                    .tx
                    .blocking_send(KmsgEvent::Failed(format!("{}: {e}", path.display())));
            }
        })
}

struct Follow {
    last: Option<u64>,
    startup: bool,
    tx: Sender<KmsgEvent>,
}

/// The receiver is gone: the daemon is shutting down.
struct Closed;

impl Follow {
    fn send(&self, ev: KmsgEvent) -> Result<(), Closed> {
        self.tx.blocking_send(ev).map_err(|_| Closed)
    }

    /// Handles one raw record: skip what was handled, report gaps, pass the rest on.
    fn record(&mut self, raw: &[u8]) -> Result<(), Closed> {
        let rec = match parse_record(raw) {
            Ok(r) => r,
            Err(e) => return self.send(KmsgEvent::Malformed(e.to_string())),
        };
        match self.last {
            Some(last) if rec.seq <= last => return Ok(()),
            Some(last) if rec.seq > last + 1 => self.send(KmsgEvent::Overrun {
                lost: rec.seq - last - 1,
                next_seq: rec.seq,
                at_startup: self.startup,
            })?,
            // First start in this boot and the oldest record is not the first: the ring wrapped.
            None if rec.seq > 0 => self.send(KmsgEvent::Overrun {
                lost: rec.seq,
                next_seq: rec.seq,
                at_startup: true,
            })?,
            _ => {}
        }
        self.last = Some(rec.seq);
        let at_startup = self.startup;
        self.send(KmsgEvent::Record { rec, at_startup })
    }

    fn caught_up(&mut self) -> Result<(), Closed> {
        if self.startup {
            self.startup = false;
            self.send(KmsgEvent::CaughtUp)?;
        }
        Ok(())
    }

    fn device(&mut self, mut file: File, stop: &AtomicBool) -> io::Result<()> {
        let mut buf = vec![0u8; RECORD_BUF];
        while !stop.load(Ordering::Relaxed) {
            match file.read(&mut buf) {
                Ok(0) => {
                    if self.caught_up().is_err() {
                        return Ok(());
                    }
                    wait_readable(&file)?;
                }
                Ok(n) => {
                    if self.record(&buf[..n]).is_err() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.caught_up().is_err() {
                        return Ok(());
                    }
                    wait_readable(&file)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Overwritten while we were away: the next read starts at the oldest record and
                // the sequence gap tells how many were lost.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn regular(&mut self, file: File, stop: &AtomicBool) -> io::Result<()> {
        let mut r = BufReader::new(file);
        let mut line = Vec::with_capacity(1024);
        while !stop.load(Ordering::Relaxed) {
            let n = r.read_until(b'\n', &mut line)?;
            if n == 0 || !line.ends_with(b"\n") {
                // At the end (perhaps mid-line): wait for the writer.
                if self.caught_up().is_err() {
                    return Ok(());
                }
                std::thread::sleep(FILE_POLL);
                continue;
            }
            // Continuation ` KEY=VALUE` lines belong to the previous record; they carry no
            // message, so in file mode they are skipped.
            if !line.starts_with(b" ") && line.len() > 1 && self.record(&line).is_err() {
                return Ok(());
            }
            line.clear();
        }
        Ok(())
    }
}

fn wait_readable(file: &File) -> io::Result<()> {
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let rc = unsafe { libc::poll(&mut pfd, 1, 500) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}
