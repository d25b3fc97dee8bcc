//! The first stage's own vector search, for CPUs with AVX-512 VBMI: 64 bytes a step, each
//! fingerprint byte looked up whole, and the newlines of every step counted in the same pass.
//!
//! Why its own: the packed searcher of `aho-corasick` steps 32 bytes at a time and splits every
//! byte into two nybbles, each looked up in a 16-entry table, so an anchor's byte `r` (0x72) also
//! passes for every byte with a 7 high nybble or a 2 low one; with our 37 anchors in 8 buckets
//! that is most of what the search costs beyond its stride. VBMI's two-register byte permute
//! (`vpermt2b`) looks a byte's low seven bits up in a 128-entry table in one instruction: a byte
//! passes only where an anchor of the bucket has that very byte (or, for bytes above 0x7f, that
//! byte less its top bit) at that position, and one lookup replaces two. The same loaded vector
//! compared with `\n` gives the step's newline count, which `scan` otherwise counts in a second
//! pass over the bytes (a twelfth of its time on an ordinary log).
//!
//! Semantics are the packed searcher's leftmost-first ones: the leftmost position where any
//! pattern starts, and at that position the pattern of lowest id. A test compares the two on
//! planted and random text.

/// How many bytes of each pattern the tables hold (the packed searcher's fingerprint length).
const FINGERPRINT: usize = 4;
/// Buckets: one bit each of a table entry.
const BUCKETS: usize = 8;

/// Newlines counted up to an offset of the haystack: the search keeps it current as it steps, so
/// that a line number costs only the bytes between the last step and the line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// Every newline in `hay[..upto]` is in `newlines`.
    pub upto: usize,
    pub newlines: u64,
    /// Bytes the count has read, a test's measure of its cost.
    #[cfg(test)]
    pub work: u64,
}

impl Counted {
    /// Moves the count to `at`, either way, and returns it. Backwards it subtracts the newlines
    /// between `at` and `upto` (a line that began before the step the search stopped in is
    /// asked about after the search: a few bytes back), unless counting from the start is
    /// shorter. Counting from the start every time instead made a storm log, a candidate every
    /// other line, cost a count of its whole window per line.
    pub fn advance(&mut self, hay: &[u8], at: usize) -> u64 {
        let read = if at >= self.upto {
            let s = &hay[self.upto..at];
            self.newlines += bytecount::count(s, b'\n') as u64;
            s.len()
        } else if self.upto - at <= at {
            let s = &hay[at..self.upto];
            self.newlines -= bytecount::count(s, b'\n') as u64;
            s.len()
        } else {
            self.newlines = bytecount::count(&hay[..at], b'\n') as u64;
            at
        };
        #[cfg(test)]
        {
            self.work += read as u64;
        }
        let _ = read;
        self.upto = at;
        self.newlines
    }

    /// A count that starts at `at`: newlines from there on (the search never moves it back).
    pub fn from_offset(at: usize) -> Counted {
        Counted {
            upto: at,
            ..Counted::default()
        }
    }
}

/// The wide searcher, built only where the CPU has what it needs.
#[derive(Debug, Clone)]
pub struct Wide {
    /// Per fingerprint position: bucket bits by a byte's low seven bits (boxed: read once per
    /// search, and a prefilter's variants stay small).
    tables: Box<[[u8; 128]; FINGERPRINT]>,
    /// Per bucket: its patterns with their ids, in id order.
    buckets: [Vec<(Box<[u8]>, usize)>; BUCKETS],
}

impl Wide {
    /// A searcher for `patterns` (pattern id = index), the pattern with id `i` in bucket
    /// `bucket_of(i)`; `None` where the CPU lacks AVX-512 BW and VBMI, or for an empty pattern.
    pub fn new(patterns: &[&[u8]], bucket_of: impl Fn(usize) -> usize) -> Option<Wide> {
        if !available() || patterns.is_empty() || patterns.iter().any(|p| p.is_empty()) {
            return None;
        }
        Some(Self::build(patterns, bucket_of))
    }

