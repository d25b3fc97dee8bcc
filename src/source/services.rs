//! Service watch: the systemd units the GPUs depend on, read from systemd on an interval.
//!
//! On an NVSwitch system the GPUs cannot run CUDA work while `nvidia-fabricmanager` is down, and
//! nothing in the kernel log says so (no Xid); `nvidia-imex`, `nvidia-persistenced` and DCGM
//! (`nvidia-dcgm`, `dcgm`: `nv-hostengine`) matter where they are installed. This source notices
//! that a unit failed, stopped after it was active in this run, or restarts in a loop, and that it
//! is active again. It sends typed [`ServiceEvent`]s; the daemon turns them into state incidents
//! that end only when the unit is verified active again.
//!
//! Why `systemctl show` and not systemd's D-Bus API: D-Bus would need a D-Bus client dependency
//! in a daemon that otherwise links none, while `systemctl show` is systemd's stable,
//! machine-readable interface. It runs as an argv (never through a shell), with a cleared
//! environment and under a timeout, from a file found the way runbook programs are found
//! (absolute search directories, checked by [`crate::runbook::sandbox::resolve`]).
//!
//! The state judgement ([`Watch::observe`]) is pure: one poll's unit states and the monotonic
//! time go in, events come out.

use crate::model::ConfigIssue;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::classify::signals;
use crate::model::{Detail, Finding, FindingKind};

/// The unit Fabric Manager runs as.
pub const FABRIC_MANAGER: &str = "nvidia-fabricmanager";

/// `[services] restart_loop`: restarts within a window that count as a loop.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RestartLoop {
    /// Automatic restarts (systemd's `NRestarts` rising) that make a loop.
    pub restarts: u64,
    /// Within this many seconds.
    pub window_secs: u64,
}

impl Default for RestartLoop {
    fn default() -> Self {
        RestartLoop {
            restarts: 3,
            window_secs: 300,
        }
    }
}

/// `[services]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServicesConfig {
    pub enabled: bool,
    /// Units to watch; one systemd does not know (not installed) is skipped silently, except
    /// Fabric Manager, whose absence is said once.
    pub units: Vec<String>,
    /// How often systemd is asked; a change is noticed within two intervals.
    pub poll_secs: u64,
    /// Absolute directories searched for `systemctl`; default: the runbooks' search path.
    pub search_path: Option<Vec<PathBuf>>,
    /// How long one `systemctl show` may take.
    pub timeout_secs: u64,
    pub restart_loop: RestartLoop,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        ServicesConfig {
            enabled: true,
            units: [
                FABRIC_MANAGER,
                "nvidia-persistenced",
                "nvidia-imex",
                "nvidia-dcgm",
                "dcgm",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            poll_secs: 5,
            search_path: None,
            timeout_secs: 5,
            restart_loop: RestartLoop::default(),
        }
    }
}

impl ServicesConfig {
    /// What the loader refuses: a unit name that is not one (it goes on a command line), an
    /// interval or window out of range, a relative search directory.
    pub fn validate(&self) -> Result<(), ConfigIssue> {
        let range = |key: &str, v: u64, lo: u64, hi: u64| {
            if v < lo || v > hi {
                Err(ConfigIssue::new(
                    format!("services.{key}"),
                    format!("expected {lo} to {hi}"),
                ))
            } else {
                Ok(())
            }
        };
        range("poll_secs", self.poll_secs, 1, 3600)?;
        range("timeout_secs", self.timeout_secs, 1, 60)?;
        range("restart_loop.restarts", self.restart_loop.restarts, 1, 1000)?;
        range(
            "restart_loop.window_secs",
            self.restart_loop.window_secs,
            1,
            86_400,
        )?;
        if self.units.len() > 64 {
            return Err(ConfigIssue::new("services.units", "at most 64 units"));
        }
        for (i, u) in self.units.iter().enumerate() {
            if !valid_unit_name(u) {
                return Err(ConfigIssue::new(
                    format!("services.units[{i}]"),
                    "not a systemd unit name (letters, digits and :-_.@, not starting with -)",
                ));
            }
        }
        if let Some(i) = self
            .search_path
            .iter()
            .flatten()
            .position(|d| !d.is_absolute())
        {
            return Err(ConfigIssue::new(
                format!("services.search_path[{i}]"),
                "relative; give absolute directories",
            ));
        }
        Ok(())
    }
}

