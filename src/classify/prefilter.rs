//! The literal prefilter: which lines can be ours at all.
//!
//! Every line the classifier reads contains one of [`candidate_literals`]. `scan` searches whole
//! buffers for them (a SIMD search of its own, Teddy or Aho-Corasick, as grep tools do) and never
//! looks at a line without one; the daemon asks the same question before the costlier
//! message-start search, so both read exactly the same lines.
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

use super::wide::{Counted, Wide};

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
    ") detected on PCI:",
    "API mismatch",
    "API Mismatch",
    // Mellanox's GPUDirect RDMA module, whose load failures name no NVIDIA tag.
    "nv_peer_mem",
    // Kernel crash headers: the task and frames after them say whether the crash is NVIDIA's.
    // Every header the trace reader knows holds one of these (a test says so): `kernel BUG at`,
    // without the colon, was never read. Its literal is `BUG at `, whose anchor `BUG ` costs the
    // buckets less than ` BUG` (30 passes on the ordinary sample against 41).
    "BUG:",
    "BUG at ",
    "general protection fault",
    // An oops's die line (`Oops: 0000 [#1] PREEMPT SMP NOPTI`, `divide error: 0000 [#1] SMP`):
    // the header of a report whose `BUG:` line was cut off, or that has none.
    crate::classify::shapes::DIE_LITERAL,
    // arm64's oops header, which holds no `BUG:`.
    "Unable to handle kernel",
    // A crash report's instruction pointer in kernel code (x86's `RIP: 0010:` and old `IP: [<`,
    // arm64's `pc : `): where a crash that names no NVIDIA module happened, which decides whether
    // the modules it was linked with make it the driver's. Not `RIP: 0033:`, the user-space
    // address every hung task's dump prints.
    "RIP: 0010:",
    "IP: [<",
    "pc : ",
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
/// which anchors are chosen: the container-host chatter of `fixtures/ordinary/container-host.log`,
/// the server chatter of `fixtures/ordinary/server-chatter.log` and the corpus's harmless lines that hold no literal (`fixtures/ordinary/corpus-harmless.log`).
/// Both files name the page of every line.
pub const ORDINARY_SAMPLE: &[&str] = &[
    include_str!("../../fixtures/ordinary/container-host.log"),
    include_str!("../../fixtures/ordinary/server-chatter.log"),
    include_str!("../../fixtures/ordinary/corpus-harmless.log"),
];

/// Anchor length: Teddy's fingerprint is at most 4 bytes, so bytes past the fourth cost the same
/// as none, and every literal is at least this long (a test in `source::file` says so).
///
/// Why not 3, as ripgrep's searcher uses for `NVRM|SXid|nvidia`: three masks step faster (in
/// memory, one core, bench/scan.sh's ordinary log: three literals 25.7 ms with 4-byte
/// fingerprints, 19.3 ms with 3), but 3-byte windows of the literals alias far more in 8 buckets:
/// with the anchors chosen again for 3 bytes the ordinary log's search stopped 406,628 times
/// instead of 4,676 and took 107.9 ms instead of 28.0 ms (the GPU-host log 66.6 ms instead of
/// 47.0 ms).
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

