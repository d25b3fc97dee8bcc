//! Health readings: one poll's worth of NVML values per GPU, for the health checks and the
//! per-boot inventory. Read on the NVML worker (one request for every GPU, under the call
//! deadline); what the values mean is decided by `crate::health`, not here.
//!
//! Every reading is optional: NVML answers NOT_SUPPORTED for sensors and features a board does
//! not have (no remapped rows before Ampere, no serial without an infoROM), and a check without
//! its reading simply does not run for that GPU.
//!
//! nvml-wrapper 0.13 has no safe call for the remapped-row counts; they are read through the
//! wrapper's own loaded symbol table (`Nvml::lib`), on the same handle, after checking that the
//! symbol resolved. The GPU recovery action is a field value (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`)
//! read with the wrapper's `field_values_for`.

use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use serde::{Deserialize, Serialize};

use super::{GpuInfo, Opened};
use crate::model::PciAddress;

/// NVML's field id for the recovery action the driver asks for (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
pub const FIELD_RECOVERY_ACTION: u32 = 230;

/// Throttle reason bits (`nvmlClocksThrottleReason*`) that mean the hardware itself slowed the
/// GPU down: HW slowdown, HW thermal slowdown, HW power-brake slowdown.
pub const THROTTLE_HW_SLOWDOWN: u64 = 0x8;
pub const THROTTLE_HW_THERMAL: u64 = 0x40;
pub const THROTTLE_HW_POWER_BRAKE: u64 = 0x80;

/// The remapped-row counters (`nvmlDeviceGetRemappedRows`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RemapCounts {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failed: bool,
}

/// One GPU's readings at one poll.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuReading {
    pub index: u32,
    pub pci: Option<PciAddress>,
    pub temp_c: Option<u32>,
    pub slowdown_c: Option<u32>,
    pub shutdown_c: Option<u32>,
    /// Active clock throttle reasons, NVML's bit mask.
    pub throttle: Option<u64>,
    pub link_gen: Option<u32>,
    pub link_gen_max: Option<u32>,
    pub link_width: Option<u32>,
    pub link_width_max: Option<u32>,
    /// GPU utilization, percent: tells a busy link from one downtrained at idle.
    pub util_pct: Option<u32>,
    pub remap: Option<RemapCounts>,
    pub pages_pending: Option<bool>,
    pub retired_sbe: Option<u32>,
    pub retired_dbe: Option<u32>,
    pub dbe_volatile: Option<u64>,
    pub dbe_aggregate: Option<u64>,
    /// NVML's recovery action value: 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain
    /// and reset.
    pub recovery: Option<u32>,
    pub power_mw: Option<u32>,
    pub limit_mw: Option<u32>,
    pub persistence: Option<bool>,
    pub ecc_enabled: Option<bool>,
    /// Frame-buffer memory allocated, bytes (`nvmlDeviceGetMemoryInfo`).
    #[serde(default)]
    pub mem_used: Option<u64>,
    /// The compute and graphics processes NVML lists on the GPU; `None` when neither list could
    /// be read (then the holder checks do not run: "no list" must not read as "no process").
    #[serde(default)]
    pub procs: Option<Vec<GpuProcess>>,
    /// The GPU's fabric registration (NVSwitch / NVL systems); `None` where NVML does not
    /// report it.
    #[serde(default)]
    pub fabric: Option<FabricReading>,
    /// NVML said the GPU is lost while it was read.
    pub lost: bool,
}

/// One process NVML lists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuProcess {
    /// The pid as NVML gives it.
    pub pid: u32,
    /// GPU memory the process holds, bytes; `None` where NVML cannot say (MIG, some drivers).
    pub used: Option<u64>,
    /// Listed by the graphics call (not the compute one).
    pub graphics: bool,
    /// What procfs says about the pid; filled in by the health task, not the worker.
    #[serde(default)]
    pub look: Option<ProcLook>,
}

/// NVML's fabric registration values (`nvmlGpuFabricInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FabricReading {
    /// `NVML_GPU_FABRIC_STATE_*`: 0 not supported, 1 not started, 2 in progress, 3 completed.
    pub state: u8,
    /// The registration's own result, an NVML return code (0 = success).
    pub status: u32,
    pub clique_id: u32,
    /// The cluster UUID, hex.
    pub cluster_uuid: String,
}

