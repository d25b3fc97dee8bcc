//! The one reader of saved logs' lines: `scan`, the classifier's tests and the corpus scorer all
//! read a saved log (dmesg, journal, syslog, a kmsg dump, a bug-report archive) through
//! [`SavedLog`], so a structure one of them folds the others fold too.
//!
//! Which lines reach it is the prefilter's choice ([`offered`]): the lines that hold a candidate
//! literal, and the indented lines right after one. A paste often wraps a driver message under
//! its head without repeating the head's prefix (`NVRM: The NVIDIA GPU 000a:00:00.0 ... installed
//! in this system` and below it `      is not supported by the NVIDIA 580.126.09 driver
//! release.`); such a line has no message start of its own and is read as the next line of the
//! head's message, with the head's tag, while the head waits for more lines.

use std::sync::Arc;

use super::prefilter::Prefilter;
use super::{prefix, table, Classifier, LineOrigin};
use crate::model::Finding;

/// Whether the line after an offered one is offered too: indented, it may continue the message.
pub fn continues(line: &[u8]) -> bool {
    matches!(line.first(), Some(b' ' | b'\t'))
}

/// Whether `line` is offered to [`SavedLog::line`]: it holds a candidate literal, or it is an
/// indented line right after an offered one. `scan`'s region search applies the same rule.
pub fn offered(pre: &Prefilter, line: &[u8], after_offered: bool) -> bool {
    pre.is_candidate(line) || (after_offered && continues(line))
}

/// Reads one saved log's lines, in order, into findings.
#[derive(Debug, Default)]
pub struct SavedLog {
    classifier: Classifier,
    /// The site's rows, which also say where a message starts in a line no built-in tag starts.
    site: Option<Arc<table::Table>>,
    /// The line number of the last line read, and the tag its last message started with
    /// (`NVRM: `, or none), for an indented continuation below it.
    last: Option<(u64, &'static str)>,
    /// One origin for every line, its timestamp text copied into the same buffer each time: a
    /// new string per candidate line was an allocation and a free for every line of a storm.
    at: LineOrigin,
}

impl SavedLog {
    pub fn new(site: Option<Arc<table::Table>>) -> Self {
        let mut classifier = Classifier::new();
        if let Some(t) = &site {
            classifier.set_site(t.clone());
        }
        SavedLog {
            classifier,
            site: site.filter(|t| !t.is_empty()),
            last: None,
            at: LineOrigin::default(),
        }
    }

    /// Reads physical line `line_no` (1-based).
    pub fn line(&mut self, line_no: u64, text: &str, out: &mut Vec<Finding>) {
        let Some((prefix, messages)) = prefix::split_ref_with(text, self.site.as_deref()) else {
            if !self.continuation(line_no, text, out) {
                self.in_report(line_no, text);
            }
            return;
        };
        let at = &mut self.at;
        at.line = line_no;
        at.seq = prefix.seq;
        at.ts_usec = prefix.ts_usec;
        match prefix.text {
            Some(t) => {
                let buf = at.timestamp.get_or_insert_with(String::new);
                buf.clear();
                buf.push_str(&t);
            }
            None => at.timestamp = None,
        }
        let mut tag = "";
        for msg in messages.iter() {
            tag = if msg.starts_with("NVRM: ") {
                "NVRM: "
            } else {
                ""
            };
            self.classifier.push(msg, &self.at, out);
        }
        self.last = Some((line_no, tag));
    }

    /// An indented line without a message start of its own, right below a message that waits
    /// for more lines: the next line of that message.
    fn continuation(&mut self, line_no: u64, text: &str, out: &mut Vec<Finding>) -> bool {
        let Some((prev, tag)) = self.last.take() else {
            return false;
        };
        let body = text.trim();
        if prev + 1 != line_no
            || !continues(text.as_bytes())
            || body.is_empty()
            || !self.classifier.has_pending()
        {
            return false;
        }
        let at = LineOrigin {
            line: line_no,
            ..LineOrigin::default()
        };
        let msg = format!("{tag}{body}");
        self.classifier.push(&msg, &at, out);
        self.last = Some((line_no, tag));
        true
    }

    /// A line with no message start of its own inside a crash report (see
    /// [`Classifier::report_line`]).
    fn in_report(&mut self, line_no: u64, text: &str) {
        if !self.classifier.has_pending() {
            return;
        }
        let (prefix, body) = prefix::kernel_text(text);
        let at = LineOrigin {
            line: line_no,
            seq: prefix.seq,
            ts_usec: prefix.ts_usec,
            timestamp: prefix.text.map(std::borrow::Cow::into_owned),
        };
        self.classifier.report_line(body, &at);
    }

    /// The end of the log: multi-line findings finish with what they have.
    pub fn finish(&mut self, out: &mut Vec<Finding>) {
        self.classifier.flush(out);
    }

    /// Lines that matched a tag but no shape.
    pub fn unclassified(&self) -> u64 {
        self.classifier.unclassified
    }
}

#[cfg(test)]
mod tests {
    use crate::classify::testing::read;
    use crate::model::FindingKind;

    #[test]
    fn an_indented_line_continues_the_message_above_it() {
        // Real lines (an Azure H100 on a driver release without it): the second line wraps the
        // driver's message under its head, without the `NVRM:` prefix.
        let found = read(
            &[
                "NVRM: The NVIDIA GPU 000a:00:00.0 (PCI ID: 10de:2330) installed in this system",
                "      is not supported by the NVIDIA 580.126.09 driver release.",
                "NVRM: The NVIDIA probe routine failed for 1 device(s).",
            ],
            true,
        );
        assert_eq!(found.len(), 2, "{found:#?}");
        assert_eq!(found[0].kind, FindingKind::DriverError);
        assert_eq!(found[0].title, "GPU not supported by the installed driver");
        assert_eq!(found[0].origin.lines, 2);
        assert_eq!(
            found[0].pci.map(|p| p.to_string()).as_deref(),
            Some("000a:00:00.0")
        );
        assert_eq!(found[1].kind, FindingKind::DriverInitFailure);
    }

    #[test]
    fn an_indented_line_below_a_finished_message_is_not_read() {
        let found = read(
            &[
                "[ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=0, GPU has fallen off the bus.",
                "      is not supported by the NVIDIA 580.126.09 driver release.",
                "   NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x22:0x56:884)",
            ],
            true,
        );
        let kinds: Vec<_> = found.iter().map(|f| (f.kind, f.origin.lines)).collect();
        assert_eq!(
            kinds,
            [(FindingKind::Xid, 1), (FindingKind::DriverInitFailure, 1)],
            "{found:#?}"
        );
    }
}
