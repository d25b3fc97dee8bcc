//! A lost GPU is a state, not an event: through the real daemon with the fake NVML, an Xid 79 on
//! a GPU NVML cannot reach never resolves on the log's silence, only when a probe verifies the
//! same board back; an event (Xid 13) still ends after its quiet period, and says only that.
//!
//! Windows and quiet periods are 1 s here, so "several quiet periods" are a few seconds. Every
//! test asserts on what a webhook receiver got.

use std::io::{BufReader, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::{fake_nvml_library, read_request};

/// The fake reads its script from a process-wide variable: one daemon with it at a time.
static LOCK: Mutex<()> = Mutex::new(());

const UUID0: &str = "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f";
const OTHER: &str = "GPU-99999999-0000-4000-8000-000000000001";
const LIMIT: Duration = Duration::from_secs(30);

/// A daemon with a webhook receiver; what the receiver got, in order.
struct Lost {
    dir: TempDir,
    child: Child,
    docs: Arc<Mutex<Vec<(Instant, Value)>>>,
    log: Arc<Mutex<String>>,
}

impl Lost {
    /// Starts the daemon with NVML (`script`) or without it (`None`), one NVIDIA GPU at
    /// 0000:17:00.0 on the fake bus, windows and quiet periods of 1 s.
    fn start(script: Option<&str>) -> Lost {
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        std::fs::write(p("kmsg"), "").unwrap();
        std::fs::write(p("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        let dev = p("sys/bus/pci/devices/0000:17:00.0");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(dev.join("class"), "0x030200\n").unwrap();
        std::fs::write(p("nvml.script"), script.unwrap_or("")).unwrap();

        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let docs: Arc<Mutex<Vec<(Instant, Value)>>> = Arc::default();
        let d2 = docs.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().map_while(Result::ok) {
                let d3 = d2.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    while let Some((_, body)) = read_request(&mut r) {
                        if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                            d3.lock().unwrap().push((Instant::now(), v));
                        }
                        let _ = w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                    }
                });
            }
        });
        std::fs::write(
            p("xidwatch.toml"),
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = {}\nlibrary = {:?}\nprobe_interval_secs = 1\ncall_timeout_secs = 1\nsysfs_root = {:?}\n[state]\ndir = {:?}\n\
                 [incidents]\nsettle_ms = 0\nwindow_secs = 1\nquiet_secs = 1\n\
                 [[alerts.webhook]]\nname = \"hook\"\nurl = \"http://{addr}/hook\"\nformat = \"json\"\n",
                p("kmsg"),
                script.is_some(),
                fake_nvml_library(),
                p("sys"),
                p("state"),
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(["run", "--config"])
            .env(
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat(),
            )
            .arg(p("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", p("boot_id"))
            .env("XIDWATCH_FAKE_NVML_SCRIPT", p("nvml.script"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn xidwatch run");
        let log: Arc<Mutex<String>> = Arc::default();
        let (l2, err) = (log.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut l = l2.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Lost {
            dir,
            child,
            docs,
            log,
        }
    }

    fn append_xid(&self, seq: u64, xid: u32) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("kmsg"))
            .unwrap();
        let rec = format!(
            "3,{seq},{},-;NVRM: Xid (PCI:0000:17:00): {xid}, pid=42, name=python3, test\n",
            1_000_000 + seq
        );
        f.write_all(rec.as_bytes()).unwrap();
    }

    /// The first document matching `pred`, and when it came; fails after [`LIMIT`].
    fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> (Instant, Value) {
        let start = Instant::now();
        loop {
            if let Some(hit) = self.docs.lock().unwrap().iter().find(|(_, v)| pred(v)) {
                return hit.clone();
            }
            assert!(
                start.elapsed() < LIMIT,
                "no {what} within {LIMIT:?}; got: {:#?}\nlog:\n{}",
                self.docs.lock().unwrap(),
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every resolved notice for the Xid 79 / lost GPU so far.
    fn resolved_lost(&self) -> Vec<Value> {
        self.docs
            .lock()
            .unwrap()
            .iter()
            .map(|(_, v)| v.clone())
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

impl Drop for Lost {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
