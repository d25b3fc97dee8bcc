//! The literal prefilter: which lines can be ours at all.
//!
//! Every line the classifier reads contains one of [`candidate_literals`]. `scan` searches whole
//! buffers for them (Teddy/Aho-Corasick, as grep tools do) and never looks at a line without
//! one; the daemon asks the same question before the costlier message-start search, so both
//! read exactly the same lines.
//!
//! The search runs in two stages, as grep tools do with many literals. A SIMD searcher looks for
//! one short *anchor* per literal: the 4-byte window of the literal (Teddy's fingerprint length)
//! that is rarest in a reference sample of ordinary kernel lines ([`ORDINARY_SAMPLE`]). Only where
//! an anchor occurs is the whole literal compared around it. A literal costs wherever the
//! searcher's fingerprint matches ordinary text, not only where the literal matches: `state:D`
//! searched by its first bytes paid on every "entered forwarding state" and `/proc/N/status` of a
//! container host; by its anchor `te:D` it pays almost nowhere. The anchors are chosen when the
//! prefilter is built, so a literal added to the list (by hand or from a table) gets its rarest
//! window without anyone choosing it, and `tests/it/prefilter_cost.rs` fails when a literal has no
//! window rare enough.

use aho_corasick::{packed, AhoCorasick, Input, MatchKind};

/// The literals of the shapes Rust reads: the driver tags, and for the lines that carry none, the
/// GSP crash report, NVML texts, hung-task reports, the X server NVIDIA driver's errors, the Xid
/// events the Kubernetes device plugin logs and the API mismatch as NVIDIA's user-space components
/// report it. The shape table's literals are added to these by [`candidate_literals`].
pub const HAND_LITERALS: &[&str] = &[
    "NVRM",
    "SXid",
    "nvidia",
    "AER:",
    "PCIe Bus Error",
    "GSP task",
    "NVML",
    "nvmlDevice",
    "blocked for more than",
    "state:D",
    "Call Trace",
    "Call trace",
    "(EE)",
    "XidCriticalError",
    "API mismatch",
    "API Mismatch",
    // Mellanox's GPUDirect RDMA module, whose load failures name no NVIDIA tag.
    "nv_peer_mem",
    // Kernel crash headers: the task and frames after them say whether the crash is NVIDIA's.
    "BUG:",
    "general protection fault",
    // A kernel warning's header (`WARNING: CPU: 2 PID: 1090 at drivers/gpu/drm/drm_ioctl.c:143
    // ...`): a later line of the report may name the NVIDIA module it is about.
    "WARNING: CPU: ",
    // Firmware-first hardware error records (APEI), whose PCIe section may name a GPU.
    "[Hardware Error]: ",
    // Tegra's (Jetson's) integrated GPU driver, whose lines carry no NVRM or nvidia tag.
    "nvgpu: ",
    // nvidia-smi's "couldn't communicate with the NVIDIA driver" as management tools reword it.
    "communicate with the NVIDIA driver",
    // A field nvidia-smi could not read, padded as its GPU table prints it (npm's `ERR! ` has one
    // space). Not with the leading spaces: a literal starting with two spaces matches the start of
    // every padded timestamp and slowed the whole scan by a tenth.
    "ERR!  ",
    // The fabric manager daemon (`nv-fabricmanager[pid]:`), which names no nvidia tag.
    "fabricmanager",
    // Fabric Manager's own log file, whose records name no daemon: `[stamp] [ERROR] [tid N] ...`.
    // Only the two levels that can be findings.
    "] [ERROR] ",
    "] [WARNING] ",
];

/// Literals at least one of which every line we classify contains: [`HAND_LITERALS`] and the
/// literals of the built-in shape table's rows, generated from the table so the two cannot drift.
/// A table literal that holds a hand literal adds nothing (every line holding it holds the other)
/// and is left out, which keeps the searcher's pattern count, and its cost, down.
pub fn candidate_literals() -> &'static [&'static str] {
    static L: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    L.get_or_init(|| {
        let all = with_table_literals(
            HAND_LITERALS,
            crate::classify::table::Table::builtin()
                .prefilter_literals()
                .into_iter(),
        );
        in_search_order(all)
    })
}

