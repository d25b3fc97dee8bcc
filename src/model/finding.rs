//! A [`Finding`]: one thing the classifier understood, from one or a few physical log lines.

use serde::Serialize;
use std::fmt;

use super::{Category, PciAddress, Severity};

/// What kind of thing was found. Serialised in snake case; these names are part of the
/// `scan --json` and alert payload contracts, so they only ever gain members.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// An NVRM `Xid` line.
    Xid,
    /// An NVSwitch `SXid` line with its continuation lines.
    Sxid,
    /// "GPU has fallen off the bus" without an Xid (or besides one).
    FallenOffBus,
    /// The driver could not initialise a GPU: RmInitAdapter, GSP firmware load, probe failures,
    /// module symbol errors.
    DriverInitFailure,
    /// User-space driver components and the kernel module disagree about the version.
    ApiMismatch,
    /// Other NVRM errors without an Xid: GSP timeouts, RPC trouble, UVM fatal errors.
    DriverError,
    /// A PCIe Advanced Error Reporting line naming a device.
    PcieAer,
    /// A line that ties a PCI address to a UUID or board serial. Info only.
    GpuIdentity,
    /// Kernel log records were lost before xidwatch could read them.
    KmsgOverrun,
    /// A kernel log record's sequence number jumped far ahead or went backwards.
    KmsgSequence,
    /// NVML reported an ECC error event.
    EccError,
    /// NVML reported that the GPU is lost.
    GpuLost,
    /// A GPU present on the PCI bus cannot be reached, or left the bus.
    GpuMissing,
    /// NVML could not be loaded or initialised.
    NvmlUnavailable,
    /// A changed config did not validate; the previous one stays in force.
    ConfigRejected,
    /// An NVML call did not return within its deadline: the driver is wedged (or a GPU is taking
    /// it down). The evidence names the tasks stuck in uninterruptible sleep.
    DriverUnresponsive,
    /// A GPU at or above its temperature threshold for the whole sustain window.
    GpuTemperature,
    /// Hardware slowdown (thermal, power brake or HW slowdown) active for several polls.
    GpuThrottling,
    /// A PCIe link trained below its maximum generation or width while the GPU is busy.
    PcieLinkDegraded,
    /// Row remapping pending or failed, or pages waiting for retirement.
    MemoryRepair,
    /// The volatile double-bit (uncorrectable) ECC count went up.
    EccDbeIncrease,
    /// NVML's GPU recovery action is not "none": the GPU needs a reset (or more) without an Xid.
    RecoveryAction,
    /// Power draw above the enforced limit for the whole sustain window.
    PowerOverLimit,
    /// Persistence mode is off (info).
    PersistenceModeOff,
    /// Something in the GPU inventory changed since the previous boot (a serial, the driver, the
    /// maximum link, a GPU gone).
    InventoryChanged,
    /// A GPU busy or holding memory for the whole window while NVML lists no process on it.
    GpuHeldNoProcess,
    /// A GPU held for the whole window by a pid that is gone or a zombie.
    GpuHeldByGoneProcess,
    /// One process's GPU memory rose through a whole long window without a fall.
    GpuMemoryGrowth,
    /// The GPU's NVSwitch / NVL fabric registration is not complete, or failed.
    FabricNotRegistered,
    /// A systemd unit the GPUs depend on (Fabric Manager, the persistence daemon, IMEX, DCGM)
    /// failed, stopped, or restarts in a loop: a state, open until the unit is active again.
    ServiceDown,
}

