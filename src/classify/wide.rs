//! The first stage's own vector search: 64 bytes a step, the newlines of every step counted in
//! the same pass. Two loops: the AVX2 one, which runs wherever the CPU has AVX2 ([`best_kind`]),
//! looks each fingerprint byte up by its two nybbles, as Teddy does, in two 32-byte halves; the
//! AVX-512 VBMI one looks each byte up whole. The VBMI loop came first and filters better, but
//! the AVX2 loop, made for CPUs without AVX-512, turned out faster on the one CPU with both that
//! it was timed on; the VBMI loop stays, tested, for `XIDWATCH_FIRST_STAGE=vbmi` to time it on
//! other CPUs.
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
//! On AVX2 the lookups are the packed searcher's, and what the loop of its own saves is that
//! second pass: on an AMD EPYC guest (one core, bench/scan.sh's logs in memory) the packed
//! search and the count took 89 ms on the GPU-host log and 58 ms on the ordinary one, this loop
//! 50 and 31 ms; `scan` of the mapped files went from 0.81 to 0.91 and 0.87 of ripgrep's speed.
//! Where the anchors are ASCII it also works out each byte's high nybble once per block instead of
//! at each of the four positions ([`HighNybbles`]).
//!
//! Semantics are the packed searcher's leftmost-first ones: the leftmost position where any
//! pattern starts, and at that position the pattern of lowest id. A test compares the two on
//! planted and random text.

/// How many bytes of each pattern the tables hold (the packed searcher's fingerprint length).
const FINGERPRINT: usize = 4;
/// Buckets: one bit each of a table entry.
const BUCKETS: usize = 8;
/// How far ahead the AVX2 loop asks for the bytes it will read.
const PREFETCH: usize = 1024;
/// Bytes whose high nybbles the AVX2 loop works out at once ([`HighNybbles`]): a step with a
/// candidate leaves the loop, and the next call starts a new block, so a longer one wastes more.
const HIGH_BLOCK: usize = 512;

/// A block's high nybbles, aligned for whole-vector stores (and 32 more bytes: a step's loads
/// reach 35 bytes past its start).
#[repr(align(32))]
struct HighNybbles([u8; HIGH_BLOCK + 32]);

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

/// Which loop a [`Wide`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A byte at a time, on any CPU: what a searcher runs until [`Wide::with_kind`] gives it a
    /// vector loop the CPU has, and the reference the vector loops are tested against.
    Scalar,
    /// AVX-512 VBMI: 64 bytes a step, each byte looked up whole in a 128-entry table.
    Vbmi,
    /// AVX2: two 32-byte halves a step, each byte looked up by its two nybbles in 16-entry
    /// tables (as Teddy does), the newlines counted in the same pass.
    Avx2,
}

/// The wide searcher, built only where the CPU has what it needs.
#[derive(Debug, Clone)]
pub struct Wide {
    kind: Kind,
    /// Per fingerprint position: bucket bits by a byte's low seven bits (boxed: read once per
    /// search, and a prefilter's variants stay small).
    tables: Box<[[u8; 128]; FINGERPRINT]>,
    /// Per fingerprint position, the AVX2 loop's tables: at `2j` the bucket bits of the patterns
    /// whose byte `j` has a given low nybble, at `2j + 1` by high nybble; each 16-entry table
    /// twice, once per 128-bit lane (`vpshufb` looks up within a lane).
    nybbles: Box<[[u8; 32]; 2 * FINGERPRINT]>,
    /// Whether every pattern's fingerprint is ASCII and whole (no pattern shorter than it): the
    /// AVX2 loop then looks low nybbles up with the byte itself, since `vpshufb` yields 0 for a
    /// byte with its top bit set, which no fingerprint holds.
    ascii: bool,
    /// Per bucket: its patterns with their ids, in id order.
    buckets: [Vec<(Box<[u8]>, usize)>; BUCKETS],
}

