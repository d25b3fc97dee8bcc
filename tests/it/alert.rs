//! Integration tests of the alert stage against real servers on loopback.
//!
//! Always run: golden files for the JSON document, the Slack message and the text report; a
//! webhook receiver (a small HTTP/1.1 server on a loopback port) for headers, signature, retry on
//! 500 and 429, permanent failure on 400, delivery after the receiver comes back, after a
//! restart, and after a SIGKILL of a process that was mid-delivery.
//!
//! Ignored unless asked for (`cargo test -- --include-ignored`, as `.ci/run` does after
//! `.ci/alert-services.sh` started the servers; without them these tests fail, never pass):
//! `XIDWATCH_SMTP_TEST=host:port` + `XIDWATCH_SMTP_MAILDIR` (plain SMTP to aiosmtpd),
//! `XIDWATCH_SMTP_TLS_TEST` + `XIDWATCH_SMTP_TLS_CA` + `XIDWATCH_SMTP_USER`/`_PASSWORD`
//! (STARTTLS + AUTH), `XIDWATCH_ALERTMANAGER_URL` (a real Alertmanager).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::support::{required_env, Receiver, Reply};
use xidwatch::alert::config::{AlertConfig, ChannelKind};
use xidwatch::alert::document::AlertDocument;
use xidwatch::alert::{
    report, slack, test_alert, webhook, Alert, AlertSender, AlertStatus, CatalogText, Dispatcher,
    FailureKind, TestAlertOptions,
};
use xidwatch::model::{
    Category, EchoCount, Evidence, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase,
    Origin, PciAddress, Severity, StepResult, StepStatus,
};

// ---------------------------------------------------------------------------------------------
// Fixtures

fn xid79_incident() -> Incident {
    let pci = PciAddress::parse("0000:17:00.0").ok();
    let mut f = Finding::new(
        FindingKind::Xid,
        Severity::Critical,
        Category::Pcie,
        "GPU has fallen off the bus".to_string(),
    );
    f.xid = Some(79);
    f.pci = pci;
    f.pid = Some(0);
    f.message = "GPU has fallen off the bus.".to_string();
    f.origin = Origin {
        line: 0,
        lines: 1,
        seq: Some(81234),
        ts_usec: Some(9_512_238_711),
        timestamp: Some("[ 9512.238711]".into()),
        raw: vec![
            "NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.".to_string(),
        ],
        ..Default::default()
    };
    let mut g = Finding::new(
        FindingKind::FallenOffBus,
        Severity::Critical,
        Category::Pcie,
        "GPU has fallen off the bus".to_string(),
    );
    g.pci = pci;
    g.origin.raw = vec!["NVRM: GPU 0000:17:00.0: GPU has fallen off the bus.".to_string()];
    Incident {
        id: "b7f3c1d2-79-0000:17:00.0-81234".to_string(),
        phase: IncidentPhase::Opened,
        host: "gpu-node-7".to_string(),
        boot_id: Some("0f5c2b1e-8d43-4c55-9a7e-3b2f1d0c9e8a".to_string()),
        kind: FindingKind::Xid,
        xid: Some(79),
        pci,
        gpu: GpuIdentity {
            index: Some(3),
            uuid: Some("GPU-5d1c8f0e-2b7a-4c3d-9e8f-1a2b3c4d5e6f".to_string()),
            serial: Some("1650923017654".to_string()),
            name: Some("NVIDIA H100 80GB HBM3".to_string()),
        },
        severity: Severity::Critical,
        category: Category::Pcie,
        title: "GPU 3 (0000:17:00.0) fell off the bus".to_string(),
        first_seen_ms: 1_764_404_043_123,
        last_seen_ms: 1_764_404_043_123,
        count: 1,
        findings: vec![f, g],
        echoes: vec![EchoCount {
            kind: FindingKind::FallenOffBus,
            xid: None,
            count: 1,
        }],
        found_at_startup: false,
        before_lookback: false,
        runbook_override: None,
        dropped_alerts_before: 0,
        test: false,
        note: None,
        supersedes: Vec::new(),
        host_page: None,
        paged_as: Vec::new(),
    }
}

fn xid79_evidence() -> Vec<Evidence> {
    vec![Evidence {
        runbook: "gpu-fell-off-bus".to_string(),
        meaning: "The driver can no longer reach GPU 3 over PCI Express: the link went down or the GPU stopped answering. Jobs on this GPU are lost.".to_string(),
        next_steps: "Drain the node. Check the PCIe link and the BMC event log, then reboot; if it happens again, open a hardware case with the serial number.".to_string(),
        steps: vec![
            StepResult {
                name: "pcie-link".to_string(),
                kind: "run".to_string(),
                target: vec!["lspci".into(), "-vvv".into(), "-s".into(), "0000:17:00.0".into()],
                status: StepStatus::Done { exit_code: Some(0) },
                output: "17:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)\n\tLnkCap:\tPort #0, Speed 32GT/s, Width x16\n\tLnkSta:\tSpeed 8GT/s (downgraded), Width x8 (downgraded)\n".to_string(),
                bytes_dropped: 0,
                duration_ms: 41,
                notes: vec!["link degraded: x8 at 8GT/s, capable of x16 at 32GT/s".to_string()],
            },
            StepResult {
                name: "nvidia-smi".to_string(),
                kind: "run".to_string(),
                target: vec!["nvidia-smi".into(), "-q".into(), "-i".into(), "0000:17:00.0".into()],
                status: StepStatus::TimedOut { after_ms: 5000 },
                output: "Unable to determine the device handle for GPU0000:17:00.0: Unknown Error\n".to_string(),
                bytes_dropped: 0,
                duration_ms: 5003,
                notes: vec![],
            },
            StepResult {
                name: "aer-counters".to_string(),
                kind: "read".to_string(),
                target: vec!["/sys/bus/pci/devices/0000:17:00.0/aer_dev_fatal".into()],
                status: StepStatus::Missing { what: "/sys/bus/pci/devices/0000:17:00.0/aer_dev_fatal".into() },
                output: String::new(),
                bytes_dropped: 0,
                duration_ms: 0,
                notes: vec![],
            },
        ],
        started_ms: 1_764_404_043_200,
        duration_ms: 5050,
        host: "gpu-node-7".to_string(),
    }]
}

fn xid79_catalog() -> CatalogText {
    CatalogText {
        mnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS".to_string(),
        summary: "The GPU cannot be reached over PCI Express.".to_string(),
        causes: "Hardware failure on the PCIe link, failing GPU hardware, or a driver problem."
            .to_string(),
        check: "Kernel PCIe (AER) messages and the system event log.".to_string(),
        immediate_bucket: Some("RESTART_BM".to_string()),
        immediate_meaning: Some("restart the machine".to_string()),
        investigatory_bucket: Some("CONTACT_SUPPORT".to_string()),
        investigatory_meaning: Some("contact your support organisation".to_string()),
        applies_to: vec!["A100".into(), "H100".into(), "B100".into(), "GB200".into()],
        source: "NVIDIA Xid catalog (Oct 2025)".to_string(),
    }
}

fn xid79_alert() -> Alert {
    Alert {
        incident: xid79_incident(),
        evidence: xid79_evidence(),
        catalog: Some(xid79_catalog()),
        gpu_state: Some(xidwatch::alert::gpu_state::GpuStateDoc {
            state: "failed".to_string(),
            reasons: vec!["GPU 3 (0000:17:00.0) fell off the bus".to_string()],
            incidents: vec!["b7f3c1d2-79-0000:17:00.0-81234".to_string()],
        }),
    }
}

/// An alert with a unique id, so tests sharing a receiver never confuse theirs.
fn alert_with_id(id: &str, severity: Severity) -> Alert {
    let mut a = xid79_alert();
    a.incident.id = id.to_string();
    a.incident.severity = severity;
    a
}

