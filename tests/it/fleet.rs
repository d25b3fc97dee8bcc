//! Running in a fleet: `xidwatch npd-check` against a live daemon (node-problem-detector's
//! custom-plugin protocol), the `/healthz` liveness endpoint, and the host name from `NODE_NAME`
//! (as the DaemonSet sets it) reaching an alert. A regular-file kmsg, a real webhook receiver
//! on loopback; no root, no GPU.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use xidwatch::cli::npd::{fit, verdict, EXIT_OK, EXIT_PROBLEM, EXIT_UNKNOWN};
use xidwatch::cli::status::{Liveness, Report};
use xidwatch::daemon::telemetry::{IncidentSummary, StatusSnapshot};
use xidwatch::model::Severity;

const BIN: &str = env!("CARGO_BIN_EXE_xidwatch");
/// The open incidents in the daemon's status refresh every 10 s.
const LIMIT: Duration = Duration::from_secs(40);

/// A free loopback port (bound, read, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Answers every HTTP request 200 and hands each body over.
fn webhook_receiver() -> (String, mpsc::Receiver<Vec<u8>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(stream) = stream else { continue };
            let mut r = BufReader::new(stream);
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let lower = line.to_ascii_lowercase();
                if let Some(v) = lower.strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0u8; len];
            if r.read_exact(&mut body).is_err() {
                continue;
            }
            let mut s = r.into_inner();
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            let _ = tx.send(body);
        }
    });
    (url, rx)
}

struct Node {
    dir: tempfile::TempDir,
    metrics: u16,
}

