//! Saved logs (`xidwatch scan`): files, gzip archives, standard input.
//!
//! Scanning is a hot path: bug-report archives are hundreds of MB and almost every line is
//! ordinary kernel chatter. So the reader never looks at a line on its own unless a literal
//! prefilter (a 64-byte-step vector search where the CPU has AVX2, Teddy or Aho-Corasick
//! elsewhere, over the whole buffer, the technique grep tools use) says it may be
//! ours; line numbers come from the newlines the wide search counts as it steps, or elsewhere
//! from a SIMD count between candidates made after the search (see [`LineCounter`]). Regular
//! files are read through a memory map that survives truncation ([`super::mapped`]), FIFOs,
//! standard input and gzip archives with `read(2)`.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::classify::saved;
use crate::classify::wide::Counted;

pub use crate::classify::prefilter::{candidate_literals, Prefilter};

/// Window size: the reads' size, and the stretch of a mapped file searched at a time. Small
/// enough (where the search does not count lines itself) that a window is still in the core's L2
/// cache when the newline count reaches it after
/// the search (and, for reads, when the search reaches it after the kernel's copy): with 2 MiB
/// reads the scan of an ordinary log was an eighth slower than with 256 KiB ones. Large enough
/// that per-window overhead vanishes.
///
/// Regular files are mapped ([`scan_path`]), everything else read. Measured on bench/scan.sh's
/// ordinary log (352 MB, page cache warm, one core, best of five): reads cost 77 ms of copying
/// before any search, which the map saves; its page faults cost about as much of the kernel's
/// time as ripgrep's own map does. `MADV_POPULATE_READ` per window, `MADV_SEQUENTIAL` and
/// `MAP_POPULATE` saved nothing; nor did prefetching the next window's cache lines while the
/// current one is searched (the search alone over the mapped ordinary log, the map's faults
/// included, best of seven in three runs: 73-90 ms plain, 75-88 ms with the next 256 KiB
/// prefetched).
const CHUNK: usize = 256 << 10;
/// Longest line classified in full; a longer one has its first `MAX_LINE` bytes classified and
/// the rest skipped, with a note.
pub const MAX_LINE: usize = 1 << 20;

/// Binary input is sniffed in its first bytes (as grep tools do) and in every candidate line, not
/// in every byte: a full pass just for NUL bytes would cost a fifth of the scan.
const BINARY_SNIFF: usize = 64 * 1024;

/// Something the reader wants the user to know about the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// 1-based line number, when the note is about one line.
    pub line: Option<u64>,
    pub text: String,
}

/// Figures about one scanned input.
#[derive(Debug, Default)]
pub struct ScanStats {
    pub bytes: u64,
    pub lines: u64,
    /// Lines the prefilter passed on.
    pub candidates: u64,
    pub notes: Vec<Note>,
    /// A read error that ended the input early (a truncated gzip, an I/O error). What was read
    /// before it has been processed.
    pub error: Option<io::Error>,
}

/// Opens a file (or `-` for standard input) to be read, transparently decompressing gzip.
///
/// The input is opened exactly once: a FIFO or standard input cannot be opened or read a second
/// time (a second open of a FIFO waits for a writer that has already gone). Reads go straight
/// into the scanner's buffer in 256 KiB pieces; the gzip sniff is the only buffered read.
pub fn open(path: &Path) -> io::Result<Box<dyn Read>> {
    if path == Path::new("-") {
        reader(Box::new(io::stdin().lock()))
    } else {
        reader(Box::new(File::open(path)?))
    }
}

