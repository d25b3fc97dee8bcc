//! The delivery promise, attacked: the daemon as a process, a regular-file kernel log, webhook
//! receivers on loopback. SIGKILL in the middle of a burst, SIGHUP while a runbook runs, a
//! receiver that accepts and never answers, a missing GPU across a restart.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support::{self, wait_for, wait_until, Reply, LIMIT};

/// One alert as a receiver got it.
#[derive(Debug, Clone)]
struct Got {
    id: String,
    phase: String,
    doc: Value,
}

/// The toolkit's webhook receiver; the first `hang` requests are read and never answered (the
/// connection is held open), as a wedged receiver would.
struct Receiver {
    url: String,
    rx: support::Receiver,
}

impl Receiver {
    fn start(hang: usize) -> Receiver {
        let rx = support::Receiver::answering(move |n, _| {
            if n < hang {
                Reply::Hang
            } else {
                Reply::Status(200)
            }
        });
        Receiver { url: rx.url(), rx }
    }

    /// The alerts answered so far.
    fn all(&self) -> Vec<Got> {
        self.rx
            .docs()
            .into_iter()
            .map(|doc| Got {
                id: doc["id"].as_str().unwrap_or_default().to_string(),
                phase: doc["phase"].as_str().unwrap_or_default().to_string(),
                doc,
            })
            .collect()
    }

    /// Distinct incident ids of opened alerts.
    fn opened(&self) -> BTreeSet<String> {
        self.all()
            .into_iter()
            .filter(|g| g.phase == "opened")
            .map(|g| g.id)
            .collect()
    }
}

/// A state directory, a kmsg file, a boot id, runbooks and a config naming them.
struct Setup {
    dir: tempfile::TempDir,
}

/// A runbook for every incident that costs nothing: the kernel log excerpt only.
const CHEAP_RUNBOOK: &str = "title = \"cheap\"\nfallback = true\n[guide]\nmeaning = \"m\"\n\
    next_steps = \"n\"\n[[step]]\nname = \"log\"\nkmsg = { lines_before = 2, lines_after = 0 }\n";

impl Setup {
    fn new(runbook: &str, extra: &str, url: &str) -> Setup {
        Setup::with_allow(runbook, extra, url, "")
    }

    /// `allow`: the `[runbooks] allow` line, for a runbook that runs a test tool.
    fn with_allow(runbook: &str, extra: &str, url: &str, allow: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let s = Setup { dir };
        std::fs::write(s.path("kmsg"), "").unwrap();
        std::fs::write(s.path("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        std::fs::create_dir_all(s.path("runbooks")).unwrap();
        std::fs::write(s.path("runbooks/rb.toml"), runbook).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let cfg = format!(
            "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n\
             [runbooks]\ndirs = [{:?}]\nsearch_path = [{:?}]\n{allow}\n\
             [alerts.retry]\ninitial_backoff_ms = 50\nmax_backoff_secs = 1\n\
             [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\ntimeout_secs = 60\n{extra}",
            s.path("kmsg"),
            s.path("sys"),
            s.path("state"),
            s.path("runbooks"),
            root.join("fixtures/fake-tools"),
        );
        std::fs::write(s.path("xidwatch.toml"), cfg).unwrap();
        s
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn append(&self, records: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path("kmsg"))
            .unwrap();
        f.write_all(records.as_bytes()).unwrap();
    }

    fn spawn(&self, env: &[(&str, &Path)]) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
        cmd.args(["run", "--config"])
            .arg(self.path("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", self.path("boot_id"))
            .env(
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat(),
            )
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path("stderr.log")).unwrap());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.path("stderr.log")).unwrap_or_default()
    }
}

/// A kmsg record with Xid `xid` on the `i`-th of up to 8,192 distinct GPUs.
fn xid_on(seq: u64, i: u32, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:{:02x}:{:02x}): {xid}, pid=42, name=python3, test\n",
        1_000_000 + seq,
        i % 256,
        i / 256
    )
}

