//! What a runbook runs against and within: the machine (programs, /sys, /proc, NVML, secrets)
//! and the ceilings the configuration puts on every runbook.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::runbook::nvml::NvmlProbe;
use crate::runbook::redact::Redactor;

/// The only `PATH` a program sees.
pub const CHILD_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

/// Everything that ties runbooks to a machine: where programs are found, where /sys and /proc
/// are, NVML, the secrets to keep out of evidence. Tests point these at fixtures.
#[derive(Clone)]
pub struct RunbookEnv {
    /// Absolute directories searched, in order, for a step's program; a relative one refuses
    /// the step. Default: the system directories.
    pub search_path: Vec<PathBuf>,
    /// Stands for `/sys` in `read` steps and the PCI topology.
    pub sysfs_root: PathBuf,
    /// Stands for `/proc` in `read` steps.
    pub procfs_root: PathBuf,
    /// Answers `nvml` steps; `None` skips them.
    pub nvml: Option<Arc<dyn NvmlProbe>>,
    /// Host name written into the evidence.
    pub host: String,
    /// Secret values cut out of the evidence (the alert channels' tokens and passwords).
    pub secrets: Redactor,
    /// `[runbooks] show_arguments`: a process's command line whole, not its program and option
    /// names only (see [`crate::runbook::process::render_cmdline`]).
    pub show_arguments: bool,
}

impl RunbookEnv {
    /// The real machine: system program directories, `/sys`, `/proc`, no NVML.
    pub fn system() -> RunbookEnv {
        RunbookEnv {
            search_path: [
                "/usr/local/sbin",
                "/usr/local/bin",
                "/usr/sbin",
                "/usr/bin",
                "/sbin",
                "/bin",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            sysfs_root: PathBuf::from("/sys"),
            procfs_root: PathBuf::from("/proc"),
            nvml: None,
            host: crate::host::hostname(),
            secrets: Redactor::default(),
            show_arguments: false,
        }
    }
}

impl fmt::Debug for RunbookEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RunbookEnv")
            .field("search_path", &self.search_path)
            .field("sysfs_root", &self.sysfs_root)
            .field("procfs_root", &self.procfs_root)
            .field("nvml", &self.nvml.is_some())
            .field("host", &self.host)
            .field("secrets", &self.secrets)
            .field("show_arguments", &self.show_arguments)
            .finish()
    }
}

/// Ceilings the caller (configuration) puts on every runbook; the smaller of these and the
/// runbook's own values applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_budget: Duration,
    pub max_step_timeout: Duration,
    pub max_output_bytes: usize,
    pub max_concurrency: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits {
            max_budget: Duration::from_secs(120),
            max_step_timeout: Duration::from_secs(60),
            max_output_bytes: 256 * 1024,
            max_concurrency: 8,
        }
    }
}
