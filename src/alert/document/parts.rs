//! The parts a page is made of, as they travel in the JSON document: the GPU, echoes, findings,
//! evidence and its steps, the phase and the generator.

use serde::{Deserialize, Serialize};

use crate::model::{Category, Severity};

/// An incident the page's incident superseded after it had been paged
/// ([`crate::model::Incident::supersedes`]), with the labels its alert was sent under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupersededDoc {
    pub id: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    pub severity: crate::model::Severity,
    pub category: crate::model::Category,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuDoc>,
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
    /// The shape that read the line (`xid`, `init.probe-error`, a site row's id): what a site's
    /// `[[classify.silence]]` row or a receiver's routing can name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
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
