//! The kernel log excerpt step (pure): lines around the incident, taken from the lines the caller
//! handed over in the [`Subject`], never read from /dev/kmsg here.

use crate::model::{PciAddress, StepStatus};

use super::exec::text::sanitize;
use super::subject::Subject;

/// Which lines around the incident to show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// This many matching lines before and after the line that opened the incident.
    Lines { before: usize, after: usize },
    /// Lines stamped within this many seconds before and after it.
    Seconds { before: u64, after: u64 },
}

/// A `kmsg = { ... }` step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KmsgSpec {
    pub window: Window,
    /// Keep only lines containing one of these (case-insensitive); all lines when empty.
    pub grep: Vec<String>,
    /// Keep only lines naming the incident's GPU.
    pub this_gpu: bool,
}

impl KmsgSpec {
    pub fn describe(&self) -> String {
        let mut s = match self.window {
            Window::Lines { before, after } => format!("{before} lines before, {after} after"),
            Window::Seconds { before, after } => format!("{before} s before, {after} s after"),
        };
        if !self.grep.is_empty() {
            s.push_str(&format!(", containing {}", self.grep.join(" or ")));
        }
        if self.this_gpu {
            s.push_str(", naming this GPU");
        }
        s
    }
}

/// How the kernel writes a GPU's address in its lines: `0000:17:00` (then `.0` or `)`).
fn short_address(pci: PciAddress) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}",
        pci.domain(),
        pci.bus(),
        pci.device()
    )
}

pub struct Excerpt {
    pub status: StepStatus,
    pub output: String,
    pub bytes_dropped: u64,
    pub notes: Vec<String>,
}

