//! NVML queries a runbook step may ask for, and the seam through which they are answered.
//!
//! The runbook stage does not load NVML itself: the NVML worker, which owns the one NVML handle,
//! implements [`NvmlProbe`], and the daemon puts it in the runbook environment. Without one,
//! `nvml` steps are skipped with the reason recorded. The types live here, beside the source, so
//! the runbook stage depends on the source and not the other way round.

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

/// Answers NVML queries. Implementations may block (NVML calls do) up to their own deadline; the
/// runner calls them on a blocking thread under the step's timeout.
pub trait NvmlProbe: Send + Sync {
    /// The answer as text for people, one `key: value` per line.
    fn query(&self, query: NvmlQuery, gpu: PciAddress) -> Result<String, NvmlError>;
}

/// Answers one query through the worker's NVML handle. Remapped rows, which nvml-wrapper 0.13
/// does not wrap, are read through its loaded symbol table (see `health`); NVLink counters say
/// "not supported" instead of guessing; the shipped runbooks also ask nvidia-smi for those.
pub(super) fn answer(
    nvml: &nvml_wrapper::Nvml,
    opened: &super::Opened,
    query: NvmlQuery,
    gpu: PciAddress,
) -> Result<String, NvmlError> {
    use nvml_wrapper::enum_wrappers::device::{
        Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
    };
    use nvml_wrapper::error::NvmlError as WrapperError;
    use NvmlError as E;
    use NvmlQuery as Q;
    let info = opened
        .inventory
        .iter()
        .find(|g| g.pci == gpu)
        .ok_or(E::GpuNotFound)?;
    let fail = |e: WrapperError| match e {
        WrapperError::NotSupported => E::NotSupported,
        other => E::Failed(other.to_string()),
    };
    if query == Q::Identity {
        return Ok(format!(
            "index: {}\npci: {}\nname: {}\nuuid: {}\nserial: {}\ndriver: {}",
            info.index,
            info.pci,
            info.name.as_deref().unwrap_or("?"),
            info.uuid.as_deref().unwrap_or("?"),
            info.serial.as_deref().unwrap_or("?"),
            opened.driver_version.as_deref().unwrap_or("?"),
        ));
    }
    let d = nvml.device_by_index(info.index).map_err(fail)?;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k}: {v}\n"));
    match query {
        Q::EccErrors => {
            for (name, err, counter) in [
                (
                    "corrected_volatile",
                    MemoryError::Corrected,
                    EccCounter::Volatile,
                ),
                (
                    "uncorrected_volatile",
                    MemoryError::Uncorrected,
                    EccCounter::Volatile,
                ),
                (
                    "corrected_aggregate",
                    MemoryError::Corrected,
                    EccCounter::Aggregate,
                ),
                (
                    "uncorrected_aggregate",
                    MemoryError::Uncorrected,
                    EccCounter::Aggregate,
                ),
            ] {
                line(
                    name,
                    d.total_ecc_errors(err, counter).map_err(fail)?.to_string(),
                );
            }
        }
        Q::RetiredPages => {
            line(
                "pending_retirement",
                d.are_pages_pending_retired().map_err(fail)?.to_string(),
            );
            for (name, cause) in [
                (
                    "retired_single_bit",
                    RetirementCause::MultipleSingleBitEccErrors,
                ),
                ("retired_double_bit", RetirementCause::DoubleBitEccError),
            ] {
                line(
                    name,
                    d.retired_pages(cause).map_err(fail)?.len().to_string(),
                );
            }
        }
        Q::Temperature => line(
            "gpu_celsius",
            d.temperature(TemperatureSensor::Gpu)
                .map_err(fail)?
                .to_string(),
        ),
        Q::Power => {
            line(
                "draw_milliwatts",
                d.power_usage().map_err(fail)?.to_string(),
            );
            line(
                "limit_milliwatts",
                d.enforced_power_limit().map_err(fail)?.to_string(),
            );
        }
        Q::Clocks => {
            for (name, clock) in [
                ("graphics", Clock::Graphics),
                ("sm", Clock::SM),
                ("memory", Clock::Memory),
            ] {
                let now = d.clock_info(clock).map_err(fail)?;
                let max = d.max_clock_info(clock).map_err(fail)?;
                line(&format!("{name}_mhz"), format!("{now} of {max}"));
            }
        }
        Q::ThrottleReasons => line(
            "active",
            format!("{:?}", d.current_throttle_reasons().map_err(fail)?),
        ),
        Q::PcieLink => {
            line(
                "gen",
                format!(
                    "{} of {}",
                    d.current_pcie_link_gen().map_err(fail)?,
                    d.max_pcie_link_gen().map_err(fail)?
                ),
            );
            line(
                "width",
                format!(
                    "x{} of x{}",
                    d.current_pcie_link_width().map_err(fail)?,
                    d.max_pcie_link_width().map_err(fail)?
                ),
            );
            line(
                "replay_counter",
                d.pcie_replay_counter().map_err(fail)?.to_string(),
            );
        }
        Q::Processes => {
            for p in d.running_compute_processes().map_err(fail)? {
                let mem = match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => {
                        format!("{} MiB", b >> 20)
                    }
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => "?".into(),
                };
                line(&format!("pid {}", p.pid), mem);
            }
        }
        Q::RemappedRows => {
            let r = super::health::remapped_rows(nvml, &d).map_err(fail)?;
            line("correctable", r.correctable.to_string());
            line("uncorrectable", r.uncorrectable.to_string());
            line("pending", r.pending.to_string());
            line("failure", r.failed.to_string());
        }
        Q::Nvlink => return Err(E::NotSupported),
        Q::Identity => {}
    }
    Ok(out)
}