/// The order the first literals are searched in: the one they had when all were written by hand.
/// Teddy puts patterns in buckets by their position, so the order decides which anchors share a
/// bucket and how often ordinary text stops the search; moving literals to the table keeps it, and
/// changing it is a decision for whoever measures the searcher. Only an order: a literal named
/// here that is no candidate is skipped (a test says so), and a candidate not named here follows,
/// in the generated order.
pub const SEARCH_ORDER: &[&str] = &[
    "NVRM",
    "SXid",
    "nvidia",
    "AER:",
    "PCIe Bus Error",
    "GSP task",
    "NVIDIA-SMI has failed",
    "NVML",
    "Unable to determine the device handle",
    "Unable to detect the device handle",
    "nvmlDevice",
    "No devices were found",
];

/// `all` with the literals of [`SEARCH_ORDER`] first, in its order.
fn in_search_order(all: Vec<&'static str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = SEARCH_ORDER
        .iter()
        .copied()
        .filter(|l| all.contains(l))
        .collect();
    out.extend(all.into_iter().filter(|l| !SEARCH_ORDER.contains(l)));
    out
}

/// `base` and those of `extra` that no literal already in the list is part of.
pub fn with_table_literals(
    base: &[&'static str],
    extra: impl Iterator<Item = &'static str>,
) -> Vec<&'static str> {
    let mut all = base.to_vec();
    for l in extra {
        if !all.iter().any(|h| l.contains(h)) {
            all.push(l);
        }
    }
    all
}

/// Ordinary kernel lines from public bug reports (no NVIDIA lines among them), the reference by
/// which anchors are chosen: the container-host chatter of `fixtures/ordinary/container-host.log`
/// and the corpus's harmless lines that hold no literal (`fixtures/ordinary/corpus-harmless.log`).
/// Both files name the page of every line.
pub const ORDINARY_SAMPLE: &[&str] = &[
    include_str!("../../fixtures/ordinary/container-host.log"),
    include_str!("../../fixtures/ordinary/corpus-harmless.log"),
];

/// Anchor length: Teddy's fingerprint is at most 4 bytes, so bytes past the fourth cost the same
/// as none, and every literal is at least this long (a test in `source::file` says so).
pub const ANCHOR_LEN: usize = 4;

/// The lines of [`ORDINARY_SAMPLE`] (not its comments or `@ URL` source lines).
pub fn ordinary_lines() -> impl Iterator<Item = &'static str> {
    ORDINARY_SAMPLE
        .iter()
        .flat_map(|s| s.lines())
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("@ "))
}

/// One literal's anchor: the literal is found by searching for `anchor`, which it holds at
/// `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anchor {
    pub literal: &'static str,
    pub anchor: &'static str,
    pub offset: usize,
}

/// How rare an anchor must be in the ordinary sample: in at most one line in 500 (0.2 %).
///
/// Why this bound: the SIMD search itself runs at several GB/s, a line of a kernel log is about
/// 130 bytes, so the search spends some 30-40 ns per line; one stop for verification (leaving the
/// vector loop, comparing the literal, re-entering) costs about as much. An anchor in one line in
/// 500 thus adds some 0.2 % per literal, and the 28 literals together stay under a few percent
/// even if all were that common. `state:D` searched by `stat` stopped in a third of a container
/// host's lines: that log scanned at 0.45 of ripgrep's speed, and at 0.71 with "state" and
/// "status" altered.
pub const MAX_ANCHOR_LINES_PER_MILLE: u32 = 2;

/// Whether `hits` lines of `total` is rare enough for an anchor.
pub fn is_rare(hits: u32, total: u32) -> bool {
    u64::from(hits) * 1000 <= u64::from(MAX_ANCHOR_LINES_PER_MILLE) * u64::from(total)
}