pub fn excerpt(spec: &KmsgSpec, s: &Subject, max_bytes: usize) -> Excerpt {
    let skipped = |reason: &str| Excerpt {
        status: StepStatus::Skipped {
            reason: reason.to_string(),
        },
        output: String::new(),
        bytes_dropped: 0,
        notes: Vec::new(),
    };
    let lines = &s.kernel_log;
    if lines.is_empty() {
        return skipped("no kernel log lines were given for this incident");
    }
    let anchor = s
        .log_anchor
        .filter(|&i| i < lines.len())
        .unwrap_or(lines.len() - 1);
    let grep: Vec<String> = spec.grep.iter().map(|g| g.to_lowercase()).collect();
    let gpu = s.pci.filter(|_| spec.this_gpu).map(short_address);
    let keep = |i: usize| {
        if i == anchor {
            return true;
        }
        let text = lines[i].text.to_lowercase();
        (grep.is_empty() || grep.iter().any(|g| text.contains(g.as_str())))
            && gpu.as_ref().is_none_or(|a| text.contains(a.as_str()))
    };
    let chosen: Vec<usize> = match spec.window {
        Window::Lines { before, after } => {
            let mut b: Vec<usize> = (0..anchor)
                .rev()
                .filter(|&i| keep(i))
                .take(before)
                .collect();
            b.reverse();
            b.push(anchor);
            b.extend((anchor + 1..lines.len()).filter(|&i| keep(i)).take(after));
            b
        }
        Window::Seconds { before, after } => {
            let Some(t) = lines[anchor].ts_usec else {
                return skipped("the kernel log lines carry no timestamps");
            };
            let lo = t.saturating_sub(before.saturating_mul(1_000_000));
            let hi = t.saturating_add(after.saturating_mul(1_000_000));
            (0..lines.len())
                .filter(|&i| lines[i].ts_usec.is_some_and(|ts| (lo..=hi).contains(&ts)) && keep(i))
                .collect()
        }
    };
    let mut output = String::new();
    let mut dropped = 0u64;
    for i in chosen {
        let l = &lines[i];
        let mark = if i == anchor { "> " } else { "  " };
        let stamp = l
            .ts_usec
            .map(|t| format!("[{:>5}.{:06}] ", t / 1_000_000, t % 1_000_000))
            .unwrap_or_default();
        let line = format!("{mark}{stamp}{}\n", sanitize(&l.text));
        if output.len() + line.len() <= max_bytes && dropped == 0 {
            output.push_str(&line);
        } else {
            dropped += line.len() as u64;
        }
    }
    let mut notes = Vec::new();
    if let (Some(x), Some(pci)) = (
        s.xid.filter(|_| s.kind == crate::model::FindingKind::Xid),
        s.pci,
    ) {
        let addr = short_address(pci);
        let needle = format!("): {x},");
        let n = lines
            .iter()
            .filter(|l| l.text.contains(&needle) && l.text.to_lowercase().contains(&addr))
            .count();
        if n > 1 {
            notes.push(format!(
                "Xid {x} appears {n} times for {pci} in the {} kernel log lines at hand",
                lines.len()
            ));
        }
    }
    if s.count > 1 {
        notes.push(format!(
            "the incident has counted {} occurrences so far",
            s.count
        ));
    }
    Excerpt {
        status: StepStatus::Done { exit_code: None },
        output,
        bytes_dropped: dropped,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runbook::subject::LogLine;

    fn subject() -> Subject {
        let pci = PciAddress::parse("0000:17:00.0").ok();
        let text = [
            "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
            "NVRM: Xid (PCI:0000:17:00): 13, pid=10, name=python3, Graphics Exception",
            "xfs: mounted",
            "NVRM: Xid (PCI:0000:18:00): 13, pid=11, name=python3, Graphics Exception",
            "NVRM: Xid (PCI:0000:17:00): 13, pid=12, name=python3, Graphics Exception",
            "NVRM: Xid (PCI:0000:17:00): 43, pid=12, name=python3, Ch 00000010",
            "audit: \x1b[31mred",
        ];
        let lines = text
            .iter()
            .enumerate()
            .map(|(i, t)| LogLine {
                seq: Some(i as u64),
                ts_usec: Some(100_000_000 + i as u64 * 10_000_000),
                text: t.to_string(),
            })
            .collect();
        let mut s = Subject::manual(pci, Some(13), Some(12));
        s.count = 2;
        s.with_kernel_log(lines, Some(4))
    }

    fn spec(window: Window) -> KmsgSpec {
        KmsgSpec {
            window,
            grep: vec![],
            this_gpu: false,
        }
    }

    #[test]
    fn lines_around_the_anchor() {
        let e = excerpt(
            &spec(Window::Lines {
                before: 1,
                after: 1,
            }),
            &subject(),
            4096,
        );
        let lines: Vec<&str> = e.output.lines().collect();
        assert_eq!(lines.len(), 3, "{}", e.output);
        assert!(lines[0].starts_with("  [  130.000000] NVRM: Xid (PCI:0000:18:00)"));
        assert!(lines[1].starts_with("> [  140.000000]"));
        assert!(lines[2].contains(": 43,"));
        assert!(e
            .notes
            .iter()
            .any(|n| n.contains("Xid 13 appears 2 times for 0000:17:00.0")));
        assert!(e.notes.iter().any(|n| n.contains("counted 2")));
    }

    #[test]
    fn filters_and_seconds() {
        let mut sp = spec(Window::Lines {
            before: 10,
            after: 10,
        });
        sp.this_gpu = true;
        sp.grep = vec!["xid".into()];
        let e = excerpt(&sp, &subject(), 4096);
        assert_eq!(e.output.lines().count(), 3, "{}", e.output);
        assert!(!e.output.contains("18:00"));
        let e = excerpt(
            &spec(Window::Seconds {
                before: 20,
                after: 20,
            }),
            &subject(),
            4096,
        );
        assert_eq!(e.output.lines().count(), 5, "{}", e.output);
        // Control characters from the log are neutralised.
        assert!(e.output.contains("audit: ?[31mred"), "{}", e.output);
    }

    #[test]
    fn cap_and_skips() {
        let e = excerpt(
            &spec(Window::Lines {
                before: 10,
                after: 10,
            }),
            &subject(),
            100,
        );
        assert!(e.output.len() <= 100);
        assert!(e.bytes_dropped > 0);
        let mut s = subject();
        s.kernel_log.clear();
        let e = excerpt(
            &spec(Window::Lines {
                before: 1,
                after: 1,
            }),
            &s,
            100,
        );
        assert!(matches!(e.status, StepStatus::Skipped { .. }));
        let mut s = subject();
        s.kernel_log.iter_mut().for_each(|l| l.ts_usec = None);
        let e = excerpt(
            &spec(Window::Seconds {
                before: 1,
                after: 1,
            }),
            &s,
            100,
        );
        assert!(
            matches!(e.status, StepStatus::Skipped { ref reason } if reason.contains("timestamps"))
        );
    }
}
