//! `xidwatch run` end to end, as a process: a regular-file kmsg (same code path as the device
//! after the open), the real nvml-wrapper against the fake libnvidia-ml, restarts, storms.
//! No root, no GPU. The tests on the real `/dev/kmsg` and as another user need root and are
//! `#[ignore]`d (`cargo test -- --include-ignored` runs them, as `.ci/run` does).

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support;

const LIMIT: Duration = Duration::from_secs(20);

/// The toolkit's harness, with `--json`: incidents as JSON on stdout.
struct Daemon(support::Daemon);

impl std::ops::Deref for Daemon {
    type Target = support::Daemon;
    fn deref(&self) -> &support::Daemon {
        &self.0
    }
}

impl Daemon {
    fn start(config: &Path, env: &[(&str, &str)]) -> Daemon {
        let run = env
            .iter()
            .fold(support::Run::new(config).json(), |r, (k, v)| r.env(k, v));
        Daemon(run.spawn())
    }

    /// Waits until `pred` holds for the incidents seen so far.
    fn wait_for(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.0.wait_json_within(LIMIT, what, pred)
    }

    fn wait_stderr(&self, what: &str) {
        self.0.wait_stderr_within(LIMIT, what)
    }

    /// SIGTERM, then the exit status and everything printed.
    fn stop(self) -> (Option<i32>, Vec<Value>, String) {
        let s = self.0.stop();
        let lines = s.json();
        (s.code, lines, s.stderr)
    }
}

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(extra: &str) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let s = Setup { dir };
        std::fs::write(s.kmsg(), "").unwrap();
        std::fs::write(s.boot(), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        // Booted an hour ago: the records below (a second after boot) are inside the look-back.
        super::support::write_boot_stat(&s.stat(), 3600);
        let cfg = format!(
            "[kmsg]\npath = {:?}\naccept_userspace = false\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n{extra}",
            s.kmsg(),
            s.dir.path().join("sys"),
            s.dir.path().join("state")
        );
        std::fs::write(s.config(), cfg).unwrap();
        s
    }
    fn kmsg(&self) -> PathBuf {
        self.dir.path().join("kmsg")
    }
    fn boot(&self) -> PathBuf {
        self.dir.path().join("boot_id")
    }
    fn config(&self) -> PathBuf {
        self.dir.path().join("xidwatch.toml")
    }
    /// The `/proc/stat` the daemon reads the boot's time from.
    fn stat(&self) -> PathBuf {
        self.dir.path().join("stat")
    }
    fn append(&self, records: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.kmsg())
            .unwrap();
        f.write_all(records.as_bytes()).unwrap();
    }
    fn start(&self) -> Daemon {
        Daemon::start(
            &self.config(),
            &[
                ("XIDWATCH_BOOT_ID_PATH", self.boot().to_str().unwrap()),
                ("XIDWATCH_BOOT_TIME_PATH", self.stat().to_str().unwrap()),
            ],
        )
    }
}

fn xid_record(seq: u64, pci_bus: &str, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:{pci_bus}:00): {xid}, pid=42, name=python3, test\n",
        1_000_000 + seq
    )
}

#[test]
fn boot_time_faults_then_live_ones_and_no_duplicate_after_restart() {
    let s = Setup::new("");
    s.append("6,0,10,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14\n");
    s.append(&xid_record(1, "17", 79));
    let d = s.start();
    let v = d.wait_for("the boot-time Xid 79", |l| l.iter().any(|i| i["xid"] == 79));
    assert_eq!(v[0]["found_at_startup"], true);
    assert_eq!(v[0]["pci"], "0000:17:00.0");
    d.wait_stderr("caught up");
    s.append(&xid_record(2, "2a", 48));
    let v = d.wait_for("the live Xid 48", |l| l.iter().any(|i| i["xid"] == 48));
    let x48 = v.iter().find(|i| i["xid"] == 48).unwrap();
    assert!(x48.get("found_at_startup").is_none() || x48["found_at_startup"] == false);
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(all.iter().filter(|i| i["phase"] == "opened").count(), 2);

    // Restart in the same boot: nothing handled twice, nothing skipped.
    s.append(&xid_record(3, "3b", 119));
    let d = s.start();
    let v = d.wait_for("the Xid written while down", |l| {
        l.iter().any(|i| i["xid"] == 119)
    });
    d.wait_stderr("caught up");
    let (code, all, _) = d.stop();
    assert_eq!(code, Some(0));
    assert_eq!(all.len(), 1, "only the new record: {all:#?}");
    assert_eq!(v[0]["xid"], 119);

    // Records lost while xidwatch was down (the ring wrapped): reported as an overrun.
    s.append(&xid_record(9, "3b", 120));
    let d = s.start();
    let v = d.wait_for("the overrun across the restart", |l| {
        l.iter().any(|i| i["kind"] == "kmsg_overrun")
    });
    let o = v.iter().find(|i| i["kind"] == "kmsg_overrun").unwrap();
    assert!(
        o["title"].as_str().unwrap().contains("5 records lost"),
        "{o}"
    );
    d.stop();

    // A new boot: the whole buffer is read again, once.
    std::fs::write(s.boot(), "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0\n").unwrap();
    let d = s.start();
    // Xid 120 folds into the GSP incident its 119 opened on the same GPU; the gap is reported.
    d.wait_for("the whole buffer again", |l| {
        l.iter().any(|i| i["kind"] == "kmsg_overrun")
            && l.iter()
                .filter(|i| i["phase"] == "opened" && i["kind"] == "xid")
                .count()
                == 3
    });
    d.stop();
}

#[test]
fn lost_records_are_reported_as_an_overrun() {
    let s = Setup::new("");
    s.append(&xid_record(0, "17", 13));
    s.append(&xid_record(1, "17", 13));
    let d = s.start();
    d.wait_stderr("caught up");
    // Records 2..=9 never arrive.
    s.append(&xid_record(10, "2a", 48));
    let v = d.wait_for("an overrun incident", |l| {
        l.iter().any(|i| i["kind"] == "kmsg_overrun")
    });
    let o = v.iter().find(|i| i["kind"] == "kmsg_overrun").unwrap();
    assert!(
        o["title"].as_str().unwrap().contains("8 records lost"),
        "{o}"
    );
    d.stop();
}