impl Wide {
    /// A searcher for `patterns` (pattern id = index), the pattern with id `i` in bucket
    /// `bucket_of(i)`, running the loop [`best_kind`] chooses; `None` where the CPU runs none (no
    /// AVX2), or for an empty pattern.
    pub fn new(patterns: &[&[u8]], bucket_of: impl Fn(usize) -> usize) -> Option<Wide> {
        let kind = best_kind()?;
        if patterns.is_empty() || patterns.iter().any(|p| p.is_empty()) {
            return None;
        }
        Self::build(patterns, bucket_of).with_kind(kind)
    }

    /// This searcher running `kind`'s loop; `None` where the CPU cannot run it (the tests
    /// run both loops where the CPU has both).
    pub fn with_kind(mut self, kind: Kind) -> Option<Wide> {
        self.kind = kind;
        can_run(kind).then_some(self)
    }

    /// The loop this searcher runs.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn build(patterns: &[&[u8]], bucket_of: impl Fn(usize) -> usize) -> Wide {
        let mut tables = [[0u8; 128]; FINGERPRINT];
        let mut nybbles = [[0u8; 32]; 2 * FINGERPRINT];
        let mut buckets: [Vec<(Box<[u8]>, usize)>; BUCKETS] = Default::default();
        for (id, p) in patterns.iter().enumerate() {
            let b = bucket_of(id) % BUCKETS;
            let bit = 1u8 << b;
            for (j, table) in tables.iter_mut().enumerate() {
                match p.get(j) {
                    Some(&byte) => {
                        table[usize::from(byte & 0x7f)] |= bit;
                        for lane in 0..2 {
                            nybbles[2 * j][lane * 16 + usize::from(byte & 15)] |= bit;
                            nybbles[2 * j + 1][lane * 16 + usize::from(byte >> 4)] |= bit;
                        }
                    }
                    // A pattern shorter than the fingerprint passes any byte past its end.
                    None => {
                        table.iter_mut().for_each(|e| *e |= bit);
                        nybbles[2 * j].iter_mut().for_each(|e| *e |= bit);
                        nybbles[2 * j + 1].iter_mut().for_each(|e| *e |= bit);
                    }
                }
            }
            buckets[b].push((p.to_vec().into_boxed_slice(), id));
        }
        let ascii = patterns
            .iter()
            .all(|p| p.len() >= FINGERPRINT && p[..FINGERPRINT].is_ascii());
        Wide {
            kind: Kind::Scalar,
            ascii,
            tables: Box::new(tables),
            nybbles: Box::new(nybbles),
            buckets,
        }
    }

    /// The leftmost pattern match at or after `from`: (position, pattern id). `counted` is
    /// moved to `from` first, then kept current by the vector loops: when they return, every
    /// newline before the returned position's 64-byte step (or before the end) is counted.
    pub fn find(&self, hay: &[u8], from: usize, counted: &mut Counted) -> Option<(usize, usize)> {
        if from > hay.len() {
            return None;
        }
        counted.advance(hay, from);
        #[cfg(target_arch = "x86_64")]
        {
            match self.kind {
                Kind::Scalar => self.find_scalar(hay, from),
                // SAFETY: a `Wide` runs a vector kind only where `can_run` found its features.
                Kind::Vbmi => self.find_steps(hay, from, counted, |h, p, n, b| unsafe {
                    self.next_step(h, p, n, b)
                }),
                // SAFETY: as above.
                Kind::Avx2 if self.ascii => {
                    self.find_steps(hay, from, counted, |h, p, n, b| unsafe {
                        self.next_step_avx2::<true>(h, p, n, b)
                    })
                }
                // SAFETY: as above.
                Kind::Avx2 => self.find_steps(hay, from, counted, |h, p, n, b| unsafe {
                    self.next_step_avx2::<false>(h, p, n, b)
                }),
            }
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
        // The four bytes at `s` as one word: a fingerprint's comparison is one compare, not a
        // call to `memcmp` (it held a twentieth as many samples as the AVX2 loop itself
        // on a GPU host's log).
        let head = hay.get(s..).and_then(|h| h.first_chunk::<4>());
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            for (p, id) in &self.buckets[b] {
                if best.is_some_and(|x| x < *id) {
                    break;
                }
                let hit = match (head, p.first_chunk::<4>()) {
                    (Some(h), Some(f)) => h == f && (p.len() == 4 || hay[s..].starts_with(p)),
                    _ => hay[s..].starts_with(p),
                };
                if hit {
                    best = Some(*id);
                    break;
                }
            }
        }
        best
    }

    /// The same search a byte at a time: the reference the vector loop is tested against.
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

    /// The steps of either loop from `from` to the first match: `step` is the loop's
    /// [`Wide::next_step`].
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn find_steps(
        &self,
        hay: &[u8],
        from: usize,
        counted: &mut Counted,
        step: impl Fn(&[u8], usize, &mut u64, &mut [u8; 64]) -> Option<(usize, u64, u32)>,
    ) -> Option<(usize, usize)> {
        let mut p = from;
        let mut newlines = counted.newlines;
        let mut bits = [0u8; 64];
        let found = loop {
            match step(hay, p, &mut newlines, &mut bits) {
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

    /// [`Wide::next_step`] on AVX2: the same 64-byte steps, each as two 32-byte halves, every
    /// byte looked up by its low and its high nybble in 16-entry tables (`vpshufb`), the two
    /// lookups ANDed: a byte passes for a bucket where some anchor of the bucket has its low
    /// nybble and some anchor its high one at that position, which admits more bytes than the
    /// whole-byte tables (the bucket order of `prefilter::teddy_order` keeps that rare on kernel
    /// text), and verification sorts them out. The newlines are counted from the first load of
    /// each half, as the AVX-512 loop does.
    ///
    /// Why not the packed searcher of `aho-corasick`, which does the same lookups: its loop
    /// leaves the count of newlines to a second pass over the bytes, which on a GPU host's log
    /// cost two fifths of what the search itself did.
    ///
    /// Where every fingerprint is ASCII, the high nybbles of a block of bytes are worked out
    /// first, once per byte, and the steps load them back at each of the four positions (see
    /// [`HighNybbles`]): 58 instructions a step instead of 72 (counted in the loop and its block pass), and on an AMD EPYC guest (Zen 3,
    /// one core, a GPU host's log in L2) 12.2 against 11.7 GB/s.
    ///
    /// The last steps, where a load would reach past the haystack (AVX2 has no masked byte
    /// loads), run on a zeroed copy of the bytes left.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,popcnt")]
    #[inline(never)]
    unsafe fn next_step_avx2<const ASCII: bool>(
        &self,
        hay: &[u8],
        mut p: usize,
        newlines: &mut u64,
        bits: &mut [u8; 64],
    ) -> Option<(usize, u64, u32)> {
        use std::arch::x86_64::*;
        let t = &*self.nybbles;
        // SAFETY: each table is 32 bytes, read whole.
        let tab = |i: usize| unsafe { _mm256_loadu_si256(t[i].as_ptr().cast()) };
        let (l0, h0, l1, h1) = (tab(0), tab(1), tab(2), tab(3));
        let (l2, h2, l3, h3) = (tab(4), tab(5), tab(6), tab(7));
        let low = _mm256_set1_epi8(0x0f);
        let nl = _mm256_set1_epi8(b'\n' as i8);
        let zero = _mm256_setzero_si256();
        let len = hay.len();
        let count = *newlines;
        // The newlines of the steps passed, kept in the vector unit: `lanes` holds a count per
        // byte lane, negated (a newline compares as -1 and is added as it is: subtracted, the
        // compiler turns the compare into an AND with a constant vector, one more register in
        // a loop short of them), at most 2 a step, folded into `sums` (four 64-bit sums) after
        // every block of 8 steps or plain step, far below a lane's 255. Counting each half's
        // newlines with a mask move, a popcount and a scalar add instead cost 14 M more
        // instructions on the 530 MiB GPU-host bench log (586.5 against 572.7 M, callgrind).
        let mut lanes = zero;
        let mut sums = zero;
        // Moves the per-lane counts into the 64-bit sums (`vpsadbw` adds each 8 lanes up).
        macro_rules! fold {
            () => {{
                sums = _mm256_add_epi64(sums, _mm256_sad_epu8(_mm256_sub_epi8(zero, lanes), zero));
                lanes = zero;
            }};
        }
        // The newlines of every byte the steps have read: `count` and the vector sums together.
        macro_rules! settle {
            () => {{
                let all =
                    _mm256_add_epi64(sums, _mm256_sad_epu8(_mm256_sub_epi8(zero, lanes), zero));
                let s = _mm_add_epi64(
                    _mm256_castsi256_si128(all),
                    _mm256_extracti128_si256::<1>(all),
                );
                count + (_mm_cvtsi128_si64(s) as u64) + (_mm_extract_epi64::<1>(s) as u64)
            }};
        }
        // One byte position of a half: the bucket bits of the 32 bytes `$v` whose high nybbles
        // are `$g`.
        macro_rules! look {
            ($v:expr, $g:expr, $lo:expr, $hi:expr) => {{
                let v = $v;
                _mm256_and_si256(
                    _mm256_shuffle_epi8($lo, if ASCII { v } else { _mm256_and_si256(v, low) }),
                    _mm256_shuffle_epi8($hi, $g),
                )
            }};
        }
        // The high nybbles of the 32 bytes `$v`.
        macro_rules! high {
            ($v:expr) => {
                _mm256_and_si256(_mm256_srli_epi16($v, 4), low)
            };
        }
        // One half: the bucket bits of its 32 start positions and its first load (whose
        // newlines are the half's). `$b` points at 35 readable bytes; `$h`, where given, at
        // those bytes' high nybbles (else they are worked out from the bytes here).
        macro_rules! half {
            ($b:expr) => {{
                let b: *const u8 = $b;
                // SAFETY: the caller of the macro says 35 bytes from `b` are readable.
                let v = unsafe {
                    [
                        _mm256_loadu_si256(b.cast()),
                        _mm256_loadu_si256(b.add(1).cast()),
                        _mm256_loadu_si256(b.add(2).cast()),
                        _mm256_loadu_si256(b.add(3).cast()),
                    ]
                };
                bits!(v, [high!(v[0]), high!(v[1]), high!(v[2]), high!(v[3])])
            }};
            ($b:expr, $h:expr) => {{
                let (b, h): (*const u8, *const u8) = ($b, $h);
                // SAFETY: the caller of the macro says 35 bytes from `b` and from `h` are
                // readable.
                let (v, g) = unsafe {
                    (
                        [
                            _mm256_loadu_si256(b.cast()),
                            _mm256_loadu_si256(b.add(1).cast()),
                            _mm256_loadu_si256(b.add(2).cast()),
                            _mm256_loadu_si256(b.add(3).cast()),
                        ],
                        [
                            _mm256_loadu_si256(h.cast()),
                            _mm256_loadu_si256(h.add(1).cast()),
                            _mm256_loadu_si256(h.add(2).cast()),
                            _mm256_loadu_si256(h.add(3).cast()),
                        ],
                    )
                };
                bits!(v, g)
            }};
        }
        // A half's bucket bits from the bytes `$v` at its four positions and their high
        // nybbles `$g`, and the bytes at its first position.
        macro_rules! bits {
            ($v:ident, $g:expr) => {{
                let g = $g;
                let r = _mm256_and_si256(
                    _mm256_and_si256(look!($v[0], g[0], l0, h0), look!($v[1], g[1], l1, h1)),
                    _mm256_and_si256(look!($v[2], g[2], l2, h2), look!($v[3], g[3], l3, h3)),
                );
                (r, $v[0])
            }};
        }
        // One step of 64 start positions at `p` from `$b`, which points at 67 readable bytes
        // (and `$h`, where given, at their high nybbles); `$valid` says which starts lie inside
        // the haystack. Its newlines go into `lanes` as soon as each half is loaded (the loaded
        // bytes need no register after that); a step with a candidate returns, one without
        // moves `p` on.
        macro_rules! step {
            ($valid:expr, $b0:expr $(, $h:expr)?) => {{
                let b0: *const u8 = $b0;
                let (r0, v0) = half!(b0 $(, $h)?);
                lanes = _mm256_add_epi8(lanes, _mm256_cmpeq_epi8(v0, nl));
                // SAFETY: 67 bytes from each pointer are readable, so 35 from 32 bytes on.
                let (r1, v1) = half!(unsafe { b0.add(32) } $(, unsafe { $h.add(32) })?);
                lanes = _mm256_add_epi8(lanes, _mm256_cmpeq_epi8(v1, nl));
                let any = _mm256_or_si256(r0, r1);
                // Most steps have no candidate: one test says so, and the candidates' mask is
                // worked out only where there are some.
                if _mm256_testz_si256(any, any) == 0 {
                    let c0 = !(_mm256_movemask_epi8(_mm256_cmpeq_epi8(r0, zero)) as u32);
                    let c1 = !(_mm256_movemask_epi8(_mm256_cmpeq_epi8(r1, zero)) as u32);
                    let cand = (u64::from(c0) | u64::from(c1) << 32) & $valid;
                    if cand != 0 {
                        // SAFETY: `bits` is 64 bytes; the step's 64 bytes from `b0` are
                        // readable (loaded again: the rare path keeps no register of the loop's).
                        let nls = unsafe {
                            _mm256_storeu_si256(bits.as_mut_ptr().cast(), r0);
                            _mm256_storeu_si256(bits.as_mut_ptr().add(32).cast(), r1);
                            let n0 = _mm256_cmpeq_epi8(_mm256_loadu_si256(b0.cast()), nl);
                            let n1 = _mm256_cmpeq_epi8(_mm256_loadu_si256(b0.add(32).cast()), nl);
                            (_mm256_movemask_epi8(n0) as u32).count_ones()
                                + (_mm256_movemask_epi8(n1) as u32).count_ones()
                        };
                        // The step's own newlines are in `lanes` already.
                        *newlines = settle!() - u64::from(nls);
                        return Some((p, cand, nls));
                    }
                }
                p += 64;
            }};
        }
        let base = hay.as_ptr();
        if ASCII {
            // The high nybbles of a block of bytes, worked out once per byte: each byte is read
            // at four fingerprint positions, and shifting and masking it at each (two of every
            // five vector operations of a step, on the shuffle ports the lookups also need)
            // cost more than storing its nybble once and loading it four times.
            let mut high = HighNybbles([0; HIGH_BLOCK + 32]);
            while p + HIGH_BLOCK + 32 <= len {
                let h = high.0.as_mut_ptr();
                let mut k = 0;
                while k < HIGH_BLOCK + 32 {
                    // One prefetch a cache line. A prefetch is a hint and never faults, whatever
                    // the address.
                    if k % 64 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(p + k + PREFETCH).cast());
                    }
                    // SAFETY: `p + k + 32 <= p + HIGH_BLOCK + 32 <= len`; `high` holds
                    // `HIGH_BLOCK + 32` bytes, 32-byte aligned, and `k` is a multiple of 32.
                    unsafe {
                        let v = _mm256_loadu_si256(base.add(p + k).cast());
                        let n = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                        _mm256_store_si256(h.add(k).cast(), n);
                    }
                    k += 32;
                }
                let mut s = 0;
                while s < HIGH_BLOCK {
                    // SAFETY: the step at `p = block + s` reads up to `block + s + 66 <
                    // block + HIGH_BLOCK + 32`: inside `hay` and inside `high` from `h + s`.
                    let (b, hs) = unsafe { (base.add(p), h.add(s)) };
                    step!(u64::MAX, b, hs);
                    s += 64;
                }
                // At most 16 per lane since the last fold (8 steps of 2).
                fold!();
            }
        }
        while p + 64 + FINGERPRINT - 1 <= len {
            // A prefetch is a hint and never faults, whatever the address.
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(p + PREFETCH).cast());
            // SAFETY: `p + 67 <= len`: the step's bytes are inside `hay`.
            let b = unsafe { base.add(p) };
            step!(u64::MAX, b);
            fold!();
        }
        while p < len {
            let mut tail = [0u8; 64 + FINGERPRINT - 1];
            let n = (len - p).min(tail.len());
            tail[..n].copy_from_slice(&hay[p..p + n]);
            let valid = if len - p >= 64 {
                u64::MAX
            } else {
                (1u64 << (len - p)) - 1
            };
            // Bytes past the haystack read as 0 in the copy: no newline, and a start among them
            // is masked off.
            let b = tail.as_ptr();
            step!(valid, b);
            fold!();
        }
        *newlines = settle!();
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

/// The loop the first stage runs: the AVX2 one wherever the CPU has AVX2, else none (the packed
/// or the Aho-Corasick searcher runs). `XIDWATCH_FIRST_STAGE` chooses another for timing them
/// on one CPU (`bench/scan.sh` does): `vbmi` the AVX-512 loop, `packed` neither vector loop,
/// `avx2` the default ([`choose`]). What is found is the same whichever runs.
///
/// Why the AVX2 loop where the CPU also has AVX-512 VBMI: on an Intel Xeon guest with both
/// (2026-12-07, one core, bench/scan.sh's logs in memory, fifteen alternating runs, medians) the
/// scan took 0.103 s on the AVX-512 loop and 0.089 s on the AVX2 one on the ordinary log, 0.165
/// and 0.140 s on the GPU-host log. Likely causes, not measured apart: of the AVX-512 loop's four
/// 64-byte loads a step, one byte apart, at least three span two cache lines, and its four
/// `vpermt2b` all need the one port that also runs its other 512-bit shuffles.
pub fn best_kind() -> Option<Kind> {
    static CHOICE: std::sync::OnceLock<Option<Kind>> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| {
        let (kind, note) = choose(std::env::var_os("XIDWATCH_FIRST_STAGE").as_deref(), can_run);
        if let Some(note) = note {
            // Said once, on standard error (the journal, under systemd): a timing taken on
            // another loop than the one asked for would mislead whoever reads it.
            eprintln!("xidwatch: {note}");
        }
        kind
    })
}

