//! The typed values that travel between pipeline stages.
//!
//! Parsing happens once, at the edge (a source or the classifier); from then on a GPU address is a
//! [`PciAddress`], a severity a [`Severity`], and no stage re-reads raw log text to learn them.

mod config_issue;
mod evidence;
mod finding;
mod incident;
mod pci;
mod stamp;
mod verification;

pub use config_issue::ConfigIssue;
pub use evidence::{Evidence, StepResult, StepStatus};
pub use finding::{
    BlockedTask, Detail, Finding, FindingKind, GpuIdentity, NvlinkDecode, Origin, RecoveryAction,
};
pub use incident::{EchoCount, Incident, IncidentPhase, Superseded};
pub use pci::{PciAddress, PciParseError};
pub use stamp::Stamp;
pub use verification::{Reached, Verification};

use serde::{Deserialize, Serialize};
use std::fmt;

/// How loud a finding is. Ordered: `Info < Warning < Critical`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth recording, never worth waking anyone.
    Info,
    /// Something is wrong; a person should look during working hours.
    Warning,
    /// The GPU (or the job on it) is down or about to be; page the on-call.
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "info" => Some(Severity::Info),
            "warning" => Some(Severity::Warning),
            "critical" => Some(Severity::Critical),
            _ => None,
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// xidwatch's own grouping of faults, used to pick runbooks and to word alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// The application did something wrong (bad address, illegal instruction); the GPU is fine.
    Application,
    /// The driver or its communication with the GPU failed.
    Driver,
    /// Memory errors: ECC, row remapping, poison, page retirement.
    Memory,
    /// The PCIe link or the bus itself: fallen off the bus, AER.
    Pcie,
    /// NVLink and NVSwitch fabric.
    Nvlink,
    /// GSP firmware, its RPC channel and other on-GPU firmware.
    Gsp,
    /// Temperature, power and clocks.
    ThermalPower,
    /// Confidential-computing and security engine faults.
    ConfidentialComputing,
    /// Notices that change nothing by themselves.
    Informational,
}

impl Category {
    pub const ALL: [Category; 9] = [
        Category::Application,
        Category::Driver,
        Category::Memory,
        Category::Pcie,
        Category::Nvlink,
        Category::Gsp,
        Category::ThermalPower,
        Category::ConfidentialComputing,
        Category::Informational,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Application => "application",
            Category::Driver => "driver",
            Category::Memory => "memory",
            Category::Pcie => "pcie",
            Category::Nvlink => "nvlink",
            Category::Gsp => "gsp",
            Category::ThermalPower => "thermal_power",
            Category::ConfidentialComputing => "confidential_computing",
            Category::Informational => "informational",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Category::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Words for people, e.g. in `explain` output.
    pub fn label(self) -> &'static str {
        match self {
            Category::Application => "application",
            Category::Driver => "driver",
            Category::Memory => "memory",
            Category::Pcie => "bus / PCIe",
            Category::Nvlink => "NVLink / NVSwitch",
            Category::Gsp => "GSP / firmware",
            Category::ThermalPower => "thermal / power",
            Category::ConfidentialComputing => "confidential computing",
            Category::Informational => "informational",
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Interns a name (a shape id, a shape table's literal) for the life of the process: findings
/// carry shape ids as `&'static str` (cheap to copy into every finding and incident), and a
/// reload that builds the site's rows again gets back the strings it had, so reloading often
/// does not grow memory. Bounded by the distinct names ever configured.
pub fn intern(name: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    static NAMES: OnceLock<Mutex<HashSet<&'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = names.get(name) {
        return n;
    }
    let leaked: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// The longest correlation window (and probe interval) accepted anywhere: 30 days.
pub const MAX_WINDOW_SECS: u64 = 30 * 24 * 3600;

/// FNV-1a over a sequence of fields (each closed by a separator byte, so ("ab", "c") and
/// ("a", "bc") differ): for ids and fingerprints that must stay the same across Rust releases,
/// which `DefaultHasher` does not promise.
#[derive(Debug, Clone, Copy)]
pub struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Adds one field.
    pub fn eat(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 ^= 0xff;
        self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
    }

    pub fn finish(self) -> u64 {
        self.0
    }
}