/// `raw`, decompressed when it starts like gzip.
fn reader(raw: Box<dyn Read>) -> io::Result<Box<dyn Read>> {
    let mut r = BufReader::with_capacity(CHUNK, raw);
    let magic = {
        use std::io::BufRead;
        let buf = loop {
            match r.fill_buf() {
                Ok(b) => break b,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        buf.len() >= 2 && buf[0] == 0x1f && buf[1] == 0x8b
    };
    if magic {
        Ok(Box::new(flate2::read::MultiGzDecoder::new(r)))
    } else {
        Ok(Box::new(r))
    }
}

/// Files smaller than this are read, not mapped: the map's set-up would cost more than the copy.
pub const MAP_MIN: u64 = 1 << 20;

/// Scans the file at `path` (or `-` for standard input) as [`scan_lines`] does: a regular,
/// uncompressed file of at least [`MAP_MIN`] bytes through a memory map ([`super::mapped`]),
/// anything else with `read(2)`. The file is opened once either way (a FIFO cannot be opened
/// twice). Fails only when the file cannot be opened.
pub fn scan_path(
    path: &Path,
    pre: &Prefilter,
    on_line: impl FnMut(u64, &[u8]),
) -> io::Result<ScanStats> {
    if path == Path::new("-") {
        return Ok(scan_lines(open(path)?, pre, on_line));
    }
    let file = File::open(path)?;
    let len = match file.metadata() {
        Ok(m) if m.is_file() && m.len() >= MAP_MIN => usize::try_from(m.len()).ok(),
        _ => None,
    };
    let gzip = || {
        use std::os::unix::fs::FileExt;
        let mut magic = [0u8; 2];
        matches!(file.read_at(&mut magic, 0), Ok(2) if magic == [0x1f, 0x8b])
    };
    if let Some(len) = len.filter(|_| !gzip()) {
        if let Ok(map) = super::mapped::Mapped::new(&file, len) {
            return Ok(scan_mapped(&map, pre, on_line));
        }
    }
    Ok(scan_lines(reader(Box::new(file))?, pre, on_line))
}

/// Serialises the tests that map files: one map at a time per process.
#[cfg(test)]
pub(crate) static MAP_TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`scan_lines`] over a mapped file: the same windows, lines, numbers and notes, without the
/// copy. Stops with a note when the file shrank under the map.
fn scan_mapped(
    map: &super::mapped::Mapped,
    pre: &Prefilter,
    mut on_line: impl FnMut(u64, &[u8]),
) -> ScanStats {
    let data = map.bytes();
    let mut st = ScanStats::default();
    let mut base_line: u64 = 0;
    let mut wrapped_carry = false;
    if let Some(i) = memchr::memchr(0, &data[..data.len().min(BINARY_SNIFF)]) {
        st.notes
            .push(binary_note(bytecount::count(&data[..i], b'\n') as u64 + 1));
    }
    let mut pos = 0;
    while pos < data.len() {
        let n = match cut(&data[pos..], true) {
            Cut::Lines(n) => n,
            // Not at the end's side: the map holds the whole rest of the file.
            Cut::More => data.len() - pos,
            Cut::Long => {
                long_line_head(
                    &data[pos..pos + MAX_LINE],
                    base_line + 1,
                    pre,
                    &mut st,
                    &mut on_line,
                );
                wrapped_carry = false;
                // Its newline (kept) is the first byte of the next region, where it counts.
                match memchr::memchr(b'\n', &data[pos + MAX_LINE..]) {
                    Some(i) => pos += MAX_LINE + i,
                    None => {
                        pos = data.len();
                        base_line += 1;
                    }
                }
                continue;
            }
        };
        base_line += scan_region(
            &data[pos..pos + n],
            base_line,
            pre,
            &mut st,
            &mut on_line,
            &mut wrapped_carry,
        );
        pos += n;
        if map.shrunk() {
            st.notes.push(Note {
                line: None,
                text: "the file shrank while it was read: the lines past its new end were not read"
                    .into(),
            });
            break;
        }
    }
    st.bytes = pos as u64;
    st.lines = base_line;
    st
}

/// Reads `r` to the end, calling `on_line(line_number, bytes)` for every candidate line (without
/// its newline or trailing `\r`). Never fails: a read error ends the input and is reported in
/// [`ScanStats::error`].
pub fn scan_lines<R: Read>(
    mut r: R,
    pre: &Prefilter,
    mut on_line: impl FnMut(u64, &[u8]),
) -> ScanStats {
    let mut st = ScanStats::default();
    // One fixed buffer, initialised once: reads land after the carried-over partial line, so no
    // per-read zeroing and no reallocation on the hot path.
    let mut buf: Vec<u8> = vec![0; CHUNK + MAX_LINE];
    let mut filled = 0usize;
    // Newlines before buf[0].
    let mut base_line: u64 = 0;
    let mut skipping_long_line = false;
    // Whether the last line of the previous region was offered (see `scan_region`).
    let mut wrapped_carry = false;
    let mut saw_nul = false;
    let mut eof = false;
    while !eof {
        let old = filled;
        // At most CHUNK per read. The carried-over part is at most MAX_LINE bytes, so the slice is
        // never empty (an empty read would look like the end of the input).
        let lim = (old + CHUNK).min(buf.len());
        let n = loop {
            match r.read(&mut buf[old..lim]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    st.error = Some(e);
                    break 0;
                }
            }
        };
        filled = old + n;
        // Sniff the first BINARY_SNIFF bytes of the input, however the reads fall.
        let sniff = (BINARY_SNIFF as u64).saturating_sub(st.bytes) as usize;
        st.bytes += n as u64;
        if n == 0 {
            eof = true;
        }
        if !saw_nul && sniff > 0 {
            if let Some(i) = memchr::memchr(0, &buf[old..filled.min(old + sniff)]) {
                saw_nul = true;
                st.notes.push(binary_note(
                    base_line + bytecount::count(&buf[..old + i], b'\n') as u64 + 1,
                ));
            }
        }
        let mut start = 0;
        if skipping_long_line {
            match memchr::memchr(b'\n', &buf[..filled]) {
                // Keep the newline: it ends the long line and is counted below.
                Some(i) => {
                    start = i;
                    skipping_long_line = false;
                }
                None => {
                    filled = 0;
                    if eof {
                        // The long line ran to the end of the input: a line still.
                        base_line += 1;
                    }
                    continue;
                }
            }
        }
        // Whole lines only; the tail waits for the next read (or the end).
        loop {
            match cut(&buf[start..filled], eof) {
                Cut::Lines(0) | Cut::More => break,
                Cut::Lines(n) => {
                    base_line += scan_region(
                        &buf[start..start + n],
                        base_line,
                        pre,
                        &mut st,
                        &mut on_line,
                        &mut wrapped_carry,
                    );
                    start += n;
                }
                Cut::Long => {
                    let head = &buf[start..start + MAX_LINE];
                    long_line_head(head, base_line + 1, pre, &mut st, &mut on_line);
                    wrapped_carry = false;
                    // Its newline (kept) is the first byte of the next region, where it counts.
                    match memchr::memchr(b'\n', &buf[start + MAX_LINE..filled]) {
                        Some(i) => start += MAX_LINE + i,
                        None if eof => {
                            start = filled;
                            base_line += 1;
                        }
                        None => {
                            start = filled;
                            skipping_long_line = true;
                        }
                    }
                }
            }
        }
        buf.copy_within(start..filled, 0);
        filled -= start;
    }
    st.lines = base_line;
    st
}