#[test]
fn records_gone_before_the_first_start_are_not_seen_rather_than_lost() {
    // The ring wrapped before xidwatch first ran in this boot: the first record is not record 0.
    let s = Setup::new("");
    s.append(&xid_record(500, "17", 13));
    s.append(&xid_record(501, "2a", 48));
    let d = s.start();
    d.wait_for("both Xids", |l| {
        l.iter().any(|i| i["xid"] == 13) && l.iter().any(|i| i["xid"] == 48)
    });
    d.wait_stderr("caught up");
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        all.iter().all(|i| i["kind"] != "kmsg_overrun"),
        "no overrun: {all:#?}"
    );
    let said = "500 earlier records had already left the ring buffer and were not seen";
    assert_eq!(err.matches(said).count(), 1, "{err}");
    let line = err.lines().find(|l| l.contains(said)).unwrap();
    assert!(line.contains("INFO"), "{line}");
    assert!(err.contains(", 0 lost"), "nothing counted as lost: {err}");
}

#[test]
fn a_sequence_far_ahead_neither_blinds_the_reader_nor_the_restart() {
    let s = Setup::new("");
    s.append(&xid_record(0, "17", 13));
    s.append("3,18446744073709551615,1000001,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=42, name=python3, test\n");
    s.append(&xid_record(1, "3b", 79));
    s.append(&xid_record(2, "4c", 119));
    let d = s.start();
    let v = d.wait_for("the records after the bad one", |l| {
        l.iter().any(|i| i["xid"] == 79) && l.iter().any(|i| i["xid"] == 119)
    });
    let seq: Vec<_> = v.iter().filter(|i| i["kind"] == "kmsg_sequence").collect();
    assert_eq!(seq.len(), 1, "reported once: {v:#?}");
    assert!(
        seq[0]["title"]
            .as_str()
            .unwrap()
            .contains("18446744073709551615 jumps far ahead"),
        "{}",
        seq[0]
    );
    d.wait_stderr("caught up");
    let (code, first, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        first.iter().any(|i| i["xid"] == 48),
        "the bad record itself is read"
    );
    let status: Value =
        serde_json::from_slice(&std::fs::read(s.dir.path().join("state/status.json")).unwrap())
            .unwrap();
    assert_eq!(status["kmsg"]["out_of_sequence"], 1, "{status}");

    // Across a restart: the position saved is not a wall; new records are read, old ones not.
    s.append(&xid_record(3, "5d", 62));
    let d = s.start();
    d.wait_for("the record written while down", |l| {
        l.iter().any(|i| i["xid"] == 62)
    });
    d.wait_stderr("caught up");
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    let opened: Vec<_> = all.iter().filter(|i| i["phase"] == "opened").collect();
    assert_eq!(opened.len(), 1, "only the new record: {all:#?}");

    // Records going backwards: said (the finding joins the incident still open for the first
    // one), and still read.
    s.append(&xid_record(1, "6e", 31));
    s.append(&xid_record(2, "7f", 43));
    let d = s.start();
    d.wait_for("the records after the step back", |l| {
        l.iter().any(|i| i["xid"] == 31) && l.iter().any(|i| i["xid"] == 43)
    });
    d.wait_stderr("record sequence number 1 goes backwards of 3");
    d.stop();
}

#[test]
fn a_forged_sequence_jump_is_reported_as_a_jump_not_as_lost_records() {
    let s = Setup::new("");
    s.append(&xid_record(0, "17", 13));
    // Two billion ahead: no ring buffer overwrites that many records between two reads.
    s.append(&xid_record(2_000_000_001, "2a", 48));
    s.append(&xid_record(2_000_000_002, "3b", 79));
    let d = s.start();
    let v = d.wait_for("the jump and the records after it", |l| {
        l.iter().any(|i| i["xid"] == 79) && l.iter().any(|i| i["kind"] == "kmsg_sequence")
    });
    assert!(
        v.iter().all(|i| i["kind"] != "kmsg_overrun"),
        "no overrun: {v:#?}"
    );
    let jump = v.iter().find(|i| i["kind"] == "kmsg_sequence").unwrap();
    let title = jump["title"].as_str().unwrap();
    assert!(title.contains("jump from 0 to 2000000001"), "{title}");
    d.wait_stderr("caught up");
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains(", 0 lost"), "nothing counted as lost: {err}");
    let status: Value =
        serde_json::from_slice(&std::fs::read(s.dir.path().join("state/status.json")).unwrap())
            .unwrap();
    assert_eq!(status["kmsg"]["lost"], 0, "{status}");
    assert_eq!(status["kmsg"]["out_of_sequence"], 1, "{status}");
}

#[test]
fn userspace_lines_are_ignored_unless_accepted() {
    let s = Setup::new("");
    s.append("12,0,5,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, injected by a user\n");
    s.append("12,1,6,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, injected again\n");
    s.append(&xid_record(2, "2a", 48));
    let d = s.start();
    d.wait_for("the kernel's Xid 48", |l| l.iter().any(|i| i["xid"] == 48));
    d.wait_stderr("caught up");
    let (_, all, err) = d.stop();
    assert!(all.iter().all(|i| i["xid"] != 79), "{all:#?}");
    assert!(err.contains("2 userspace ignored"), "{err}");
    // Said once, naming the key, so a test with `echo` is not met by silence.
    assert_eq!(
        err.matches("kmsg] accept_userspace = true").count(),
        1,
        "{err}"
    );

    let s = Setup::new("");
    let cfg = std::fs::read_to_string(s.config())
        .unwrap()
        .replace("accept_userspace = false", "accept_userspace = true");
    std::fs::write(s.config(), cfg).unwrap();
    s.append("12,0,5,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, a fire drill\n");
    let d = s.start();
    d.wait_for("the drill's Xid 79", |l| l.iter().any(|i| i["xid"] == 79));
    d.stop();
}

#[test]
fn a_storm_is_one_incident_with_exact_counts() {
    // No settle delay: this is about the digest after the first alert, not what settles into it.
    let s = Setup::new("[incidents]\nwindow_secs = 2\nsettle_ms = 0\n");
    let d = s.start();
    d.wait_stderr("caught up");
    let mut storm = String::new();
    for seq in 0..5000u64 {
        storm.push_str(&xid_record(seq, "17", 13));
    }
    s.append(&storm);
    let v = d.wait_for("the digest", |l| l.iter().any(|i| i["phase"] == "digest"));
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(all.len(), 2, "{all:#?}");
    assert_eq!(
        v.iter().find(|i| i["phase"] == "digest").unwrap()["count"],
        5000
    );
    assert_eq!(all[0]["id"], all[1]["id"]);
}