/// `NVML_GPU_FABRIC_STATE_*`.
pub const FABRIC_NOT_SUPPORTED: u8 = 0;
pub const FABRIC_NOT_STARTED: u8 = 1;
pub const FABRIC_IN_PROGRESS: u8 = 2;
pub const FABRIC_COMPLETED: u8 = 3;

/// Reads every GPU of the inventory. Blocks in NVML calls: only the worker calls it.
pub(super) fn read_all(nvml: &Nvml, opened: &Opened) -> Vec<GpuReading> {
    opened.inventory.iter().map(|g| read_one(nvml, g)).collect()
}

/// The VBIOS version of every GPU of the inventory, in its order.
pub(super) fn read_vbios(nvml: &Nvml, opened: &Opened) -> Vec<Option<String>> {
    opened
        .inventory
        .iter()
        .map(|g| {
            nvml.device_by_index(g.index)
                .and_then(|d| d.vbios_version())
                .ok()
        })
        .collect()
}

fn read_one(nvml: &Nvml, g: &GpuInfo) -> GpuReading {
    let mut r = GpuReading {
        index: g.index,
        pci: Some(g.pci),
        ..GpuReading::default()
    };
    let d = match nvml.device_by_index(g.index) {
        Ok(d) => d,
        Err(e) => {
            r.lost = matches!(e, NvmlError::GpuLost);
            return r;
        }
    };
    let mut lost = false;
    r.temp_c = ok(&mut lost, d.temperature(TemperatureSensor::Gpu));
    r.slowdown_c = ok(
        &mut lost,
        d.temperature_threshold(TemperatureThreshold::Slowdown),
    );
    r.shutdown_c = ok(
        &mut lost,
        d.temperature_threshold(TemperatureThreshold::Shutdown),
    );
    r.throttle = ok(&mut lost, d.current_throttle_reasons().map(|t| t.bits()));
    r.link_gen = ok(&mut lost, d.current_pcie_link_gen());
    r.link_gen_max = ok(&mut lost, d.max_pcie_link_gen());
    r.link_width = ok(&mut lost, d.current_pcie_link_width());
    r.link_width_max = ok(&mut lost, d.max_pcie_link_width());
    r.util_pct = ok(&mut lost, d.utilization_rates().map(|u| u.gpu));
    r.remap = ok(&mut lost, remapped_rows(nvml, &d));
    r.pages_pending = ok(&mut lost, d.are_pages_pending_retired());
    r.retired_sbe = ok(
        &mut lost,
        d.retired_pages(RetirementCause::MultipleSingleBitEccErrors)
            .map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)),
    );
    r.retired_dbe = ok(
        &mut lost,
        d.retired_pages(RetirementCause::DoubleBitEccError)
            .map(|p| u32::try_from(p.len()).unwrap_or(u32::MAX)),
    );
    r.dbe_volatile = ok(
        &mut lost,
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile),
    );
    r.dbe_aggregate = ok(
        &mut lost,
        d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Aggregate),
    );
    r.recovery = ok(&mut lost, recovery_action(&d));
    r.power_mw = ok(&mut lost, d.power_usage());
    r.limit_mw = ok(&mut lost, d.enforced_power_limit());
    r.persistence = ok(&mut lost, d.is_in_persistent_mode());
    r.ecc_enabled = ok(&mut lost, d.is_ecc_enabled().map(|e| e.currently_enabled));
    r.mem_used = ok(&mut lost, d.memory_info().map(|m| m.used));
    r.procs = processes(&mut lost, &d);
    r.fabric = ok(&mut lost, fabric_info(nvml, &d));
    r.lost = lost;
    r
}

/// The value, or `None` (noting a lost GPU): a reading that fails skips its check only.
fn ok<T>(lost: &mut bool, res: Result<T, NvmlError>) -> Option<T> {
    match res {
        Ok(v) => Some(v),
        Err(NvmlError::GpuLost) => {
            *lost = true;
            None
        }
        Err(_) => None,
    }
}

