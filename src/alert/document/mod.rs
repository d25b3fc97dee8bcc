//! The `xidwatch.alert/v1` JSON document: everything one alert carries, in a stable shape.
//!
//! It is built once from an [`Alert`] when the alert enters the outbox; every channel
//! (webhook, Slack, email, Alertmanager, standard output) renders from it. It is an API from the
//! first day: fields are only ever added, never renamed or removed, and `schema` says which
//! version a receiver is reading.
//!
//! This file holds the shape and builds it from one alert; [`build`]'s `PageBuilder` is the one
//! place that assembles a page (the document, its evidence note, its host group, its hand-off),
//! [`host`] folds a host page, and [`words`] holds the wording that every rendering shares.

use serde::{Deserialize, Serialize};

use crate::model::{Category, Evidence, Finding, Incident, IncidentPhase, Severity, StepStatus};

use super::input::{Alert, CatalogText};

pub mod build;
pub mod host;
pub mod parts;
pub mod words;

pub use parts::{
    EchoDoc, EvidenceDoc, FindingDoc, Generator, GpuDoc, Phase, StepDoc, StepStatusDoc,
    SupersededDoc,
};

pub use host::{host_roles, HostRole};
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
    /// The drain command for the site's scheduler (`[handoff]`), when the fault takes the GPU out of service.
    /// Suggested for a person; xidwatch never runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffDoc>,
    /// Set on a host page: several GPUs opened the same critical fault together, so this one
    /// opening page stands for all of them (see [`HostGroup`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_group: Option<HostGroup>,
    /// On a later notice of a GPU whose opening page was a host page: that page's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_page: Option<String>,
    /// The GPU's state (the verdict's) when the alert was handed over: a resolved notice for
    /// one fault says whether the GPU is well, or still failed for another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_state: Option<super::gpu_state::GpuStateDoc>,
    /// Incidents this one superseded after they were paged; they end with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<SupersededDoc>,
    /// The severities earlier pages of this incident went out under, before a worse finding
    /// raised it: receivers keyed by labels end those alerts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paged_as: Vec<Severity>,
    pub generator: Generator,
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
    /// Builds the document. Pure: the same alert always gives the same document.
    pub fn build(alert: &Alert) -> AlertDocument {
        let inc = &alert.incident;
        let gpu = gpu_doc(inc);
        let (meaning, next_steps) = meaning_and_steps(&alert.evidence, alert.catalog.as_ref());
        let mut findings: Vec<FindingDoc> = inc
            .findings
            .iter()
            .take(MAX_FINDINGS)
            .map(finding_doc)
            .collect();
        let folded = fold_init_pairs(&mut findings);
        let findings_omitted = inc.findings.len().saturating_sub(findings.len() + folded);
        let mut count = inc.count;
        if inc.kind == crate::model::FindingKind::DriverInitFailure {
            count = count.saturating_sub(folded as u64).max(1);
        }
        let meaning = match findings.first().and_then(api_versions) {
            Some(v) => format!("{v}. {meaning}"),
            None => meaning,
        };
        // An open incident's note is how it stands ("cannot verify recovery without NVML"):
        // every channel shows the meaning, so the page says it.
        let meaning = match (&inc.note, inc.phase) {
            (Some(n), IncidentPhase::Opened | IncidentPhase::Digest) => format!("{meaning} {n}."),
            _ => meaning,
        };
        AlertDocument {
            schema: SCHEMA.to_string(),
            id: inc.id.clone(),
            phase: match inc.phase {
                IncidentPhase::Opened => Phase::Opened,
                IncidentPhase::Digest => Phase::Digest,
                IncidentPhase::Resolved => Phase::Resolved,
            },
            test: inc.test,
            host: inc.host.clone(),
            boot_id: inc.boot_id.clone(),
            severity: inc.severity,
            category: inc.category,
            kind: inc.kind.as_str().to_string(),
            xid: inc.xid,
            title: inc.title.clone(),
            headline: headline(inc, escalation(&alert.evidence).as_deref()),
            gpu,
            meaning,
            next_steps,
            first_seen: rfc3339(inc.first_seen_ms),
            first_seen_ms: inc.first_seen_ms,
            last_seen: rfc3339(inc.last_seen_ms),
            last_seen_ms: inc.last_seen_ms,
            count,
            found_at_startup: inc.found_at_startup,
            dropped_alerts_before: inc.dropped_alerts_before,
            echoes: inc
                .echoes
                .iter()
                .map(|e| EchoDoc {
                    kind: e.kind.as_str().to_string(),
                    xid: e.xid,
                    count: e.count,
                })
                .collect(),
            findings_omitted,
            findings,
            catalog: alert.catalog.clone(),
            runbook_override: inc.runbook_override.clone(),
            evidence: alert.evidence.iter().map(evidence_doc).collect(),
            evidence_note: None,
            report_path: None,
            handoff: None,
            host_group: None,
            host_page: inc.host_page.clone(),
            gpu_state: alert.gpu_state.clone(),
            paged_as: inc.paged_as.clone(),
            supersedes: inc
                .supersedes
                .iter()
                .map(|s| SupersededDoc {
                    id: s.id.clone(),
                    kind: s.kind.as_str().to_string(),
                    xid: s.xid,
                    severity: s.severity,
                    category: s.category,
                    gpu: (inc.pci.is_some() || !s.gpu.is_empty()).then(|| GpuDoc {
                        index: s.gpu.index,
                        pci: inc.pci.map(|p| p.to_string()),
                        uuid: s.gpu.uuid.clone(),
                        serial: s.gpu.serial.clone(),
                        name: s.gpu.name.clone(),
                    }),
                })
                .collect(),
            generator: Generator {
                name: "xidwatch".to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
        }
    }
}