/// The loop that `XIDWATCH_FIRST_STAGE=value` (`None`: unset) asks for on a CPU that runs the
/// loops `runs` says, and what to tell the user where it asked for one it does not get: a value
/// that names no loop, or a loop the CPU cannot run, gets the default and says so.
fn choose(
    value: Option<&std::ffi::OsStr>,
    runs: impl Fn(Kind) -> bool,
) -> (Option<Kind>, Option<String>) {
    let default = runs(Kind::Avx2).then_some(Kind::Avx2);
    let Some(value) = value else {
        return (default, None);
    };
    match value.to_str() {
        Some("avx2") => (default, None),
        Some("packed") => (None, None),
        Some("vbmi") if runs(Kind::Vbmi) => (Some(Kind::Vbmi), None),
        Some("vbmi") => (
            default,
            Some("XIDWATCH_FIRST_STAGE=vbmi: this CPU has no AVX-512 VBMI; the default loop runs".into()),
        ),
        _ => (
            default,
            Some(format!(
                "XIDWATCH_FIRST_STAGE={value:?} names no loop (avx2, vbmi or packed); the default loop runs"
            )),
        ),
    }
}

/// Whether this CPU runs `kind`'s loop.
pub fn can_run(kind: Kind) -> bool {
    match kind {
        Kind::Scalar => true,
        Kind::Vbmi => vbmi_available(),
        Kind::Avx2 => {
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("popcnt")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        }
    }
}

