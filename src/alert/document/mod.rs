//! The `xidwatch.alert/v1` JSON document: everything one alert carries, in a stable shape.
//!
//! It is built once from an [`Alert`](super::Alert) when the alert enters the outbox; every channel
//! (webhook, Slack, email, Alertmanager, standard output) renders from it. It is an API from the
//! first day: fields are only ever added, never renamed or removed, and `schema` says which
//! version a receiver is reading.
//!
//! This file holds the shape; [`build`] assembles a page from an alert (the one place that does),
//! [`host`] folds a host page, and [`words`] holds the wording that every rendering shares.

use serde::{Deserialize, Serialize};

use crate::model::{Category, Incident, Severity};

use super::input::CatalogText;

pub mod build;
pub mod host;
pub mod words;

pub use words::{duration_words, kind_words, rfc3339};

/// The value of the `schema` field.
pub const SCHEMA: &str = "xidwatch.alert/v1";
/// The note on an alert whose runbook was running when xidwatch stopped or crashed.
pub const EVIDENCE_LOST_NOTE: &str =
    "xidwatch restarted while this incident's runbook ran: the alert is sent without its evidence; run `xidwatch runbook run` by hand for it";

/// Bounds applied while building, so one alert never grows without limit.
pub const MAX_FINDINGS: usize = 20;
pub const MAX_RAW_LINES_PER_FINDING: usize = 40;
pub const MAX_LINE_CHARS: usize = 2000;
pub const MAX_STEP_OUTPUT_BYTES: usize = 32 * 1024;
pub const MAX_STEPS: usize = 64;

/// One page for the host when several GPUs open the same critical fault together.
///
/// A PCIe switch, a riser, a power event or the driver takes several GPUs down at once; a page
/// per card, each with advice about that one card, sends the on-call to the wrong place. The
/// design, kept simple so the outbox's promise is unchanged:
/// - every GPU keeps its own incident, history, digests and resolved notice;
/// - the engine releases first alerts of the same critical (kind, Xid) on different GPUs whose
///   settle delays overlap in the same tick ([`crate::incident`]);
/// - the daemon hands over only the first of them (the lead), carrying this group; its id is the
///   lead incident's id, so it is stable across restarts and deduplicated as before, and it goes
///   through the outbox like any alert (written before it is acknowledged, sent at least once);
/// - the other GPUs' opening pages are not sent: they are folded into this one, each named here
///   with its own incident id, so their later notices can be matched to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostGroup {
    /// Every GPU of the group, the lead first.
    pub gpus: Vec<HostGpu>,
    /// PCI ports above every GPU of the group (nearest first), from the sysfs topology: a shared
    /// switch or root port is where to look. Empty when sysfs does not know.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_ports: Vec<String>,
    /// What the GPUs share, in words ("the PCIe port 0000:16:00.0", or "the host").
    pub shared: String,
}

/// One GPU of a [`HostGroup`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostGpu {
    /// Its own incident, which goes on (digests, resolved notice) under this id.
    pub incident_id: String,
    pub gpu: GpuDoc,
    pub title: String,
}

