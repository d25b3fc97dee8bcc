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
//! milliseconds: tests and drills use that, production never does. A line there is cut at
//! [`MAX_FILE_RECORD`] bytes (the kernel's own records are under 8 KiB), so a file that is not
//! what it claims to be costs bounded memory.
//!
//! Sequence numbers are judged by [`Sequencer`]: the kernel's only ever go up by one, or jump
//! forward over records it overwrote, and it cannot have overwritten more than its ring holds
//! ([`MAX_LOST`]). Anything else (a jump further than that, a step back) is a sequence jump:
//! counted and reported with where it jumped from and to, never added to the lost records, and
//! the records after it are still read.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::sync::mpsc::{Receiver, SyncSender};
use tokio::sync::mpsc::Sender;

use super::record::{parse_record_into, KmsgRecord};

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
    /// A record whose sequence number does not follow the previous one; the record itself is
    /// passed on too (as a `Record`) unless it may have been handled before a restart.
    SequenceAnomaly {
        anomaly: SeqAnomaly,
        at_startup: bool,
    },
    /// Everything that was in the buffer at start-up has been read.
    CaughtUp,
    /// The source failed for good.
    Failed(String),
}

/// Events handed to the pipeline in one channel message at most. One message per record cost a
/// wake-up of the other side (a futex call and a context switch on a busy core) per record: a
/// sixth of the daemon's time while it read a backlog. A batch is sent when it is full and
/// whenever the reader has nothing more to read for now (before it waits), so a record never
/// waits in a batch for the next one: the latency of a lone record is unchanged.
pub const BATCH: usize = 256;
/// Batches the channel between reader and pipeline holds (bounded memory while the pipeline is
/// behind: at most `CHANNEL_BATCHES * BATCH` records queued, as with one record per message
/// before).
pub const CHANNEL_BATCHES: usize = 4;

/// Largest record the kernel produces (CONSOLE_EXT_LOG_MAX) with room to spare.
const RECORD_BUF: usize = 16 * 1024;
/// Longest line kept from a regular file; the rest of a longer line is skipped with a warning.
pub const MAX_FILE_RECORD: usize = 64 * 1024;
/// A sequence number this far from where reading starts (the first record of a boot, or the
/// resume point) is not the kernel's: no boot prints four billion records. Looser than
/// [`MAX_LOST`] on purpose: across a restart, or before the first start, any number of records
/// may have come and gone, and a record judged against this bound is not yet compared with a
/// record read just before it.
pub const FAR_AHEAD: u64 = 1 << 32;

/// The most records one gap between two records read one after the other may have lost. Between
/// two reads the kernel can only overwrite what its ring holds: at most one record per 32 bytes
/// of a 32 MiB buffer, the largest `CONFIG_LOG_BUF_SHIFT` allows, so about a million. A larger
/// gap (a forged record, a rewritten file) is a sequence jump, not two billion lost records.
pub const MAX_LOST: u64 = 1 << 20;

/// What was wrong with a record's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqAnomalyKind {
    /// More than [`MAX_LOST`] records past the previous one (or more than [`FAR_AHEAD`] past
    /// where reading started).
    FarAhead,
    /// Not after the previous record.
    Backwards,
}

/// One record out of sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqAnomaly {
    pub kind: SeqAnomalyKind,
    /// The record's sequence number.
    pub seq: u64,
    /// The last in-order sequence number before it (`None`: none yet in this run).
    pub after: Option<u64>,
    /// Delivered anomalies so far in this run, this one included (the daemon reports the first
    /// as a finding and logs the rest sparingly).
    pub count: u64,
    /// Whether the record is passed on; `false` when it came before the resume point was found
    /// and was read (and reported) before the restart. Only delivered ones reach the daemon.
    pub delivered: bool,
}