#[test]
fn config_errors_name_the_key_and_exit_78() {
    let s = Setup::new("[kmsg]\n");
    let out = support::Run::new(&s.config()).output();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("xidwatch.toml") && err.contains("kmsg"),
        "{err}"
    );

    std::fs::write(
        s.config(),
        "[kmsg]\npath = \"/dev/kmsg\"\nacept_userspace = true\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["check", "--config"])
        .arg(s.config())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("acept_userspace") && err.contains("line 3"),
        "{err}"
    );
}

// ---- NVML through the real nvml-wrapper and the fake library ----

fn fake_library() -> PathBuf {
    super::support::fake_nvml_library()
}

fn nvml_setup(script: &str) -> (Setup, PathBuf) {
    let s = Setup::new("");
    let lib = fake_library();
    let cfg = std::fs::read_to_string(s.config()).unwrap().replace(
        "enabled = false",
        &format!("enabled = true\nlibrary = {lib:?}"),
    );
    std::fs::write(s.config(), cfg).unwrap();
    let script_path = s.dir.path().join("nvml.script");
    std::fs::write(&script_path, script).unwrap();
    (s, script_path)
}

#[test]
fn nvml_events_enrich_and_fold_into_kernel_log_incidents() {
    let (s, script) = nvml_setup(
        "init ok\ndriver_version 550.54.14\n\
         device pci=0000:17:00.0 uuid=GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f serial=1650923011234 name=NVIDIA_H100\n\
         device pci=0000:2a:00.0 uuid=GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0 serial=1650923011235 name=NVIDIA_H100\n\
         event after_ms=300 gpu=0 type=xid data=79\n\
         event after_ms=50 gpu=1 type=dbe\n\
         event after_ms=10 gpu=1 type=xid data=48\n",
    );
    s.append(&xid_record(0, "17", 79));
    let d = Daemon::start(
        &s.config(),
        &[
            ("XIDWATCH_BOOT_ID_PATH", s.boot().to_str().unwrap()),
            (
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat().to_str().unwrap(),
            ),
            ("XIDWATCH_FAKE_NVML_SCRIPT", script.to_str().unwrap()),
        ],
    );
    let v = d.wait_for("the ECC event", |l| {
        l.iter().any(|i| i["kind"] == "ecc_error")
    });
    let x79 = v.iter().find(|i| i["xid"] == 79).unwrap();
    // The kernel-log incident carries what NVML knows about the GPU.
    assert_eq!(
        x79["gpu"]["uuid"],
        "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f"
    );
    assert_eq!(x79["gpu"]["serial"], "1650923011234");
    assert_eq!(x79["gpu"]["index"], 0);
    let ecc = v.iter().find(|i| i["kind"] == "ecc_error").unwrap();
    assert_eq!(
        (ecc["pci"].as_str(), ecc["severity"].as_str()),
        (Some("0000:2a:00.0"), Some("critical"))
    );
    // An Xid only NVML saw (none in the kernel log) is reported after the matching window,
    // with the catalog's severity: 48 is critical, and it outranks the ECC event it follows.
    let v = d.wait_for("the NVML-only Xid 48", |l| l.iter().any(|i| i["xid"] == 48));
    let x48 = v.iter().find(|i| i["xid"] == 48).unwrap();
    assert_eq!(x48["severity"], "critical", "{x48}");
    assert!(
        x48["findings"][0]["title"]
            .as_str()
            .unwrap()
            .contains("reported by NVML"),
        "{x48}"
    );
    // The NVML copy of Xid 79 was folded, not reported twice.
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(all.iter().filter(|i| i["xid"] == 79).count(), 1, "{all:#?}");
}

#[test]
fn nvml_init_failures_become_incidents_and_the_kernel_log_goes_on() {
    for (code, words) in [("9", "driver"), ("18", "mismatch")] {
        let (s, script) = nvml_setup(&format!("init error {code}\n"));
        s.append(&xid_record(0, "17", 48));
        let d = Daemon::start(
            &s.config(),
            &[
                ("XIDWATCH_BOOT_ID_PATH", s.boot().to_str().unwrap()),
                (
                    "XIDWATCH_BOOT_TIME_PATH",
                    super::support::recent_boot_stat().to_str().unwrap(),
                ),
                ("XIDWATCH_FAKE_NVML_SCRIPT", script.to_str().unwrap()),
            ],
        );
        let v = d.wait_for("the NVML incident and the Xid", |l| {
            l.iter().any(|i| i["kind"] == "nvml_unavailable") && l.iter().any(|i| i["xid"] == 48)
        });
        let n = v.iter().find(|i| i["kind"] == "nvml_unavailable").unwrap();
        assert!(
            n["title"].as_str().unwrap().to_lowercase().contains(words),
            "{n}"
        );
        assert_eq!(n["severity"], "critical");
        d.stop();
    }
    // No library at all (no NVIDIA driver): said once, no incident.
    let s = Setup::new("");
    let cfg = std::fs::read_to_string(s.config()).unwrap().replace(
        "enabled = false",
        "enabled = true\nlibrary = \"/nonexistent/libnvidia-ml.so.1\"",
    );
    std::fs::write(s.config(), cfg).unwrap();
    s.append(&xid_record(0, "17", 48));
    let d = s.start();
    d.wait_for("the Xid", |l| l.iter().any(|i| i["xid"] == 48));
    d.wait_stderr("NVML unavailable");
    let (_, all, _) = d.stop();
    assert!(all.iter().all(|i| i["kind"] != "nvml_unavailable"));
}

