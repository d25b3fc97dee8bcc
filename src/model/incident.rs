//! An [`Incident`]: one real problem on one GPU (or on the host), with its echoes folded in.

use serde::Serialize;

use super::{Category, Finding, FindingKind, GpuIdentity, PciAddress, Severity};

/// Why the incident stage is handing this incident on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IncidentPhase {
    /// First occurrence: runbooks run and the first alert goes out (after the settle delay).
    Opened,
    /// The correlation window closed after repeats: one digest with exact counts.
    Digest,
    /// Nothing new for the incident's quiet period: receivers may close it.
    Resolved,
}

/// How many times one kind of echo (a related finding) was folded into the incident.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EchoCount {
    pub kind: FindingKind,
    pub xid: Option<u32>,
    pub count: u64,
}

/// One incident. Built by the incident stage, read by the runbook and alert stages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incident {
    /// Stable id derived from what the incident is (boot, GPU, kind/Xid, first sequence), so a
    /// restart never mints a second id for the same incident. Receivers deduplicate on it.
    pub id: String,
    pub phase: IncidentPhase,
    pub host: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The kind of the finding that opened the incident (its cause).
    pub kind: FindingKind,
    pub xid: Option<u32>,
    pub pci: Option<PciAddress>,
    #[serde(skip_serializing_if = "GpuIdentity::is_empty")]
    pub gpu: GpuIdentity,
    pub severity: Severity,
    pub category: Category,
    /// Headline for people, without the host ("GPU 3 (0000:17:00.0) fell off the bus").
    pub title: String,
    /// Wall-clock time of the first and latest occurrence, milliseconds since the Unix epoch; for
    /// a kernel log fault, when the kernel logged it ([`Finding::logged_ms`]), not when read.
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    /// Exact number of occurrences of the opening (GPU, kind, Xid), whatever the storm.
    pub count: u64,
    /// Findings folded in: the cause first, then a bounded sample of echoes and repeats.
    pub findings: Vec<Finding>,
    /// Exact counts of every echo kind folded in.
    pub echoes: Vec<EchoCount>,
    /// True when the finding was already in the kernel log when xidwatch started.
    pub found_at_startup: bool,
    /// Found on the first start of a boot and logged before the look-back (`[kmsg]
    /// lookback_secs`): recorded in the history and status, never paged, so an old fault read
    /// from the ring buffer is not sent as new.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub before_lookback: bool,
    /// Runbook chosen by a per-Xid override in the config, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runbook_override: Option<String>,
    /// Alerts dropped from a full outbox before this one, reported so nothing vanishes silently.
    #[serde(skip_serializing_if = "is_zero")]
    pub dropped_alerts_before: u64,
    /// A synthetic incident sent by `xidwatch test-alert`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub test: bool,
    /// What is true about how this incident stands or ended, in words receivers show: "quiet
    /// for 10 min" (an event: nothing was fixed, it only stopped), "recovered: GPU-... reachable
    /// again (same board)", or why a lost GPU cannot be verified. Without it a resolved notice
    /// would read as "fixed" whatever ended it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Incidents this one superseded after they had been paged (an NVML `gpu_missing` paged
    /// before the kernel's Xid 79 that explains it): they get no resolved notice of their own,
    /// since the GPU is no better for being explained, and end with this one. Receivers that
    /// keep one alert per problem (Alertmanager) end theirs when this one resolves.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<Superseded>,
    /// Set on an incident opened together with the same critical fault on other GPUs: the id of
    /// the host page that stood for its opening page. Its own digests and resolved notice name
    /// it, so a receiver can tie them to the page it was shown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_page: Option<String>,
    /// The severities earlier pages of this incident went out under, when a worse finding
    /// raised it since: receivers that key an alert by its labels (Alertmanager) end those, so
    /// the GPU is shown once, at its present severity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paged_as: Vec<Severity>,
}

/// A paged incident folded into a later one (see [`Incident::supersedes`]), with what its alert
/// was labelled by when it went out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Superseded {
    pub id: String,
    pub kind: FindingKind,
    pub xid: Option<u32>,
    pub severity: Severity,
    pub category: Category,
    #[serde(skip_serializing_if = "GpuIdentity::is_empty")]
    pub gpu: GpuIdentity,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Superseded {
    /// `inc` as its successor remembers it: the labels its alert went out under.
    pub fn of(inc: &Incident) -> Superseded {
        Superseded {
            id: inc.id.clone(),
            kind: inc.kind,
            xid: inc.xid,
            severity: inc.severity,
            category: inc.category,
            gpu: inc.gpu.clone(),
        }
    }
}
