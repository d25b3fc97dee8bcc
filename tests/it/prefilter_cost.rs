//! The prefilter's cost on ordinary lines: every literal is searched by an anchor that ordinary
//! kernel lines (public logs, `fixtures/ordinary/`) rarely hold, and the two-stage search finds
//! exactly the lines that hold a literal.
//!
//! A literal costs wherever the SIMD searcher's fingerprint matches, not only where the literal
//! does: `state:D` searched by its first bytes stopped on every "entered forwarding state" and
//! `/proc/N/status` of a container host. The bound and why it is what it is:
//! [`prefilter::MAX_ANCHOR_LINES_PER_MILLE`].

use xidwatch::classify::prefilter::{self, Prefilter, ANCHOR_LEN};

/// Lines of the ordinary sample that hold `needle`.
fn lines_holding(needle: &[u8]) -> u32 {
    prefilter::ordinary_lines()
        .filter(|l| l.as_bytes().windows(needle.len()).any(|w| w == needle))
        .count() as u32
}

/// Literals whose anchor (the bytes the searcher's fingerprint is made of) is not rare in the
/// ordinary sample, with the number of sample lines it stops in.
fn costly(literals: &[&'static str]) -> Vec<(&'static str, &'static str, u32)> {
    let total = prefilter::ordinary_lines().count() as u32;
    let pre = Prefilter::with_literals(literals);
    pre.anchors()
        .iter()
        .filter_map(|a| {
            // As the searcher pays: stops of the first stage on each sample line.
            let one = Prefilter::with_literals(&[a.literal]);
            let stops = prefilter::ordinary_lines()
                .filter(|l| one.anchor_hits(l.as_bytes()) > 0)
                .count() as u32;
            (!prefilter::is_rare(stops, total)).then_some((a.literal, a.anchor, stops))
        })
        .collect()
}

#[test]
fn the_sample_is_ordinary_and_large_enough() {
    let total = prefilter::ordinary_lines().count();
    // Under 500 lines, "one line in 500" means no line at all: stricter than the bound, never
    // looser. A sample that shrank much would no longer tell common words from rare ones.
    assert!(total >= 350, "only {total} ordinary lines");
    let pre = Prefilter::new();
    for l in prefilter::ordinary_lines() {
        assert!(!pre.is_candidate(l.as_bytes()), "not ordinary: {l}");
    }
    // Every block names its source.
    for s in prefilter::ORDINARY_SAMPLE {
        assert!(s.contains("\n@ https://"), "a sample file without sources");
    }
}

#[test]
fn every_literal_is_searched_by_a_rare_anchor() {
    let bad = costly(prefilter::candidate_literals());
    assert!(
        bad.is_empty(),
        "literals whose anchor is common in ordinary lines (literal, anchor, sample lines): {bad:?}"
    );
}

/// Every literal added costs a pattern of the first stage unless it shares an anchor, and past
/// [`prefilter::MAX_ANCHORS`] patterns the packed searcher is refused.
#[test]
fn the_anchors_fit_the_packed_searcher() {
    let pre = Prefilter::new();
    assert!(
        pre.patterns().len() <= prefilter::MAX_ANCHORS,
        "{} distinct anchors for {} literals, at most {}: let a new literal share a window",
        pre.patterns().len(),
        pre.anchors().len(),
        prefilter::MAX_ANCHORS
    );
}

/// The first stage's buckets, as the searcher fills them, stop its SIMD loop on few windows of
/// ordinary text: a literal added to a crowded bucket, or an order that mixes unlike anchors,
/// costs every line of every log (in list order the same anchors stop on a fifth of the lines).
#[test]
fn the_buckets_pass_few_ordinary_windows() {
    let pre = Prefilter::new();
    let lines = prefilter::ordinary_lines().count();
    let passes: usize = prefilter::ordinary_lines()
        .map(|l| prefilter::bucket_passes(pre.patterns(), l.as_bytes()))
        .sum();
    assert!(
        passes * 20 <= lines,
        "{passes} bucket passes on {lines} ordinary lines (at most one line in 20)"
    );
    // The bound means something: the same anchors in the order they were found pass far more.
    let mut listed: Vec<&str> = Vec::new();
    for a in pre.anchors() {
        if !listed.contains(&a.anchor) {
            listed.push(a.anchor);
        }
    }
    let unordered: usize = prefilter::ordinary_lines()
        .map(|l| prefilter::bucket_passes(&listed, l.as_bytes()))
        .sum();
    assert!(unordered * 20 > lines, "{unordered} on {lines}");
}

/// Real wordings that hold no built-in literal (round notes in `fixtures/unseen/README.md`): the
/// installer's missing `dkms.conf`, an exporter's bare exit status, the container runtime's mode
/// notice, the vGPU manager's status line.
const EXTRA: [&str; 4] = [
    "dkms.conf' for copying",
    "err: exit status 12",
    "Auto-detected mode as 'legacy'",
    "vmiop_log: NVOS status",
];

/// A site's literals after the built-in ones keep the built-in plan (no regrouping at every
/// load): each built-in anchor keeps its pattern id but for one the site's anchor may take, and
/// every literal of both is found.
#[test]
fn a_sites_literals_extend_the_built_in_plan() {
    let built_in = Prefilter::new();
    let mut lits: Vec<&'static str> = built_in.anchors().iter().map(|a| a.literal).collect();
    lits.extend(EXTRA);
    let pre = Prefilter::with_literals(&lits);
    let moved = built_in
        .patterns()
        .iter()
        .zip(pre.patterns())
        .filter(|(a, b)| a != b)
        .count();
    assert!(moved <= EXTRA.len(), "{moved} built-in anchors moved");
    for l in &lits {
        let line = format!("[ 1.0] tool: {l} here");
        assert!(pre.find_from(line.as_bytes(), 0).is_some(), "{line}");
    }
}

/// Literals that hold a common window no ordinary line holds are searched by it once: the two
/// tool messages naming "the NVIDIA driver" share one anchor, and each literal is still found.
#[test]
fn literals_that_share_an_unseen_window_share_an_anchor() {
    let lits: &[&'static str] = &[
        "communicate with the NVIDIA driver",
        "NVIDIA driver is not loaded",
        "SXid",
    ];
    let pre = Prefilter::with_literals(lits);
    assert_eq!(pre.patterns().len(), 2, "{:?}", pre.anchors());
    for a in pre.anchors() {
        assert_eq!(&a.literal[a.offset..a.offset + a.anchor.len()], a.anchor);
        let line = format!("[ 1.0] tool: {} here", a.literal);
        assert_eq!(pre.find_from(line.as_bytes(), 0), Some(13), "{line}");
    }
    // A window shared by one literal only is no reason to leave its rare first bytes.
    let pre = Prefilter::with_literals(&["SXid", "nvidia"]);
    let heads: Vec<&str> = pre.anchors().iter().map(|a| a.anchor).collect();
    assert_eq!(heads, ["SXid", "nvid"]);
}

/// The guard holds for literals added later (from a table or by hand): a literal made only of
/// common words gets no rare anchor, and the check says so.
#[test]
fn a_literal_of_common_words_is_caught() {
    let bad = costly(&["entered forwarding state", "NVRM"]);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].0, "entered forwarding state");
    // And the literal that motivated the guard, by its leading bytes, is common.
    let total = prefilter::ordinary_lines().count() as u32;
    let lead = lines_holding(&b"state:D"[..ANCHOR_LEN]);
    assert!(!prefilter::is_rare(lead, total), "{lead} of {total}");
}