impl FindingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::Xid => "xid",
            FindingKind::Sxid => "sxid",
            FindingKind::FallenOffBus => "fallen_off_bus",
            FindingKind::DriverInitFailure => "driver_init_failure",
            FindingKind::ApiMismatch => "api_mismatch",
            FindingKind::DriverError => "driver_error",
            FindingKind::PcieAer => "pcie_aer",
            FindingKind::GpuIdentity => "gpu_identity",
            FindingKind::KmsgOverrun => "kmsg_overrun",
            FindingKind::KmsgSequence => "kmsg_sequence",
            FindingKind::EccError => "ecc_error",
            FindingKind::GpuLost => "gpu_lost",
            FindingKind::GpuMissing => "gpu_missing",
            FindingKind::NvmlUnavailable => "nvml_unavailable",
            FindingKind::ConfigRejected => "config_rejected",
            FindingKind::DriverUnresponsive => "driver_unresponsive",
            FindingKind::GpuTemperature => "gpu_temperature",
            FindingKind::GpuThrottling => "gpu_throttling",
            FindingKind::PcieLinkDegraded => "pcie_link_degraded",
            FindingKind::MemoryRepair => "memory_repair",
            FindingKind::EccDbeIncrease => "ecc_dbe_increase",
            FindingKind::RecoveryAction => "recovery_action",
            FindingKind::PowerOverLimit => "power_over_limit",
            FindingKind::PersistenceModeOff => "persistence_mode_off",
            FindingKind::InventoryChanged => "inventory_changed",
            FindingKind::GpuHeldNoProcess => "gpu_held_no_process",
            FindingKind::GpuHeldByGoneProcess => "gpu_held_by_gone_process",
            FindingKind::GpuMemoryGrowth => "gpu_memory_growth",
            FindingKind::FabricNotRegistered => "fabric_not_registered",
            FindingKind::ServiceDown => "service_down",
        }
    }

    pub const ALL: [FindingKind; 30] = [
        FindingKind::Xid,
        FindingKind::Sxid,
        FindingKind::FallenOffBus,
        FindingKind::DriverInitFailure,
        FindingKind::ApiMismatch,
        FindingKind::DriverError,
        FindingKind::PcieAer,
        FindingKind::GpuIdentity,
        FindingKind::KmsgOverrun,
        FindingKind::EccError,
        FindingKind::GpuLost,
        FindingKind::GpuMissing,
        FindingKind::NvmlUnavailable,
        FindingKind::ConfigRejected,
        FindingKind::KmsgSequence,
        FindingKind::DriverUnresponsive,
        FindingKind::GpuTemperature,
        FindingKind::GpuThrottling,
        FindingKind::PcieLinkDegraded,
        FindingKind::MemoryRepair,
        FindingKind::EccDbeIncrease,
        FindingKind::RecoveryAction,
        FindingKind::PowerOverLimit,
        FindingKind::PersistenceModeOff,
        FindingKind::InventoryChanged,
        FindingKind::GpuHeldNoProcess,
        FindingKind::GpuHeldByGoneProcess,
        FindingKind::GpuMemoryGrowth,
        FindingKind::FabricNotRegistered,
        FindingKind::ServiceDown,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        FindingKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identity of the GPU a finding is about, as far as the log (or NVML) told us.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GpuIdentity {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl GpuIdentity {
    pub fn is_empty(&self) -> bool {
        self.index.is_none() && self.uuid.is_none() && self.serial.is_none() && self.name.is_none()
    }
}

/// Where a finding came from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Origin {
    /// 1-based number of the first physical line in the scanned input (0 for live sources).
    pub line: u64,
    /// How many physical lines (or kmsg records) the finding covers.
    pub lines: u32,
    /// Kernel log sequence number of the first record, for live kmsg.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Kernel timestamp in microseconds since boot, when the input carried one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ts_usec: Option<u64>,
    /// The timestamp text the input carried (`[ 9512.238711]`, `Nov 29 08:14:03`, ...), verbatim.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<super::Stamp>,
    /// The message lines as read (prefixes removed), for the evidence.
    pub raw: Vec<String>,
    /// Each raw line's own kernel timestamp, where the lines were read from records of their
    /// own (a detail line under an Xid); missing entries are the finding's [`Origin::ts_usec`].
    #[serde(skip)]
    pub raw_ts_usec: Vec<Option<u64>>,
}

impl Origin {
    /// The kernel timestamp of raw line `i`: its own where it had one, else the finding's.
    pub fn line_ts(&self, i: usize) -> Option<u64> {
        self.raw_ts_usec.get(i).copied().flatten().or(self.ts_usec)
    }
}

/// The NVIDIA recovery action carried by Xid 154.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "action", content = "text")]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    DrainP2p,
    DrainAndReset,
    OsReboot,
    PfFlr,
    /// R595's Xid 154 action for GPUs of a multi-node NVLink (IMEX) domain: the domain's memory
    /// export must be recovered, which touches every node sharing it, not just this GPU.
    RecoverImexDomain,
    /// NVML's newer recovery value: a PCIe bus reset of the GPU (more than a GPU reset, less
    /// than a reboot).
    BusReset,
    /// NVML's newer recovery value: the whole system must be rebooted.
    SystemReboot,
    /// A value this version does not know, kept as the driver wrote it.
    Other(String),
}

