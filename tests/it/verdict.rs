//! The one GPU state as machines read it: `xidwatch health-check` in every state, `status --json`
//! carrying the verdict, and the verdict document against docs/verdict.schema.json. The daemon
//! is faked by a status.json the test writes (no root, no GPU).

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use xidwatch::daemon::control;
use xidwatch::daemon::telemetry::{GpuSummary, IncidentSummary, StatusSnapshot};
use xidwatch::model::{PciAddress, Severity};
use xidwatch::verdict::{judge, no_status, Freshness};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn pci(s: &str) -> PciAddress {
    PciAddress::parse(s).unwrap()
}

/// A live process named xidwatch (a `scan` waiting on its input) for the status file to name:
/// `status` takes a status.json for a running daemon's only while its pid is one.
struct Daemon(Child);

impl Daemon {
    fn start() -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .arg("scan")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Daemon(child)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh status from a "running" daemon whose pid is `pid`.
fn snapshot_of(pid: u32, open: Vec<IncidentSummary>) -> StatusSnapshot {
    let now = now_ms();
    let mut s = StatusSnapshot {
        schema: "xidwatch.status/v1".into(),
        taken_ms: now,
        heartbeat_ms: now,
        started_ms: now - 60_000,
        pid,
        version: "test".into(),
        gpus: vec![
            GpuSummary {
                index: 0,
                pci: pci("0000:17:00.0"),
                uuid: Some("GPU-0".into()),
                name: None,
            },
            GpuSummary {
                index: 3,
                pci: pci("0000:3b:00.0"),
                uuid: None,
                name: None,
            },
        ],
        open_incidents_total: open.len() as u64,
        open_incidents: open,
        ..StatusSnapshot::default()
    };
    s.nvml.up = true;
    s.nvml.state = "ok".into();
    s
}

fn snapshot(open: Vec<IncidentSummary>) -> StatusSnapshot {
    snapshot_of(0, open)
}

fn incident(id: &str, kind: &str, severity: Severity, at: Option<&str>) -> IncidentSummary {
    IncidentSummary {
        id: id.into(),
        title: format!("{id}: {kind}"),
        severity,
        first_seen_ms: now_ms() - 5_000,
        last_seen_ms: now_ms() - 1_000,
        count: 1,
        kind: kind.into(),
        pci: at.map(pci),
        state: false,
    }
}

fn health_check(state: &Path) -> (Option<i32>, String, Output) {
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .arg("health-check")
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code(), text, out)
}

fn one_line(text: &str, out: &Output) {
    assert!(
        text.ends_with('\n') && text.lines().count() == 1,
        "{text:?}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn health_check_exits_by_the_host_state() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();

    // No daemon, no status: unknown, and quickly.
    let start = Instant::now();
    let (code, text, out) = health_check(state);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    one_line(&text, &out);
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.starts_with("xidwatch: unknown: xidwatch is not running (no status in "),
        "{text}"
    );

    let daemon = Daemon::start();
    let snapshot = |open| snapshot_of(daemon.0.id(), open);
    let cases = [
        (vec![], 0, "xidwatch: healthy: no GPU fault open (2 GPUs)"),
        (
            vec![
                incident("w1", "xid", Severity::Warning, Some("0000:17:00.0")),
                incident("i1", "pcie_aer", Severity::Info, Some("0000:3b:00.0")),
            ],
            1,
            "xidwatch: degraded: w1: xid",
        ),
        (
            vec![
                incident("w1", "xid", Severity::Warning, Some("0000:17:00.0")),
                incident("lost", "gpu_lost", Severity::Warning, Some("0000:3b:00.0")),
            ],
            2,
            "xidwatch: failed: lost: gpu_lost",
        ),
        (
            vec![incident("fm", "service_down", Severity::Warning, None)],
            2,
            "xidwatch: failed: fm: service_down",
        ),
    ];
    for (open, want, line) in cases {
        control::write_status_file(state, &snapshot(open)).unwrap();
        let (code, text, out) = health_check(state);
        one_line(&text, &out);
        assert_eq!(code, Some(want), "{text}");
        assert_eq!(text.trim_end(), line);
    }

    // A health condition while NVML is down: nobody can verify it, so unknown.
    let mut hot = incident(
        "hot",
        "gpu_temperature",
        Severity::Warning,
        Some("0000:17:00.0"),
    );
    hot.state = true;
    let mut s = snapshot(vec![hot]);
    s.nvml.up = false;
    s.nvml.state = "driver not loaded".into();
    control::write_status_file(state, &s).unwrap();
    let (code, text, _) = health_check(state);
    assert_eq!(
        (code, text.trim_end()),
        (Some(3), "xidwatch: unknown: hot: gpu_temperature")
    );

    // The daemon stopped: its last status is no evidence, even of a failure.
    let mut gone = snapshot(vec![incident(
        "x79",
        "fallen_off_bus",
        Severity::Critical,
        Some("0000:3b:00.0"),
    )]);
    gone.stopped_ms = Some(gone.taken_ms);
    control::write_status_file(state, &gone).unwrap();
    let (code, text, _) = health_check(state);
    assert_eq!(code, Some(3), "{text}");
    assert!(
        text.starts_with("xidwatch: unknown: xidwatch is not running (last status "),
        "{text}"
    );
}

