//! The alert stage: turns an [`Incident`] and its [`Evidence`] into messages people read (Slack,
//! email, standard output) and documents machines read (webhook JSON, Alertmanager), and delivers
//! them without losing any.
//!
//! Flow: the daemon hands an [`Alert`] to the [`Dispatcher`] through a bounded channel; the
//! dispatcher builds the [`AlertDocument`] once, writes it to the on-disk [`outbox`] and only then
//! sends it to every channel that wants it, with retries. The outbox file is removed when every
//! channel has accepted the alert or failed for good, so a crash or restart re-sends what was
//! pending (at least once; receivers deduplicate on the stable incident id).
//!
//! `config` is the `[alerts]` table, `document` the `xidwatch.alert/v1` JSON document, `report`
//! the readable text, `slack`/`webhook`/`email`/`alertmanager` the channels, `retry` the backoff
//! policy, `outbox` the durable queue and `dispatch` the sender loop.

pub mod alertmanager;
pub mod channel;
pub mod config;
pub mod dispatch;
pub mod document;
pub mod email;
pub mod gpu_state;
pub mod handoff;
pub mod outbox;
pub mod report;
pub mod retry;
pub mod slack;
pub mod webhook;

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::model::{
    Category, Evidence, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase, Origin,
    PciAddress, Severity,
};

pub use channel::Channel;
pub use config::{AlertConfig, ChannelKind, Secret};
pub use dispatch::{read_status, AlertSender, AlertStatus, ChannelStatus, Dispatcher, SendError};
pub use document::AlertDocument;
pub use retry::{DeliveryError, FailureKind};

/// One alert as the daemon hands it over.
#[derive(Debug, Clone)]
pub struct Alert {
    pub incident: Incident,
    pub evidence: Vec<Evidence>,
    /// The catalog's words for this fault, when the classifier knows it.
    pub catalog: Option<CatalogText>,
    /// The GPU's (or host's) state when the daemon handed the alert over; `None` where no
    /// daemon judged it (`scan`, `test-alert`).
    pub gpu_state: Option<gpu_state::GpuStateDoc>,
}

/// The catalog's text for one fault, filled by the classify stage from NVIDIA's catalog. Plain
/// strings on purpose: the alert stage only shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogText {
    /// NVIDIA's mnemonic, e.g. `ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`.
    pub mnemonic: String,
    /// What the fault is, in a sentence.
    pub summary: String,
    /// Usual causes (NVIDIA's trigger conditions, in the project's words).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub causes: String,
    /// What to check first.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub check: String,
    /// NVIDIA's immediate-action bucket (`RESTART_BM`, `RESET_GPU`, ...) and what it means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate_bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub immediate_meaning: Option<String>,
    /// NVIDIA's investigatory-action bucket (`CONTACT_SUPPORT`, ...) and what it means.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub investigatory_bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub investigatory_meaning: Option<String>,
    /// GPU families the code applies to (`A100`, `H100`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applies_to: Vec<String>,
    /// Where the text came from (catalog name and date).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

impl CatalogText {
    /// "Immediate: RESTART_BM (restart the machine). Then: CONTACT_SUPPORT (...)", when known.
    pub fn action_words(&self) -> Option<String> {
        let part = |bucket: &Option<String>, meaning: &Option<String>| match (bucket, meaning) {
            (Some(b), Some(m)) if !m.trim().is_empty() => Some(format!("{b} ({})", m.trim())),
            (Some(b), _) => Some(b.clone()),
            (None, Some(m)) if !m.trim().is_empty() => Some(m.trim().to_string()),
            _ => None,
        };
        let imm = part(&self.immediate_bucket, &self.immediate_meaning);
        let inv = part(&self.investigatory_bucket, &self.investigatory_meaning);
        match (imm, inv) {
            // NVIDIA gives some Xids (48, 145) one bucket for both steps: said once.
            (Some(a), Some(b)) if a == b => Some(format!("Immediate, then investigate: {a}.")),
            (Some(a), Some(b)) => Some(format!("Immediate: {a}. Then: {b}.")),
            (Some(a), None) => Some(format!("Immediate: {a}.")),
            (None, Some(b)) => Some(format!("Investigate: {b}.")),
            (None, None) => None,
        }
    }
}

