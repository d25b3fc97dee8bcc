//! Configuration: TOML file -> defaults -> validated [`Config`], built in one step that either
//! succeeds or says exactly what is wrong (file, key, what was expected). Unknown keys are errors:
//! a typo must never silently fall back to a default on a machine that pages people.

pub mod classify;
pub mod env;

pub mod metrics;
pub mod watch;

pub use crate::files::{read_config_file, MAX_CONFIG_BYTES};
pub use crate::model::MAX_WINDOW_SECS;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use std::sync::Arc;

use crate::classify::{XidOverride, XidOverrides};
use crate::model::ConfigIssue;
use crate::runbook::{render_load_errors, RunLimits, RunbookSet, RunbooksConfig};

/// Where the packaged install keeps the config.
pub const DEFAULT_PATH: &str = "/etc/xidwatch/xidwatch.toml";

/// `[kmsg]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct KmsgConfig {
    /// The kernel log device (a regular file of records works too: tests and drills use that).
    pub path: PathBuf,
    /// Accept records written by userspace (facility != kernel). Off in production, so nobody can
    /// page the on-call by writing to /dev/kmsg; tests and fire drills turn it on.
    pub accept_userspace: bool,
    /// On the first start of a boot the whole ring buffer is read: faults the kernel logged more
    /// than this many seconds before the start are recorded (history, status) but not paged, so
    /// installing on a machine up for months does not page every old fault as new. 0 pages all.
    pub lookback_secs: u64,
}

/// Six hours: a fault from the last shift still pages; one from last month does not.
pub const DEFAULT_LOOKBACK_SECS: u64 = 6 * 3600;

impl Default for KmsgConfig {
    fn default() -> Self {
        KmsgConfig {
            path: PathBuf::from("/dev/kmsg"),
            accept_userspace: false,
            lookback_secs: DEFAULT_LOOKBACK_SECS,
        }
    }
}

/// `[nvml]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct NvmlConfig {
    pub enabled: bool,
    /// Path of `libnvidia-ml.so`; the dynamic loader's search when unset.
    pub library: Option<PathBuf>,
    /// How often the lost-GPU probe compares the PCI bus with what NVML reaches.
    pub probe_interval_secs: u64,
    /// Root of sysfs for the probe (tests point it at a fixture tree).
    pub sysfs_root: PathBuf,
    /// How long one NVML call may take before the driver counts as unresponsive (a critical
    /// `driver_unresponsive` incident). Init has its own, longer limit.
    pub call_timeout_secs: u64,
    /// Root of procfs, read for the tasks stuck in the driver when NVML does not answer.
    pub procfs_root: PathBuf,
}

impl Default for NvmlConfig {
    fn default() -> Self {
        NvmlConfig {
            enabled: true,
            library: None,
            probe_interval_secs: 30,
            sysfs_root: PathBuf::from("/sys"),
            call_timeout_secs: 10,
            procfs_root: PathBuf::from("/proc"),
        }
    }
}

/// `[state]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// Where the kmsg position, open incidents and the alert outbox live. Default:
    /// `$STATE_DIRECTORY` (systemd), else `/var/lib/xidwatch` as root, else the user's state dir.
    pub dir: Option<PathBuf>,
}

/// `[incidents]`
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct IncidentsConfig {
    /// How long repeats and echoes of a fault fold into its incident before a digest closes it.
    pub window_secs: u64,
    /// Bound on incidents open at once; the oldest is closed early (with its digest) when full.
    pub max_open: usize,
    /// How long an NVML Xid event waits for the same Xid in the kernel log before it is reported
    /// on its own.
    pub nvml_match_ms: u64,
    /// How long a new incident's first alert waits for related findings on the same GPU (the
    /// cause a few milliseconds after an AER warning, Xid 45 cleanups), so one fault is one page
    /// led by its cause. 0 sends at once.
    pub settle_ms: u64,
    /// How long after an incident's last finding its resolved notice goes out (never before its
    /// window has closed): counted from the last finding, not from the window's end, since a
    /// fault that stopped long ago is over whatever window it opened. 0: never.
    pub quiet_secs: u64,
    /// How often an incident that ends only when verified (a lost GPU, a failing check, a
    /// service down) is told again while it holds, so it does not fade from a channel; 0: never.
    pub remind_secs: u64,
    /// Hostname for alerts; when unset, `$NODE_NAME` (Kubernetes) if set, else the machine's.
    pub host: Option<String>,
}

