//! Operating the daemon: the Prometheus endpoint over real TCP, the status socket over a real
//! Unix socket, `status.json`, and `xidwatch status` as a process. No root needed; the one test
//! that switches users needs root and is `#[ignore]`d (`--include-ignored` runs it).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use xidwatch::alert::{AlertStatus, ChannelKind, ChannelStatus};
use xidwatch::config::Config;
use xidwatch::daemon::control::{self, QueryError};
use xidwatch::daemon::metrics;
use xidwatch::daemon::telemetry::{GpuSummary, StatusSnapshot, Telemetry};
use xidwatch::model::{
    Category, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase, PciAddress, Severity,
};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn pci(s: &str) -> PciAddress {
    PciAddress::parse(s).unwrap()
}

fn finding(kind: FindingKind, xid: Option<u32>, at: Option<&str>, sev: Severity) -> Finding {
    let mut f = Finding::new(kind, sev, Category::Pcie, "test");
    f.xid = xid;
    f.pci = at.map(pci);
    f
}

fn incident(id: &str, sev: Severity, phase: IncidentPhase) -> Incident {
    Incident {
        id: id.into(),
        phase,
        host: "gpu-node-01".into(),
        boot_id: None,
        kind: FindingKind::Xid,
        xid: Some(79),
        pci: Some(pci("0000:3b:00.0")),
        gpu: GpuIdentity::default(),
        severity: sev,
        category: Category::Pcie,
        title: "GPU 3 (0000:3b:00.0) fell off the bus".into(),
        first_seen_ms: now_ms() - 120_000,
        last_seen_ms: now_ms() - 60_000,
        count: 3,
        findings: Vec::new(),
        echoes: Vec::new(),
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

/// A telemetry record with something in every family.
fn fed() -> Arc<Telemetry> {
    let t = Arc::new(Telemetry::new());
    t.set_kmsg_path(Path::new("/dev/kmsg"));
    t.kmsg_records(1200);
    t.kmsg_lost(7);
    t.kmsg_malformed(2);
    t.kmsg_userspace_ignored(1);
    t.set_kmsg_position("5f2c1e0a7b3d4c619e8f0a1b2c3d4e5f", 4711);
    t.set_nvml(true, "ok");
    t.set_gpus(vec![GpuSummary {
        index: 3,
        pci: pci("0000:3b:00.0"),
        uuid: Some("GPU-1234".into()),
        name: Some("NVIDIA H100 80GB HBM3".into()),
    }]);
    for _ in 0..3 {
        t.record_finding(&finding(
            FindingKind::Xid,
            Some(79),
            Some("0000:3b:00.0"),
            Severity::Critical,
        ));
    }
    t.record_finding(&finding(
        FindingKind::Xid,
        Some(13),
        Some("0000:5e:00.0"),
        Severity::Warning,
    ));
    t.record_finding(&finding(
        FindingKind::KmsgOverrun,
        None,
        None,
        Severity::Warning,
    ));
    let inc = incident("xid79-abc", Severity::Critical, IncidentPhase::Opened);
    t.record_incident(&inc);
    t.record_incident(&incident(
        "xid79-abc",
        Severity::Critical,
        IncidentPhase::Digest,
    ));
    t.record_incident(&incident(
        "xid79-old",
        Severity::Critical,
        IncidentPhase::Resolved,
    ));
    t.set_open_incidents_from([&inc]);
    t.runbook_run("xid79", Duration::from_millis(1500), true);
    t.runbook_run("xid79", Duration::from_secs(45), false);
    t.config_reloaded(false, now_ms());
    let status = AlertStatus {
        updated_ms: now_ms(),
        channels: vec![ChannelStatus {
            name: "slack".into(),
            kind: ChannelKind::Slack,
            queued: 1,
            delivered_total: 5,
            failed_total: 1,
            retries_total: 2,
            last_success_ms: Some(now_ms() - 3_600_000),
            last_failure_ms: Some(now_ms() - 60_000),
            last_error: Some("HTTP 503 from hooks.slack.com".into()),
        }],
        outbox_count: 1,
        outbox_bytes: 2048,
        dropped_total: 0,
        accepted_total: 6,
    };
    t.set_alert_status_provider(Some(Arc::new(move || status.clone())));
    t
}

// ---------------------------------------------------------------------------------------------
// Metrics endpoint

struct Served {
    addr: std::net::SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn serve_metrics(t: Arc<Telemetry>) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(metrics::serve(listener, t, rx));
    Served { addr, stop, task }
}

/// One raw HTTP exchange on a blocking socket (off the runtime's threads).
async fn http(addr: std::net::SocketAddr, request: Vec<u8>) -> String {
    tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(&request).unwrap();
        let mut out = Vec::new();
        // The server may close while a too-large request is still being written; whatever
        // arrived before the reset is the answer.
        let _ = s.read_to_end(&mut out);
        String::from_utf8(out).unwrap()
    })
    .await
    .unwrap()
}

