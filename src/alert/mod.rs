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
//! The rooms, lowest first; each imports only rooms listed before it:
//! - `input` (what the daemon hands over), `error` (setup errors), `retry` (delivery errors,
//!   the backoff and `[alerts.retry]`), `secret` (secrets and their values);
//! - `document` (the `xidwatch.alert/v1` page's shape, the host page, shared wording), then
//!   `handoff` (the drain command, read from a page) and `report` (the readable text), then
//!   `document::build` (the one `PageBuilder`, which assembles every page, hand-off included);
//! - `http` (the HTTP code every HTTP channel shares) and `sink` (the [`sink::Sink`] and
//!   [`sink::ChannelConfig`] traits every channel kind implements);
//! - `channels/<kind>` (one folder per kind: its table, checks, build and delivery);
//! - `config` (the `[alerts]` table, walking every kind through one list), then `channel`
//!   (the built channels);
//! - `outbox` (the durable queue) and `dispatch` (the sender: shared state, workers, intake).

pub mod channel;
pub mod channels;
pub mod config;
pub mod dispatch;
pub mod document;
pub mod error;
pub mod gpu_state;
pub mod handoff;
pub mod http;
pub mod input;
pub mod outbox;
pub mod report;
pub mod retry;
pub mod secret;
pub mod sink;

// Each channel kind by the name it has always had.
pub use channels::{alertmanager, email, slack, webhook};

use std::time::Instant;

use serde::Serialize;

use crate::model::{
    Category, Evidence, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase, Origin,
    PciAddress, Severity,
};

pub use channel::Channel;
pub use config::AlertConfig;
pub use dispatch::{read_status, AlertSender, AlertStatus, ChannelStatus, Dispatcher, SendError};
pub use document::AlertDocument;
pub use error::{AlertError, ConfigIssue};
pub use input::{Alert, CatalogText};
pub use retry::{DeliveryError, FailureKind};
pub use secret::Secret;
pub use sink::ChannelKind;

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
        paged_as: Vec::new(),
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
    let doc = document::build::PageBuilder::new(cfg.handoff.clone()).page(&alert, None, None);
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