/// Where the next region of `bytes` (which start at a line's start) ends, so that regions hold
/// whole lines only. One rule for the map and the reads, so both cut a file the same way.
enum Cut {
    /// The region is `..n`: up to the last newline within a window ([`CHUNK`]), or the end of a
    /// longer line, or (at the end) everything left.
    Lines(usize),
    /// The first line is longer than [`MAX_LINE`]: its head is classified, the rest skipped.
    Long,
    /// No whole line yet: read more.
    More,
}

/// `at_end`: `bytes` run to the end of the input.
fn cut(bytes: &[u8], at_end: bool) -> Cut {
    let lim = bytes.len().min(CHUNK);
    if at_end && lim == bytes.len() {
        return Cut::Lines(lim);
    }
    if let Some(i) = memchr::memrchr(b'\n', &bytes[..lim]) {
        return Cut::Lines(i + 1);
    }
    // A line of exactly MAX_LINE bytes has its newline at MAX_LINE: whole, not long.
    let cap = bytes.len().min(MAX_LINE + 1);
    match memchr::memchr(b'\n', &bytes[lim..cap]) {
        Some(i) => Cut::Lines(lim + i + 1),
        None if at_end && cap == bytes.len() => Cut::Lines(cap),
        None if cap > MAX_LINE => Cut::Long,
        None => Cut::More,
    }
}

/// Notes a line longer than [`MAX_LINE`] and offers its head when it is a candidate.
fn long_line_head(
    head: &[u8],
    line: u64,
    pre: &Prefilter,
    st: &mut ScanStats,
    on_line: &mut impl FnMut(u64, &[u8]),
) {
    st.notes.push(long_line_note(line));
    if pre.is_candidate(head) {
        st.candidates += 1;
        on_line(line, trim_cr(head));
    }
}

fn binary_note(line: u64) -> Note {
    Note {
        line: Some(line),
        text: "binary data (NUL bytes) in the input from about here; lines may be garbled".into(),
    }
}