impl Default for IncidentsConfig {
    fn default() -> Self {
        IncidentsConfig {
            window_secs: 300,
            max_open: 4096,
            nvml_match_ms: 2000,
            settle_ms: 2000,
            quiet_secs: 600,
            remind_secs: 0,
            host: None,
        }
    }
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RawConfig {
    pub kmsg: KmsgConfig,
    pub nvml: NvmlConfig,
    pub state: StateConfig,
    pub runbooks: RunbooksConfig,
    pub incidents: IncidentsConfig,
    /// Per-Xid overrides: `[xid.79] severity = "critical"`.
    pub xid: BTreeMap<String, XidOverride>,
    /// Alert channels: `[[alerts.webhook]]`, `[[alerts.email]]`, `[[alerts.alertmanager]]`, ...
    pub alerts: crate::alert::AlertConfig,
    /// `[metrics]`: the optional Prometheus endpoint.
    pub metrics: metrics::MetricsConfig,
    /// `[handoff]`: the scheduler whose drain command pages carry (suggested, never run).
    pub handoff: crate::alert::handoff::HandoffConfig,
    /// `[health]`, `[inventory]`, `[history]`: see docs/health.md.
    pub health: crate::health::HealthConfig,
    pub inventory: crate::health::config::InventoryConfig,
    pub history: crate::health::config::HistoryConfig,
    /// `[services]`: the systemd units watched (docs/operating.md).
    pub services: crate::source::services::ServicesConfig,
    /// `[fabricmanager]`: Fabric Manager's log, followed (docs/operating.md).
    pub fabricmanager: crate::source::fabricmanager::FabricManagerConfig,
    /// `[classify]`: the site's own line shapes and silences (docs/operating.md).
    pub classify: classify::ClassifyConfig,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (None: built-in defaults).
    pub source: Option<PathBuf>,
    pub kmsg: KmsgConfig,
    pub nvml: NvmlConfig,
    pub state_dir: PathBuf,
    pub runbooks: RunbooksConfig,
    /// The runbooks, loaded and checked against the safety rules.
    pub runbook_set: Arc<RunbookSet>,
    pub runbook_limits: RunLimits,
    pub incidents: IncidentsConfig,
    pub overrides: XidOverrides,
    pub alerts: crate::alert::AlertConfig,
    /// The `[alerts]` channels, built from it when the config was loaded.
    pub alert_channels: crate::alert::channel::BuiltChannels,
    pub metrics: metrics::MetricsConfig,
    /// `[metrics]` as checked when the config was loaded.
    pub metrics_settings: metrics::MetricsSettings,
    /// Loaded for a command that sends nothing ([`Config::load_sending_nothing`]): why the alert
    /// channels were left out (an `env:` secret only the service's environment holds, typically),
    /// worded as refusals are, with no value. `None` when the channels were built.
    pub channels_left_out: Option<String>,
    pub health: crate::health::HealthConfig,
    pub inventory: crate::health::config::InventoryConfig,
    pub history: crate::health::config::HistoryConfig,
    pub services: crate::source::services::ServicesConfig,
    pub fabricmanager: crate::source::fabricmanager::FabricManagerConfig,
    pub classify: classify::ClassifyConfig,
    /// `[classify]`'s rows, checked against their examples and compiled when the config was
    /// loaded: the classifier reads them before its built-in shapes.
    pub site_shapes: Arc<crate::classify::table::Table>,
}

/// A config error, always naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `message` is the whole refusal as printed; `at` is where it is, as values, so nothing
    /// has to be read back out of the message.
    #[error("{path}: {message}")]
    Invalid {
        path: PathBuf,
        message: String,
        at: Where,
    },
}

/// Where in the file a refusal is: the line (known for a parse error), the key, and for refused
/// runbooks their load errors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Where {
    pub line: Option<usize>,
    pub key: Option<String>,
    pub detail: Option<String>,
}

/// Where a refused config went wrong, for a page: the file, the line and the key, never the value
/// (it may be a secret, such as a webhook token in a URL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub path: PathBuf,
    pub line: Option<usize>,
    pub key: Option<String>,
    /// For refused runbooks: their load errors, which name the runbook file, step and line and the
    /// refused command (runbook files hold no secrets; the config's values are never here).
    pub detail: Option<String>,
}

impl Refusal {
    /// `/etc/xidwatch/xidwatch.toml line 12, key incidents.window_secs`.
    pub fn words(&self) -> String {
        let mut s = self.path.display().to_string();
        if let Some(l) = self.line {
            s.push_str(&format!(" line {l}"));
        }
        match &self.key {
            Some(k) => s.push_str(&format!(", key {k}")),
            None => s.push_str(" (cannot be read or parsed)"),
        }
        s
    }
}

impl ConfigError {
    /// The refusal without the file's name.
    pub fn message(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ConfigError::Invalid { message, .. } => message.as_str().into(),
            ConfigError::Read { source, .. } => format!("cannot read: {source}").into(),
        }
    }

    /// File, line and key of the error, without the value. `text` is the file's text, used to
    /// find the line of a key that validation (rather than parsing) refused.
    pub fn refusal(&self, text: Option<&str>) -> Refusal {
        match self {
            ConfigError::Read { path, .. } => Refusal {
                path: path.clone(),
                line: None,
                key: None,
                detail: None,
            },
            ConfigError::Invalid { path, at, .. } => Refusal {
                path: path.clone(),
                line: at.line.or_else(|| {
                    let key = at.key.as_deref()?;
                    // A refused runbook file is named in the detail; the config's line is the
                    // one that points at its directory.
                    let key = if at.detail.is_some() {
                        "runbooks.dirs"
                    } else {
                        key
                    };
                    key_line(text?, key)
                }),
                key: match (&at.key, &at.detail) {
                    (Some(_), Some(_)) => Some("runbooks (a runbook file was refused)".into()),
                    (k, _) => k.clone(),
                },
                detail: at.detail.clone(),
            },
        }
    }
}

/// The line where `key` (`incidents.window_secs`, `alerts.webhook[0] (oncall).url`) is set: the
/// first `last = ` line after a table header that names its first part, else the first anywhere.
fn key_line(text: &str, key: &str) -> Option<usize> {
    let first = key.split(['.', '[', ' ']).next().unwrap_or(key);
    let last = key
        .rsplit('.')
        .next()
        .unwrap_or(key)
        .trim_end_matches(|c: char| c == ']' || c.is_ascii_digit())
        .trim_end_matches('[');
    let sets = |l: &str| {
        let l = l.trim_start();
        l.strip_prefix(last)
            .is_some_and(|r| r.trim_start().starts_with('='))
    };
    let mut in_table = false;
    let mut anywhere = None;
    for (i, l) in text.lines().enumerate() {
        let t = l.trim();
        if t.starts_with('[') {
            in_table = t
                .trim_matches(|c| c == '[' || c == ']')
                .trim()
                .starts_with(first);
            if in_table && last == first {
                return Some(i + 1);
            }
            continue;
        }
        if sets(l) {
            if in_table {
                return Some(i + 1);
            }
            anywhere.get_or_insert(i + 1);
        }
    }
    anywhere
}