/// SIGKILL in the middle of a burst of 2,000 distinct incidents, then a restart: every incident
/// reaches the receiver, and what is sent twice is bounded by what was in flight.
#[test]
fn sigkill_during_a_burst_of_2000_incidents_loses_none() {
    const N: u32 = 2000;
    let rx = Receiver::start(0);
    // No rate limit and room for the whole burst: this test is about crashes, not about the
    // outbox's bound (which drops the oldest alerts, counted, when a receiver cannot keep up).
    let s = Setup::new(
        CHEAP_RUNBOOK,
        "rate_limit_count = 1000000\nrate_limit_window_secs = 1\n[alerts.outbox]\nmax_count = 5000\n",
        &rx.url,
    );
    let mut burst = String::new();
    for i in 0..N {
        // Xid 13: an application fault per GPU, each its own page (the same critical fault on
        // many GPUs at once would be one host page).
        burst.push_str(&xid_on(u64::from(i), i, 13));
    }
    s.append(&burst);
    let mut first = s.spawn(&[]);
    wait_until(
        Duration::from_secs(60),
        "a first part of the alerts",
        || rx.opened().len() >= 150,
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let before = rx.all().len();
    assert!(
        before < N as usize,
        "killed in the middle of the burst, not after it"
    );

    let mut second = s.spawn(&[]);
    wait_until(
        Duration::from_secs(90),
        "every incident after the restart",
        || rx.opened().len() >= N as usize,
    );
    super::support::sigterm(&second);
    second.wait().unwrap();
    let all = rx.all();
    let opened = rx.opened();
    assert_eq!(
        opened.len(),
        N as usize,
        "lost: {}",
        N as usize - opened.len()
    );
    let resent = all.len() - opened.len();
    // Sent again at most what the first run had in flight (4 sends) or not yet acknowledged
    // (one batch of the reader).
    assert!(resent <= 600, "{resent} alerts sent twice\n{}", s.stderr());
}

/// A reload while an incident's runbook runs: the alert stage lives on, so the runbook's
/// evidence reaches the same outbox and the alert is delivered once, with it.
#[test]
fn sighup_while_a_runbook_runs_delivers_the_alert_once_with_its_evidence() {
    let rx = Receiver::start(0);
    // The barrier tool waits for a partner that never comes, found by this unique name in the
    // command lines of /proc (a step can write nothing, so the test looks there too).
    let barrier = tempfile::Builder::new()
        .prefix("xw-promise-")
        .tempdir_in("/tmp")
        .unwrap();
    let name = barrier.path().file_name().unwrap().to_str().unwrap();
    let slow = format!(
        "title = \"slow\"\n[[match]]\nxids = [48]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\
         [[step]]\nname = \"wait\"\nrun = [\"barrier\", {name:?}, \"2\"]\ntimeout_secs = 3\n"
    );
    let allow = format!("allow = [[\"barrier\", {name:?}, \"2\"]]");
    let s = Setup::with_allow(&slow, "", &rx.url, &allow);
    let mut d = s.spawn(&[]);
    wait_until(Duration::from_secs(20), "start-up", || {
        s.stderr().contains("caught up")
    });
    s.append(&xid_on(0, 0x2a, 48));
    wait_until(Duration::from_secs(20), "the runbook to start", || {
        std::fs::read_dir("/proc").is_ok_and(|rd| {
            rd.flatten().any(|e| {
                std::fs::read(e.path().join("cmdline"))
                    .is_ok_and(|c| c.windows(name.len()).any(|w| w == name.as_bytes()))
            })
        })
    });
    // Reload twice while it runs: by signal, and by a real edit of the config.
    super::support::signal(&d, libc::SIGHUP);
    let cfg = std::fs::read_to_string(s.path("xidwatch.toml")).unwrap();
    // As editors save: a new file renamed over the old one.
    std::fs::write(s.path("xidwatch.toml.new"), format!("{cfg}\n# edited\n")).unwrap();
    std::fs::rename(s.path("xidwatch.toml.new"), s.path("xidwatch.toml")).unwrap();
    let start = Instant::now();
    while rx.all().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no alert within 30 s\n{}",
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Nothing else is coming once the reload is done and the outbox is empty: everything the
    // daemon accepted was delivered.
    let status = wait_for(LIMIT, "the reload and an empty outbox", || {
        support::status_of(&s.path("state")).filter(|st| {
            s.stderr().contains("config reloaded")
                && st["alerts"]["outbox_count"] == 0
                && support::daemon::delivered(st, "hook") >= 1
        })
    });
    assert_eq!(status["alerts"]["accepted_total"], 1, "{status:#}");
    super::support::sigterm(&d);
    d.wait().unwrap();
    let all = rx.all();
    assert_eq!(all.len(), 1, "{all:#?}\n{}", s.stderr());
    assert_eq!(all[0].doc["xid"], 48);
    assert_eq!(
        all[0].doc["evidence"][0]["runbook"], "rb",
        "{:#}",
        all[0].doc
    );
    assert_eq!(all[0].doc["evidence"][0]["steps"][0]["name"], "wait");
    let err = s.stderr();
    assert!(err.contains("config reloaded"), "{err}");
    assert!(!err.contains("alert stage:"), "{err}");
}

/// A receiver that accepts a request and never answers holds one send, not its channel: the
/// next alert of the same channel is delivered meanwhile.
#[test]
fn a_hung_receiver_does_not_hold_back_the_next_alert() {
    let rx = Receiver::start(1);
    let s = Setup::new(CHEAP_RUNBOOK, "", &rx.url);
    let mut d = s.spawn(&[]);
    wait_until(Duration::from_secs(20), "start-up", || {
        s.stderr().contains("caught up")
    });
    s.append(&xid_on(0, 1, 79));
    // The first alert is at the receiver, which holds it, before the second fault comes.
    wait_until(LIMIT, "the first alert to reach the receiver", || {
        !rx.rx.requests().is_empty()
    });
    // Another fault (an Xid 79 on a second GPU this close would share the first one's host page).
    s.append(&xid_on(1, 2, 48));
    // The first request hangs for 120 s (and the channel's timeout is 60 s); the second alert
    // must not wait for either.
    wait_until(Duration::from_secs(15), "the second alert", || {
        !rx.all().is_empty()
    });
    super::support::sigterm(&d);
    d.wait().unwrap();
    let all = rx.all();
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].doc["gpu"]["pci"], "0000:02:00.0");
}