impl std::fmt::Display for SeqAnomaly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            SeqAnomalyKind::FarAhead => "jumps far ahead",
            SeqAnomalyKind::Backwards => "goes backwards",
        };
        write!(f, "record sequence number {} {what}", self.seq)?;
        match self.after {
            Some(a) => write!(
                f,
                " of {a} (a sequence jump from {a} to {}, not counted as lost records)",
                self.seq
            )?,
            None => write!(
                f,
                " (a sequence jump to {} at the start, not counted as lost records)",
                self.seq
            )?,
        }
        if !self.delivered {
            f.write_str(" (before the resume point; skipped as possibly handled)")?;
        }
        Ok(())
    }
}

/// What to do with a record, by its sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Handled before the restart: skip it.
    Handled,
    /// The next record: pass it on.
    Next,
    /// `lost` records were overwritten before it: report the overrun, pass it on.
    Gap { lost: u64 },
    /// The first record of the first start in this boot; `not_seen` records before it left the
    /// ring before xidwatch ran. Not an overrun: nothing was lost on xidwatch's watch.
    First { not_seen: u64 },
    /// Out of sequence: report it, and pass the record on if `delivered`.
    Anomaly(SeqAnomaly),
}

/// Judges sequence numbers, record by record. Plain values in, verdicts out: tested without a
/// kernel.
///
/// Resuming after record `p` means: skip records up to the first one numbered `p` (or the first
/// one past it, if `p` is gone), and read everything after it in order of arrival, whatever its
/// number. So a bad number that was saved as the position (say 2^64-1, followed by small ones)
/// never keeps the daemon blind after a restart: the records after it are new.
#[derive(Debug, Clone)]
pub struct Sequencer {
    resume_after: Option<u64>,
    /// The last in-order sequence number; `None` until the first record (or the resume point).
    last: Option<u64>,
    /// The last out-of-sequence number, if the previous record was one: a record right after it
    /// means the stream really moved there, so `last` follows without a second report.
    stray: Option<u64>,
    anomalies: u64,
}

impl Sequencer {
    pub fn new(resume_after: Option<u64>) -> Sequencer {
        Sequencer {
            resume_after,
            last: None,
            stray: None,
            anomalies: 0,
        }
    }

    fn anomaly(&mut self, kind: SeqAnomalyKind, seq: u64, delivered: bool) -> Verdict {
        // Only what is read now counts: a skipped one was reported before the restart.
        if delivered {
            self.anomalies += 1;
        }
        self.stray = delivered.then_some(seq);
        Verdict::Anomaly(SeqAnomaly {
            kind,
            seq,
            after: self.last,
            count: self.anomalies,
            delivered,
        })
    }

    pub fn judge(&mut self, seq: u64) -> Verdict {
        let Some(last) = self.last else {
            return match self.resume_after {
                // Still looking for the resume point.
                Some(p) if seq <= p => {
                    if seq == p {
                        self.last = Some(p);
                    }
                    Verdict::Handled
                }
                Some(p) if seq - p > FAR_AHEAD => {
                    self.anomaly(SeqAnomalyKind::FarAhead, seq, false)
                }
                Some(p) => {
                    self.last = Some(p);
                    self.judge(seq)
                }
                None if seq > FAR_AHEAD => self.anomaly(SeqAnomalyKind::FarAhead, seq, true),
                None => {
                    self.last = Some(seq);
                    Verdict::First { not_seen: seq }
                }
            };
        };
        let stray = self.stray.take();
        if seq == last.wrapping_add(1) && last != u64::MAX {
            self.last = Some(seq);
            return Verdict::Next;
        }
        if stray.is_some_and(|s| s != u64::MAX && seq == s + 1) {
            // The stream went on from the stray record: follow it, reported once already.
            self.last = Some(seq);
            return Verdict::Next;
        }
        if seq <= last {
            return self.anomaly(SeqAnomalyKind::Backwards, seq, true);
        }
        if seq - last - 1 > MAX_LOST {
            return self.anomaly(SeqAnomalyKind::FarAhead, seq, true);
        }
        self.last = Some(seq);
        Verdict::Gap {
            lost: seq - last - 1,
        }
    }
}
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
/// The way batches come back to the reader once the pipeline has handled them (see
/// [`parse_record_into`]): the sending half goes to the pipeline, the receiving half to [`spawn`].
pub fn returns() -> (SyncSender<Vec<KmsgEvent>>, Receiver<Vec<KmsgEvent>>) {
    std::sync::mpsc::sync_channel(IN_FLIGHT)
}