fn golden_doc() -> AlertDocument {
    let mut doc = AlertDocument::build(&xid79_alert());
    doc.report_path =
        Some("/var/lib/xidwatch/alert-reports/b7f3c1d2-79-0000_17_00_0-81234.txt".to_string());
    // The crate version changes with releases; the golden file should not.
    doc.generator.version = "0.0.0-test".to_string();
    doc
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn golden_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// Compares with a golden file; `UPDATE_GOLDEN=1` rewrites it.
fn check_golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
            path.display()
        )
    });
    if want != actual {
        let tmp = path.with_extension("actual");
        let _ = std::fs::write(&tmp, actual);
        panic!(
            "{} differs from the golden file; actual output written to {} (UPDATE_GOLDEN=1 to accept)",
            path.display(),
            tmp.display()
        );
    }
}

/// Polls `cond` until it holds or `secs` pass.
async fn wait_until(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out after {secs} s waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn parse_cfg(toml_text: &str) -> AlertConfig {
    #[derive(serde::Deserialize)]
    struct Root {
        #[serde(default)]
        alerts: AlertConfig,
    }
    let cfg = toml::from_str::<Root>(toml_text)
        .unwrap_or_else(|e| panic!("{e}\n{toml_text}"))
        .alerts;
    if let Err(errs) = cfg.validate() {
        panic!("config does not validate: {errs:?}\n{toml_text}");
    }
    cfg
}

/// Fast retries for tests; the rest of `[alerts]` as given.
const FAST_RETRY: &str = "[alerts.retry]\ninitial_backoff_ms = 20\nmax_backoff_secs = 1\n";

struct Running {
    sender: AlertSender,
    handle: tokio::task::JoinHandle<()>,
    shutdown: watch::Sender<bool>,
}

impl Running {
    fn start(cfg: &AlertConfig, state: &Path) -> Running {
        let (tx, rx) = watch::channel(false);
        let (sender, handle) = Dispatcher::start(cfg, state, rx).expect("dispatcher starts");
        Running {
            sender,
            handle,
            shutdown: tx,
        }
    }

    fn status(&self) -> AlertStatus {
        self.sender.status()
    }

    /// Waits for `cond` on the status; on timeout the panic shows the whole status.
    async fn wait(&self, what: &str, secs: u64, cond: impl Fn(&AlertStatus) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let st = self.status();
            if cond(&st) {
                return;
            }
            if Instant::now() > deadline {
                panic!("timed out after {secs} s waiting for: {what}\nstatus: {st:#?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn channel(&self, name: &str) -> xidwatch::alert::ChannelStatus {
        self.status()
            .channels
            .into_iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no channel {name}"))
    }

    /// Asks for shutdown and checks the tasks end promptly, whatever the receivers do.
    async fn stop(self) {
        let _ = self.shutdown.send(true);
        tokio::time::timeout(Duration::from_secs(5), self.handle)
            .await
            .expect("the dispatcher stops within 5 s of the shutdown signal")
            .expect("dispatcher task");
    }
}

fn outbox_files(state: &Path) -> Vec<String> {
    match std::fs::read_dir(state.join("alert-outbox")) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".json") && n != "meta.json")
            .collect(),
        Err(_) => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------------------
// The toolkit's HTTP/1.1 receiver on loopback

fn ok() -> Reply {
    Reply::With(200, vec![], "ok".into())
}

/// A loopback port with nothing listening on it (for "receiver down").
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------------------------
// Golden files

#[test]
fn golden_json_document() {
    let doc = golden_doc();
    assert_eq!(doc.schema, "xidwatch.alert/v1");
    assert_eq!(
        doc.headline,
        "gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79, critical"
    );
    check_golden("alert_v1_xid79.json", &(doc.to_json_pretty() + "\n"));
    // The document reads back as itself (the outbox relies on it).
    let back: AlertDocument = serde_json::from_slice(&doc.to_json()).unwrap();
    assert_eq!(back, doc);
}

#[test]
fn golden_slack_message() {
    let doc = golden_doc();
    let payload = slack::payload(&doc);
    check_golden(
        "slack_xid79.json",
        &(serde_json::to_string_pretty(&payload).unwrap() + "\n"),
    );
    let att = &payload["attachments"][0];
    assert_eq!(att["color"], "#d50000");
    let text = payload["text"].as_str().unwrap();
    assert!(text.contains("gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79, critical"));
    let all = serde_json::to_string(&payload).unwrap();
    assert!(
        all.contains("link degraded: x8 at 8GT/s"),
        "key evidence line is in the message"
    );
    assert!(all.contains("1650923017654") && all.contains("GPU-5d1c8f0e"));
    assert!(
        all.contains("/var/lib/xidwatch/alert-reports/"),
        "says where the full report is"
    );
}

#[test]
fn golden_text_report() {
    check_golden("report_xid79.txt", &report::render(&golden_doc()));
}

/// With `[handoff] scheduler = "slurm"`, the page carries the exact drain command: in the text
/// (and so the email) and in Slack.
#[test]
fn golden_page_with_the_slurm_hand_off() {
    use xidwatch::alert::handoff::{suggest, HandoffConfig, Scheduler};
    let mut doc = golden_doc();
    let cfg = HandoffConfig {
        scheduler: Scheduler::Slurm,
        node: None,
    };
    doc.handoff = suggest(&cfg, &doc);
    let want = "scontrol update NodeName=gpu-node-7 State=DRAIN Reason=\"xidwatch: Xid 79 on 0000:17:00.0 (incident b7f3c1d2-79-0000:17:00.0-81234)\"";
    assert_eq!(doc.handoff.as_ref().unwrap().commands, [want]);
    let text = report::render(&doc);
    assert!(text.contains(want), "{text}");
    check_golden("report_xid79_slurm.txt", &text);
    let slack = serde_json::to_string(&slack::payload(&doc)).unwrap();
    assert!(
        slack.contains("scontrol update NodeName=gpu-node-7 State=DRAIN"),
        "{slack}"
    );
}

/// The resolved notice as Slack shows it: short, green, `phase: resolved`, the same incident.
#[test]
fn golden_slack_resolved_notice() {
    let mut alert = xid79_alert();
    alert.incident.phase = IncidentPhase::Resolved;
    alert.incident.last_seen_ms = alert.incident.first_seen_ms + 65_000;
    let mut doc = AlertDocument::build(&alert);
    doc.generator.version = "0.0.0-test".to_string();
    let payload = slack::payload(&doc);
    check_golden(
        "slack_xid79_resolved.json",
        &(serde_json::to_string_pretty(&payload).unwrap() + "\n"),
    );
    assert_eq!(payload["phase"], "resolved");
    assert_eq!(payload["attachments"][0]["color"], "#2e7d32");
    assert!(payload["text"]
        .as_str()
        .unwrap()
        .contains("[RESOLVED] gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus"));
}

#[test]
fn slack_message_stays_within_limits_for_huge_evidence() {
    let mut alert = xid79_alert();
    let line = "NVRM: Xid (PCI:0000:17:00): 79, <&> ".repeat(40);
    alert.incident.findings[0].origin.raw = vec![line; 500];
    alert.evidence[0].steps[0].notes = vec!["n".repeat(5000); 20];
    alert.evidence[0].meaning = "m".repeat(10_000);
    for i in 0..200 {
        let mut s = alert.evidence[0].steps[1].clone();
        s.name = format!("step-{i}");
        alert.evidence[0].steps.push(s);
    }
    let doc = AlertDocument::build(&alert);
    let payload = slack::payload(&doc);
    let blocks = payload["attachments"][0]["blocks"].as_array().unwrap();
    assert!(blocks.len() <= 50);
    let mut total = 0;
    for b in blocks {
        if let Some(t) = b["text"]["text"].as_str() {
            assert!(t.chars().count() <= 3000, "section over 3000 characters");
            total += t.chars().count();
        }
        if let Some(fields) = b["fields"].as_array() {
            assert!(fields.len() <= 10);
            for f in fields {
                assert!(f["text"].as_str().unwrap().chars().count() <= 2000);
            }
        }
    }
    assert!(total < 12_000, "whole message {total} characters");
    // Markup from the log is escaped.
    let all = serde_json::to_string(&payload).unwrap();
    assert!(all.contains("&lt;&amp;&gt;") && !all.contains("<&>"));
}

#[test]
fn digest_is_one_message_with_exact_counts() {
    let mut alert = xid79_alert();
    alert.incident.phase = IncidentPhase::Digest;
    alert.incident.count = 31_250;
    alert.incident.last_seen_ms = alert.incident.first_seen_ms + 5 * 60 * 1000;
    let doc = AlertDocument::build(&alert);
    assert!(
        doc.headline.ends_with("critical (31250 times in 5 min)"),
        "{}",
        doc.headline
    );
    assert_eq!(
        webhook::idempotency_key(&doc),
        format!("{}/digest/31250", doc.id)
    );
    let text = report::render(&doc);
    assert!(text.contains("31250 occurrence(s)"));
}

// ---------------------------------------------------------------------------------------------
// Webhook and Slack against a real HTTP server

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_headers_signature_and_body() {
    let rx = Receiver::start();
    let state = tempfile::tempdir().unwrap();
    // Secrets from files here: setting environment variables in a multi-threaded test process is
    // racy (the unit tests cover `env:`).
    let token_file = state.path().join("token");
    std::fs::write(&token_file, "Bearer tok-123\n").unwrap();
    let secret_file = state.path().join("hmac.secret");
    std::fs::write(&secret_file, "s3cr3t-hmac\n").unwrap();
    let cfg = parse_cfg(&format!(
        r#"
        [[alerts.webhook]]
        name = "receiver"
        url = "{}"
        format = "json"
        hmac_secret = "file:{}"
        headers = {{ Authorization = "file:{}", "X-Team" = "gpu-infra" }}
        "#,
        rx.url_for("/hook"),
        secret_file.display(),
        token_file.display()
    ));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("one request", 10, || rx.requests().len() == 1).await;
    wait_until("outbox empty", 10, || run.status().outbox_count == 0).await;

    let req = &rx.requests()[0];
    assert_eq!(req.path, "/hook");
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(
        req.header("idempotency-key"),
        Some("b7f3c1d2-79-0000:17:00.0-81234")
    );
    assert_eq!(
        req.header("x-xidwatch-incident"),
        Some("b7f3c1d2-79-0000:17:00.0-81234")
    );
    assert_eq!(req.header("x-xidwatch-schema"), Some("xidwatch.alert/v1"));
    assert_eq!(req.header("authorization"), Some("Bearer tok-123"));
    assert_eq!(req.header("x-team"), Some("gpu-infra"));
    assert!(req.header("user-agent").unwrap().starts_with("xidwatch/"));
    // The receiver can check the signature with the shared secret.
    let sig = req
        .header("x-xidwatch-signature")
        .expect("signature header");
    assert_eq!(sig, webhook::sign(b"s3cr3t-hmac", &req.body));
    assert_ne!(sig, webhook::sign(b"wrong", &req.body));

    let body = req.json();
    assert_eq!(body["schema"], "xidwatch.alert/v1");
    assert_eq!(body["gpu"]["pci"], "0000:17:00.0");
    assert_eq!(body["gpu"]["serial"], "1650923017654");
    assert_eq!(
        body["catalog"]["mnemonic"],
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"
    );
    assert_eq!(body["evidence"][0]["steps"].as_array().unwrap().len(), 3);
    assert_eq!(body["evidence"][0]["steps"][1]["status"], "timed_out");
    assert!(body["findings"][0]["raw"][0]
        .as_str()
        .unwrap()
        .contains("Xid (PCI:0000:17:00): 79"));
    // The full report was kept on the host, and the document says where.
    let report_path = body["report_path"].as_str().expect("report_path");
    assert!(std::fs::read_to_string(report_path)
        .unwrap()
        .contains("link degraded"));

    let ch = run.channel("receiver");
    assert_eq!((ch.delivered_total, ch.failed_total, ch.queued), (1, 0, 0));
    assert!(ch.last_success_ms.is_some());
    // Another process (`xidwatch status`) reads the same from the state directory.
    wait_until("status file up to date", 10, || {
        xidwatch::alert::read_status(state.path())
            .is_ok_and(|st| st.outbox_count == 0 && st.channels == run.status().channels)
    })
    .await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_500_and_429_honouring_retry_after() {
    let rx = Receiver::start();
    rx.script(vec![
        Reply::With(500, vec![], "boom".into()),
        Reply::With(
            429,
            vec![("Retry-After".into(), "1".into())],
            "slow down".into(),
        ),
        ok(),
    ]);
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"r\"\nurl = \"{}\"\nformat = \"json\"\n",
        rx.url_for("/h")
    ));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("three requests", 20, || rx.requests().len() == 3).await;
    wait_until("outbox empty", 10, || run.status().outbox_count == 0).await;
    let reqs = rx.requests();
    let keys: Vec<_> = reqs
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert!(
        keys.iter().all(|k| k == &keys[0]),
        "same idempotency key on every retry"
    );
    // Backoff is 20 ms here; only Retry-After explains a gap of a second.
    let gap = reqs[2].at - reqs[1].at;
    assert!(
        gap >= Duration::from_millis(950),
        "Retry-After honoured: {gap:?}"
    );
    let ch = run.channel("r");
    assert_eq!(
        (ch.delivered_total, ch.retries_total, ch.failed_total),
        (1, 2, 0)
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_400_is_permanent_and_the_url_stays_secret() {
    let rx = Receiver::start();
    rx.set_default(Reply::With(400, vec![], "invalid_payload".into()));
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"slack\"\nurl = \"{}\"\nformat = \"slack\"\n",
        rx.url_for("/services/T000/B000/XSECRETTOKENX")
    ));
    assert!(!format!("{cfg:?}").contains("XSECRETTOKENX"));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("failed for good", 10, || {
        run.channel("slack").failed_total == 1
    })
    .await;
    wait_until("outbox empty", 10, || run.status().outbox_count == 0).await;
    assert_eq!(rx.requests().len(), 1, "a 400 is not retried");
    let ch = run.channel("slack");
    let err = ch.last_error.unwrap();
    assert!(
        err.contains("HTTP 400") && err.contains("invalid_payload"),
        "{err}"
    );
    assert!(!err.contains("XSECRETTOKENX"), "{err}");
    assert!(!format!("{:?}", run.sender).contains("XSECRETTOKENX"));
    // It was a Slack message.
    let body = rx.requests()[0].json();
    assert!(body["attachments"][0]["blocks"].is_array());
    assert!(outbox_files(state.path()).is_empty());
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_when_the_receiver_comes_back() {
    let port = free_port();
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"late\"\nurl = \"http://127.0.0.1:{port}/late\"\nformat = \"json\"\n"
    ));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("a failed attempt", 10, || {
        run.channel("late").retries_total >= 1
    })
    .await;
    assert_eq!(outbox_files(state.path()).len(), 1, "waiting in the outbox");
    let err = run.channel("late").last_error.unwrap();
    assert!(err.contains("connect"), "{err}");
    assert!(
        !err.contains("/late") && !err.contains("127.0.0.1:"),
        "no URL in errors: {err}"
    );
    let rx = Receiver::start_on(port);
    wait_until("delivered", 15, || run.channel("late").delivered_total == 1).await;
    wait_until("outbox empty", 10, || outbox_files(state.path()).is_empty()).await;
    assert_eq!(rx.requests().len(), 1);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_is_delivered_after_a_restart() {
    let rx = Receiver::start();
    rx.set_default(Reply::With(503, vec![], "down".into()));
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"r\"\nurl = \"{}\"\nformat = \"json\"\n",
        rx.url_for("/r")
    ));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("a retry", 10, || run.channel("r").retries_total >= 1).await;
    run.stop().await;
    assert_eq!(
        outbox_files(state.path()).len(),
        1,
        "still in the outbox after shutdown"
    );

    rx.set_default(ok());
    let before = rx.requests().len();
    let run = Running::start(&cfg, state.path());
    wait_until("delivered after restart", 15, || {
        run.channel("r").delivered_total == 1
    })
    .await;
    wait_until("outbox empty", 10, || outbox_files(state.path()).is_empty()).await;
    let reqs = rx.requests();
    let last = reqs.last().unwrap();
    assert!(reqs.len() > before);
    assert_eq!(
        last.header("idempotency-key"),
        Some("b7f3c1d2-79-0000:17:00.0-81234")
    );
    assert_eq!(run.status().outbox_count, 0);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_hanging_receiver() {
    let rx = Receiver::start();
    rx.set_default(Reply::Hang);
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "[[alerts.webhook]]\nname = \"hang\"\nurl = \"{}\"\nformat = \"json\"\ntimeout_secs = 120\n",
        rx.url_for("/hang")
    ));
    let run = Running::start(&cfg, state.path());
    run.sender.send(xid79_alert()).await.unwrap();
    wait_until("request in flight", 10, || rx.requests().len() == 1).await;
    run.stop().await; // panics if it takes more than 5 s
    assert_eq!(outbox_files(state.path()).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn severity_filter_digest_and_alertmanager_shape() {
    let rx = Receiver::start();
    let down = free_port();
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        r#"{FAST_RETRY}
        [[alerts.webhook]]
        name = "all"
        url = "{all}"
        format = "json"
        min_severity = "info"
        [[alerts.webhook]]
        name = "pager"
        url = "{pager}"
        format = "json"
        min_severity = "critical"
        [[alerts.alertmanager]]
        name = "am"
        urls = ["http://127.0.0.1:{down}", "{am}"]
        labels = {{ cluster = "test" }}
        "#,
        all = rx.url_for("/all"),
        pager = rx.url_for("/pager"),
        am = rx.url_for("/am"),
    ));
    let run = Running::start(&cfg, state.path());
    let mut warn = alert_with_id("warn-1", Severity::Warning);
    warn.incident.phase = IncidentPhase::Digest;
    warn.incident.count = 4096;
    run.sender.send(warn).await.unwrap();
    wait_until("warning delivered", 15, || {
        run.status().outbox_count == 0 && rx.requests_to("/all").len() == 1
    })
    .await;
    assert!(
        rx.requests_to("/pager").is_empty(),
        "below the pager's minimum severity"
    );
    let all = &rx.requests_to("/all")[0];
    assert_eq!(all.json()["phase"], "digest");
    assert_eq!(all.json()["count"], 4096);
    assert_eq!(all.header("idempotency-key"), Some("warn-1/digest/4096"));

    // Alertmanager: one instance is down, the other accepts; that is a delivery.
    let am = &rx.requests_to("/am/api/v2/alerts")[0];
    let alerts = am.json();
    let a = &alerts.as_array().unwrap()[0];
    assert_eq!(a["labels"]["alertname"], "XidwatchXid");
    assert_eq!(a["labels"]["host"], "gpu-node-7");
    assert_eq!(a["labels"]["gpu"], "3");
    assert_eq!(a["labels"]["pci"], "0000:17:00.0");
    assert_eq!(a["labels"]["xid"], "79");
    assert_eq!(a["labels"]["severity"], "warning");
    assert_eq!(a["labels"]["cluster"], "test");
    for (k, v) in a["labels"].as_object().unwrap() {
        assert!(
            ![
                "id",
                "incident_id",
                "seq",
                "timestamp",
                "count",
                "first_seen",
                "boot_id"
            ]
            .contains(&k.as_str()),
            "{k} does not identify the problem"
        );
        assert!(
            !v.as_str().unwrap().contains("4096"),
            "no counts in labels: {k}={v}"
        );
    }
    assert!(a["annotations"]["summary"]
        .as_str()
        .unwrap()
        .contains("Xid 79"));
    assert!(a["annotations"]["action"]
        .as_str()
        .unwrap()
        .contains("Drain the node"));
    assert!(a["annotations"]["evidence"]
        .as_str()
        .unwrap()
        .contains("link degraded"));
    assert!(a["startsAt"].as_str().unwrap().ends_with('Z'));
    assert!(a["endsAt"].as_str().unwrap() > a["startsAt"].as_str().unwrap());
    assert_eq!(run.channel("am").delivered_total, 1);

    run.sender
        .send(alert_with_id("crit-1", Severity::Critical))
        .await
        .unwrap();
    wait_until("critical reaches the pager", 15, || {
        rx.requests_to("/pager").len() == 1
    })
    .await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_outbox_drops_oldest_non_critical_and_says_so() {
    let rx = Receiver::start();
    rx.set_default(Reply::With(503, vec![], "down".into()));
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[alerts.outbox]\nmax_count = 2\n[[alerts.webhook]]\nname = \"r\"\nurl = \"{}\"\nformat = \"json\"\nmin_severity = \"info\"\n",
        rx.url_for("/full")
    ));
    let run = Running::start(&cfg, state.path());
    for (id, sev) in [
        ("warn-a", Severity::Warning),
        ("warn-b", Severity::Warning),
        ("crit-c", Severity::Critical),
        ("crit-d", Severity::Critical),
    ] {
        run.sender.send(alert_with_id(id, sev)).await.unwrap();
    }
    run.wait("four accepted, two dropped", 10, |s| {
        s.accepted_total == 4 && s.dropped_total == 2
    })
    .await;
    assert_eq!(outbox_files(state.path()).len(), 2);
    let before = rx.requests().len();
    rx.set_default(ok());
    run.wait("outbox drained", 15, |s| s.outbox_count == 0)
        .await;
    let delivered: Vec<serde_json::Value> = rx.requests()[before..]
        .iter()
        .map(super::support::Request::json)
        .collect();
    let ids: Vec<&str> = delivered
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"crit-c") && ids.contains(&"crit-d"),
        "{ids:?}"
    );
    assert!(
        !ids.contains(&"warn-a") && !ids.contains(&"warn-b"),
        "{ids:?}"
    );
    let d = delivered.iter().find(|d| d["id"] == "crit-d").unwrap();
    assert_eq!(
        d["dropped_alerts_before"], 1,
        "crit-d reports warn-a, dropped to make room for crit-c"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_delays_without_dropping() {
    let rx = Receiver::start();
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "[[alerts.webhook]]\nname = \"slow\"\nurl = \"{}\"\nformat = \"json\"\nrate_limit_count = 1\nrate_limit_window_secs = 1\n",
        rx.url_for("/slow")
    ));
    let run = Running::start(&cfg, state.path());
    for i in 0..3 {
        run.sender
            .send(alert_with_id(&format!("rl-{i}"), Severity::Critical))
            .await
            .unwrap();
    }
    wait_until("all three delivered", 20, || rx.requests().len() == 3).await;
    let reqs = rx.requests();
    for w in reqs.windows(2) {
        assert!(
            w[1].at - w[0].at >= Duration::from_millis(950),
            "one per second"
        );
    }
    let ids: Vec<_> = reqs
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_string())
        .collect();
    assert_eq!(ids, ["rl-0", "rl-1", "rl-2"], "in order");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_alert_reports_each_channel() {
    let rx = Receiver::start();
    let cfg = parse_cfg(&format!(
        r#"
        [[alerts.webhook]]
        name = "good"
        url = "{}"
        format = "slack"
        [[alerts.webhook]]
        name = "bad"
        url = "http://127.0.0.1:{}/bad"
        format = "json"
        "#,
        rx.url_for("/good"),
        free_port()
    ));
    let built = xidwatch::alert::channel::BuiltChannels::build(&cfg).unwrap();
    let report = test_alert(
        &cfg,
        &built,
        TestAlertOptions {
            channel: None,
            host: "gpu-node-7".into(),
            evidence: xid79_evidence(),
            now_ms: 1_764_404_043_123,
        },
    )
    .await
    .unwrap();
    assert_eq!(report.results.len(), 2);
    assert!(!report.all_ok());
    let good = report.results.iter().find(|r| r.channel == "good").unwrap();
    assert!(good.ok && good.kind == ChannelKind::Slack);
    let bad = report.results.iter().find(|r| r.channel == "bad").unwrap();
    assert_eq!(bad.failure, Some(FailureKind::Transient));
    let text = report.render();
    assert!(
        text.contains("ok      good (slack)") && text.contains("bad (webhook)"),
        "{text}"
    );
    let body = rx.requests_to("/good")[0].json();
    assert!(body["text"].as_str().unwrap().contains("[TEST]"));

    // Only one channel, by name; an unknown name is an error.
    let one = test_alert(
        &cfg,
        &built,
        TestAlertOptions {
            channel: Some("good".into()),
            host: "h".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(one.all_ok() && one.results.len() == 1);
    assert!(test_alert(
        &cfg,
        &built,
        TestAlertOptions {
            channel: Some("nope".into()),
            ..Default::default()
        }
    )
    .await
    .is_err());
}

// ---------------------------------------------------------------------------------------------
// SIGKILL mid-delivery: a child process (this test binary, one test) sends and is killed while
// the receiver holds the request unanswered; a fresh dispatcher on the same state directory then
// delivers the alert.

const CHILD_STATE: &str = "XIDWATCH_ALERT_CHILD_STATE";
const CHILD_URL: &str = "XIDWATCH_ALERT_CHILD_URL";

/// Not a test: the process `sigkill_mid_delivery_then_restart` starts (with `--ignored`) and
/// kills. Ignored so that a plain run does not count it as a pass; a no-op without its variables.
#[test]
#[ignore = "helper process of sigkill_mid_delivery_then_restart, not a test of its own"]
fn sigkill_child_process() {
    let (Some(state), Some(url)) = (std::env::var_os(CHILD_STATE), std::env::var(CHILD_URL).ok())
    else {
        return;
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let cfg = parse_cfg(&format!(
            "[[alerts.webhook]]\nname = \"r\"\nurl = \"{url}\"\nformat = \"json\"\ntimeout_secs = 120\n"
        ));
        let run = Running::start(&cfg, Path::new(&state));
        run.sender.send(xid79_alert()).await.unwrap();
        // Wait to be killed; give up after a minute so a broken parent leaves nothing behind.
        tokio::time::sleep(Duration::from_secs(60)).await;
        std::process::exit(3);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_delivery_then_restart() {
    let rx = Receiver::start();
    rx.set_default(Reply::Hang);
    let state = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "alert::sigkill_child_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_STATE, state.path())
        .env(CHILD_URL, rx.url_for("/k"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the child is mid-delivery", 30, || rx.requests().len() == 1).await;
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert_eq!(
        outbox_files(state.path()).len(),
        1,
        "the alert survived the kill"
    );

    rx.set_default(ok());
    let cfg = parse_cfg(&format!(
        "[[alerts.webhook]]\nname = \"r\"\nurl = \"{}\"\nformat = \"json\"\n",
        rx.url_for("/k")
    ));
    let run = Running::start(&cfg, state.path());
    wait_until("delivered by the restarted dispatcher", 15, || {
        run.channel("r").delivered_total == 1
    })
    .await;
    wait_until("outbox empty", 10, || outbox_files(state.path()).is_empty()).await;
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].header("idempotency-key"),
        reqs[1].header("idempotency-key")
    );
    assert_eq!(
        reqs[0].body, reqs[1].body,
        "the same document, byte for byte"
    );
    run.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The shipped example config

#[test]
fn example_config_parses_and_validates() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/alerts.example.toml"),
    )
    .expect("docs/alerts.example.toml");
    // The variables the example names, as inline values (no set_var in a threaded test).
    let mut text = text;
    for (k, v) in [
        (
            "SLACK_WEBHOOK_URL",
            "https://hooks.slack.com/services/T0/B0/x",
        ),
        ("RECEIVER_TOKEN", "Bearer abc"),
        ("SMTP_PASSWORD", "pw"),
    ] {
        assert!(text.contains(&format!("\"env:{k}\"")), "{k}");
        text = text.replace(&format!("\"env:{k}\""), &format!("\"inline:{v}\""));
    }
    let dir = tempfile::tempdir().unwrap();
    let text = text.replace("/etc/xidwatch/webhook-hmac.secret", &{
        let p = dir.path().join("hmac");
        std::fs::write(&p, "k").unwrap();
        p.display().to_string()
    });
    let cfg = parse_cfg(&text);
    assert!(cfg.channels().len() >= 4);
}

/// Email through the toolkit's SMTP sink (no server to set up, so it runs everywhere): one
/// message to every recipient, with the page's subject and the incident's header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn email_reaches_an_smtp_sink() {
    let sink = super::support::SmtpSink::start();
    let id = unique("mail");
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://{}\"\nfrom = \"xidwatch <xidwatch@gpu-node-7.example>\"\nto = [\"oncall@example.com\", \"Second <second@example.com>\"]\n",
        sink.addr()
    ));
    let run = Running::start(&cfg, state.path());
    run.sender
        .send(alert_with_id(&id, Severity::Critical))
        .await
        .unwrap();
    run.wait("mail delivered", 20, |s| s.channels[0].delivered_total == 1)
        .await;
    let mails = sink.mails();
    assert_eq!(mails.len(), 1, "{mails:#?}");
    assert_eq!(mails[0].from, "xidwatch@gpu-node-7.example");
    assert_eq!(mails[0].to, ["oncall@example.com", "second@example.com"]);
    let msg = mails[0].unfolded();
    assert!(
        msg.contains(
            "Subject: [xidwatch] gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79,"
        ),
        "{msg}"
    );
    assert!(msg.contains(&format!("X-Xidwatch-Incident: {id}")), "{msg}");
    run.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Opt-in: real SMTP server (aiosmtpd) and real Alertmanager

fn maildir_messages(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for sub in ["new", "cur"] {
        if let Ok(rd) = std::fs::read_dir(dir.join(sub)) {
            for e in rd.flatten() {
                if let Ok(t) = std::fs::read_to_string(e.path()) {
                    out.push(t);
                }
            }
        }
    }
    out
}

fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{n}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an SMTP server: XIDWATCH_SMTP_TEST, XIDWATCH_SMTP_MAILDIR (.ci/alert-services.sh)"]
async fn email_through_a_real_smtp_server() {
    let addr = required_env("XIDWATCH_SMTP_TEST");
    let maildir = required_env("XIDWATCH_SMTP_MAILDIR");
    let id = unique("mail");
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://{addr}\"\nfrom = \"xidwatch <xidwatch@gpu-node-7.example>\"\nto = [\"oncall@example.com\", \"Second <second@example.com>\"]\n"
    ));
    let run = Running::start(&cfg, state.path());
    run.sender
        .send(alert_with_id(&id, Severity::Critical))
        .await
        .unwrap();
    run.wait("mail delivered", 20, |s| s.channels[0].delivered_total == 1)
        .await;
    let msg = {
        let mut found = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while found.is_none() && Instant::now() < deadline {
            found = maildir_messages(Path::new(&maildir))
                .into_iter()
                .find(|m| m.contains(&id));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Unfold long header lines (RFC 5322) before looking at them.
        found
            .expect("the message is in the maildir")
            .replace("\r\n", "\n")
            .replace("\n ", " ")
    };
    let stem = id.replace(':', "_");
    assert!(
        msg.contains(
            "Subject: [xidwatch] gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79,"
        ),
        "{msg}"
    );
    assert!(msg.contains(&format!("xidwatch-{stem}.txt")));
    assert!(msg.contains(&format!("xidwatch-{stem}.json")));
    assert!(msg.contains("application/json"));
    assert!(msg.contains("second@example.com"));
    assert!(msg.contains(&format!("X-Xidwatch-Incident: {id}")));
    assert!(msg.contains("Message-ID: <"));
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an SMTP server with STARTTLS and AUTH: XIDWATCH_SMTP_TLS_TEST and friends (.ci/alert-services.sh)"]
async fn email_starttls_and_auth_through_a_real_smtp_server() {
    let addr = required_env("XIDWATCH_SMTP_TLS_TEST");
    let ca = required_env("XIDWATCH_SMTP_TLS_CA");
    let maildir = required_env("XIDWATCH_SMTP_MAILDIR");
    let user = required_env("XIDWATCH_SMTP_USER");
    required_env("XIDWATCH_SMTP_PASSWORD");
    let id = unique("tls");
    let state = tempfile::tempdir().unwrap();
    let channel = |name: &str, password: &str| {
        format!(
            "[[alerts.email]]\nname = \"{name}\"\nsmtp_url = \"smtp://{addr}\"\ntls = \"starttls\"\nca_file = \"{ca}\"\nfrom = \"xidwatch@example.com\"\nto = [\"oncall@example.com\"]\nusername = \"{user}\"\npassword = \"{password}\"\n"
        )
    };
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}{}{}",
        channel("tls", "env:XIDWATCH_SMTP_PASSWORD"),
        channel("wrongpw", "not-the-password")
    ));
    let run = Running::start(&cfg, state.path());
    run.sender
        .send(alert_with_id(&id, Severity::Critical))
        .await
        .unwrap();
    run.wait("delivered over STARTTLS with AUTH", 20, |s| {
        s.channels
            .iter()
            .any(|c| c.name == "tls" && c.delivered_total == 1)
    })
    .await;
    run.wait("wrong password fails for good", 20, |s| {
        s.channels
            .iter()
            .any(|c| c.name == "wrongpw" && c.failed_total == 1)
    })
    .await;
    let err = run.channel("wrongpw").last_error.unwrap();
    assert!(err.contains("authentication"), "{err}");
    assert!(!err.contains("not-the-password"));
    assert_eq!(
        run.channel("wrongpw").retries_total,
        0,
        "auth failure is permanent"
    );
    let found = maildir_messages(Path::new(&maildir))
        .into_iter()
        .any(|m| m.contains(&id));
    assert!(found);
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an Alertmanager: XIDWATCH_ALERTMANAGER_URL (.ci/alert-services.sh)"]
async fn alertmanager_shows_the_alert_active() {
    let base = required_env("XIDWATCH_ALERTMANAGER_URL");
    let host = unique("am-host");
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"{base}\"]\n"
    ));
    let run = Running::start(&cfg, state.path());
    let mut alert = xid79_alert();
    alert.incident.host = host.clone();
    run.sender.send(alert).await.unwrap();
    wait_until("accepted by Alertmanager", 20, || {
        run.channel("am").delivered_total == 1
    })
    .await;

    let client = reqwest::Client::new();
    let mut url = reqwest::Url::parse(&format!("{base}/api/v2/alerts")).unwrap();
    url.query_pairs_mut()
        .append_pair("filter", &format!("host=\"{host}\""));
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let resp = client.get(url.clone()).send().await.unwrap();
        let list: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        if let Some(a) = list.as_array().and_then(|l| l.first()) {
            if a["status"]["state"] == "active" {
                break a.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "alert not active in Alertmanager: {list}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let l = &found["labels"];
    assert_eq!(l["alertname"], "XidwatchXid");
    assert_eq!(l["host"], host.as_str());
    assert_eq!(l["gpu"], "3");
    assert_eq!(l["pci"], "0000:17:00.0");
    assert_eq!(l["xid"], "79");
    assert_eq!(l["severity"], "critical");
    assert!(found["annotations"]["summary"]
        .as_str()
        .unwrap()
        .contains("fell off the bus"));
    run.stop().await;
}

/// The incident's resolved notice resolves the Alertmanager alert at once (`endsAt` = now): it
/// is active after the page, and gone from the active list after the notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an Alertmanager: XIDWATCH_ALERTMANAGER_URL (.ci/alert-services.sh)"]
async fn alertmanager_resolves_the_alert_on_the_resolved_notice() {
    let base = required_env("XIDWATCH_ALERTMANAGER_URL");
    let host = unique("am-resolve");
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"{base}\"]\nresolve_after_secs = 3600\n"
    ));
    let run = Running::start(&cfg, state.path());
    let mut alert = xid79_alert();
    alert.incident.host = host.clone();
    run.sender.send(alert.clone()).await.unwrap();
    wait_until("the page accepted", 20, || {
        run.channel("am").delivered_total == 1
    })
    .await;
    let client = reqwest::Client::new();
    let mut url = reqwest::Url::parse(&format!("{base}/api/v2/alerts")).unwrap();
    url.query_pairs_mut()
        .append_pair("filter", &format!("host=\"{host}\""));
    let states = || async {
        let resp = client.get(url.clone()).send().await.unwrap();
        let list: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        list.as_array()
            .unwrap()
            .iter()
            .map(|a| a["status"]["state"].as_str().unwrap_or("").to_string())
            .collect::<Vec<_>>()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while states().await != ["active"] {
        assert!(
            Instant::now() < deadline,
            "never active: {:?}",
            states().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    alert.incident.phase = IncidentPhase::Resolved;
    run.sender.send(alert).await.unwrap();
    wait_until("the resolved notice accepted", 20, || {
        run.channel("am").delivered_total == 2
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !states().await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "still listed as active after the resolved notice: {:?}",
            states().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    run.stop().await;
}

/// An incident paged as a warning and raised by a worse finding is one alert in Alertmanager,
/// at its present severity: the digest that raises it ends the warning's alert (whose labels
/// differ only in `severity`), which would otherwise fire on beside the critical one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an Alertmanager: XIDWATCH_ALERTMANAGER_URL (.ci/alert-services.sh)"]
async fn alertmanager_shows_a_raised_incident_once_at_its_new_severity() {
    let base = required_env("XIDWATCH_ALERTMANAGER_URL");
    let host = unique("am-raised");
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"{base}\"]\nresolve_after_secs = 3600\n"
    ));
    let run = Running::start(&cfg, state.path());
    let mut alert = xid79_alert();
    alert.incident.host = host.clone();
    alert.incident.severity = Severity::Warning;
    run.sender.send(alert.clone()).await.unwrap();
    wait_until("the warning accepted", 20, || {
        run.channel("am").delivered_total == 1
    })
    .await;
    let client = reqwest::Client::new();
    let mut url = reqwest::Url::parse(&format!("{base}/api/v2/alerts")).unwrap();
    url.query_pairs_mut()
        .append_pair("filter", &format!("host=\"{host}\""))
        .append_pair("active", "true");
    // The severities Alertmanager lists as active for this host.
    let active = || async {
        let resp = client.get(url.clone()).send().await.unwrap();
        let list: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
        let mut s: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["status"]["state"] == "active")
            .map(|a| a["labels"]["severity"].as_str().unwrap_or("").to_string())
            .collect();
        s.sort();
        s
    };
    let settle = |want: &'static [&'static str], what: &'static str| {
        let active = &active;
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let got = active().await;
                if got == want {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "{what}: active {got:?}, want {want:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    settle(&["warning"], "the warning page").await;

    alert.incident.phase = IncidentPhase::Digest;
    alert.incident.severity = Severity::Critical;
    alert.incident.paged_as = vec![Severity::Warning];
    run.sender.send(alert).await.unwrap();
    wait_until("the raising digest accepted", 20, || {
        run.channel("am").delivered_total == 2
    })
    .await;
    settle(&["critical"], "after the raise").await;
    run.stop().await;
}

/// A resolved notice reaches a webhook as `phase: resolved`, and a Slack-format webhook as a
/// short green message carrying `phase: resolved`; an email channel does not get it unless its
/// `send_resolved` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolved_notices_reach_webhooks_per_channel() {
    let rx = Receiver::start();
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"hook\"\nurl = \"{}\"\nformat = \"json\"\n\
         [[alerts.webhook]]\nname = \"slack\"\nurl = \"{}\"\nformat = \"slack\"\n\
         [[alerts.webhook]]\nname = \"quiet\"\nurl = \"{}\"\nformat = \"json\"\nsend_resolved = false\n",
        rx.url_for("/hook"),
        rx.url_for("/slack"),
        rx.url_for("/quiet"),
    ));
    let run = Running::start(&cfg, state.path());
    let mut alert = xid79_alert();
    alert.incident.phase = IncidentPhase::Resolved;
    run.sender.send(alert).await.unwrap();
    wait_until("the resolved notices", 20, || {
        rx.requests_to("/hook").len() == 1 && rx.requests_to("/slack").len() == 1
    })
    .await;
    let hook = rx.requests_to("/hook")[0].json();
    assert_eq!(hook["phase"], "resolved");
    assert!(hook["headline"].as_str().unwrap().starts_with("[RESOLVED]"));
    assert_eq!(
        rx.requests_to("/hook")[0].header("idempotency-key"),
        Some(format!("{}/resolved", hook["id"].as_str().unwrap()).as_str())
    );
    let slack = rx.requests_to("/slack")[0].json();
    assert_eq!(slack["phase"], "resolved");
    assert!(slack["text"]
        .as_str()
        .unwrap()
        .contains(":white_check_mark:"));
    assert!(rx.requests_to("/quiet").is_empty(), "send_resolved = false");
    run.stop().await;
    assert!(rx.requests_to("/quiet").is_empty());
}