impl Config {
    /// The sections read only at start-up, and whether `new` changes each: a reload says so
    /// and keeps the old values until the next restart ([`Config::keeping_restart_only`]).
    fn restart_only(&self, new: &Config) -> [(&'static str, bool); 10] {
        [
            ("kmsg.path", new.kmsg.path != self.kmsg.path),
            ("state.dir", new.state_dir != self.state_dir),
            ("nvml", new.nvml != self.nvml),
            ("incidents.host", new.incidents.host != self.incidents.host),
            ("metrics", new.metrics != self.metrics),
            ("health", new.health != self.health),
            ("inventory", new.inventory != self.inventory),
            ("history", new.history != self.history),
            ("services", new.services != self.services),
            ("fabricmanager", new.fabricmanager != self.fabricmanager),
        ]
    }

    /// The incident engine's settings; `boot_id` keys the incidents of this boot.
    pub fn engine_config(&self, boot_id: String) -> crate::incident::EngineConfig {
        crate::incident::EngineConfig {
            window_ms: self.incidents.window_secs.saturating_mul(1000),
            max_open: self.incidents.max_open,
            nvml_match_ms: self.incidents.nvml_match_ms,
            host: crate::host::alert_host(self.incidents.host.as_deref()),
            boot_id,
            overrides: self.overrides.clone(),
            settle_ms: self.incidents.settle_ms,
            quiet_ms: self.incidents.quiet_secs.saturating_mul(1000),
            remind_ms: self.incidents.remind_secs.saturating_mul(1000),
        }
    }

    /// What the NVML side starts with: the worker (when `[nvml]` is enabled), the probe, the
    /// health checks and the expected GPU count. `boot_hex` names this boot's inventory.
    pub fn nvml_link(
        &self,
        boot_hex: &str,
        probe_rounds: Arc<std::sync::atomic::AtomicU64>,
    ) -> crate::source::nvml::link::LinkOptions {
        use std::time::Duration;
        crate::source::nvml::link::LinkOptions {
            worker: self
                .nvml
                .enabled
                .then(|| crate::source::nvml::WorkerOptions {
                    library: self.nvml.library.clone(),
                    call_timeout: Duration::from_secs(self.nvml.call_timeout_secs),
                    open_timeout: crate::source::nvml::link::NVML_OPEN_LIMIT,
                    procfs_root: self.nvml.procfs_root.clone(),
                }),
            health: self.health.clone(),
            expected_gpus: self.inventory.expected_gpus,
            sysfs_root: self.nvml.sysfs_root.clone(),
            probe_every: Duration::from_secs(self.nvml.probe_interval_secs),
            keep: crate::source::health::Keep {
                state_dir: self.state_dir.clone(),
                boot_hex: boot_hex.to_string(),
            },
            probe_rounds,
        }
    }

    /// The alert stage's settings; with `stdout_taken` (`run --json`) the stdout channel is
    /// off, as standard output carries the incidents.
    pub fn alert_config(&self, stdout_taken: bool) -> crate::alert::AlertConfig {
        let mut c = self.alerts.clone();
        if stdout_taken {
            c.stdout.enabled = Some(false);
        }
        c
    }

    /// The alert channels as built at load, without stdout when it is taken.
    pub fn alert_channels(&self, stdout_taken: bool) -> crate::alert::channel::BuiltChannels {
        if stdout_taken {
            self.alert_channels
                .without(crate::alert::config::STDOUT_CHANNEL)
        } else {
            self.alert_channels.clone()
        }
    }

    /// The sections `new` changes that take effect only at the next restart.
    pub fn restart_only_changes(&self, new: &Config) -> Vec<&'static str> {
        self.restart_only(new)
            .into_iter()
            .filter_map(|(what, changed)| changed.then_some(what))
            .collect()
    }