    fn build(patterns: &[&[u8]], bucket_of: impl Fn(usize) -> usize) -> Wide {
        let mut tables = [[0u8; 128]; FINGERPRINT];
        let mut buckets: [Vec<(Box<[u8]>, usize)>; BUCKETS] = Default::default();
        for (id, p) in patterns.iter().enumerate() {
            let b = bucket_of(id) % BUCKETS;
            let bit = 1u8 << b;
            for (j, table) in tables.iter_mut().enumerate() {
                match p.get(j) {
                    Some(&byte) => table[usize::from(byte & 0x7f)] |= bit,
                    // A pattern shorter than the fingerprint passes any byte past its end.
                    None => table.iter_mut().for_each(|e| *e |= bit),
                }
            }
            buckets[b].push((p.to_vec().into_boxed_slice(), id));
        }
        Wide {
            tables: Box::new(tables),
            buckets,
        }
    }

    /// The leftmost pattern match at or after `from`: (position, pattern id). `counted` is
    /// moved to `from` first, then kept current by the search: when it returns, every newline before the returned position's 64-byte step (or
    /// before the end) is counted.
    pub fn find(&self, hay: &[u8], from: usize, counted: &mut Counted) -> Option<(usize, usize)> {
        if from > hay.len() {
            return None;
        }
        counted.advance(hay, from);
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `Wide` is only built where `available()` found the features.
            unsafe { self.find_avx512(hay, from, counted) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = counted;
            self.find_scalar(hay, from)
        }
    }