/// Small details of the page: the Slack GPU field is never a bare "GPU" when NVML cannot name
/// the GPU; an echo's kind is not repeated before its Xid; a non-Xid kind is shown once; the
/// same runbook note from two steps is listed once.
#[test]
fn page_details_say_each_thing_once() {
    let mut alert = xid79_alert();
    alert.incident.gpu.index = None;
    alert.incident.echoes = vec![EchoCount {
        kind: FindingKind::Xid,
        xid: Some(45),
        count: 2,
    }];
    let mut second = alert.evidence[0].steps[0].clone();
    second.name = "pcie-link-again".into();
    alert.evidence[0].steps.push(second);
    let doc = AlertDocument::build(&alert);
    let payload = slack::payload(&doc);
    let fields: Vec<String> = payload["attachments"][0]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["fields"].as_array())
        .flatten()
        .map(|f| f["text"].as_str().unwrap().to_string())
        .collect();
    let gpu = fields.iter().find(|f| f.starts_with("*GPU*")).unwrap();
    assert_eq!(gpu, "*GPU*\nindex unknown (NVIDIA H100 80GB HBM3)");
    alert.incident.gpu.name = None;
    let bare = serde_json::to_string(&slack::payload(&AlertDocument::build(&alert))).unwrap();
    assert!(
        bare.contains("*GPU*\\nindex unknown (NVML cannot name it)"),
        "{bare}"
    );
    assert!(fields.iter().any(|f| f == "*PCI*\n`0000:17:00.0`"));
    let text = report::render(&doc);
    assert!(text.contains("\n  Xid 45: 2 time(s)\n"), "{text}");
    assert!(!text.contains("xid Xid"), "{text}");
    assert_eq!(
        doc.notes().len(),
        1,
        "one note, not one per step: {:?}",
        doc.notes()
    );

    let mut aer = xid79_alert();
    aer.incident.kind = FindingKind::PcieAer;
    aer.incident.xid = None;
    aer.catalog = Some(CatalogText {
        mnemonic: "pcie_aer".into(),
        ..CatalogText::default()
    });
    let doc = AlertDocument::build(&aer);
    let text = report::summary(&doc);
    assert!(
        text.contains("Fault:     PCIe AER error (category"),
        "{text}"
    );
    let all = serde_json::to_string(&slack::payload(&doc)).unwrap();
    assert!(all.contains("*Fault*\\nPCIe AER error\""), "{all}");
}

