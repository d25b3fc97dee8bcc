//! One harness for `xidwatch run` as a process: spawned with the test's config and fixtures,
//! its output collected as it comes, its progress read from the control socket (the live
//! [`StatusSnapshot`](xidwatch::daemon::telemetry::StatusSnapshot) as JSON), stopped as systemd
//! would.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::wait::{wait_for, LIMIT};

/// `xidwatch run --config CONFIG`, to be spawned: the boot's time from
/// [`super::recent_boot_stat`], no `NOTIFY_SOCKET`, stdin from /dev/null, stdout and stderr
/// collected.
pub struct Run {
    cmd: Command,
    state_dir: Option<PathBuf>,
}

impl Run {
    pub fn new(config: &Path) -> Run {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
        cmd.arg("run")
            .arg("--config")
            .arg(config)
            .env("XIDWATCH_BOOT_TIME_PATH", super::recent_boot_stat())
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Run {
            cmd,
            state_dir: None,
        }
    }

    /// One incident a line, as JSON, on stdout (`--json`).
    pub fn json(mut self) -> Run {
        self.cmd.arg("--json");
        self
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Run {
        self.cmd.arg(arg);
        self
    }

    pub fn env(mut self, key: &str, value: impl AsRef<OsStr>) -> Run {
        self.cmd.env(key, value);
        self
    }

    /// The fake NVML library plays `script` (see tests/fake-nvml).
    pub fn nvml_script(self, script: &Path) -> Run {
        self.env("XIDWATCH_FAKE_NVML_SCRIPT", script)
    }

    /// The config's `[state] dir`, where [`Daemon::status`] finds the control socket.
    pub fn state_dir(mut self, dir: &Path) -> Run {
        self.state_dir = Some(dir.to_path_buf());
        self
    }

    /// Runs it to its end (a config it refuses, a start that fails): its exit and output.
    pub fn output(mut self) -> std::process::Output {
        self.cmd.output().expect("run xidwatch run")
    }

    pub fn spawn(mut self) -> Daemon {
        let mut child = self.cmd.spawn().expect("spawn xidwatch run");
        let stdout: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let o = stdout.clone();
        let e = stderr.clone();
        let readers = vec![
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    o.lock().unwrap().push((Instant::now(), line));
                }
            }),
            std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    let mut s = e.lock().unwrap();
                    s.push_str(&line);
                    s.push('\n');
                }
            }),
        ];
        Daemon {
            child,
            stdout,
            stderr,
            readers,
            state_dir: self.state_dir,
        }
    }
}

/// A running `xidwatch run`. Dropped without [`Daemon::stop`], it is killed.
pub struct Daemon {
    pub child: Child,
    /// Each stdout line, with when it came.
    stdout: Arc<Mutex<Vec<(Instant, String)>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    state_dir: Option<PathBuf>,
}

/// What a stopped daemon left: its exit and everything it printed.
#[derive(Debug)]
pub struct Stopped {
    pub code: Option<i32>,
    pub stdout: Vec<String>,
    pub stderr: String,
}

impl Stopped {
    /// The stdout lines as JSON (after `--json`).
    pub fn json(&self) -> Vec<Value> {
        self.stdout.iter().map(|l| parse_line(l)).collect()
    }
}

fn parse_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"))
}

impl Daemon {
    pub fn stdout(&self) -> Vec<String> {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .map(|(_, l)| l.clone())
            .collect()
    }

    /// The stdout lines so far as JSON, each with when it came.
    pub fn json_timed(&self) -> Vec<(Instant, Value)> {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .map(|(t, l)| (*t, parse_line(l)))
            .collect()
    }

    /// The stdout lines so far as JSON (after `--json`: the incidents).
    pub fn json(&self) -> Vec<Value> {
        self.stdout().iter().map(|l| parse_line(l)).collect()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: libc::c_int) {
        super::signal(&self.child, sig);
    }

    /// Waits until stderr (the log) says `text`.
    #[track_caller]
    pub fn wait_stderr(&self, text: &str) {
        self.wait_stderr_within(LIMIT, text)
    }

    #[track_caller]
    pub fn wait_stderr_within(&self, limit: Duration, text: &str) {
        let start = Instant::now();
        while !self.stderr.lock().unwrap().contains(text) {
            assert!(
                start.elapsed() < limit,
                "no {text:?} in stderr within {limit:?}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `pred` holds for the stdout lines as JSON; returns them.
    #[track_caller]
    pub fn wait_json(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.wait_json_within(LIMIT, what, pred)
    }

    #[track_caller]
    pub fn wait_json_within(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let lines = self.json();
            if pred(&lines) {
                return lines;
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}; stdout: {lines:#?}\nstderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The daemon's status now, from its control socket; `None` before the socket answers.
    pub fn status(&self) -> Option<Value> {
        let dir = self
            .state_dir
            .as_ref()
            .expect("Run::state_dir names where the control socket is");
        status_of(dir)
    }

    /// Waits until the daemon's status satisfies `pred`; returns that status.
    #[track_caller]
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_status_within(LIMIT, what, pred)
    }

    #[track_caller]
    pub fn wait_status_within(
        &self,
        limit: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            if let Some(s) = self.status().filter(|s| pred(s)) {
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}; status: {:#}\nstderr:\n{}",
                self.status().unwrap_or_default(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, then the exit and everything printed (the readers have seen the pipes close).
    pub fn stop(mut self) -> Stopped {
        super::sigterm(&self.child);
        self.finish()
    }

    /// SIGTERM, and the exit within `limit`: a daemon still running then is killed and the test
    /// fails, with its log.
    pub fn stop_within(mut self, limit: Duration) -> Stopped {
        super::sigterm(&self.child);
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let s = self.finish();
                panic!("no exit within {limit:?} of SIGTERM; stderr:\n{}", s.stderr);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.finish()
    }

    /// SIGKILL, then the exit and everything printed.
    pub fn kill(mut self) -> Stopped {
        let _ = self.child.kill();
        self.finish()
    }

    fn finish(&mut self) -> Stopped {
        let status = self.child.wait().unwrap();
        // The pipes close when the daemon and whatever it started are gone.
        let readers = std::mem::take(&mut self.readers);
        wait_for(LIMIT, "the daemon's output to end", || {
            readers.iter().all(|r| r.is_finished()).then_some(())
        });
        for r in readers {
            let _ = r.join();
        }
        Stopped {
            code: status.code(),
            stdout: self.stdout(),
            stderr: self.stderr(),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The status a daemon with state directory `dir` answers on its control socket now.
pub fn status_of(dir: &Path) -> Option<Value> {
    let mut s = UnixStream::connect(dir.join("xidwatch.sock")).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).ok()?;
    serde_json::from_slice(&body).ok()
}

/// Counters of a status snapshot that only grow: kernel log records read, findings counted.
pub fn kmsg_records(status: &Value) -> u64 {
    status["kmsg"]["records"].as_u64().unwrap_or(0)
}

/// Every finding the daemon counted, over every label set.
pub fn findings_total(status: &Value) -> u64 {
    status["findings"].as_array().map_or(0, |a| {
        a.iter().map(|f| f["count"].as_u64().unwrap_or(0)).sum()
    })
}

/// Alerts the channel named `name` delivered.
pub fn delivered(status: &Value, name: &str) -> u64 {
    status["alerts"]["channels"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .map_or(0, |c| c["delivered_total"].as_u64().unwrap_or(0))
}

/// Alerts waiting in the outbox.
pub fn outbox_count(status: &Value) -> u64 {
    status["alerts"]["outbox_count"].as_u64().unwrap_or(0)
}