/// `gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79, critical`; a repeat offender's
/// `... - Xid 79 (2nd time in 30 days: replace the board), critical`, so that its page and mail
/// subject never read as a duplicate of the first one.
fn headline(inc: &Incident, escalation: Option<&str>) -> String {
    let mut s = String::new();
    if inc.test {
        s.push_str("[TEST] ");
    }
    if inc.phase == IncidentPhase::Resolved {
        s.push_str("[RESOLVED] ");
    }
    s.push_str(&inc.host);
    s.push_str(": ");
    s.push_str(&inc.title);
    s.push_str(" - ");
    match (inc.xid, escalation) {
        (Some(x), Some(e)) => s.push_str(&format!("Xid {x} ({e}), ")),
        (Some(x), None) => s.push_str(&format!("Xid {x}, ")),
        (None, Some(e)) => s.push_str(&format!("{e}, ")),
        (None, None) => {}
    }
    s.push_str(inc.severity.as_str());
    if let (IncidentPhase::Resolved, Some(note)) = (inc.phase, &inc.note) {
        // What ended it, as the engine knows it: "recovered: ... (same board)" for a lost GPU
        // verified back, "quiet for 10 min" for an event that only stopped.
        s.push_str(&format!(
            " ({note}, since {}, {} occurrence(s))",
            rfc3339(inc.last_seen_ms),
            inc.count
        ));
    } else if inc.phase == IncidentPhase::Resolved
        && inc.kind == crate::model::FindingKind::ServiceDown
    {
        // A state incident ends when the state is seen gone, not when it has been quiet.
        s.push_str(&format!(
            " (verified active again at {})",
            rfc3339(inc.last_seen_ms)
        ));
    } else if inc.phase == IncidentPhase::Resolved && crate::incident::is_state(inc.kind) {
        // A health check's incident ends only when the check passes again: say it was checked.
        s.push_str(&format!(
            " (passes again: verified at {})",
            rfc3339(inc.last_seen_ms)
        ));
    } else if inc.phase == IncidentPhase::Resolved {
        s.push_str(&format!(
            " (quiet since {}, {} occurrence(s))",
            rfc3339(inc.last_seen_ms),
            inc.count
        ));
    }
    if inc.phase == IncidentPhase::Digest {
        s.push_str(&format!(
            " ({} times in {})",
            inc.count,
            duration_words(inc.last_seen_ms.saturating_sub(inc.first_seen_ms))
        ));
        // A reminder ("still failing") or another board at a lost GPU's address.
        if let Some(note) = &inc.note {
            s.push_str(&format!(" ({note})"));
        }
    }
    s
}

/// The history runbook's escalation of a repeat offender, in headline words: "2nd time in 30
/// days: replace the board". `None` when the repeat-offender rule did not match.
fn escalation(evidence: &[Evidence]) -> Option<String> {
    let notes: Vec<&str> = evidence
        .iter()
        .filter(|e| e.runbook == "gpu-history")
        .flat_map(|e| e.steps.iter())
        .flat_map(|s| s.notes.iter().map(String::as_str))
        .collect();
    if !notes.iter().any(|n| n.starts_with("repeat offender")) {
        return None;
    }
    // "history: the 2nd Xid 79 on this board (serial 1650923017654) in 30 days"
    let times = notes.iter().find_map(|n| {
        let rest = n.strip_prefix("history: the ")?;
        let (nth, _) = rest.split_once(' ')?;
        let days = rest.rsplit_once(" in ")?.1;
        nth.starts_with(|c: char| c.is_ascii_digit())
            .then(|| format!("{nth} time in {days}"))
    });
    Some(match times {
        Some(t) => format!("{t}: replace the board"),
        None => "repeat offender: replace the board".to_string(),
    })
}