/// Both process lists. One list that cannot be read (graphics is NOT_SUPPORTED on many compute
/// boards) leaves the other; neither gives `None`.
fn processes(lost: &mut bool, d: &Device) -> Option<Vec<GpuProcess>> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let compute = ok(lost, d.running_compute_processes());
    let graphics = ok(lost, d.running_graphics_processes());
    if compute.is_none() && graphics.is_none() {
        return None;
    }
    let mut out: Vec<GpuProcess> = Vec::new();
    for (list, is_graphics) in [(compute, false), (graphics, true)] {
        for p in list.unwrap_or_default() {
            // A process with both contexts is listed by both calls: once is enough.
            if out.iter().any(|o| o.pid == p.pid) {
                continue;
            }
            out.push(GpuProcess {
                pid: p.pid,
                used: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                },
                graphics: is_graphics,
                look: None,
            });
        }
    }
    Some(out)
}

/// `nvmlDeviceGetGpuFabricInfo`, which nvml-wrapper 0.13 loads but does not wrap. The v1 call
/// carries the four values the check needs (state, status, clique, cluster) on every driver that
/// reports fabric registration; NOT_SUPPORTED (the call, or state 0) is a system without it.
pub(super) fn fabric_info(nvml: &Nvml, d: &Device) -> Result<FabricReading, NvmlError> {
    let lib = nvml.lib();
    // The sys crate's method `expect`s the symbol: a library without it must not get there.
    if lib.nvmlDeviceGetGpuFabricInfo.is_err() {
        return Err(NvmlError::NotSupported);
    }
    let mut info = nvml_wrapper_sys::bindings::nvmlGpuFabricInfo_t {
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
    };
    // SAFETY: the symbol resolved (checked above); the handle comes from the live `Nvml` that
    // `d` borrows; the out-pointer is a valid local of the call's struct type.
    let code = unsafe { lib.nvmlDeviceGetGpuFabricInfo(d.handle(), &mut info) };
    nvml_wrapper::error::nvml_try(code)?;
    if info.state == FABRIC_NOT_SUPPORTED {
        return Err(NvmlError::NotSupported);
    }
    Ok(FabricReading {
        state: info.state,
        status: info.status,
        clique_id: info.cliqueId,
        cluster_uuid: info
            .clusterUuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect(),
    })
}

/// `nvmlDeviceGetRemappedRows`, which nvml-wrapper 0.13 loads but does not wrap.
pub(super) fn remapped_rows(nvml: &Nvml, d: &Device) -> Result<RemapCounts, NvmlError> {
    let lib = nvml.lib();
    // The sys crate's method `expect`s the symbol: a library without it must not get there.
    if lib.nvmlDeviceGetRemappedRows.is_err() {
        return Err(NvmlError::NotSupported);
    }
    let (mut corr, mut unc, mut pending, mut failed) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: the symbol resolved (checked above); the handle comes from the live `Nvml` that
    // `d` borrows; the four out-pointers are valid locals.
    let code = unsafe {
        lib.nvmlDeviceGetRemappedRows(d.handle(), &mut corr, &mut unc, &mut pending, &mut failed)
    };
    nvml_wrapper::error::nvml_try(code)?;
    Ok(RemapCounts {
        correctable: corr,
        uncorrectable: unc,
        pending: pending != 0,
        failed: failed != 0,
    })
}

fn recovery_action(d: &Device) -> Result<u32, NvmlError> {
    let mut values = d.field_values_for(&[FieldId(FIELD_RECOVERY_ACTION)])?;
    let sample = values.pop().ok_or(NvmlError::NotSupported)??;
    match sample.value? {
        SampleValue::U32(v) => Ok(v),
        SampleValue::U64(v) => Ok(u32::try_from(v).unwrap_or(u32::MAX)),
        SampleValue::I64(v) => Ok(u32::try_from(v).unwrap_or(u32::MAX)),
        SampleValue::F64(_) => Err(NvmlError::NotSupported),
    }
}

/// What procfs says about one pid.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ProcLook {
    pub state: Liveness,
    /// The program name (`comm`), cleaned for the page.
    pub comm: Option<String>,
    pub uid: Option<u32>,
    /// The user name for `uid`, where the system's user database knows it.
    pub user: Option<String>,
    /// The job from the cgroup: Slurm job and step, Kubernetes pod and container, systemd unit.
    pub job: Option<String>,
    /// The pid inside the process's own (innermost) pid namespace, when that is another one.
    pub ns_pid: Option<u32>,
}

/// Whether a pid is a process in xidwatch's pid namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    #[default]
    Running,
    /// Exited, and not yet reaped by its parent (state `Z`).
    Zombie,
    /// No such pid here: it exited, or it lives in a pid namespace xidwatch cannot see.
    Absent,
}