fn body(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_every_metric_with_its_labels() {
    let t = fed();
    let srv = serve_metrics(t.clone()).await;
    let resp = http(
        srv.addr,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n".to_vec(),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200 OK\r\n"), "{resp}");
    assert!(
        resp.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{resp}"
    );
    let text = body(&resp);
    let len: usize = resp
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(len, text.len());
    for line in [
        "xidwatch_up 1",
        "xidwatch_findings_total{kind=\"xid\",xid=\"79\",pci=\"0000:3b:00.0\",severity=\"critical\"} 3",
        "xidwatch_findings_total{kind=\"xid\",xid=\"13\",pci=\"0000:5e:00.0\",severity=\"warning\"} 1",
        "xidwatch_findings_total{kind=\"kmsg_overrun\",xid=\"\",pci=\"\",severity=\"warning\"} 1",
        "xidwatch_incidents_total{severity=\"critical\",phase=\"opened\"} 1",
        "xidwatch_incidents_total{severity=\"critical\",phase=\"digest\"} 1",
        "xidwatch_incidents_total{severity=\"critical\",phase=\"resolved\"} 1",
        "xidwatch_open_incidents 1",
        "xidwatch_kmsg_records_total 1200",
        "xidwatch_kmsg_lost_records_total 7",
        "xidwatch_kmsg_malformed_total 2",
        "xidwatch_nvml_up 1",
        "xidwatch_gpus 1",
        "xidwatch_runbook_runs_total{runbook=\"xid79\",result=\"ok\"} 1",
        "xidwatch_runbook_runs_total{runbook=\"xid79\",result=\"failed\"} 1",
        "xidwatch_runbook_duration_seconds_count{runbook=\"xid79\"} 2",
        "xidwatch_runbook_duration_seconds_sum{runbook=\"xid79\"} 46.5",
        "xidwatch_runbook_duration_seconds_bucket{le=\"2.5\",runbook=\"xid79\"} 1",
        "xidwatch_runbook_duration_seconds_bucket{le=\"60.0\",runbook=\"xid79\"} 2",
        "xidwatch_runbook_duration_seconds_bucket{le=\"+Inf\",runbook=\"xid79\"} 2",
        "xidwatch_alerts_sent_total{channel=\"slack\"} 5",
        "xidwatch_alerts_failed_total{channel=\"slack\"} 1",
        "xidwatch_outbox_alerts 1",
        "xidwatch_alerts_dropped_total 0",
        "xidwatch_config_reload_failures_total 1",
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?}:\n{text}");
    }
    let start = text
        .lines()
        .find_map(|l| l.strip_prefix("xidwatch_start_time_seconds "))
        .expect("xidwatch_start_time_seconds");
    let start: f64 = start.parse().unwrap();
    assert!((start * 1000.0 - t.started_ms() as f64).abs() < 1.0);

    // Live values: a later scrape sees later counts.
    t.kmsg_records(1);
    let resp = http(srv.addr, b"GET /metrics HTTP/1.0\r\n\r\n".to_vec()).await;
    assert!(body(&resp)
        .lines()
        .any(|l| l == "xidwatch_kmsg_records_total 1201"));

    // HEAD: headers only.
    let resp = http(srv.addr, b"HEAD /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
    assert!(
        resp.starts_with("HTTP/1.1 200 OK\r\n") && body(&resp).is_empty(),
        "{resp}"
    );

    let _ = srv.stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), srv.task)
        .await
        .expect("serve ends on shutdown")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_refuses_everything_else() {
    let srv = serve_metrics(fed()).await;
    let resp = http(srv.addr, b"GET / HTTP/1.1\r\n\r\n".to_vec()).await;
    assert!(resp.starts_with("HTTP/1.1 404 Not Found\r\n"), "{resp}");
    let resp = http(
        srv.addr,
        b"GET /metrics/../etc/passwd HTTP/1.1\r\n\r\n".to_vec(),
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 404 "), "{resp}");
    let resp = http(
        srv.addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n".to_vec(),
    )
    .await;
    assert!(
        resp.starts_with("HTTP/1.1 405 ") && resp.contains("Allow: GET, HEAD"),
        "{resp}"
    );
    let resp = http(srv.addr, b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n".to_vec()).await;
    assert!(resp.starts_with("HTTP/1.1 400 "), "{resp}");
    // A request head that never ends is cut off at the size bound.
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-Fill: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
    let resp = http(srv.addr, huge).await;
    assert!(
        resp.is_empty() || resp.starts_with("HTTP/1.1 431 "),
        "{resp}"
    );
    // A client that connects and says nothing does not stop others from being served.
    let idle = TcpStream::connect(srv.addr).unwrap();
    let resp = http(srv.addr, b"GET /metrics HTTP/1.1\r\n\r\n".to_vec()).await;
    assert!(resp.starts_with("HTTP/1.1 200 "), "{resp}");
    drop(idle);
    let _ = srv.stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), srv.task)
        .await
        .unwrap()
        .unwrap();
}