impl RecoveryAction {
    /// Parses the driver's words ("GPU Reset Required", "Node Reboot Required", ...).
    pub fn from_text(text: &str) -> Self {
        let t = text.trim().to_ascii_lowercase();
        let t = t.trim_end_matches(" required").trim();
        match t {
            "none" => RecoveryAction::None,
            "gpu reset" | "reset gpu" => RecoveryAction::GpuReset,
            "node reboot" | "reboot node" => RecoveryAction::NodeReboot,
            "drain p2p" => RecoveryAction::DrainP2p,
            "drain and reset" => RecoveryAction::DrainAndReset,
            "os reboot" => RecoveryAction::OsReboot,
            "pf flr" => RecoveryAction::PfFlr,
            "recover imex domain" | "imex domain recovery" => RecoveryAction::RecoverImexDomain,
            "bus reset" | "gpu bus reset" => RecoveryAction::BusReset,
            "system reboot" | "reboot system" => RecoveryAction::SystemReboot,
            _ => RecoveryAction::Other(text.trim().to_string()),
        }
    }

    /// How serious the requested action is for the on-call.
    pub fn severity(&self) -> Severity {
        match self {
            RecoveryAction::None => Severity::Info,
            RecoveryAction::DrainP2p => Severity::Warning,
            _ => Severity::Critical,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            RecoveryAction::None => "none".into(),
            RecoveryAction::GpuReset => "GPU reset required".into(),
            RecoveryAction::NodeReboot => "node reboot required".into(),
            RecoveryAction::DrainP2p => "drain peer-to-peer traffic".into(),
            RecoveryAction::DrainAndReset => "drain, then reset".into(),
            RecoveryAction::OsReboot => "OS reboot required".into(),
            RecoveryAction::PfFlr => "PCIe function-level reset required".into(),
            RecoveryAction::RecoverImexDomain => {
                "recover the IMEX domain (every node sharing its NVLink memory)".into()
            }
            RecoveryAction::BusReset => "PCIe bus reset required".into(),
            RecoveryAction::SystemReboot => "system reboot required".into(),
            RecoveryAction::Other(s) => s.clone(),
        }
    }
}

/// One row of NVIDIA's NVLink5 (Xid 144-150) decode table that matched a logged register pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvlinkDecode {
    /// `V1` (drivers before R575) or `V2` (R575 and later).
    pub layout: &'static str,
    pub unit: &'static str,
    pub severity: &'static str,
    pub immediate: &'static str,
    pub investigatory: &'static str,
    pub origin: &'static str,
}