    /// `self` (a reloaded config) with the start-up-only sections of `running`, the config in
    /// force: what a reload applies.
    pub fn keeping_restart_only(self, running: &Config) -> Config {
        Config {
            kmsg: KmsgConfig {
                path: running.kmsg.path.clone(),
                ..self.kmsg
            },
            state_dir: running.state_dir.clone(),
            nvml: running.nvml.clone(),
            incidents: IncidentsConfig {
                host: running.incidents.host.clone(),
                ..self.incidents
            },
            metrics: running.metrics.clone(),
            health: running.health.clone(),
            inventory: running.inventory.clone(),
            history: running.history.clone(),
            services: running.services.clone(),
            fabricmanager: running.fabricmanager.clone(),
            ..self
        }
    }
    /// Loads `path`; with `None`, the default path if it exists, else built-in defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_for(path, true)
    }

    /// Like [`load`](Self::load), for a command that sends nothing (`scan --runbooks`,
    /// `runbook list|show|run`): alert channels that do not build (a secret's environment
    /// variable unset, as it is outside the service) are left out with a note in
    /// `channels_left_out` instead of refusing the config, as `status` and `history` do.
    pub fn load_sending_nothing(path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::load_for(path, false)
    }

    fn load_for(path: Option<&Path>, sends: bool) -> Result<Config, ConfigError> {
        let path = match path {
            Some(p) => Some(p.to_path_buf()),
            None if Path::new(DEFAULT_PATH).exists() => Some(PathBuf::from(DEFAULT_PATH)),
            None => None,
        };
        match path {
            Some(p) => {
                let text = read_config_file(&p).map_err(|source| ConfigError::Read {
                    path: p.clone(),
                    source,
                })?;
                Config::from_toml_for(&text, Some(&p), sends)
            }
            None => Config::from_raw(RawConfig::default(), None, sends, None),
        }
    }

    /// Parses and validates config text; `path` is only used in messages.
    pub fn from_toml(text: &str, path: Option<&Path>) -> Result<Config, ConfigError> {
        Config::from_toml_for(text, path, true)
    }

    fn from_toml_for(text: &str, path: Option<&Path>, sends: bool) -> Result<Config, ConfigError> {
        let shown = path.map_or_else(|| PathBuf::from("<config>"), Path::to_path_buf);
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let (message, at) = describe_toml_error(text, &e);
            ConfigError::Invalid {
                path: shown.clone(),
                message,
                at,
            }
        })?;
        let tree = toml::from_str::<toml::Table>(text).ok();
        if let Some(key) = tree.as_ref().and_then(|t| key_with_nul(t, "")) {
            return Err(ConfigError::Invalid {
                path: shown,
                message: format!(
                    "{key}: holds a NUL character, which no path, name or value may hold"
                ),
                at: Where {
                    key: Some(key),
                    ..Where::default()
                },
            });
        }
        Config::from_raw(raw, path, sends, tree.as_ref())
    }

    /// Checks and builds what was parsed. Every check returns a [`ConfigIssue`] that names its
    /// key as a value; with the file's `tree`, each message leaves without that key's value (and
    /// without any long string of the file), scrubbed by the key, never read back out of the
    /// text.
    fn from_raw(
        raw: RawConfig,
        path: Option<&Path>,
        sends: bool,
        tree: Option<&toml::Table>,
    ) -> Result<Config, ConfigError> {
        let shown = path.map_or_else(|| PathBuf::from("<config>"), Path::to_path_buf);
        // Every refusal is scrubbed by its own key: the message leaves without the value.
        let refused = |issues: &[ConfigIssue]| ConfigError::Invalid {
            path: shown.clone(),
            message: issues
                .iter()
                .map(|i| match tree {
                    Some(t) => scrub_part(&i.key, &i.message, t),
                    None => i.to_string(),
                })
                .collect::<Vec<_>>()
                .join("; "),
            at: Where {
                key: issues
                    .first()
                    .map(|i| i.key.clone())
                    .filter(|k| !k.is_empty()),
                ..Where::default()
            },
        };
        let invalid = |issue: ConfigIssue| refused(std::slice::from_ref(&issue));
        let alert_refusal = |e: crate::alert::AlertError| match e {
            crate::alert::AlertError::Config(issues) => refused(&issues),
            e => refused(&[ConfigIssue::new("alerts", e.to_string())]),
        };
        let overrides = XidOverrides::from_table(raw.xid).map_err(invalid)?;
        if raw.incidents.window_secs == 0 || raw.incidents.window_secs > MAX_WINDOW_SECS {
            return Err(invalid(ConfigIssue::new(
                "incidents.window_secs",
                format!("expected seconds from 1 to {MAX_WINDOW_SECS} (30 days)"),
            )));
        }
        if raw.incidents.nvml_match_ms > 60_000 {
            return Err(invalid(ConfigIssue::new(
                "incidents.nvml_match_ms",
                "expected at most 60000",
            )));
        }
        if raw.incidents.settle_ms > 60_000 {
            return Err(invalid(ConfigIssue::new(
                "incidents.settle_ms",
                "expected at most 60000 (0 sends the first alert at once)",
            )));
        }
        if raw.incidents.quiet_secs > MAX_WINDOW_SECS {
            return Err(invalid(ConfigIssue::new(
                "incidents.quiet_secs",
                format!("expected at most {MAX_WINDOW_SECS} (0 never resolves)"),
            )));
        }
        if raw.nvml.probe_interval_secs > MAX_WINDOW_SECS {
            return Err(invalid(ConfigIssue::new(
                "nvml.probe_interval_secs",
                format!("expected at most {MAX_WINDOW_SECS}"),
            )));
        }
        if raw.nvml.call_timeout_secs == 0 || raw.nvml.call_timeout_secs > 600 {
            return Err(invalid(ConfigIssue::new(
                "nvml.call_timeout_secs",
                "expected seconds from 1 to 600",
            )));
        }
        if raw.incidents.max_open == 0 {
            return Err(invalid(ConfigIssue::new(
                "incidents.max_open",
                "expected at least 1",
            )));
        }
        if raw.nvml.probe_interval_secs == 0 {
            return Err(invalid(ConfigIssue::new(
                "nvml.probe_interval_secs",
                "expected a number of seconds above 0",
            )));
        }
        raw.handoff.validate().map_err(invalid)?;
        // Checked and built here, once: the daemon, a reload and test-alert use these channels.
        let mut channels_left_out = None;
        let alert_channels = match crate::alert::channel::BuiltChannels::build(&raw.alerts) {
            Ok(b) => b,
            Err(e) if !sends => {
                // Nothing is sent: the channels are not needed, only worth a word.
                channels_left_out = Some(alert_refusal(e).message().to_string());
                let bare = crate::alert::AlertConfig {
                    webhook: Vec::new(),
                    email: Vec::new(),
                    alertmanager: Vec::new(),
                    ..raw.alerts.clone()
                };
                crate::alert::channel::BuiltChannels::build(&bare).map_err(alert_refusal)?
            }
            Err(e) => return Err(alert_refusal(e)),
        };
        let runbook_limits = raw.runbooks.limits().map_err(invalid)?;
        let catalog = raw.runbooks.catalog().map_err(invalid)?;
        let runbook_set = RunbookSet::load(&raw.runbooks.dirs(), &catalog).map_err(|errors| {
            // Runbook load errors name runbook files (which hold no secrets): not scrubbed.
            let detail = render_load_errors(&errors).trim_end().to_string();
            ConfigError::Invalid {
                path: shown.clone(),
                message: format!("runbooks refused:\n{detail}"),
                at: Where {
                    key: Some("runbooks".into()),
                    detail: Some(detail),
                    ..Where::default()
                },
            }
        })?;
        let metrics_settings = raw.metrics.validate().map_err(invalid)?;
        crate::health::config::validate(&raw.health, &raw.inventory, &raw.history)
            .map_err(invalid)?;
        raw.services.validate().map_err(invalid)?;
        raw.fabricmanager.validate().map_err(invalid)?;
        let site_shapes = raw.classify.build().map_err(invalid)?;
        // A misspelt runbook name must not fall back silently to the matching rules.
        for (xid, o) in overrides.iter() {
            if let Some(name) = &o.runbook {
                if runbook_set.get(name).is_none() {
                    let known: Vec<&str> = runbook_set.iter().map(|r| r.name()).collect();
                    return Err(invalid(ConfigIssue::new(
                        format!("xid.{xid}.runbook"),
                        format!("no runbook named {name:?} (known: {})", known.join(", ")),
                    )));
                }
            }
        }
        if raw.kmsg.path.as_os_str().is_empty() {
            return Err(invalid(ConfigIssue::new(
                "kmsg.path",
                "expected a path such as \"/dev/kmsg\"",
            )));
        }
        Ok(Config {
            source: path.map(Path::to_path_buf),
            state_dir: raw.state.dir.clone().unwrap_or_else(default_state_dir),
            kmsg: raw.kmsg,
            nvml: raw.nvml,
            runbooks: raw.runbooks,
            runbook_set: Arc::new(runbook_set),
            runbook_limits,
            incidents: raw.incidents,
            overrides,
            alerts: crate::alert::AlertConfig {
                handoff: raw.handoff,
                ..raw.alerts
            },
            alert_channels,
            metrics: raw.metrics,
            metrics_settings,
            health: raw.health,
            inventory: raw.inventory,
            history: raw.history,
            services: raw.services,
            fabricmanager: raw.fabricmanager,
            classify: raw.classify,
            site_shapes,
            channels_left_out,
        })
    }
}