/// Every `xidwatch_*` series the shipped Prometheus rules use exists, with every label the rules
/// select on or aggregate by (except `host`, `job` and `instance`, which the scrape adds).
#[test]
fn shipped_prometheus_rules_only_use_metrics_that_exist() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/xidwatch.rules.yml")).unwrap();
    let text = metrics::render(&fed().snapshot());

    // name -> label names on its samples, from the exposition.
    let sample = regex::Regex::new(r"^(xidwatch_\w+)(?:\{([^}]*)\})? ").unwrap();
    let label = regex::Regex::new(r#"(\w+)="[^"]*""#).unwrap();
    let mut exported: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    for line in text.lines() {
        if let Some(c) = sample.captures(line) {
            let set = exported.entry(c[1].to_string()).or_default();
            if let Some(ls) = c.get(2) {
                for l in label.captures_iter(ls.as_str()) {
                    set.insert(l[1].to_string());
                }
            }
        }
    }

    let scrape_labels = ["host", "job", "instance"];
    // `by (a, b) (increase(name{...}[..]))` and plain `name{k="v"}` uses.
    let by_use =
        regex::Regex::new(r"by \(([^)]*)\)\s*\((?:rate|increase)\((xidwatch_\w+)").unwrap();
    let use_ = regex::Regex::new(r"(xidwatch_\w+)(\{([^}]*)\})?").unwrap();
    let selector = regex::Regex::new(r#"(\w+)\s*=~?\s*"([^"]*)""#).unwrap();
    let mut checked = 0;
    for c in use_.captures_iter(&rules) {
        let name = &c[1];
        let Some(labels) = exported.get(name) else {
            panic!("the rules use {name}, which xidwatch does not export:\n{text}");
        };
        if let Some(sel) = c.get(3) {
            for s in selector.captures_iter(sel.as_str()) {
                let (k, v) = (&s[1], &s[2]);
                if scrape_labels.contains(&k) {
                    continue;
                }
                assert!(labels.contains(k), "{name} has no label {k}");
                let want = format!("{k}=\"{v}\"");
                assert!(
                    text.lines()
                        .any(|l| l.starts_with(name) && l.contains(&want)),
                    "no {name} sample with {want} (the rules select it)"
                );
            }
        }
        checked += 1;
    }
    for c in by_use.captures_iter(&rules) {
        let name = &c[2];
        for k in c[1].split(',').map(str::trim) {
            if scrape_labels.contains(&k) {
                continue;
            }
            assert!(
                exported[name].contains(k),
                "the rules aggregate {name} by {k}, which it does not carry"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 10,
        "the rules file looks different: {checked} uses"
    );
}

// ---------------------------------------------------------------------------------------------
// Status socket and status.json

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_socket_round_trip_stale_socket_and_second_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let path = control::socket_path(dir.path());
    // A socket left by a crashed daemon: bound, never removed.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let t = fed();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let p2 = path.clone();
    let t2 = t.clone();
    let task = tokio::spawn(async move { control::serve_status(&p2, t2, rx).await });
    // Wait for the bind without sleeping a fixed time: the socket answers when it is ready.
    let mut snap = None;
    for _ in 0..200 {
        match control::query_status(&path, Duration::from_secs(2)).await {
            Ok(s) => {
                snap = Some(s);
                break;
            }
            Err(QueryError::NotListening { .. }) => tokio::task::yield_now().await,
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let snap = snap.expect("the status socket answers");
    assert_eq!(snap.pid, std::process::id());
    assert_eq!(snap.kmsg.records, 1200);
    assert_eq!(snap.kmsg.last_seq, Some(4711));
    assert_eq!(snap.open_incidents[0].id, "xid79-abc");
    assert_eq!(snap.alerts.as_ref().unwrap().channels[0].name, "slack");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    // Same uid: the peer check lets us in (above); a second daemon on the same state dir is
    // refused instead of stealing the socket.
    let e = control::bind_status_socket(&path).unwrap_err().to_string();
    assert!(e.contains("another xidwatch"), "{e}");

    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!path.exists(), "the socket is removed on shutdown");
    match control::query_status(&path, Duration::from_secs(2)).await {
        Err(QueryError::NotListening { .. }) => {}
        other => panic!("{other:?}"),
    }
}

fn config_for(state: &Path, dir: &Path) -> PathBuf {
    let cfg = dir.join("xidwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[state]\ndir = \"{}\"\n[nvml]\nenabled = false\n[metrics]\nlisten = \"127.0.0.1:9448\"\n",
            state.display()
        ),
    )
    .unwrap();
    cfg
}

fn status_cmd(cfg: &Path, json: bool) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
    c.arg("status").arg("--config").arg(cfg);
    if json {
        c.arg("--json");
    }
    c.stdin(Stdio::null());
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_command_reads_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let cfg = config_for(&state, dir.path());
    let t = fed();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let listener = control::bind_status_socket(&control::socket_path(&state)).unwrap();
    let task = tokio::spawn(control::serve_status_on(listener, t.clone(), rx));

    let c2 = cfg.clone();
    let out = tokio::task::spawn_blocking(move || status_cmd(&c2, false).output().unwrap())
        .await
        .unwrap();
    let s = text(&out);
    assert_eq!(out.status.code(), Some(0), "{s}");
    for want in [
        &format!(
            "xidwatch: running (pid {}, version {}) since ",
            std::process::id(),
            env!("CARGO_PKG_VERSION")
        ),
        " UTC (up ",
        "status from ",
        "/dev/kmsg: boot 5f2c1e0a7b3d, record 4711; 1200 read, 7 lost, 2 malformed",
        "NVML        up (ok)",
        "GPU 3   0000:3b:00.0  NVIDIA H100 80GB HBM3  GPU-1234",
        "open incidents: 1",
        "critical GPU 3 (0000:3b:00.0) fell off the bus  x3  last ",
        "xid79-abc",
        "alerts: 1 in the outbox (2048 bytes)",
        "slack (slack): 5 delivered, 1 failed, 2 retried, 1 queued",
        "last failure ",
        "HTTP 503 from hooks.slack.com",
        "last reload REFUSED (old config kept)",
        // What the kernel gave the daemon (this test process) to confine runbook steps with.
        &format!(
            "runbook steps confined by: {}",
            xidwatch::runbook::confine::Support::probe()
        ),
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }

    let c2 = cfg.clone();
    let out = tokio::task::spawn_blocking(move || status_cmd(&c2, true).output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["daemon"], "running");
    assert_eq!(v["source"], "socket");
    assert_eq!(v["status"]["schema"], "xidwatch.status/v1");
    assert_eq!(v["status"]["kmsg"]["lost"], 7);

    let _ = stop.send(true);
    task.await.unwrap();
}

#[test]
fn status_command_falls_back_to_status_json() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let cfg = config_for(&state, dir.path());

    // Nothing recorded at all: not running, exit 3.
    let out = status_cmd(&cfg, false).output().unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(
        text(&out).starts_with("xidwatch: not running\n"),
        "{}",
        text(&out)
    );

    // A status.json from a daemon that has gone (its pid no longer exists).
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    let mut snap: StatusSnapshot = fed().snapshot();
    snap.pid = dead_pid;
    snap.taken_ms = now_ms() - 2 * 3_600_000;
    control::write_status_file(&state, &snap).unwrap();
    let out = status_cmd(&cfg, false).output().unwrap();
    let s = text(&out);
    assert_eq!(out.status.code(), Some(3), "{s}");
    assert!(
        s.starts_with("xidwatch: not running; last known state from ") && s.contains("(2h 0m ago)"),
        "{s}"
    );
    assert!(s.contains("status.json written"), "{s}");
    assert!(
        s.contains("open incidents: 1"),
        "the last known state is shown: {s}"
    );

    let out = status_cmd(&cfg, true).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["daemon"], "not_running");
    assert_eq!(v["source"], "file");
    assert!(v["age_ms"].as_u64().unwrap() >= 2 * 3_600_000);

    // A live xidwatch process whose socket is unreachable, with a fresh status file: running.
    let mut live = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .arg("scan")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut snap = fed().snapshot();
    snap.pid = live.id();
    control::write_status_file(&state, &snap).unwrap();
    let out = status_cmd(&cfg, false).output().unwrap();
    drop(live.stdin.take());
    let _ = live.wait();
    let s = text(&out);
    assert_eq!(out.status.code(), Some(0), "{s}");
    assert!(
        s.starts_with(&format!("xidwatch: running (pid {}", snap.pid)),
        "{s}"
    );
    assert!(s.contains("status.json written"), "{s}");
}

