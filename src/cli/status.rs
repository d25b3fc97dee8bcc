//! `xidwatch status`: is the daemon running, and what does it see?
//!
//! Asks the daemon's socket in the state directory (2 s at most); when that fails, reads the
//! `status.json` the daemon rewrites periodically, which also gives the last known state of a
//! daemon that has stopped. Exit status as `systemctl status` and LSB init scripts use it:
//! 0 running, 3 not running, 4 unknown (the status could not be read), 78 config error.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::EXIT_CONFIG;
use crate::config::{default_state_dir, Config, ConfigError, DEFAULT_PATH};
use crate::status::control::{self, QueryError, STATUS_FILE_INTERVAL};
use crate::status::metrics::{health, HEALTH_STALE};
use crate::status::telemetry::StatusSnapshot;
use crate::verdict::{judge, no_status, Freshness, GpuState, Verdict};

/// Exit status: the daemon is not running.
pub const EXIT_NOT_RUNNING: u8 = 3;
/// Exit status: whether the daemon runs could not be told (permissions, unreadable state).
pub const EXIT_UNKNOWN: u8 = 4;
/// How long the socket gets to answer.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(2);
/// Open incidents shown in the readable output (all of them are in `--json`).
const SHOWN_INCIDENTS: usize = 20;

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Config file (its `[state] dir` says where the daemon keeps its socket and status).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Whether the daemon runs, as far as this command can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    Running,
    NotRunning,
    Unknown,
}

/// What `status` found; `--json` prints it as it is.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub daemon: Liveness,
    /// Where the status came from: `socket`, `file`, or none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'static str>,
    pub state_dir: PathBuf,
    /// How old the status is, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_ms: Option<u64>,
    /// Why the socket did not answer, or what else is worth knowing.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusSnapshot>,
    /// The host's and each GPU's state ([`crate::verdict`], schema `xidwatch.verdict/v1`):
    /// the one answer every reader of this status gives.
    pub verdict: Verdict,
}

impl Report {
    pub fn exit_code(&self) -> u8 {
        match self.daemon {
            Liveness::Running => 0,
            Liveness::NotRunning => EXIT_NOT_RUNNING,
            Liveness::Unknown => EXIT_UNKNOWN,
        }
    }
}

fn now_ms() -> u64 {
    crate::clock::wall_ms()
}

pub fn run(args: &StatusArgs) -> anyhow::Result<u8> {
    let (state_dir, note) = match state_dir(args.config.as_deref()) {
        Ok(found) => found,
        Err(e) => {
            eprintln!("xidwatch: config error: {e}");
            return Ok(EXIT_CONFIG);
        }
    };
    let rt = super::runtime()?;
    let mut report = rt.block_on(gather(state_dir));
    report.notes.extend(note);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report, now_ms()));
    }
    Ok(report.exit_code())
}

/// The host's state, then every GPU that is not healthy with its reasons.
fn render_state(o: &mut String, v: &Verdict, now: u64) {
    use std::fmt::Write;
    let _ = writeln!(o, "\nstate: {}", v.line());
    for g in v
        .gpus
        .iter()
        .filter(|g| g.judged.state != GpuState::Healthy)
    {
        let gpu = match g.index {
            Some(i) => format!("GPU {i} {}", g.pci),
            None => format!("GPU {}", g.pci),
        };
        let since = g
            .judged
            .since_ms
            .map(|t| format!(" since {}", when(t, now)))
            .unwrap_or_default();
        let _ = writeln!(o, "  {gpu}  {}{since}", g.judged.state.as_str());
        for reason in &g.judged.reasons {
            let _ = writeln!(o, "    {}", reason.title);
        }
    }
    let healthy = v
        .gpus
        .iter()
        .filter(|g| g.judged.state == GpuState::Healthy)
        .count();
    if healthy > 0 && healthy < v.gpus.len() {
        let _ = writeln!(o, "  {healthy} other GPU(s) healthy");
    }
}