/// A parse error as "line L, column C, key `section.key`: what was wrong", without quoting the
/// file: toml's own message shows the offending line, and that line may hold a webhook URL or a
/// password that must not reach a log or an alert. Quoted values in the message are elided too.
pub fn describe_toml_error(text: &str, e: &toml::de::Error) -> (String, Where) {
    let mut msg = elide_quoted(e.message().trim());
    let Some(span) = e.span() else {
        return (msg, Where::default());
    };
    let start = span.start.min(text.len());
    // The refused value, as written (`987654321`, `"starttls"`, `[1, 2]`), is cut wherever
    // serde's message repeats it: `invalid type: integer `987654321``, `unknown variant `x``.
    // Only a span on the value side of `=`: an unknown key's span is the key, which stays.
    let value_side = text[text[..start].rfind('\n').map_or(0, |i| i + 1)..start].contains('=');
    if let Some(raw) = text
        .get(start..span.end.min(text.len()))
        .filter(|_| value_side)
    {
        let raw = raw.trim();
        let bare = raw.trim_matches(|c| c == '"' || c == '\'');
        for r in [raw, bare] {
            if !r.is_empty() && !r.contains('\n') {
                msg = cut_token(&msg, r);
            }
        }
    }
    let before = &text[..start];
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"'))
        .filter(|k| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        });
    let section = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    // A table header refused as such (a table given twice): its name is the key.
    let header = line
        .trim()
        .strip_prefix('[')
        .map(|h| h.trim_matches(|c| c == '[' || c == ']').trim().to_string())
        .filter(|h| !h.is_empty());
    let key = match (header, section, key) {
        (Some(h), _, _) => Some(h),
        (None, Some(s), Some(k)) => Some(format!("{s}.{k}")),
        (None, None, Some(k)) => Some(k.to_string()),
        _ => None,
    };
    let named = key
        .as_ref()
        .map(|k| format!(", key `{k}`"))
        .unwrap_or_default();
    let at = Where {
        line: Some(line_no),
        key,
        detail: None,
    };
    (format!("line {line_no}, column {col}{named}: {msg}"), at)
}

/// One refusal, `key: rest`, with every rendering of the key's value, and of any long string
/// anywhere in the file, cut from `rest`.
fn scrub_part(key: &str, rest: &str, tree: &toml::Table) -> String {
    let mut renders = Vec::new();
    collect_renders(&toml::Value::Table(tree.clone()), &mut renders);
    renders.retain(|r| r.chars().count() >= 8);
    if let Some(v) = lookup(tree, key) {
        collect_renders(v, &mut renders);
    }
    renders.sort_by_key(|r| std::cmp::Reverse(r.len()));
    renders.dedup();
    let mut rest = rest.to_string();
    for r in &renders {
        rest = cut_token(&rest, r);
    }
    if key.is_empty() {
        rest
    } else if rest.is_empty() {
        key.to_string()
    } else {
        format!("{key}: {rest}")
    }
}

/// The value at a message's key: `alerts.webhook[0] (oncall).url`, `runbooks.allow[2]`,
/// `xid.79.runbook`. Channel names in parentheses are dropped; a key not in the file gives None.
fn lookup<'a>(tree: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut key = key.trim().to_string();
    while let Some(open) = key.find(" (") {
        let close = key[open..].find(')').map_or(key.len(), |c| open + c + 1);
        key.replace_range(open..close, "");
    }
    let mut at: Option<&toml::Value> = None;
    for segment in key.split('.') {
        let mut parts = segment.split('[');
        let name = parts.next().unwrap_or("");
        let table = match at {
            None => tree,
            Some(toml::Value::Table(t)) => t,
            Some(_) => return None,
        };
        let mut v = table.get(name)?;
        for idx in parts {
            let i: usize = idx.trim_end_matches(']').parse().ok()?;
            v = v.as_array()?.get(i)?;
        }
        at = Some(v);
    }
    at
}

/// Every way a value may be written into a message: as it is, quoted, and as TOML writes it.
fn collect_renders(v: &toml::Value, out: &mut Vec<String>) {
    match v {
        toml::Value::String(s) => {
            if !s.is_empty() {
                out.push(format!("{s:?}"));
                out.push(s.clone());
            }
        }
        toml::Value::Integer(i) => out.push(i.to_string()),
        toml::Value::Float(f) => {
            out.push(f.to_string());
            out.push(v.to_string());
        }
        toml::Value::Boolean(b) => out.push(b.to_string()),
        toml::Value::Datetime(d) => out.push(d.to_string()),
        toml::Value::Array(items) => {
            out.push(v.to_string());
            items.iter().for_each(|i| collect_renders(i, out));
        }
        toml::Value::Table(t) => t.values().for_each(|i| collect_renders(i, out)),
    }
}