#[test]
fn status_command_and_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    // Not TOML: nothing to go on.
    std::fs::write(&cfg, "[state\ndir = 1\n").unwrap();
    let out = status_cmd(&cfg, false).output().unwrap();
    assert_eq!(out.status.code(), Some(78), "{}", text(&out));
    assert!(text(&out).contains("bad.toml"), "{}", text(&out));
    assert!(
        status_cmd(&dir.path().join("missing.toml"), false)
            .output()
            .unwrap()
            .status
            .code()
            == Some(78)
    );

    // Valid TOML that does not validate in this environment (a secret only the service's
    // environment holds): status still reads the state directory it names, and says why.
    let state = dir.path().join("state");
    std::fs::write(
        &cfg,
        format!(
            "[state]\ndir = \"{}\"\n[metrics]\nlisten = \"everywhere\"\n[[alerts.webhook]]\nname = \"s\"\nurl = \"env:XIDWATCH_OPS_TEST_UNSET\"\n",
            state.display()
        ),
    )
    .unwrap();
    let out = status_cmd(&cfg, false).output().unwrap();
    let s = text(&out);
    assert_eq!(out.status.code(), Some(3), "{s}");
    assert!(
        s.contains("note: the config does not validate")
            && s.contains(&state.display().to_string()),
        "{s}"
    );
}