#[test]
fn the_unit_protocol_ready_watchdog_stopping() {
    use std::os::unix::net::UnixDatagram;
    let s = Setup::new("");
    let sock_path = s.dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let d = Daemon::start(
        &s.config(),
        &[
            ("XIDWATCH_BOOT_ID_PATH", s.boot().to_str().unwrap()),
            (
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat().to_str().unwrap(),
            ),
            ("NOTIFY_SOCKET", sock_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "200000"),
        ],
    );
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !(seen.iter().any(|m: &String| m == "READY=1") && seen.iter().any(|m| m == "WATCHDOG=1"))
    {
        let n = sock.recv(&mut buf).expect("a notification");
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let (code, _, _) = d.stop();
    assert_eq!(code, Some(0));
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    loop {
        let n = sock.recv(&mut buf).expect("STOPPING=1");
        if &buf[..n] == b"STOPPING=1" {
            break;
        }
    }
}

/// On the real kernel log: writes test lines to /dev/kmsg, so it needs root.
#[test]
#[ignore = "needs root: writes test lines to /dev/kmsg"]
fn real_kmsg_end_to_end() {
    super::support::require_kmsg_e2e();
    let s = Setup::new("[incidents]\nwindow_secs = 3\n");
    let cfg = std::fs::read_to_string(s.config())
        .unwrap()
        .replace(&format!("path = {:?}", s.kmsg()), "path = \"/dev/kmsg\"")
        .replace("accept_userspace = false", "accept_userspace = true");
    std::fs::write(s.config(), cfg).unwrap();
    std::fs::write(
        s.boot(),
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap(),
    )
    .unwrap();
    // A bus number unique to this run, so lines from earlier runs in the ring are told apart.
    let tag = format!("{:02x}", (std::process::id() % 200) as u8 + 16);
    let write = |line: &str| {
        let mut k = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/kmsg")
            .expect("open /dev/kmsg for writing");
        k.write_all(line.as_bytes()).unwrap();
    };
    let d = s.start();
    d.wait_stderr("caught up");
    write(&format!(
        "<3>NVRM: Xid (PCI:0000:{tag}:00): 79, pid=1, name=e2e, GPU has fallen off the bus.\n"
    ));
    let v = d.wait_for("the Xid 79", |l| {
        l.iter()
            .any(|i| i["xid"] == 79 && i["pci"] == format!("0000:{tag}:00.0"))
    });
    assert!(v.iter().any(|i| i["xid"] == 79));
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");

    // Restart: no duplicate. A fence (an Xid on another bus, written after the restart) is
    // reported only after everything read before it was handled.
    let d = s.start();
    d.wait_stderr("caught up");
    let fence = format!("{:02x}", ((std::process::id() % 200) as u8 + 16) ^ 0x80);
    write(&format!(
        "<3>NVRM: Xid (PCI:0000:{fence}:00): 31, pid=1, name=e2e, Ch 00000008, intr 00000000. MMU Fault\n"
    ));
    d.wait_for("the fence", |l| {
        l.iter()
            .any(|i| i["xid"] == 31 && i["pci"] == format!("0000:{fence}:00.0"))
    });
    let (_, all, _) = d.stop();
    assert!(
        all.iter()
            .all(|i| i["pci"] != format!("0000:{tag}:00.0") || i["phase"] == "digest"),
        "{all:#?}"
    );

    // A storm of 5,000 Xid 13 lines: exact counts, bounded incidents.
    let d = s.start();
    d.wait_stderr("caught up");
    for _ in 0..5000 {
        write(&format!(
            "<4>NVRM: Xid (PCI:0000:{tag}:00): 13, pid=1, name=e2e, Graphics Exception\n"
        ));
    }
    // Exact counts: every storm line is in exactly one incident's count (the writer may outlast
    // one window, so the storm may span a few incidents, each ending with a digest).
    let ours = format!("0000:{tag}:00.0");
    let total = |l: &[Value]| -> u64 {
        let mut by_id = std::collections::BTreeMap::new();
        for i in l
            .iter()
            .filter(|i| i["xid"] == 13 && i["pci"] == ours.as_str())
        {
            let c = i["count"].as_u64().unwrap_or(0);
            let e = by_id
                .entry(i["id"].as_str().unwrap_or("").to_string())
                .or_insert(0);
            *e = c.max(*e);
        }
        by_id.values().sum()
    };
    let overrun_seen = |l: &[Value]| l.iter().any(|i| i["kind"] == "kmsg_overrun");
    let v = d.wait_for("every storm line counted", |l| {
        total(l) == 5000 || overrun_seen(l)
    });
    let (_, all, err) = d.stop();
    let ids: std::collections::BTreeSet<_> = all
        .iter()
        .filter(|i| i["xid"] == 13 && i["pci"] == ours.as_str())
        .map(|i| i["id"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        ids.len() <= 10,
        "a bounded number of incidents: {}",
        ids.len()
    );
    // An overrun (the ring buffer is small) is reported; without one, counts are exact.
    if !overrun_seen(&all) {
        assert_eq!(total(&v), 5000, "{err}");
    }
}

#[test]
fn reload_applies_valid_changes_and_refuses_invalid_ones() {
    let s = Setup::new("");
    let base = std::fs::read_to_string(s.config()).unwrap();
    let d = s.start();
    d.wait_stderr("caught up");
    s.append(&xid_record(0, "17", 48));
    d.wait_for("the first Xid 48", |l| l.iter().any(|i| i["xid"] == 48));

    // A valid change, applied on SIGHUP: Xid 48 is now ignored.
    std::fs::write(s.config(), format!("{base}[xid.48]\nignore = true\n")).unwrap();
    super::support::signal(&d.child, libc::SIGHUP);
    d.wait_stderr("config reloaded");
    s.append(&xid_record(1, "2a", 48));
    s.append(&xid_record(2, "2a", 79));
    let v = d.wait_for("Xid 79 on 2a", |l| {
        l.iter()
            .any(|i| i["xid"] == 79 && i["pci"] == "0000:2a:00.0")
    });
    assert!(
        !v.iter()
            .any(|i| i["xid"] == 48 && i["pci"] == "0000:2a:00.0"),
        "{v:#?}"
    );

    // An invalid change, picked up from the file itself: refused, alerted once, old config kept.
    std::fs::write(
        s.config(),
        format!("{base}[xid.48]\nignore = true\nsevrity = \"info\"\n"),
    )
    .unwrap();
    d.wait_stderr("config reload refused");
    let v = d.wait_for("the refusal incident", |l| {
        l.iter().any(|i| i["kind"] == "config_rejected")
    });
    let r = v.iter().find(|i| i["kind"] == "config_rejected").unwrap();
    assert!(
        r["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("sevrity"),
        "{r}"
    );
    s.append(&xid_record(3, "3b", 48));
    s.append(&xid_record(4, "3b", 79));
    let v = d.wait_for("Xid 79 on 3b", |l| {
        l.iter()
            .any(|i| i["xid"] == 79 && i["pci"] == "0000:3b:00.0")
    });
    assert!(
        !v.iter()
            .any(|i| i["xid"] == 48 && i["pci"] == "0000:3b:00.0"),
        "old config must stay: {v:#?}"
    );
    let (code, all, _) = d.stop();
    assert_eq!(code, Some(0));
    assert_eq!(
        all.iter()
            .filter(|i| i["kind"] == "config_rejected")
            .count(),
        1
    );
}

#[test]
fn check_reports_a_runbook_that_would_change_the_machine() {
    let s = Setup::new("");
    let rb_dir = s.dir.path().join("runbooks");
    std::fs::create_dir_all(&rb_dir).unwrap();
    std::fs::write(
        rb_dir.join("fix-it.toml"),
        "title = \"fix it\"\n[[match]]\nxids = [79]\n[guide]\nmeaning = \"x\"\nnext_steps = \"y\"\n\
         [[step]]\nname = \"reset the gpu\"\nrun = [\"nvidia-smi\", \"-r\", \"-i\", \"{pci}\"]\n",
    )
    .unwrap();
    let cfg = std::fs::read_to_string(s.config()).unwrap();
    std::fs::write(
        s.config(),
        format!(
            "{cfg}[runbooks]\ndirs = [{:?}, {rb_dir:?}]\n",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks")
        ),
    )
    .unwrap();
    for cmd in ["check", "run"] {
        let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args([cmd, "--config"])
            .arg(s.config())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{cmd}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("fix-it.toml") && err.contains("reset the gpu") && err.contains("-r"),
            "{cmd}: {err}"
        );
    }
}

#[test]
fn the_probe_reports_a_gpu_on_the_bus_that_nvml_cannot_reach() {
    let (s, script) = nvml_setup("init ok\ndriver_version 550.54.14\ndevice pci=0000:17:00.0 uuid=GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n");
    for (dev, class) in [
        ("0000:17:00.0", "0x030200"),
        ("0000:2a:00.0", "0x030200"),
        ("0000:00:1f.6", "0x020000"),
    ] {
        let d = s.dir.path().join("sys/bus/pci/devices").join(dev);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join("vendor"),
            if dev.starts_with("0000:00") {
                "0x8086\n"
            } else {
                "0x10de\n"
            },
        )
        .unwrap();
        std::fs::write(d.join("class"), format!("{class}\n")).unwrap();
    }
    let d = Daemon::start(
        &s.config(),
        &[
            ("XIDWATCH_BOOT_ID_PATH", s.boot().to_str().unwrap()),
            (
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat().to_str().unwrap(),
            ),
            ("XIDWATCH_FAKE_NVML_SCRIPT", script.to_str().unwrap()),
        ],
    );
    let v = d.wait_for("the missing GPU", |l| {
        l.iter().any(|i| i["kind"] == "gpu_missing")
    });
    let m = v.iter().find(|i| i["kind"] == "gpu_missing").unwrap();
    assert_eq!(m["pci"], "0000:2a:00.0");
    assert!(m["title"].as_str().unwrap().contains("is missing"), "{m}");
    d.stop();
}

/// As an ordinary user: state under the user's own state directory, and a clear word when the
/// kernel log cannot be read. Needs root to become another user (CI runs as root).
#[test]
#[ignore = "needs root and setpriv: runs the daemon as another user"]
fn as_an_ordinary_user() {
    use std::os::unix::fs::PermissionsExt;
    super::support::require_root("it switches to another user with setpriv");
    assert!(
        Path::new("/usr/bin/setpriv").exists(),
        "this test needs /usr/bin/setpriv (util-linux)"
    );
    // A world-readable copy of everything the user needs, outside any private directory.
    let dir = tempfile::Builder::new()
        .prefix("xidwatch-user-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = dir.path().join("xidwatch");
    std::fs::copy(env!("CARGO_BIN_EXE_xidwatch"), &bin).unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
    let secret = dir.path().join("kmsg-root-only");
    std::fs::write(&secret, xid_record(0, "17", 79)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let open = dir.path().join("kmsg-readable");
    std::fs::write(&open, xid_record(0, "17", 79)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = |kmsg: &Path| {
        let p = dir.path().join(format!(
            "{}.toml",
            kmsg.file_name().unwrap().to_string_lossy()
        ));
        std::fs::write(
            &p,
            // No settle delay: the test stops the daemon as soon as the record is read.
            format!(
                "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[incidents]\nsettle_ms = 0\n"
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    };
    let as_nobody = |cfg: &Path| {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args(["run", "--json", "--config"])
            .arg(cfg)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", "/usr/bin:/bin")
            .env(
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat(),
            )
            .stdin(Stdio::null());
        c
    };
    let out = as_nobody(&config(&secret)).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied") && err.contains("CAP_SYSLOG"),
        "{err}"
    );

    let child = as_nobody(&config(&open))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let state = home.join(".local/state/xidwatch/position.json");
    let start = Instant::now();
    while !state.exists() {
        assert!(
            start.elapsed() < LIMIT,
            "no state under the user's state directory"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    super::support::sigterm(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"xid\":79"));
}

#[test]
fn status_follows_the_daemon_up_and_down() {
    let s = Setup::new("");
    s.append(&xid_record(0, "17", 79));
    let status = || {
        Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(["status", "--config"])
            .arg(s.config())
            .output()
            .unwrap()
    };
    let d = s.start();
    d.wait_for("the incident", |l| l.iter().any(|i| i["xid"] == 79));
    let out = status();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("running") && text.contains("fell off the bus"),
        "{text}"
    );
    let (code, _, _) = d.stop();
    assert_eq!(code, Some(0));
    let out = status();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{text}");
    assert!(text.contains("not running"), "{text}");
}

#[test]
fn corrupt_state_files_are_named_and_survived() {
    let s = Setup::new("");
    s.append(&xid_record(0, "17", 79));
    let state = s.dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("position.json"), b"{\"boot_id\": 12").unwrap();
    std::fs::write(state.join("incidents.json"), b"\xff\xfe not json").unwrap();
    let d = s.start();
    d.wait_for("the Xid despite the broken state", |l| {
        l.iter().any(|i| i["xid"] == 79)
    });
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("position.json") && err.contains("corrupt"),
        "{err}"
    );
    assert!(
        err.contains("incidents.json") && err.contains("corrupt"),
        "{err}"
    );
    // The files are whole again after a clean stop.
    let pos: Value =
        serde_json::from_slice(&std::fs::read(state.join("position.json")).unwrap()).unwrap();
    assert_eq!(pos["last_seq"], 0);
}

/// `XIDWATCH_LOG` takes a level and levels per module: one module's debug lines appear while the
/// rest stays at info; a value that does not parse is said, and logging goes on at info.
#[test]
fn log_levels_are_read_per_module() {
    let s = Setup::new("");
    let env = |log: &str| {
        vec![
            (
                "XIDWATCH_BOOT_ID_PATH",
                s.boot().to_str().unwrap().to_string(),
            ),
            (
                "XIDWATCH_BOOT_TIME_PATH",
                s.stat().to_str().unwrap().to_string(),
            ),
            ("XIDWATCH_LOG", log.to_string()),
        ]
    };
    let start = |log: &str| {
        let e = env(log);
        let pairs: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        Daemon::start(&s.config(), &pairs)
    };
    let d = start("warn,xidwatch::daemon::checkpoint=debug");
    s.append(&xid_record(0, "17", 79));
    d.wait_stderr("checkpoint saved");
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !err.contains("caught up"),
        "info lines of other modules stay out:\n{err}"
    );

    let d = start("xidwatch=loud");
    d.wait_stderr("caught up");
    let (_, _, err) = d.stop();
    assert!(
        err.contains("XIDWATCH_LOG=\"xidwatch=loud\" is not a list of levels"),
        "{err}"
    );
}

#[test]
fn logs_as_json_lines_for_log_shippers() {
    let s = Setup::new("");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(s.config())
        .env("XIDWATCH_BOOT_ID_PATH", s.boot())
        .env(
            "XIDWATCH_BOOT_TIME_PATH",
            super::support::recent_boot_stat(),
        )
        .env("XIDWATCH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = String::new();
    {
        use std::io::Read;
        let mut pipe = child.stderr.take().unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while !err.contains("caught up") {
            assert!(start.elapsed() < LIMIT, "{err}");
            let n = pipe.read(&mut buf).unwrap();
            err.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        super::support::sigterm(&child);
        pipe.read_to_string(&mut err).unwrap();
    }
    assert_eq!(child.wait().unwrap().code(), Some(0));
    for line in err.lines().filter(|l| !l.is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}"));
        assert!(
            v["level"].is_string() && v["fields"]["message"].is_string(),
            "{v}"
        );
    }
}

#[test]
fn a_changed_runbook_directory_is_reloaded_and_checked() {
    let s = Setup::new("");
    let rb = s.dir.path().join("runbooks");
    std::fs::create_dir_all(&rb).unwrap();
    let cfg = std::fs::read_to_string(s.config()).unwrap();
    std::fs::write(
        s.config(),
        format!(
            "{cfg}[runbooks]\ndirs = [{:?}, {rb:?}]\n",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("runbooks")
        ),
    )
    .unwrap();
    let d = s.start();
    d.wait_stderr("caught up");
    // A runbook that asks for a reboot appears: the reload refuses it and says which file.
    std::fs::write(
        rb.join("bad.toml"),
        "title = \"bad\"\n[[match]]\nxids = [79]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\
         [[step]]\nname = \"fix it\"\nrun = [\"reboot\"]\n",
    )
    .unwrap();
    let v = d.wait_for("the refused runbook", |l| {
        l.iter().any(|i| i["kind"] == "config_rejected")
    });
    let r = v.iter().find(|i| i["kind"] == "config_rejected").unwrap();
    let msg = r["findings"][0]["message"].as_str().unwrap();
    assert!(msg.contains("bad.toml") && msg.contains("reboot"), "{msg}");
    d.stop();
}

#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused_naming_the_first() {
    let s = Setup::new("");
    let first = s.start();
    first.wait_stderr("caught up");
    let out = support::Run::new(&s.config())
        .json()
        .env("XIDWATCH_BOOT_ID_PATH", s.boot())
        .output();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("in use by another xidwatch")
            && err.contains(&format!("pid {}", first.child.id())),
        "{err}"
    );
    // The first one was not disturbed.
    s.append(&xid_record(0, "17", 79));
    first.wait_for("the Xid after the refusal", |l| {
        l.iter().any(|i| i["xid"] == 79)
    });
    let (code, _, err) = first.stop();
    assert_eq!(code, Some(0), "{err}");
    // Its lock died with it: the next start works.
    let again = s.start();
    again.wait_stderr("caught up");
    again.stop();
}

/// Every file under `dir`, recursively, with its mode.
fn files_with_modes(dir: &Path) -> Vec<(PathBuf, u32)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let m = e.metadata().unwrap();
        if m.is_dir() {
            out.extend(files_with_modes(&e.path()));
        } else if !m.file_type().is_socket() {
            out.push((e.path(), m.mode() & 0o7777));
        }
    }
    out
}

