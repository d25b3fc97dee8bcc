//! The ids of the shapes Rust reads; the table's rows carry theirs in `shapes.toml`. Every
//! finding the classifier makes names the shape that read it: incidents of errors that name no
//! GPU group by it, and guidance is chosen by it, so a title can be reworded without splitting
//! an open incident or changing its advice. An id's family is the part before its first dot.

pub const XID: &str = "xid";
pub const XID_UNREADABLE: &str = "xid.unreadable";
pub const SXID: &str = "sxid";
pub const AER: &str = "aer.error";
pub const AER_STATUS: &str = "aer.status";
/// A firmware-first (APEI/CPER) PCIe error record of an NVIDIA device.
pub const AER_APEI: &str = "aer.apei";
pub const GPU_UUID: &str = "identity.uuid";
pub const BOARD_SERIAL: &str = "identity.serial";
pub const FALLEN_OFF_BUS: &str = "bus.fallen-off";
/// The tail of the three-line fall without its head.
pub const FALLEN_OFF_BUS_TAIL: &str = "bus.fallen-off-tail";
/// `The NVIDIA GPU <addr> ... has fallen off the bus and is not responding to commands.`
pub const NOT_RESPONDING: &str = "bus.not-responding";
pub const RC_ALL_CHANNELS_79: &str = "bus.rc-all-channels";
pub const RC_ALL_CHANNELS: &str = "driver.rc-all-channels";
pub const INIT_RM_ADAPTER: &str = "init.rm-init-adapter";
pub const INIT_MODULE: &str = "init.module-failed";
pub const INIT_FIRMWARE_BOOT: &str = "init.firmware-boot";
pub const INIT_FIRMWARE_LOAD: &str = "init.firmware-load";
pub const INIT_PROBE_DRIVER: &str = "init.probe-driver";
pub const INIT_PROBE: &str = "init.probe-error";
pub const INIT_VERSION_MAGIC: &str = "init.version-magic";
/// A module loader (`modprobe`, `systemd-modules-load`) that could not load an NVIDIA module.
pub const INIT_MODULE_LOAD: &str = "init.module-load";
/// An NVIDIA module refused a symbol (GPL-only symbols, unknown symbols).
pub const INIT_MODULE_SYMBOL: &str = "init.module-symbol";
pub const INIT_X_GPU: &str = "init.x-server-gpu";
pub const INIT_X_MODULE: &str = "init.x-server-module";
pub const API_MISMATCH: &str = "api.mismatch";
/// The kernel-version line of an API mismatch whose head was lost.
pub const API_MISMATCH_TAIL: &str = "api.mismatch-tail";
pub const API_VERSION_MISMATCH: &str = "api.version-mismatch";
pub const GSP_RPC_DUMP: &str = "gsp.rpc-dump";
pub const GSP_CRASH: &str = "gsp.crash";
pub const NOT_SUPPORTED: &str = "driver.not-supported";
/// `The NVIDIA GPU ... installed in this system requires use of the NVIDIA open kernel modules.`
pub const NEEDS_OPEN_MODULES: &str = "driver.needs-open-modules";
pub const DRIVER_ERROR: &str = "driver.error";
pub const DRIVER_FATAL: &str = "driver.fatal";
/// An error of one NVIDIA module (`nvidia-drm`, `nvidia`); the finding's module says which.
pub const MODULE_ERROR: &str = "module.error";
pub const TOOL_ERROR: &str = "tool.error";
pub const CALL_TRACE: &str = "trace.call";
pub const HUNG_TASK: &str = "trace.hung-task";
/// A crash in core kernel code on a kernel whose only out-of-tree modules are NVIDIA's.
pub const CORE_CRASH_NVIDIA_TAINTED: &str = "trace.core-nvidia-tainted";
pub const FM_SXID: &str = "fabricmanager.sxid";
pub const FM_ABORTED_TOPOLOGY: &str = "fabricmanager.aborted-topology";
pub const FM_ABORTED: &str = "fabricmanager.aborted";
pub const FM_GPU_HANDLE: &str = "fabricmanager.gpu-handle-missing";
pub const FM_SWITCH_DRIVER: &str = "fabricmanager.switch-driver-request";
pub const FM_ERROR: &str = "fabricmanager.error";

/// Every id above, for the checks that no two shapes (and no site row) share one.
pub const ALL: &[&str] = &[
    XID,
    XID_UNREADABLE,
    SXID,
    AER,
    AER_STATUS,
    AER_APEI,
    GPU_UUID,
    BOARD_SERIAL,
    FALLEN_OFF_BUS,
    FALLEN_OFF_BUS_TAIL,
    NOT_RESPONDING,
    RC_ALL_CHANNELS_79,
    RC_ALL_CHANNELS,
    INIT_RM_ADAPTER,
    INIT_MODULE,
    INIT_FIRMWARE_BOOT,
    INIT_FIRMWARE_LOAD,
    INIT_PROBE_DRIVER,
    INIT_PROBE,
    INIT_VERSION_MAGIC,
    INIT_MODULE_LOAD,
    INIT_MODULE_SYMBOL,
    INIT_X_GPU,
    INIT_X_MODULE,
    API_MISMATCH,
    API_MISMATCH_TAIL,
    API_VERSION_MISMATCH,
    GSP_RPC_DUMP,
    GSP_CRASH,
    NOT_SUPPORTED,
    NEEDS_OPEN_MODULES,
    DRIVER_ERROR,
    DRIVER_FATAL,
    MODULE_ERROR,
    TOOL_ERROR,
    CALL_TRACE,
    HUNG_TASK,
    CORE_CRASH_NVIDIA_TAINTED,
    FM_SXID,
    FM_ABORTED_TOPOLOGY,
    FM_ABORTED,
    FM_GPU_HANDLE,
    FM_SWITCH_DRIVER,
    FM_ERROR,
];

/// The family of a shape id: `init` for `init.probe-error`, `xid` for `xid`.
pub fn family(id: &str) -> &str {
    id.split_once('.').map_or(id, |(f, _)| f)
}