fn valid_unit_name(u: &str) -> bool {
    !u.is_empty()
        && u.len() <= 255
        && !u.starts_with('-')
        && u.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.@\\".contains(&b))
}

/// The name systemd knows a unit by: `.service` added when no type suffix is given.
pub fn unit_id(u: &str) -> String {
    if u.contains('.') {
        u.to_string()
    } else {
        format!("{u}.service")
    }
}

/// One unit as `systemctl show` reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnitState {
    pub id: String,
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub result: String,
    pub restarts: Option<u64>,
}

/// The properties asked for.
pub const PROPERTIES: &str = "Id,LoadState,ActiveState,SubState,NRestarts,Result";

/// Parses `systemctl show --property=...` output: `Key=Value` lines, one block per unit,
/// blocks separated by an empty line. Not `--value`: that drops the names, and systemd prints
/// properties in its own order, not the order asked. Lines it does not know are ignored.
pub fn parse_show(text: &str) -> Vec<UnitState> {
    let mut out = Vec::new();
    let mut cur: Option<UnitState> = None;
    for line in text.lines() {
        if line.trim().is_empty() {
            if let Some(u) = cur.take() {
                out.push(u);
            }
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let u = cur.get_or_insert_with(UnitState::default);
        let v = v.trim().chars().take(256).collect::<String>();
        match k.trim() {
            "Id" => u.id = v,
            "LoadState" => u.load_state = v,
            "ActiveState" => u.active_state = v,
            "SubState" => u.sub_state = v,
            "Result" => u.result = v,
            "NRestarts" => u.restarts = v.parse().ok(),
            _ => {}
        }
    }
    if let Some(u) = cur {
        out.push(u);
    }
    out
}

/// What the watch tells the pipeline.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceEvent {
    /// A unit failed, stopped, or restarts in a loop: opens (or repeats) its state incident.
    Down(Finding),
    /// A unit that was down is verified active: ends its state incident.
    Active(Finding),
    /// A line for the daemon's log, said once (Fabric Manager not installed, systemctl
    /// unusable).
    Note { warn: bool, text: String },
}

#[derive(Debug, Default)]
struct Memory {
    /// Seen active in this run: an inactive unit is "stopped" only after that.
    was_active: bool,
    /// A down finding was sent and the unit was not verified active since.
    down: bool,
    /// Restart counts seen, with when, within the loop window.
    restarts: VecDeque<(Duration, u64)>,
    last_restarts: Option<u64>,
    told_not_found: bool,
}

/// The judgement over polls.
#[derive(Debug)]
pub struct Watch {
    cfg: RestartLoop,
    nvswitch: bool,
    units: BTreeMap<String, Memory>,
}

impl Watch {
    /// `nvswitch`: whether this host has NVSwitches (Fabric Manager's absence is worded by it).
    pub fn new(cfg: RestartLoop, nvswitch: bool) -> Watch {
        Watch {
            cfg,
            nvswitch,
            units: BTreeMap::new(),
        }
    }

