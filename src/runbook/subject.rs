//! [`Subject`]: what a runbook is run for, in checked values only.
//!
//! An incident carries free text (titles, messages, process names, the raw log lines). The subject
//! keeps only what has been parsed into a type (a PCI address, integers, a well-formed UUID) for
//! placeholders, and the kernel log lines separately, for the excerpt step, which prints them and
//! never puts them on a command line.

use std::fmt;

use crate::model::{Category, FindingKind, Incident, PciAddress, Severity};

/// A GPU (or MIG instance) UUID in NVIDIA's form, `GPU-` or `MIG-` followed by 8-4-4-4-12 hex
/// digits. Only built by [`GpuUuid::parse`], so it is safe on a command line.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(String);

impl GpuUuid {
    pub fn parse(text: &str) -> Option<GpuUuid> {
        let (prefix, rest) = text.split_at_checked(4)?;
        if prefix != "GPU-" && prefix != "MIG-" {
            return None;
        }
        let groups: Vec<&str> = rest.split('-').collect();
        let lens = [8, 4, 4, 4, 12];
        let ok = groups.len() == lens.len()
            && groups
                .iter()
                .zip(lens)
                .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()));
        ok.then(|| GpuUuid(format!("{prefix}{}", rest.to_ascii_lowercase())))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Units `{unit}` may name (`name` or `name.service`), for the catalog ([`super::safety`]).
#[rustfmt::skip]
pub const UNITS: &[&str] = &[
    "nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "dcgm", "nvidia-powerd",
    "nvidia-imex", "xidwatch",
];

/// A systemd unit `{unit}` may name: one of the catalog's units ([`UNITS`]),
/// without the `.service` suffix. Only built by [`ServiceUnit::parse`], so a unit name from a
/// config or from `systemctl` output reaches a command line only when the catalog allows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceUnit(&'static str);

impl ServiceUnit {
    pub fn parse(text: &str) -> Option<ServiceUnit> {
        let name = text.strip_suffix(".service").unwrap_or(text);
        UNITS.iter().find(|u| **u == name).map(|u| ServiceUnit(u))
    }

    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuUuid({})", self.0)
    }
}

/// One kernel log line available to the excerpt step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogLine {
    /// Kernel sequence number, for live kmsg.
    pub seq: Option<u64>,
    /// Kernel timestamp, microseconds since boot.
    pub ts_usec: Option<u64>,
    /// The message, prefixes removed. Printed in the evidence; never part of a command.
    pub text: String,
}

/// The latest kernel log lines, for the excerpt step of the runbooks a new incident runs.
///
/// Why slots overwritten in place rather than a `VecDeque` popped and pushed: every kernel record
/// passes here. In a profile of the daemon on bench/daemon_file.sh's GPU-host mix (600,000
/// records, one core), popping the oldest line and pushing the new one held 9.6 % of the samples;
/// in place, where a full ring only copies the text into the oldest slot's buffer (no allocation,
/// no move of a slot), 0.6 %. Wall-clock runs on the shared machine vary more than that.
#[derive(Debug)]
pub struct LogRing {
    /// Filled up to `cap`, then overwritten in place from `next` on.
    lines: Vec<LogLine>,
    /// Once full, the slot of the oldest line, which the next line takes.
    next: usize,
    cap: usize,
}

impl LogRing {
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        LogRing {
            lines: Vec::with_capacity(cap),
            next: 0,
            cap,
        }
    }

    /// Keeps a line. Once the ring is full, the oldest line's slot and text buffer take the new
    /// line: no allocation per record on the daemon's hot path.
    pub fn remember(&mut self, seq: u64, ts_usec: u64, text: &str) {
        if self.lines.len() < self.cap {
            self.lines.push(LogLine {
                seq: Some(seq),
                ts_usec: Some(ts_usec),
                text: text.to_owned(),
            });
            return;
        }
        let slot = &mut self.lines[self.next];
        slot.seq = Some(seq);
        slot.ts_usec = Some(ts_usec);
        slot.text.clear();
        slot.text.push_str(text);
        self.next = (self.next + 1) % self.cap;
    }

    /// A copy of the lines kept, oldest first.
    pub fn lines(&self) -> Vec<LogLine> {
        let (newer, older) = self.lines.split_at(self.next);
        older.iter().chain(newer).cloned().collect()
    }
}