/// The path every real incident takes: the alert is held during the settle delay and while its
/// runbook runs, then the evidence is attached. The opening page sent to Slack and to the webhook
/// names the report file kept on the host, and that file holds the attached evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_alert_with_attached_evidence_names_its_report() {
    let rx = Receiver::start();
    let state = tempfile::tempdir().unwrap();
    let cfg = parse_cfg(&format!(
        "{FAST_RETRY}[[alerts.webhook]]\nname = \"hook\"\nurl = \"{}\"\nformat = \"json\"\n\
         [[alerts.webhook]]\nname = \"slack\"\nurl = \"{}\"\nformat = \"slack\"\n",
        rx.url_for("/hook"),
        rx.url_for("/slack"),
    ));
    let run = Running::start(&cfg, state.path());
    let mut bare = alert_with_id("held-then-attached", Severity::Critical);
    bare.evidence.clear();
    let ack = run
        .sender
        .submit(bare, Some(Duration::from_secs(60)), None)
        .await
        .unwrap();
    ack.await.unwrap();
    assert!(rx.requests().is_empty(), "held: nothing sent yet");
    run.sender
        .attach_evidence(alert_with_id("held-then-attached", Severity::Critical))
        .await
        .unwrap();
    wait_until("the opening page on both channels", 20, || {
        rx.requests_to("/hook").len() == 1 && rx.requests_to("/slack").len() == 1
    })
    .await;
    let hook = rx.requests_to("/hook")[0].json();
    let path = hook["report_path"]
        .as_str()
        .unwrap_or_else(|| panic!("the opening document names its report: {hook:#}"))
        .to_string();
    assert!(
        Path::new(&path).starts_with(state.path()),
        "{path} lies in the state directory"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("link degraded"),
        "the evidence is in it: {text}"
    );
    let slack = serde_json::to_string(&rx.requests_to("/slack")[0].json()).unwrap();
    assert!(
        slack.contains(&path),
        "the Slack footer names {path}: {slack}"
    );
    assert!(!slack.contains("journal"), "{slack}");
    run.stop().await;
}