#[test]
fn the_two_stages_find_exactly_the_lines_with_a_literal() {
    let pre = Prefilter::new();
    let mut lines: Vec<String> = prefilter::ordinary_lines().map(str::to_string).collect();
    for f in std::fs::read_dir("fixtures/corpus").expect("corpus") {
        let path = f.expect("entry").path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).expect("corpus file");
            lines.extend(
                text.lines()
                    .map(|l| l.split_once(" | ").map_or(l, |(_, t)| t).to_string()),
            );
        }
    }
    let literals = prefilter::candidate_literals();
    // Literals at the very start and end of the haystack, next to each other, and cut short.
    for l in literals {
        lines.push(l.to_string());
        lines.push(format!("x{l}"));
        lines.push(format!("{l}{l}"));
        lines.push(l[..l.len() - 1].to_string());
        lines.push(l[1..].to_string());
    }
    for l in &lines {
        let want = literals.iter().any(|c| l.contains(c));
        assert_eq!(pre.is_candidate(l.as_bytes()), want, "{l:?}");
        if want {
            let at = pre.find_from(l.as_bytes(), 0).expect("found");
            assert!(
                literals
                    .iter()
                    .any(|c| l.as_bytes()[at..].starts_with(c.as_bytes())),
                "{l:?} at {at}"
            );
        }
    }
    // In one buffer, the first match lies in the first line that holds a literal.
    let buf = lines.join("\n");
    let first = lines
        .iter()
        .position(|l| literals.iter().any(|c| l.contains(c)))
        .expect("some line");
    let at = pre.find_from(buf.as_bytes(), 0).expect("found");
    assert_eq!(buf[..at].matches('\n').count(), first);
}