/// What a runbook is selected and run for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub kind: FindingKind,
    /// The Xid (or, for [`FindingKind::Sxid`], the SXid) number.
    pub xid: Option<u32>,
    pub category: Category,
    pub severity: Severity,
    pub pci: Option<PciAddress>,
    pub gpu_index: Option<u32>,
    pub uuid: Option<GpuUuid>,
    pub pid: Option<u32>,
    /// The process name the line gave with the pid (`name=`), to tell a reused pid from the
    /// faulting process before quoting it.
    pub process: Option<String>,
    /// The kernel timestamp (microseconds since boot) of the line that named the pid: a process
    /// started after it is not the one that faulted.
    pub fault_ts_usec: Option<u64>,
    /// Occurrences counted so far (the incident's count); 0 when unknown.
    pub count: u64,
    /// A runbook named by configuration for this incident; wins over matching when it exists.
    pub runbook_override: Option<String>,
    /// Kernel log lines around the incident, oldest first, for the excerpt step.
    pub kernel_log: Vec<LogLine>,
    /// Index in `kernel_log` of the line that opened the incident.
    pub log_anchor: Option<usize>,
    /// The root port above the GPU as an AER report named it ("pcieport 0000:16:01.0: AER: ...
    /// error received: 0000:17:00.0"), for `{parent_pci}` when sysfs no longer has the GPU (it
    /// fell off the bus).
    pub port_from_log: Option<PciAddress>,
    /// The systemd unit a `service_down` incident is about, for `{unit}`.
    pub unit: Option<ServiceUnit>,
}

impl Subject {
    /// A subject for an on-call's `runbook run`: a GPU and optionally an Xid and a pid.
    /// The category follows the kind (driver for Xids until a classifier says better) and can be
    /// set afterwards.
    pub fn manual(pci: Option<PciAddress>, xid: Option<u32>, pid: Option<u32>) -> Subject {
        Subject {
            kind: if xid.is_some() {
                FindingKind::Xid
            } else {
                FindingKind::DriverError
            },
            xid,
            category: Category::Driver,
            severity: Severity::Warning,
            pci,
            gpu_index: None,
            uuid: None,
            pid,
            process: None,
            fault_ts_usec: None,
            count: 0,
            runbook_override: None,
            kernel_log: Vec::new(),
            log_anchor: None,
            port_from_log: None,
            unit: None,
        }
    }

    /// The daemon's recent kernel log `lines` as the context, anchored at the record that
    /// opened the incident (its first finding's), when it is among them.
    pub fn with_recent_log(self, lines: Vec<LogLine>) -> Subject {
        let opened = self.log_anchor.and_then(|i| self.kernel_log.get(i)?.seq);
        let anchor = opened.and_then(|s| lines.iter().rposition(|l| l.seq == Some(s)));
        self.with_kernel_log(lines, anchor)
    }

    /// Replaces the kernel log lines (e.g. with the daemon's recent kmsg records, or the lines
    /// around the finding in a scanned file) and marks which one opened the incident.
    pub fn with_kernel_log(mut self, lines: Vec<LogLine>, anchor: Option<usize>) -> Subject {
        self.log_anchor = anchor.filter(|&i| i < lines.len());
        if self.port_from_log.is_none() {
            if let Some(gpu) = self.pci {
                self.port_from_log = lines.iter().rev().find_map(|l| aer_port(&l.text, gpu));
            }
        }
        self.kernel_log = lines;
        self
    }
}