impl Node {
    fn new(webhook: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let metrics = free_port();
        let n = Node { dir, metrics };
        std::fs::write(n.path("kmsg"), "").unwrap();
        std::fs::write(n.path("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        // No [incidents] host: the name comes from NODE_NAME.
        let cfg = format!(
            "[kmsg]\npath = {:?}\naccept_userspace = false\n[nvml]\nenabled = false\nsysfs_root = {:?}\n\
             [state]\ndir = {:?}\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [alerts.retry]\ninitial_backoff_ms = 20\nmax_backoff_secs = 1\n\
             [[alerts.webhook]]\nname = \"hook\"\nurl = {webhook:?}\nformat = \"json\"\n",
            n.path("kmsg"),
            n.path("sys"),
            n.state(),
        );
        std::fs::write(n.path("xidwatch.toml"), cfg).unwrap();
        n
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn state(&self) -> PathBuf {
        self.path("state")
    }
    fn start(&self, node_name: &str) -> Child {
        Command::new(BIN)
            .args(["run", "--config"])
            .arg(self.path("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", self.path("boot_id"))
            .env(
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat(),
            )
            .env("NODE_NAME", node_name)
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }
    fn append(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path("kmsg"))
            .unwrap();
        f.write_all(line.as_bytes()).unwrap();
    }
    fn npd_check(&self) -> (Option<i32>, String, Output) {
        let out = Command::new(BIN)
            .args(["npd-check", "--state-dir"])
            .arg(self.state())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), text, out)
    }
    /// Runs npd-check until it exits `code`; its one line.
    fn npd_until(&self, code: i32) -> String {
        let start = Instant::now();
        loop {
            let (got, text, out) = self.npd_check();
            if got == Some(code) {
                assert_one_line(&text, &out);
                return text.trim_end().to_string();
            }
            assert!(
                start.elapsed() < LIMIT,
                "npd-check never exited {code}; last {got:?}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics)).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        resp
    }
    fn wait_metrics(&self) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.metrics)).is_err() {
            assert!(start.elapsed() < LIMIT, "metrics never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// NPD's protocol: one line on standard output, within its default 80 bytes, nothing on stderr.
fn assert_one_line(text: &str, out: &Output) {
    assert!(
        text.ends_with('\n') && text.lines().count() == 1,
        "{text:?}"
    );
    assert!(text.trim_end().len() <= 80, "{} bytes: {text}", text.len());
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn xid_record(seq: u64, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:3b:00): {xid}, pid=42, name=python3, test\n",
        1_000_000 + seq
    )
}

#[test]
fn npd_check_healthz_and_node_name_against_a_live_daemon() {
    let (url, bodies) = webhook_receiver();
    let n = Node::new(&url);

    // No daemon yet: unknown.
    let (code, text, out) = n.npd_check();
    assert_eq!(code, Some(i32::from(EXIT_UNKNOWN)), "{text}");
    assert_one_line(&text, &out);
    assert!(
        text.starts_with("unknown: xidwatch is not running (no status in "),
        "{text}"
    );

    let mut child = n.start("gpu-node-17");
    n.wait_metrics();

    // Running, nothing found: OK, and live.
    let ok = n.npd_until(i32::from(EXIT_OK));
    assert_eq!(ok, "ok: no GPU fault open (0 GPUs, NVML disabled)");
    let health = n.get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200 OK\r\n"), "{health}");
    assert!(
        health.contains("\r\n\r\nok: pipeline went round "),
        "{health}"
    );

    // An Xid 79: the alert names the node from NODE_NAME, and npd-check reports a problem.
    n.append(&xid_record(0, 79));
    let body = bodies
        .recv_timeout(LIMIT)
        .expect("no alert reached the webhook");
    let doc: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["host"], "gpu-node-17", "{doc:#}");
    let problem = n.npd_until(i32::from(EXIT_PROBLEM));
    assert!(problem.starts_with("failed: "), "{problem}");
    assert!(problem.contains("fell off the bus"), "{problem}");
    // The same state, for machines, on the metrics listener.
    let verdict = n.get("/verdict");
    let (head, body) = verdict.split_once("\r\n\r\n").unwrap_or_default();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{verdict}");
    assert!(head.contains("Content-Type: application/json"), "{verdict}");
    let doc: Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["schema"], "xidwatch.verdict/v1", "{doc:#}");
    assert_eq!(doc["host"]["state"], "failed", "{doc:#}");
    assert_eq!(doc["gpus"][0]["pci"], "0000:3b:00.0", "{doc:#}");
    assert_eq!(doc["gpus"][0]["state"], "failed", "{doc:#}");
    let metrics = n.get("/metrics");
    assert!(
        metrics.contains("xidwatch_gpu_state{pci=\"0000:3b:00.0\",state=\"failed\"} 1"),
        "{metrics}"
    );

    // Stopped: unknown, never OK.
    xidwatch_sigterm(&child);
    assert_eq!(child.wait().unwrap().code(), Some(0));
    let stopped = n.npd_until(i32::from(EXIT_UNKNOWN));
    assert!(
        stopped.starts_with("unknown: xidwatch is not running (last status "),
        "{stopped}"
    );
}

fn xidwatch_sigterm(child: &Child) {
    super::support::sigterm(child);
}

#[test]
fn npd_check_config_and_argument_errors_are_unknown_or_usage() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[state\n").unwrap();
    let out = Command::new(BIN)
        .args(["npd-check", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(i32::from(EXIT_UNKNOWN)), "{text}");
    assert_one_line(&text, &out);
    assert!(text.starts_with("unknown: config error: "), "{text}");
}

fn report(daemon: Liveness, status: Option<StatusSnapshot>) -> Report {
    Report {
        daemon,
        source: status.as_ref().map(|_| "socket"),
        state_dir: Path::new("/var/lib/xidwatch").into(),
        age_ms: None,
        notes: vec!["cannot open the status socket: permission denied".into()],
        status,
        verdict: xidwatch::verdict::no_status("not judged", 0),
    }
}

fn snapshot(now: u64, heartbeat_age_ms: u64) -> StatusSnapshot {
    let mut s = StatusSnapshot {
        taken_ms: now,
        started_ms: now - 3_600_000,
        heartbeat_ms: now - heartbeat_age_ms,
        ..StatusSnapshot::default()
    };
    s.nvml.up = true;
    s.nvml.state = "ok".into();
    s
}

fn incident(title: &str, severity: Severity, last_seen_ms: u64) -> IncidentSummary {
    IncidentSummary {
        id: title.into(),
        title: title.into(),
        severity,
        first_seen_ms: last_seen_ms,
        last_seen_ms,
        count: 1,
        kind: "xid".into(),
        pci: None,
        state: false,
    }
}

/// Every state's exit status and message, including those a live test cannot reach quickly (a
/// daemon stuck for a minute, a status the user may not read).
#[test]
fn npd_verdict_for_each_state() {
    let now = 1_800_000_000_000;
    let ok = verdict(
        &report(Liveness::Running, Some(snapshot(now, 5_000))),
        Severity::Critical,
        now,
    );
    assert_eq!(ok, (EXIT_OK, "ok: no GPU fault open (0 GPUs)".into()));

    let mut s = snapshot(now, 5_000);
    s.open_incidents = vec![
        incident(
            "GPU 1 (0000:5e:00.0): Xid 13",
            Severity::Warning,
            now - 1_000,
        ),
        incident(
            "GPU 3 (0000:3b:00.0) fell off the bus (Xid 79)",
            Severity::Critical,
            now - 9_000,
        ),
        incident(
            "GPU 0 (0000:17:00.0): double-bit ECC (Xid 48)",
            Severity::Critical,
            now - 2_000,
        ),
    ];
    let (code, msg) = verdict(
        &report(Liveness::Running, Some(s.clone())),
        Severity::Critical,
        now,
    );
    assert_eq!(code, EXIT_PROBLEM);
    assert_eq!(
        msg, "failed: GPU 3 (0000:3b:00.0) fell off the bus (Xid 79) (+1 more)",
        "the host's state and its oldest reason"
    );
    let (code, msg) = verdict(&report(Liveness::Running, Some(s)), Severity::Warning, now);
    assert_eq!(
        (code, msg.ends_with("(Xid 79) (+1 more)")),
        (EXIT_PROBLEM, true),
        "{msg}"
    );

    let mut warn_only = snapshot(now, 5_000);
    warn_only.open_incidents = vec![incident("GPU 1: Xid 13", Severity::Warning, now)];
    let (code, _) = verdict(
        &report(Liveness::Running, Some(warn_only)),
        Severity::Critical,
        now,
    );
    assert_eq!(code, EXIT_OK, "warnings are not a GPUFault by default");

    let stuck = verdict(
        &report(Liveness::Running, Some(snapshot(now, 75_000))),
        Severity::Critical,
        now,
    );
    assert_eq!(
        stuck,
        (
            EXIT_UNKNOWN,
            "unknown: xidwatch is stuck: no progress for 1m 15s (limit 1m 0s)".into()
        )
    );

    let mut gone = snapshot(now - 300_000, 0);
    gone.stopped_ms = Some(now - 300_000);
    let stopped = verdict(
        &report(Liveness::NotRunning, Some(gone)),
        Severity::Critical,
        now,
    );
    assert_eq!(
        stopped,
        (
            EXIT_UNKNOWN,
            "unknown: xidwatch is not running (last status 5m 0s ago)".into()
        )
    );

    let denied = verdict(&report(Liveness::Unknown, None), Severity::Critical, now);
    assert_eq!(denied.0, EXIT_UNKNOWN);
    assert_eq!(
        fit(&denied.1, 80),
        "unknown: cannot read xidwatch's status: cannot open the status socket: permis..."
    );
}

/// The one manual page the .deb ships: the top-level sections, then a COMMANDS section with each
/// command's synopsis line and options in it, rather than clap_mangen's list of per-command
/// pages (`xidwatch-scan(1)` ...), which the package does not ship.
fn manual_page() -> Vec<u8> {
    use clap::CommandFactory;
    let man = |cmd: clap::Command| {
        clap_mangen::Man::new(cmd)
            .date("2026-12-01")
            .source(format!("xidwatch {}", env!("CARGO_PKG_VERSION")))
            .manual("xidwatch manual")
    };
    let mut cli = xidwatch::cli::Cli::command();
    cli.build();
    let top = man(cli.clone());
    let mut page = Vec::new();
    top.render_title(&mut page).unwrap();
    top.render_name_section(&mut page).unwrap();
    top.render_synopsis_section(&mut page).unwrap();
    top.render_description_section(&mut page).unwrap();
    top.render_options_section(&mut page).unwrap();
    page.extend_from_slice(b".SH COMMANDS\n");
    fn commands(
        page: &mut Vec<u8>,
        cmd: &clap::Command,
        path: &str,
        man: &dyn Fn(clap::Command) -> clap_mangen::Man,
    ) {
        for sub in cmd
            .get_subcommands()
            .filter(|c| !c.is_hide_set() && c.get_name() != "help")
        {
            let name = format!("{path} {}", sub.get_name());
            page.extend_from_slice(format!(".SS \"{name}\"\n").as_bytes());
            let mut options = Vec::new();
            let m = man(sub.clone());
            m.render_description_section(&mut options).unwrap();
            m.render_options_section(&mut options).unwrap();
            let text = String::from_utf8(options).unwrap();
            // Each command's sections become paragraphs of its subsection.
            for line in text.lines() {
                match line {
                    ".SH DESCRIPTION" => {}
                    l if l.starts_with(".SH ") => page.extend_from_slice(b".PP\nOptions:\n"),
                    l => {
                        page.extend_from_slice(l.as_bytes());
                        page.push(b'\n');
                    }
                }
            }
            if sub.has_subcommands() {
                commands(page, sub, &name, man);
            }
        }
    }
    commands(&mut page, &cli, "xidwatch", &man);
    top.render_version_section(&mut page).unwrap();
    page
}

/// The manual page the .deb ships (deploy/debian/xidwatch.1) is rendered from the CLI definition;
/// this fails when a subcommand or flag changes without it. `XIDWATCH_BLESS=1` rewrites it.
/// It names no page the package does not ship.
#[test]
fn the_manual_page_matches_the_cli() {
    let page = manual_page();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/debian/xidwatch.1");
    if std::env::var_os("XIDWATCH_BLESS").is_some() {
        std::fs::write(&path, &page).unwrap();
    }
    let shipped = std::fs::read(&path).unwrap_or_default();
    assert!(
        shipped == page,
        "{} is not the page the CLI gives: XIDWATCH_BLESS=1 cargo test --test it the_manual_page",
        path.display()
    );
    let text = String::from_utf8_lossy(&shipped);
    assert!(
        !text.contains("xidwatch\\-scan(1)") && !text.contains("(1)\n"),
        "the page refers to pages that do not ship"
    );
    assert!(text.contains("xidwatch runbook run") && text.contains("\\-\\-runbooks"));
}

/// In a pod (or anywhere systemd is not PID 1), the runbook steps that ask systemctl are skipped
/// with a note that says why, rather than failing; where systemd runs, they are not skipped.
#[test]
fn systemctl_steps_say_why_they_cannot_run_without_systemd() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        format!("[state]\ndir = {:?}\n", dir.path().join("state")),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["runbook", "run", "driver", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let step = text
        .split("\n[")
        .find(|s| s.contains("systemctl status nvidia-persistenced"))
        .unwrap_or_else(|| panic!("no persistence daemon step in:\n{text}"));
    let skipped = step.contains("skipped: systemd is not running here (no /run/systemd/system");
    let booted = Path::new("/run/systemd/system").is_dir();
    assert_eq!(
        skipped, !booted,
        "systemd booted: {booted}; the step:\n{step}"
    );
}