#[test]
fn state_files_are_0640_or_tighter() {
    // A receiver that takes the connection and never answers: the alert stays in the outbox.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming() {
            held.push(c);
        }
    });
    let s = Setup::new(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = \"http://{addr}/hook\"\nformat = \"json\"\n"
    ));
    let state = s.dir.path().join("state");
    let d = s.start();
    d.wait_stderr("caught up");
    s.append(&xid_record(0, "17", 79));
    d.wait_for("the Xid", |l| l.iter().any(|i| i["xid"] == 79));
    let has = |sub: &str, ext: &str| {
        std::fs::read_dir(state.join(sub)).is_ok_and(|rd| {
            rd.map_while(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(ext))
        })
    };
    let start = Instant::now();
    while !(has("alert-outbox", ".json") && has("alert-reports", ".txt")) {
        assert!(start.elapsed() < LIMIT, "{:?}", files_with_modes(&state));
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    let files = files_with_modes(&state);
    let names: Vec<String> = files
        .iter()
        .map(|(p, _)| p.strip_prefix(&state).unwrap().display().to_string())
        .collect();
    for want in ["status.json", "alert-status.json", "position.json"] {
        assert!(names.iter().any(|n| n == want), "no {want}: {names:?}");
    }
    assert!(
        names.iter().any(|n| n.starts_with("alert-outbox/00")),
        "{names:?}"
    );
    for (p, mode) in &files {
        assert_eq!(mode & 0o137, 0, "{} is {mode:04o}", p.display());
    }
    assert!(
        names.iter().all(|n| !n.ends_with(".tmp")),
        "no temporary files left: {names:?}"
    );
}

