//! Test helpers shared by the classifier's test files: saved-log lines read the way `scan` reads
//! them (numbered from 1, prefix split, folded, flushed at the end).

use super::prefilter::Prefilter;
use super::{prefix, Classifier, LineOrigin};
use crate::model::{Finding, Severity};

/// Classifies `lines` as one saved log. With `prefilter`, lines without a candidate literal are
/// skipped as `scan` skips them: a class the prefilter drops is a class never read.
pub fn read(lines: &[&str], prefilter: bool) -> Vec<Finding> {
    let pre = Prefilter::shared();
    let mut c = Classifier::new();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if prefilter && !pre.is_candidate(l.as_bytes()) {
            continue;
        }
        let Some(split) = prefix::split(l) else {
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

/// The loud findings (warning or above) of one line read alone.
pub fn loud_line(line: &str, prefilter: bool) -> Vec<Finding> {
    read(&[line], prefilter)
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}
