//! The status document (`xidwatch.status/v1`): what a running daemon reports about itself, as
//! plain values. The daemon fills it (its telemetry); `xidwatch status`, the
//! verdict and the metrics endpoint read it. It lives here, below the daemon, so that the
//! verdict can judge a document without depending on the daemon that wrote it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::alert::AlertStatus;
use crate::model::{Incident, IncidentPhase, PciAddress, Severity};
/// The health task's gauges, as the source measures them.
pub use crate::source::health::HealthGauges;

/// Version of the [`StatusSnapshot`] document; it only ever gains fields within one version.
pub const STATUS_SCHEMA: &str = "xidwatch.status/v1";

/// Distinct (kind, Xid, GPU) finding series kept before findings fold into `pci="other"`.
pub const MAX_FINDING_SERIES: usize = 4096;
/// Distinct runbook names kept before runs fold into `runbook="other"`.
pub const MAX_RUNBOOKS: usize = 256;
/// Open incidents listed in a snapshot (the most recent first); the total is always exact.
pub const MAX_LISTED_INCIDENTS: usize = 1000;
/// GPUs listed in a snapshot.
pub const MAX_LISTED_GPUS: usize = 1024;

/// The words `serde` uses for an [`IncidentPhase`], which has no `as_str` of its own.
pub fn phase_str(p: IncidentPhase) -> &'static str {
    match p {
        IncidentPhase::Opened => "opened",
        IncidentPhase::Digest => "digest",
        IncidentPhase::Resolved => "resolved",
    }
}

/// One GPU the daemon knows (from NVML's inventory).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSummary {
    pub index: u32,
    pub pci: PciAddress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl From<&crate::source::nvml::GpuInfo> for GpuSummary {
    fn from(g: &crate::source::nvml::GpuInfo) -> Self {
        GpuSummary {
            index: g.index,
            pci: g.pci,
            uuid: g.uuid.clone(),
            name: g.name.clone(),
        }
    }
}

/// One open incident, as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentSummary {
    pub id: String,
    pub title: String,
    pub severity: Severity,
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    pub count: u64,
    /// The kind of the finding that opened it (`fallen_off_bus`, `xid`, ...): the GPU state
    /// (`crate::verdict`) goes by it. Empty from a daemon too old to report it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The GPU it is about; `None` for a host-level incident (a service, the driver).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci: Option<PciAddress>,
    /// A state kind: open until its source verifies the condition is gone, never closed by a
    /// quiet period; with NVML down that check cannot run, so the GPU's state is unknown.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub state: bool,
}

impl From<&Incident> for IncidentSummary {
    fn from(i: &Incident) -> Self {
        IncidentSummary {
            id: i.id.clone(),
            title: i.title.clone(),
            severity: i.severity,
            first_seen_ms: i.first_seen_ms,
            last_seen_ms: i.last_seen_ms,
            count: i.count,
            kind: i.kind.as_str().to_string(),
            pci: i.pci,
            state: crate::incident::is_state(i.kind),
        }
    }
}

/// Resolved incidents kept for `status`, the most recent first.
pub const MAX_RECENTLY_RESOLVED: usize = 20;

/// An incident that resolved (quiet for its quiet period), as `status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResolvedSummary {
    #[serde(flatten)]
    pub incident: IncidentSummary,
    /// When the resolved notice was handed to the alert stage (ms since the epoch).
    pub resolved_ms: u64,
}

/// The kernel log source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KmsgHealth {
    pub path: Option<String>,
    /// Boot id (hex) and last sequence number handled.
    pub boot_id: Option<String>,
    pub last_seq: Option<u64>,
    pub records: u64,
    pub lost: u64,
    pub malformed: u64,
    pub userspace_ignored: u64,
    /// Records whose sequence number jumped far ahead or went backwards (still read).
    pub out_of_sequence: u64,
    /// Lines a reader failed on (a defect in xidwatch, never expected): skipped, and the watch
    /// went on.
    pub unread: u64,
}

/// The NVML source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NvmlHealth {
    pub up: bool,
    /// In words: "ok", "disabled", "driver not loaded", ...
    pub state: String,
    /// When `up`/`state` last changed (ms since the epoch); 0 before the first report.
    pub since_ms: u64,
    /// Rounds of the lost-GPU probe since start (each bus comparison, and each look at a call
    /// that overran its limit): the probe is alive when this grows.
    pub probe_rounds: u64,
}

/// Count of findings for one label set (the metric `xidwatch_findings_total`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingCount {
    pub kind: String,
    /// The Xid as a label value: digits, empty when the finding has none, or `other`.
    pub xid: String,
    /// The PCI address as a label value: empty when the finding names no GPU, or `other`.
    pub pci: String,
    pub severity: Severity,
    pub count: u64,
}