/// The document. See `docs/alerts.md` for the meaning of every field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlertDocument {
    pub schema: String,
    /// The incident's stable id; receivers drop duplicates on `(id, phase, count)`.
    pub id: String,
    pub phase: Phase,
    /// A synthetic alert from `xidwatch test-alert`.
    pub test: bool,
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    pub severity: Severity,
    pub category: Category,
    /// Finding kind that opened the incident (`xid`, `fallen_off_bus`, ...).
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// The incident title ("GPU 3 (0000:17:00.0) fell off the bus").
    pub title: String,
    /// One line for people: host, GPU, what happened, Xid, severity.
    pub headline: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuDoc>,
    /// What the fault means and what to do next, from the runbook, else from the catalog.
    pub meaning: String,
    pub next_steps: String,
    pub first_seen: String,
    pub first_seen_ms: u64,
    pub last_seen: String,
    pub last_seen_ms: u64,
    /// Exact number of occurrences of the opening fault.
    pub count: u64,
    pub found_at_startup: bool,
    /// Alerts dropped from a full outbox before this one.
    pub dropped_alerts_before: u64,
    #[serde(default)]
    pub echoes: Vec<EchoDoc>,
    /// The cause first, then a bounded sample of echoes and repeats.
    pub findings: Vec<FindingDoc>,
    /// Findings beyond the ones carried here.
    #[serde(default)]
    pub findings_omitted: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runbook_override: Option<String>,
    /// Every runbook's result, every step.
    pub evidence: Vec<EvidenceDoc>,
    /// Why the evidence is missing or partial, when it is (the runbook was interrupted by a
    /// restart, or skipped because too many were waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_note: Option<String>,
    /// Where the full readable report lies on the host, when the daemon wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_path: Option<String>,
    /// The drain command for the site's scheduler (`[handoff]`), when the guide says to drain.
    /// Suggested for a person; xidwatch never runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffDoc>,
    /// Set on a host page: several GPUs opened the same critical fault together, so this one
    /// opening page stands for all of them (see [`HostGroup`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_group: Option<HostGroup>,
    pub generator: Generator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Opened,
    Digest,
    /// Nothing new for the quiet period: the incident is over for receivers.
    Resolved,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generator {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDoc {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EchoDoc {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    pub count: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FindingDoc {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub severity: Severity,
    pub category: Category,
    pub title: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<u32>,
    /// Kind-specific fields as the classifier decoded them (`type` names the shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The kernel log lines, as read.
    pub raw: Vec<String>,
    #[serde(default)]
    pub raw_omitted: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceDoc {
    pub runbook: String,
    pub meaning: String,
    pub next_steps: String,
    pub host: String,
    pub started_ms: u64,
    pub duration_ms: u64,
    pub steps: Vec<StepDoc>,
    #[serde(default)]
    pub steps_omitted: usize,
}

/// How one step ended; the same words as the runbook stage uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum StepStatusDoc {
    Done {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    TimedOut {
        after_ms: u64,
    },
    Missing {
        what: String,
    },
    Skipped {
        reason: String,
    },
    Failed {
        error: String,
    },
}

impl StepStatusDoc {
    /// Short words for people ("exit 0", "timed out after 5000 ms", ...).
    pub fn describe(&self) -> String {
        match self {
            StepStatusDoc::Done { exit_code: Some(c) } => format!("exit {c}"),
            StepStatusDoc::Done { exit_code: None } => "done".to_string(),
            StepStatusDoc::TimedOut { after_ms } => format!("timed out after {after_ms} ms"),
            StepStatusDoc::Missing { what } => format!("missing: {what}"),
            StepStatusDoc::Skipped { reason } => format!("skipped: {reason}"),
            StepStatusDoc::Failed { error } => format!("failed: {error}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDoc {
    pub name: String,
    pub kind: String,
    pub target: Vec<String>,
    #[serde(flatten)]
    pub status: StepStatusDoc,
    pub output: String,
    /// Output bytes dropped by the runbook's cap plus any dropped here.
    pub bytes_dropped: u64,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The schedulers xidwatch can word a drain for.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Scheduler {
    #[default]
    None,
    Slurm,
    Kubernetes,
}

impl Scheduler {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheduler::None => "none",
            Scheduler::Slurm => "slurm",
            Scheduler::Kubernetes => "kubernetes",
        }
    }
}

/// The hand-off as the page carries it (see [`crate::alert::handoff`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffDoc {
    pub scheduler: Scheduler,
    pub node: String,
    /// The commands, in order, for a person to run; empty for a test alert.
    pub commands: Vec<String>,
    /// Always says that xidwatch does not run them.
    pub note: String,
}

impl AlertDocument {
    /// The document as sent: compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Serialising plain structs of strings and numbers cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The document indented, for attachments and golden files.
    pub fn to_json_pretty(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// A name safe for files and mail headers, derived from the id.
    pub fn file_stem(&self) -> String {
        let mut s: String = self
            .id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(96)
            .collect();
        match self.phase {
            Phase::Opened => {}
            Phase::Digest => s.push_str("-digest"),
            Phase::Resolved => s.push_str("-resolved"),
        }
        s
    }

    /// Every kernel log line of the carried findings, in order; a finding's first line carries
    /// the timestamp the log gave it (`[ 9512.238711] NVRM: Xid ...`).
    ///
    /// The findings are listed by kernel sequence number (else by kernel timestamp): the cause
    /// leads the document's findings, but in the log an AER line often came before the Xid, and
    /// the on-call reads the log in the order it happened.
    pub fn kernel_lines(&self) -> Vec<String> {
        let mut order: Vec<&FindingDoc> = self.findings.iter().collect();
        if order.iter().all(|f| f.seq.is_some()) {
            order.sort_by_key(|f| f.seq);
        } else if order
            .iter()
            .all(|f| f.timestamp.as_deref().and_then(uptime_us).is_some())
        {
            order.sort_by_key(|f| f.timestamp.as_deref().and_then(uptime_us));
        }
        let mut out = Vec::new();
        for f in order {
            for (i, l) in f.raw.iter().enumerate() {
                match (&f.timestamp, i) {
                    (Some(ts), 0) => out.push(format!("{ts} {l}")),
                    _ => out.push(l.clone()),
                }
            }
            if f.raw_omitted > 0 {
                out.push(format!(
                    "({} more line(s) of this record not kept)",
                    f.raw_omitted
                ));
            }
        }
        out
    }

    /// Runbook notes (what the evidence means, e.g. "link degraded to x8"), in order, each note
    /// once (two steps reading the same thing note it twice).
    pub fn notes(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for s in self.evidence.iter().flat_map(|e| e.steps.iter()) {
            for n in &s.notes {
                if !out.iter().any(|(_, seen)| *seen == n.as_str()) {
                    out.push((s.name.as_str(), n.as_str()));
                }
            }
        }
        out
    }

    /// The opening fault in words: "Xid 79", "driver initialisation failure".
    pub fn fault_words(&self) -> String {
        kind_words(&self.kind, self.xid)
    }

    /// "GPU 3 (0000:17:00.0)" or "host" when no GPU is known.
    pub fn gpu_label(&self) -> String {
        match &self.gpu {
            Some(g) => match (g.index, &g.pci) {
                (Some(i), Some(p)) => format!("GPU {i} ({p})"),
                (Some(i), None) => format!("GPU {i}"),
                (None, Some(p)) => format!("GPU {p}"),
                (None, None) => "GPU (index unknown)".to_string(),
            },
            None => "host".to_string(),
        }
    }
}

/// The GPU part of the document, when the incident names one.
pub(crate) fn gpu_doc(inc: &Incident) -> Option<GpuDoc> {
    if inc.pci.is_none() && inc.gpu.is_empty() {
        return None;
    }
    Some(GpuDoc {
        index: inc.gpu.index,
        pci: inc.pci.map(|p| p.to_string()),
        uuid: inc.gpu.uuid.clone(),
        serial: inc.gpu.serial.clone(),
        name: inc.gpu.name.clone(),
    })
}

/// `[ 9512.238711]` as microseconds since boot; `None` for any other timestamp text.
fn uptime_us(ts: &str) -> Option<u64> {
    let inner = ts.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
    let (s, frac) = inner.split_once('.').unwrap_or((inner, "0"));
    let frac: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
    Some(s.parse::<u64>().ok()?.checked_mul(1_000_000)? + frac.parse::<u64>().ok()?)
}