/// The most batches out at once: those queued to the pipeline, the one it is handling and the
/// one the reader is handing over. The way back holds that many, so that none has to be dropped.
const IN_FLIGHT: usize = CHANNEL_BATCHES + 2;

/// Records kept for reuse: every batch in flight's worth, each with its buffers. Why so many:
/// where the reader and the pipeline share a core, the reader fills the queue in one time slice
/// and the pipeline hands all of it back in the next; with a batch's worth kept, and one batch
/// taken back per hand-over, the rest were dropped and allocated again (freeing and allocating
/// records held 7 % of the samples of a profile of the daemon on bench/daemon_file.sh's GPU-host
/// mix, pinned to one core).
const SPARE_RECORDS: usize = BATCH * IN_FLIGHT;

/// A record whose message buffer grew past this is not kept for reuse (a file's line may be
/// [`MAX_FILE_RECORD`] long; its buffer would be held for good).
const SPARE_MESSAGE_CAPACITY: usize = 16 * 1024;

pub fn spawn(
    path: PathBuf,
    file: File,
    resume_after: Option<u64>,
    tx: Sender<Vec<KmsgEvent>>,
    returned: Option<Receiver<Vec<KmsgEvent>>>,
    stop: Arc<AtomicBool>,
) -> io::Result<JoinHandle<()>> {
    let is_char = file.metadata()?.file_type().is_char_device();
    std::thread::Builder::new()
        .name("kmsg".into())
        .spawn(move || {
            let mut st = Follow {
                seq: Sequencer::new(resume_after),
                startup: true,
                truncated: 0,
                batch: Vec::with_capacity(BATCH),
                tx,
                returned,
                spare: Vec::new(),
            };
            let res = if is_char {
                st.device(file, &stop)
            } else {
                st.regular(file, &stop)
            };
            if let Err(e) = res {
                st.batch
                    .push(KmsgEvent::Failed(format!("{}: {e}", path.display())));
            }
            // What was read before a stop or a failure still reaches the pipeline.
            let _ = st.flush();
        })
}

struct Follow {
    seq: Sequencer,
    startup: bool,
    /// Lines of a regular file cut at [`MAX_FILE_RECORD`] so far.
    truncated: u64,
    /// Events not yet handed over (see [`BATCH`]).
    batch: Vec<KmsgEvent>,
    tx: Sender<Vec<KmsgEvent>>,
    /// Batches the pipeline has handled, back for their buffers.
    returned: Option<Receiver<Vec<KmsgEvent>>>,
    /// Records from returned batches, reused by the next records read.
    spare: Vec<KmsgRecord>,
}

/// The receiver is gone: the daemon is shutting down.
struct Closed;

impl Follow {
    /// Queues an event; hands the batch over when it is full.
    fn send(&mut self, ev: KmsgEvent) -> Result<(), Closed> {
        self.batch.push(ev);
        if self.batch.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands the queued events over: when the batch is full, and before every wait, so nothing
    /// read stays behind while the reader sleeps.
    fn flush(&mut self) -> Result<(), Closed> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = self.reuse().unwrap_or_else(|| Vec::with_capacity(BATCH));
        let full = std::mem::replace(&mut self.batch, next);
        self.tx.blocking_send(full).map_err(|_| Closed)
    }

    /// A batch the pipeline gave back, emptied; the records of every batch waiting there kept
    /// as spares. `None` when none is waiting (the reader never waits for one).
    fn reuse(&mut self) -> Option<Vec<KmsgEvent>> {
        let returned = self.returned.as_ref()?;
        let mut first: Option<Vec<KmsgEvent>> = None;
        while let Ok(mut back) = returned.try_recv() {
            for ev in back.drain(..) {
                if let KmsgEvent::Record { rec, .. } = ev {
                    if self.spare.len() < SPARE_RECORDS
                        && rec.message.capacity() <= SPARE_MESSAGE_CAPACITY
                    {
                        self.spare.push(rec);
                    }
                }
            }
            first.get_or_insert(back);
        }
        first
    }