impl From<&Incident> for Subject {
    /// Takes the checked fields of the incident; the UUID is kept only when well formed. The
    /// kernel log lines are the incident's own findings' lines (cause first); callers with more
    /// context replace them with [`Subject::with_kernel_log`].
    fn from(inc: &Incident) -> Subject {
        let mut kernel_log = Vec::new();
        for f in &inc.findings {
            for (i, text) in f.origin.raw.iter().enumerate() {
                kernel_log.push(LogLine {
                    seq: f.origin.seq.map(|s| s.saturating_add(i as u64)),
                    ts_usec: f.origin.line_ts(i),
                    text: text.clone(),
                });
            }
        }
        // The cause comes first in `findings`; show the lines in log order, anchored on it.
        let anchor_seq = kernel_log.first().and_then(|l| l.seq);
        kernel_log.sort_by_key(|l| (l.seq, l.ts_usec));
        let anchor = if kernel_log.is_empty() {
            None
        } else {
            Some(
                anchor_seq
                    .and_then(|s| kernel_log.iter().position(|l| l.seq == Some(s)))
                    .unwrap_or(0),
            )
        };
        Subject {
            kind: inc.kind,
            xid: inc.xid,
            category: inc.category,
            severity: inc.severity,
            pci: inc.pci,
            gpu_index: inc.gpu.index,
            uuid: inc.gpu.uuid.as_deref().and_then(GpuUuid::parse),
            pid: inc.findings.iter().find_map(|f| f.pid),
            process: inc
                .findings
                .iter()
                .find(|f| f.pid.is_some())
                .and_then(|f| f.process.clone()),
            fault_ts_usec: inc
                .findings
                .iter()
                .find(|f| f.pid.is_some())
                .and_then(|f| f.origin.ts_usec),
            count: inc.count,
            runbook_override: inc.runbook_override.clone(),
            port_from_log: inc.pci.and_then(|gpu| {
                inc.findings.iter().find_map(|f| match &f.detail {
                    Some(crate::model::Detail::Aer {
                        reporter: Some(r), ..
                    }) if *r != gpu => Some(*r),
                    _ => None,
                })
            }),
            unit: inc.findings.iter().find_map(|f| match &f.detail {
                Some(crate::model::Detail::Service { unit, .. }) => ServiceUnit::parse(unit),
                _ => None,
            }),
            kernel_log,
            log_anchor: anchor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_ring_keeps_the_latest_lines_in_order() {
        let mut ring = LogRing::new(3);
        let kept = |ring: &LogRing| -> Vec<u64> {
            ring.lines().into_iter().filter_map(|l| l.seq).collect()
        };
        assert!(kept(&ring).is_empty());
        // Filling, full, and every offset of the overwrite position after it.
        for i in 0..11u64 {
            ring.remember(i, i * 10, &format!("line {i}"));
            let want: Vec<u64> = (i.saturating_sub(2)..=i).collect();
            assert_eq!(kept(&ring), want, "after {i}");
        }
        let last = ring.lines().pop().unwrap();
        assert_eq!((last.ts_usec, last.text.as_str()), (Some(100), "line 10"));
    }

    #[test]
    fn uuid_must_be_well_formed() {
        let u = GpuUuid::parse("GPU-5F2C1E0A-7b3d-4c61-9e8f-0a1b2c3d4e5f").unwrap();
        assert_eq!(u.as_str(), "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f");
        assert!(GpuUuid::parse("MIG-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f").is_some());
        for bad in [
            "",
            "GPU-",
            "gpu-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f",
            "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5",
            "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f; reboot",
            "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5g",
            "GPU-5f2c1e0a-7b3d-4c61-9e8f0a1b2c3d4e5f",
            "GPU-ü5f2c1e0-7b3d-4c61-9e8f-0a1b2c3d4e5f",
        ] {
            assert!(GpuUuid::parse(bad).is_none(), "{bad}");
        }
    }
}

/// The reporting port of an AER line about `gpu`: "pcieport 0000:16:01.0: AER: Uncorrected
/// (Fatal) error received: 0000:17:00.0" gives 0000:16:01.0. Parsed into a checked address; the
/// rest of the line is never used.
fn aer_port(text: &str, gpu: PciAddress) -> Option<PciAddress> {
    let rest = text.split("pcieport ").nth(1)?;
    let (port, tail) = rest.split_once(": AER:")?;
    let port = PciAddress::parse(port.trim()).ok()?;
    let named = tail.rsplit(' ').next().map(str::trim)?;
    (PciAddress::parse(named).ok() == Some(gpu) && port != gpu).then_some(port)
}

#[cfg(test)]
mod port_tests {
    use super::*;

    #[test]
    fn the_root_port_comes_from_the_aer_line_about_the_gpu() {
        let gpu = PciAddress::parse("0000:17:00.0").unwrap();
        assert_eq!(
            aer_port(
                "pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0",
                gpu
            ),
            PciAddress::parse("0000:16:01.0").ok()
        );
        assert_eq!(
            aer_port(
                "pcieport 0000:16:01.0: AER: Corrected error message received from 0000:2a:00.0",
                gpu
            ),
            None,
            "another device's report"
        );
        assert_eq!(aer_port("NVRM: Xid (PCI:0000:17:00): 79", gpu), None);
        let s = Subject::manual(Some(gpu), Some(79), None).with_kernel_log(
            vec![LogLine {
                seq: Some(1),
                ts_usec: None,
                text:
                    "pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0"
                        .into(),
            }],
            Some(0),
        );
        assert_eq!(s.port_from_log, PciAddress::parse("0000:16:01.0").ok());
    }
}