/// `text` with every occurrence of `value` replaced by `…`; where the value begins or ends with
/// a letter or digit, only where it stands as a whole word (so `1` does not cut `10`).
fn cut_token(text: &str, value: &str) -> String {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let (first_word, last_word) = (
        value.chars().next().is_some_and(word),
        value.chars().last().is_some_and(word),
    );
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(i) = text[from..].find(value).map(|i| from + i) {
        let end = i + value.len();
        let before_ok = !first_word || !text[..i].chars().last().is_some_and(word);
        let after_ok = !last_word || !text[end..].chars().next().is_some_and(word);
        out.push_str(&text[from..i]);
        if before_ok && after_ok {
            out.push('…');
        } else {
            out.push_str(value);
        }
        from = end;
    }
    out.push_str(&text[from..]);
    out
}

/// `invalid type: string "hunter2", expected a boolean` -> `invalid type: string "…", ...`.
fn elide_quoted(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut inside = false;
    for c in msg.chars() {
        if c == '"' {
            if inside {
                out.push('…');
            }
            inside = !inside;
            out.push(c);
        } else if !inside {
            out.push(c);
        }
    }
    out
}

/// `$STATE_DIRECTORY` under systemd; `/var/lib/xidwatch` as root; the user's state directory
/// otherwise, so a non-root run never needs root to keep its position.
/// The first key (dotted, with list indices) whose string value holds a NUL: the system calls
/// that take paths and names would stop there, so a value that passes `check` would mean
/// something else at run time.
fn key_with_nul(table: &toml::Table, prefix: &str) -> Option<String> {
    fn walk(v: &toml::Value, at: String) -> Option<String> {
        match v {
            toml::Value::String(s) if s.contains('\0') => Some(at),
            toml::Value::Array(items) => items
                .iter()
                .enumerate()
                .find_map(|(i, item)| walk(item, format!("{at}[{i}]"))),
            toml::Value::Table(t) => key_with_nul(t, &at),
            _ => None,
        }
    }
    table.iter().find_map(|(k, v)| {
        let at = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if k.contains('\0') {
            return Some(at);
        }
        walk(v, at)
    })
}

pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STATE_DIRECTORY") {
        // systemd may pass several, colon-separated; the first is ours.
        if let Some(first) = d.to_string_lossy().split(':').next() {
            return PathBuf::from(first);
        }
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/xidwatch");
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("xidwatch");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".local/state/xidwatch");
    }
    PathBuf::from(".xidwatch-state")
}

#[cfg(test)]
mod tests {
    /// A NUL anywhere is refused by `check`, naming the key, instead of failing at run time.
    #[test]
    fn a_nul_in_any_string_is_refused_naming_its_key() {
        for (text, key) in [
            (
                "[runbooks]\nsearch_path = [\"/usr/bin\\u0000/tmp\"]\n",
                "runbooks.search_path[0]",
            ),
            ("[kmsg]\npath = \"/dev/kmsg\\u0000x\"\n", "kmsg.path"),
            (
                "[runbooks]\ndirs = [\"/a\", \"/b\\u0000\"]\n",
                "runbooks.dirs[1]",
            ),
        ] {
            let e = super::Config::from_toml(text, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("NUL"), "{text}: {e}");
        }
    }