fn long_line_note(line: u64) -> Note {
    Note {
        line: Some(line),
        text: format!(
            "line longer than {} KiB: its first {} KiB were classified, the rest skipped",
            MAX_LINE / 1024,
            MAX_LINE / 1024
        ),
    }
}

/// Newlines in a region up to an offset, counted from the last offset asked about.
///
/// Why lazily, after the search: candidates come in order, so every byte of the region is counted
/// once, in the stretch between two candidates, right after the literal search has brought that
/// stretch into the cache. Measured on bench/scan.sh's ordinary log (352 MB, page cache warm, one
/// core, best of seven), counting each window before its search (to fault a mapped window's
/// pages in for the search) cost 94-97 ms, counting after it 85-89 ms: the search streams from
/// memory as fast as the count does, and the count then reads the cache. Where the first stage is
/// the wide search, it counts the newlines of every step it takes in the same pass
/// ([`crate::classify::wide`]), and what is left to count is the stretch between its last step
/// and the line asked about, forwards or back (a line that began in the step before).
struct LineCounter {
    /// Newlines up to the last offset asked about or searched to.
    last: std::cell::Cell<Counted>,
}

impl LineCounter {
    fn new() -> Self {
        LineCounter {
            last: std::cell::Cell::new(Counted::default()),
        }
    }

    /// Newlines in `region[..at]`.
    fn newlines_before(&self, region: &[u8], at: usize) -> u64 {
        let mut c = self.last.get();
        let n = c.advance(region, at);
        self.last.set(c);
        n
    }

    /// The next candidate at or after `from` ([`Prefilter::find_counted`]), the count kept.
    fn find(&self, pre: &Prefilter, region: &[u8], from: usize) -> Option<usize> {
        let mut c = self.last.get();
        let found = pre.find_counted(region, from, &mut c);
        self.last.set(c);
        found
    }
}

/// Scans complete lines in `region`; returns how many lines it holds. `carry` says whether the
/// last line before the region was offered (its indented followers here are offered too), and
/// is set to whether the region's last line was.
fn scan_region(
    region: &[u8],
    base_line: u64,
    pre: &Prefilter,
    st: &mut ScanStats,
    on_line: &mut impl FnMut(u64, &[u8]),
    carry: &mut bool,
) -> u64 {
    let counter = LineCounter::new();
    let line_at = |at: usize| base_line + counter.newlines_before(region, at) + 1;
    let mut pos = 0;
    // The end of the last line offered, for the carry.
    let mut offered_end = None;
    if *carry && saved::continues(region) {
        let ne = memchr::memchr(b'\n', region).unwrap_or(region.len());
        on_line(base_line + 1, trim_cr(&region[..ne.min(MAX_LINE)]));
        pos = offer_wrapped(region, ne, &line_at, on_line);
        offered_end = Some(pos);
    }
    while pos < region.len() {
        let Some(m_start) = counter.find(pre, region, pos) else {
            break;
        };
        let ls = memchr::memrchr(b'\n', &region[pos..m_start]).map_or(pos, |i| pos + i + 1);
        let le = memchr::memchr(b'\n', &region[m_start..]).map_or(region.len(), |i| m_start + i);
        st.candidates += 1;
        offer_heads(region, ls, offered_end, &line_at, on_line);
        let line = line_at(ls);
        if memchr::memchr(0, &region[ls..le]).is_some()
            && !st.notes.iter().any(|n| n.text.starts_with("binary"))
        {
            st.notes.push(binary_note(line));
        }
        if le - ls > MAX_LINE {
            st.notes.push(long_line_note(line));
            on_line(line, &region[ls..ls + MAX_LINE]);
        } else {
            on_line(line, trim_cr(&region[ls..le]));
        }
        pos = offer_wrapped(region, le, &line_at, on_line);
        offered_end = Some(pos);
    }
    *carry = offered_end.is_some_and(|e| e + 1 >= region.len());
    // A last line without a newline (at EOF) is a line too.
    let partial = !region.is_empty() && region[region.len() - 1] != b'\n';
    let lines = counter.newlines_before(region, region.len()) + u64::from(partial);
    #[cfg(test)]
    COUNT_WORK.with(|w| w.set(w.get() + counter.last.get().work));
    lines
}