    /// Judges one poll; `now` is monotonic time.
    pub fn observe(&mut self, states: &[UnitState], now: Duration) -> Vec<ServiceEvent> {
        let mut out = Vec::new();
        let window = Duration::from_secs(self.cfg.window_secs);
        for s in states {
            if s.id.is_empty() {
                continue;
            }
            let m = self.units.entry(s.id.clone()).or_default();
            if s.load_state == "not-found" {
                if s.id.starts_with(FABRIC_MANAGER) && !m.told_not_found {
                    out.push(ServiceEvent::Note {
                        warn: self.nvswitch,
                        text: if self.nvswitch {
                            format!("service watch: {} is not installed, although this host has NVSwitches: CUDA work cannot start on its GPUs without Fabric Manager", s.id)
                        } else {
                            format!("service watch: {} is not installed and this host has no NVSwitch: no Fabric Manager to watch", s.id)
                        },
                    });
                }
                m.told_not_found = true;
                continue;
            }
            // The restart counter, kept for the loop window.
            let risen = match (m.last_restarts, s.restarts) {
                (Some(a), Some(b)) => b > a,
                _ => false,
            };
            if let Some(n) = s.restarts {
                m.restarts.push_back((now, n));
            }
            while m
                .restarts
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > window)
            {
                m.restarts.pop_front();
            }
            m.last_restarts = s.restarts;
            let in_window = match (m.restarts.front(), m.restarts.back()) {
                (Some((_, a)), Some((_, b))) => b.saturating_sub(*a),
                _ => 0,
            };
            let looping = in_window >= self.cfg.restarts;
            let active = s.active_state == "active";
            let stopped = matches!(s.active_state.as_str(), "inactive" | "deactivating");
            if active && !risen {
                if m.down {
                    m.down = false;
                    m.restarts.clear();
                    if let Some(n) = s.restarts {
                        m.restarts.push_back((now, n));
                    }
                    out.push(ServiceEvent::Active(finding(
                        s,
                        false,
                        0,
                        self.cfg.window_secs,
                    )));
                }
                m.was_active = true;
                continue;
            }
            if active {
                m.was_active = true;
            }
            let down = s.active_state == "failed" || (stopped && m.was_active) || looping;
            if down && !m.down {
                m.down = true;
                out.push(ServiceEvent::Down(finding(
                    s,
                    looping && s.active_state != "failed",
                    in_window,
                    self.cfg.window_secs,
                )));
            }
        }
        out
    }
}

/// The finding for a unit's state (`restart_loop`: the loop is the news).
fn finding(s: &UnitState, restart_loop: bool, restarts: u64, window_secs: u64) -> Finding {
    let what = if restart_loop {
        format!(
            "restarting in a loop ({restarts} restarts within {})",
            crate::clock::duration_words(window_secs.saturating_mul(1000))
        )
    } else if s.active_state == "active" {
        "active again".to_string()
    } else if s.active_state == "failed" {
        format!("failed (result {})", s.result)
    } else {
        format!("stopped ({}/{})", s.active_state, s.sub_state)
    };
    let mut f = signals::finding(
        FindingKind::ServiceDown,
        Some(Detail::Service {
            unit: s.id.clone(),
            active_state: s.active_state.clone(),
            sub_state: s.sub_state.clone(),
            result: s.result.clone(),
            restarts: s.restarts,
            restart_loop,
        }),
        format!("{} {what}", s.id),
    );
    let why = if s.id.starts_with(FABRIC_MANAGER) {
        " While Fabric Manager is down, the GPUs of an NVSwitch system cannot run CUDA work (no Xid is logged); `nvidia-smi -q` shows each GPU's fabric state."
    } else if s.id.starts_with("nvidia-imex") {
        " While IMEX is down, multi-node jobs cannot share GPU memory across nodes."
    } else {
        ""
    };
    f.message = format!(
        "systemd reports {}: ActiveState={}, SubState={}, Result={}{}.{why}",
        s.id,
        s.active_state,
        s.sub_state,
        s.result,
        s.restarts
            .map_or(String::new(), |n| format!(", NRestarts={n}"))
    );
    f
}

/// Whether the host has NVSwitches: a PCI device of vendor 0x10de and class 0x068000 under
/// `sysfs_root/bus/pci/devices`.
pub fn has_nvswitch(sysfs_root: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(sysfs_root.join("bus/pci/devices")) else {
        return false;
    };
    rd.filter_map(|e| e.ok()).any(|e| {
        let read = |name: &str| {
            std::fs::read_to_string(e.path().join(name))
                .map(|s| s.trim().to_ascii_lowercase())
                .unwrap_or_default()
        };
        read("vendor") == "0x10de" && read("class") == "0x068000"
    })
}

