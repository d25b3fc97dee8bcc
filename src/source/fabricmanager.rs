//! Fabric Manager's log (`/var/log/fabricmanager.log`), followed like `tail -F`.
//!
//! When Fabric Manager loses a switch port or gives up on the fabric, its own log may be the only
//! place the cause is written (no Xid in the kernel log), so the daemon follows it as it follows
//! `/dev/kmsg`. Its records go through the same classifier as `scan`'s (the classifier itself
//! recognises a Fabric Manager record), and the findings travel to the daemon as values
//! ([`FmLogEvent`]); this source never touches the pipeline.
//!
//! Why a poll (stat of the path, fstat of the open file, every `poll_ms`) and not inotify: an
//! inotify watch on a file follows the inode, not the name, so rotation (rename + create) needs a
//! second watch on the directory and re-arming, and a log that appears only later needs a watch
//! on a directory that may not exist either. One stat and one fstat a second cost nothing, see
//! every rotation and truncation the same way, and a second of delay is far below what a page
//! takes to reach anyone.
//!
//! Where to start: the log is history, so a first start begins at its end (old records are not
//! paged at every start). The position (inode and offset, at the end of the last whole line) is
//! kept in the state directory, so a restart resumes within the same file without doubling or
//! losing records; a file with another inode (rotated while the daemon was down), one shorter than
//! the offset (truncated) and one that appears while the daemon runs are read from their start.

use crate::model::ConfigIssue;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use crate::classify::{prefix, Classifier, LineOrigin};
use crate::model::Finding;

/// The state file holding [`LogPosition`].
pub const POSITION_FILE: &str = "fabricmanager-position.json";

/// Longest line classified; a longer one has its first `MAX_LINE` bytes classified, the rest is
/// skipped (never buffered) and counted. Fabric Manager's records are a few hundred bytes.
pub const MAX_LINE: usize = 64 << 10;

/// Bytes read at a time: the memory this source holds is bounded by `CHUNK + MAX_LINE`.
const CHUNK: usize = 64 << 10;

/// `[fabricmanager]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct FabricManagerConfig {
    pub enabled: bool,
    /// Fabric Manager's log file (its `LOG_FILE_NAME`).
    pub log: PathBuf,
    /// How often the file is checked for new lines, rotation and truncation.
    pub poll_ms: u64,
}

impl Default for FabricManagerConfig {
    fn default() -> Self {
        FabricManagerConfig {
            enabled: true,
            log: PathBuf::from("/var/log/fabricmanager.log"),
            poll_ms: 1000,
        }
    }
}

impl FabricManagerConfig {
    /// Refuses what would make the follower spin or read nothing.
    pub fn validate(&self) -> Result<(), ConfigIssue> {
        if self.enabled && !self.log.is_absolute() {
            return Err(ConfigIssue::new(
                "fabricmanager.log",
                "expected an absolute path such as \"/var/log/fabricmanager.log\"",
            ));
        }
        if !(100..=60_000).contains(&self.poll_ms) {
            return Err(ConfigIssue::new(
                "fabricmanager.poll_ms",
                "expected 100 to 60000",
            ));
        }
        Ok(())
    }
}

/// Where reading stopped: the file (device and inode) and the offset just after the last whole
/// line handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogPosition {
    pub dev: u64,
    pub inode: u64,
    pub offset: u64,
}

/// What the follower tells the daemon.
#[derive(Debug)]
pub enum FmLogEvent {
    /// Findings from lines read up to `pos` (possibly none: the position moved over quiet lines).
    Read {
        findings: Vec<Finding>,
        pos: LogPosition,
    },
    /// Something to log.
    Note { warn: bool, text: String },
}

/// Splits bytes into lines with bounded memory: a torn last line waits for the rest, a line over
/// `cap` bytes is cut (its head is a line, the rest skipped up to its newline and counted), and a
/// trailing `\r` is dropped.
#[derive(Debug)]
pub struct LineSplitter {
    buf: Vec<u8>,
    cap: usize,
    skipping: bool,
    /// Lines cut so far.
    pub cut: u64,
}

impl LineSplitter {
    pub fn new(cap: usize) -> Self {
        LineSplitter {
            buf: Vec::new(),
            cap: cap.max(1),
            skipping: false,
            cut: 0,
        }
    }