#[cfg(test)]
thread_local! {
    /// Bytes the line counts of this thread's scans have read ([`Counted::work`]).
    static COUNT_WORK: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Offers the head lines ([`saved::HEADS`]) right above the candidate line that starts at `ls`,
/// up to [`saved::MAX_HEADS`] of them and none already offered (`offered_end`: where the last
/// offered line ends), in order, as [`saved::offered_lines`] does. A line above is looked at only
/// when it ends with a byte of [`saved::HEAD_ENDS`], as every head does: a byte or two per
/// candidate line otherwise.
fn offer_heads(
    region: &[u8],
    ls: usize,
    offered_end: Option<usize>,
    line_at: &impl Fn(usize) -> u64,
    on_line: &mut impl FnMut(u64, &[u8]),
) {
    let floor = offered_end.map_or(0, |e| e + 1);
    let mut starts = [0usize; saved::MAX_HEADS];
    let mut n = 0;
    let mut end = ls;
    while n < saved::MAX_HEADS && end > floor {
        // `end` is the start of the line below; its newline ends this one.
        let nl = end - 1;
        let text_end = if nl > 0 && region[nl - 1] == b'\r' {
            nl - 1
        } else {
            nl
        };
        if text_end == 0 || text_end <= floor || !saved::HEAD_ENDS.contains(&region[text_end - 1]) {
            break;
        }
        let start = memchr::memrchr(b'\n', &region[floor..nl]).map_or(floor, |i| floor + i + 1);
        if nl - start > MAX_LINE || !saved::is_head(&region[start..nl]) {
            break;
        }
        starts[n] = start;
        n += 1;
        end = start;
    }
    for &s in starts[..n].iter().rev() {
        let e = memchr::memchr(b'\n', &region[s..]).map_or(region.len(), |i| s + i);
        on_line(line_at(s), trim_cr(&region[s..e]));
    }
}

/// How many indented lines below an offered line are offered with it.
const MAX_WRAPPED: usize = 8;

/// Offers the indented lines right below the offered line that ends at `end` (its newline, or
/// the region's end): a paste that wraps a driver message under its head goes on there, as
/// `classify::saved::offered` says; the reader decides whether they continue it. Returns where
/// the last line offered ends; `line_at` numbers the line that starts at an offset.
fn offer_wrapped(
    region: &[u8],
    mut end: usize,
    line_at: &impl Fn(usize) -> u64,
    on_line: &mut impl FnMut(u64, &[u8]),
) -> usize {
    for _ in 0..MAX_WRAPPED {
        let ns = end + 1;
        if ns >= region.len() || !saved::continues(&region[ns..]) {
            break;
        }
        let ne = memchr::memchr(b'\n', &region[ns..]).map_or(region.len(), |i| ns + i);
        on_line(line_at(ns), trim_cr(&region[ns..ne.min(ns + MAX_LINE)]));
        end = ne;
    }
    end
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The region search offers the head lines above a candidate line as the one reader's
    /// scorer does (`saved::offered_lines`): the same lines, numbered alike, whatever the line
    /// endings; a head already offered, or above a line that is not offered, is not offered again.
    #[test]
    fn heads_above_a_candidate_are_offered_once_and_in_order() {
        let pre = Prefilter::shared();
        let lines = [
            "pacman: (3/6) Install DKMS modules",
            "'make' -j8 KERNEL_UNAME=6.4.1-zen1-1-zen modules.......(bad exit status: 2)",
            "Error! Bad return status for module build on kernel: 6.4.1-zen1-1-zen (x86_64)",
            "Consult /var/lib/dkms/nvidia/390.157/build/make.log for more information.",
            "Error! Bad return status for module build on kernel: 6.4.1-zen1-1-zen (x86_64)",
            "Consult /var/lib/dkms/zfs/2.2.0/build/make.log for more information.",
            "(bad exit status: 2)",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  390.157",
        ];
        let bytes: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
        let want: Vec<u64> = saved::offered_lines(pre, &bytes)
            .iter()
            .enumerate()
            .filter(|(_, o)| **o)
            .map(|(i, _)| i as u64 + 1)
            .collect();
        assert_eq!(want, [2, 3, 4, 7, 8]);
        for eol in ["\n", "\r\n"] {
            let text = lines.join(eol) + eol;
            let mut got = Vec::new();
            scan_lines(text.as_bytes(), pre, |n, l| got.push((n, l.to_vec())));
            let nums: Vec<u64> = got.iter().map(|g| g.0).collect();
            assert_eq!(nums, want, "{eol:?}");
            assert_eq!(got[1].1, lines[2].as_bytes());
        }
    }

    /// Numbering the lines of a storm (a candidate every other line, lines that start in one
    /// search step and are asked about after it) reads each byte about once, and every number is
    /// right: a count that started again from the window's start at every line read the window
    /// once per line.
    #[test]
    fn numbering_a_storms_lines_reads_each_byte_about_once() {
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str("[ 1.000000] eth0: link becomes ready on the bridge port\n");
            text.push_str(&format!(
                "[ 1.000001] NVRM: Xid (PCI:0000:17:00): 13, pid={i}, name=python3, Graphics Exception\n"
            ));
        }
        let packed = Prefilter::packed_with_literals(candidate_literals());
        for pre in [&Prefilter::new(), &packed] {
            COUNT_WORK.with(|w| w.set(0));
            let mut got = Vec::new();
            let st = scan_lines(text.as_bytes(), pre, |n, _| got.push(n));
            let work = COUNT_WORK.with(|w| w.get());
            assert_eq!(st.lines, 40_000);
            assert_eq!(got, (1..=20_000).map(|i| 2 * i).collect::<Vec<u64>>());
            assert!(
                work <= 2 * text.len() as u64,
                "the line counts read {work} bytes of {} (wide: {})",
                text.len(),
                pre.is_wide()
            );
        }
    }

    /// The wide first stage and the packed one offer the same lines with the same numbers and
    /// figures, over the ordinary sample with every literal planted in it, CRLF endings, indented
    /// continuations and windows' edges (here the reads' 256 KiB) between them.
    #[test]
    fn the_wide_and_the_packed_search_offer_the_same_lines() {
        let mut text = String::new();
        let ordinary: Vec<&str> = crate::classify::prefilter::ordinary_lines().collect();
        let mut i = 0;
        while text.len() < 3 * CHUNK {
            for l in candidate_literals() {
                text.push_str(ordinary[i % ordinary.len()]);
                text.push_str(if i % 3 == 0 { "\r\n" } else { "\n" });
                text.push_str(&format!("[ {i}.000000] x {l} tail\n"));
                if i % 5 == 0 {
                    text.push_str("    indented continuation\n");
                }
                i += 1;
            }
        }
        let run = |pre: &Prefilter| {
            let mut got = Vec::new();
            let st = scan_lines(text.as_bytes(), pre, |n, l| got.push((n, l.to_vec())));
            (got, st.lines, st.candidates, st.bytes)
        };
        let packed = Prefilter::packed_with_literals(candidate_literals());
        assert!(!packed.is_wide());
        let (a, b) = (run(&Prefilter::new()), run(&packed));
        assert!(a.0.len() > 1000);
        assert_eq!(a, b);
    }

    /// The prefilter's speed rests on literals the SIMD search rarely matches by accident: at
    /// least 4 bytes, not starting with a space (padding is everywhere in a kernel log).
    #[test]
    fn candidate_literals_are_cheap_to_search() {
        for l in candidate_literals() {
            assert!(l.len() >= 4, "{l:?} is shorter than 4 bytes");
            assert!(
                !l.starts_with(char::is_whitespace),
                "{l:?} starts with a space"
            );
        }
    }

    fn collect(input: &[u8]) -> (Vec<(u64, String)>, ScanStats) {
        let mut out = Vec::new();
        let st = scan_lines(input, &Prefilter::new(), |n, l| {
            out.push((n, String::from_utf8_lossy(l).into_owned()))
        });
        let mapped = collect_mapped(input, |_| ());
        assert_eq!(mapped.0, out, "the map and the reads offer the same lines");
        assert_eq!(
            (mapped.1.lines, mapped.1.candidates, mapped.1.bytes),
            (st.lines, st.candidates, st.bytes)
        );
        assert_eq!(mapped.1.notes, st.notes);
        (out, st)
    }

    /// Maps `input` (written to a file) and scans the map; `meanwhile` runs between the map and
    /// the scan, with the file.
    fn collect_mapped(
        input: &[u8],
        meanwhile: impl FnOnce(&File),
    ) -> (Vec<(u64, String)>, ScanStats) {
        use std::io::Write;
        let _one = MAP_TEST_LOCK.lock();
        let mut f = tempfile::NamedTempFile::new().expect("temp");
        f.write_all(input).expect("write");
        let mut out = Vec::new();
        if input.is_empty() {
            let st = scan_path(f.path(), &Prefilter::new(), |n, l| {
                out.push((n, String::from_utf8_lossy(l).into_owned()))
            })
            .expect("scan");
            return (out, st);
        }
        let file = File::open(f.path()).expect("open");
        // Another test of this process may hold the one map for a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let map = loop {
            match super::super::mapped::Mapped::new(&file, input.len()) {
                Ok(m) => break m,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e) => panic!("map: {e}"),
            }
        };
        meanwhile(f.as_file());
        let st = scan_mapped(&map, &Prefilter::new(), |n, l| {
            out.push((n, String::from_utf8_lossy(l).into_owned()))
        });
        (out, st)
    }

    /// A file someone truncates while it is mapped: the scan reads what is left, says the file
    /// shrank, and the process lives (without the SIGBUS handler it dies here).
    #[test]
    fn a_file_truncated_under_the_map_ends_the_scan_with_a_note() {
        let mut input = Vec::new();
        for n in 1..=40_000u64 {
            if n % 1000 == 0 {
                input.extend_from_slice(format!("NVRM: Xid line {n}\n").as_bytes());
            } else {
                input.extend_from_slice(&[b'x'; 99]);
                input.push(b'\n');
            }
        }
        let keep = 1_000_000u64;
        let (lines, st) = collect_mapped(&input, |f| f.set_len(keep).expect("truncate"));
        assert!(
            st.notes.iter().any(|n| n.text.contains("shrank")),
            "{:?}",
            st.notes
        );
        // Every line wholly before the new end was read, with its number; none after the map
        // went to zeros.
        let before: Vec<u64> = (1..=40_000u64)
            .filter(|n| n % 1000 == 0 && n * 100 <= keep)
            .collect();
        let got: Vec<u64> = lines.iter().map(|(n, _)| *n).collect();
        assert_eq!(&got[..before.len()], &before[..], "{got:?}");
        assert!(lines
            .iter()
            .all(|(n, l)| *l == format!("NVRM: Xid line {n}")));
        assert!(st.bytes < input.len() as u64);
    }

    /// A regular file of at least MAP_MIN bytes is mapped, anything else read: both give the same
    /// result, and a FIFO (which cannot be mapped, nor opened twice) is read.
    #[test]
    fn scan_path_maps_large_files_and_reads_fifos() {
        use std::io::Write;
        let mut input = Vec::new();
        while (input.len() as u64) < 2 * MAP_MIN {
            input.extend_from_slice(b"[  1.0] ordinary line\n[  1.1] NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n");
        }
        let (lines, st) = collect(&input);
        assert_eq!(st.candidates as usize, lines.len());
        let dir = tempfile::tempdir().expect("dir");
        let fifo = dir.path().join("log.fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let writer = {
            let fifo = fifo.clone();
            let input = input.clone();
            std::thread::spawn(move || {
                let mut w = File::options().write(true).open(fifo).expect("open fifo");
                w.write_all(&input).expect("write fifo");
            })
        };
        let mut got = Vec::new();
        let st2 = scan_path(&fifo, &Prefilter::new(), |n, l| {
            got.push((n, String::from_utf8_lossy(l).into_owned()))
        })
        .expect("scan fifo");
        writer.join().expect("writer");
        assert_eq!(got, lines);
        assert_eq!(st2.lines, st.lines);
    }

    #[test]
    fn finds_candidates_with_exact_line_numbers() {
        let (lines, st) = collect(b"a\nb NVRM: x\r\nc\n\nd nvidia: y\nlast SXid");
        assert_eq!(
            lines,
            vec![
                (2, "b NVRM: x".into()),
                (5, "d nvidia: y".into()),
                (6, "last SXid".into())
            ]
        );
        assert_eq!(st.lines, 6);
        assert_eq!(st.candidates, 3);
    }

    #[test]
    fn indented_lines_below_an_offered_one_are_offered_with_exact_numbers() {
        let (lines, st) = collect(
            b"a\nb NVRM: x\n   wrapped\n\tand more\nc\n  not below one\nd nvidia: y\n  last",
        );
        assert_eq!(
            lines,
            vec![
                (2, "b NVRM: x".into()),
                (3, "   wrapped".into()),
                (4, "\tand more".into()),
                (7, "d nvidia: y".into()),
                (8, "  last".into())
            ]
        );
        assert_eq!(st.lines, 8);
        assert_eq!(st.candidates, 2);
    }

    #[test]
    fn line_numbers_survive_chunk_boundaries() {
        let mut input = Vec::new();
        let filler = "x".repeat(99) + "\n";
        for i in 0..30_000u32 {
            if i % 1000 == 7 {
                input.extend_from_slice(format!("NVRM: line {}\n", i + 1).as_bytes());
            } else {
                input.extend_from_slice(filler.as_bytes());
            }
        }
        let (lines, st) = collect(&input);
        assert_eq!(st.lines, 30_000);
        assert_eq!(lines.len(), 30);
        for (n, l) in lines {
            assert_eq!(l, format!("NVRM: line {n}"));
        }
    }

    #[test]
    fn line_numbers_stay_exact_across_many_reads() {
        // Several read sizes' worth of lines of varying length, candidates at known lines.
        let mut input = Vec::new();
        let mut want = Vec::new();
        for n in 1..=60_000u64 {
            if n % 997 == 0 {
                input.extend_from_slice(format!("[{n}] NVRM: Xid line {n}\n").as_bytes());
                want.push(n);
            } else {
                input.extend(std::iter::repeat_n(b'x', (n % 113) as usize));
                input.push(b'\n');
            }
        }
        assert!(input.len() > 8 * CHUNK);
        let (lines, st) = collect(&input);
        assert_eq!(lines.iter().map(|(n, _)| *n).collect::<Vec<_>>(), want);
        assert!(lines.iter().all(|(n, l)| l.ends_with(&format!("line {n}"))));
        assert_eq!(st.lines, 60_000);
    }

    #[test]
    fn long_lines_are_cut_with_a_note() {
        let mut input = b"NVRM: ".to_vec();
        input.extend(std::iter::repeat_n(b'y', 3 * MAX_LINE));
        input.extend_from_slice(b"\nNVRM: after\n");
        let (lines, st) = collect(&input);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].1.len(), MAX_LINE);
        assert_eq!(lines[1], (2, "NVRM: after".into()));
        assert_eq!(st.notes.len(), 1);
        assert_eq!(st.lines, 2);
    }

    /// The reads and the map cut a file by one rule (`cut`): a line of exactly MAX_LINE bytes is
    /// whole, a longer one is noted whether or not it is a candidate, and a long last line
    /// without a newline still counts as a line. `collect` fails when the two paths differ.
    #[test]
    fn long_lines_are_cut_alike_by_the_reads_and_the_map() {
        let exact = [vec![b'z'; MAX_LINE], b"\nNVRM: next\n".to_vec()].concat();
        let (lines, st) = collect(&exact);
        assert_eq!(lines, vec![(2, "NVRM: next".into())]);
        assert!(st.notes.is_empty(), "{:?}", st.notes);
        assert_eq!(st.lines, 2);

        let ordinary_long = [
            b"a\n".to_vec(),
            vec![b'z'; MAX_LINE + 10],
            b"\nNVRM: x\n".to_vec(),
        ]
        .concat();
        let (lines, st) = collect(&ordinary_long);
        assert_eq!(lines, vec![(3, "NVRM: x".into())]);
        assert_eq!(st.notes.len(), 1);
        assert_eq!(st.notes[0].line, Some(2));

        let long_last = [b"NVRM: a\n".to_vec(), vec![b'z'; 2 * MAX_LINE]].concat();
        let (lines, st) = collect(&long_last);
        assert_eq!(lines, vec![(1, "NVRM: a".into())]);
        assert_eq!(st.lines, 2);
    }

    #[test]
    fn nul_bytes_are_noted_when_the_first_read_is_large() {
        let mut input = b"\0 garbage\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 2 << 20));
        input.extend_from_slice(b"\nNVRM: ok\n");
        let (lines, st) = collect(&input);
        assert_eq!(lines, vec![(3, "NVRM: ok".into())]);
        assert_eq!(st.notes[0].line, Some(1), "{:?}", st.notes);
        assert!(st.notes[0].text.contains("binary"));
    }

    #[test]
    fn nul_bytes_are_noted() {
        let (lines, st) = collect(b"\0\0\x01garbage\nNVRM: ok\n");
        assert_eq!(lines, vec![(2, "NVRM: ok".into())]);
        assert!(st.notes[0].text.contains("binary"));
    }
}