/// Output kept from one `systemctl show`, at most.
const MAX_OUTPUT: usize = 256 << 10;

/// Runs `systemctl show` for `units` once. The program is the checked file `program`, run as an
/// argv with a cleared environment, killed when it overruns `timeout`.
pub async fn show(
    program: &Path,
    units: &[String],
    timeout: Duration,
) -> Result<Vec<UnitState>, String> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg("show")
        .arg(format!("--property={PROPERTIES}"))
        .arg("--no-pager")
        .arg("--")
        .args(units.iter().map(|u| unit_id(u)))
        .env_clear()
        .env("PATH", crate::runbook::CHILD_PATH)
        .env("LC_ALL", "C")
        .env("SYSTEMD_PAGER", "")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let out = match tokio::time::timeout(timeout, cmd.output()).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(format!("cannot run {}: {e}", program.display())),
        Err(_) => {
            return Err(format!(
                "{} show did not answer within {} s",
                program.display(),
                timeout.as_secs()
            ))
        }
    };
    let text = String::from_utf8_lossy(&out.stdout[..out.stdout.len().min(MAX_OUTPUT)]);
    let states = parse_show(&text);
    if states.is_empty() {
        // One log line: systemctl's own message may span several (journald would split it).
        let err = String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(512)])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        return Err(format!(
            "{} show answered nothing ({}{}{err})",
            program.display(),
            out.status,
            if err.is_empty() { "" } else { ": " }
        ));
    }
    Ok(states)
}