    /// Bytes of a torn line held back (not yet a line): the saved position stops before them so
    /// that a restart reads the line whole. Zero while skipping a cut line's tail.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// Feeds `chunk`, calling `line` for every whole line in it.
    pub fn push(&mut self, mut chunk: &[u8], line: &mut impl FnMut(&[u8])) {
        while !chunk.is_empty() {
            if self.skipping {
                match memchr::memchr(b'\n', chunk) {
                    Some(i) => {
                        self.skipping = false;
                        chunk = &chunk[i + 1..];
                    }
                    None => return,
                }
                continue;
            }
            match memchr::memchr(b'\n', chunk) {
                Some(i) if self.buf.len() + i <= self.cap => {
                    if self.buf.is_empty() {
                        line(trim_cr(&chunk[..i]));
                    } else {
                        self.buf.extend_from_slice(&chunk[..i]);
                        line(trim_cr(&self.buf));
                        self.buf.clear();
                    }
                    chunk = &chunk[i + 1..];
                }
                found => {
                    let room = self.cap - self.buf.len();
                    let end = found.unwrap_or(chunk.len());
                    if end <= room {
                        self.buf.extend_from_slice(chunk);
                        return;
                    }
                    // Over the cap: classify the head, skip the rest of the line.
                    self.buf.extend_from_slice(&chunk[..room]);
                    line(&self.buf);
                    self.buf.clear();
                    self.cut += 1;
                    match found {
                        Some(i) => chunk = &chunk[i + 1..],
                        None => {
                            self.skipping = true;
                            return;
                        }
                    }
                }
            }
        }
    }

    /// The end of a file that will not grow (rotated away): a torn last line is a line too.
    pub fn finish(&mut self, line: &mut impl FnMut(&[u8])) {
        if !self.buf.is_empty() {
            line(trim_cr(&self.buf));
        }
        self.reset();
    }

    /// Forgets a torn line (the file was truncated under it).
    pub fn reset(&mut self) {
        self.buf.clear();
        self.skipping = false;
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Classifies one line the way `scan` does; invalid UTF-8 is replaced. A reader that fails on
/// the line (a defect: reading never panics by design) costs the line, not this follower: a
/// panic here ended the thread, and with it the watch of the Fabric Manager's log, silently.
fn classify_line(c: &mut Classifier, bytes: &[u8], out: &mut Vec<Finding>) {
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read_line(c, bytes, out)));
    if read.is_err() {
        tracing::error!(
            "Fabric Manager log: a reader failed on a line and skipped it (a defect in xidwatch: please report it with the line, whose start follows); the watch goes on: {}",
            crate::classify::trim::chars(&String::from_utf8_lossy(bytes), 200)
        );
    }
}

fn read_line(c: &mut Classifier, bytes: &[u8], out: &mut Vec<Finding>) {
    let text = String::from_utf8_lossy(bytes);
    let Some((p, messages)) = prefix::split_borrowed(&text) else {
        return;
    };
    let at = LineOrigin {
        line: 0,
        seq: p.seq,
        ts_usec: p.ts_usec,
        timestamp: p.text.as_deref().map(crate::model::Stamp::new),
    };
    for msg in messages.iter() {
        c.push(msg, &at, out);
    }
}

struct Open {
    file: File,
    dev: u64,
    inode: u64,
    /// Bytes read so far (the splitter may hold a torn line's part of them).
    read: u64,
}

/// The follower's state between polls. Pure of timing: [`Follower::poll`] does one round.
pub struct Follower {
    path: PathBuf,
    saved: Option<LogPosition>,
    open: Option<Open>,
    /// False until the first file is opened (or found absent) in this run: only a file there at
    /// the start may start at its end or at the saved position.
    opened_once: bool,
    said_absent: bool,
    said_error: bool,
    splitter: LineSplitter,
    classifier: Classifier,
    reported_cut: u64,
    /// The position last sent.
    sent: Option<LogPosition>,
}

impl Follower {
    pub fn new(path: PathBuf, saved: Option<LogPosition>) -> Self {
        Follower {
            path,
            saved,
            open: None,
            opened_once: false,
            said_absent: false,
            said_error: false,
            splitter: LineSplitter::new(MAX_LINE),
            classifier: Classifier::new(),
            reported_cut: 0,
            sent: None,
        }
    }

