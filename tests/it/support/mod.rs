//! The integration tests' toolkit: one harness for `xidwatch run` ([`Run`], [`Daemon`]), one
//! HTTP receiver ([`Receiver`]), one SMTP sink ([`SmtpSink`]), a scenario that writes the config
//! from typed values ([`Scenario`]), and [`wait_until`], which polls progress (the daemon's
//! status counters, what a receiver got, the log) instead of sleeping.
//!
//! Every `xidwatch run` a test starts takes its boot's time from [`recent_boot_stat`] (or a file
//! the test writes with [`write_boot_stat`]).

// A toolkit: each test uses the part it needs.
#![allow(dead_code, unused_imports)]

pub mod daemon;
pub mod http;
pub mod scenario;
pub mod smtp;
pub mod wait;

pub use daemon::{status_of, Daemon, Run, Stopped};
pub use http::{Receiver, Reply, Request};
pub use scenario::{table, Scenario};
pub use smtp::{Mail, SmtpSink};
pub use wait::{wait_for, wait_until, LIMIT};

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;

/// Builds the fake `libnvidia-ml.so` (`tests/fake-nvml`) once per test run and returns its path.
pub fn fake_nvml_library() -> PathBuf {
    static FAKE: OnceLock<PathBuf> = OnceLock::new();
    FAKE.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let status = Command::new(env!("CARGO"))
            .args(["build", "-p", "fake-nvml", "--manifest-path"])
            .arg(manifest.join("Cargo.toml"))
            .status()
            .expect("run cargo build -p fake-nvml");
        assert!(status.success(), "cargo build -p fake-nvml failed");
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => manifest.join(dir),
            None => manifest.join("target"),
        };
        let lib = target.join("debug").join("libnvidia_ml.so");
        assert!(lib.is_file(), "fake NVML not found at {}", lib.display());
        lib
    })
    .clone()
}

/// Asks a child process to stop as systemd would.
pub fn sigterm(child: &Child) {
    signal(child, libc::SIGTERM);
}

/// Sends `sig` to a child of this test.
pub fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of our own, not yet reaped, child.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// The value of `name`, which an `#[ignore = "needs ..."]` test cannot do without: a test run
/// with `--include-ignored` on a machine without the service fails here, saying what to start,
/// instead of passing without having run.
pub fn required_env(name: &str) -> String {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v,
        _ => panic!(
            "{name} is not set: start the services with `. .ci/alert-services.sh` (or run .ci/run)"
        ),
    }
}

/// Fails the calling test unless it runs as root (for `#[ignore = "needs root"]` tests).
pub fn require_root(why: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "this test needs root ({why}); it runs as uid {uid}");
}

/// Fails the calling test unless the run opted in to writing test lines to the real `/dev/kmsg`
/// (`XIDWATCH_KMSG_E2E=1`, as `.ci/run` does on its throwaway machine) and runs as root.
pub fn require_kmsg_e2e() {
    assert_eq!(
        std::env::var("XIDWATCH_KMSG_E2E").as_deref(),
        Ok("1"),
        "this test writes test lines to /dev/kmsg: opt in with XIDWATCH_KMSG_E2E=1 (as .ci/run does)"
    );
    require_root("it writes test lines to /dev/kmsg");
}

/// Reads one HTTP/1.1 request from `r`: its request line and header lines (each with its
/// `\r\n`) and its body (`content-length` bytes). `None` when the peer closed before a whole
/// request. Loopback receivers of the tests share it.
pub fn read_request<R: std::io::BufRead>(r: &mut R) -> Option<(Vec<String>, Vec<u8>)> {
    let mut head = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.trim_end().split_once(": ") {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().unwrap_or(0);
            }
        }
        head.push(line);
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((head, body))
}

/// A `/proc/stat`-shaped file whose `btime` is an hour ago, for `XIDWATCH_BOOT_TIME_PATH`: the
/// daemon dates kernel log records from the boot's time, so the tests' records (a few seconds
/// after boot) are an hour old, inside the default look-back, on a test machine up for months
/// as on one just booted.
pub fn recent_boot_stat() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("xidwatch-it-stat-{}", std::process::id()));
        write_boot_stat(&p, 3600);
        p
    })
}

/// Writes a `/proc/stat`-shaped file at `path` whose `btime` is `secs_ago` seconds ago.
pub fn write_boot_stat(path: &Path, secs_ago: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::write(path, format!("cpu  1 2 3 4\nbtime {}\n", now - secs_ago)).unwrap();
}

/// How many times the fake NVML was called as `call`, from the file named by
/// `XIDWATCH_FAKE_NVML_CALLS` (tests/fake-nvml): polls and probe rounds, counted.
pub fn nvml_calls(file: &Path, call: &str) -> usize {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == call)
        .count()
}