// ---------------------------------------------------------------------------------------------
// What the page says: the truth, in words, in order

fn step(name: &str, status: StepStatus, output: &str, notes: &[&str]) -> StepResult {
    StepResult {
        name: name.to_string(),
        kind: "run".to_string(),
        target: vec![name.to_string()],
        status,
        output: output.to_string(),
        bytes_dropped: 0,
        duration_ms: 3,
        notes: notes.iter().map(|n| n.to_string()).collect(),
    }
}

fn slack_section(payload: &serde_json::Value, title: &str) -> String {
    payload["attachments"][0]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"]["text"].as_str())
        .find(|t| t.starts_with(title))
        .unwrap_or_else(|| panic!("no {title} section: {payload:#}"))
        .to_string()
}

/// The Slack evidence says what each step found (a note, or the first line of its output), says
/// once which programs are not installed, and when it is too long cuts between whole items,
/// saying how many were left out and where the full report is.
#[test]
fn slack_evidence_shows_findings_collapses_missing_and_cuts_at_whole_items() {
    let mut alert = xid79_alert();
    let missing = |p: &str| StepStatus::Missing {
        what: format!("{p} is not installed (searched /usr/local/bin:/usr/bin:/usr/sbin)"),
    };
    let done = StepStatus::Done { exit_code: Some(0) };
    let mut steps = vec![
        step("dmidecode", missing("dmidecode"), "", &[]),
        step("ipmitool", missing("ipmitool"), "", &[]),
        step(
            "driver version",
            done.clone(),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03\nGCC version: 12\n",
            &[],
        ),
        step("ipmitool again", missing("ipmitool"), "", &[]),
    ];
    for i in 0..30 {
        steps.push(step(
            &format!("sysfs read {i}"),
            done.clone(),
            &format!(
                "/sys/bus/pci/devices/0000:17:00.0/very/long/path/number/{i}/current_link_speed\n"
            ),
            &[],
        ));
    }
    alert.evidence[0].steps.extend(steps);
    let mut doc = AlertDocument::build(&alert);
    doc.report_path = Some("/var/lib/xidwatch/alert-reports/x.txt".to_string());
    let ev = slack_section(&slack::payload(&doc), "*Evidence*");
    assert!(!ev.contains("is not installed"), "{ev}");
    assert_eq!(
        ev.matches(
            "not installed here: dmidecode, ipmitool (searched /usr/local/bin:/usr/bin:/usr/sbin)"
        )
        .count(),
        1,
        "{ev}"
    );
    assert!(
        ev.contains("NVIDIA UNIX x86_64 Kernel Module  535.54.03"),
        "{ev}"
    );
    assert!(ev.contains("link degraded: x8 at 8GT/s"), "{ev}");
    assert!(!ev.contains('…'), "cut mid-item: {ev}");
    for l in ev.lines().skip(1) {
        assert!(
            l.starts_with("• ") || l.starts_with("runbook ") || l.starts_with('_'),
            "not a whole item: {l:?}\n{ev}"
        );
        if l.contains("very/long/path") {
            assert!(l.ends_with("current_link_speed"), "a path cut: {l:?}");
        }
    }
    let last = ev.lines().last().unwrap();
    assert!(
        last.contains("more item(s) left out")
            && last.contains("/var/lib/xidwatch/alert-reports/x.txt"),
        "{last}"
    );
}