    /// A refused config names file, line and key for the page, never the value, for a parse
    /// error and for a value that parses but does not validate (a secret URL among them).
    /// Host names are ASCII (an international one as punycode): a non-ASCII host is refused at
    /// load, naming the key, and its punycode form is taken.
    #[test]
    fn a_host_name_is_ascii_or_punycode() {
        let hook = |url: &str| {
            Config::from_toml(
                &format!("[[alerts.webhook]]\nname = \"h\"\nformat = \"json\"\nurl = \"{url}\"\n"),
                None,
            )
        };
        match hook("https://b\u{fc}cher.example/hook") {
            Err(ConfigError::Invalid { at, .. }) => assert!(
                at.key
                    .as_deref()
                    .is_some_and(|k| k.starts_with("alerts.webhook[0]")),
                "{at:?}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(hook("https://xn--bcher-kva.example/hook").is_ok());
    }

    #[test]
    fn refusals_carry_their_key_and_line_as_values() {
        let at = |text: &str| match Config::from_toml(text, None) {
            Err(ConfigError::Invalid { at, .. }) => at,
            other => panic!("{text}: {other:?}"),
        };
        // A check's refusal: the key it returned, and the line looked up by it.
        let w = at("[kmsg]\npath = \"/dev/kmsg\"\n[incidents]\nwindow_secs = 0\n");
        assert_eq!(w.key.as_deref(), Some("incidents.window_secs"));
        assert_eq!(w.line, None, "found from the text only when a page asks");
        // A parse error: line and key from toml's span.
        let w = at("[nvml]\nenabled = \"yes\"\n");
        assert_eq!((w.line, w.key.as_deref()), (Some(2), Some("nvml.enabled")));
        // An alert channel's refusal names its own key.
        let w = at("[[alerts.webhook]]\nname = \"h\"\nformat = \"json\"\nurl = \"ftp://x/y\"\n");
        assert!(
            w.key
                .as_deref()
                .is_some_and(|k| k.starts_with("alerts.webhook[0]")),
            "{w:?}"
        );
    }

    #[test]
    fn refusals_name_file_line_and_key_never_the_value() {
        let p = std::path::Path::new("/etc/xidwatch/xidwatch.toml");
        let cases = [
            (
                "[incidents]\nwindow_secs = 987654321\n",
                2,
                "incidents.window_secs",
                "987654321",
            ),
            (
                "[kmsg]\npath = \"/dev/kmsg\"\n[nvml]\nenabled = \"hunter2\"\n",
                4,
                "nvml.enabled",
                "hunter2",
            ),
            (
                "[[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"ftp://hooks.example/T0/SECRETTOKEN\"\n",
                4,
                "url",
                "SECRETTOKEN",
            ),
        ];
        for (text, line, key, value) in cases {
            let e = super::Config::from_toml(text, Some(p)).unwrap_err();
            let r = e.refusal(Some(text));
            let words = r.words();
            assert!(words.starts_with("/etc/xidwatch/xidwatch.toml"), "{words}");
            assert_eq!(r.line, Some(line), "{words} ({e})");
            assert!(
                r.key.as_deref().is_some_and(|k| k.contains(key)),
                "{words} ({e})"
            );
            assert!(!words.contains(value), "{words}");
        }
    }

    /// Config cases whose error must name the key but never the value, one per kind of value:
    /// strings, integers, floats, booleans, arrays, tables, enum-like strings (TLS modes), URLs,
    /// each both where it does not parse and where it parses but does not validate. Shared with
    /// the `check` and reload tests.
    pub const NEVER_ECHOED: &[(&str, &str, &str)] = &[
        ("[incidents]\nwindow_secs = 987654321\n", "incidents.window_secs", "987654321"),
        ("[incidents]\nwindow_secs = 12345.678\n", "incidents.window_secs", "12345.678"),
        ("[incidents]\nwindow_secs = \"sekrit-window\"\n", "incidents.window_secs", "sekrit-window"),
        ("[health]\ninterval_secs = 777777\n", "health.interval_secs", "777777"),
        ("[runbooks]\nmax_budget_secs = 98765.4321\n", "runbooks", "98765.4321"),
        ("[runbooks]\nmax_parallel_runbooks = 31337\n", "max_parallel_runbooks", "31337"),
        ("[runbooks]\nallow = [[\"ibstat\"], 424242]\n", "allow", "424242"),
        ("[runbooks]\nallow = [{ k = \"table-secret\" }]\n", "allow", "table-secret"),
        ("[runbooks]\nsearch_path = [\"relative-secret\"]\n", "search_path", "relative-secret"),
        ("[kmsg]\npath = { k = \"inline-secret\" }\n", "kmsg.path", "inline-secret"),
        ("[kmsg]\naccept_userspace = \"hunter2\"\n", "kmsg.accept_userspace", "hunter2"),
        ("[kmsg]\naccept_userspace = 8675309\n", "kmsg.accept_userspace", "8675309"),
        ("[kmsg]\naccept_userspace = [\"arr-secret\"]\n", "kmsg.accept_userspace", "arr-secret"),
        ("[kmsg]\npath = true\n", "kmsg.path", "true"),
        ("[metrics]\nlisten = \"10.1.2.3:sekrit\"\n", "metrics.listen", "sekrit"),
        ("[handoff]\nnode = \"bad node sekrit\"\n", "handoff.node", "sekrit"),
        ("[xid.79]\nrunbook = \"falen-off-bus\"\n", "xid.79.runbook", "falen-off-bus"),
        ("[xid.79]\nwindow_secs = 99999999\n", "xid.79.window_secs", "99999999"),
        (
            "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example:587\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\nusername = \"u\"\npassword = 987654321\n",
            "password",
            "987654321",
        ),
        (
            "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtps://mail.example\"\ntls = \"starttls\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n",
            "smtp_url",
            "starttls",
        ),
        (
            "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example\"\ntls = \"tls-sekrit\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n",
            "tls",
            "tls-sekrit",
        ),
        (
            "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example\"\nfrom = \"x@example.com\"\nto = [\"rcpt-sekrit\"]\n",
            "to[0]",
            "rcpt-sekrit",
        ),
        (
            "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"gopher://mail.example/SEKRIT\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n",
            "smtp_url",
            "gopher",
        ),
        (
            "[[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"ftp://hooks.example/T0/SECRETTOKEN\"\n",
            "url",
            "ftp",
        ),
        (
            "[[alerts.webhook]]\nname = \"hook\"\nformat = \"jsonsekrit\"\nurl = \"https://hooks.example/T0\"\n",
            "format",
            "jsonsekrit",
        ),
        (
            "[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"http://user:pw-sekrit@am.example:9093\"]\n",
            "urls[0]",
            "pw-sekrit",
        ),
        (
            "[[alerts.alertmanager]]\nname = \"am\"\nurls = [\"http://am.example:9093\"]\ngenerator_url = \"not a url sekrit\"\n",
            "generator_url",
            "sekrit",
        ),
    ];

    /// Every kind of value, refused where it parses and where it validates: the message names
    /// file, line and key, and holds the value nowhere.
    /// An alert channel's refusal carries its key as a value: a message that itself holds
    /// "; " or ": " is kept whole (it used to be cut apart where the key was looked for), the
    /// key names the channel, and the value is still cut out.
    #[test]
    fn alert_refusals_keep_their_key_and_their_whole_message() {
        let p = std::path::Path::new("/etc/xidwatch/xidwatch.toml");
        let text = "[[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtp://mail.example.com\"\ntls = \"none\"\nfrom = \"x@example.com\"\nto = [\"y@example.com\"]\n[[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"ftp://hooks.example/T0/SECRETTOKEN\"\n";
        let e = super::Config::from_toml(text, Some(p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("alerts.webhook[0] (hook).url: the scheme is not http or https"),
            "{e}"
        );
        assert!(
            e.contains("alerts.email[0] (mail).tls: a plain SMTP connection is allowed only to a loopback address; use tls = \"starttls\" or an smtps:// URL"),
            "{e}"
        );
        assert!(!e.contains("SECRETTOKEN"), "{e}");
        let r = super::Config::from_toml(text, Some(p))
            .unwrap_err()
            .refusal(Some(text));
        assert_eq!(r.key.as_deref(), Some("alerts.webhook[0] (hook).url"));
    }

    #[test]
    fn no_refusal_echoes_a_value_of_any_kind() {
        let p = std::path::Path::new("/etc/xidwatch/xidwatch.toml");
        for (text, key, value) in NEVER_ECHOED {
            let e = super::Config::from_toml(text, Some(p)).unwrap_err();
            let whole = e.to_string();
            let r = e.refusal(Some(text));
            assert!(whole.contains(key), "{text}: {whole}");
            assert!(!whole.contains(value), "{text}: {whole}");
            assert!(!r.words().contains(value), "{text}: {}", r.words());
            assert!(r.line.is_some(), "{text}: {} ({whole})", r.words());
        }
    }

    use super::*;

    /// The README's "every key, with its default" block, as the README has it.
    pub fn readme_defaults_block() -> &'static str {
        let readme = include_str!("../../README.md");
        let at = readme.find("Every key, with its default").unwrap_or(0);
        let start = readme[at..].find("```toml\n").map_or(at, |i| at + i + 8);
        let end = readme[start..].find("```\n").map_or(start, |i| start + i);
        &readme[start..end]
    }

    /// The README's block of defaults says what the defaults are: read as a config, it is the
    /// config of no file at all.
    #[test]
    fn the_readme_defaults_are_the_defaults() {
        let block = readme_defaults_block();
        assert!(
            block.contains("[kmsg]") && block.contains("quiet_secs"),
            "{block}"
        );
        let written = Config::from_toml(block, Some(Path::new("README.md")))
            .unwrap_or_else(|e| panic!("{e}"));
        let none = Config::from_raw(RawConfig::default(), None, true, None).unwrap();
        assert_eq!(written.kmsg, none.kmsg);
        assert_eq!(written.nvml, none.nvml);
        assert_eq!(written.state_dir, none.state_dir);
        assert_eq!(
            format!("{:?}", written.incidents),
            format!("{:?}", none.incidents)
        );
        assert_eq!(written.runbooks, none.runbooks);
        assert_eq!(written.metrics, none.metrics);
        assert_eq!(written.health, none.health);
        assert_eq!(written.inventory, none.inventory);
        assert_eq!(written.history, none.history);
        assert_eq!(
            format!("{:?}", written.alerts),
            format!("{:?}", none.alerts)
        );
        assert_eq!(
            format!("{:?}", written.overrides),
            format!("{:?}", none.overrides)
        );
    }

    #[test]
    fn defaults_and_required_names() {
        let c = Config::from_toml(
            "[kmsg]\npath = \"/tmp/k\"\naccept_userspace = true\n[nvml]\nenabled = false\nlibrary = \"/x/libnvidia-ml.so\"\n[state]\ndir = \"/tmp/s\"\n[runbooks]\ndirs = [\"runbooks\", \"runbooks\"]\n[xid.13]\nseverity = \"info\"\n",
            None,
        )
        .unwrap();
        assert_eq!(c.kmsg.path, PathBuf::from("/tmp/k"));
        assert!(c.kmsg.accept_userspace);
        assert!(!c.nvml.enabled);
        assert_eq!(c.state_dir, PathBuf::from("/tmp/s"));
        assert_eq!(c.runbooks.dirs().len(), 2);
        assert!(c.overrides.get(13).is_some());
    }

    #[test]
    fn the_lookback_defaults_to_six_hours_and_zero_turns_it_off() {
        let c = Config::from_toml("", None).unwrap();
        assert_eq!(c.kmsg.lookback_secs, 21_600);
        let c = Config::from_toml("[kmsg]\nlookback_secs = 0\n", None).unwrap();
        assert_eq!(c.kmsg.lookback_secs, 0);
        assert!(Config::from_toml("[kmsg]\nlookback_secs = -1\n", None).is_err());
    }

    #[test]
    fn typos_and_bad_values_name_file_and_key() {
        let p = Path::new("/etc/xidwatch/xidwatch.toml");
        let e = Config::from_toml("[kmsg]\npaht = \"/dev/kmsg\"\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/etc/xidwatch/xidwatch.toml") && e.contains("paht") && e.contains("line 2"),
            "{e}"
        );
        let e = Config::from_toml("[kmsg]\naccept_userspace = \"yes\"\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("accept_userspace") || e.contains("line 2"),
            "{e}"
        );
        assert!(e.contains("bool"), "{e}");
        let e = Config::from_toml("[xid.abc]\nignore = true\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("xid.abc"), "{e}");
        for bad in [
            "[incidents]\nwindow_secs = 9000000000000000000\n",
            "[incidents]\nnvml_match_ms = 9000000000000000000\n",
            "[xid.13]\nwindow_secs = 9000000000000000000\n",
            "[runbooks]\nmax_parallel_runbooks = 0\n",
        ] {
            let e = Config::from_toml(bad, Some(p)).unwrap_err().to_string();
            let key = bad
                .lines()
                .nth(1)
                .and_then(|l| l.split(' ').next())
                .unwrap_or("");
            assert!(e.contains(key), "{bad}: {e}");
        }
        let e = Config::from_toml("[incidents]\nwindow_secs = 0\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("incidents.window_secs"), "{e}");
        // Neither the message nor the line it points at repeats a value: it may be a secret.
        let e = Config::from_toml(
            "[[alerts.webhook]]\nname = \"slack\"\nurl = https://hooks.example.com/T0/B0/hunter2\nformat = \"slack\"\n",
            Some(p),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("line 3") && e.contains("alerts.webhook.url") && !e.contains("hunter2"),
            "{e}"
        );
        let e = Config::from_toml("[kmsg]\naccept_userspace = \"hunter2\"\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kmsg.accept_userspace") && !e.contains("hunter2"),
            "{e}"
        );
        let e = Config::from_toml("[xid.79]\nrunbook = \"falen-off-bus\"\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("xid.79.runbook") && !e.contains("falen-off-bus"),
            "{e}"
        );
        let e = Config::from_toml("[bogus]\n", Some(p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn only_regular_files_of_bounded_size_are_read() {
        let e = Config::load(Some(Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file (a character device)"),
            "{e}"
        );
        let d = tempfile::tempdir().unwrap();
        let e = Config::load(Some(d.path())).unwrap_err().to_string();
        assert!(e.contains("directory"), "{e}");
        let big = d.path().join("big.toml");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = Config::load(Some(&big)).unwrap_err().to_string();
        assert!(
            e.contains("big.toml") && e.contains("more than a config may be"),
            "{e}"
        );
        let fifo = d.path().join("fifo.toml");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = Config::load(Some(&fifo)).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
    }
}
