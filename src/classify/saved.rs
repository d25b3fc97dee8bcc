//! The one reader of saved logs' lines: `scan`, the classifier's tests and the corpus scorer all
//! read a saved log (dmesg, journal, syslog, a kmsg dump, a bug-report archive) through
//! [`SavedLog`], so a structure one of them folds the others fold too.
//!
//! Which lines reach it is the prefilter's choice ([`offered_lines`]): the lines that hold a
//! candidate literal, the indented lines right after one, and the [`HEADS`] right above one. A
//! paste often wraps a driver message under
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
/// indented line right after an offered one. `scan`'s region search applies the same rule, and
/// also offers the [`HEADS`] right above an offered line ([`offered_lines`]).
pub fn offered(pre: &Prefilter, line: &[u8], after_offered: bool) -> bool {
    pre.is_candidate(line) || (after_offered && continues(line))
}

/// A line that heads a report but names nothing it is about: the line below it does, and a
/// finding read from that line takes the head in. DKMS prints `Error! Bad return status for module
/// build on kernel: 6.2.7-nitrous-1 (x86_64)` and only then `Consult
/// /var/lib/dkms/nvidia/525.89.02/build/make.log ...` (or, from DKMS 3 on, `dkms autoinstall on
/// ... failed for nvidia(10)`); the head is the line a reader looks for, and it is NVIDIA's only
/// when the next line says so.
///
/// Why not a literal: a head holds no word that only NVIDIA's lines hold, and each window of it
/// tried as an anchor took the searcher's bucket passes on the ordinary sample from 29 to 41-57
/// (`tests/it/prefilter_cost.rs`). A head costs nothing where nothing is offered: the source looks
/// above an offered line only.
#[derive(Debug)]
pub struct Head {
    /// Text the head line holds.
    pub text: &'static str,
    /// Shape ids (a prefix of them) of the findings that take the head in.
    pub taken_by: &'static str,
}

pub const HEADS: &[Head] = &[
    Head {
        text: "Bad return status for module build",
        taken_by: "installer.dkms-",
    },
    // DKMS 3's build step, when the page or the terminal put it right above the report.
    Head {
        text: "(bad exit status: ",
        taken_by: "installer.dkms-",
    },
    // A container runtime quoting the NVIDIA hook's standard error, where the page or terminal
    // broke it after the toolkit's first line (`docker: Error response from daemon: ... error
    // running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as
    // 'legacy'`); the hook's own error (`nvidia-container-cli: detection error: nvml error:
    // ...`) is the next line.
    Head {
        text: "stderr: Auto-detected mode as '",
        taken_by: "tool.",
    },
];

/// The last bytes a head line can end with: the source reads the line above an offered one only
/// when it ends with one of them (a test checks every head's example does).
pub const HEAD_ENDS: &[u8] = b")'";

/// How many head lines one offered line takes in (DKMS 3: the build step, then the report).
pub const MAX_HEADS: usize = 2;

/// Whether `line` is one of the [`HEADS`]. Every head ends with a byte of [`HEAD_ENDS`] (a test
/// says so), which the source checks first: the line above an offered one is read only when it
/// ends so.
pub fn is_head(line: &[u8]) -> bool {
    head_of(line).is_some()
}

/// Which of the [`HEADS`] `line` is: the one rule for the source, which offers it, and the
/// reader, which holds it for the line below.
fn head_of(line: &[u8]) -> Option<&'static Head> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if !line.last().is_some_and(|c| HEAD_ENDS.contains(c)) {
        return None;
    }
    HEADS
        .iter()
        .find(|h| crate::classify::find::find(line, h.text.as_bytes()).is_some())
}

