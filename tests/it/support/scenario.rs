//! A scenario: a temporary machine (a kernel log file, a boot id, a state directory, a sysfs
//! root, runbooks) and its config, built from typed values and written as TOML.

use std::io::Write;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::daemon::{Daemon, Run};

/// The boot id every scenario's machine has booted with, unless the test writes another.
pub const BOOT_ID: &str = "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f";

pub struct Scenario {
    dir: tempfile::TempDir,
    config: Table,
    nvml_script: Option<PathBuf>,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario::new()
    }
}

impl Scenario {
    /// An empty kernel log, [`BOOT_ID`], NVML off, `/sys` and the state directory under the
    /// scenario's directory.
    pub fn new() -> Scenario {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Scenario {
            dir,
            config: Table::new(),
            nvml_script: None,
        };
        std::fs::write(s.path("kmsg"), "").unwrap();
        std::fs::write(s.path("boot_id"), format!("{BOOT_ID}\n")).unwrap();
        let (kmsg, sys, state) = (s.path("kmsg"), s.path("sys"), s.path("state"));
        s.set("kmsg.path", path_value(&kmsg))
            .set("nvml.enabled", false)
            .set("nvml.sysfs_root", path_value(&sys))
            .set("state.dir", path_value(&state));
        s
    }

    /// `rel` under the scenario's directory.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn config_path(&self) -> PathBuf {
        self.path("xidwatch.toml")
    }

    /// Sets `key` (dotted: `incidents.window_secs`) to `value`, creating the tables on the way.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> &mut Scenario {
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts.pop().unwrap();
        let mut t = &mut self.config;
        for p in parts {
            t = t
                .entry(p)
                .or_insert_with(|| Value::Table(Table::new()))
                .as_table_mut()
                .unwrap_or_else(|| panic!("{key}: {p} is not a table"));
        }
        t.insert(last.to_string(), value.into());
        self
    }

    /// Appends a table to the array `key` (`alerts.webhook` is `[[alerts.webhook]]`).
    pub fn push(&mut self, key: &str, table: Table) -> &mut Scenario {
        let (parent, last) = key.rsplit_once('.').unwrap_or(("", key));
        let mut t = &mut self.config;
        for p in parent.split('.').filter(|p| !p.is_empty()) {
            t = t
                .entry(p)
                .or_insert_with(|| Value::Table(Table::new()))
                .as_table_mut()
                .unwrap();
        }
        t.entry(last)
            .or_insert_with(|| Value::Array(Vec::new()))
            .as_array_mut()
            .unwrap()
            .push(Value::Table(table));
        self
    }

    /// A JSON webhook channel named `name`.
    pub fn webhook(&mut self, name: &str, url: &str) -> &mut Scenario {
        self.push(
            "alerts.webhook",
            table(&[
                ("name", name.into()),
                ("url", url.into()),
                ("format", "json".into()),
            ]),
        )
    }

    /// An email channel through plain SMTP to `addr`.
    pub fn email(&mut self, name: &str, addr: std::net::SocketAddr, to: &str) -> &mut Scenario {
        self.push(
            "alerts.email",
            table(&[
                ("name", name.into()),
                ("smtp_url", format!("smtp://{addr}").into()),
                ("from", "xidwatch@gpu-node-7.example".into()),
                ("to", Value::Array(vec![to.into()])),
            ]),
        )
    }

    /// Retries after 50 ms, backing off to at most a second.
    pub fn fast_retry(&mut self) -> &mut Scenario {
        self.set("alerts.retry.initial_backoff_ms", 50)
            .set("alerts.retry.max_backoff_secs", 1)
    }

    /// The runbook `name` (its TOML) in the scenario's runbook directory, which the config
    /// names, with the fake tools first in the search path.
    pub fn runbook(&mut self, name: &str, text: &str) -> &mut Scenario {
        std::fs::create_dir_all(self.path("runbooks")).unwrap();
        std::fs::write(self.path(&format!("runbooks/{name}.toml")), text).unwrap();
        let dirs = path_value(&self.path("runbooks"));
        let tools = path_value(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-tools"));
        self.set("runbooks.dirs", Value::Array(vec![dirs]))
            .set("runbooks.search_path", Value::Array(vec![tools]))
    }

    /// Runbooks run against the fixtures: the fake tools, the fake sysfs tree and procfs.
    pub fn fixture_runbooks(&mut self) -> &mut Scenario {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        self.set(
            "runbooks.search_path",
            Value::Array(vec![path_value(&root.join("fixtures/fake-tools"))]),
        )
        .set(
            "runbooks.sysfs_root",
            path_value(&root.join("fixtures/sysfs")),
        )
        .set(
            "runbooks.procfs_root",
            path_value(&root.join("fixtures/proc")),
        )
    }

    /// NVML from the fake library, playing `script` (see tests/fake-nvml).
    pub fn fake_nvml(&mut self, script: &str) -> &mut Scenario {
        let path = self.path("nvml.script");
        std::fs::write(&path, script).unwrap();
        self.nvml_script = Some(path);
        let lib = super::fake_nvml_library();
        self.set("nvml.enabled", true)
            .set("nvml.library", path_value(&lib))
    }

    /// The config as TOML.
    pub fn config_text(&self) -> String {
        toml::to_string(&self.config).unwrap()
    }

    /// Writes the config; returns its path.
    pub fn write_config(&self) -> PathBuf {
        let path = self.config_path();
        std::fs::write(&path, self.config_text()).unwrap();
        path
    }

    /// Appends kernel log records (`PRI,SEQ,USEC,-;TEXT` lines) to the kernel log file.
    pub fn append_kmsg(&self, records: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path("kmsg"))
            .unwrap();
        f.write_all(records.as_bytes()).unwrap();
    }

    /// `xidwatch run` on this scenario, its config written first: the boot id file, the fake
    /// NVML's script, the state directory for [`Daemon::status`].
    pub fn run(&self) -> Run {
        let mut run = Run::new(&self.write_config())
            .env("XIDWATCH_BOOT_ID_PATH", self.path("boot_id"))
            .state_dir(&self.state_dir());
        if let Some(script) = &self.nvml_script {
            run = run.nvml_script(script);
        }
        run
    }

    /// [`Scenario::run`], spawned.
    pub fn spawn(&self) -> Daemon {
        self.run().spawn()
    }
}

/// A table of `(key, value)`.
pub fn table(entries: &[(&str, Value)]) -> Table {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn path_value(p: &Path) -> Value {
    Value::String(p.to_str().expect("a UTF-8 path").to_string())
}