/// An API mismatch page states both versions; the kind names never stand where words belong.
#[test]
fn an_api_mismatch_page_states_both_versions_in_words() {
    let mut alert = xid79_alert();
    let inc = &mut alert.incident;
    inc.kind = FindingKind::ApiMismatch;
    inc.xid = None;
    inc.title = "driver API mismatch: user-space driver and kernel module versions differ".into();
    inc.echoes = vec![EchoCount {
        kind: FindingKind::PcieAer,
        xid: None,
        count: 1,
    }];
    let f = &mut inc.findings[0];
    f.kind = FindingKind::ApiMismatch;
    f.xid = None;
    f.origin.raw = vec!["NVRM: API mismatch: the client has the version 535.54.03, but".into()];
    f.detail = Some(xidwatch::model::Detail::ApiMismatch {
        client_version: "535.54.03".into(),
        kernel_version: "525.85.12".into(),
    });
    alert.evidence.clear();
    alert.catalog = None;
    let doc = AlertDocument::build(&alert);
    let slack = serde_json::to_string(&slack::payload(&doc)).unwrap();
    let text = report::render(&doc);
    for page in [&slack, &text] {
        assert!(
            page.contains("535.54.03")
                && page.contains("525.85.12")
                && page.contains("kernel module version 525.85.12"),
            "{page}"
        );
        assert!(
            !page.contains("api_mismatch") && !page.contains("pcie_aer"),
            "{page}"
        );
        assert!(page.contains("PCIe AER error"), "{page}");
    }
    assert!(slack.contains("driver API mismatch"), "{slack}");
}