/// Which of `lines` are offered to [`SavedLog::line`], as `scan`'s region search offers them:
/// [`offered`], and up to [`MAX_HEADS`] head lines right above an offered line that holds a
/// candidate literal.
pub fn offered_lines(pre: &Prefilter, lines: &[&[u8]]) -> Vec<bool> {
    let mut out = vec![false; lines.len()];
    let mut after_offered = false;
    for (i, l) in lines.iter().enumerate() {
        let candidate = pre.is_candidate(l);
        after_offered = candidate || (after_offered && continues(l));
        out[i] = after_offered;
        if candidate {
            for j in (i.saturating_sub(MAX_HEADS)..i).rev() {
                if out[j] || !is_head(lines[j]) {
                    break;
                }
                out[j] = true;
            }
        }
    }
    out
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
    /// [`HEADS`] read right above the next line, waiting for it: (line number, the line, which
    /// findings take it).
    heads: Vec<(u64, String, &'static str)>,
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
            heads: Vec::new(),
        }
    }

    /// Reads physical line `line_no` (1-based).
    pub fn line(&mut self, line_no: u64, text: &str, out: &mut Vec<Finding>) {
        if self.heads.last().is_some_and(|h| h.0 + 1 != line_no) {
            self.heads.clear();
        }
        let first_new = out.len();
        let Some((prefix, messages)) = prefix::split_ref_with(text, self.site.as_deref()) else {
            if let Some(h) = head_of(text.trim_end().as_bytes()) {
                if self.heads.len() == MAX_HEADS {
                    self.heads.remove(0);
                }
                self.heads
                    .push((line_no, text.trim().to_string(), h.taken_by));
                return;
            }
            self.heads.clear();
            if !self.continuation(line_no, text, out) {
                self.in_report(line_no, text);
            }
            return;
        };
        let at = &mut self.at;
        at.line = line_no;
        at.seq = prefix.seq;
        at.ts_usec = prefix.ts_usec;
        at.timestamp = prefix.text.as_deref().map(crate::model::Stamp::new);
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
        if !self.heads.is_empty() {
            self.take_heads(&mut out[first_new..]);
        }
    }

    /// The waiting heads go to the first finding of the line below them that takes them; without
    /// one they were no report of NVIDIA's and are dropped.
    fn take_heads(&mut self, found: &mut [Finding]) {
        let heads = std::mem::take(&mut self.heads);
        let Some(f) = found.iter_mut().find(|f| {
            f.shape
                .is_some_and(|s| heads.iter().all(|h| s.starts_with(h.2)))
        }) else {
            return;
        };
        let n = heads.len();
        f.origin.line = heads[0].0;
        f.origin.lines += n as u32;
        let ts = f.origin.ts_usec;
        f.origin.raw.splice(0..0, heads.into_iter().map(|h| h.1));
        if !f.origin.raw_ts_usec.is_empty() {
            f.origin
                .raw_ts_usec
                .splice(0..0, std::iter::repeat_n(ts, n));
        }
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
            timestamp: prefix.text.as_deref().map(crate::model::Stamp::new),
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

    /// DKMS's report heads take in the line below them when that line is NVIDIA's, however the
    /// report goes on (real lines of rounds w and x: the build log's pointer, DKMS 3's autoinstall
    /// line, and the build step above the head); another module's report stays quiet, head and all.
    #[test]
    fn a_dkms_head_joins_the_nvidia_line_below_it_and_no_other() {
        use crate::classify::testing::loud_lines;
        let f = loud_lines(
            &[
                "==> dkms install --no-depmod nvidia/525.89.02 -k 6.2.7-nitrous-1",
                "Error! Bad return status for module build on kernel: 6.2.7-nitrous-1 (x86_64)",
                "Consult /var/lib/dkms/nvidia/525.89.02/build/make.log for more information.",
            ],
            true,
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].origin.line, f[0].origin.lines), (2, 2));
        assert!(f[0].origin.raw[0].starts_with("Error! Bad return status"));
        let f = loud_lines(
            &[
                "'make' -j8 IGNORE_PREEMPT_RT_PRESENCE=1 KERNEL_UNAME=6.4.1-zen1-1-zen modules.......(bad exit status: 2)",
                "Error! Bad return status for module build on kernel: 6.4.1-zen1-1-zen (x86_64)",
                "dkms autoinstall on 6.4.1-zen1-1-zen/x86_64 failed for nvidia(10)",
            ],
            true,
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].origin.line, f[0].origin.lines), (1, 3));
        for other in [
            "Consult /var/lib/dkms/vboxhost/7.0.6_OSE/build/make.log for more information.",
            "dkms autoinstall on 6.4.1-zen1-1-zen/x86_64 failed for zfs(10)",
        ] {
            let found = crate::classify::testing::read(
                &[
                    "Error! Bad return status for module build on kernel: 6.2.7-nitrous-1 (x86_64)",
                    other,
                ],
                true,
            );
            assert!(found.is_empty(), "{other}: {found:#?}");
        }
        // A head far from the line that would take it is not taken in.
        let f = loud_lines(
            &[
                "Error! Bad return status for module build on kernel: 6.2.7-nitrous-1 (x86_64)",
                "make: *** [Makefile:80: modules] Error 2",
                "Consult /var/lib/dkms/nvidia/525.89.02/build/make.log for more information.",
            ],
            true,
        );
        assert_eq!((f[0].origin.line, f[0].origin.lines), (3, 1), "{f:#?}");
    }

    /// A container runtime's error that quotes the NVIDIA hook's standard error, broken after
    /// the toolkit's first line, joins the hook's error read from the line below (round ab's real
    /// lines); the same head above a line that is no finding of a tool stays quiet.
    #[test]
    fn a_container_runtimes_head_joins_the_hooks_error_below_it() {
        use crate::classify::testing::{loud_lines, read};
        let head = "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'";
        let f = loud_lines(
            &[
                "584db29952f41090c2621db300d402dc14370d2a2fec188ae8b11e5a229aad38",
                head,
                "nvidia-container-cli: detection error: nvml error: unknown error: unknown",
                "Run 'docker run --help' for more information",
            ],
            true,
        );
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!((f[0].origin.line, f[0].origin.lines), (2, 2));
        assert!(f[0].origin.raw[0].starts_with("docker: Error response"));
        // The hook's set-up error below it is no finding: the head goes with it.
        let f = read(
            &[
                head,
                "nvidia-container-cli: container error: cgroup subsystem devices not found: unknown",
            ],
            true,
        );
        assert!(f.is_empty(), "{f:#?}");
    }

    /// The source reads the line above an offered one only when it ends with a byte of
    /// `HEAD_ENDS`: every head must, or it would never be offered.
    #[test]
    fn every_head_ends_as_the_source_looks_for() {
        let examples = [
            "Error! Bad return status for module build on kernel: 6.2.7-nitrous-1 (x86_64)",
            "TCH=1 SYSSRC=/lib/modules/7.1.3-4-liquorix-amd64/build modules......(bad exit status: 2)",
            "docker: Error response from daemon: failed to create task for container: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'",
        ];
        assert_eq!(
            super::HEADS.len(),
            examples.len(),
            "a new head needs its example here"
        );
        for (h, example) in super::HEADS.iter().zip(examples) {
            assert!(example.contains(h.text), "{example}");
            assert!(super::HEAD_ENDS.contains(&example.as_bytes()[example.len() - 1]));
            assert!(super::is_head(example.as_bytes()), "{example}");
            assert!(super::is_head(format!("{example}\r").as_bytes()));
        }
        assert!(!super::is_head(
            b"Error! Bad return status for module build, cut"
        ));
    }
}