/// Peak resident memory of a process, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status")
}

#[test]
fn a_huge_line_in_a_kmsg_file_is_cut_and_costs_bounded_memory() {
    const LINE: usize = 128 << 20;
    let s = Setup::new("");
    let d = s.start();
    d.wait_stderr("caught up");
    let before = peak_rss_kib(d.child.id());
    {
        // Written in pieces, with no newline until the end: the reader meets the line unfinished.
        // 17 bytes of header, 128 MiB of message, then the newline.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(s.kmsg())
            .unwrap();
        f.write_all(b"3,0,1000,-;NVRM: ").unwrap();
        let chunk = vec![b'A'; 1 << 20];
        for _ in 0..LINE >> 20 {
            f.write_all(&chunk).unwrap();
        }
    }
    s.append("\n");
    s.append(&xid_record(1, "17", 79));
    d.wait_for("the record after the huge line", |l| {
        l.iter().any(|i| i["xid"] == 79)
    });
    d.wait_stderr("was cut to its first 65536");
    let peak = peak_rss_kib(d.child.id());
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("a line of {} bytes", LINE + 18)),
        "{err}"
    );
    // The line is 128 MiB; reading it may cost the cap and buffers, not the line.
    assert!(
        peak < before + 16 * 1024,
        "peak RSS {peak} KiB, {before} KiB before the line"
    );
}

