//! NVML queries a runbook step may ask for, and the seam through which they are answered.
//!
//! The runbook stage does not load NVML itself: whoever owns the NVML handle (the NVML source)
//! implements [`NvmlProbe`] and puts it in the [`RunbookEnv`](super::RunbookEnv). Without one,
//! `nvml` steps are skipped with the reason recorded.

use std::fmt;

use crate::model::PciAddress;

/// Read-only NVML queries, by what they report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NvmlQuery {
    /// Volatile and aggregate ECC error counts.
    EccErrors,
    /// Remapped rows (correctable, uncorrectable, pending, failure).
    RemappedRows,
    /// Retired pages and pending retirements.
    RetiredPages,
    /// Temperatures and their slowdown and shutdown thresholds.
    Temperature,
    /// Power draw and limits.
    Power,
    /// Current and maximum clocks.
    Clocks,
    /// Active clock event (throttle) reasons.
    ThrottleReasons,
    /// PCIe link generation and width, current and maximum; replay counter.
    PcieLink,
    /// NVLink state and error counters per link.
    Nvlink,
    /// Compute processes on the GPU.
    Processes,
    /// Name, UUID, serial, VBIOS and driver version.
    Identity,
}

impl NvmlQuery {
    pub const ALL: [NvmlQuery; 11] = [
        NvmlQuery::EccErrors,
        NvmlQuery::RemappedRows,
        NvmlQuery::RetiredPages,
        NvmlQuery::Temperature,
        NvmlQuery::Power,
        NvmlQuery::Clocks,
        NvmlQuery::ThrottleReasons,
        NvmlQuery::PcieLink,
        NvmlQuery::Nvlink,
        NvmlQuery::Processes,
        NvmlQuery::Identity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            NvmlQuery::EccErrors => "ecc_errors",
            NvmlQuery::RemappedRows => "remapped_rows",
            NvmlQuery::RetiredPages => "retired_pages",
            NvmlQuery::Temperature => "temperature",
            NvmlQuery::Power => "power",
            NvmlQuery::Clocks => "clocks",
            NvmlQuery::ThrottleReasons => "throttle_reasons",
            NvmlQuery::PcieLink => "pcie_link",
            NvmlQuery::Nvlink => "nvlink",
            NvmlQuery::Processes => "processes",
            NvmlQuery::Identity => "identity",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        NvmlQuery::ALL.into_iter().find(|q| q.as_str() == s)
    }
}

impl fmt::Display for NvmlQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an NVML query gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlError {
    /// This GPU or driver does not support the query.
    NotSupported,
    /// NVML knows no GPU at this address.
    GpuNotFound,
    /// Anything else, in NVML's words.
    Failed(String),
}

/// Answers NVML queries. Implementations may block (NVML calls do); the runner calls them on a
/// blocking thread under the step's timeout.
pub trait NvmlProbe: Send + Sync {
    /// The answer as text for people, one `key: value` per line.
    fn query(&self, query: NvmlQuery, gpu: PciAddress) -> Result<String, NvmlError>;
}