/// The watch's task: finds `systemctl`, then polls every `poll_secs` until the receiver is gone.
/// Failures of systemctl itself are said once (and again after it worked), never paged.
pub async fn watch_loop(
    cfg: ServicesConfig,
    search_path: Vec<PathBuf>,
    sysfs_root: PathBuf,
    tx: tokio::sync::mpsc::Sender<ServiceEvent>,
) {
    let note = |warn, text: String| ServiceEvent::Note { warn, text };
    let program = match crate::runbook::sandbox::resolve("systemctl", &search_path) {
        Ok(p) => p.path,
        Err(e) => {
            let why = match e {
                crate::runbook::sandbox::NotRun::Missing(w)
                | crate::runbook::sandbox::NotRun::Refused(w) => w,
            };
            let _ = tx
                .send(note(
                    true,
                    format!("service watch off: {why}; set [services] search_path, or [services] enabled = false"),
                ))
                .await;
            return;
        }
    };
    let nvswitch = {
        let root = sysfs_root.clone();
        tokio::task::spawn_blocking(move || has_nvswitch(&root))
            .await
            .unwrap_or(false)
    };
    let mut watch = Watch::new(cfg.restart_loop.clone(), nvswitch);
    let mut timer = tokio::time::interval(Duration::from_secs(cfg.poll_secs));
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let timeout = Duration::from_secs(cfg.timeout_secs);
    let start = tokio::time::Instant::now();
    let mut failing = false;
    let _ = tx
        .send(note(
            false,
            format!(
                "service watch: {} every {} s with {}",
                cfg.units.join(", "),
                cfg.poll_secs,
                program.display()
            ),
        ))
        .await;
    loop {
        timer.tick().await;
        let events = match show(&program, &cfg.units, timeout).await {
            Ok(states) => {
                failing = false;
                watch.observe(&states, start.elapsed())
            }
            Err(e) if !failing => {
                failing = true;
                vec![note(true, format!("service watch: {e}; trying again"))]
            }
            Err(_) => Vec::new(),
        };
        for ev in events {
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(id: &str, load: &str, active: &str, sub: &str, restarts: u64) -> UnitState {
        UnitState {
            id: id.into(),
            load_state: load.into(),
            active_state: active.into(),
            sub_state: sub.into(),
            result: if active == "failed" {
                "exit-code".into()
            } else {
                "success".into()
            },
            restarts: Some(restarts),
        }
    }

    const FM: &str = "nvidia-fabricmanager.service";

    #[test]
    fn parses_blocks_in_any_property_order() {
        let text = "Id=a.service\nNRestarts=2\nLoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n\nLoadState=not-found\nId=b.service\nActiveState=inactive\nSubState=dead\nNRestarts=x\nResult=success\n";
        let s = parse_show(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].id, "a.service");
        assert_eq!(s[0].restarts, Some(2));
        assert_eq!(s[0].active_state, "failed");
        assert_eq!(s[1].load_state, "not-found");
        assert_eq!(s[1].restarts, None);
        assert!(parse_show("garbage without equals\n").is_empty());
    }

    #[test]
    fn failed_is_down_once_and_active_again_ends_it() {
        let mut w = Watch::new(RestartLoop::default(), true);
        let t = Duration::from_secs;
        assert!(w
            .observe(&[st(FM, "loaded", "active", "running", 0)], t(0))
            .is_empty());
        let ev = w.observe(&[st(FM, "loaded", "failed", "failed", 0)], t(5));
        assert!(
            matches!(&ev[..], [ServiceEvent::Down(f)] if f.severity == crate::model::Severity::Critical)
        );
        assert!(w
            .observe(&[st(FM, "loaded", "failed", "failed", 0)], t(10))
            .is_empty());
        let ev = w.observe(&[st(FM, "loaded", "active", "running", 0)], t(15));
        assert!(matches!(&ev[..], [ServiceEvent::Active(_)]));
    }

    #[test]
    fn inactive_is_down_only_after_it_was_active() {
        let mut w = Watch::new(RestartLoop::default(), true);
        let t = Duration::from_secs;
        let u = "nvidia-persistenced.service";
        assert!(w
            .observe(&[st(u, "loaded", "inactive", "dead", 0)], t(0))
            .is_empty());
        w.observe(&[st(u, "loaded", "active", "running", 0)], t(5));
        let ev = w.observe(&[st(u, "loaded", "inactive", "dead", 0)], t(10));
        assert!(matches!(&ev[..], [ServiceEvent::Down(_)]));
    }

    #[test]
    fn restarts_rising_in_the_window_is_a_loop_and_ends_when_they_stop() {
        let mut w = Watch::new(RestartLoop::default(), true);
        let t = Duration::from_secs;
        let mut all = Vec::new();
        for (i, n) in [0, 1, 2, 3].into_iter().enumerate() {
            all.extend(w.observe(&[st(FM, "loaded", "active", "running", n)], t(i as u64 * 5)));
        }
        assert!(
            matches!(&all[..], [ServiceEvent::Down(f)] if f.title.contains("loop")),
            "{all:?}"
        );
        let ev = w.observe(&[st(FM, "loaded", "active", "running", 3)], t(20));
        assert!(matches!(&ev[..], [ServiceEvent::Active(_)]));
        // Slow restarts, one per window, are no loop.
        let mut w = Watch::new(RestartLoop::default(), true);
        for n in 0..6u64 {
            assert!(w
                .observe(&[st(FM, "loaded", "active", "running", n)], t(n * 400))
                .is_empty());
        }
    }

    #[test]
    fn not_found_is_silent_except_fabric_manager_said_once() {
        let mut w = Watch::new(RestartLoop::default(), false);
        let t = Duration::from_secs;
        let states = [
            st(FM, "not-found", "inactive", "dead", 0),
            st("dcgm.service", "not-found", "inactive", "dead", 0),
        ];
        let ev = w.observe(&states, t(0));
        assert!(
            matches!(&ev[..], [ServiceEvent::Note { warn: false, text }] if text.contains("no NVSwitch")),
            "{ev:?}"
        );
        assert!(w.observe(&states, t(5)).is_empty());
    }

    #[test]
    fn config_refuses_bad_units_and_ranges() {
        let ok = ServicesConfig::default();
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.units = vec!["-evil".into()];
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.units = vec!["a b".into()];
        assert!(c.validate().is_err());
        let mut c = ok;
        c.poll_secs = 0;
        assert!(c.validate().is_err());
    }
}