/// "the user-space driver is 535.54.03 and the kernel module 525.85.12", for an API mismatch
/// whose versions the kernel log gave: the on-call needs both to know which one to change.
fn api_versions(f: &FindingDoc) -> Option<String> {
    let d = f.detail.as_ref()?;
    let client = d.get("client_version")?.as_str().unwrap_or_default();
    let kernel = d.get("kernel_version")?.as_str().unwrap_or_default();
    let word = |v: &str| {
        if v.is_empty() {
            "not in the log".to_string()
        } else {
            v.to_string()
        }
    };
    (!client.is_empty() || !kernel.is_empty()).then(|| {
        format!(
            "The user-space driver (client) is version {} and the kernel module version {}",
            word(client),
            word(kernel)
        )
    })
}

/// The note on the first page after start-up about `n` older faults it found and did not page
/// (logged before the `lookback_secs` look-back).
pub fn older_faults_note(n: u64, lookback_secs: u64) -> String {
    format!(
        "{n} older fault{s} found at start-up (before the {} look-back) {were} recorded, not paged: see xidwatch history",
        crate::clock::duration_words(lookback_secs.saturating_mul(1000)),
        s = if n == 1 { "" } else { "s" },
        were = if n == 1 { "was" } else { "were" },
    )
}

/// `RmInitAdapter failed!` and the `rm_init_adapter failed, device minor number N` that follows
/// it are one failure reported twice by the driver: the second is folded into the first (its
/// lines kept) when it follows for the same GPU (or names none). Returns how many were folded.
fn fold_init_pairs(findings: &mut Vec<FindingDoc>) -> usize {
    use crate::classify::shape_id;
    // The first is read by Rust, the second by the shape table's `init.rm-init-adapter-*` rows.
    let is_head = |f: &FindingDoc| f.shape.as_deref() == Some(shape_id::INIT_RM_ADAPTER);
    let is_minor = |f: &FindingDoc| {
        f.shape
            .as_deref()
            .is_some_and(|s| s.starts_with("init.rm-init-adapter-"))
    };
    let mut folded = 0;
    let mut i = 1;
    while i < findings.len() {
        let (head, tail) = findings.split_at_mut(i);
        let (prev, cur) = (&mut head[i - 1], &tail[0]);
        let same_gpu = cur.pci.is_none() || cur.pci == prev.pci;
        if is_head(prev)
            && is_minor(cur)
            && cur.xid.is_none()
            && same_gpu
            && !prev.raw.iter().any(|l| l.contains("rm_init_adapter"))
        {
            let cur = findings.remove(i);
            let prev = &mut findings[i - 1];
            for (n, l) in cur.raw.into_iter().enumerate() {
                match (&cur.timestamp, n) {
                    (Some(ts), 0) if prev.timestamp.as_ref() != Some(ts) => {
                        prev.raw.push(format!("{ts} {l}"))
                    }
                    _ => prev.raw.push(l),
                }
            }
            prev.raw_omitted += cur.raw_omitted;
            folded += 1;
        } else {
            i += 1;
        }
    }
    folded
}

