//! The `xidwatch.alert/v1` JSON document: everything one alert carries, in a stable shape.
//!
//! It is built once from an [`Alert`](super::Alert) when the alert enters the outbox; every channel
//! (webhook, Slack, email, Alertmanager, standard output) renders from it. It is an API from the
//! first day: fields are only ever added, never renamed or removed, and `schema` says which
//! version a receiver is reading.

use serde::{Deserialize, Serialize};

use crate::model::{Category, Evidence, Finding, Incident, IncidentPhase, Severity, StepStatus};

use super::{Alert, CatalogText};

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
    pub handoff: Option<super::handoff::HandoffDoc>,
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

impl AlertDocument {
    /// Builds the document. Pure: the same alert always gives the same document.
    pub fn build(alert: &Alert) -> AlertDocument {
        let inc = &alert.incident;
        let gpu = gpu_doc(inc);
        let (meaning, next_steps) = meaning_and_steps(&alert.evidence, alert.catalog.as_ref());
        let findings: Vec<FindingDoc> = inc
            .findings
            .iter()
            .take(MAX_FINDINGS)
            .map(finding_doc)
            .collect();
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
            headline: headline(inc),
            gpu,
            meaning,
            next_steps,
            first_seen: rfc3339(inc.first_seen_ms),
            first_seen_ms: inc.first_seen_ms,
            last_seen: rfc3339(inc.last_seen_ms),
            last_seen_ms: inc.last_seen_ms,
            count: inc.count,
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
            findings_omitted: inc.findings.len().saturating_sub(findings.len()),
            findings,
            catalog: alert.catalog.clone(),
            runbook_override: inc.runbook_override.clone(),
            evidence: alert.evidence.iter().map(evidence_doc).collect(),
            evidence_note: None,
            report_path: None,
            handoff: None,
            generator: Generator {
                name: "xidwatch".to_string(),
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
        }
    }

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
    pub fn kernel_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for f in &self.findings {
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

/// `gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79, critical`.
fn headline(inc: &Incident) -> String {
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
    if let Some(x) = inc.xid {
        s.push_str(&format!("Xid {x}, "));
    }
    s.push_str(inc.severity.as_str());
    if inc.phase == IncidentPhase::Resolved {
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
    }
    s
}

/// "42 s", "5 min", "3 h".
pub fn duration_words(ms: u64) -> String {
    let s = ms / 1000;
    if s < 120 {
        format!("{s} s")
    } else if s < 2 * 3600 {
        format!("{} min", s / 60)
    } else {
        format!("{} h", s / 3600)
    }
}

fn gpu_doc(inc: &Incident) -> Option<GpuDoc> {
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
        xid: f.xid,
        pci: f.pci.map(|p| p.to_string()),
        pid: f.pid,
        process: f.process.clone(),
        severity: f.severity,
        category: f.category,
        title: f.title.clone(),
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
        timestamp: f.origin.timestamp.clone(),
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

/// Milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
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

    #[test]
    fn clip_respects_char_boundaries() {
        let (s, cut) = clip_bytes("ééé", 3);
        assert_eq!(s, "é");
        assert_eq!(cut, 4);
    }
}