/// `RmInitAdapter failed!` and the `rm_init_adapter failed, device minor number N` after it are
/// one failure: one occurrence on the page, both lines kept.
#[test]
fn rm_init_adapter_and_its_minor_number_line_are_one_event() {
    let mut alert = xid79_alert();
    let inc = &mut alert.incident;
    inc.kind = FindingKind::DriverInitFailure;
    inc.xid = None;
    inc.count = 2;
    inc.echoes.clear();
    inc.title = "GPU 3 (0000:17:00.0) failed to initialise".into();
    // The two lines as the classifier reads them: the pair is told by the shapes that read it.
    let mut c = xidwatch::classify::Classifier::new();
    let mut read = Vec::new();
    for (seq, ts, line) in [
        (
            100,
            "[   12.500000]",
            "NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x22:0x56:884)",
        ),
        (
            101,
            "[   12.500100]",
            "NVRM: rm_init_adapter failed, device minor number 3",
        ),
    ] {
        let at = xidwatch::classify::LineOrigin {
            line: 0,
            seq: Some(seq),
            ts_usec: None,
            timestamp: Some(ts.into()),
        };
        c.push(line, &at, &mut read);
    }
    c.flush(&mut read);
    assert_eq!(read.len(), 2, "{read:#?}");
    assert!(read
        .iter()
        .all(|f| f.kind == FindingKind::DriverInitFailure));
    inc.findings = read;
    alert.evidence.clear();
    alert.catalog = None;
    let doc = AlertDocument::build(&alert);
    assert_eq!(doc.count, 1);
    assert_eq!(doc.findings.len(), 1);
    assert_eq!(
        doc.kernel_lines(),
        vec![
            "[   12.500000] NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x22:0x56:884)",
            "[   12.500100] NVRM: rm_init_adapter failed, device minor number 3",
        ]
    );
    let slack = serde_json::to_string(&slack::payload(&doc)).unwrap();
    assert!(slack.contains(" x1"), "{slack}");
    assert!(!slack.contains(" x2"), "{slack}");
    assert!(!slack.contains("driver_init_failure"), "{slack}");
    assert!(slack.contains("driver initialisation failure"), "{slack}");
    let text = report::render(&doc);
    assert!(text.contains(", 1 occurrence(s)"), "{text}");
    assert!(!text.contains("driver_init_failure"), "{text}");
}

