//! A lost GPU is a state, not an event: through the real daemon with the fake NVML, an Xid 79 on
//! a GPU NVML cannot reach never resolves on the log's silence, only when a probe verifies the
//! same board back; an event (Xid 13) still ends after its quiet period, and says only that.
//!
//! Windows and quiet periods are 1 s here, so "several quiet periods" are a few seconds. Every
//! test asserts on what a webhook receiver got; two also on what follows from it: the alert in a
//! real Alertmanager, and `xidwatch npd-check`'s verdict.

use std::io::Write;
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::{self, fake_nvml_library, Receiver};

/// The fake reads its script from a process-wide variable: one daemon with it at a time.
static LOCK: Mutex<()> = Mutex::new(());

const UUID0: &str = "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f";
const OTHER: &str = "GPU-99999999-0000-4000-8000-000000000001";
const LIMIT: Duration = Duration::from_secs(30);

/// A daemon with a webhook receiver; what the receiver got, in order.
struct Lost {
    dir: TempDir,
    daemon: support::Daemon,
    rx: Receiver,
    /// Just before the daemon was spawned: the fake's `at_ms` times count from its NVML init,
    /// which is later, so a script's `set at_ms=T` has not happened before `started + T`.
    started: Instant,
}

impl Lost {
    /// Starts the daemon with NVML (`script`) or without it (`None`), one NVIDIA GPU at
    /// 0000:17:00.0 on the fake bus, windows and quiet periods of 1 s.
    fn start(script: Option<&str>) -> Lost {
        Lost::start_with(script, "", "")
    }

    /// As [`Lost::start`], with `incidents` added to `[incidents]` and `channels` after the
    /// webhook channel.
    fn start_with(script: Option<&str>, incidents: &str, channels: &str) -> Lost {
        Lost::start_on(&["0000:17:00.0"], script, incidents, channels)
    }