#[test]
fn failing_state_writes_are_logged_once_and_leave_no_litter() {
    // position.json becomes a directory once the daemon runs (one there at start is set aside):
    // every save of the position fails at the rename, the way a full disk fails it at the write;
    // the daemon goes on watching. Pages go out at once (no settle delay): the test is about the
    // saves, and 20 settle delays would be 40 s of waiting.
    let s = Setup::new("[incidents]\nsettle_ms = 0\n");
    let state = s.dir.path().join("state");
    let d = s.start();
    d.wait_stderr("caught up");
    let _ = std::fs::remove_file(state.join("position.json"));
    std::fs::create_dir_all(state.join("position.json").join("x")).unwrap();
    let failures = || {
        super::support::status_of(&state)
            .map_or(0, |st| st["state_write_failures"].as_u64().unwrap_or(0))
    };
    for i in 0..20u64 {
        let before = failures();
        s.append(&xid_record(i, &format!("{:02x}", 0x20 + i), 79));
        d.wait_for("the incident", |l| {
            l.iter().filter(|i| i["phase"] == "opened").count() as u64 == i + 1
        });
        // Each incident gets a save of its own (and a failure of its own) before the next
        // arrives, by the daemon's own count of failed writes.
        super::support::wait_until(super::support::LIMIT, "the failed save", || {
            failures() > before
        });
    }
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    let failures = err
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("position.json"))
        .count();
    assert_eq!(failures, 1, "one line for 20 failed saves:\n{err}");
    let litter: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(litter.is_empty(), "{litter:?}");
}

/// An AER error the kernel reports on the root port above a GPU is tied to that GPU through the
/// sysfs topology (the device's link names its ports), and a port above two GPUs is not.
#[test]
fn aer_on_the_port_above_a_gpu_is_tied_to_it_through_sysfs() {
    let s = Setup::new("");
    let sys = s.dir.path().join("sys");
    // Root port 0000:16:01.0 with one GPU below; root port 0000:30:01.0 with two.
    for (port, gpu) in [
        ("0000:16:01.0", "0000:17:00.0"),
        ("0000:30:01.0", "0000:31:00.0"),
        ("0000:30:01.0", "0000:32:00.0"),
    ] {
        let real = sys.join("devices/pci0000:00").join(port).join(gpu);
        std::fs::create_dir_all(&real).unwrap();
        std::fs::write(real.join("vendor"), "0x10de\n").unwrap();
        std::fs::write(real.join("class"), "0x030200\n").unwrap();
        let links = sys.join("bus/pci/devices");
        std::fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink(
            format!("../../../devices/pci0000:00/{port}/{gpu}"),
            links.join(gpu),
        )
        .unwrap();
    }
    s.append(
        "3,0,5000000,-;pcieport 0000:16:01.0: AER: device recovery failed\n\
         3,1,5000001,-;pcieport 0000:30:01.0: AER: device recovery failed\n",
    );
    let d = s.start();
    let v = d.wait_for("two incidents", |l| l.len() >= 2);
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    let pcis: Vec<&str> = v.iter().map(|i| i["pci"].as_str().unwrap_or("-")).collect();
    assert!(pcis.contains(&"0000:17:00.0"), "{v:#?}");
    assert!(
        !pcis.contains(&"0000:31:00.0") && !pcis.contains(&"0000:32:00.0"),
        "a port above two GPUs names neither: {v:#?}"
    );
}

/// Config values that must never come back in an error, one per kind of value; each refused
/// through `check` and through a running daemon's reload, whose log line goes to the journal.
const NEVER_ECHOED: &[(&str, &str)] = &[
    ("[incidents]\nwindow_secs = 987654321\n", "987654321"),
    ("[incidents]\nwindow_secs = 12345.678\n", "12345.678"),
    ("[runbooks]\nmax_budget_secs = 98765.4321\n", "98765.4321"),
    ("[health]\ninterval_secs = true\n", "true"),
    ("[runbooks]\nallow = [[\"ibstat\"], 424242]\n", "424242"),
    ("[runbooks]\nallow = [{ k = \"table-secret\" }]\n", "table-secret"),
    ("[metrics]\nlisten = \"10.1.2.3:sekrit\"\n", "sekrit"),
    (
        "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example:587\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\nusername = \"u\"\npassword = 987654321\n",
        "987654321",
    ),
    (
        "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtps://mail.example\"\ntls = \"starttls\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n",
        "starttls",
    ),
    (
        "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example\"\ntls = \"tls-sekrit\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n",
        "tls-sekrit",
    ),
    (
        "[[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"ftp://hooks.example/T0/SECRETTOKEN\"\n",
        "ftp",
    ),
];

#[test]
fn config_errors_never_echo_a_value_through_check_or_a_reload() {
    let s = Setup::new("");
    let base = std::fs::read_to_string(s.config()).unwrap();
    for (extra, value) in NEVER_ECHOED {
        std::fs::write(s.config(), format!("{base}{extra}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(["check", "--config"])
            .arg(s.config())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(78), "{extra}");
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(all.contains("xidwatch.toml"), "{extra}: {all}");
        assert!(!all.contains(value), "{extra}: {all}");
    }

    std::fs::write(s.config(), &base).unwrap();
    let d = s.start();
    d.wait_stderr("caught up");
    for (n, (extra, value)) in NEVER_ECHOED.iter().enumerate() {
        std::fs::write(s.config(), format!("{base}{extra}")).unwrap();
        super::support::signal(&d.child, libc::SIGHUP);
        let start = Instant::now();
        let refused = loop {
            let err = d.stderr();
            let refused: Vec<String> = err
                .lines()
                .filter(|l| l.contains("config reload refused"))
                .map(str::to_string)
                .collect();
            if refused.len() > n {
                break refused[n].clone();
            }
            assert!(start.elapsed() < LIMIT, "{extra}: {err}");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(
            refused.contains("xidwatch.toml") && !refused.contains(value),
            "{extra}: {refused}"
        );
    }
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
}

/// A clean stop takes the status socket with it: the state directory holds no socket file once
/// the daemon has stopped.
#[test]
fn a_clean_stop_removes_the_status_socket() {
    let s = Setup::new("");
    let sock = s.dir.path().join("state").join("xidwatch.sock");
    let d = s.start();
    d.wait_stderr("caught up");
    let start = Instant::now();
    while !sock.exists() {
        assert!(start.elapsed() < LIMIT, "no socket at {}", sock.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(!sock.exists(), "{} left behind:\n{err}", sock.display());
}

/// A loopback webhook receiver that answers 200: every JSON body it was sent, in order.
fn hook_receiver() -> (std::net::SocketAddr, Arc<Mutex<Vec<Value>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let g = g.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                while let Some((_, body)) = super::support::read_request(&mut r) {
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        g.lock().unwrap().push(v);
                    }
                    if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .is_err()
                    {
                        break;
                    }
                }
            });
        }
    });
    (addr, got)
}

