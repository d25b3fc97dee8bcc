//! The state directory, attacked: a FIFO, a symbolic link or a directory others can write to,
//! planted where the daemon keeps its files. The daemon as a process, a regular-file kernel log.
//! Each time it must say what it refused, set it aside, go on working and stop on SIGTERM.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::support;

const LIMIT: Duration = Duration::from_secs(20);

/// A temporary directory with a kernel log file, a boot id, a config and a state directory
/// (mode 0700, as the daemon makes it) for things to be planted in before the start. No settle
/// delay: the tests are about the files, not about what settles into an incident.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let s = Setup {
            dir: tempfile::tempdir().unwrap(),
        };
        std::fs::write(s.path("kmsg"), "").unwrap();
        std::fs::write(s.path("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        std::fs::create_dir(s.state()).unwrap();
        std::fs::set_permissions(s.state(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let cfg = format!(
            "[kmsg]\npath = {:?}\naccept_userspace = false\n[nvml]\nenabled = false\n\
             sysfs_root = {:?}\n[state]\ndir = {:?}\n[incidents]\nsettle_ms = 0\n",
            s.path("kmsg"),
            s.path("sys"),
            s.state()
        );
        std::fs::write(s.path("xidwatch.toml"), cfg).unwrap();
        s
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn state(&self) -> PathBuf {
        self.path("state")
    }

    fn append(&self, records: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path("kmsg"))
            .unwrap();
        f.write_all(records.as_bytes()).unwrap();
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
        cmd.args(["run", "--json", "--config"])
            .arg(self.path("xidwatch.toml"))
            .env("XIDWATCH_BOOT_ID_PATH", self.path("boot_id"))
            .env(
                "XIDWATCH_BOOT_TIME_PATH",
                super::support::recent_boot_stat(),
            )
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null());
        cmd
    }

    fn start(&self) -> Daemon {
        Daemon(
            support::Run::new(&self.path("xidwatch.toml"))
                .json()
                .env("XIDWATCH_BOOT_ID_PATH", self.path("boot_id"))
                .spawn(),
        )
    }

    /// Names in the state directory (or `sub` of it) starting `NAME.refused-`.
    fn refused(&self, sub: &str, name: &str) -> Vec<PathBuf> {
        let dir = self.state().join(sub);
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}.refused-"))
            })
            .collect()
    }
}

/// The toolkit's harness, with `--json`.
struct Daemon(support::Daemon);

impl Daemon {
    fn stderr(&self) -> String {
        self.0.stderr()
    }

    fn wait_until(&self, what: &str, cond: impl Fn(&Daemon) -> bool) {
        let start = Instant::now();
        while !cond(self) {
            assert!(
                start.elapsed() < LIMIT,
                "timed out waiting for {what}; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_stderr(&self, all: &[&str]) {
        self.wait_until(&format!("{all:?} in stderr"), |d| {
            let e = d.stderr();
            all.iter().all(|w| e.contains(w))
        });
    }

    fn wait_xid(&self, xid: u32) {
        self.wait_until(&format!("the Xid {xid} incident"), |d| {
            d.0.json().iter().any(|i| i["xid"] == xid)
        });
    }

    /// SIGTERM, then the exit status, within a bounded time (a daemon stuck where the test gave
    /// up on it, in `open`, deaf to SIGTERM, is killed, not left behind).
    fn stop(self) -> (Option<i32>, String) {
        let s = self.0.stop_within(Duration::from_secs(10));
        (s.code, s.stderr)
    }
}

fn xid_record(seq: u64, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:17:00): {xid}, pid=42, name=python3, test\n",
        1_000_000 + seq
    )
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "{}",
        p.display()
    );
}

fn saved_seq(state: &Path) -> Option<u64> {
    let bytes = std::fs::read(state.join("position.json")).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?["last_seq"].as_u64()
}

/// A FIFO at `sub/name` in the state directory: refused, set aside, and the daemon works on.
fn a_fifo_is_set_aside(sub: &str, name: &str) {
    let s = Setup::new();
    let dir = s.state().join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    let planted = dir.join(name);
    mkfifo(&planted);
    s.append(&xid_record(0, 13));
    let d = s.start();
    d.wait_stderr(&[name, "FIFO", "refused", "caught up"]);
    d.wait_xid(13);
    s.append(&xid_record(1, 79));
    d.wait_xid(79);
    d.wait_until("the position of the last record saved", |_| {
        saved_seq(&s.state()) == Some(1)
    });
    let (code, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    let aside = s.refused(sub, name);
    assert_eq!(aside.len(), 1, "{aside:?}\n{err}");
    let kind = std::fs::symlink_metadata(&aside[0]).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO itself was set aside");
    let line = err.lines().find(|l| l.contains("refused")).unwrap();
    assert!(
        line.contains(&planted.display().to_string()) && line.contains("set aside"),
        "{line}"
    );
}

#[test]
fn a_fifo_at_the_position_file_is_set_aside() {
    a_fifo_is_set_aside("", "position.json");
}

#[test]
fn a_fifo_at_the_incidents_checkpoint_is_set_aside() {
    a_fifo_is_set_aside("", "incidents.json");
}

#[test]
fn a_fifo_as_an_outbox_entry_is_set_aside() {
    a_fifo_is_set_aside("alert-outbox", "0000000000000001.json");
}

#[test]
fn a_linked_lock_file_does_not_carry_the_pid_to_its_target() {
    let s = Setup::new();
    let target = s.path("precious");
    std::fs::write(&target, b"precious\n").unwrap();
    let lock = s.state().join("xidwatch.lock");
    std::os::unix::fs::symlink(&target, &lock).unwrap();
    s.append(&xid_record(0, 13));
    let d = s.start();
    d.wait_stderr(&["xidwatch.lock", "symbolic link", "refused", "caught up"]);
    d.wait_xid(13);
    d.wait_until("the position saved", |_| saved_seq(&s.state()) == Some(0));
    let pid = d.0.child.id();
    let held = std::fs::read_to_string(&lock).unwrap();
    assert_eq!(
        held.trim(),
        pid.to_string(),
        "a fresh lock file holds the pid"
    );
    assert!(std::fs::symlink_metadata(&lock)
        .unwrap()
        .file_type()
        .is_file());
    let (code, err) = d.stop();
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"precious\n", "unchanged");
    let aside = s.refused("", "xidwatch.lock");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(std::fs::symlink_metadata(&aside[0])
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn a_state_directory_others_can_write_is_refused_at_the_start() {
    let s = Setup::new();
    std::fs::set_permissions(s.state(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut child = s
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a daemon that accepts the directory runs on; it is killed and the test fails.
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {LIMIT:?}: the directory was accepted");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(78), "{err}");
    assert!(
        err.contains(&format!("state directory {}", s.state().display()))
            && err.contains("mode 0777"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(s.state()).unwrap().next().is_none(),
        "nothing written in it"
    );
}