/// The state directory the config names. Status needs nothing else from the config, so a file
/// that parses but does not validate (typically: an `env:NAME` secret that only the service's
/// environment holds, when an operator runs `sudo xidwatch status`) still gives its `[state] dir`,
/// with a note; a file that cannot be read or is not TOML is an error.
pub fn state_dir(config: Option<&Path>) -> Result<(PathBuf, Option<String>), ConfigError> {
    let err = match Config::load(config) {
        Ok(c) => return Ok((c.state_dir, None)),
        Err(e @ ConfigError::Read { .. }) => return Err(e),
        Err(e) => e,
    };
    let path = match config {
        Some(p) => p.to_path_buf(),
        None => PathBuf::from(DEFAULT_PATH),
    };
    let table: toml::Table = crate::config::read_config_file(&path)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| clone_error(&err))?;
    let dir = match table.get("state").and_then(|s| s.get("dir")) {
        None => default_state_dir(),
        Some(toml::Value::String(d)) => PathBuf::from(d),
        Some(_) => return Err(err),
    };
    let note = format!(
        "the config does not validate ({err}); reading the status in {} anyway",
        dir.display()
    );
    Ok((dir, Some(note)))
}

fn clone_error(e: &ConfigError) -> ConfigError {
    match e {
        ConfigError::Invalid { path, message, at } => ConfigError::Invalid {
            path: path.clone(),
            message: message.clone(),
            at: at.clone(),
        },
        ConfigError::Read { path, source } => ConfigError::Read {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
    }
}

/// Asks the socket, then falls back to `status.json`, and judges the state from what it found.
pub async fn gather(state_dir: PathBuf) -> Report {
    gather_within(state_dir, SOCKET_TIMEOUT).await
}

/// [`gather`], with the socket given `timeout` to answer (`health-check` must be quick).
pub async fn gather_within(state_dir: PathBuf, timeout: Duration) -> Report {
    let mut r = gather_raw(state_dir, timeout).await;
    r.verdict = verdict_of(&r, now_ms());
    r
}

/// Whether `r`'s status can be trusted now; `Err` with the reason when there is none at all.
/// The words are the ones `npd-check` and `health-check` print after `unknown: `.
pub fn freshness(r: &Report, now: u64) -> Result<(&StatusSnapshot, Freshness), String> {
    let notes = || {
        if r.notes.is_empty() {
            "no details".to_string()
        } else {
            r.notes.join("; ")
        }
    };
    match (r.daemon, &r.status) {
        (Liveness::Running, Some(s)) => {
            // A status from a daemon too old to report its heartbeat has 0: judge by its age.
            let beat = if s.heartbeat_ms > 0 {
                s.heartbeat_ms
            } else {
                s.taken_ms
            };
            if health(beat, now).0 {
                Ok((s, Freshness::Fresh))
            } else {
                let why = format!(
                    "xidwatch is stuck: no progress for {} (limit {})",
                    span(now.saturating_sub(beat)),
                    span(HEALTH_STALE.as_millis() as u64)
                );
                Ok((s, Freshness::Stale(why)))
            }
        }
        (Liveness::Running, None) => Err(format!(
            "xidwatch runs but its status is unreadable: {}",
            notes()
        )),
        (Liveness::NotRunning, Some(s)) => {
            let why = format!(
                "xidwatch is not running (last status {} ago)",
                span(now.saturating_sub(s.taken_ms))
            );
            Ok((s, Freshness::Stale(why)))
        }
        (Liveness::NotRunning, None) => Err(format!(
            "xidwatch is not running (no status in {})",
            r.state_dir.display()
        )),
        (Liveness::Unknown, _) => Err(format!("cannot read xidwatch's status: {}", notes())),
    }
}

/// The state of the host and its GPUs from what `status` found.
pub fn verdict_of(r: &Report, now: u64) -> Verdict {
    match freshness(r, now) {
        Ok((s, f)) => judge(s, &f, now),
        Err(why) => no_status(&why, now),
    }
}

async fn gather_raw(state_dir: PathBuf, timeout: Duration) -> Report {
    let sock = control::socket_path(&state_dir);
    let mut notes = Vec::new();
    let mut answered = false;
    let mut denied = false;
    match control::query_status(&sock, timeout).await {
        Ok(snap) => {
            return Report {
                daemon: Liveness::Running,
                source: Some("socket"),
                age_ms: Some(now_ms().saturating_sub(snap.taken_ms)),
                state_dir,
                notes,
                status: Some(snap),
                verdict: no_status("not judged yet", 0),
            }
        }
        Err(QueryError::NotListening { .. }) => {}
        Err(e @ QueryError::Refused(_)) => {
            answered = true;
            denied = true;
            notes.push(format!("the daemon refused this user: {e}"));
        }
        Err(e @ QueryError::PermissionDenied { .. }) => {
            denied = true;
            notes.push(format!(
                "cannot open the status socket: {e}; run as root or as the daemon's user"
            ));
        }
        Err(e @ QueryError::Timeout { .. }) => {
            answered = true;
            notes.push(format!("the daemon did not answer: {e}"));
        }
        Err(e) => notes.push(format!("status socket: {e}")),
    }

    let file = match control::read_status_file(&state_dir) {
        Ok(f) => f,
        Err(e) => {
            let denied_here = e
                .downcast_ref::<std::io::Error>()
                .or_else(|| e.root_cause().downcast_ref::<std::io::Error>())
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied);
            denied |= denied_here;
            notes.push(format!("{e:#}"));
            None
        }
    };
    let now = now_ms();
    match file {
        Some(snap) => {
            let age = now.saturating_sub(snap.taken_ms);
            let alive = snap.stopped_ms.is_none()
                && snap.pid != std::process::id()
                && control::process_alive(snap.pid);
            let fresh = age <= 3 * STATUS_FILE_INTERVAL.as_millis() as u64;
            let daemon = if answered || alive {
                if !fresh {
                    notes.push(format!(
                        "pid {} is alive but its status file is {} old: the daemon may be stuck",
                        snap.pid,
                        span(age)
                    ));
                }
                Liveness::Running
            } else {
                Liveness::NotRunning
            };
            Report {
                daemon,
                source: Some("file"),
                age_ms: Some(age),
                state_dir,
                notes,
                status: Some(snap),
                verdict: no_status("not judged yet", 0),
            }
        }
        None => Report {
            daemon: if answered {
                Liveness::Running
            } else if denied {
                Liveness::Unknown
            } else {
                Liveness::NotRunning
            },
            source: None,
            age_ms: None,
            state_dir,
            notes,
            status: None,
            verdict: no_status("not judged yet", 0),
        },
    }
}