/// Whether this CPU runs the AVX-512 VBMI loop.
pub fn vbmi_available() -> bool {
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

    /// `XIDWATCH_FIRST_STAGE` gets the loop it names where the CPU runs it, and otherwise the
    /// default with a line that says so; unset or `avx2`, the default without a word.
    #[test]
    fn the_first_stage_choice_is_the_one_asked_for_or_said() {
        use std::ffi::OsStr;
        let all = |_: Kind| true;
        let avx2_only = |k: Kind| k != Kind::Vbmi;
        let neither = |k: Kind| k == Kind::Scalar;
        assert_eq!(choose(None, all), (Some(Kind::Avx2), None));
        assert_eq!(
            choose(Some(OsStr::new("avx2")), all),
            (Some(Kind::Avx2), None)
        );
        assert_eq!(
            choose(Some(OsStr::new("vbmi")), all),
            (Some(Kind::Vbmi), None)
        );
        assert_eq!(choose(Some(OsStr::new("packed")), all), (None, None));
        assert_eq!(choose(None, neither), (None, None));
        let (kind, note) = choose(Some(OsStr::new("vbmi")), avx2_only);
        assert_eq!(kind, Some(Kind::Avx2));
        assert!(note.is_some_and(|n| n.contains("no AVX-512 VBMI")));
        for typo in ["avx512", "VBMI", ""] {
            let (kind, note) = choose(Some(OsStr::new(typo)), all);
            assert_eq!(kind, Some(Kind::Avx2), "{typo:?}");
            assert!(
                note.as_deref().is_some_and(
                    |n| n.contains(&format!("{typo:?}")) && n.contains("names no loop")
                ),
                "{typo:?}: {note:?}"
            );
        }
    }

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

    /// Whole ASCII fingerprints only: the AVX2 loop's other form (low nybbles looked up by the
    /// byte itself).
    const ASCII_PATTERNS: &[&[u8]] = &[
        b"NVRM",
        b"SXid",
        b"nvid",
        b"AER:",
        b"abcd",
        b"Call",
        b"(EE)",
        b"RIP:",
        b"BUG:",
        b"stat",
        b"\x7fab\x00",
    ];

    /// Long runs without a candidate, all newlines, over hundreds of steps: the count the vector
    /// loops keep stays exact, at a match after the run and at the end of a haystack with none.
    /// (Summing the newlines per byte lane and adding them up every 127 steps, instead of a mask
    /// and a population count per half, was measured 5 % slower on an AMD EPYC guest; this test
    /// was written for it and kept.)
    #[test]
    fn the_newline_count_stays_exact_over_long_runs_without_a_candidate() {
        for patterns in [PATTERNS, ASCII_PATTERNS] {
            let w = Wide::build(patterns, |i| i % BUCKETS);
            let loops: Vec<Wide> = [Kind::Scalar, Kind::Vbmi, Kind::Avx2]
                .into_iter()
                .filter_map(|k| w.clone().with_kind(k))
                .collect();
            for run in [
                126 * 64,
                127 * 64 - 1,
                127 * 64,
                127 * 64 + 1,
                254 * 64 + 3,
                300 * 64 + 17,
            ] {
                for from in [0, 1, 63, 64 * 5 + 7] {
                    let mut hay = vec![b'\n'; run];
                    for w in &loops {
                        let mut c = Counted::default();
                        assert_eq!(w.find(&hay, from, &mut c), None, "{:?} {run}", w.kind());
                        let upto = c.upto;
                        let exact = hay[..upto].iter().filter(|&&b| b == b'\n').count();
                        assert_eq!(c.newlines, exact as u64, "{:?} {run}", w.kind());
                        // The vector loops count to the end; the byte loop counts nothing.
                        if w.kind() != Kind::Scalar {
                            assert_eq!(upto, run, "{:?} {run}", w.kind());
                        }
                    }
                    hay.extend_from_slice(b"NVRM\n\n");
                    for w in &loops {
                        let mut c = Counted::default();
                        let got = w.find(&hay, from, &mut c);
                        assert_eq!(got.map(|g| g.0), Some(run), "{:?} {run}", w.kind());
                        let upto = c.upto;
                        assert!(upto <= run);
                        let exact = hay[..upto].iter().filter(|&&b| b == b'\n').count();
                        assert_eq!(c.newlines, exact as u64, "{:?} {run} from {from}", w.kind());
                    }
                }
            }
        }
    }

    /// Every search of the vector loop, from every start, agrees with a plain one on text with
    /// the patterns planted at every offset of a step, across the end, and with near misses;
    /// and the newline count it keeps is exact.
    #[test]
    fn the_wide_search_finds_what_a_plain_search_finds() {
        for (patterns, ascii) in [(PATTERNS, false), (ASCII_PATTERNS, true)] {
            let w = Wide::build(patterns, |i| i % BUCKETS);
            assert_eq!(w.ascii, ascii);
            agrees_with_a_plain_search(patterns, &w);
        }
    }

    fn agrees_with_a_plain_search(patterns: &[&[u8]], w: &Wide) {
        let mut rng = fastrand::Rng::with_seed(9);
        let alphabet = b"NVRMSXidnvAER:abcdCl(E)IP:BUGst \n\xc3\xa9\x80\x00\x7f\xd4\xf2z";
        // Every loop this CPU runs (on a CPU with neither, the scalar reference alone).
        let loops: Vec<Wide> = [Kind::Scalar, Kind::Vbmi, Kind::Avx2]
            .into_iter()
            .filter_map(|k| w.clone().with_kind(k))
            .collect();
        for len in [
            0, 1, 3, 4, 31, 32, 33, 35, 63, 64, 65, 66, 67, 68, 127, 130, 200, 543, 544, 545, 700,
            1100, 1700,
        ] {
            for _ in 0..40 {
                let mut hay: Vec<u8> = (0..len)
                    .map(|_| alphabet[rng.usize(..alphabet.len())])
                    .collect();
                if len > 4 && rng.bool() {
                    let p = patterns[rng.usize(..patterns.len())];
                    let at = rng.usize(..=len - p.len().min(len));
                    let end = (at + p.len()).min(len);
                    hay[at..end].copy_from_slice(&p[..end - at]);
                }
                for from in 0..=len {
                    let want = reference(patterns, &hay, from);
                    let c = Counted::default();
                    assert_eq!(
                        w.find_scalar(&hay, from),
                        want,
                        "scalar {hay:?} from {from}"
                    );
                    for w in &loops {
                        let mut c = c;
                        let got = w.find(&hay, from, &mut c);
                        let kind = w.kind();
                        assert_eq!(got, want, "{kind:?} {hay:?} from {from}");
                        let upto = c.upto;
                        assert!(upto <= got.map_or(len, |g| g.0), "counted past the match");
                        let exact = hay[..upto].iter().filter(|&&b| b == b'\n').count();
                        assert_eq!(c.newlines, exact as u64, "{kind:?} {hay:?} from {from}");
                    }
                }
            }
        }
    }

    /// A haystack that ends where the mapped memory ends: the AVX-512 tail steps' loads reach
    /// past the end only under their masks, the AVX2 ones read a copy, so neither loop faults nor
    /// reads the page beyond (a guard page, no access at all), whatever the haystack's length.
    #[test]
    fn the_search_never_touches_the_byte_after_the_haystack() {
        let loops: Vec<Wide> = [Kind::Vbmi, Kind::Avx2]
            .into_iter()
            .filter_map(|k| Wide::build(PATTERNS, |i| i % BUCKETS).with_kind(k))
            .collect();
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
            for w in &loops {
                for len in [0, 1, 2, 3, 4, 5, 31, 32, 35, 63, 64, 65, 67, 68, 130, page] {
                    let hay = &first[page - len..];
                    let mut c = Counted::default();
                    assert_eq!(
                        w.find(hay, 0, &mut c),
                        reference(PATTERNS, hay, 0),
                        "{:?} len {len}",
                        w.kind()
                    );
                }
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
