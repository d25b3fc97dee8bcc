//! The classifier scored on real kernel lines from public bug reports (`fixtures/corpus/`): the
//! share of core fault lines and of other NVIDIA error lines it reports, and the share of
//! harmless lines it raises an alarm on. Fails under the targets and prints the score either way.

use std::collections::BTreeMap;
use std::path::Path;

use xidwatch::classify::{prefix, Classifier, LineOrigin};
use xidwatch::model::{Finding, FindingKind, Severity};
use xidwatch::source::file::Prefilter;

/// One labelled physical line of a corpus block.
struct Labelled {
    label: String,
    text: String,
}

/// A run of lines from one source, fed to the classifier as one log.
struct Block {
    url: String,
    lines: Vec<Labelled>,
}

fn load() -> Vec<Block> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/corpus");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures/corpus")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    names.sort();
    let mut blocks = Vec::new();
    for path in names {
        let text = std::fs::read_to_string(&path).expect("corpus file");
        for (n, raw) in text.lines().enumerate() {
            if raw.is_empty() || raw.starts_with('#') {
                continue;
            }
            if let Some(url) = raw.strip_prefix("@ ") {
                assert!(
                    url.starts_with("https://"),
                    "{}:{}: no URL",
                    path.display(),
                    n + 1
                );
                blocks.push(Block {
                    url: url.to_string(),
                    lines: Vec::new(),
                });
                continue;
            }
            let (label, line) = raw
                .split_once(" | ")
                .unwrap_or_else(|| panic!("{}:{}: no label", path.display(), n + 1));
            let block = blocks
                .last_mut()
                .unwrap_or_else(|| panic!("{}:{}: line before any @ URL", path.display(), n + 1));
            block.lines.push(Labelled {
                label: label.to_string(),
                text: line.to_string(),
            });
        }
    }
    blocks
}

/// Classifies a block as `scan` does (literal prefilter, prefix split, folding, flush at the end).
fn classify(block: &Block, pre: &Prefilter) -> Vec<Finding> {
    let mut c = Classifier::new();
    let mut out = Vec::new();
    for (i, l) in block.lines.iter().enumerate() {
        if !pre.is_candidate(l.text.as_bytes()) {
            continue;
        }
        let Some(split) = prefix::split(&l.text) else {
            continue;
        };
        let at = LineOrigin {
            line: i as u64 + 1,
            seq: split.prefix.seq,
            ts_usec: split.prefix.ts_usec,
            timestamp: split.prefix.text.clone(),
        };
        for m in &split.messages {
            c.push(m, &at, &mut out);
        }
    }
    c.flush(&mut out);
    out
}

/// Whether finding `f` covers physical line `n` (1-based) whose text is `text`.
fn covers(f: &Finding, n: u64, text: &str) -> bool {
    f.origin.line == n
        || (n > f.origin.line
            && n <= f.origin.line + 64
            && f.origin.raw.iter().any(|r| text.contains(r.trim())))
}

fn core_kind_ok(label: &str, f: &Finding) -> bool {
    match label {
        "core.xid" => f.kind == FindingKind::Xid,
        "core.sxid" => f.kind == FindingKind::Sxid,
        "core.bus" => {
            f.kind == FindingKind::FallenOffBus || (f.kind == FindingKind::Xid && f.xid == Some(79))
        }
        "core.init" => f.kind == FindingKind::DriverInitFailure,
        "core.api" => f.kind == FindingKind::ApiMismatch,
        _ => false,
    }
}

#[derive(Default)]
struct Score {
    hit: u32,
    total: u32,
}

impl Score {
    fn pct(&self) -> f64 {
        if self.total == 0 {
            100.0
        } else {
            100.0 * f64::from(self.hit) / f64::from(self.total)
        }
    }
}

#[test]
fn corpus_of_real_lines_meets_the_targets() {
    let pre = Prefilter::new();
    let blocks = load();
    let (mut core, mut other, mut harmless) =
        (Score::default(), Score::default(), Score::default());
    let mut per_family: BTreeMap<String, Score> = BTreeMap::new();
    let mut misses = Vec::new();
    let mut alarms = Vec::new();
    let mut lines = 0;
    for b in &blocks {
        let findings = classify(b, &pre);
        for (i, l) in b.lines.iter().enumerate() {
            lines += 1;
            let n = i as u64 + 1;
            let loud = |f: &&Finding| f.severity >= Severity::Warning;
            let hit = match l.label.as_str() {
                "-" | "x" => continue,
                "ok" => {
                    harmless.total += 1;
                    if let Some(f) = findings.iter().filter(loud).find(|f| f.origin.line == n) {
                        alarms.push(format!("{}\n    {}\n    => {}", b.url, l.text, f.title));
                    } else {
                        harmless.hit += 1;
                    }
                    continue;
                }
                // A core line counts when it is read as what it is, whatever the severity (an
                // NVLink5 Xid the decode table marks IGNORE is info, and still read).
                lab if lab.starts_with("core.") => findings
                    .iter()
                    .any(|f| core_kind_ok(lab, f) && covers(f, n, &l.text)),
                "other.aer_gpu" | "other.aer_old" => findings
                    .iter()
                    .any(|f| f.kind == FindingKind::PcieAer && covers(f, n, &l.text)),
                lab if lab.starts_with("other.") => findings
                    .iter()
                    .filter(loud)
                    .any(|f| f.kind != FindingKind::GpuIdentity && covers(f, n, &l.text)),
                lab => panic!("{}: unknown label {lab}", b.url),
            };
            let score = if l.label.starts_with("core.") {
                &mut core
            } else {
                &mut other
            };
            score.total += 1;
            let fam = per_family.entry(l.label.clone()).or_default();
            fam.total += 1;
            if hit {
                score.hit += 1;
                fam.hit += 1;
            } else {
                misses.push(format!("{} [{}]\n    {}", b.url, l.label, l.text));
            }
        }
    }
    let false_alarms = harmless.total - harmless.hit;
    let alarm_pct = 100.0 * f64::from(false_alarms) / f64::from(harmless.total.max(1));
    println!(
        "corpus: {lines} lines from {} sources; core {}/{} = {:.1} %; other NVIDIA errors and GPU AER {}/{} = {:.1} %; false alarms {}/{} = {:.1} %",
        blocks.len(),
        core.hit,
        core.total,
        core.pct(),
        other.hit,
        other.total,
        other.pct(),
        false_alarms,
        harmless.total,
        alarm_pct
    );
    for (fam, s) in &per_family {
        println!("  {fam:<16} {:>3}/{:<3} {:.0} %", s.hit, s.total, s.pct());
    }
    for m in &misses {
        println!("MISSED {m}");
    }
    for a in &alarms {
        println!("FALSE ALARM {a}");
    }
    assert!(
        lines >= 500,
        "the corpus must hold at least 500 lines, has {lines}"
    );
    assert!(
        harmless.total >= 150,
        "at least 150 harmless lines, has {}",
        harmless.total
    );
    assert!(core.pct() >= 97.0, "core recall {:.1} % < 97 %", core.pct());
    assert!(
        other.pct() >= 80.0,
        "other recall {:.1} % < 80 %",
        other.pct()
    );
    assert!(alarm_pct <= 0.5, "false alarms {alarm_pct:.1} % > 0.5 %");
}