    /// One round: opens the file if needed, reads what is new, notices rotation and truncation.
    /// Events go to `emit`; false from `emit` (the daemon is gone) stops the round.
    pub fn poll(&mut self, emit: &mut impl FnMut(FmLogEvent) -> bool) -> bool {
        if self.open.is_none() && !self.try_open(emit) {
            return true;
        }
        if !self.read_new(emit) {
            return false;
        }
        // Rotation: the name now leads elsewhere (or nowhere). What the old file held is read
        // (above), then the new one from its start.
        let renamed = match std::fs::metadata(&self.path) {
            Ok(m) => self
                .open
                .as_ref()
                .is_some_and(|o| (m.dev(), m.ino()) != (o.dev, o.inode)),
            Err(_) => true,
        };
        if renamed {
            // Lines written between the read above and the stat are in the old file: read it
            // to its end once more before letting it go.
            if !self.read_new(emit) {
                return false;
            }
            let mut out = Vec::new();
            let c = &mut self.classifier;
            self.splitter.finish(&mut |l| classify_line(c, l, &mut out));
            self.classifier.flush(&mut out);
            let pos = self.position();
            self.open = None;
            if let Some(pos) = pos {
                if !emit(FmLogEvent::Read { findings: out, pos }) {
                    return false;
                }
            }
            if !emit(note(
                false,
                format!(
                    "Fabric Manager log: {} was rotated; reading the new file from its start",
                    self.path.display()
                ),
            )) {
                return false;
            }
            if self.try_open(emit) {
                return self.read_new(emit);
            }
        }
        true
    }

    fn position(&self) -> Option<LogPosition> {
        self.open.as_ref().map(|o| LogPosition {
            dev: o.dev,
            inode: o.inode,
            offset: o.read - self.splitter.held() as u64,
        })
    }

    fn try_open(&mut self, emit: &mut impl FnMut(FmLogEvent) -> bool) -> bool {
        let opened = File::open(&self.path).and_then(|f| {
            let m = f.metadata()?;
            if !m.is_file() {
                return Err(io::Error::other("not a regular file"));
            }
            Ok((f, m))
        });
        let (file, m) = match opened {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A file that appears from now on was created after the daemon looked: all of it
                // is new.
                self.opened_once = true;
                if !self.said_absent {
                    self.said_absent = true;
                    emit(note(
                        false,
                        format!(
                            "Fabric Manager log: {} is not there (yet); checking for it (said once)",
                            self.path.display()
                        ),
                    ));
                }
                return false;
            }
            Err(e) => {
                if !self.said_error {
                    self.said_error = true;
                    emit(note(
                        true,
                        format!(
                            "Fabric Manager log: cannot read {}: {e}; checking again (said once)",
                            self.path.display()
                        ),
                    ));
                }
                return false;
            }
        };
        let (dev, inode, size) = (m.dev(), m.ino(), m.len());
        let start = match (self.opened_once, self.saved) {
            // The same file as before the restart: resume, unless it was truncated meanwhile.
            (false, Some(s)) if (s.dev, s.inode) == (dev, inode) && s.offset <= size => s.offset,
            // A first start: the file is history.
            (false, None) => size,
            // Rotated or truncated while the daemon was down, or a file that appeared (or was
            // recreated) while it runs: all of it is new.
            _ => 0,
        };
        self.opened_once = true;
        self.said_absent = false;
        self.said_error = false;
        self.splitter.reset();
        self.open = Some(Open {
            file,
            dev,
            inode,
            read: start,
        });
        emit(note(
            false,
            format!(
                "Fabric Manager log: following {} from offset {start}",
                self.path.display()
            ),
        ));
        true
    }

    /// Reads the open file to its end in bounded chunks; a truncated file is read from its start.
    fn read_new(&mut self, emit: &mut impl FnMut(FmLogEvent) -> bool) -> bool {
        let Some(o) = self.open.as_mut() else {
            return true;
        };
        let size = match o.file.metadata() {
            Ok(m) => m.len(),
            Err(_) => return true,
        };
        if size < o.read {
            o.read = 0;
            self.splitter.reset();
            if !emit(note(
                false,
                format!(
                    "Fabric Manager log: {} was truncated; reading it from its start",
                    self.path.display()
                ),
            )) {
                return false;
            }
        }
        let mut buf = vec![0u8; CHUNK];
        loop {
            let Some(o) = self.open.as_mut() else {
                return true;
            };
            let n = match o.file.read_at(&mut buf, o.read) {
                Ok(0) => return self.emit_read(Vec::new(), emit),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return emit(note(
                        true,
                        format!("Fabric Manager log: reading {}: {e}", self.path.display()),
                    ))
                }
            };
            o.read += n as u64;
            let mut out = Vec::new();
            let c = &mut self.classifier;
            self.splitter
                .push(&buf[..n], &mut |l| classify_line(c, l, &mut out));
            self.classifier.flush(&mut out);
            if self.splitter.cut > self.reported_cut {
                self.reported_cut = self.splitter.cut;
                if self.reported_cut.is_power_of_two()
                    && !emit(note(
                        true,
                        format!(
                            "Fabric Manager log: {} line(s) longer than {} KiB so far; each was cut there",
                            self.reported_cut,
                            MAX_LINE / 1024
                        ),
                    ))
                {
                    return false;
                }
            }
            // Quiet chunks only move the position: said once at the end of the backlog, so a
            // long stretch of chatter is not a state-file write per chunk.
            if !out.is_empty() && !self.emit_read(out, emit) {
                return false;
            }
        }
    }

    /// Sends what was read with the position after it; false when the daemon is gone.
    fn emit_read(
        &mut self,
        findings: Vec<Finding>,
        emit: &mut impl FnMut(FmLogEvent) -> bool,
    ) -> bool {
        let Some(pos) = self.position() else {
            return true;
        };
        if findings.is_empty() && self.sent == Some(pos) {
            return true;
        }
        self.sent = Some(pos);
        emit(FmLogEvent::Read { findings, pos })
    }
}