    /// As [`Lost::start_with`], with NVIDIA GPUs at `gpus` on the fake bus; `incidents` may set
    /// its own `settle_ms` (0 otherwise).
    fn start_on(gpus: &[&str], script: Option<&str>, incidents: &str, channels: &str) -> Lost {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        std::fs::write(p("kmsg"), "").unwrap();
        std::fs::write(p("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        for pci in gpus {
            let dev = p(&format!("sys/bus/pci/devices/{pci}"));
            std::fs::create_dir_all(&dev).unwrap();
            std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
            std::fs::write(dev.join("class"), "0x030200\n").unwrap();
        }
        let settle = if incidents.contains("settle_ms") {
            ""
        } else {
            "settle_ms = 0\n"
        };
        std::fs::write(p("nvml.script"), script.unwrap_or("")).unwrap();

        let rx = Receiver::start();
        let url = rx.url_for("/hook");
        std::fs::write(
            p("xidwatch.toml"),
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = {}\nlibrary = {:?}\nprobe_interval_secs = 1\ncall_timeout_secs = 1\nsysfs_root = {:?}\n[state]\ndir = {:?}\n\
                 [incidents]\n{settle}window_secs = 1\nquiet_secs = 1\n{incidents}\
                 [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n{channels}",
                p("kmsg"),
                script.is_some(),
                fake_nvml_library(),
                p("sys"),
                p("state"),
            ),
        )
        .unwrap();
        let started = Instant::now();
        let daemon = support::Run::new(&p("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", p("boot_id"))
            .nvml_script(&p("nvml.script"))
            .spawn();
        Lost {
            dir,
            daemon,
            rx,
            started,
        }
    }

    fn append_xid(&self, seq: u64, xid: u32) {
        self.append_xid_on("17", seq, xid);
    }

    /// A reboot: the daemon stops, the boot id changes, the kernel log starts empty, the fake
    /// NVML plays `script` from its new init; the same state directory, config and receiver.
    fn reboot(self, script: &str) -> Lost {
        let Lost {
            dir, daemon, rx, ..
        } = self;
        let stopped = daemon.stop();
        assert_eq!(stopped.code, Some(0), "{}", stopped.stderr);
        let p = |name: &str| dir.path().join(name);
        std::fs::write(p("boot_id"), "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0\n").unwrap();
        std::fs::write(p("kmsg"), "").unwrap();
        std::fs::write(p("nvml.script"), script).unwrap();
        let started = Instant::now();
        let daemon = support::Run::new(&p("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", p("boot_id"))
            .nvml_script(&p("nvml.script"))
            .spawn();
        Lost {
            dir,
            daemon,
            rx,
            started,
        }
    }

    /// An Xid on the GPU at bus `bus` (`0000:<bus>:00.0`).
    fn append_xid_on(&self, bus: &str, seq: u64, xid: u32) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("kmsg"))
            .unwrap();
        let rec = format!(
            "3,{seq},{},-;NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid=42, name=python3, test\n",
            1_000_000 + seq
        );
        f.write_all(rec.as_bytes()).unwrap();
    }

    /// What the receiver got, in order, and when each came.
    fn docs(&self) -> Vec<(Instant, Value)> {
        self.rx
            .answered()
            .iter()
            .filter_map(|r| serde_json::from_slice(&r.body).ok().map(|v| (r.at, v)))
            .collect()
    }

    /// The log so far.
    fn log(&self) -> String {
        self.daemon.stderr()
    }

    /// The first document matching `pred`, and when it came; fails after [`LIMIT`].
    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> (Instant, Value) {
        let start = Instant::now();
        loop {
            if let Some(hit) = self.docs().into_iter().find(|(_, v)| pred(v)) {
                return hit;
            }
            assert!(
                start.elapsed() < LIMIT,
                "no {what} within {LIMIT:?}; got: {:#?}\nlog:\n{}",
                self.docs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every resolved notice for the Xid 79 / lost GPU so far.
    fn resolved_lost(&self) -> Vec<Value> {
        self.docs()
            .into_iter()
            .map(|(_, v)| v)
            .filter(|v| v["phase"] == "resolved" && is_lost(v))
            .collect()
    }

    /// Waits, polling, until `d` has passed: the absence of a notice over several quiet periods.
    fn hold_for(&self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            assert!(
                self.resolved_lost().is_empty(),
                "{:#?}",
                self.resolved_lost()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn is_lost(v: &Value) -> bool {
    v["xid"] == 79 || v["kind"] == "gpu_missing" || v["kind"] == "fallen_off_bus"
}

fn headline(v: &Value) -> String {
    v["headline"].as_str().unwrap_or_default().to_string()
}

/// The GPU is seen at init, then lost 1.5 s in (the probe notices), and `then` from `back_ms`.
fn script(back_ms: u64, then: &str) -> String {
    format!(
        "init ok\ndriver_version 550.54.14\n\
         device pci=0000:17:00.0 uuid={UUID0} serial=1650923011234 name=NVIDIA_H100\n\
         set at_ms=1500 gpu=0 lost=1\n\
         set at_ms={back_ms} gpu=0 lost=0 {then}\n"
    )
}

/// Lost, then an Xid 79: the page goes out, and nothing resolves on silence.
fn lose(d: &Lost) -> Instant {
    d.wait_for("the probe's gpu_missing", |v| v["kind"] == "gpu_missing");
    d.append_xid(1, 79);
    let (at, page) = d.wait_for("the Xid 79 page", |v| {
        v["xid"] == 79 && v["phase"] == "opened"
    });
    assert_eq!(page["gpu"]["uuid"], UUID0, "{page}");
    at
}

#[test]
fn a_lost_gpu_never_resolves_while_lost_and_resolves_when_the_same_board_is_back() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let d = Lost::start(Some(&script(9_000, "")));
    let paged = lose(&d);
    // Lost until 9 s after init: several 1 s windows and quiet periods pass without an end.
    let (at, resolved) = d.wait_for("the verified recovery", |v| {
        v["phase"] == "resolved" && v["xid"] == 79
    });
    assert!(
        at.duration_since(paged) >= Duration::from_secs(3),
        "resolved {:?} after the page, before the GPU was back",
        at.duration_since(paged)
    );
    let h = headline(&resolved);
    assert!(
        h.contains(&format!("recovered: {UUID0} reachable again (same board)")),
        "{h}"
    );
    assert!(!h.contains("quiet"), "{h}");
    assert_eq!(d.resolved_lost().len(), 1, "{:#?}", d.resolved_lost());
}

/// A reboot ends no state: the GPU lost in the first boot stays the same open incident across
/// it, and only the new boot's probe finding the same board reachable ends it, saying so.
#[test]
fn a_gpu_lost_before_a_reboot_ends_only_when_the_new_boot_verifies_it() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Lost for the rest of the first boot.
    let d = Lost::start(Some(&script(600_000, "")));
    lose(&d);
    let (_, page) = d.wait_for("the Xid 79 page", |v| {
        v["xid"] == 79 && v["phase"] == "opened"
    });
    assert!(d.resolved_lost().is_empty(), "{:#?}", d.resolved_lost());
    // The new boot: the board is there, NVML reaches it.
    let d = d.reboot(&format!(
        "init ok\ndriver_version 550.54.14\n\
         device pci=0000:17:00.0 uuid={UUID0} serial=1650923011234 name=NVIDIA_H100\n"
    ));
    let (_, resolved) = d.wait_for("the verified recovery after the reboot", |v| {
        v["phase"] == "resolved" && v["xid"] == 79
    });
    assert_eq!(
        resolved["id"], page["id"],
        "the same incident: {resolved:#}"
    );
    let h = headline(&resolved);
    assert!(
        h.contains(&format!(
            "recovered after the reboot: {UUID0} reachable again (same board)"
        )),
        "{h}"
    );
    // The probe's gpu_missing, superseded by the Xid 79 in the first boot, ends with it.
    let ids: Vec<&Value> = resolved["supersedes"]
        .as_array()
        .map(|a| a.iter().map(|s| &s["kind"]).collect())
        .unwrap_or_default();
    assert!(ids.iter().any(|k| *k == "gpu_missing"), "{resolved:#}");
    assert_eq!(d.resolved_lost().len(), 1, "{:#?}", d.resolved_lost());
}

#[test]
fn another_board_at_the_address_is_no_recovery() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let d = Lost::start(Some(&script(4_000, &format!("uuid={OTHER}"))));
    lose(&d);
    let (_, note) = d.wait_for("the other-board digest", |v| {
        headline(v).contains("different board")
    });
    let h = headline(&note);
    assert!(h.contains(OTHER) && h.contains("not recovered"), "{h}");
    // Probe rounds every second see the other board: still open.
    d.hold_for(Duration::from_secs(3));
}

#[test]
fn without_nvml_a_lost_gpu_stays_open_and_the_page_says_why() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let d = Lost::start(None);
    d.append_xid(1, 79);
    let (_, page) = d.wait_for("the Xid 79 page", |v| {
        v["xid"] == 79 && v["phase"] == "opened"
    });
    let meaning = page["meaning"].as_str().unwrap_or_default();
    assert!(
        meaning.contains("xidwatch cannot verify recovery without NVML; this stays open until"),
        "{meaning}"
    );
    d.hold_for(Duration::from_secs(4));
}

#[test]
fn an_event_still_ends_after_its_quiet_period_and_says_quiet() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let d = Lost::start(None);
    d.append_xid(1, 13);
    let (_, resolved) = d.wait_for("the Xid 13 quiet notice", |v| {
        v["xid"] == 13 && v["phase"] == "resolved"
    });
    let h = headline(&resolved);
    assert!(h.contains("quiet for 1 s"), "{h}");
    assert!(!h.contains("recovered"), "{h}");
}

/// How long a test watches a lost GPU's incident hold after it first shows: four quiet periods.
const HOLD: Duration = Duration::from_secs(4);
/// When the fake makes the GPU reachable again in the tests below (ms after its init): long
/// enough that the page, its first showing and [`HOLD`] all fit before it on a slow machine.
const BACK_MS: u64 = 15_000;

impl Lost {
    /// When the fake is certain to still report the GPU lost: before `started + BACK_MS` (less a
    /// margin). Fails if `HOLD` from `from` does not fit, rather than watching a recovered GPU.
    fn hold_until(&self, from: Instant) -> Instant {
        let back = self.started + Duration::from_millis(BACK_MS) - Duration::from_millis(500);
        assert!(
            from + HOLD <= back,
            "too slow: the incident showed {:?} after the start, too late to watch it hold for {HOLD:?} before the GPU is back",
            from.duration_since(self.started)
        );
        from + HOLD
    }

    /// `xidwatch npd-check --config ...`: its exit code and its line.
    fn npd_check(&self) -> (Option<i32>, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(["npd-check", "--config"])
            .arg(self.dir.path().join("xidwatch.toml"))
            .output()
            .expect("run xidwatch npd-check");
        let text = String::from_utf8_lossy(&out.stdout).trim_end().to_string();
        (out.status.code(), text)
    }

    /// Runs npd-check until it exits `code`; its line. Fails after [`LIMIT`].
    fn npd_until(&self, code: i32) -> String {
        let start = Instant::now();
        loop {
            let (got, text) = self.npd_check();
            if got == Some(code) {
                return text;
            }
            assert!(
                start.elapsed() < LIMIT,
                "npd-check never exited {code} within {LIMIT:?}; last {got:?}: {text}\nlog:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A host name no other test run has used, for an Alertmanager filter.
/// The real Alertmanager's list of one host's alerts (`GET /api/v2/alerts?filter=host=...`).
struct Alertmanager {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    url: reqwest::Url,
}

impl Alertmanager {
    fn new(base: &str, host: &str) -> Alertmanager {
        let mut url = reqwest::Url::parse(&format!("{base}/api/v2/alerts")).unwrap();
        url.query_pairs_mut()
            .append_pair("filter", &format!("host=\"{host}\""));
        Alertmanager {
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            client: reqwest::Client::new(),
            url,
        }
    }

    fn list(&self) -> Value {
        self.rt.block_on(async {
            let resp = self.client.get(self.url.clone()).send().await.unwrap();
            serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
        })
    }
}

/// What an alert is about: `xid 79`, or its kind (`gpu_missing`).
fn what_of(alert: &Value) -> String {
    let l = &alert["labels"];
    match l["xid"].as_str() {
        Some(x) => format!("xid {x}"),
        None => l["kind"].as_str().unwrap_or("").to_string(),
    }
}

fn unique_host(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

/// Through the real daemon to a real Alertmanager: the Xid 79 on a lost GPU is active there,
/// stays active over several quiet periods (its `endsAt` is "until resolved", and no resolved
/// notice goes out on silence), and leaves the active list once the fake makes the same board
/// reachable again.
#[test]
#[ignore = "needs an Alertmanager: XIDWATCH_ALERTMANAGER_URL (.ci/alert-services.sh)"]
fn a_lost_gpu_stays_active_in_alertmanager_until_the_same_board_is_back() {
    let base = super::support::required_env("XIDWATCH_ALERTMANAGER_URL");
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let host = unique_host("lost-am");
    let d = Lost::start_with(
        Some(&script(BACK_MS, "")),
        &format!("host = {host:?}\n"),
        &format!("[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"{base}\"]\n"),
    );
    let am = Alertmanager::new(&base, &host);
    // This host's alerts that Alertmanager lists, as (what, state): the Xid 79 (`xid 79`) and
    // the probe's `gpu_missing`, each with its state (active, suppressed, ...).
    let alerts = || -> (Vec<(String, String)>, Value) {
        let list = am.list();
        let mut got: Vec<(String, String)> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let state = a["status"]["state"].as_str().unwrap_or("").to_string();
                (what_of(a), state)
            })
            .collect();
        got.sort();
        (got, list)
    };
    let active = |what: &str| (what.to_string(), "active".to_string());
    let both = vec![active("gpu_missing"), active("xid 79")];

    lose(&d);
    let deadline = Instant::now() + LIMIT;
    let shown = loop {
        let (got, list) = alerts();
        if got == both {
            let xid = list
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["labels"]["xid"] == "79")
                .unwrap();
            assert_eq!(xid["labels"]["pci"], "0000:17:00.0", "{xid:#}");
            assert_eq!(xid["labels"]["uuid"], UUID0, "{xid:#}");
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the Xid 79 and gpu_missing never both active in Alertmanager: {list:#}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };

    // Several 1 s quiet periods: both still active every time (a resolved notice, or an
    // `endsAt` on a timer, would take them off the active list).
    let until = d.hold_until(shown);
    let mut polls = 0;
    while Instant::now() < until {
        let (got, list) = alerts();
        assert_eq!(
            got,
            both,
            "not both active {:?} after they showed, GPU still lost: {list:#}",
            shown.elapsed()
        );
        polls += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(polls >= 4, "{polls} polls");
    assert!(d.resolved_lost().is_empty(), "{:#?}", d.resolved_lost());

    // The same board is back: the Xid 79's resolved notice ends it in Alertmanager, and with
    // it the probe's `gpu_missing`, which it superseded after that was paged (no resolved
    // notice of its own while the GPU was lost: it ends with its successor).
    d.wait_for("the verified recovery", |v| {
        v["phase"] == "resolved" && v["xid"] == 79
    });
    let deadline = Instant::now() + LIMIT;
    loop {
        let (got, list) = alerts();
        if !got.iter().any(|(_, state)| state == "active") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still active in Alertmanager after the GPU was back: {list:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// node-problem-detector's check follows the host's verdict: it reports the problem (exit 1) on
/// every run while the GPU is lost, over several quiet periods, and OK (exit 0) once the same
/// board is back and the incident resolved.
#[test]
fn npd_check_reports_a_lost_gpu_until_the_same_board_is_back() {
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let d = Lost::start(Some(&script(BACK_MS, "")));
    lose(&d);
    let first = d.npd_until(1);
    assert!(first.starts_with("failed: "), "{first}");

    let until = d.hold_until(Instant::now());
    let mut runs = 0;
    while Instant::now() < until {
        let (code, text) = d.npd_check();
        assert_eq!(code, Some(1), "GPU still lost: {text}");
        assert!(text.starts_with("failed: "), "{text}");
        runs += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(runs >= 4, "{runs} runs");
    assert!(d.resolved_lost().is_empty(), "{:#?}", d.resolved_lost());

    d.wait_for("the verified recovery", |v| {
        v["phase"] == "resolved" && v["xid"] == 79
    });
    let ok = d.npd_until(0);
    assert!(ok.starts_with("ok: "), "{ok}");
}

/// Two GPUs lost together are one host page, but two alerts in Alertmanager, each under its own
/// GPU's labels: when the fake brings one board back, only its alerts end (its Xid 79 and the
/// `gpu_missing` it superseded), and the other GPU's stay active while it is still lost.
#[test]
#[ignore = "needs an Alertmanager: XIDWATCH_ALERTMANAGER_URL (.ci/alert-services.sh)"]
fn a_host_page_is_one_alert_per_gpu_in_alertmanager_and_each_ends_on_its_own() {
    let base = super::support::required_env("XIDWATCH_ALERTMANAGER_URL");
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let host = unique_host("hostpage-am");
    let script = format!(
        "init ok\ndriver_version 550.54.14\n\
         device pci=0000:17:00.0 uuid={UUID0} serial=1650923011234 name=NVIDIA_H100\n\
         device pci=0000:18:00.0 uuid={OTHER} serial=1650923011235 name=NVIDIA_H100\n\
         set at_ms=1500 gpu=0 lost=1\nset at_ms=1500 gpu=1 lost=1\n\
         set at_ms={BACK_MS} gpu=1 lost=0\n"
    );
    let d = Lost::start_on(
        &["0000:17:00.0", "0000:18:00.0"],
        Some(&script),
        &format!("settle_ms = 500\nhost = {host:?}\n"),
        &format!("[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"{base}\"]\n"),
    );
    let am = Alertmanager::new(&base, &host);
    // This host's active alerts as "what@pci".
    let active = || -> (Vec<String>, Value) {
        let list = am.list();
        let mut got: Vec<String> = list
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["status"]["state"] == "active")
            .map(|a| {
                format!(
                    "{}@{}",
                    what_of(a),
                    a["labels"]["pci"].as_str().unwrap_or("-")
                )
            })
            .collect();
        got.sort();
        (got, list)
    };
    let wait_active = |want: &[&str], what: &str| {
        let deadline = Instant::now() + LIMIT;
        loop {
            let (got, list) = active();
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: active {got:?}, want {want:?}: {list:#}\nlog:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    d.wait_for("the probe's gpu_missing", |v| v["kind"] == "gpu_missing");
    d.append_xid_on("17", 1, 79);
    d.append_xid_on("18", 2, 79);
    let (_, page) = d.wait_for("the Xid 79 host page", |v| {
        v["xid"] == 79 && v["phase"] == "opened"
    });
    assert_eq!(
        page["host_group"]["gpus"].as_array().map(Vec::len),
        Some(2),
        "{page:#}"
    );
    wait_active(
        &[
            "gpu_missing@0000:17:00.0",
            "gpu_missing@0000:18:00.0",
            "xid 79@0000:17:00.0",
            "xid 79@0000:18:00.0",
        ],
        "both GPUs lost",
    );
    // The second board is back: only its alerts end.
    d.wait_for("the second GPU's verified recovery", |v| {
        v["phase"] == "resolved" && v["xid"] == 79 && v["gpu"]["pci"] == "0000:18:00.0"
    });
    wait_active(
        &["gpu_missing@0000:17:00.0", "xid 79@0000:17:00.0"],
        "one GPU back",
    );
    assert!(
        d.resolved_lost()
            .iter()
            .all(|v| v["gpu"]["pci"] == "0000:18:00.0"),
        "{:#?}",
        d.resolved_lost()
    );
}
