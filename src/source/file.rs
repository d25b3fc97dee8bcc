//! Saved logs (`xidwatch scan`): files, gzip archives, standard input.
//!
//! Scanning is a hot path: bug-report archives are hundreds of MB and almost every line is
//! ordinary kernel chatter. So the reader never looks at a line on its own unless a literal
//! prefilter (Teddy/Aho-Corasick over the whole buffer, the same technique grep tools use) says it
//! may be ours; line numbers come from a SIMD newline count over the skipped stretches.

use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::Path;

use crate::classify::saved;

pub use crate::classify::prefilter::{candidate_literals, Prefilter};

/// Read size. Small enough that a read's bytes are still in the core's L2 cache when the literal
/// search reaches them (the kernel's copy puts them there): with 2 MiB reads the scan of an
/// ordinary log was an eighth slower than with 256 KiB ones. Large enough that per-read
/// overhead vanishes.
///
/// Measured again against a memory map on a GPU host's log (bench/scan.sh's gpu-host log, 277 MB,
/// page cache warm, one core; CPU time, best of five): `read(2)` in 256 KiB pieces 105-110 ms;
/// a whole-file map 171-176 ms with no advice, 163-167 ms with `MADV_SEQUENTIAL`, 152-170 ms with
/// `MADV_WILLNEED`, 152-175 ms with `MADV_HUGEPAGE` (the page cache is not in huge pages), also
/// when searched in 256 KiB windows. The map saves the copy (system time) but the search and the
/// newline count then read memory instead of cache, which costs more; it also needs a SIGBUS
/// handler to survive truncation. So reads stay.
///
/// Measured once more on the same logs (task-clock, best of five): a whole-file map with
/// `MAP_POPULATE`, with and without `MADV_SEQUENTIAL`, and with `MADV_WILLNEED` one window ahead,
/// all cost more than reads (the search of mapped pages is slower by more than the copy it
/// saves); reads of 64 KiB to 2 MiB cost the same within noise; a read buffer in a transparent
/// huge page saved nothing. ripgrep itself searches these logs faster with `--no-mmap`.
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

/// Opens a file (or `-` for standard input), transparently decompressing gzip.
///
/// The input is opened exactly once and only ever read with `read(2)`: a FIFO or standard input
/// cannot be opened or read a second time (a second open of a FIFO waits for a writer that has
/// already gone), and a memory map of a file that someone truncates meanwhile kills the process
/// with SIGBUS, where a read just ends early. Reads go straight into the scanner's buffer in
/// 256 KiB pieces; the gzip sniff is the only buffered read.
pub fn open(path: &Path) -> io::Result<Box<dyn Read>> {
    let raw: Box<dyn Read> = if path == Path::new("-") {
        Box::new(io::stdin().lock())
    } else {
        Box::new(File::open(path)?)
    };
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
        // At most CHUNK per read. The carried-over part is shorter than MAX_LINE, so the slice is
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
                    continue;
                }
            }
        }
        // Process whole lines only; the tail waits for the next read (or EOF).
        let end = if eof {
            filled
        } else {
            match memchr::memrchr(b'\n', &buf[start..filled]) {
                Some(i) => start + i + 1,
                None if filled - start >= MAX_LINE => {
                    let line = base_line + 1;
                    st.notes.push(long_line_note(line));
                    let head = &buf[start..start + MAX_LINE];
                    if pre.is_candidate(head) {
                        st.candidates += 1;
                        on_line(line, trim_cr(head));
                    }
                    filled = 0;
                    skipping_long_line = true;
                    continue;
                }
                None => {
                    buf.copy_within(start..filled, 0);
                    filled -= start;
                    continue;
                }
            }
        };
        base_line += scan_region(
            &buf[start..end],
            base_line,
            pre,
            &mut st,
            &mut on_line,
            &mut wrapped_carry,
        );
        buf.copy_within(end..filled, 0);
        filled -= end;
    }
    st.lines = base_line;
    st
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

/// Scans complete lines in `region`; returns how many newlines it holds. `carry` says whether the
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
    let mut counted: u64 = 0;
    let mut pos = 0;
    // The end of the last line offered, for the carry.
    let mut offered_end = None;
    if *carry && saved::continues(region) {
        let ne = memchr::memchr(b'\n', region).unwrap_or(region.len());
        on_line(base_line + 1, trim_cr(&region[..ne.min(MAX_LINE)]));
        pos = offer_wrapped(region, ne, base_line, &mut counted, on_line);
        offered_end = Some(pos);
    }
    while pos < region.len() {
        let Some(m_start) = pre.find_from(region, pos) else {
            break;
        };
        let ls = memchr::memrchr(b'\n', &region[pos..m_start]).map_or(pos, |i| pos + i + 1);
        let le = memchr::memchr(b'\n', &region[m_start..]).map_or(region.len(), |i| m_start + i);
        counted += bytecount::count(&region[pos..ls], b'\n') as u64;
        st.candidates += 1;
        let line = base_line + counted + 1;
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
        pos = offer_wrapped(region, le, base_line, &mut counted, on_line);
        offered_end = Some(pos);
    }
    *carry = offered_end.is_some_and(|e| e + 1 >= region.len());
    counted += bytecount::count(&region[pos.min(region.len())..], b'\n') as u64;
    // A last line without a newline (at EOF) is a line too.
    if !region.is_empty() && region[region.len() - 1] != b'\n' {
        counted += 1;
    }
    counted
}

/// How many indented lines below an offered line are offered with it.
const MAX_WRAPPED: usize = 8;

/// Offers the indented lines right below the offered line that ends at `end` (its newline, or
/// the region's end): a paste that wraps a driver message under its head goes on there, as
/// `classify::saved::offered` says; the reader decides whether they continue it. Returns where
/// the last line offered ends; `counted` passes the newlines before each.
fn offer_wrapped(
    region: &[u8],
    mut end: usize,
    base_line: u64,
    counted: &mut u64,
    on_line: &mut impl FnMut(u64, &[u8]),
) -> usize {
    for _ in 0..MAX_WRAPPED {
        let ns = end + 1;
        if ns >= region.len() || !saved::continues(&region[ns..]) {
            break;
        }
        let ne = memchr::memchr(b'\n', &region[ns..]).map_or(region.len(), |i| ns + i);
        *counted += 1;
        on_line(
            base_line + *counted + 1,
            trim_cr(&region[ns..ne.min(ns + MAX_LINE)]),
        );
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
        (out, st)
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