/// The shipped configs carry `[metrics]`: both must load.
#[test]
fn shipped_configs_with_metrics_load() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let c = Config::load(Some(&root.join("systemd/xidwatch.toml"))).unwrap();
    assert!(
        !c.metrics.is_enabled(),
        "loopback-only and off unless asked"
    );
    let ds = std::fs::read_to_string(root.join("deploy/kubernetes/daemonset.yaml")).unwrap();
    let start = ds.find("xidwatch.toml: |\n").unwrap() + "xidwatch.toml: |\n".len();
    let end = start + ds[start..].find("\n---").unwrap();
    let embedded: String = ds[start..end]
        .lines()
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    // The rest of that config needs the pod's secrets in the environment; `[metrics]` does not.
    let table: toml::Table = embedded.parse().unwrap();
    let metrics: metrics::MetricsConfig = table["metrics"].clone().try_into().unwrap();
    let m = metrics.validate().unwrap();
    assert_eq!(m.listen, Some("0.0.0.0:9448".parse().unwrap()));
    assert_eq!(m.warnings.len(), 1);
}

/// As root only: a user other than the daemon's is refused by the peer check even when the
/// socket's file mode would let it in.
#[test]
#[ignore = "needs root: runs `xidwatch status` as another user"]
fn status_socket_refuses_other_users() {
    super::support::require_root("it runs `xidwatch status` as another user");
    use std::os::unix::process::CommandExt;
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = base.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = config_for(&state, base.path());
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let sock = control::socket_path(&state);
    let _guard = rt.enter();
    let listener = control::bind_status_socket(&sock).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let task = rt.spawn(control::serve_status_on(listener, fed(), rx));

    let out = status_cmd(&cfg, false)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let s = text(&out);
    assert!(
        s.contains("permission denied: uid 65534 may not read"),
        "{s}"
    );
    assert!(!s.contains("xid79-abc"), "nothing leaks: {s}");
    // The daemon answered, so it runs; the details were refused.
    assert_eq!(out.status.code(), Some(0), "{s}");
    let _ = stop.send(true);
    rt.block_on(task).unwrap();
}

/// docs/operating.md lists every metric the endpoint exports, under the name Prometheus sees.
#[test]
fn operating_doc_lists_every_metric() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/operating.md")).unwrap();
    let text = metrics::render(&fed().snapshot());
    let mut families = 0;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, ty) = rest.split_once(' ').unwrap();
        let shown = if ty == "counter" {
            format!("`{name}_total`")
        } else {
            format!("`{name}`")
        };
        assert!(
            doc.contains(&shown),
            "docs/operating.md does not list {shown}"
        );
        families += 1;
    }
    assert!(families >= 17, "{families} families");
}

#[test]
fn check_warns_about_a_metrics_endpoint_open_to_the_network() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        "[nvml]\nenabled = false\n[metrics]\nlisten = \"0.0.0.0:9448\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .arg("check")
        .arg("--config")
        .arg(&cfg)
        .output()
        .unwrap();
    let s = text(&out);
    assert_eq!(out.status.code(), Some(0), "{s}");
    assert!(
        s.contains("warning: metrics.listen = \"0.0.0.0:9448\" is reachable from other machines"),
        "{s}"
    );
}