    /// Which pattern starts at `s`, whose step's table lookups gave `bits`: the lowest id.
    #[inline]
    fn verify(&self, hay: &[u8], s: usize, mut bits: u8) -> Option<usize> {
        let mut best: Option<usize> = None;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            for (p, id) in &self.buckets[b] {
                if best.is_some_and(|x| x < *id) {
                    break;
                }
                if hay[s..].starts_with(p) {
                    best = Some(*id);
                    break;
                }
            }
        }
        best
    }

    /// The same search a byte at a time: the reference the vector loop is tested against.
    #[cfg_attr(target_arch = "x86_64", allow(dead_code))]
    fn find_scalar(&self, hay: &[u8], from: usize) -> Option<(usize, usize)> {
        (from..hay.len()).find_map(|s| {
            let bits = (0..FINGERPRINT).fold(0xffu8, |acc, j| {
                acc & hay.get(s + j).map_or(self.tables[j][0], |&c| {
                    self.tables[j][usize::from(c & 0x7f)]
                })
            });
            self.verify(hay, s, bits).map(|id| (s, id))
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt")]
    unsafe fn find_avx512(
        &self,
        hay: &[u8],
        from: usize,
        counted: &mut Counted,
    ) -> Option<(usize, usize)> {
        let mut p = from;
        let mut newlines = counted.newlines;
        let mut bits = [0u8; 64];
        let found = loop {
            // SAFETY: the caller runs on a CPU with the features (a `Wide` exists).
            match unsafe { self.next_step(hay, p, &mut newlines, &mut bits) } {
                None => {
                    p = hay.len().max(p);
                    break None;
                }
                Some((at, cand, nls)) => {
                    p = at;
                    if let Some(hit) = self.first_in_step(hay, p, &bits, cand) {
                        break Some(hit);
                    }
                    newlines += u64::from(nls);
                    p += 64;
                }
            }
        };
        counted.upto = p.min(hay.len());
        counted.newlines = newlines;
        found
    }

    /// Steps from `p` to the first 64-byte step with a candidate, adding the newlines of the
    /// steps it passes to `newlines`: (the step's start, its candidate bits, its newline count),
    /// the bucket bits of its 64 start positions in `bits`; `None` at the end of `hay`.
    ///
    /// Why a function of its own that calls nothing: a call in the loop clobbers every vector
    /// register, and the compiler then keeps the eight table vectors on the stack and loads
    /// them again at every step, twice the loads of the search itself.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,popcnt")]
    #[inline(never)]
    unsafe fn next_step(
        &self,
        hay: &[u8],
        mut p: usize,
        newlines: &mut u64,
        bits: &mut [u8; 64],
    ) -> Option<(usize, u64, u32)> {
        use std::arch::x86_64::*;
        let t = &*self.tables;
        // SAFETY (every load below): the tables are 128 bytes, read as two 64-byte halves.
        let lo = |j: usize| unsafe { _mm512_loadu_si512(t[j].as_ptr().cast()) };
        let hi = |j: usize| unsafe { _mm512_loadu_si512(t[j].as_ptr().add(64).cast()) };
        let (l0, h0, l1, h1) = (lo(0), hi(0), lo(1), hi(1));
        let (l2, h2, l3, h3) = (lo(2), hi(2), lo(3), hi(3));
        let nl = _mm512_set1_epi8(b'\n' as i8);
        let len = hay.len();
        let base = hay.as_ptr();
        let mut count = *newlines;
        // One step: the candidates' bucket bits of the 64 start positions at `p`, and the
        // newlines among the 64 bytes. `mask(j)` says which bytes of the load at `p + j` lie
        // inside the haystack (masked-off bytes read as 0 and are never touched).
        macro_rules! step {
            ($m0:expr, $m1:expr, $m2:expr, $m3:expr) => {{
                // SAFETY: every byte loaded is inside `hay` (the masks say which), and masked
                // AVX-512 loads do not touch or fault on masked-off bytes. Near the end `p + j`
                // may lie past `hay`'s end: `wrapping_add` forms that address without the
                // in-bounds promise `add` makes, and no byte of it is read.
                let b0 = unsafe { _mm512_maskz_loadu_epi8($m0, base.wrapping_add(p).cast()) };
                let b1 = unsafe { _mm512_maskz_loadu_epi8($m1, base.wrapping_add(p + 1).cast()) };
                let b2 = unsafe { _mm512_maskz_loadu_epi8($m2, base.wrapping_add(p + 2).cast()) };
                let b3 = unsafe { _mm512_maskz_loadu_epi8($m3, base.wrapping_add(p + 3).cast()) };
                let r = _mm512_and_si512(
                    _mm512_and_si512(
                        _mm512_permutex2var_epi8(l0, b0, h0),
                        _mm512_permutex2var_epi8(l1, b1, h1),
                    ),
                    _mm512_and_si512(
                        _mm512_permutex2var_epi8(l2, b2, h2),
                        _mm512_permutex2var_epi8(l3, b3, h3),
                    ),
                );
                let nls = (_mm512_cmpeq_epi8_mask(b0, nl) & $m0).count_ones();
                let cand = _mm512_test_epi8_mask(r, r) & $m0;
                if cand != 0 {
                    // SAFETY: `bits` is 64 bytes.
                    unsafe { _mm512_storeu_si512(bits.as_mut_ptr().cast(), r) };
                    *newlines = count;
                    return Some((p, cand, nls));
                }
                count += u64::from(nls);
                p += 64;
            }};
        }
        let full = u64::MAX;
        while p + 64 + FINGERPRINT - 1 <= len {
            step!(full, full, full, full);
        }
        while p < len {
            let valid = |j: usize| -> u64 {
                let n = len.saturating_sub(p + j);
                if n >= 64 {
                    u64::MAX
                } else {
                    (1u64 << n) - 1
                }
            };
            step!(valid(0), valid(1), valid(2), valid(3));
        }
        *newlines = count;
        None
    }

    /// The leftmost match among a step's candidates `cand` (bit i: start `p + i`), whose
    /// bucket bits are `bits`.
    #[cfg(target_arch = "x86_64")]
    fn first_in_step(
        &self,
        hay: &[u8],
        p: usize,
        bits: &[u8; 64],
        mut cand: u64,
    ) -> Option<(usize, usize)> {
        while cand != 0 {
            let i = cand.trailing_zeros() as usize;
            cand &= cand - 1;
            if let Some(id) = self.verify(hay, p + i, bits[i]) {
                return Some((p + i, id));
            }
        }
        None
    }
}

/// Whether this CPU runs the wide search.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("popcnt")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(patterns: &[&[u8]], hay: &[u8], from: usize) -> Option<(usize, usize)> {
        (from..hay.len()).find_map(|s| {
            patterns
                .iter()
                .position(|p| hay[s..].starts_with(p))
                .map(|id| (s, id))
        })
    }

    const PATTERNS: &[&[u8]] = &[
        b"NVRM",
        b"SXid",
        b"nvid",
        b"AER:",
        b"\xc3\xa9t\xc3",
        b"ab",
        b"abcd",
        b"Call",
        b"(EE)",
        b"RIP:",
        b"BUG:",
        b"stat",
    ];

    /// Every search of the vector loop, from every start, agrees with a plain one on text with
    /// the patterns planted at every offset of a step, across the end, and with near misses;
    /// and the newline count it keeps is exact.
    #[test]
    fn the_wide_search_finds_what_a_plain_search_finds() {
        let mut rng = fastrand::Rng::with_seed(9);
        let alphabet = b"NVRMSXidnvAER:abcdCl(E)IP:BUGst \n\xc3\xa9\x80\x00z";
        let w = Wide::build(PATTERNS, |i| i % BUCKETS);
        for len in [0, 1, 3, 4, 63, 64, 65, 66, 67, 68, 127, 130, 200, 700] {
            for _ in 0..40 {
                let mut hay: Vec<u8> = (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect();
                if len > 4 && rng.bool() {
                    let p = PATTERNS[rng.usize(..PATTERNS.len())];
                    let at = rng.usize(..=len - p.len().min(len));
                    let end = (at + p.len()).min(len);
                    hay[at..end].copy_from_slice(&p[..end - at]);
                }
                for from in 0..=len {
                    let want = reference(PATTERNS, &hay, from);
                    let mut c = Counted::default();
                    assert_eq!(
                        w.find_scalar(&hay, from),
                        want,
                        "scalar {hay:?} from {from}"
                    );
                    if available() {
                        let got = w.find(&hay, from, &mut c);
                        assert_eq!(got, want, "{hay:?} from {from}");
                        let upto = c.upto;
                        assert!(upto <= got.map_or(len, |g| g.0), "counted past the match");
                        let exact = hay[..upto].iter().filter(|&&b| b == b'\n').count();
                        assert_eq!(c.newlines, exact as u64, "{hay:?} from {from}");
                    }
                }
            }
        }
    }

    /// A haystack that ends where the mapped memory ends: the tail steps' loads reach past the
    /// end only under their masks, so the search neither faults nor reads the page beyond (a
    /// guard page, no access at all), whatever the haystack's length.
    #[test]
    fn the_search_never_touches_the_byte_after_the_haystack() {
        if !available() {
            return;
        }
        // SAFETY: a private anonymous map of two pages, the second made inaccessible, unmapped
        // at the end; the slices below lie in the first page.
        unsafe {
            let page = 4096usize;
            let m = libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            assert_eq!(
                libc::mprotect(m.cast::<u8>().add(page).cast(), page, libc::PROT_NONE),
                0
            );
            let first = std::slice::from_raw_parts_mut(m.cast::<u8>(), page);
            first.fill(b'x');
            first[page - 2..].copy_from_slice(b"ab");
            let w = Wide::build(PATTERNS, |i| i % BUCKETS);
            for len in [0, 1, 2, 3, 4, 5, 63, 64, 65, 67, 68, 130, page] {
                let hay = &first[page - len..];
                let mut c = Counted::default();
                assert_eq!(
                    w.find(hay, 0, &mut c),
                    reference(PATTERNS, hay, 0),
                    "len {len}"
                );
            }
            assert_eq!(libc::munmap(m, 2 * page), 0);
        }
    }

    /// The count moves back as exactly as it moves on, reading only the bytes between (or from
    /// the start, when that is shorter).
    #[test]
    fn the_count_moves_back_when_asked_about_an_earlier_offset() {
        let hay = b"a\nb\nc\nd\ne\nf\ng\nh\n";
        let mut c = Counted::default();
        assert_eq!(c.advance(hay, 12), 6);
        assert_eq!(c.advance(hay, 16), 8);
        let before = c.work;
        assert_eq!(c.advance(hay, 13), 6);
        assert_eq!(c.work - before, 3, "back three bytes reads three");
        assert_eq!(c.advance(hay, 2), 1);
        assert_eq!(c.advance(hay, 0), 0);
        for at in (0..=hay.len()).rev().chain(0..=hay.len()) {
            let exact = hay[..at].iter().filter(|&&b| b == b'\n').count() as u64;
            assert_eq!(c.advance(hay, at), exact, "at {at}");
        }
    }
}