    /// Handles one raw record: skip what was handled, report gaps, pass the rest on.
    fn record(&mut self, raw: &[u8]) -> Result<(), Closed> {
        let mut rec = self.spare.pop().unwrap_or_default();
        if let Err(e) = parse_record_into(raw, &mut rec) {
            self.spare.push(rec);
            return self.send(KmsgEvent::Malformed(e.to_string()));
        }
        match self.seq.judge(rec.seq) {
            Verdict::Handled => return Ok(()),
            Verdict::Next => {}
            Verdict::Gap { lost } => self.send(KmsgEvent::Overrun {
                lost,
                next_seq: rec.seq,
                at_startup: self.startup,
            })?,
            // The ring wrapped before xidwatch first ran in this boot: those records were never
            // ours to lose, so no overrun; said once, at info level.
            Verdict::First { not_seen } => {
                if not_seen > 0 {
                    tracing::info!(
                        "kernel log: first start in this boot; {not_seen} earlier records had \
                         already left the ring buffer and were not seen"
                    );
                }
            }
            // Before the resume point: read (and reported) before the restart.
            Verdict::Anomaly(a) if !a.delivered => {
                tracing::debug!("kernel log: {a}");
                return Ok(());
            }
            Verdict::Anomaly(a) => self.send(KmsgEvent::SequenceAnomaly {
                anomaly: a,
                at_startup: self.startup,
            })?,
        }
        let at_startup = self.startup;
        self.send(KmsgEvent::Record { rec, at_startup })
    }

    /// At the end of what there is to read for now: says "caught up" the first time, and hands
    /// everything queued over before the reader waits.
    fn caught_up(&mut self) -> Result<(), Closed> {
        if self.startup {
            self.startup = false;
            self.batch.push(KmsgEvent::CaughtUp);
        }
        self.flush()
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
        // 64 KiB reads: a backlog of records costs one system call per few hundred of them.
        let mut r = BufReader::with_capacity(64 * 1024, file);
        let mut line = CappedLine::new(MAX_FILE_RECORD);
        while !stop.load(Ordering::Relaxed) {
            // The usual case: a whole line in the read buffer, parsed where it lies rather than
            // copied out first.
            if line.kept.is_empty() {
                let buf = match r.fill_buf() {
                    Ok(b) => b,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if let Some(i) = memchr::memchr(b'\n', buf).filter(|&i| i < MAX_FILE_RECORD) {
                    let raw = &buf[..=i];
                    if !raw.starts_with(b" ") && raw.len() > 1 && self.record(raw).is_err() {
                        return Ok(());
                    }
                    r.consume(i + 1);
                    continue;
                }
            }
            if !line.read(&mut r)? {
                // At the end (perhaps mid-line): wait for the writer.
                if self.caught_up().is_err() {
                    return Ok(());
                }
                std::thread::sleep(FILE_POLL);
                continue;
            }
            if line.dropped > 0 {
                self.truncated += 1;
                if self.truncated <= 10 || self.truncated.is_power_of_two() {
                    tracing::warn!(
                        "kernel log file: a line of {} bytes was cut to its first {} \
                         (kernel records are under 8 KiB); {} lines cut so far",
                        line.kept.len() as u64 + line.dropped,
                        line.kept.len(),
                        self.truncated
                    );
                }
            }
            // Continuation ` KEY=VALUE` lines belong to the previous record; they carry no
            // message, so in file mode they are skipped.
            let raw = &line.kept;
            if !raw.starts_with(b" ") && raw.len() > 1 && self.record(raw).is_err() {
                return Ok(());
            }
            line.clear();
        }
        Ok(())
    }
}

/// One line of a regular file, at most `cap` bytes of it kept: memory stays bounded whatever the
/// file holds (a 400 MB line without a newline costs `cap`, not 400 MB).
#[derive(Debug)]
pub struct CappedLine {
    cap: usize,
    /// The start of the line, newline included when it fits.
    pub kept: Vec<u8>,
    /// Bytes of the line past the cap, skipped.
    pub dropped: u64,
}

impl CappedLine {
    pub fn new(cap: usize) -> CappedLine {
        CappedLine {
            cap,
            kept: Vec::with_capacity(1024),
            dropped: 0,
        }
    }