#[test]
fn status_json_carries_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        format!("[state]\ndir = {:?}\n", state.display().to_string()),
    )
    .unwrap();
    let open = vec![incident(
        "x79",
        "xid",
        Severity::Critical,
        Some("0000:3b:00.0"),
    )];
    let daemon = Daemon::start();
    control::write_status_file(&state, &snapshot_of(daemon.0.id(), open)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["status", "--json", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = &v["verdict"];
    assert_eq!(verdict["schema"], "xidwatch.verdict/v1", "{v:#}");
    assert_eq!(verdict["host"]["state"], "failed", "{v:#}");
    assert_eq!(verdict["host"]["incidents"][0], "x79");
    let gpus = verdict["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0]["pci"], "0000:17:00.0");
    assert_eq!(gpus[0]["state"], "healthy");
    assert_eq!(gpus[1]["state"], "failed");
    assert_eq!(gpus[1]["reasons"][0]["kind"], "xid");
    validate(&schema(), &schema(), verdict, "verdict").unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["status", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\nstate: failed: x79: xid\n"), "{text}");
    assert!(
        text.contains("  GPU 3 0000:3b:00.0  failed since "),
        "{text}"
    );
}

fn schema() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/verdict.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every shape the document takes validates against the published schema.
#[test]
fn verdict_documents_match_the_schema() {
    let root = schema();
    let mut hot = incident(
        "hot",
        "gpu_temperature",
        Severity::Warning,
        Some("0000:17:00.0"),
    );
    hot.state = true;
    let mut down = snapshot(vec![hot]);
    down.nvml.up = false;
    let docs = [
        judge(&snapshot(vec![]), &Freshness::Fresh, 1),
        judge(
            &snapshot(vec![
                incident("x", "xid", Severity::Critical, Some("0000:3b:00.0")),
                incident("w", "xid", Severity::Warning, Some("0000:b3:00.0")),
                incident("fm", "service_down", Severity::Warning, None),
            ]),
            &Freshness::Fresh,
            1,
        ),
        judge(&down, &Freshness::Fresh, 1),
        judge(&snapshot(vec![]), &Freshness::Stale("stuck".into()), 1),
        no_status("xidwatch is not running", 1),
    ];
    for d in docs {
        let v = serde_json::to_value(&d).unwrap();
        validate(&root, &root, &v, "verdict").unwrap_or_else(|e| panic!("{e}\n{v:#}"));
    }
    // The validator does refuse: a wrong state, a missing field, an unknown one.
    let mut v = serde_json::to_value(no_status("x", 1)).unwrap();
    v["host"]["state"] = "broken".into();
    assert!(validate(&root, &root, &v, "verdict").is_err());
    let mut v = serde_json::to_value(no_status("x", 1)).unwrap();
    v.as_object_mut().unwrap().remove("gpus");
    assert!(validate(&root, &root, &v, "verdict").is_err());
    let mut v = serde_json::to_value(no_status("x", 1)).unwrap();
    v["extra"] = 1.into();
    assert!(validate(&root, &root, &v, "verdict").is_err());
}

/// The subset of JSON Schema docs/verdict.schema.json uses: `type`, `enum`, `required`,
/// `properties`, `additionalProperties: false`, `items` and local `$ref`s; a keyword outside it
/// fails, so the file cannot grow past what this checks.
fn validate(root: &Value, s: &Value, v: &Value, at: &str) -> Result<(), String> {
    let obj = s
        .as_object()
        .ok_or(format!("{at}: schema is not an object"))?;
    for key in obj.keys() {
        let known = [
            "$schema",
            "$id",
            "$defs",
            "$ref",
            "title",
            "description",
            "type",
            "enum",
            "required",
            "properties",
            "additionalProperties",
            "items",
        ];
        if !known.contains(&key.as_str()) {
            return Err(format!("{at}: keyword {key} is not checked"));
        }
    }
    if let Some(r) = obj.get("$ref").and_then(Value::as_str) {
        let mut target = root;
        for part in r
            .strip_prefix("#/")
            .ok_or(format!("{at}: $ref {r}"))?
            .split('/')
        {
            target = target
                .get(part)
                .ok_or(format!("{at}: $ref {r} not found"))?;
        }
        return validate(root, target, v, at);
    }
    if let Some(t) = obj.get("type").and_then(Value::as_str) {
        let ok = match t {
            "object" => v.is_object(),
            "array" => v.is_array(),
            "string" => v.is_string(),
            "integer" => v.is_u64() || v.is_i64(),
            "boolean" => v.is_boolean(),
            other => return Err(format!("{at}: type {other} is not checked")),
        };
        if !ok {
            return Err(format!("{at}: {v} is not {t}"));
        }
    }
    if let Some(e) = obj.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{at}: {v} is not one of {e:?}"));
        }
    }
    if let Some(m) = v.as_object() {
        for r in obj
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = r.as_str().unwrap_or_default();
            if !m.contains_key(name) {
                return Err(format!("{at}: {name} is required"));
            }
        }
        let props = obj.get("properties").and_then(Value::as_object);
        for (k, val) in m {
            match props.and_then(|p| p.get(k)) {
                Some(sub) => validate(root, sub, val, &format!("{at}.{k}"))?,
                None if obj.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return Err(format!("{at}: {k} is not in the schema"))
                }
                None => {}
            }
        }
    }
    if let (Some(items), Some(a)) = (obj.get("items"), v.as_array()) {
        for (i, val) in a.iter().enumerate() {
            validate(root, items, val, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

/// deploy/nhc/xidwatch.nhc under bash with NHC's `die` stubbed: it passes a healthy host, dies
/// with the line otherwise, and its options let degraded or unknown pass.
#[test]
fn the_nhc_check_dies_with_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let nhc = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nhc/xidwatch.nhc");
    let run = |args: &str| {
        let script = format!(
            "die() {{ echo \"DIE $1 $2\"; return 1; }}\n. {:?}\ncheck_xidwatch {args} --state-dir {:?}\necho \"rc=$?\"\n",
            nhc.display().to_string(),
            state.display().to_string()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(script)
            .env("XIDWATCH", env!("CARGO_BIN_EXE_xidwatch"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // No daemon: unknown, which dies unless let pass.
    let out = run("");
    assert!(
        out.starts_with("DIE 1 check_xidwatch: xidwatch: unknown: ") && out.ends_with("rc=1\n"),
        "{out}"
    );
    assert_eq!(run("--unknown-ok"), "rc=0\n");

    let daemon = Daemon::start();
    control::write_status_file(state, &snapshot_of(daemon.0.id(), vec![])).unwrap();
    assert_eq!(run(""), "rc=0\n");
    let warn = vec![incident(
        "w1",
        "xid",
        Severity::Warning,
        Some("0000:17:00.0"),
    )];
    control::write_status_file(state, &snapshot_of(daemon.0.id(), warn)).unwrap();
    assert_eq!(
        run(""),
        "DIE 1 check_xidwatch: xidwatch: degraded: w1: xid\nrc=1\n"
    );
    assert_eq!(run("--degraded-ok"), "rc=0\n");
    let lost = vec![incident(
        "l",
        "fallen_off_bus",
        Severity::Critical,
        Some("0000:3b:00.0"),
    )];
    control::write_status_file(state, &snapshot_of(daemon.0.id(), lost)).unwrap();
    assert_eq!(
        run("--degraded-ok --unknown-ok"),
        "DIE 1 check_xidwatch: xidwatch: failed: l: fallen_off_bus\nrc=1\n"
    );
}