/// Count of incidents handed on, per severity and phase (`xidwatch_incidents_total`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncidentCount {
    pub severity: Severity,
    /// `opened` or `digest`.
    pub phase: String,
    pub count: u64,
}

/// Runs of one runbook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunbookStats {
    pub name: String,
    pub ok: u64,
    pub failed: u64,
    pub duration_sum_secs: f64,
    /// Non-cumulative counts per bucket of [`RUNBOOK_BUCKETS`], plus the `+Inf` bucket last.
    pub buckets: Vec<u64>,
    pub last_run_ms: u64,
    pub last_ok: bool,
}

/// The last config reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadInfo {
    pub ok: bool,
    pub at_ms: u64,
}

/// Config reloads since start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConfigHealth {
    pub last_reload: Option<ReloadInfo>,
    pub reloads_ok: u64,
    pub reload_failures: u64,
    /// Times a change on disk or SIGHUP was looked at, whether it reloaded or changed nothing
    /// in force.
    pub checks: u64,
}

/// Everything `xidwatch status` shows and the metrics endpoint exports, at one instant.
///
/// A versioned document ([`STATUS_SCHEMA`]): fields are only ever added, and readers accept
/// documents with fields missing (`#[serde(default)]`) or unknown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusSnapshot {
    pub schema: String,
    /// When the snapshot was taken (ms since the epoch).
    pub taken_ms: u64,
    pub version: String,
    pub pid: u32,
    /// When the daemon started (ms since the epoch).
    pub started_ms: u64,
    pub kmsg: KmsgHealth,
    pub nvml: NvmlHealth,
    pub gpus: Vec<GpuSummary>,
    pub findings: Vec<FindingCount>,
    /// Findings counted under a folded label (`other`) because of the series cap.
    pub findings_folded: u64,
    /// State writes (position, checkpoint, outbox, status...) that failed since start.
    pub state_write_failures: u64,
    pub incidents: Vec<IncidentCount>,
    /// Exact number of open incidents; `open_incidents` lists at most
    /// [`MAX_LISTED_INCIDENTS`] of them, the most recently seen first.
    pub open_incidents_total: u64,
    pub open_incidents: Vec<IncidentSummary>,
    /// Incidents resolved since the daemon started, the most recent first (at most
    /// [`MAX_RECENTLY_RESOLVED`]).
    #[serde(default)]
    pub recently_resolved: Vec<ResolvedSummary>,
    pub runbooks: Vec<RunbookStats>,
    /// What the kernel gives the daemon to confine runbook steps with (Landlock ABI, seccomp),
    /// in words; empty from a daemon too old to report it.
    pub confinement: String,
    pub config: ConfigHealth,
    /// The alert stage; `None` when no alert channel is configured.
    pub alerts: Option<AlertStatus>,
    /// When the daemon's main loop last went round (ms since the epoch): it beats at least every
    /// the daemon's status interval (10 s), so an old value means a stuck pipeline.
    /// 0 from a daemon too old to report it.
    pub heartbeat_ms: u64,
    /// Set in the last snapshot a daemon writes when it stops cleanly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_ms: Option<u64>,
    /// The health checks' state: only what adds to the findings (see docs/health.md).
    #[serde(default, skip_serializing_if = "HealthGauges::is_empty")]
    pub health: HealthGauges,
}

impl StatusSnapshot {
    /// Milliseconds the daemon had been running when the snapshot was taken.
    pub fn uptime_ms(&self) -> u64 {
        self.taken_ms.saturating_sub(self.started_ms)
    }

    /// Total findings counted, over every label set.
    pub fn findings_total(&self) -> u64 {
        self.findings.iter().map(|f| f.count).sum()
    }
}

/// How long the main loop may go without a heartbeat before `/healthz` fails. It beats at least
/// every status interval (10 s); six missed beats is not a slow disk.
pub const HEALTH_STALE: Duration = Duration::from_secs(60);

/// The liveness verdict for a heartbeat at `heartbeat_ms`, at `now_ms`: healthy or not, and one
/// line that says why.
pub fn health(heartbeat_ms: u64, now_ms: u64) -> (bool, String) {
    let age = now_ms.saturating_sub(heartbeat_ms);
    if age <= HEALTH_STALE.as_millis() as u64 {
        (true, format!("ok: pipeline went round {}s ago", age / 1000))
    } else {
        (
            false,
            format!(
                "stalled: the pipeline has not gone round for {}s (limit {}s)",
                age / 1000,
                HEALTH_STALE.as_secs()
            ),
        )
    }
}