    /// Reads on until the end of the line (`true`) or of the data for now (`false`, the part
    /// read so far is kept for the next call).
    pub fn read(&mut self, r: &mut impl BufRead) -> io::Result<bool> {
        loop {
            let buf = match r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if buf.is_empty() {
                return Ok(false);
            }
            let (take, done) = match memchr::memchr(b'\n', buf) {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            let room = self.cap.saturating_sub(self.kept.len()).min(take);
            self.kept.extend_from_slice(&buf[..room]);
            self.dropped += (take - room) as u64;
            r.consume(take);
            if done {
                return Ok(true);
            }
        }
    }

    pub fn clear(&mut self) {
        self.kept.clear();
        self.dropped = 0;
        // A long line once must not keep its buffer for the rest of the run.
        self.kept.shrink_to(1024);
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

/// The finding for records the kernel overwrote before they were read.
pub fn overrun_finding(lost: u64, next_seq: u64) -> crate::model::Finding {
    let mut f = crate::classify::signals::finding(
        crate::model::FindingKind::KmsgOverrun,
        None,
        format!("kernel log overrun: {lost} records lost"),
    );
    f.message = format!("{lost} kernel log records were lost before record {next_seq}; faults in them may have been missed");
    f.detail = Some(crate::model::Detail::Overrun { lost });
    f.origin.seq = Some(next_seq);
    f
}

/// The finding for the first record out of sequence in a run.
pub fn sequence_finding(a: &SeqAnomaly) -> crate::model::Finding {
    let mut f = crate::classify::signals::finding(
        crate::model::FindingKind::KmsgSequence,
        None,
        format!("kernel log: {a}"),
    );
    f.message = format!(
        "{a}. The kernel numbers its records one by one, so the log being read is not what it \
         seems (a rewritten or concatenated file, or a bug); records after it are still read. \
         Later ones are counted in the daemon's log, not reported again."
    );
    f.origin.seq = Some(a.seq);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts for a stream, in order.
    fn judge_all(resume: Option<u64>, seqs: &[u64]) -> Vec<Verdict> {
        let mut s = Sequencer::new(resume);
        seqs.iter().map(|q| s.judge(*q)).collect()
    }

    fn delivered(resume: Option<u64>, seqs: &[u64]) -> Vec<u64> {
        let mut s = Sequencer::new(resume);
        seqs.iter()
            .copied()
            .filter(|q| match s.judge(*q) {
                Verdict::Handled => false,
                Verdict::Anomaly(a) => a.delivered,
                _ => true,
            })
            .collect()
    }

    #[test]
    fn in_order_gaps_and_the_first_start() {
        use Verdict::*;
        assert_eq!(
            judge_all(None, &[0, 1, 2, 5]),
            [First { not_seen: 0 }, Next, Next, Gap { lost: 2 }]
        );
        // The ring wrapped before the first start: not seen, not lost.
        assert_eq!(
            judge_all(None, &[500, 501]),
            [First { not_seen: 500 }, Next]
        );
        // Resuming: handled ones skipped, the gap past the resume point counted.
        assert_eq!(
            judge_all(Some(3), &[1, 2, 3, 4, 9]),
            [Handled, Handled, Handled, Next, Gap { lost: 4 }]
        );
        // The resume point left the ring while we were down.
        assert_eq!(judge_all(Some(3), &[7, 8]), [Gap { lost: 3 }, Next]);
    }

    #[test]
    fn a_sequence_far_ahead_is_reported_once_and_reading_goes_on() {
        let mut s = Sequencer::new(None);
        for q in 0..=10 {
            s.judge(q);
        }
        match s.judge(u64::MAX) {
            Verdict::Anomaly(a) => {
                assert_eq!(a.kind, SeqAnomalyKind::FarAhead);
                assert_eq!(
                    (a.seq, a.after, a.count, a.delivered),
                    (u64::MAX, Some(10), 1, true)
                );
            }
            v => panic!("{v:?}"),
        }
        for q in 11..=20 {
            assert_eq!(s.judge(q), Verdict::Next, "record {q}");
        }
    }

    #[test]
    fn a_gap_larger_than_the_ring_is_a_jump_not_lost_records() {
        use Verdict::*;
        // As large as the ring can have overwritten: lost.
        let s = 10 + MAX_LOST + 1;
        assert_eq!(
            judge_all(None, &[10, s, s + 1]),
            [First { not_seen: 10 }, Gap { lost: MAX_LOST }, Next]
        );
        // Two billion ahead: a jump from 10 to it, reported once, never lost; the stream after
        // it is followed.
        let far = 10 + 2_000_000_000;
        let v = judge_all(None, &[10, far, far + 1, far + 5]);
        match v[1] {
            Anomaly(a) => {
                assert_eq!(
                    (a.kind, a.seq, a.after),
                    (SeqAnomalyKind::FarAhead, far, Some(10))
                );
                let text = a.to_string();
                assert!(
                    text.contains(&format!("jump from 10 to {far}"))
                        && text.contains("not counted as lost"),
                    "{text}"
                );
            }
            v => panic!("{v:?}"),
        }
        assert_eq!(v[2..], [Next, Gap { lost: 3 }]);
        assert!(v
            .iter()
            .all(|v| !matches!(v, Gap { lost } if *lost > MAX_LOST)));
        // Just past the bound: a jump too.
        assert!(matches!(
            judge_all(None, &[10, 10 + MAX_LOST + 2])[1],
            Anomaly(a) if a.kind == SeqAnomalyKind::FarAhead
        ));
        // Across a restart: a far jump past the resume point is read and reported, not skipped
        // nor lost; a long uptime (a first record far past 0) is neither.
        let v = judge_all(Some(5), &[far, far + 1]);
        assert!(
            matches!(v[0], Anomaly(a) if a.delivered && a.after == Some(5)),
            "{v:?}"
        );
        assert_eq!(v[1], Next);
        assert_eq!(
            judge_all(None, &[far, far + 1]),
            [First { not_seen: far }, Next]
        );
    }

    #[test]
    fn going_backwards_is_reported_and_the_stream_followed() {
        let v = judge_all(None, &[0, 1, 2, 3, 1, 2, 3, 4]);
        let anomalies: Vec<_> = v
            .iter()
            .filter_map(|v| match v {
                Verdict::Anomaly(a) => Some(a.kind),
                _ => None,
            })
            .collect();
        // One report: the records after the step back continue from it.
        assert_eq!(anomalies, [SeqAnomalyKind::Backwards]);
        assert_eq!(v[5..], [Verdict::Next, Verdict::Next, Verdict::Next]);
        // A single stray record back: one report, then on as before.
        assert_eq!(delivered(None, &[0, 1, 2, 0, 3]), [0, 1, 2, 0, 3]);
        assert_eq!(judge_all(None, &[0, 1, 2, 0, 3])[4], Verdict::Next);
    }

    #[test]
    fn a_bad_saved_position_does_not_blind_the_restart() {
        let stream: Vec<u64> = (0..=10).chain([u64::MAX]).chain(11..=20).collect();
        // Saved at the bad record itself: everything after it is new.
        assert_eq!(
            delivered(Some(u64::MAX), &stream),
            (11..=20).collect::<Vec<_>>()
        );
        // Saved past it: the bad record before the resume point is not read again.
        assert_eq!(delivered(Some(15), &stream), (16..=20).collect::<Vec<_>>());
        // Saved before it: the bad record is read (and reported) with the rest.
        let mut want = vec![u64::MAX];
        want.extend(11..=20);
        assert_eq!(delivered(Some(10), &stream), want);
        // First start in a boot whose first record is the bad one.
        let v = judge_all(None, &[u64::MAX, 0, 1]);
        assert!(matches!(v[0], Verdict::Anomaly(a) if a.delivered && a.after.is_none()));
        assert_eq!(v[1], Verdict::First { not_seen: 0 });
    }

    /// Records read into the buffers of batches the pipeline gave back carry only their own text:
    /// a long message before a short one, an escape before none.
    #[test]
    fn records_reused_from_returned_batches_carry_only_their_own_text() {
        use std::io::Write;
        let n = 4 * BATCH as u64 + 3;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let mut expected = Vec::new();
        for seq in 0..n {
            let line = match seq % 4 {
                0 => format!(
                    "6,{seq},{},-;a long message {}",
                    1000 + seq,
                    "x".repeat(300)
                ),
                1 => format!("6,{seq},{},-;short {seq}", 1000 + seq),
                2 => format!("4,{seq},{},-;tab\\x09here {seq}", 1000 + seq),
                _ => format!("6,{seq},{},-;s", 1000 + seq),
            };
            writeln!(f, "{line}").unwrap();
            expected.push(super::super::record::parse_record(line.as_bytes()).unwrap());
        }
        f.flush().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHANNEL_BATCHES);
        let (back, returned) = returns();
        let stop = Arc::new(AtomicBool::new(false));
        let file = File::open(f.path()).unwrap();
        let t = spawn(
            f.path().to_path_buf(),
            file,
            None,
            tx,
            Some(returned),
            stop.clone(),
        )
        .unwrap();
        let mut got = Vec::new();
        'outer: while let Some(batch) = rx.blocking_recv() {
            let mut done = false;
            for ev in &batch {
                match ev {
                    KmsgEvent::Record { rec, .. } => got.push(rec.clone()),
                    KmsgEvent::CaughtUp => done = true,
                    other => panic!("{other:?}"),
                }
            }
            // Handed back as the daemon does, so that later records reuse these.
            let _ = back.try_send(batch);
            if done {
                break 'outer;
            }
        }
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(&expected) {
            assert_eq!(g, e, "record {}", e.seq);
        }
        stop.store(true, Ordering::Relaxed);
        drop(rx);
        t.join().unwrap();
    }

    /// A backlog reaches the pipeline in batches of at most [`BATCH`], every record once and in
    /// order, "caught up" right after the last one.
    #[test]
    fn a_backlog_arrives_in_order_in_bounded_batches() {
        use std::io::Write;
        let n = 3 * BATCH as u64 + 17;
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for seq in 0..n {
            writeln!(f, "6,{seq},{},-;line {seq}", 1000 + seq).unwrap();
        }
        f.flush().unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::channel(CHANNEL_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let file = File::open(f.path()).unwrap();
        let t = spawn(f.path().to_path_buf(), file, None, tx, None, stop.clone()).unwrap();
        let mut seqs = Vec::new();
        let mut batches = 0;
        'outer: while let Some(batch) = rx.blocking_recv() {
            assert!(!batch.is_empty() && batch.len() <= BATCH, "{}", batch.len());
            batches += 1;
            for ev in batch {
                match ev {
                    KmsgEvent::Record { rec, at_startup } => {
                        assert!(at_startup);
                        seqs.push(rec.seq);
                    }
                    KmsgEvent::CaughtUp => break 'outer,
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(seqs, (0..n).collect::<Vec<_>>());
        assert!(batches >= 4, "{batches} batches");
        stop.store(true, Ordering::Relaxed);
        drop(rx);
        t.join().unwrap();
    }

    #[test]
    fn capped_lines_keep_the_start_and_count_the_rest() {
        let data = [vec![b'a'; 100], b"\nshort\n".to_vec(), vec![b'b'; 50]].concat();
        let mut r = std::io::BufReader::with_capacity(16, &data[..]);
        let mut l = CappedLine::new(10);
        assert!(l.read(&mut r).unwrap());
        assert_eq!((l.kept.len(), l.dropped), (10, 91));
        l.clear();
        assert!(l.read(&mut r).unwrap());
        assert_eq!((&l.kept[..], l.dropped), (&b"short\n"[..], 0));
        l.clear();
        // The end of the data mid-line: what was read is kept, bounded, for the next call.
        assert!(!l.read(&mut r).unwrap());
        assert_eq!((l.kept.len(), l.dropped), (10, 40));
    }
}