/// A clearly marked synthetic alert for `xidwatch test-alert`: Xid 79 on a GPU that does not
/// exist, with whatever real evidence the caller gathered on this machine.
pub fn synthetic_alert(host: &str, now_ms: u64, evidence: Vec<Evidence>) -> Alert {
    let pci = PciAddress::new(0, 0xff, 0x1f, 0);
    let mut finding = Finding::new(
        FindingKind::Xid,
        Severity::Critical,
        Category::Pcie,
        "GPU has fallen off the bus (TEST)".to_string(),
    );
    finding.xid = Some(79);
    finding.pci = pci;
    finding.message =
        "GPU has fallen off the bus. (synthetic test line from xidwatch test-alert)".to_string();
    finding.origin = Origin {
        line: 0,
        lines: 1,
        seq: None,
        ts_usec: None,
        timestamp: None,
        raw: vec![
            "NVRM: Xid (PCI:0000:ff:1f): 79, pid=0, name=xidwatch-test, GPU has fallen off the bus. [xidwatch test-alert: this line is synthetic]"
                .to_string(),
        ],
        raw_ts_usec: Vec::new(),
    };
    let incident = Incident {
        id: format!("test-{host}-{now_ms}"),
        phase: IncidentPhase::Opened,
        host: host.to_string(),
        boot_id: None,
        kind: FindingKind::Xid,
        xid: Some(79),
        pci,
        gpu: GpuIdentity {
            index: Some(99),
            uuid: Some("GPU-00000000-0000-0000-0000-000000000000".to_string()),
            serial: Some("TEST-SERIAL".to_string()),
            name: Some("xidwatch test GPU".to_string()),
        },
        severity: Severity::Critical,
        category: Category::Pcie,
        title: "TEST ALERT: GPU 99 (0000:ff:1f.0) fell off the bus (synthetic, nothing is wrong)"
            .to_string(),
        first_seen_ms: now_ms,
        last_seen_ms: now_ms,
        count: 1,
        findings: vec![finding],
        echoes: Vec::new(),
        found_at_startup: false,
        before_lookback: false,
        runbook_override: None,
        dropped_alerts_before: 0,
        test: true,
        note: None,
        supersedes: Vec::new(),
        host_page: None,
    };
    Alert {
        incident,
        evidence,
        catalog: Some(CatalogText {
            mnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS".to_string(),
            summary: "This is a test alert sent by `xidwatch test-alert`. A real Xid 79 means the driver could no longer reach the GPU over PCI Express.".to_string(),
            immediate_bucket: Some("RESTART_BM".to_string()),
            immediate_meaning: Some("nothing to do: this is a test".to_string()),
            source: "xidwatch test-alert".to_string(),
            ..CatalogText::default()
        }),
        gpu_state: None,
    }
}

/// What the caller of `xidwatch test-alert` passes in.
#[derive(Debug, Clone, Default)]
pub struct TestAlertOptions {
    /// Only this channel (by name); all enabled channels when `None`.
    pub channel: Option<String>,
    /// The host name to report.
    pub host: String,
    /// Real runbook evidence gathered on this machine.
    pub evidence: Vec<Evidence>,
    /// Wall clock, milliseconds since the Unix epoch.
    pub now_ms: u64,
}

/// What happened on one channel during `test-alert`.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelTestResult {
    pub channel: String,
    pub kind: ChannelKind,
    pub ok: bool,
    /// For a failure: whether it would be retried in the daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<FailureKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub elapsed_ms: u64,
}

/// The per-channel outcome of `test-alert`.
#[derive(Debug, Clone, Serialize)]
pub struct TestAlertReport {
    pub incident_id: String,
    pub results: Vec<ChannelTestResult>,
}

impl TestAlertReport {
    pub fn all_ok(&self) -> bool {
        !self.results.is_empty() && self.results.iter().all(|r| r.ok)
    }

    /// One line per channel, for the terminal.
    pub fn render(&self) -> String {
        let mut out = format!("test alert {}\n", self.incident_id);
        if self.results.is_empty() {
            out.push_str("  no channel selected\n");
        }
        for r in &self.results {
            let line = if r.ok {
                format!(
                    "  ok      {} ({}) in {} ms\n",
                    r.channel,
                    r.kind.as_str(),
                    r.elapsed_ms
                )
            } else {
                let how = match r.failure {
                    Some(FailureKind::Permanent) => "FAILED (permanent)",
                    _ => "FAILED (would retry)",
                };
                format!(
                    "  {how} {} ({}) after {} ms: {}\n",
                    r.channel,
                    r.kind.as_str(),
                    r.elapsed_ms,
                    r.error.as_deref().unwrap_or("")
                )
            };
            out.push_str(&line);
        }
        out
    }
}

/// Errors of the alert stage's setup (delivery failures are [`DeliveryError`]s).
#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("invalid alert configuration:\n  {}", .0.join("\n  "))]
    Config(Vec<String>),
    #[error("alert channel {channel}: {message}")]
    Channel { channel: String, message: String },
    #[error("no alert channel named {0:?} is configured")]
    NoSuchChannel(String),
    #[error("alert outbox {path}: {message}")]
    Outbox { path: String, message: String },
}

/// Sends a synthetic alert once to each selected channel, directly (no outbox, no retries, no
/// severity filter or rate limit), and reports what each channel said.
pub async fn test_alert(
    cfg: &AlertConfig,
    built: &channel::BuiltChannels,
    opts: TestAlertOptions,
) -> Result<TestAlertReport, AlertError> {
    let mut channels: Vec<std::sync::Arc<Channel>> = built.0.iter().cloned().collect();
    if let Some(name) = &opts.channel {
        channels.retain(|c| c.name() == name);
        if channels.is_empty() {
            return Err(AlertError::NoSuchChannel(name.clone()));
        }
    }
    let alert = synthetic_alert(&opts.host, opts.now_ms, opts.evidence);
    let mut doc = AlertDocument::build(&alert);
    doc.handoff = handoff::suggest(&cfg.handoff, &doc);
    let mut results = Vec::new();
    for ch in &channels {
        let start = Instant::now();
        let outcome = ch.deliver(&doc).await;
        let elapsed_ms = start.elapsed().as_millis() as u64;
        results.push(match outcome {
            Ok(()) => ChannelTestResult {
                channel: ch.name().to_string(),
                kind: ch.kind(),
                ok: true,
                failure: None,
                error: None,
                elapsed_ms,
            },
            Err(e) => ChannelTestResult {
                channel: ch.name().to_string(),
                kind: ch.kind(),
                ok: false,
                failure: Some(e.kind),
                error: Some(e.message),
                elapsed_ms,
            },
        });
    }
    Ok(TestAlertReport {
        incident_id: doc.id,
        results,
    })
}