/// Chooses each literal's anchor: its first `ANCHOR_LEN` bytes when those are rare in the sample
/// (see [`is_rare`]), else of its `ANCHOR_LEN`-byte windows (on character boundaries),
/// the one that occurs in the fewest lines of `sample`; among equally rare ones, the one whose
/// bytes are rarest in the sample (rare bytes also make Teddy's nybble masks alias less), then the
/// earliest. A literal shorter than `ANCHOR_LEN` is its own anchor.
pub fn choose_anchors<'a>(
    literals: &[&'static str],
    sample: impl Iterator<Item = &'a str>,
) -> Vec<Anchor> {
    use std::collections::HashMap;
    let windows = |l: &'static str| {
        (0..=l.len().saturating_sub(ANCHOR_LEN))
            .filter(move |&i| {
                l.is_char_boundary(i) && l.is_char_boundary((i + ANCHOR_LEN).min(l.len()))
            })
            .map(move |i| (i, &l[i..(i + ANCHOR_LEN).min(l.len())]))
    };
    let mut lines_with: HashMap<&[u8], u32> = HashMap::new();
    for l in literals {
        for (_, w) in windows(l) {
            lines_with.insert(w.as_bytes(), 0);
        }
    }
    // The first two bytes of every window, as bits: most of the sample's windows start like none
    // of them, and this test is far cheaper than hashing the window (the prefilter is built at
    // every start, and hashing every window of the sample was a tenth of a short scan's time).
    let mut starts = vec![0u64; 1024];
    let pair = |w: &[u8]| usize::from(w[0]) << 8 | usize::from(w.get(1).copied().unwrap_or(0));
    for w in lines_with.keys() {
        if w.len() >= 2 {
            starts[pair(w) >> 6] |= 1 << (pair(w) & 63);
        }
    }
    let mut byte_freq = [0u64; 256];
    let mut total_lines = 0u32;
    for line in sample {
        total_lines += 1;
        let b = line.as_bytes();
        for &c in b {
            byte_freq[c as usize] += 1;
        }
        let mut seen: Vec<&[u8]> = Vec::new();
        for w in b.windows(ANCHOR_LEN) {
            if starts[pair(w) >> 6] & (1 << (pair(w) & 63)) == 0 {
                continue;
            }
            if let Some(n) = lines_with.get_mut(w) {
                if !seen.contains(&w) {
                    seen.push(w);
                    *n += 1;
                }
            }
        }
    }
    let total = total_lines.max(1);
    literals
        .iter()
        .map(|&l| {
            let head = &l[..ANCHOR_LEN.min(l.len())];
            // The literal's own first bytes when they are rare: Teddy's buckets are filled by the
            // patterns' leading bytes, and the leading bytes of the distinct literals are spread
            // the widest (measured: a set of mid-word anchors searched a tenth slower).
            let (offset, anchor) = if is_rare(lines_with[head.as_bytes()], total) {
                (0, head)
            } else {
                windows(l)
                    .min_by_key(|&(i, w)| {
                        let bytes: u64 = w.bytes().map(|c| byte_freq[c as usize]).sum();
                        (lines_with[w.as_bytes()], bytes, i)
                    })
                    .unwrap_or((0, l))
            };
            Anchor {
                literal: l,
                anchor,
                offset,
            }
        })
        .collect()
}

/// Buckets of the packed (Teddy) searcher for a few dozen patterns ("slim" Teddy).
const TEDDY_BUCKETS: usize = 8;