/// A GPU that NVML cannot reach stays missing across a restart: one incident, one page.
#[test]
fn a_gpu_that_stays_missing_is_paged_once_across_restarts() {
    let rx = Receiver::start(0);
    let s = Setup::new(CHEAP_RUNBOOK, "", &rx.url);
    // Two GPUs on the bus; NVML (the fake library) reaches only the first.
    for pci in ["0000:17:00.0", "0000:2a:00.0"] {
        let d = s.path("sys/bus/pci/devices").join(pci);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(d.join("class"), "0x030200\n").unwrap();
    }
    let script = s.path("nvml-script.txt");
    std::fs::write(
        &script,
        "init ok\ndriver_version 550.54.14\ndevice pci=0000:17:00.0 uuid=GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n",
    )
    .unwrap();
    let lib = super::support::fake_nvml_library();
    let cfg = std::fs::read_to_string(s.path("xidwatch.toml"))
        .unwrap()
        .replace(
            "[nvml]\nenabled = false\n",
            &format!("[nvml]\nenabled = true\nlibrary = {lib:?}\nprobe_interval_secs = 1\n"),
        );
    std::fs::write(s.path("xidwatch.toml"), cfg).unwrap();
    let calls = s.path("nvml-calls.txt");
    let env: [(&str, &Path); 2] = [
        ("XIDWATCH_FAKE_NVML_SCRIPT", &script),
        ("XIDWATCH_FAKE_NVML_CALLS", &calls),
    ];
    // Probe rounds so far: each asks NVML for its GPU count.
    let rounds = || support::nvml_calls(&calls, "nvmlDeviceGetCount_v2");

    let missing = |all: &[Got]| -> Vec<String> {
        all.iter()
            .filter(|g| g.doc["kind"] == "gpu_missing" && g.phase == "opened")
            .map(|g| g.id.clone())
            .collect()
    };
    let mut d = s.spawn(&env);
    wait_until(Duration::from_secs(30), "the missing GPU's page", || {
        !missing(&rx.all()).is_empty()
    });
    for _ in 0..2 {
        super::support::sigterm(&d);
        d.wait().unwrap();
        d = s.spawn(&env);
        // Several probe rounds after the restart.
        wait_until(Duration::from_secs(20), "start-up", || {
            s.stderr().contains("caught up")
        });
        let seen = rounds();
        wait_until(LIMIT, "three more probe rounds", || rounds() >= seen + 3);
    }
    super::support::sigterm(&d);
    d.wait().unwrap();
    let pages = missing(&rx.all());
    assert_eq!(pages.len(), 1, "{pages:?}\n{}", s.stderr());
    let by_pci: BTreeMap<String, usize> = rx.all().iter().fold(BTreeMap::new(), |mut m, g| {
        *m.entry(g.doc["gpu"]["pci"].to_string()).or_default() += 1;
        m
    });
    assert_eq!(by_pci.len(), 1, "{by_pci:?}");
}

/// A crash loop (the daemon killed again and again right after it starts) re-sends nothing that
/// was already delivered: the checkpoint follows each alert within a fraction of a second, and
/// the outbox remembers what it accepted.
#[test]
fn a_crash_loop_does_not_send_an_alert_again() {
    let rx = Receiver::start(0);
    let s = Setup::new(CHEAP_RUNBOOK, "", &rx.url);
    s.append(&xid_on(0, 7, 79));
    let mut d = s.spawn(&[]);
    wait_until(Duration::from_secs(20), "the alert", || {
        !rx.all().is_empty()
    });
    for i in 0..6u64 {
        // Killed at a different moment of its start each time.
        std::thread::sleep(Duration::from_millis(150 + 60 * i));
        d.kill().unwrap();
        d.wait().unwrap();
        d = s.spawn(&[]);
    }
    wait_until(Duration::from_secs(20), "start-up", || {
        s.stderr().contains("caught up")
    });
    // Nothing is waiting to be sent again: the outbox is empty.
    wait_for(LIMIT, "an empty outbox", || {
        support::status_of(&s.path("state")).filter(|st| st["alerts"]["outbox_count"] == 0)
    });
    super::support::sigterm(&d);
    d.wait().unwrap();
    let all = rx.all();
    assert_eq!(all.len(), 1, "{all:#?}");
}