/// Waits until `pred` holds for the pages received so far.
fn wait_pages(got: &Mutex<Vec<Value>>, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        {
            let l = got.lock().unwrap();
            if pred(&l) {
                return l.clone();
            }
        }
        assert!(
            start.elapsed() < LIMIT,
            "timed out waiting for {what}: {:#?}",
            got.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until the GPU history holds an event that `pred` accepts; returns them all.
fn wait_history(s: &Setup, what: &str, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
    let path = s.dir.path().join("state").join("history.json");
    let start = Instant::now();
    loop {
        let events: Vec<Value> = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| v["events"].as_array().cloned())
            .unwrap_or_default();
        if events.iter().any(&pred) {
            return events;
        }
        assert!(
            start.elapsed() < LIMIT,
            "no {what} in the history: {events:#?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An Xid record logged `secs` seconds after boot.
fn xid_record_at(seq: u64, secs: u64, pci_bus: &str, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:{pci_bus}:00): {xid}, pid=42, name=python3, test\n",
        secs * 1_000_000
    )
}

#[test]
fn a_fault_logged_before_the_start_is_dated_when_the_kernel_logged_it() {
    let (addr, got) = hook_receiver();
    let s = Setup::new(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = \"http://{addr}/hook\"\nformat = \"json\"\n"
    ));
    // Booted an hour ago; the Xid 79 was logged 50 minutes after boot: 10 minutes ago.
    super::support::write_boot_stat(&s.stat(), 3600);
    s.append(&xid_record_at(0, 3000, "17", 79));
    let logged = wall_ms() - 600_000;
    let near = |ms: &Value| {
        let ms = ms.as_u64().unwrap_or(0);
        ms.abs_diff(logged) < 5_000
    };
    let d = s.start();
    let pages = wait_pages(&got, "the page of the Xid 79", |l| {
        l.iter().any(|p| p["xid"] == 79 && p["phase"] == "opened")
    });
    let page = pages.iter().find(|p| p["xid"] == 79).unwrap();
    assert_eq!(page["found_at_startup"], true, "{page:#}");
    assert!(
        near(&page["first_seen_ms"]),
        "first seen 10 minutes ago ({logged}), not at the start: {page:#}"
    );
    let events = wait_history(&s, "the Xid 79", |e| e["xid"] == 79);
    let e = events.iter().find(|e| e["xid"] == 79).unwrap();
    assert!(
        near(&e["at_ms"]),
        "history dated 10 minutes ago ({logged}): {e:#}"
    );
    let v = d.wait_for("the incident on stdout", |l| {
        l.iter().any(|i| i["xid"] == 79)
    });
    assert!(near(&v[0]["first_seen_ms"]), "{:#}", v[0]);

    // A live record is dated by the kernel's clock too: now, give or take the clocks' drift.
    d.wait_stderr("caught up");
    super::support::write_boot_stat(&s.stat(), 3600);
    s.append(&xid_record_at(1, 3600, "2a", 48));
    let pages = wait_pages(&got, "the live Xid 48", |l| {
        l.iter().any(|p| p["xid"] == 48)
    });
    let live = pages.iter().find(|p| p["xid"] == 48).unwrap();
    assert!(
        live["first_seen_ms"].as_u64().unwrap().abs_diff(wall_ms()) < 10_000,
        "{live:#}"
    );
    let (code, _, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn first_start_records_faults_older_than_the_lookback_without_paging_them() {
    let (addr, got) = hook_receiver();
    let s = Setup::new(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = \"http://{addr}/hook\"\nformat = \"json\"\n"
    ));
    // Up for 8 hours: an Xid 79 from the first minute (beyond the default 6 h look-back), an Xid
    // 48 on another GPU from a minute ago.
    super::support::write_boot_stat(&s.stat(), 8 * 3600);
    s.append(&xid_record_at(0, 60, "17", 79));
    s.append(&xid_record_at(1, 8 * 3600 - 60, "2a", 48));
    let d = s.start();
    let pages = wait_pages(&got, "the page of the recent Xid 48", |l| {
        l.iter().any(|p| p["xid"] == 48)
    });
    let page = pages.iter().find(|p| p["xid"] == 48).unwrap();
    let note = "1 older fault found at start-up (before the 6 h look-back) was recorded, not paged: see xidwatch history";
    assert!(
        page.to_string().contains(note),
        "the first page carries the note: {page:#}"
    );
    // The old one is in the history, dated then (8 h ago less a minute).
    let events = wait_history(&s, "the old Xid 79", |e| e["xid"] == 79);
    let old = events.iter().find(|e| e["xid"] == 79).unwrap();
    let then = wall_ms() - (8 * 3600 - 60) * 1000;
    assert!(
        old["at_ms"].as_u64().unwrap().abs_diff(then) < 5_000,
        "{old:#}"
    );
    d.wait_stderr("caught up");
    d.wait_stderr("was logged before the 6 h look-back: recorded, not paged");
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    // Stated on stdout as recorded, not paged; never sent to a channel.
    let x79 = all
        .iter()
        .find(|i| i["xid"] == 79)
        .expect("the old incident on stdout");
    assert_eq!(x79["before_lookback"], true, "{x79:#}");
    assert!(
        got.lock().unwrap().iter().all(|p| p["xid"] != 79),
        "the old Xid 79 paged: {:#?}",
        got.lock().unwrap()
    );
    // A restart within the boot reads nothing again and pages nothing old.
    let d = s.start();
    d.wait_stderr("caught up");
    let (code, all, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(all.is_empty(), "{all:#?}");
    assert!(got.lock().unwrap().iter().all(|p| p["xid"] != 79));
}