/// Orders the distinct anchors so that the packed searcher's buckets hold anchors whose bytes
/// look alike, as the ordinary sample tells.
///
/// Why: Teddy finds candidates by nybble masks per bucket and byte position, and a bucket's
/// masks are the union of its anchors' nybbles, so two unlike anchors in one bucket also match
/// every mix of their nybbles. With the anchors in list order such mixes stopped the search in
/// about one ordinary line in five (each stop a verification of the bucket); grouped, in a few
/// in a hundred, and the search of an ordinary log ran nearly as fast as for three literals. The
/// searcher fills its buckets round-robin by pattern id (`aho-corasick`'s Teddy puts id `i` in
/// bucket `7 - i % 8`, and an anchor whose low nybbles equal an earlier one's into that one's
/// bucket), so the order is the grouping. Should the searcher fill its buckets otherwise, the
/// order costs speed only, never a match.
///
/// The grouping is greedy: the anchors whose own masks pass the most windows of the sample come
/// first, each into the bucket (with room) where it adds the fewest passing windows. Windows
/// that pass no bucket whatever the grouping are dropped first, so it takes well under a
/// millisecond.
fn teddy_order(anchors: &[&'static str], sample: impl Iterator<Item = &'static str>) -> Vec<usize> {
    type Masks = [(u16, u16); ANCHOR_LEN];
    let n = anchors.len();
    if n <= TEDDY_BUCKETS || anchors.iter().any(|a| a.len() != ANCHOR_LEN) {
        return (0..n).collect();
    }
    let masks_of = |a: &str| -> Masks {
        let mut m = [(0u16, 0u16); ANCHOR_LEN];
        for (j, b) in a.bytes().enumerate() {
            m[j] = (1 << (b >> 4), 1 << (b & 15));
        }
        m
    };
    let union = |a: &Masks, b: &Masks| -> Masks {
        let mut m = *a;
        for j in 0..ANCHOR_LEN {
            m[j] = (m[j].0 | b[j].0, m[j].1 | b[j].1);
        }
        m
    };
    let passes = |m: &Masks, w: &[u8; ANCHOR_LEN]| {
        (0..ANCHOR_LEN)
            .all(|j| m[j].0 & (1 << (w[j] >> 4)) != 0 && m[j].1 & (1 << (w[j] & 15)) != 0)
    };
    // Anchors whose low nybbles are all equal share a bucket whatever their ids: one unit, led by
    // its first anchor; the others come after every leader, so they move no leader's bucket.
    let lo = |a: &str| -> Vec<u8> { a.bytes().map(|b| b & 15).collect() };
    let mut units: Vec<(Vec<usize>, Masks)> = Vec::new();
    for (i, a) in anchors.iter().enumerate() {
        match units.iter_mut().find(|u| lo(anchors[u.0[0]]) == lo(a)) {
            Some(u) => {
                u.0.push(i);
                u.1 = union(&u.1, &masks_of(a));
            }
            None => units.push((vec![i], masks_of(a))),
        }
    }
    let all = units
        .iter()
        .fold([(0u16, 0u16); ANCHOR_LEN], |m, u| union(&m, &u.1));
    let mut windows: Vec<[u8; ANCHOR_LEN]> = sample
        .flat_map(|l| l.as_bytes().windows(ANCHOR_LEN))
        .filter_map(|w| <[u8; ANCHOR_LEN]>::try_from(w).ok())
        .filter(|w| passes(&all, w))
        .collect();
    windows.sort_unstable();
    let mut weighted: Vec<([u8; ANCHOR_LEN], u32)> = Vec::new();
    for w in windows {
        match weighted.last_mut() {
            Some((last, c)) if *last == w => *c += 1,
            _ => weighted.push((w, 1)),
        }
    }
    let cost = |m: &Masks| -> u64 {
        weighted
            .iter()
            .filter(|(w, _)| passes(m, w))
            .map(|&(_, c)| u64::from(c))
            .sum()
    };
    // Leader k (pattern id k) lands in bucket `TEDDY_BUCKETS - 1 - k % TEDDY_BUCKETS`.
    let m = units.len();
    let bucket_of = |k: usize| TEDDY_BUCKETS - 1 - k % TEDDY_BUCKETS;
    let mut room = [0usize; TEDDY_BUCKETS];
    for k in 0..m {
        room[bucket_of(k)] += 1;
    }
    let mut by_cost: Vec<(u64, usize)> = units
        .iter()
        .enumerate()
        .map(|(i, u)| (cost(&u.1), i))
        .collect();
    by_cost.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut buckets: Vec<(Masks, u64, Vec<usize>)> =
        vec![([(0, 0); ANCHOR_LEN], 0, Vec::new()); TEDDY_BUCKETS];
    for &(_, u) in &by_cost {
        let best = (0..TEDDY_BUCKETS)
            .filter(|&b| buckets[b].2.len() < room[b])
            .map(|b| {
                let joined = union(&buckets[b].0, &units[u].1);
                let c = cost(&joined);
                (c - buckets[b].1.min(c), b, joined, c)
            })
            .min_by_key(|&(added, b, _, _)| (added, b));
        let Some((_, b, joined, c)) = best else {
            return (0..n).collect();
        };
        buckets[b] = (joined, c, std::mem::take(&mut buckets[b].2));
        buckets[b].2.push(u);
    }
    let mut next = [0usize; TEDDY_BUCKETS];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for k in 0..m {
        let b = bucket_of(k);
        let Some(&u) = buckets[b].2.get(next[b]) else {
            return (0..n).collect();
        };
        next[b] += 1;
        order.push(units[u].0[0]);
    }
    for (idx, _) in &units {
        order.extend(idx[1..].iter().copied());
    }
    order
}

/// The first stage: a packed (Teddy) searcher where the CPU has one, Aho-Corasick elsewhere.
enum Stage1 {
    Packed(packed::Searcher),
    Ac(AhoCorasick),
}

/// The literal prefilter.
pub struct Prefilter {
    stage1: Stage1,
    /// Per distinct anchor (the first stage's pattern id): the literals it stands for, with the
    /// anchor's offset in each.
    verify: Vec<Vec<(&'static [u8], usize)>>,
    anchors: Vec<Anchor>,
}

impl Default for Prefilter {
    fn default() -> Self {
        Self::new()
    }
}

impl Prefilter {
    pub fn new() -> Self {
        Self::with_literals(candidate_literals())
    }

    /// A prefilter for other literals (the cost test builds one per candidate list).
    pub fn with_literals(literals: &[&'static str]) -> Self {
        let anchors = choose_anchors(literals, ordinary_lines());
        let mut distinct: Vec<&'static str> = Vec::new();
        let mut verify: Vec<Vec<(&'static [u8], usize)>> = Vec::new();
        for a in &anchors {
            let id = match distinct.iter().position(|d| *d == a.anchor) {
                Some(id) => id,
                None => {
                    distinct.push(a.anchor);
                    verify.push(Vec::new());
                    distinct.len() - 1
                }
            };
            verify[id].push((a.literal.as_bytes(), a.offset));
        }
        let order = teddy_order(&distinct, ordinary_lines());
        let distinct: Vec<&'static str> = order.iter().map(|&i| distinct[i]).collect();
        let verify: Vec<Vec<(&'static [u8], usize)>> = order
            .iter()
            .map(|&i| std::mem::take(&mut verify[i]))
            .collect();
        // Leftmost-first: which anchor matched at a position is decided by the verifier, and
        // distinct anchors of one length cannot match at the same position, so none is lost.
        let stage1 = match packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            .builder()
            .extend(&distinct)
            .build()
        {
            Some(s) => Stage1::Packed(s),
            None => Stage1::Ac(
                AhoCorasick::builder()
                    .match_kind(MatchKind::LeftmostFirst)
                    .build(&distinct)
                    .expect("built-in literals"),
            ),
        };
        Prefilter {
            stage1,
            verify,
            anchors,
        }
    }

    /// One prefilter for the whole process, built on first use.
    pub fn shared() -> &'static Prefilter {
        static P: std::sync::OnceLock<Prefilter> = std::sync::OnceLock::new();
        P.get_or_init(Prefilter::new)
    }

    /// Each literal's anchor, as the first stage searches for it.
    pub fn anchors(&self) -> &[Anchor] {
        &self.anchors
    }

    /// Whether a line (or any buffer) holds a candidate literal.
    pub fn is_candidate(&self, hay: &[u8]) -> bool {
        self.find_from(hay, 0).is_some()
    }

    /// The first anchor match at or after `from`: (position, first-stage pattern id).
    #[inline]
    fn anchor_from(&self, hay: &[u8], from: usize) -> Option<(usize, usize)> {
        match &self.stage1 {
            Stage1::Packed(s) => s
                .find_in(hay, aho_corasick::Span::from(from..hay.len()))
                .map(|m| (m.start(), m.pattern().as_usize())),
            Stage1::Ac(ac) => ac
                .find(Input::new(hay).span(from..hay.len()))
                .map(|m| (m.start(), m.pattern().as_usize())),
        }
    }

    /// Where a candidate literal at or after `from` starts, in the first line (after `from`) that
    /// holds one. It is the leftmost literal of that line's anchors, which is all `scan` needs:
    /// a literal holds no newline, so the anchor found first lies in the first line that holds a
    /// literal.
    pub fn find_from(&self, hay: &[u8], from: usize) -> Option<usize> {
        let mut at = from;
        while at < hay.len() {
            let (pos, id) = self.anchor_from(hay, at)?;
            for &(lit, off) in &self.verify[id] {
                if pos >= from + off {
                    let s = pos - off;
                    if hay[s..].starts_with(lit) {
                        return Some(s);
                    }
                }
            }
            at = pos + 1;
        }
        None
    }

    /// How many times the first stage stops in `hay` (anchor matches, whether the literal is
    /// there or not): the work the prefilter does on top of the SIMD search itself.
    pub fn anchor_hits(&self, hay: &[u8]) -> usize {
        let mut n = 0;
        let mut at = 0;
        while let Some((pos, _)) = self.anchor_from(hay, at) {
            n += 1;
            at = pos + 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distinct_anchors() -> Vec<&'static str> {
        let mut d: Vec<&'static str> = Vec::new();
        for a in choose_anchors(candidate_literals(), ordinary_lines()) {
            if !d.contains(&a.anchor) {
                d.push(a.anchor);
            }
        }
        d
    }

    /// The bucket order is a permutation of the anchors: it moves them, never drops one.
    #[test]
    fn the_teddy_order_is_a_permutation() {
        let d = distinct_anchors();
        let mut order = teddy_order(&d, ordinary_lines());
        order.sort_unstable();
        assert_eq!(order, (0..d.len()).collect::<Vec<_>>());
        // Few anchors, or none of the sample: the list order.
        assert_eq!(teddy_order(&d[..3], ordinary_lines()), [0, 1, 2]);
        assert_eq!(
            teddy_order(&d, std::iter::empty()).len(),
            d.len(),
            "an empty sample still orders every anchor"
        );
    }

    /// Every literal is found wherever it stands, whatever bucket its anchor went to.
    #[test]
    fn every_literal_is_found_in_any_position() {
        let pre = Prefilter::new();
        for l in candidate_literals() {
            for pad in ["", "x", "[  12.345678] ", "abc def "] {
                let line = format!("{pad}{l} tail");
                assert_eq!(
                    pre.find_from(line.as_bytes(), 0),
                    Some(pad.len()),
                    "{line:?}"
                );
            }
        }
        assert_eq!(pre.find_from(b"nothing of ours here", 0), None);
    }

    /// The grouping lowers what ordinary text costs the search: fewer windows of the sample pass
    /// some bucket's masks than with the anchors in list order.
    #[test]
    fn the_teddy_order_groups_alike_anchors() {
        let d = distinct_anchors();
        let passing = |order: &[usize]| -> usize {
            // The buckets as the searcher fills them: round-robin by id, low-nybble twins together.
            let mut buckets: Vec<Vec<&str>> = vec![Vec::new(); TEDDY_BUCKETS];
            let mut twin: Vec<(Vec<u8>, usize)> = Vec::new();
            for (id, &i) in order.iter().enumerate() {
                let lo: Vec<u8> = d[i].bytes().map(|b| b & 15).collect();
                let b = match twin.iter().find(|t| t.0 == lo) {
                    Some(t) => t.1,
                    None => {
                        let b = TEDDY_BUCKETS - 1 - id % TEDDY_BUCKETS;
                        twin.push((lo, b));
                        b
                    }
                };
                buckets[b].push(d[i]);
            }
            let passes = |bucket: &[&str], w: &[u8]| {
                (0..ANCHOR_LEN).all(|j| {
                    bucket.iter().any(|a| a.as_bytes()[j] >> 4 == w[j] >> 4)
                        && bucket.iter().any(|a| a.as_bytes()[j] & 15 == w[j] & 15)
                })
            };
            ordinary_lines()
                .flat_map(|l| l.as_bytes().windows(ANCHOR_LEN))
                .filter(|w| buckets.iter().any(|b| !b.is_empty() && passes(b, w)))
                .count()
        };
        let listed: Vec<usize> = (0..d.len()).collect();
        let grouped = teddy_order(&d, ordinary_lines());
        let (before, after) = (passing(&listed), passing(&grouped));
        assert!(
            after * 2 < before,
            "grouped {after} windows, listed {before}"
        );
    }
}