/// Fields some findings carry beyond the common ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Detail {
    /// Xid 13 graphics engine exception location.
    GraphicsException { gpc: u32, tpc: u32, sm: u32 },
    /// Xid 74 NVLink fatal error.
    NvlinkError { link: u32, registers: Vec<u32> },
    /// NVLink5 Xids 144-150.
    Nvlink5 {
        unit: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        link: Option<u32>,
        intr_info: u32,
        error_status: u32,
        /// Matching rows of the decode table; both layouts when the driver version is unknown.
        decode: Vec<NvlinkDecode>,
    },
    /// Xid 154.
    Recovery {
        from: RecoveryAction,
        to: RecoveryAction,
    },
    /// The four-line API mismatch message.
    ApiMismatch {
        client_version: String,
        kernel_version: String,
    },
    /// NVSwitch SXid with its continuation lines folded in.
    Sxid {
        fatal: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        link: Option<u32>,
        continuation: Vec<String>,
    },
    /// RmInitAdapter-style failures with the driver's status triple.
    InitFailure {
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
    },
    /// PCIe AER.
    Aer {
        #[serde(skip_serializing_if = "Option::is_none")]
        reporter: Option<PciAddress>,
        class: String,
    },
    /// Lost kernel log records.
    Overrun { lost: u64 },
    /// A watched systemd unit as `systemctl show` last reported it.
    Service {
        /// The unit's name as systemd spells it (`nvidia-fabricmanager.service`).
        unit: String,
        active_state: String,
        sub_state: String,
        /// systemd's `Result` (`exit-code`, `signal`, `timeout`, `success`, ...).
        result: String,
        /// systemd's `NRestarts` counter, when it reported one.
        #[serde(skip_serializing_if = "Option::is_none")]
        restarts: Option<u64>,
        /// Whether this is the restart-loop finding (the unit may be active between restarts).
        restart_loop: bool,
    },
    /// An NVML ECC event: which of the two counters it was about.
    Ecc { double_bit: bool },
    /// An NVML call that missed its deadline, and the tasks in uninterruptible sleep (D state)
    /// at that moment: where a wedged driver holds them is where the on-call looks first.
    DriverUnresponsive {
        /// The NVML call that did not return (`nvmlDeviceGetCount`, ...).
        call: String,
        /// How long it had been running when it was declared stuck.
        waited_ms: u64,
        blocked: Vec<BlockedTask>,
        /// D-state tasks beyond the ones listed.
        #[serde(skip_serializing_if = "is_zero")]
        blocked_omitted: usize,
    },
    /// The memory-repair counters behind a `memory_repair` finding.
    MemoryRepair {
        remap_pending: bool,
        remap_failed: bool,
        pages_pending: bool,
    },
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One task in uninterruptible sleep, as procfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockedTask {
    /// The process (thread group) id.
    pub pid: u32,
    /// The thread id; equal to `pid` for a process's main thread.
    pub tid: u32,
    pub comm: String,
    /// The kernel function it sleeps in (`/proc/PID/task/TID/wchan`), when the kernel says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wchan: Option<String>,
    /// Kernel stack frames, innermost first (`/proc/PID/task/TID/stack`: root only). Empty when
    /// unreadable.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

/// One understood event. Built by the classifier (or a source for NVML/probe signals), consumed by
/// the incident stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub kind: FindingKind,
    /// The Xid (or SXid) number, when the line carried one.
    pub xid: Option<u32>,
    /// The GPU (or NVSwitch) the line named, normalised.
    pub pci: Option<PciAddress>,
    pub pid: Option<u32>,
    pub process: Option<String>,
    pub severity: Severity,
    pub category: Category,
    /// A short headline for people ("GPU has fallen off the bus"). Borrowed where it is fixed
    /// (an Xid's catalog name): a storm's findings share it instead of a copy each.
    pub title: std::borrow::Cow<'static, str>,
    /// The message text after the fixed fields (address, Xid, pid, name).
    pub message: String,
    /// The earlier Xid this one names as its cause ("caused by previous Xid N").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
    #[serde(skip_serializing_if = "GpuIdentity::is_empty")]
    pub gpu: GpuIdentity,
    pub origin: Origin,
    /// When the kernel logged it (wall clock, ms since the epoch), for a kernel log record: a
    /// fault read at start-up may be hours old, and is dated then rather than when it was read.
    /// `None` for other sources, which are dated when seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logged_ms: Option<u64>,
    /// The id of the shape-table row that read the line (`tool.smi-failed`, `site.ib-link-flap`),
    /// for findings a table row made: incidents group by it rather than by the title's words, so
    /// a row's title can be reworded without splitting an open incident. `None` for the shapes
    /// Rust reads (Xid, SXid, AER, the multi-line reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shape: Option<&'static str>,
    /// The NVIDIA kernel module a finding is about, for the shapes where that is what tells two
    /// findings apart when neither names a GPU: the module that printed an error, the module a
    /// task hung in, the module that failed to load. Part of such an incident's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
}

impl Finding {
    /// A finding with the common fields set and everything optional empty.
    pub fn new(
        kind: FindingKind,
        severity: Severity,
        category: Category,
        title: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Self {
        Finding {
            kind,
            xid: None,
            pci: None,
            pid: None,
            process: None,
            severity,
            category,
            title: title.into(),
            message: String::new(),
            caused_by: None,
            detail: None,
            gpu: GpuIdentity::default(),
            origin: Origin::default(),
            logged_ms: None,
            shape: None,
            module: None,
        }
    }
}