/// Chooses each literal's anchor, as few distinct ones as the literals allow: first a window no
/// sample line holds that several literals share stands for all of them (`IA d` for the two tool
/// messages that name "the NVIDIA driver"; each distinct anchor is one more pattern of the
/// searcher, which crowds its buckets). Then, for each other literal, of its `ANCHOR_LEN`-byte
/// windows (on character boundaries) the one in the fewest lines of `sample`; among equally rare
/// ones its first bytes, then the one whose bytes are rarest in the sample (rare bytes also make
/// Teddy's nybble masks alias less), then the earliest. A literal shorter than `ANCHOR_LEN` is its
/// own anchor.
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
    for line in sample {
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
    let unseen = |w: &str| lines_with[w.as_bytes()] == 0;
    let bytes_of = |w: &str| -> u64 { w.bytes().map(|c| byte_freq[c as usize]).sum() };
    // First the windows several literals share: each such window is one pattern of the searcher
    // for all of them. Greedy cover, the window held by the most literals not yet anchored first
    // (then a literal's own first bytes, then the rarest bytes); only windows no sample line
    // holds, and only while a window serves two literals or more. Not merely rare ones: a sample
    // of some hundred lines cannot tell one line in 500 from one in 50 (`fail` was in one sample
    // line, and in a tenth of the bench log's).
    let mut chosen: Vec<Option<(usize, &'static str)>> = vec![None; literals.len()];
    loop {
        let mut best: Option<((usize, bool, u64), &'static str)> = None;
        for &l in literals {
            for (_, w) in windows(l) {
                if w.len() < ANCHOR_LEN || !unseen(w) {
                    continue;
                }
                let holders = literals
                    .iter()
                    .zip(&chosen)
                    .filter(|(o, c)| c.is_none() && o.contains(w))
                    .count();
                let head = literals.iter().any(|o| o.starts_with(w));
                let key = (holders, head, u64::MAX - bytes_of(w));
                if best.is_none_or(|b| key > b.0) {
                    best = Some((key, w));
                }
            }
        }
        let Some((_, w)) = best.filter(|b| b.0 .0 >= 2) else {
            break;
        };
        for (l, c) in literals.iter().zip(chosen.iter_mut()) {
            if c.is_none() {
                if let Some(at) = l.find(w) {
                    *c = Some((at, w));
                }
            }
        }
    }
    literals
        .iter()
        .zip(chosen)
        .map(|(&l, shared)| {
            // Else the window in the fewest sample lines; among those, the literal's own first
            // bytes: Teddy's buckets are filled by the patterns' leading bytes, and the leading
            // bytes of the distinct literals are spread the widest (measured: a set of mid-word
            // anchors searched a tenth slower); then the rarest bytes, then the earliest.
            let (offset, anchor) = shared.unwrap_or_else(|| {
                windows(l)
                    .min_by_key(|&(i, w)| (lines_with[w.as_bytes()], i != 0, bytes_of(w), i))
                    .unwrap_or((0, l))
            });
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

/// How many starting orders the bucket grouping tries ([`teddy_order`]).
const RESTARTS: usize = 16;

/// Most distinct anchors the first stage may have: the packed searcher refuses more than 64
/// patterns, and the scan would fall to a DFA several times slower. Below that, what an anchor
/// costs is how often the buckets it shares pass ordinary text, which
/// `tests/it/prefilter_cost.rs` bounds on the ordinary sample. Measured on bench/scan.sh's
/// ordinary log (one core, search alone, best of five): 33 anchors in the bucket order below,
/// 102 ms; three literals, 103 ms; the 33 in list order, 118 ms.
pub const MAX_ANCHORS: usize = 64;

/// A bucket's masks as Teddy keeps them, per byte position the high and the low nybbles it
/// admits: one 16-bit lane per position, high nybbles in `.0`, low ones in `.1`. A window is the
/// same with one bit per lane, so it passes a bucket when both ANDs keep a bit in every lane (four
/// bits each), and a plan tests thousands of windows in microseconds.
type Masks = (u64, u64);
const _: () = assert!(ANCHOR_LEN * 16 <= 64);

/// The masks of one anchor or window of `ANCHOR_LEN` bytes.
fn masks_of(a: &[u8]) -> Masks {
    a.iter().enumerate().fold((0, 0), |m, (j, &b)| {
        (
            m.0 | 1 << (16 * j + usize::from(b >> 4)),
            m.1 | 1 << (16 * j + usize::from(b & 15)),
        )
    })
}

fn union(a: &Masks, b: &Masks) -> Masks {
    (a.0 | b.0, a.1 | b.1)
}

/// Whether window `w` passes a bucket of masks `m`.
fn passes(m: &Masks, w: &Masks) -> bool {
    (m.0 & w.0).count_ones() as usize == ANCHOR_LEN
        && (m.1 & w.1).count_ones() as usize == ANCHOR_LEN
}

/// The bucket of each pattern (by id) as the slim searcher fills them: round-robin by id from
/// the last, a pattern whose low nybbles equal an earlier one's into that one's bucket.
fn buckets_by_id<'a>(patterns: impl Iterator<Item = &'a [u8]>) -> Vec<usize> {
    let mut twin: Vec<(&[u8], usize)> = Vec::new();
    patterns
        .enumerate()
        .map(|(id, p)| {
            let p = &p[..p.len().min(ANCHOR_LEN)];
            let same_low = |t: &&(&[u8], usize)| {
                t.0.len() == p.len() && t.0.iter().zip(p).all(|(a, b)| a & 15 == b & 15)
            };
            match twin.iter().find(same_low) {
                Some(t) => t.1,
                None => {
                    let b = TEDDY_BUCKETS - 1 - id % TEDDY_BUCKETS;
                    twin.push((p, b));
                    b
                }
            }
        })
        .collect()
}

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
    let n = anchors.len();
    if n <= TEDDY_BUCKETS || anchors.iter().any(|a| a.len() != ANCHOR_LEN) {
        return (0..n).collect();
    }
    // Anchors whose low nybbles are all equal share a bucket whatever their ids: one unit, led by
    // its first anchor; the others come after every leader, so they move no leader's bucket.
    let lo = |a: &str| -> Vec<u8> { a.bytes().map(|b| b & 15).collect() };
    let mut units: Vec<(Vec<usize>, Masks)> = Vec::new();
    for (i, a) in anchors.iter().enumerate() {
        match units.iter_mut().find(|u| lo(anchors[u.0[0]]) == lo(a)) {
            Some(u) => {
                u.0.push(i);
                u.1 = union(&u.1, &masks_of(a.as_bytes()));
            }
            None => units.push((vec![i], masks_of(a.as_bytes()))),
        }
    }
    let all = units.iter().fold((0, 0), |m, u| union(&m, &u.1));
    // Per position, the bytes `all` admits: most windows fail at their first byte.
    let mut admit = [[false; 256]; ANCHOR_LEN];
    for (j, row) in admit.iter_mut().enumerate() {
        for (b, ok) in row.iter_mut().enumerate() {
            *ok = all.0 >> (16 * j + (b >> 4)) & 1 == 1 && all.1 >> (16 * j + (b & 15)) & 1 == 1;
        }
    }
    let mut windows: Vec<Masks> = sample
        .flat_map(|l| l.as_bytes().windows(ANCHOR_LEN))
        .filter(|w| w.iter().enumerate().all(|(j, &b)| admit[j][usize::from(b)]))
        .map(masks_of)
        .collect();
    windows.sort_unstable();
    let mut weighted: Vec<(Masks, u32)> = Vec::new();
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
    let mask_of = |members: &[usize]| members.iter().fold((0, 0), |m, &u| union(&m, &units[u].1));
    type Buckets = Vec<(Masks, u64, Vec<usize>)>;
    // One grouping: greedy in the order `seq`, each unit into the bucket (with room) where it
    // adds the fewest passing windows, then swaps.
    let group = |seq: &[usize]| -> Option<Buckets> {
        let mut buckets: Buckets = vec![((0, 0), 0, Vec::new()); TEDDY_BUCKETS];
        for &u in seq {
            let (_, b, joined, c) = (0..TEDDY_BUCKETS)
                .filter(|&b| buckets[b].2.len() < room[b])
                .map(|b| {
                    let joined = union(&buckets[b].0, &units[u].1);
                    let c = cost(&joined);
                    (c - buckets[b].1.min(c), b, joined, c)
                })
                .min_by_key(|&(added, b, _, _)| (added, b))?;
            buckets[b] = (joined, c, std::mem::take(&mut buckets[b].2));
            buckets[b].2.push(u);
        }
        // Then swaps: a unit of one bucket for a unit of another wherever that lowers the two
        // buckets' cost, until none does (the greedy's first choices are made before it knows
        // what joins them: `cman`, `lost`, `oROM` and `nvc.` in one bucket passed "load" and
        // "lood").
        for _ in 0..8 {
            let mut improved = false;
            for a in 0..TEDDY_BUCKETS {
                for b in a + 1..TEDDY_BUCKETS {
                    // Whatever the two buckets swap, their masks stay within the union of both,
                    // so only the windows passing that union can count: a few dozen of thousands.
                    let both = union(&buckets[a].0, &buckets[b].0);
                    let pool: Vec<(Masks, u32)> = weighted
                        .iter()
                        .filter(|(w, _)| passes(&both, w))
                        .copied()
                        .collect();
                    let pool_cost = |m: &Masks| -> u64 {
                        pool.iter()
                            .filter(|(w, _)| passes(m, w))
                            .map(|&(_, c)| u64::from(c))
                            .sum()
                    };
                    for i in 0..buckets[a].2.len() {
                        for j in 0..buckets[b].2.len() {
                            let (ui, uj) = (buckets[a].2[i], buckets[b].2[j]);
                            buckets[a].2[i] = uj;
                            buckets[b].2[j] = ui;
                            let (xa, xb) = (mask_of(&buckets[a].2), mask_of(&buckets[b].2));
                            let (ca, cb) = (pool_cost(&xa), pool_cost(&xb));
                            if ca + cb < buckets[a].1 + buckets[b].1 {
                                (buckets[a].0, buckets[a].1) = (xa, ca);
                                (buckets[b].0, buckets[b].1) = (xb, cb);
                                improved = true;
                            } else {
                                buckets[a].2[i] = ui;
                                buckets[b].2[j] = uj;
                            }
                        }
                    }
                }
            }
            if !improved {
                break;
            }
        }
        Some(buckets)
    };
    // Greedy and swaps end in a local optimum that one more anchor can move far (a row's new
    // anchor once took the ordinary sample from 23 bucket passes to 37): so the grouping is also
    // tried from a few fixed shuffles of the costliest-first order, and the cheapest kept. The
    // shuffles are a fixed sequence, so the plan is the same at every run.
    let first: Vec<usize> = by_cost.iter().map(|&(_, u)| u).collect();
    let mut best: Option<(u64, Buckets)> = None;
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    for attempt in 0..RESTARTS {
        let mut seq = first.clone();
        if attempt > 0 {
            // A Fisher-Yates shuffle driven by a fixed xorshift sequence.
            for i in (1..seq.len()).rev() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                seq.swap(i, (state % (i as u64 + 1)) as usize);
            }
        }
        let Some(b) = group(&seq) else {
            return (0..n).collect();
        };
        let total = b.iter().map(|x| x.1).sum::<u64>();
        if best.as_ref().is_none_or(|(t, _)| total < *t) {
            best = Some((total, b));
        }
    }
    let Some((_, buckets)) = best else {
        return (0..n).collect();
    };
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

/// What the prefilter is built from: each literal's anchor, and the order of the distinct anchors
/// (in order of first appearance) that groups the searcher's buckets.
///
/// Choosing them reads every window of the ordinary sample several times, some milliseconds at
/// every start of every process; for the built-in literals they are chosen once, when the code
/// changes, and kept in `prefilter_plan.rs` (a test fails when that file is not what
/// [`Plan::for_literals`] chooses now, and `XIDWATCH_BLESS=1` rewrites it). Site rows with
/// literals of their own get theirs chosen at load.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub anchors: Vec<Anchor>,
    pub order: Vec<usize>,
}

#[rustfmt::skip]
#[path = "prefilter_plan.rs"]
mod plan;

impl Plan {
    /// Chooses the plan for `literals` against the ordinary sample.
    ///
    /// The built-in literals followed by a site's own (its `[[classify.shape]]` rows) keep the
    /// kept plan and add the site's anchors after it: a site row costs its own anchor, not a new
    /// grouping of every bucket (which also took a third of a second at every load).
    pub fn for_literals(literals: &[&'static str]) -> Plan {
        if literals.len() > plan::LITERALS.len() && literals.starts_with(plan::LITERALS) {
            return Plan::built_in().extended(&literals[plan::LITERALS.len()..]);
        }
        let anchors = choose_anchors(literals, ordinary_lines());
        let mut distinct: Vec<&'static str> = Vec::new();
        for a in &anchors {
            if !distinct.contains(&a.anchor) {
                distinct.push(a.anchor);
            }
        }
        let order = teddy_order(&distinct, ordinary_lines());
        Plan { anchors, order }
    }

    /// This plan with `extra` literals added: one that holds an anchor already searched is found
    /// by it; each other gets its own anchor, chosen as [`choose_anchors`] would, searched after
    /// the plan's own (their buckets stay as they are).
    fn extended(mut self, extra: &[&'static str]) -> Plan {
        let mut distinct: Vec<&'static str> = Vec::new();
        for a in &self.anchors {
            if !distinct.contains(&a.anchor) {
                distinct.push(a.anchor);
            }
        }
        let first_new = distinct.len();
        for &literal in extra {
            let found = distinct
                .iter()
                .find_map(|&d| literal.find(d).map(|offset| (d, offset)));
            let (anchor, offset) = match found {
                Some(f) => f,
                None => {
                    let own = choose_anchors(&[literal], ordinary_lines());
                    let Some(a) = own.first() else { continue };
                    distinct.push(a.anchor);
                    (a.anchor, a.offset)
                }
            };
            self.anchors.push(Anchor {
                literal,
                anchor,
                offset,
            });
        }
        if distinct.len() > first_new {
            self.order = place_new(&distinct, std::mem::take(&mut self.order), first_new);
        }
        self
    }

    /// The plan kept for the built-in literals.
    fn built_in() -> Plan {
        Plan {
            anchors: plan::LITERALS
                .iter()
                .zip(plan::ANCHORS)
                .map(|(&literal, &(anchor, offset))| Anchor {
                    literal,
                    anchor,
                    offset,
                })
                .collect(),
            order: plan::ORDER.to_vec(),
        }
    }

    /// The plan as the source of `prefilter_plan.rs`.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "//! The built-in prefilter's plan, as `Plan::for_literals` chooses it for the built-in\n\
             //! literals. Generated: `XIDWATCH_BLESS=1 cargo test --lib prefilter` rewrites it, and\n\
             //! `prefilter::tests::the_kept_plan_is_the_chosen_one` fails when it is not current.\n\n\
             /// The literals, in the order `candidate_literals` gives.\n\
             pub const LITERALS: &[&str] = &[\n",
        );
        for a in &self.anchors {
            out.push_str(&format!("    {:?},\n", a.literal));
        }
        out.push_str("];\n\n/// Per literal: its anchor and the anchor's offset in it.\npub const ANCHORS: &[(&str, usize)] = &[\n");
        for a in &self.anchors {
            out.push_str(&format!("    ({:?}, {}),\n", a.anchor, a.offset));
        }
        out.push_str("];\n\n/// The distinct anchors (in order of first appearance) in the searcher's order.\npub const ORDER: &[usize] = &[");
        let order: Vec<String> = self.order.iter().map(usize::to_string).collect();
        out.push_str(&order.join(", "));
        out.push_str("];\n");
        out
    }
}

/// `order` (a searcher's order of `distinct[..first_new]`) with each anchor from `first_new` on
/// placed, in turn, where it costs the fewest bucket passes on the ordinary sample: at the end,
/// or at a position whose anchor then moves to the end. A bucket is chosen by position, so
/// appending alone put a site's anchor beside unlike ones (one literal took the sample from 17
/// passes to 107).
fn place_new(distinct: &[&'static str], mut order: Vec<usize>, first_new: usize) -> Vec<usize> {
    if distinct.iter().any(|a| a.len() != ANCHOR_LEN) {
        order.extend(first_new..distinct.len());
        return order;
    }
    // The sample's windows once, those that pass the union of every anchor (no other can pass a
    // bucket), each with how often it occurs.
    let all = distinct
        .iter()
        .fold((0, 0), |m, a| union(&m, &masks_of(a.as_bytes())));
    let mut windows: Vec<Masks> = ordinary_lines()
        .flat_map(|l| l.as_bytes().windows(ANCHOR_LEN))
        .map(masks_of)
        .filter(|w| passes(&all, w))
        .collect();
    windows.sort_unstable();
    let mut weighted: Vec<(Masks, usize)> = Vec::new();
    for w in windows {
        match weighted.last_mut() {
            Some((last, c)) if *last == w => *c += 1,
            _ => weighted.push((w, 1)),
        }
    }
    let cost = |order: &[usize]| -> usize {
        let ids = buckets_by_id(order.iter().map(|&i| distinct[i].as_bytes()));
        let mut buckets = [(0u64, 0u64); TEDDY_BUCKETS];
        for (&b, &i) in ids.iter().zip(order) {
            buckets[b] = union(&buckets[b], &masks_of(distinct[i].as_bytes()));
        }
        weighted
            .iter()
            .filter(|(w, _)| buckets.iter().any(|b| b.0 != 0 && passes(b, w)))
            .map(|&(_, c)| c)
            .sum()
    };
    for new in first_new..distinct.len() {
        let mut appended = order.clone();
        appended.push(new);
        let mut best = (cost(&appended), appended);
        for p in 0..order.len() {
            let mut o = order.clone();
            o.push(o[p]);
            o[p] = new;
            let c = cost(&o);
            if c < best.0 {
                best = (c, o);
            }
        }
        order = best.1;
    }
    order
}

/// How many `ANCHOR_LEN`-byte windows of `hay` pass one of the slim packed searcher's buckets
/// for `patterns` (in pattern-id order): each such window stops the SIMD loop to verify the
/// bucket, so this is what ordinary text costs the first stage beyond its stride. The buckets as
/// the searcher fills them: round-robin by id from the last, low-nybble twins together.
pub fn bucket_passes(patterns: &[&str], hay: &[u8]) -> usize {
    let mut buckets: Vec<Vec<&[u8]>> = vec![Vec::new(); TEDDY_BUCKETS];
    for (b, p) in buckets_by_id(patterns.iter().map(|p| p.as_bytes()))
        .into_iter()
        .zip(patterns)
    {
        buckets[b].push(p.as_bytes());
    }
    let passes = |bucket: &[&[u8]], w: &[u8]| {
        (0..ANCHOR_LEN).all(|j| {
            bucket
                .iter()
                .any(|a| a.get(j).is_some_and(|x| x >> 4 == w[j] >> 4))
                && bucket
                    .iter()
                    .any(|a| a.get(j).is_some_and(|x| x & 15 == w[j] & 15))
        })
    };
    hay.windows(ANCHOR_LEN)
        .filter(|w| buckets.iter().any(|b| !b.is_empty() && passes(b, w)))
        .count()
}

/// The first stage: the wide search where the CPU has AVX2 ([`super::wide`]), the packed (Teddy)
/// searcher where it has SSSE3 only, Aho-Corasick elsewhere.
enum Stage1 {
    Wide(Wide),
    Packed(packed::Searcher),
    Ac(AhoCorasick),
}

/// The literal prefilter.
pub struct Prefilter {
    stage1: Stage1,
    /// The first stage's patterns, by pattern id.
    patterns: Vec<&'static str>,
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
        let plan = if literals == plan::LITERALS {
            Plan::built_in()
        } else {
            Plan::for_literals(literals)
        };
        Self::from_plan(plan, true)
    }

    /// The same prefilter on the packed searcher even where the wide one runs: what the tests
    /// and the benchmarks compare it with.
    pub fn packed_with_literals(literals: &[&'static str]) -> Self {
        let plan = if literals == plan::LITERALS {
            Plan::built_in()
        } else {
            Plan::for_literals(literals)
        };
        Self::from_plan(plan, false)
    }

    /// Whether the first stage is the wide search (and keeps newline counts as it searches).
    pub fn is_wide(&self) -> bool {
        matches!(self.stage1, Stage1::Wide(_))
    }

    fn from_plan(Plan { anchors, order }: Plan, wide: bool) -> Self {
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
        let distinct: Vec<&'static str> = order.iter().map(|&i| distinct[i]).collect();
        let verify: Vec<Vec<(&'static [u8], usize)>> = order
            .iter()
            .map(|&i| std::mem::take(&mut verify[i]))
            .collect();
        // Leftmost-first: which anchor matched at a position is decided by the verifier, and
        // distinct anchors of one length cannot match at the same position, so none is lost.
        let bytes: Vec<&[u8]> = distinct.iter().map(|d| d.as_bytes()).collect();
        let buckets = buckets_by_id(bytes.iter().copied());
        if let Some(w) = Wide::new(&bytes, |id| buckets[id]).filter(|_| wide) {
            return Prefilter {
                stage1: Stage1::Wide(w),
                patterns: distinct,
                verify,
                anchors,
            };
        }
        let stage1 = match packed::Config::new()
            .match_kind(packed::MatchKind::LeftmostFirst)
            // Slim: the bucket order above is made for its 8 buckets, and it steps 32 bytes at a
            // time where fat Teddy steps 16 (measured: 102 ms slim, 119 ms fat on the ordinary
            // bench log's search, as fast as three literals slim).
            .only_teddy_fat(Some(false))
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
            patterns: distinct,
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

    /// The first stage's patterns, the distinct anchors, in pattern-id order (which decides
    /// the searcher's buckets).
    pub fn patterns(&self) -> &[&'static str] {
        &self.patterns
    }

    /// Whether a line (or any buffer) holds a candidate literal.
    pub fn is_candidate(&self, hay: &[u8]) -> bool {
        self.find_from(hay, 0).is_some()
    }

    /// The first anchor match at or after `from`: (position, first-stage pattern id). The wide
    /// search keeps `counted` current as it goes ([`Wide::find`]); the others leave it.
    #[inline]
    fn anchor_from(
        &self,
        hay: &[u8],
        from: usize,
        counted: &mut Counted,
    ) -> Option<(usize, usize)> {
        match &self.stage1 {
            Stage1::Wide(w) => w.find(hay, from, counted),
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
        self.find_counted(hay, from, &mut Counted::from_offset(from))
    }

    /// [`Prefilter::find_from`], counting newlines on the way where the first stage can
    /// ([`Counted`]: `scan`'s line numbers without a second pass over the bytes).
    pub fn find_counted(&self, hay: &[u8], from: usize, counted: &mut Counted) -> Option<usize> {
        let mut at = from;
        while at < hay.len() {
            let (pos, id) = self.anchor_from(hay, at, counted)?;
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
        let mut counted = Counted::default();
        while let Some((pos, _)) = self.anchor_from(hay, at, &mut counted) {
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

    /// A site's anchor is placed where it costs least, never worse than searched last, and far
    /// better for some: `dkms`, last, shared a bucket with unlike anchors.
    #[test]
    fn a_sites_anchor_is_placed_where_it_costs_least() {
        let on_sample = |plan: Plan| {
            let pre = Prefilter::from_plan(plan, true);
            ordinary_lines()
                .map(|l| bucket_passes(pre.patterns(), l.as_bytes()))
                .sum::<usize>()
        };
        let mut better = 0;
        for extra in ["dkms.conf' for copying", "Auto-detected mode as 'legacy'"] {
            let plan = Plan::built_in().extended(&[extra]);
            // The same anchors, the site's searched last.
            let mut order = Plan::built_in().order;
            assert_eq!(plan.order.len(), order.len() + 1, "{extra}: a new anchor");
            order.push(order.len());
            let last = on_sample(Plan {
                anchors: plan.anchors.clone(),
                order,
            });
            let placed = on_sample(plan);
            assert!(placed <= last, "{extra}: placed {placed}, last {last}");
            better += usize::from(placed < last);
        }
        assert!(better > 0);
    }

    /// The plan kept for the built-in literals is the one chosen now: a literal, a sample line or
    /// the chooser changed without `prefilter_plan.rs` following fails here.
    #[test]
    fn the_kept_plan_is_the_chosen_one() {
        let chosen = Plan::for_literals(candidate_literals());
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/classify/prefilter_plan.rs"
        );
        if std::env::var_os("XIDWATCH_BLESS").is_some() {
            std::fs::write(path, chosen.render()).expect("write the plan");
            return;
        }
        assert_eq!(
            Plan::built_in(),
            chosen,
            "src/classify/prefilter_plan.rs is stale: XIDWATCH_BLESS=1 cargo test --lib prefilter"
        );
        assert_eq!(include_str!("prefilter_plan.rs"), chosen.render());
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

    /// The wide first stage and the packed one find the same lines, with the same newline count:
    /// on the ordinary sample joined into one text (every line crossing 64-byte steps
    /// differently), with each literal planted into it, from line starts spread over it. Where the CPU
    /// has no AVX2 both are the packed searcher and this holds trivially.
    #[test]
    fn the_wide_and_the_packed_first_stage_agree() {
        let wide = Prefilter::new();
        let packed = Prefilter::packed_with_literals(plan::LITERALS);
        assert!(!packed.is_wide());
        let ordinary: String = ordinary_lines().map(|l| format!("{l}\n")).collect();
        for (i, l) in candidate_literals().iter().enumerate() {
            let at = ordinary
                .match_indices('\n')
                .nth(i * 7 % 150)
                .map_or(0, |(n, _)| n + 1);
            let text = format!("{}x {l} tail\n{}", &ordinary[..at], &ordinary[at..]);
            let hay = text.as_bytes();
            let mut from = 0;
            while from < hay.len() {
                let mut c = Counted::default();
                let got = wide.find_counted(hay, from, &mut c);
                assert_eq!(got, packed.find_from(hay, from), "{l:?} from {from}");
                let exact = bytecount::count(&hay[..c.upto], b'\n') as u64;
                assert_eq!(c.newlines, exact, "{l:?} from {from}");
                // Every 16th line start: each search runs on to the planted literal.
                for _ in 0..16 {
                    // Past the last newline: to the end, not beyond it.
                    from += hay[from..]
                        .iter()
                        .position(|&b| b == b'\n')
                        .map_or(hay.len() - from, |n| n + 1);
                }
            }
        }
    }

    /// The grouping lowers what ordinary text costs the search: fewer windows of the sample pass
    /// some bucket's masks than with the anchors in list order.
    #[test]
    fn the_teddy_order_groups_alike_anchors() {
        let d = distinct_anchors();
        let passing = |order: &[usize]| -> usize {
            let patterns: Vec<&str> = order.iter().map(|&i| d[i]).collect();
            ordinary_lines()
                .map(|l| bucket_passes(&patterns, l.as_bytes()))
                .sum()
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