fn note(warn: bool, text: String) -> FmLogEvent {
    FmLogEvent::Note { warn, text }
}

/// Follows `path` on its own thread until the daemon drops the receiver. Blocking reads stay off
/// the daemon's single-threaded runtime.
pub fn spawn(
    cfg: &FabricManagerConfig,
    saved: Option<LogPosition>,
    tx: mpsc::Sender<FmLogEvent>,
) -> io::Result<()> {
    let mut f = Follower::new(cfg.log.clone(), saved);
    let every = Duration::from_millis(cfg.poll_ms);
    std::thread::Builder::new()
        .name("fabricmanager-log".into())
        .spawn(move || {
            let mut emit = |ev| tx.blocking_send(ev).is_ok();
            while f.poll(&mut emit) && !tx.is_closed() {
                std::thread::sleep(every);
            }
        })?;
    Ok(())
}

/// Saves the Fabric Manager log position (atomically, through the state directory's checked
/// helpers) when it moved.
pub fn save_position(
    state: &crate::state::StateDir,
    last: &mut Option<LogPosition>,
    pos: LogPosition,
) {
    if *last == Some(pos) {
        return;
    }
    match state.save_json(POSITION_FILE, &pos) {
        Ok(()) => *last = Some(pos),
        Err(e) => {
            crate::state::log_write_error(
                "fabricmanager position",
                &format!("saving the Fabric Manager log position: {e:#}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], cap: usize) -> (Vec<Vec<u8>>, LineSplitter) {
        let mut s = LineSplitter::new(cap);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut |l| out.push(l.to_vec()));
        }
        (out, s)
    }

    #[test]
    fn a_torn_line_waits_for_its_rest() {
        let (out, s) = split(&[b"one\r\ntw", b"o", b"\nthr"], 100);
        assert_eq!(out, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(s.held(), 3, "the torn `thr` is held, not a line");
        let mut s = s;
        let mut rest = Vec::new();
        s.finish(&mut |l| rest.push(l.to_vec()));
        assert_eq!(rest, vec![b"thr".to_vec()]);
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn an_over_long_line_is_cut_counted_and_never_buffered_whole() {
        let long = vec![b'x'; 1 << 20];
        let (out, s) = split(&[b"a\n", &long, &long, b"tail\nb\n"], 1024);
        assert_eq!(out.len(), 3, "a, the cut head, b");
        assert_eq!(out[1].len(), 1024);
        assert_eq!(out[2], b"b");
        assert_eq!(s.cut, 1);
        assert_eq!(s.held(), 0);
        // Cut within one chunk too, with the newline in it.
        let mut one = vec![b'y'; 5000];
        one.extend_from_slice(b"\nok\n");
        let (out, s) = split(&[&one], 1024);
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].len(), out[1].as_slice(), s.cut),
            (1024, &b"ok"[..], 1)
        );
        // A line exactly at the cap is whole.
        let mut exact = vec![b'z'; 1024];
        exact.push(b'\n');
        let (out, s) = split(&[&exact[..10], &exact[10..]], 1024);
        assert_eq!((out.len(), out[0].len(), s.cut), (1, 1024, 0));
    }

    #[test]
    fn invalid_utf8_is_replaced_and_still_classified() {
        let line = b"[Nov 14 2023 10:00:00] [ERROR] [tid 1234] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port 18 \xff\xfe";
        let (out, _) = split(&[line, b"\n"], MAX_LINE);
        let mut c = Classifier::new();
        let mut f = Vec::new();
        classify_line(&mut c, &out[0], &mut f);
        c.flush(&mut f);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].xid, Some(20034));
        // Garbage of every kind never panics.
        for junk in [&b"\xff\xff\xff"[..], b"[\xc3", b"] [ERROR] \xe2\x82", b""] {
            classify_line(&mut c, junk, &mut f);
        }
    }

    /// A reader that fails on a line (the unit tests' classifier panics on a marked line) costs
    /// that line: the follower's next record is still read.
    #[test]
    fn a_reader_that_fails_on_a_line_costs_the_line_not_the_follower() {
        let mut c = Classifier::new();
        let mut f = Vec::new();
        let poison = format!(
            "[Nov 14 2023 10:00:00] [ERROR] [tid 1234] {}",
            crate::classify::POISON_FOR_TESTS
        );
        classify_line(&mut c, poison.as_bytes(), &mut f);
        classify_line(&mut c, b"[Nov 14 2023 10:00:01] [ERROR] [tid 1234] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port 18", &mut f);
        c.flush(&mut f);
        assert!(f.iter().any(|x| x.xid == Some(20034)), "{f:#?}");
    }

    /// The follower on its own: a megabyte line, invalid UTF-8 and a torn record in the file
    /// cost bounded memory, never a panic, and the next record is still found, once.
    #[test]
    fn the_follower_survives_odd_input_and_finds_the_next_record() {
        use std::io::Write;
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("fm.log");
        std::fs::write(&path, "old history\n").unwrap();
        let mut f = Follower::new(path.clone(), None);
        let mut got = Vec::new();
        let mut emit = |ev| {
            if let FmLogEvent::Read { findings, pos } = ev {
                got.push((
                    findings
                        .into_iter()
                        .filter_map(|f| f.xid)
                        .collect::<Vec<_>>(),
                    pos,
                ));
            }
            true
        };
        assert!(f.poll(&mut emit));
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        w.write_all(&vec![b'x'; 1 << 20]).unwrap();
        w.write_all(b"\n\xff\xfe [ERROR] \xc3\n").unwrap();
        let rec = "[Nov 14 2023 10:00:00] [ERROR] [tid 1234] detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 0 port 18\n";
        w.write_all(&rec.as_bytes()[..30]).unwrap();
        assert!(f.poll(&mut emit));
        w.write_all(&rec.as_bytes()[30..]).unwrap();
        assert!(f.poll(&mut emit));
        assert!(f.poll(&mut emit));
        let xids: Vec<u32> = got.iter().flat_map(|(x, _)| x.clone()).collect();
        assert_eq!(xids, vec![20034]);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(got.last().map(|(_, p)| p.offset), Some(len));
        assert_eq!(f.splitter.cut, 1);
    }

    #[test]
    fn config_keys_are_documented_ones_only() {
        let c: FabricManagerConfig =
            toml::from_str("enabled = false\nlog = \"/var/log/fm.log\"\npoll_ms = 500\n").unwrap();
        assert_eq!((c.enabled, c.poll_ms), (false, 500));
        assert_eq!(c.log, PathBuf::from("/var/log/fm.log"));
        let e = toml::from_str::<FabricManagerConfig>("logfile = \"/x\"\n").unwrap_err();
        assert!(e.to_string().contains("logfile"), "{e}");
    }

    #[test]
    fn config_refuses_a_relative_log_and_a_spinning_poll() {
        let ok = FabricManagerConfig::default();
        assert!(ok.validate().is_ok());
        let rel = FabricManagerConfig {
            log: "fabricmanager.log".into(),
            ..ok.clone()
        };
        assert_eq!(rel.validate().unwrap_err().key, "fabricmanager.log");
        let fast = FabricManagerConfig { poll_ms: 1, ..ok };
        assert_eq!(fast.validate().unwrap_err().key, "fabricmanager.poll_ms");
    }
}
