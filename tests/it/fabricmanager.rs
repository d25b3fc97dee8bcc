//! Fabric Manager's log followed by the real daemon: a log file in each test's own directory,
//! written as Fabric Manager and logrotate would (appends, rename and create, truncation in
//! place); incidents are read from `run --json`. Every wait is on progress: a log line of the
//! daemon's or an incident on its standard output.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::support;

/// A Fabric Manager ERROR record for `sxid` on the switch at bus `bus` (each test's switches
/// differ, so that every record is an incident of its own).
fn fatal(sxid: u32, bus: u8) -> String {
    format!("[Nov 14 2023 10:00:00] [ERROR] [tid 1234] detected NVSwitch fatal error {sxid} on fid 0 on NVSwitch pci bus id 00000000:{bus:02x}:00.0 physical id 0 port 18\n")
}

const INFO: &str =
    "[Nov 14 2023 10:00:00] [INFO] [tid 1234] Fabric Manager version 550.54.15 is running\n";

struct Host {
    dir: tempfile::TempDir,
}

/// The toolkit's harness, with `--json`.
struct Daemon(support::Daemon);

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("kmsg"), "").unwrap();
        std::fs::write(
            dir.path().join("boot_id"),
            "66666666-6666-6666-6666-666666666666\n",
        )
        .unwrap();
        Host { dir }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn fm(&self) -> PathBuf {
        self.p("fabricmanager.log")
    }

    fn append(&self, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.fm())
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn start(&self) -> Daemon {
        let config = self.p("xidwatch.toml");
        std::fs::write(
            &config,
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\n[state]\ndir = {:?}\n[incidents]\nsettle_ms = 0\n[services]\nenabled = false\n[fabricmanager]\nenabled = true\nlog = {:?}\npoll_ms = 100\n",
                self.p("kmsg"),
                self.p("state"),
                self.fm(),
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

impl Daemon {
    /// Waits until the daemon's log holds `text` `n` times.
    fn wait_log(&self, text: &str, n: usize) {
        let start = Instant::now();
        while self.0.stderr().matches(text).count() < n {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no {text:?} in the log:\n{}",
                self.0.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for an opened incident for `sxid`.
    fn wait_opened(&self, sxid: u32) -> serde_json::Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self
                .0
                .json()
                .into_iter()
                .find(|v| v["phase"] == "opened" && v["xid"] == sxid)
            {
                return v;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no incident for SXid {sxid}; got: {:#?}\nlog:\n{}",
                self.0.json(),
                self.0.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The SXids of the opened incidents so far.
    fn opened(&self) -> Vec<u64> {
        self.0
            .json()
            .iter()
            .filter(|v| v["phase"] == "opened")
            .filter_map(|v| v["xid"].as_u64())
            .collect()
    }

    /// Stops it (SIGTERM) and returns what it logged; it must exit 0.
    fn stop(self) -> (Vec<u64>, String) {
        let opened = self.opened();
        let s = self.0.stop();
        assert_eq!(s.code, Some(0), "{}", s.stderr);
        (opened, s.stderr)
    }
}

#[test]
fn old_records_are_history_and_an_appended_error_pages_once() {
    let h = Host::new();
    h.append(&format!("{INFO}{}", fatal(20034, 0x86)));
    let len = std::fs::metadata(h.fm()).unwrap().len();
    let d = h.start();
    d.wait_log(&format!("from offset {len}"), 1);
    h.append(&format!("{INFO}{INFO}{}", fatal(12028, 0x87)));
    let inc = d.wait_opened(12028);
    assert_eq!(inc["kind"], "sxid", "{inc:#}");
    // A last record after more chatter: everything before it has been handled.
    h.append(&format!("{INFO}{}", fatal(20035, 0x88)));
    d.wait_opened(20035);
    let (opened, log) = d.stop();
    assert_eq!(
        opened,
        vec![12028, 20035],
        "the old record is history\n{log}"
    );
}

#[test]
fn rotation_by_rename_and_by_truncation_is_followed() {
    let h = Host::new();
    h.append(INFO);
    let d = h.start();
    d.wait_log("Fabric Manager log: following", 1);
    h.append(&fatal(20034, 0x86));
    d.wait_opened(20034);
    // Rename and create, as logrotate does: the writer's last line lands in the old file after
    // the rotated name exists, then the new file replaces the name at once.
    let mut writer = std::fs::OpenOptions::new()
        .append(true)
        .open(h.fm())
        .unwrap();
    std::fs::hard_link(h.fm(), h.p("fabricmanager.log.1")).unwrap();
    writer.write_all(fatal(20035, 0x87).as_bytes()).unwrap();
    let fresh = h.p("fabricmanager.log.new");
    std::fs::write(&fresh, format!("{INFO}{}", fatal(20036, 0x88))).unwrap();
    std::fs::rename(&fresh, h.fm()).unwrap();
    d.wait_opened(20035);
    d.wait_opened(20036);
    d.wait_log("was rotated", 1);
    // Truncation in place (copytruncate), after enough chatter that the new content is shorter
    // than what was read.
    for _ in 0..20 {
        h.append(INFO);
    }
    h.append(&fatal(20037, 0x89));
    d.wait_opened(20037);
    std::fs::OpenOptions::new()
        .write(true)
        .open(h.fm())
        .unwrap()
        .set_len(0)
        .unwrap();
    h.append(&fatal(20038, 0x8a));
    d.wait_opened(20038);
    let (opened, log) = d.stop();
    assert_eq!(opened, vec![20034, 20035, 20036, 20037, 20038], "{log}");
    assert!(log.contains("was truncated"), "{log}");
}

#[test]
fn a_restart_resumes_without_repeating_or_losing_a_record() {
    let h = Host::new();
    h.append(INFO);
    let d = h.start();
    d.wait_log("Fabric Manager log: following", 1);
    h.append(&fatal(20034, 0x86));
    d.wait_opened(20034);
    let (opened, _) = d.stop();
    assert_eq!(opened, vec![20034]);
    let len = std::fs::metadata(h.fm()).unwrap().len();
    // Written while the daemon was down, the last one torn (its writer not done yet).
    h.append(&format!("{INFO}{}", fatal(20035, 0x87)));
    let torn = fatal(20036, 0x88);
    let (head, tail) = torn.split_at(40);
    h.append(head);
    let d = h.start();
    d.wait_log(&format!("from offset {len}"), 1);
    d.wait_opened(20035);
    h.append(tail);
    d.wait_opened(20036);
    let (opened, log) = d.stop();
    assert_eq!(opened, vec![20035, 20036], "nothing repeated\n{log}");
    // And once more: the torn line, now whole, is not read twice either.
    let len = std::fs::metadata(h.fm()).unwrap().len();
    let d = h.start();
    d.wait_log(&format!("from offset {len}"), 1);
    h.append(&fatal(20037, 0x89));
    d.wait_opened(20037);
    let (opened, log) = d.stop();
    assert_eq!(opened, vec![20037], "{log}");
}

#[test]
fn an_absent_log_is_said_once_and_followed_once_it_appears() {
    let h = Host::new();
    let d = h.start();
    d.wait_log("is not there (yet)", 1);
    // It appears (the service started after xidwatch): read from its start, INFO silent.
    h.append(INFO);
    d.wait_log("from offset 0", 1);
    h.append(&format!("{INFO}{}", fatal(20034, 0x86)));
    d.wait_opened(20034);
    let (opened, log) = d.stop();
    assert_eq!(opened, vec![20034], "{log}");
    assert_eq!(log.matches("is not there").count(), 1, "{log}");
    // Nothing about the log is a warning or an error: its absence is normal.
    assert!(
        !log.lines()
            .any(|l| l.contains("Fabric Manager log") && !l.contains(" INFO ")),
        "{log}"
    );
}
