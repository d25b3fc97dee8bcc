//! Test helpers shared by the classifier's test files: saved-log lines read the way `scan` reads
//! them (numbered from 1, prefix split, folded, flushed at the end).

use super::prefilter::Prefilter;
use super::saved::{self, SavedLog};
use crate::model::{Finding, Severity};

/// Classifies `lines` as one saved log. With `prefilter`, lines without a candidate literal are
/// skipped as `scan` skips them: a class the prefilter drops is a class never read.
pub fn read(lines: &[&str], prefilter: bool) -> Vec<Finding> {
    let pre = Prefilter::shared();
    let mut log = SavedLog::default();
    let mut out = Vec::new();
    let bytes: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    let offered = saved::offered_lines(pre, &bytes);
    for (i, l) in lines.iter().enumerate() {
        if !prefilter || offered[i] {
            log.line(i as u64 + 1, l, &mut out);
        }
    }
    log.finish(&mut out);
    out
}

/// The loud findings (warning or above) of `lines` read as one saved log.
pub fn loud_lines(lines: &[&str], prefilter: bool) -> Vec<Finding> {
    read(lines, prefilter)
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

/// The loud findings (warning or above) of one line read alone.
pub fn loud_line(line: &str, prefilter: bool) -> Vec<Finding> {
    loud_lines(&[line], prefilter)
}

/// Asserts that `line` read alone makes no loud finding.
pub fn quiet(line: &str) {
    let f = loud_line(line, true);
    assert!(f.is_empty(), "{line}: {f:?}");
}

/// Asserts that `line` read alone makes no loud finding with the prefilter off: for a line that
/// holds no candidate literal, [`quiet`] shows only that the prefilter drops it, and this that the
/// classifier's own rule keeps it quiet too.
pub fn quiet_unfiltered(line: &str) {
    let f = loud_line(line, false);
    assert!(f.is_empty(), "{line}: {f:?}");
}

/// The one loud finding of `line` read alone, which must be of `kind`.
pub fn one_of_kind(line: &str, kind: crate::model::FindingKind) -> Finding {
    let mut f = loud_line(line, true);
    assert_eq!(f.len(), 1, "{line}: {f:?}");
    assert_eq!(f[0].kind, kind, "{line}");
    f.remove(0)
}

/// The real lines of `fixtures/corpus/` and `fixtures/unseen/` (the text after each label), for
/// tests that hold a fast reader to the slow one it replaced on every line the project has.
pub fn fixture_lines() -> Vec<String> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");
    let mut lines = Vec::new();
    for dir in ["corpus", "unseen"] {
        let rd = std::fs::read_dir(format!("{root}/{dir}"))
            .unwrap_or_else(|e| panic!("fixtures/{dir} is part of the repository: {e}"));
        for e in rd.flatten() {
            let text = std::fs::read_to_string(e.path())
                .unwrap_or_else(|err| panic!("{}: {err}", e.path().display()));
            lines.extend(
                text.lines()
                    .filter_map(|l| l.split_once(" | "))
                    .map(|(_, t)| t.to_string()),
            );
        }
    }
    assert!(lines.len() > 5000, "the fixtures' lines were read");
    lines
}

#[cfg(test)]
mod tests {
    /// A message the driver prints over several records keeps each record's own time, so the
    /// page's kernel-log block dates every line (not all of them at the first line's time).
    #[test]
    fn folded_lines_keep_their_own_times() {
        let f = super::read(
            &[
                "[  100.000001] NVRM: The NVIDIA GPU 0000:17:00.0",
                "[  100.500002] NVRM: (PCI ID: 10de:2330) installed in this system has",
                "[  101.000003] NVRM: fallen off the bus and is not responding to commands.",
            ],
            false,
        );
        let f = f
            .iter()
            .find(|f| f.origin.raw.len() == 3)
            .unwrap_or_else(|| panic!("no folded finding in {f:#?}"));
        assert_eq!(f.origin.line_ts(0), Some(100_000_001));
        assert_eq!(f.origin.line_ts(1), Some(100_500_002));
        assert_eq!(f.origin.line_ts(2), Some(101_000_003));
    }
}