fn meaning_and_steps(evidence: &[Evidence], catalog: Option<&CatalogText>) -> (String, String) {
    let from_runbook = |f: fn(&Evidence) -> &str| {
        evidence
            .iter()
            .map(f)
            .find(|s| !s.trim().is_empty())
            .map(|s| s.trim().to_string())
    };
    let meaning = from_runbook(|e| &e.meaning)
        .or_else(|| {
            catalog
                .map(|c| c.summary.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "No description is known for this fault.".to_string());
    let next = from_runbook(|e| &e.next_steps)
        .or_else(|| catalog.and_then(CatalogText::action_words))
        .unwrap_or_else(|| "Check the kernel log and the GPU's state.".to_string());
    (meaning, next)
}

fn clip_line(s: &str) -> String {
    if s.len() <= MAX_LINE_CHARS {
        return s.to_string();
    }
    let mut end = MAX_LINE_CHARS;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn finding_doc(f: &Finding) -> FindingDoc {
    let raw: Vec<String> = f
        .origin
        .raw
        .iter()
        .take(MAX_RAW_LINES_PER_FINDING)
        .map(|l| clip_line(l))
        .collect();
    FindingDoc {
        kind: f.kind.as_str().to_string(),
        shape: f.shape.map(str::to_string),
        xid: f.xid,
        pci: f.pci.map(|p| p.to_string()),
        pid: f.pid,
        process: f.process.clone(),
        severity: f.severity,
        category: f.category,
        title: f.title.to_string(),
        message: clip_line(&f.message),
        caused_by: f.caused_by,
        detail: f.detail.as_ref().and_then(|d| serde_json::to_value(d).ok()),
        gpu: (!f.gpu.is_empty()).then(|| GpuDoc {
            index: f.gpu.index,
            pci: None,
            uuid: f.gpu.uuid.clone(),
            serial: f.gpu.serial.clone(),
            name: f.gpu.name.clone(),
        }),
        timestamp: f.origin.timestamp.as_deref().map(str::to_string),
        seq: f.origin.seq,
        raw_omitted: f.origin.raw.len().saturating_sub(raw.len()),
        raw,
    }
}

fn evidence_doc(e: &Evidence) -> EvidenceDoc {
    EvidenceDoc {
        runbook: e.runbook.clone(),
        meaning: e.meaning.clone(),
        next_steps: e.next_steps.clone(),
        host: e.host.clone(),
        started_ms: e.started_ms,
        duration_ms: e.duration_ms,
        steps: e
            .steps
            .iter()
            .take(MAX_STEPS)
            .map(|s| {
                let (output, cut) = clip_bytes(&s.output, MAX_STEP_OUTPUT_BYTES);
                StepDoc {
                    name: s.name.clone(),
                    kind: s.kind.clone(),
                    target: s.target.clone(),
                    status: match &s.status {
                        StepStatus::Done { exit_code } => StepStatusDoc::Done {
                            exit_code: *exit_code,
                        },
                        StepStatus::TimedOut { after_ms } => StepStatusDoc::TimedOut {
                            after_ms: *after_ms,
                        },
                        StepStatus::Missing { what } => {
                            StepStatusDoc::Missing { what: what.clone() }
                        }
                        StepStatus::Skipped { reason } => StepStatusDoc::Skipped {
                            reason: reason.clone(),
                        },
                        StepStatus::Failed { error } => StepStatusDoc::Failed {
                            error: error.clone(),
                        },
                    },
                    output,
                    bytes_dropped: s.bytes_dropped + cut as u64,
                    duration_ms: s.duration_ms,
                    notes: s.notes.clone(),
                }
            })
            .collect(),
        steps_omitted: e.steps.len().saturating_sub(MAX_STEPS),
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary; returns the bytes cut.
pub(crate) fn clip_bytes(s: &str, max: usize) -> (String, usize) {
    if s.len() <= max {
        return (s.to_string(), 0);
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    (s[..end].to_string(), s.len() - end)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_values() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(rfc3339(1_764_404_043_123), "2025-11-29T08:14:03.123Z");
    }

    /// A host page names every GPU with its incident, the port above all of them when sysfs
    /// knows it, and says the host is what to check; without sysfs it is still a host page.
    #[test]
    fn a_host_page_names_every_gpu_and_what_they_share() {
        let alert = crate::alert::synthetic_alert("node-1", 1_764_404_043_123, Vec::new());
        let mut a = alert.incident.clone();
        a.id = "a".into();
        a.pci = crate::model::PciAddress::parse("0000:19:00.0").ok();
        let mut b = a.clone();
        b.id = "b".into();
        b.pci = crate::model::PciAddress::parse("0000:1a:00.0").ok();
        let dir = tempfile::tempdir().unwrap();
        let devices = dir.path().join("bus/pci/devices");
        std::fs::create_dir_all(&devices).unwrap();
        for (name, path) in [
            (
                "0000:19:00.0",
                "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0",
            ),
            (
                "0000:1a:00.0",
                "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:04.0/0000:1a:00.0",
            ),
        ] {
            std::os::unix::fs::symlink(format!("../../../devices/{path}"), devices.join(name))
                .unwrap();
        }
        let g = HostGroup::new(&a, &[&b], dir.path());
        assert_eq!(g.shared_ports, vec!["0000:17:00.0", "0000:16:01.0"]);
        let ids: Vec<&str> = g.gpus.iter().map(|g| g.incident_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
        let mut doc = AlertDocument::build(&alert);
        doc.apply_host_group(g);
        assert!(
            doc.headline.contains("2 GPUs failed together (Xid 79)"),
            "{}",
            doc.headline
        );
        assert!(doc.headline.contains("0000:19:00.0") && doc.headline.contains("0000:1a:00.0"));
        assert!(
            doc.meaning.contains("the PCIe port 0000:17:00.0"),
            "{}",
            doc.meaning
        );
        assert!(
            doc.next_steps.contains("PCIe switch or riser"),
            "{}",
            doc.next_steps
        );
        let report = crate::alert::report::render(&doc);
        assert!(report.contains("incident b"), "{report}");
        assert!(
            report.contains("Shared:    PCIe 0000:17:00.0 > 0000:16:01.0"),
            "{report}"
        );

        let none = HostGroup::new(&a, &[&b], &dir.path().join("absent"));
        assert!(none.shared_ports.is_empty());
        assert!(none.shared.starts_with("the host"), "{}", none.shared);
    }

    #[test]
    fn clip_respects_char_boundaries() {
        let (s, cut) = clip_bytes("ééé", 3);
        assert_eq!(s, "é");
        assert_eq!(cut, 4);
    }
}
