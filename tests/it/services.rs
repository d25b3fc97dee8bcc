//! The service watch end to end: the real daemon with a fake `systemctl` (copied from
//! fixtures/fake-tools into each test's own directory) whose answers the test rewrites; incidents
//! are read from `run --json`, pages from a webhook receiver on loopback. Every wait is on
//! progress: the fake counts the polls it answered.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::support::{self, Receiver};

/// The toolkit's webhook receiver and its URL.
fn receiver() -> (String, Receiver) {
    let rx = Receiver::start();
    (rx.url(), rx)
}

struct Host {
    dir: tempfile::TempDir,
}

/// The toolkit's harness, with `--json`: incidents on stdout, the log on stderr.
struct Daemon(support::Daemon);

const FM: &str = "nvidia-fabricmanager.service";
const PD: &str = "nvidia-persistenced.service";

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(bin.join("units")).unwrap();
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-tools/systemctl");
        std::fs::copy(fake, bin.join("systemctl")).unwrap();
        std::fs::write(dir.path().join("kmsg"), "").unwrap();
        std::fs::write(
            dir.path().join("boot_id"),
            "55555555-5555-5555-5555-555555555555\n",
        )
        .unwrap();
        Host { dir }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What `systemctl show` says about `unit` from now on (written whole, then renamed).
    fn unit(&self, unit: &str, active: &str, sub: &str, result: &str, restarts: u64) {
        let tmp = self.p("bin/units/.tmp");
        std::fs::write(
            &tmp,
            format!("Id={unit}\nLoadState=loaded\nActiveState={active}\nSubState={sub}\nResult={result}\nNRestarts={restarts}\n"),
        )
        .unwrap();
        std::fs::rename(tmp, self.p("bin/units").join(unit)).unwrap();
    }

    fn polls(&self) -> usize {
        std::fs::read_to_string(self.p("bin/calls"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Waits until the fake answered `n` more polls than now: the daemon has seen what was
    /// written before.
    fn wait_polls(&self, n: usize) {
        let start = (self.polls(), Instant::now());
        while self.polls() < start.0 + n {
            assert!(start.1.elapsed() < Duration::from_secs(30), "no polls");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start(&self, url: &str) -> Daemon {
        let config = self.p("xidwatch.toml");
        let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-tools");
        std::fs::write(
            &config,
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n[incidents]\nsettle_ms = 0\n[runbooks]\nsearch_path = [{:?}, {:?}]\n[services]\npoll_secs = 1\nunits = [\"nvidia-fabricmanager\", \"nvidia-persistenced\", \"dcgm\"]\nrestart_loop = {{ restarts = 3, window_secs = 300 }}\n[[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n",
                self.p("kmsg"),
                self.p("sys"),
                self.p("state"),
                self.p("bin"),
                tools,
            ),
        )
        .unwrap();
        Daemon(
            support::Run::new(&config)
                .json()
                .env("XIDWATCH_BOOT_ID_PATH", self.p("boot_id"))
                .spawn(),
        )
    }
}

/// What a test waits on: the incidents printed, or the pages the receiver got.
trait Docs {
    fn docs(&self) -> Vec<serde_json::Value>;
}

impl Docs for Receiver {
    fn docs(&self) -> Vec<serde_json::Value> {
        Receiver::docs(self)
    }
}

impl Docs for Daemon {
    fn docs(&self) -> Vec<serde_json::Value> {
        self.0.json()
    }
}

fn wait_for(
    what: &str,
    got: &impl Docs,
    d: &Daemon,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(v) = got.docs().iter().find(|v| pred(v)) {
            return v.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no {what}; got: {:#?}\nlog:\n{}",
            got.docs(),
            d.0.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn count(got: &Receiver, pred: impl Fn(&serde_json::Value) -> bool) -> usize {
    got.docs().iter().filter(|v| pred(v)).count()
}

impl Daemon {
    /// SIGTERM, and the exit must be clean; the log.
    fn stop(self) -> String {
        let s = self.0.stop();
        assert_eq!(s.code, Some(0), "{}", s.stderr);
        s.stderr
    }
}

fn step<'a>(doc: &'a serde_json::Value, runbook: &str, name: &str) -> &'a serde_json::Value {
    doc["evidence"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["runbook"] == runbook))
        .and_then(|e| e["steps"].as_array())
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no step {name:?} of {runbook} in {doc:#}"))
}

/// The step ran and showed the unit's status, or was skipped because this machine has no
/// systemd (a container): either way the page carries it, for this unit.
fn shows_status(s: &serde_json::Value, unit: &str) {
    let out = s["output"].as_str().unwrap_or_default();
    let skipped = s.to_string().contains("systemd is not running here");
    assert!(
        skipped || (out.contains("FAKE-STATUS") && out.contains(unit)),
        "{s:#}"
    );
}

#[test]
fn a_failed_unit_is_one_incident_paged_once_and_ends_when_verified_active() {
    let h = Host::new();
    h.unit(PD, "active", "running", "success", 0);
    let (url, pages) = receiver();
    let d = h.start(&url);
    h.wait_polls(2);
    h.unit(PD, "failed", "failed", "exit-code", 0);
    let inc = wait_for("an incident", &d, &d, |v| {
        v["kind"] == "service_down" && v["phase"] == "opened"
    });
    assert!(inc["title"].as_str().unwrap().contains(PD), "{inc:#}");
    let page = wait_for("a page", &pages, &d, |v| {
        v["kind"] == "service_down" && v["phase"] == "opened"
    });
    assert_eq!(page["severity"], "warning", "{page:#}");
    shows_status(
        step(&page, "service-down", "unit status"),
        "nvidia-persistenced",
    );
    // Still failed for a few more polls: nothing new.
    h.wait_polls(3);
    h.unit(PD, "active", "running", "success", 0);
    let done = wait_for("a resolved notice", &pages, &d, |v| {
        v["kind"] == "service_down" && v["phase"] == "resolved"
    });
    assert!(
        done["headline"]
            .as_str()
            .unwrap()
            .contains("verified active again"),
        "{done:#}"
    );
    h.wait_polls(2);
    assert_eq!(count(&pages, |v| v["phase"] == "opened"), 1);
    assert_eq!(count(&pages, |v| v["phase"] == "resolved"), 1);
    let log = d.stop();
    assert!(log.contains("verified active"), "{log}");
}

#[test]
fn fabric_manager_restarting_in_a_loop_is_critical_with_the_fabric_state() {
    let h = Host::new();
    h.unit(FM, "active", "running", "success", 0);
    let (url, pages) = receiver();
    let d = h.start(&url);
    for n in 1..=3 {
        h.wait_polls(2);
        h.unit(FM, "active", "running", "success", n);
    }
    let page = wait_for("a page", &pages, &d, |v| {
        v["kind"] == "service_down" && v["phase"] == "opened"
    });
    assert!(
        page["title"]
            .as_str()
            .unwrap()
            .contains("restarting in a loop"),
        "{page:#}"
    );
    assert_eq!(page["severity"], "critical", "{page:#}");
    shows_status(
        step(&page, "fabric-manager", "unit status"),
        "nvidia-fabricmanager",
    );
    step(&page, "fabric-manager", "fabric state of every GPU");
    // The restarts stop: active with the counter still, verified at the next poll.
    let done = wait_for("a resolved notice", &pages, &d, |v| {
        v["kind"] == "service_down" && v["phase"] == "resolved"
    });
    assert_eq!(done["id"], page["id"]);
    assert_eq!(count(&pages, |v| v["phase"] == "opened"), 1);
    d.stop();
}

#[test]
fn units_not_installed_are_silent_and_a_missing_fabric_manager_is_said_once() {
    let h = Host::new();
    let (url, pages) = receiver();
    let d = h.start(&url);
    h.wait_polls(4);
    let log = d.stop();
    assert_eq!(
        log.matches("is not installed and this host has no NVSwitch")
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains("dcgm.service"), "{log}");
    assert!(pages.docs().is_empty());
}
