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