/// "3h 12m", "45s", "2d 4h".
pub fn span(ms: u64) -> String {
    let s = ms / 1000;
    let (d, h, m, sec) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60, s % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {sec}s")
    } else {
        format!("{sec}s")
    }
}

/// "2024-05-01 12:00:00 UTC".
fn utc(ms: u64) -> String {
    let iso = crate::alert::document::rfc3339(ms);
    // 2024-05-01T12:00:00.000Z -> 2024-05-01 12:00:00 UTC
    format!("{} {} UTC", &iso[..10], &iso[11..19])
}

/// "2024-05-01 12:00:00 UTC (3h 12m ago)".
fn when(ms: u64, now: u64) -> String {
    let plain = utc(ms);
    if now >= ms {
        format!("{plain} ({} ago)", span(now - ms))
    } else {
        plain
    }
}

/// The readable report.
pub fn render(r: &Report, now: u64) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let state = match r.daemon {
        Liveness::Running => "running",
        Liveness::NotRunning => "not running",
        Liveness::Unknown => "unknown",
    };
    match (&r.status, r.daemon) {
        (Some(s), Liveness::Running) => {
            let _ = writeln!(
                o,
                "xidwatch: {state} (pid {}, version {}) since {} (up {})",
                s.pid,
                s.version,
                utc(s.started_ms),
                span(now.saturating_sub(s.started_ms))
            );
        }
        (Some(s), _) => {
            let _ = writeln!(
                o,
                "xidwatch: {state}; last known state from {} (pid {}, started {})",
                when(s.taken_ms, now),
                s.pid,
                when(s.started_ms, now)
            );
        }
        (None, _) => {
            let _ = writeln!(o, "xidwatch: {state}");
        }
    }
    match (r.source, &r.status) {
        (Some("socket"), _) => {
            let _ = writeln!(
                o,
                "  status from {}",
                control::socket_path(&r.state_dir).display()
            );
        }
        (Some(_), Some(s)) => {
            let _ = writeln!(
                o,
                "  status from {} written {}",
                r.state_dir.join(control::STATUS_FILE).display(),
                when(s.taken_ms, now)
            );
        }
        _ => {
            let _ = writeln!(o, "  no status recorded in {}", r.state_dir.display());
        }
    }
    for n in &r.notes {
        let _ = writeln!(o, "  note: {n}");
    }
    render_state(&mut o, &r.verdict, now);
    let Some(s) = &r.status else {
        return o;
    };

    let k = &s.kmsg;
    let _ = writeln!(o, "\nsources");
    let pos = match (&k.boot_id, k.last_seq) {
        (Some(b), Some(q)) => format!("boot {}, record {q}", &b[..b.len().min(12)]),
        (_, Some(q)) => format!("record {q}"),
        _ => "no record yet".to_string(),
    };
    // Said only when it happened: the kernel never numbers records out of sequence.
    let out_of_sequence = match k.out_of_sequence {
        0 => String::new(),
        n => format!(", {n} out of sequence"),
    };
    // Said only when it happened: a line a reader failed on is a defect to report.
    let unread = match k.unread {
        0 => String::new(),
        n => format!(", {n} line(s) a reader failed on (skipped; a defect: please report it)"),
    };
    let _ = writeln!(
        o,
        "  kernel log  {}: {pos}; {} read, {} lost, {} malformed, {} from user space ignored{out_of_sequence}{unread}",
        k.path.as_deref().unwrap_or("?"),
        k.records,
        k.lost,
        k.malformed,
        k.userspace_ignored
    );
    let _ = writeln!(
        o,
        "  NVML        {} ({}) since {}; {} GPU(s)",
        if s.nvml.up { "up" } else { "down" },
        s.nvml.state,
        when(s.nvml.since_ms, now),
        s.gpus.len()
    );
    for g in &s.gpus {
        let _ = writeln!(
            o,
            "    GPU {:<3} {}  {}  {}",
            g.index,
            g.pci,
            g.name.as_deref().unwrap_or("?"),
            g.uuid.as_deref().unwrap_or("")
        );
    }
    if let (Some(e), Some(p)) = (s.health.expected_gpus, s.health.present_gpus) {
        let _ = writeln!(
            o,
            "  GPU count   {p} of {e} expected{}",
            if p < e { " (MISSING)" } else { "" }
        );
    }
    for (check, pci) in &s.health.failing {
        let _ = writeln!(o, "  failing     {check} on {pci}");
    }
    if let Some(rl) = s.config.last_reload {
        let _ = writeln!(
            o,
            "  config      last reload {} {} ({} ok, {} refused since start)",
            if rl.ok {
                "applied"
            } else {
                "REFUSED (old config kept)"
            },
            when(rl.at_ms, now),
            s.config.reloads_ok,
            s.config.reload_failures
        );
    }

    if !s.confinement.is_empty() {
        let _ = writeln!(o, "\nrunbook steps confined by: {}", s.confinement);
    }

    let _ = writeln!(
        o,
        "\nopen incidents: {} ({} findings counted since start)",
        s.open_incidents_total,
        s.findings_total()
    );
    for i in s.open_incidents.iter().take(SHOWN_INCIDENTS) {
        let _ = writeln!(
            o,
            "  {:<8} {}  x{}  last {}\n           {}",
            i.severity.as_str(),
            i.title,
            i.count,
            when(i.last_seen_ms, now),
            i.id
        );
    }
    let shown = s.open_incidents.len().min(SHOWN_INCIDENTS) as u64;
    if s.open_incidents_total > shown {
        let _ = writeln!(
            o,
            "  ... and {} more (xidwatch status --json lists them)",
            s.open_incidents_total - shown
        );
    }

    if !s.recently_resolved.is_empty() {
        let _ = writeln!(
            o,
            "\nrecently resolved: {} (quiet for their quiet period)",
            s.recently_resolved.len()
        );
        for r in s.recently_resolved.iter().take(SHOWN_INCIDENTS) {
            let i = &r.incident;
            let _ = writeln!(
                o,
                "  {:<8} {}  x{}  resolved {}\n           {}",
                i.severity.as_str(),
                i.title,
                i.count,
                when(r.resolved_ms, now),
                i.id
            );
        }
    }

    match &s.alerts {
        None => {
            let _ = writeln!(o, "\nalerts: no alert channel configured");
        }
        Some(a) => {
            let _ = writeln!(
                o,
                "\nalerts: {} in the outbox ({} bytes), {} accepted since start, {} dropped from a full outbox",
                a.outbox_count, a.outbox_bytes, a.accepted_total, a.dropped_total
            );
            for c in &a.channels {
                let _ = writeln!(
                    o,
                    "  {} ({}): {} delivered, {} failed, {} retried, {} queued",
                    c.name,
                    c.kind.as_str(),
                    c.delivered_total,
                    c.failed_total,
                    c.retries_total,
                    c.queued
                );
                if let Some(t) = c.last_success_ms {
                    let _ = writeln!(o, "    last success {}", when(t, now));
                }
                if let Some(t) = c.last_failure_ms {
                    let _ = writeln!(
                        o,
                        "    last failure {}: {}",
                        when(t, now),
                        c.last_error.as_deref().unwrap_or("?")
                    );
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(span(0), "0s");
        assert_eq!(span(61_000), "1m 1s");
        assert_eq!(span(3 * 3_600_000 + 12 * 60_000), "3h 12m");
        assert_eq!(span(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
        assert_eq!(when(0, 1000), "1970-01-01 00:00:00 UTC (1s ago)");
    }

    #[test]
    fn not_running_without_any_state() {
        let r = Report {
            daemon: Liveness::NotRunning,
            source: None,
            state_dir: "/nonexistent".into(),
            age_ms: None,
            notes: Vec::new(),
            status: None,
            verdict: no_status("xidwatch is not running", 0),
        };
        assert_eq!(r.exit_code(), 3);
        let text = render(&r, 0);
        assert!(text.starts_with("xidwatch: not running\n"), "{text}");
        assert!(text.contains("no status recorded"), "{text}");
    }

    /// Lines a reader failed on are said, and only when there were any.
    #[test]
    fn lines_a_reader_failed_on_are_said_when_there_were_any() {
        let report = |unread: u64| {
            let mut status = StatusSnapshot::default();
            status.kmsg.unread = unread;
            Report {
                daemon: Liveness::NotRunning,
                source: None,
                state_dir: "/nonexistent".into(),
                age_ms: None,
                notes: Vec::new(),
                status: Some(status),
                verdict: no_status("xidwatch is not running", 0),
            }
        };
        let text = render(&report(2), 0);
        assert!(
            text.contains("2 line(s) a reader failed on (skipped; a defect: please report it)"),
            "{text}"
        );
        assert!(!render(&report(0), 0).contains("reader failed"));
    }
}