/// The second Xid 79 on a board is not a duplicate: its headline and mail subject carry the
/// escalation.
#[test]
fn a_repeat_offenders_headline_and_subject_carry_the_escalation() {
    let first = AlertDocument::build(&xid79_alert());
    let mut alert = xid79_alert();
    let summary = xidwatch::history::Summary {
        count_in_window: 2,
        window_days: 30,
        repeat_offender: true,
        earlier: Vec::new(),
        board: "serial:1650923017654".into(),
        what: "Xid 79".into(),
    };
    alert.evidence.push(xidwatch::history::evidence(
        &summary,
        "gpu-node-7",
        1_764_404_043_300,
    ));
    let doc = AlertDocument::build(&alert);
    assert_ne!(doc.headline, first.headline);
    assert_eq!(
        doc.headline,
        "gpu-node-7: GPU 3 (0000:17:00.0) fell off the bus - Xid 79 (2nd time in 30 days: replace the board), critical"
    );
    let from: lettre::message::Mailbox = "xidwatch <xidwatch@example.org>".parse().unwrap();
    let msg =
        xidwatch::alert::email::message(&doc, &from, std::slice::from_ref(&from), "[xidwatch]")
            .unwrap();
    // Headers are folded at 78 characters: unfold before reading the subject.
    let head = String::from_utf8_lossy(&msg.formatted()).replace("\r\n ", " ");
    let subject = head
        .lines()
        .find(|l| l.starts_with("Subject:"))
        .unwrap_or_default()
        .to_string();
    assert!(subject.contains("2nd time in 30 days"), "{subject}");
}

/// The kernel-log block is in the order the kernel wrote it: an AER line before the Xid is shown
/// before it, though the Xid leads the findings as the cause.
#[test]
fn the_kernel_log_block_is_in_kernel_order() {
    let mut alert = xid79_alert();
    let mut aer = Finding::new(
        FindingKind::PcieAer,
        Severity::Critical,
        Category::Pcie,
        "PCIe AER: fatal error",
    );
    aer.origin.seq = Some(81230);
    aer.origin.timestamp = Some("[ 9512.100231]".into());
    aer.origin.raw =
        vec!["pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0".into()];
    alert.incident.findings[1].origin.seq = Some(81235);
    alert.incident.findings.push(aer);
    let doc = AlertDocument::build(&alert);
    let lines = doc.kernel_lines();
    assert!(
        lines[0].starts_with("[ 9512.100231] pcieport"),
        "{lines:#?}"
    );
    assert!(
        lines[1].starts_with("[ 9512.238711] NVRM: Xid"),
        "{lines:#?}"
    );
    let text = report::render(&doc);
    let (aer_at, xid_at) = (
        text.find("AER: Uncorrected").unwrap(),
        text.find("NVRM: Xid").unwrap(),
    );
    assert!(aer_at < xid_at, "{text}");
}