/// A reload happens when what is in force changed: not when some other `.toml` appears beside
/// the config, nor when the config is saved unchanged; a real edit reloads.
#[test]
fn only_a_real_change_of_what_is_in_force_reloads() {
    let rx = Receiver::start(0);
    let s = Setup::new(CHEAP_RUNBOOK, "", &rx.url);
    let mut d = s.spawn(&[]);
    wait_until(Duration::from_secs(20), "start-up", || {
        s.stderr().contains("caught up")
    });
    let cfg = std::fs::read_to_string(s.path("xidwatch.toml")).unwrap();
    let state = s.path("state");
    // Each change is waited for by the daemon's own count of changes it looked at.
    let checks =
        || support::status_of(&state).map_or(0, |st| st["config"]["checks"].as_u64().unwrap_or(0));
    let before = checks();
    std::fs::write(s.path("other.toml"), "[kmsg]\npath = \"/nowhere\"\n").unwrap();
    wait_until(LIMIT, "the stray file looked at", || checks() > before);
    let before = checks();
    std::fs::write(s.path("xidwatch.toml.new"), &cfg).unwrap();
    std::fs::rename(s.path("xidwatch.toml.new"), s.path("xidwatch.toml")).unwrap();
    wait_until(LIMIT, "the unchanged save looked at", || checks() > before);
    assert!(!s.stderr().contains("config reloaded"), "{}", s.stderr());
    std::fs::write(s.path("xidwatch.toml.new"), format!("{cfg}\n# edited\n")).unwrap();
    std::fs::rename(s.path("xidwatch.toml.new"), s.path("xidwatch.toml")).unwrap();
    wait_until(Duration::from_secs(10), "the reload", || {
        s.stderr().contains("config reloaded")
    });
    super::support::sigterm(&d);
    d.wait().unwrap();
}

/// The shipped unit's case through the daemon: an operator's `allow` entry that is a script
/// attacks the daemon running it (truncate its position file, plant a state file, read its
/// config with the webhook URL, signal it, connect to the receiver, write through /bin/sh). The
/// page's own evidence shows each attack denied, the daemon goes on and stops cleanly, and its
/// state is intact.
#[test]
fn an_allowed_step_cannot_touch_the_daemon_that_runs_it() {
    let rx = Receiver::start(0);
    let port = rx
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let port: String = port.chars().take_while(|c| c.is_ascii_digit()).collect();
    let runbook = "title = \"attack\"\n[[match]]\nxids = [48]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\
         [[step]]\nname = \"attack\"\nrun = [\"attack-daemon\", \"{name}\", \"{port}\"]\ntimeout_secs = 20\n";
    let s = Setup::with_allow(
        "",
        "",
        &rx.url,
        "allow = [[\"attack-daemon\", \"{name}\", \"{port}\"]]",
    );
    let name = s
        .dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        s.dir.path().starts_with("/tmp"),
        "the tool finds its targets under /tmp"
    );
    std::fs::write(
        s.path("runbooks/rb.toml"),
        runbook.replace("{name}", &name).replace("{port}", &port),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(s.path("xidwatch.toml")).unwrap();
    std::fs::write(
        s.path("xidwatch.toml"),
        cfg.replace("{name}", &name).replace("{port}", &port),
    )
    .unwrap();
    let mut d = s.spawn(&[]);
    wait_until(Duration::from_secs(20), "start-up", || {
        s.stderr().contains("caught up")
    });
    let position = std::fs::read(s.path("state/position.json")).unwrap_or_default();
    s.append(&xid_on(0, 0x2a, 48));
    wait_until(Duration::from_secs(30), "the page", || !rx.all().is_empty());
    let page = rx.all()[0].doc.clone();
    let out = page["evidence"][0]["steps"][0]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    for attack in [
        "truncate-position",
        "plant-state",
        "read-config",
        "signal-daemon",
        "connect-receiver",
        "shell-write",
    ] {
        assert!(
            out.contains(&format!("{attack}: denied")),
            "{attack} not denied in the page's evidence:\n{out}\n{page:#}"
        );
    }
    assert!(d.try_wait().unwrap().is_none(), "the daemon died");
    assert!(!s.path("state/planted").exists());
    let now = std::fs::read(s.path("state/position.json")).unwrap_or_default();
    assert!(
        !now.is_empty() || position.is_empty(),
        "the position file was emptied"
    );
    super::support::sigterm(&d);
    let st = d.wait().unwrap();
    assert!(st.success(), "{st:?}\n{}", s.stderr());
}
