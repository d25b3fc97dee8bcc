//! The shapes of the lines the NVIDIA driver, the kernel and the NVIDIA tools print, as pure
//! parsers from one message line (prefix already removed) to a typed [`Shape`].
//!
//! The hot shapes (the Xid and SXid lines that make up a storm) are read by a hand-written parser
//! without backtracking; regexes are kept for rare shapes and each is compiled the first time a
//! line needs it, so a short scan does not pay for compiling all of them.
//!
//! The general rule behind the enumerated shapes: a line from an NVIDIA kernel module (NVRM,
//! nvidia, nvidia-modeset, nvidia-drm, nvidia-uvm, nvidia-nvlink, nvidia-nvswitch) that carries an
//! error signal is at least a warning ([`Shape::DriverError`]); known-harmless notices stay quiet.

use std::sync::OnceLock;

use regex::Regex;

use crate::model::PciAddress;

/// One understood message line, before catalog lookup and multi-line folding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    Xid(XidLine),
    /// A Fabric Manager record that is an error (its own log file, or the journal's copy).
    FabricManager(crate::classify::fabricmanager::FmEvent),
    /// `NVRM: GPU at PCI:0000:17:00: GPU-...`
    GpuUuid {
        pci: PciAddress,
        uuid: String,
    },
    /// `NVRM: GPU Board Serial Number: ...` (applies to the GPU named just before).
    BoardSerial(String),
    /// A one-line fallen-off-the-bus message.
    FallenOffBus {
        pci: Option<PciAddress>,
    },
    /// `NVRM: RC all channels for critical error N.`
    RcAllChannels {
        code: u32,
    },
    /// First line of the three-line message, `NVRM: The NVIDIA GPU 0000:17:00.0`; what follows
    /// decides whether it is a fall off the bus or a "not supported by this driver" notice.
    TheNvidiaGpu {
        pci: PciAddress,
        rest: String,
    },
    /// A line that ends a pending `TheNvidiaGpu` as a fall off the bus.
    FallenOffBusTail,
    InitFailure {
        pci: Option<PciAddress>,
        what: String,
        code: Option<String>,
        /// More lines of explanation follow ("the probe routine was not called", "BAR0 is 0M").
        folds: bool,
    },
    /// `NVRM: API mismatch: the client has the version X, but` (older wording) or
    /// `NVRM: API mismatch: the client 'NAME' (pid N)` (newer wording, versions on later lines).
    ApiMismatchHead {
        client: Option<String>,
        process: Option<String>,
        pid: Option<u32>,
    },
    /// `NVRM: has the version X, but this kernel module has` (newer wording, second line).
    ApiMismatchClient {
        client: String,
    },
    /// `NVRM: this kernel module has the version Y.  Please` or `NVRM: the version Y.  Please
    /// make sure that this`.
    ApiMismatchKernel {
        kernel: String,
    },
    /// The last lines of the API mismatch message.
    ApiMismatchTail {
        last: bool,
    },
    /// A driver component at another version than the kernel module, told in one line: a
    /// companion module (`nvidia-modeset: Version mismatch: nvidia.ko(410.73)
    /// nvidia-modeset.ko(390.87)`) or a user-space component (`Error: API mismatch: the NVIDIA
    /// kernel module has version 177.80, but this NVIDIA driver component has version 177.82.`).
    VersionMismatch {
        component: String,
        component_version: Option<String>,
        kernel: Option<String>,
    },
    /// A GSP / RPC diagnostic line: opens or continues a GSP dump.
    GspDump {
        opens: bool,
        text: String,
    },
    /// The GSP crash report's watchdog or panic line (`GSP task watchdog timeout @ pc:...`),
    /// printed without the `NVRM:` prefix; its register lines follow.
    GspCrash {
        text: String,
    },
    /// A GPU the installed driver does not support (legacy GPU, open modules without GSP).
    NotSupported {
        pci: Option<PciAddress>,
        text: String,
    },
    /// Other errors from the NVIDIA modules.
    DriverError {
        pci: Option<PciAddress>,
        text: String,
        critical: bool,
    },
    /// An error from an NVIDIA module other than NVRM (nvidia-modeset, nvidia-drm, nvidia-uvm...).
    ModuleError {
        module: &'static str,
        pci: Option<PciAddress>,
        text: String,
    },
    /// An nvidia-smi or NVML error text pasted into a log.
    ToolError {
        pci: Option<PciAddress>,
        text: String,
        critical: bool,
    },
    /// The start of a kernel report that a call trace follows: a hung task, `Call Trace:`, a
    /// `RIP:` line, a kernel warning.
    TraceStart {
        task: Option<String>,
        hung: bool,
        /// The NVIDIA module the line itself names (`RIP: ...[nvidia_modeset]`).
        module: Option<&'static str>,
        text: String,
    },
    /// One frame of a call trace; `module` when the frame is in an NVIDIA module.
    TraceFrame {
        module: Option<&'static str>,
    },
    Sxid(SxidLine),
    Aer(AerLine),
    /// The driver's load banner; carries the version (it decides the NVLink5 register layout).
    DriverLoaded {
        version: String,
    },
    /// An `NVRM: Xid` line whose fields could not be read.
    UnreadableXid,
    /// Known harmless lines.
    Harmless,
    /// An NVIDIA-tagged line we do not classify.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidLine {
    /// `None` when the reporter redacted the address (`PCI:...`).
    pub pci: Option<PciAddress>,
    pub xid: u32,
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// The message after the address, Xid, pid and name.
    pub rest: String,
    /// The GPU's UUID, when the line names the GPU by it rather than by address (an NVML Xid
    /// event as the Kubernetes device plugin logs it).
    pub uuid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SxidLine {
    pub switch: String,
    /// `None` when the reporter redacted the address (`PCI:...`).
    pub pci: Option<PciAddress>,
    pub sxid: u32,
    /// `Some(true)` Fatal, `Some(false)` Non-fatal, `None` for a continuation line.
    pub fatal: Option<bool>,
    pub rest: String,
}

/// What an AER status line says about recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AerStatus {
    /// `AER: device recovery failed`
    RecoveryFailed,
    /// `AER: Root Port link has been reset`
    LinkReset,
    /// `AER: can't recover (no error_detected callback)`
    CantRecover,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AerLine {
    /// The device that printed the line (`pcieport 0000:16:01.0` or `nvidia 0000:17:00.0`).
    pub reporter: PciAddress,
    pub driver: String,
    /// The device named by an "error received" line.
    pub source: Option<PciAddress>,
    /// `Corrected`, `Uncorrected (Fatal)`, `Uncorrected (Non-Fatal)`, when the line says.
    pub class: Option<String>,
    /// True when the line names an NVIDIA device id `[10de:....]`.
    pub nvidia_device: bool,
    /// A recovery status line.
    pub status: Option<AerStatus>,
    pub text: String,
}

const ADDR: &str = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?";

/// A regex compiled the first time it is used. Only rare shapes use one.
macro_rules! lazy_re {
    ($name:ident, $pat:expr) => {
        fn $name() -> &'static Regex {
            static RE: OnceLock<Regex> = OnceLock::new();
            RE.get_or_init(|| Regex::new(&$pat.replace("ADDR", ADDR)).expect("built-in regex"))
        }
    };
}

lazy_re!(
    re_gpu_uuid,
    r"^GPU at (?:PCI:)?(ADDR): (GPU-[0-9A-Fa-f-]{8,64})"
);
lazy_re!(re_rm_init, r"^RmInitAdapter failed!\s*(?:\(([^)]*)\))?");
lazy_re!(
    re_rm_init_minor,
    r"^rm_init_adapter failed,? (?:for )?device (?:bearing )?minor number (\d+)"
);
lazy_re!(re_rm_init_old, r"^rm_init_adapter\((\d+)\) failed");
lazy_re!(
    re_api_head,
    r"^API mismatch: the client has the version (\S+?),? but"
);
lazy_re!(
    re_api_head_new,
    r"^API mismatch: the client '([^']{0,64})' \(pid (\d+)\)"
);
lazy_re!(re_api_client, r"^has the version (\S+?),? but");
lazy_re!(
    re_api_kernel,
    r"^(?:this kernel module has )?the version (\S+?)\.?\s+Please"
);
lazy_re!(re_rc_all, r"^RC all channels for critical error (\d+)");
lazy_re!(
    re_probe_failed,
    r"^The NVIDIA probe routine failed for (\d+) device"
);
lazy_re!(
    re_probe_not_called,
    r"^The NVIDIA probe routine was not called for (\d+) device"
);
lazy_re!(re_loading, r"^The NVIDIA GPU (ADDR)\s*(.*)$");
lazy_re!(
    re_fw_load,
    r"^nvidia (ADDR): (?:Direct firmware load for|loading) (\S+) failed with error (-?\d+)"
);
lazy_re!(
    re_probe_driver,
    r"^nvidia (ADDR): probe with driver nvidia failed with error (-?\d+)"
);
lazy_re!(
    re_probe_of,
    r"^nvidia: probe of (ADDR) failed with error (-?\d+)"
);
lazy_re!(
    re_module_sym,
    r"^([\w-]+): (disagrees about version of symbol|Unknown symbol) (\S+)"
);
lazy_re!(
    re_gpl_only,
    r"^([\w-]+): module using GPL-only symbols uses symbols (?:(\S+) )?from proprietary module (\S+?)\.?$"
);
lazy_re!(
    re_version_magic,
    r"^(nvidia[\w-]*): version magic '([^']*)' should be '([^']*)'"
);
lazy_re!(re_any_addr, r"PCI:(ADDR)");
lazy_re!(
    re_user_api_kernel_first,
    r"^API [Mm]ismatch[:,] the NVIDIA kernel module has (?:the )?version ([^\s,]+),?(?:\s+but this (NVIDIA driver component|X module) has (?:the )?version ([^\s,]+?)\.?(?:\s|$))?"
);
lazy_re!(
    re_user_api_component_first,
    r"^API [Mm]ismatch[:,] [Tt]his NVIDIA driver component has (?:the )?version ([^\s,]+),? but the NVIDIA kernel module's version does not match"
);
lazy_re!(
    re_module_version_mismatch,
    r"^(nvidia[\w-]*): Version mismatch: nvidia\.ko\(([^()\s]+)\) ([\w-]+?)(?:\.ko)?\(([^()\s]+)\)"
);

fn pci(s: &str) -> Option<PciAddress> {
    PciAddress::parse(s).ok()
}

/// The NVIDIA kernel modules a call-trace frame can name, as the kernel prints them.
const NVIDIA_MODULES: &[&str] = &[
    "nvidia_uvm",
    "nvidia_modeset",
    "nvidia_drm",
    "nvidia_peermem",
    "nvidia_fs",
    "nvidia",
];

/// The NVIDIA module named by a trailing `[module]` (or `[module]]`) of a frame or RIP line.
pub fn frame_module(line: &str) -> Option<&'static str> {
    let t = line.trim_end();
    let open = t.rfind('[')?;
    let inner = t[open + 1..].trim_end_matches(']');
    NVIDIA_MODULES.iter().copied().find(|m| *m == inner)
}

/// Whether a line is a call-trace frame (`sym+0x1f/0x40 [mod]`, with `? ` and `[<addr>] `).
pub fn is_frame(line: &str) -> bool {
    let t = frame_text(line);
    let Some(plus) = t.find("+0x") else {
        return false;
    };
    let sym = &t[..plus];
    !sym.is_empty()
        && !sym.contains(' ')
        && t[plus..].contains("/0x")
        && sym
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'$'))
}

/// A frame line without its leading `[<address>]`, `? ` and spaces.
fn frame_text(line: &str) -> &str {
    let mut t = line.trim_start();
    if t.starts_with("[<") {
        if let Some(end) = t.find(">]") {
            t = t[end + 2..].trim_start();
        }
    }
    t.strip_prefix("? ").unwrap_or(t).trim_start()
}

/// Classifies one message line (starting at its tag).
pub fn parse(msg: &str) -> Shape {
    if let Some(rest) = msg.strip_prefix("NVRM: ") {
        return parse_nvrm(rest.trim_end());
    }
    if let Some(rest) = msg.strip_prefix("NVRM ") {
        // Older open-module builds print `NVRM funcName: text`.
        return parse_nvrm(rest.trim_end());
    }
    if msg.starts_with("nvidia-nvswitch") {
        if let Some(s) = parse_sxid(msg) {
            return Shape::Sxid(s);
        }
        return module_line("nvidia-nvswitch", msg);
    }
    if msg.starts_with("pcieport ") || msg.starts_with("nvidia ") {
        if let Some(a) = parse_aer(msg) {
            return Shape::Aer(a);
        }
    }
    if let Some(s) = fabric_manager(msg) {
        return s;
    }
    if let Some(s) = daemon_version_mismatch(msg) {
        return s;
    }
    if msg.starts_with("nvidia") {
        return parse_nvidia_other(msg);
    }
    if msg.starts_with("nvgpu: ") {
        // Tegra (Jetson) integrated GPU driver: NVIDIA's, with no NVRM or nvidia tag.
        return module_line("nvgpu", msg);
    }
    if msg.starts_with("NVIDIA") {
        if let Some(s) = parse_xorg(msg) {
            return s;
        }
    }
    if msg.starts_with("GSP task ") {
        return Shape::GspCrash {
            text: msg.trim_end().to_string(),
        };
    }
    if msg.starts_with("[drm:") {
        if is_nvidia_drm(msg) && msg.contains("*ERROR*") {
            return Shape::ModuleError {
                module: "nvidia-drm",
                pci: None,
                text: msg
                    .split_once("*ERROR*")
                    .map_or(msg, |(_, t)| t)
                    .trim()
                    .to_string(),
            };
        }
        return Shape::Harmless;
    }
    if let Some(x) = parse_xid_event(msg) {
        return Shape::Xid(x);
    }
    if let Some(s) = parse_user_api(msg) {
        return s;
    }
    if let Some(rest) = msg.strip_prefix("[drm] [nvidia-drm] ") {
        return drm_notice(rest);
    }
    if let Some(s) = module_symbol(msg)
        .or_else(|| module_insert(msg))
        .or_else(|| pm_callback(msg))
    {
        return s;
    }
    if let Some(s) = parse_tool(msg) {
        return s;
    }
    parse_trace(msg).unwrap_or(Shape::Other)
}

/// Whether a `[drm:func [module]] *ERROR*` line is nvidia-drm's: the function is in
/// `[nvidia_drm]`, or the DRM core printed it for nvidia-drm (`... *ERROR* [nvidia-drm] ...`,
/// as `drm_new_set_master [drm]` does when nvidia-drm refuses modeset ownership).
pub fn is_nvidia_drm(msg: &str) -> bool {
    msg.contains("[nvidia_drm]") || msg.contains("[nvidia-drm]")
}

/// nvidia-drm's own notices, `[drm] [nvidia-drm] [GPU ID 0x00000100] TEXT`: most are harmless
/// ("Loading driver"), the ones with an error signal are errors (`nv_drm_reset_input_colorspace
/// failed with error code: -35`).
fn drm_notice(rest: &str) -> Shape {
    let text = match rest.strip_prefix("[GPU ID ") {
        Some(r) => r.split_once("] ").map_or(r, |(_, t)| t),
        None => rest,
    }
    .trim();
    if is_harmless(text) || !has_error_signal(text) {
        return Shape::Harmless;
    }
    Shape::ModuleError {
        module: "nvidia-drm",
        pci: None,
        text: text.to_string(),
    }
}

/// A module that cannot load because of NVIDIA's symbols: `nvidia: disagrees about version of
/// symbol X`, `nv_peer_mem: Unknown symbol nvidia_p2p_get_pages (err -22)`, `nvidia_fs: module
/// using GPL-only symbols uses symbols nvidia_p2p_get_pages from proprietary module nvidia.`.
/// Either the module or the symbol is NVIDIA's; other modules' symbol trouble is not ours.
fn module_symbol(m: &str) -> Option<Shape> {
    // Both wordings say "symbol"; the regexes run only on lines that do (not on every frame).
    if !m.contains(" symbol") {
        return None;
    }
    let (module, what, nvidia) = if let Some(c) = re_module_sym().captures(m) {
        let what = format!("{} {}", &c[2], &c[3]);
        (c[1].to_string(), what, is_nvidia_name(&c[3]))
    } else if let Some(c) = re_gpl_only().captures(m) {
        // Newer kernels name the symbol, older ones only the module that owns it: `nvidia_fs:
        // module using GPL-only symbols uses symbols from proprietary module nvidia.`
        let owner = &c[3];
        let what = match c.get(2) {
            Some(sym) => format!(
                "may not use the GPL-only symbols of {owner}: {}",
                sym.as_str()
            ),
            None => format!("may not use the GPL-only symbols of {owner}"),
        };
        let nvidia = is_nvidia_name(owner) || c.get(2).is_some_and(|s| is_nvidia_name(s.as_str()));
        (c[1].to_string(), what, nvidia)
    } else {
        return None;
    };
    if !(nvidia || is_nvidia_name(&module)) {
        return None;
    }
    Some(Shape::InitFailure {
        pci: None,
        what: format!("module {module}: {what}"),
        code: None,
        folds: false,
    })
}

/// What module loaders print when they cannot load a module, each with the character that ends
/// the module name: `systemd-modules-load[1054]: Failed to insert module 'nvidia_uvm': Cannot
/// allocate memory`, `modprobe: ERROR: could not insert 'nvidia': No such device`, `modprobe:
/// ERROR: ... could not find module by name='nvidia_331_uvm'`, `modprobe: FATAL: Module
/// nvidia-uvm not found.`. The kernel often logs nothing of its own for these.
const MODULE_LOADER: &[(&str, char)] = &[
    ("Failed to insert module '", '\''),
    ("could not insert '", '\''),
    ("could not find module by name='", '\''),
    ("FATAL: Module ", ' '),
];

/// Where a module loader's failure for an NVIDIA module starts in `line` (at the phrase), with
/// the module and the rest of the line.
pub fn module_loader_failure(line: &str) -> Option<(usize, &str, &str)> {
    MODULE_LOADER.iter().find_map(|(phrase, end)| {
        let at = line.find(phrase)?;
        let after = &line[at + phrase.len()..];
        let (module, rest) = after.split_once(*end)?;
        is_nvidia_name(module).then_some((at, module, rest))
    })
}

/// A module loader that could not load an NVIDIA module (see [`MODULE_LOADER`]).
fn module_insert(m: &str) -> Option<Shape> {
    let (_, module, rest) = module_loader_failure(m)?;
    let reason = rest.trim_start_matches(':').trim().trim_end_matches('.');
    let what = if reason.is_empty() || reason == "not found" {
        format!("module {module} could not be loaded (not found)")
    } else {
        format!("module {module} could not be loaded ({reason})")
    };
    Some(Shape::InitFailure {
        pci: None,
        what,
        code: None,
        folds: false,
    })
}

/// The power-management core reporting that an NVIDIA callback failed: `PM: pci_pm_suspend():
/// nv_pmops_suspend+0x0/0x40 [nvidia] returns -5` (suspend or resume of the GPU failed).
pub fn pm_callback_module(m: &str) -> Option<&'static str> {
    let rest = m.strip_prefix("PM: ")?;
    let i = rest.find(" returns -")?;
    frame_module(&rest[..i])
}

fn pm_callback(m: &str) -> Option<Shape> {
    let module = pm_callback_module(m)?;
    Some(Shape::ModuleError {
        module,
        pci: None,
        text: m.trim_end().to_string(),
    })
}

/// NVIDIA's kernel modules and exported symbols: `nvidia`, `nvidia_uvm`, `nvidia-drm`,
/// `nv_peer_mem`, `nvidia_p2p_get_pages`.
fn is_nvidia_name(name: &str) -> bool {
    name.starts_with("nvidia") || name.starts_with("nv_peer_mem")
}

/// Hung-task reports, call-trace headers and frames.
fn parse_trace(msg: &str) -> Option<Shape> {
    let t = msg.trim_start();
    if let Some(rest) = t.strip_prefix("INFO: task ") {
        // `INFO: task NAME:PID blocked for more than N seconds.`, or (newer kernels) `INFO: task
        // NAME:PID blocked on a mutex|semaphore likely last held by task OTHER:PID`.
        let i = hung_wording(rest)?;
        let name = rest[..i].rsplit_once(':').map_or(&rest[..i], |(n, _)| n);
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung: true,
            module: task_module(name),
            text: t.trim_end().to_string(),
        });
    }
    if let Some(rest) = t.strip_prefix("task:") {
        // `task:NAME state:D stack:0 pid:...` (newer kernels, after the INFO line).
        let i = rest.find(" state:")?;
        let name = rest[..i].trim();
        let hung = rest[i..].starts_with(" state:D");
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung,
            module: if hung { task_module(name) } else { None },
            text: t.trim_end().to_string(),
        });
    }
    // Kernel crash and warning headers (`BUG: unable to handle page fault for address: ...`,
    // `BUG: kernel NULL pointer dereference`, `BUG: soft lockup - CPU#1 stuck for 26s!`,
    // `general protection fault ...`, `kernel BUG at ...`, `WARNING: CPU: 5 PID: 22400 at
    // .../nvidia/nv.c:4405 nv_restore_user_channels+0x57/0x200 [nvidia]`). Whose crash it is
    // comes from what follows (the task, the RIP, the frames): one outside NVIDIA's modules
    // stays silent.
    if let Some(h) = crash_header(t) {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: frame_module(h).or_else(|| source_module(h)),
            text: h.trim_end().to_string(),
        });
    }
    // `CPU: 5 PID: 9577 Comm: nvidia-smi Tainted: P O 5.19.17 #2`: the task a crash dump was
    // taken in. An NVIDIA tool or kernel thread crashing is a crash in the driver.
    if let Some(name) = crash_task(t) {
        return Some(Shape::TraceStart {
            task: Some(name.to_string()),
            hung: false,
            module: task_module(name),
            text: t.trim_end().to_string(),
        });
    }
    if t.starts_with("Call Trace:") || t.starts_with("Call trace:") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: None,
            text: t.trim_end().to_string(),
        });
    }
    if t.starts_with("RIP: ") || t.starts_with("pc : ") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: frame_module(t),
            text: t.trim_end().to_string(),
        });
    }
    if t.contains("usercopy") && t.contains("'nvidia") {
        return Some(Shape::TraceStart {
            task: None,
            hung: false,
            module: Some("nvidia"),
            text: t.trim_end().to_string(),
        });
    }
    if is_frame(t) {
        return Some(Shape::TraceFrame {
            module: frame_module(t),
        });
    }
    None
}

/// Kernel crash and warning headers, as they start a message.
pub const CRASH_HEADERS: &[&str] = &[
    "BUG: ",
    "general protection fault",
    "kernel BUG at ",
    "WARNING: CPU: ",
];

/// Where a kernel crash or warning header starts in `line`, if it holds one.
pub fn crash_start(line: &str) -> Option<usize> {
    CRASH_HEADERS
        .iter()
        .filter_map(|h| line.find(h))
        .min()
        .or_else(|| {
            line.find("WARNING")
                .filter(|&i| warning_at_source(&line[i..]))
        })
}

/// The crash header `t` starts with, from the header on (`watchdog: BUG: soft lockup` included).
fn crash_header(t: &str) -> Option<&str> {
    let t = t.strip_prefix("watchdog: ").unwrap_or(t);
    let t = t.strip_prefix("NMI watchdog: ").unwrap_or(t);
    (CRASH_HEADERS.iter().any(|h| t.starts_with(h)) || warning_at_source(t)).then_some(t)
}

/// A kernel warning that names its source line without `CPU:` first: newer kernels print
/// `WARNING: drivers/x/y.c:123 at func+0x1/0x2, CPU#3: comm/42`, and people shorten it to
/// `WARNING at nvidia-drm/nvidia-drm-drv.c:1221 func+0x327/0x340`. The source path must end in
/// `:LINE`, which keeps other programs' "WARNING: ..." sentences out.
pub fn warning_at_source(t: &str) -> bool {
    let rest = t
        .strip_prefix("WARNING: ")
        .or_else(|| t.strip_prefix("WARNING at "));
    let Some(path) = rest.and_then(|r| r.split_whitespace().next()) else {
        return false;
    };
    path.contains('/')
        && path
            .rsplit_once(':')
            .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The NVIDIA module a kernel warning's source path is in (`.../nvidia-drm/nvidia-drm-drv.c:1221`
/// is nvidia_drm), when the line names no module in brackets.
pub fn source_module(h: &str) -> Option<&'static str> {
    h.split_whitespace()
        .filter(|w| w.contains('/'))
        .flat_map(|w| w.split('/'))
        .find_map(task_module)
}

/// The task named by a crash dump's `CPU: N PID: N Comm: NAME ...` line (`UID: N` may come
/// between, as newer kernels print it).
pub fn crash_task(t: &str) -> Option<&str> {
    let rest = t.strip_prefix("CPU: ")?;
    let i = rest.find(" Comm: ")?;
    if !rest[..i].contains("PID: ") {
        return None;
    }
    rest[i + " Comm: ".len()..].split_whitespace().next()
}

/// Where a hung-task line's wording starts, in any kernel's words: `blocked for more than N
/// seconds`, or `blocked on a mutex|semaphore|rw-semaphore likely last held by task ...`.
pub fn hung_wording(rest: &str) -> Option<usize> {
    rest.find(" blocked for more than")
        .or_else(|| rest.find(" blocked on a"))
}

/// The NVIDIA module a kernel thread or NVIDIA tool belongs to, by its task name: a hang of
/// `nvidia-modeset/0` or of `nvidia-smi` is a hang in the driver even when no frame is logged.
fn task_module(name: &str) -> Option<&'static str> {
    let n = name.to_ascii_lowercase();
    if n.starts_with("nvidia-modeset") || n.starts_with("nvidia_modeset") {
        Some("nvidia_modeset")
    } else if n.starts_with("nvidia-drm") || n.starts_with("nvidia_drm") {
        Some("nvidia_drm")
    } else if n.starts_with("nvidia-uvm") || n.starts_with("nvidia_uvm") || n.starts_with("uvm ") {
        Some("nvidia_uvm")
    } else if n.starts_with("nvidia") || n.starts_with("nv_queue") {
        Some("nvidia")
    } else {
        None
    }
}

/// nvidia-smi and NVML error texts pasted into logs and reports.
fn parse_tool(msg: &str) -> Option<Shape> {
    let t = msg.trim();
    let (critical, pci) = if t.starts_with("NVIDIA-SMI has failed because it couldn")
        || driver_unreachable_start(t) == Some(0)
    {
        (true, None)
    } else if nvml_failure_start(t) == Some(0) {
        // `Failed to initialize NVML: ...`, `Failed to properly shut down NVML: ...`: a kernel
        // module and a library of different versions stop every NVML client (critical), the
        // other reasons stop this one.
        let reason = t.split_once(NVML_COLON).map_or("", |(_, r)| r);
        (reason.starts_with("Driver/library version mismatch"), None)
    } else if t.starts_with(NVML_MISMATCH) {
        // nvidia-smi and libnvidia-ml from different driver versions: nvidia-smi stops.
        (false, None)
    } else if let Some(rest) = t
        .strip_prefix("Unable to determine the device handle for ")
        .or_else(|| t.strip_prefix("Unable to detect the device handle for "))
    {
        // nvidia-smi writes "for GPU 0000:...", older ones "for gpu 0000:..." and some
        // "for GPU0000:..." with no space.
        let rest = rest
            .get(..3)
            .filter(|g| g.eq_ignore_ascii_case("gpu"))
            .map_or(rest, |_| &rest[3..]);
        let addr = Some(rest.trim_start())
            .and_then(|a| a.split(':').take(3).collect::<Vec<_>>().join(":").into())
            .and_then(|a: String| pci(a.trim_end_matches(':')));
        (true, addr)
    } else if let Some(name) = nvml_exception(t) {
        // A lost GPU is critical; a capability or permission answer is no fault at all.
        if NVML_ANSWERS.contains(&name) {
            return Some(Shape::Harmless);
        }
        (name == "GpuIsLost", None)
    } else if is_smi_error_row(t) {
        // A GPU row of the nvidia-smi table whose fields read `ERR!`: nvidia-smi could not read
        // the GPU at all.
        (false, None)
    } else if t.starts_with("No devices were found")
        || t.starts_with("Error: nvmlDevice")
        || t.starts_with("nvmlDevice")
    {
        (false, None)
    } else {
        return None;
    };
    Some(Shape::ToolError {
        pci,
        text: t.to_string(),
        critical,
    })
}

/// Management tools (cluster charms, operators) that reword nvidia-smi's "couldn't communicate
/// with the NVIDIA driver": the driver is not loaded or not answering.
const DRIVER_UNREACHABLE: &str = "communicate with the NVIDIA driver";

/// Where a "cannot communicate with the NVIDIA driver" sentence starts in `line`: at the failure
/// words just before the phrase (`Unable to`, `Failed to`, `Could not`, `couldn't`).
pub fn driver_unreachable_start(line: &str) -> Option<usize> {
    let i = memchr::memmem::find(line.as_bytes(), DRIVER_UNREACHABLE.as_bytes())?;
    let head = &line[..i];
    [
        "Unable to ",
        "unable to ",
        "Failed to ",
        "failed to ",
        "Could not ",
        "could not ",
    ]
    .iter()
    .find(|w| head.ends_with(*w))
    .map(|w| i - w.len())
}

/// NVML's Python binding raising one of its errors: `pynvml.NVMLError_Unknown: Unknown Error`,
/// `NVMLError_GpuIsLost: GPU is lost`. The error's name, when `t` is such a line.
pub fn nvml_exception(t: &str) -> Option<&str> {
    let rest = t.strip_prefix("pynvml.").unwrap_or(t);
    let rest = rest.strip_prefix(NVML_EXCEPTION)?;
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    (end > 0 && rest[end..].starts_with(':')).then(|| &rest[..end])
}

/// The class prefix of NVML's Python exceptions.
pub const NVML_EXCEPTION: &str = "NVMLError_";

/// NVML errors that answer a question ("not supported here", "not allowed for this user", "no
/// such object") rather than report a fault: tools ask and carry on.
const NVML_ANSWERS: &[&str] = &[
    "NotSupported",
    "NoPermission",
    "NotFound",
    "FunctionNotFound",
    "InvalidArgument",
    "AlreadyInitialized",
    "Uninitialized",
    "InsufficientSize",
];

/// The nvidia-smi marker for a field it could not read, padded as the table prints it (a
/// single-spaced `ERR!` is npm's, not nvidia-smi's).
pub const SMI_ERR_FIELD: &str = "  ERR!  ";

/// Whether `t` is a row of the nvidia-smi GPU table (`|   0  ERR!   Off  | 00000000:01:00.0 ...|`)
/// with a field that reads `ERR!`.
pub fn is_smi_error_row(t: &str) -> bool {
    let t = t.trim();
    t.len() > 2 && t.starts_with('|') && t.ends_with('|') && t.contains(SMI_ERR_FIELD)
}

const NVML_COLON: &str = " NVML: ";
/// What nvidia-smi prints when its own NVML library is from another driver version.
pub const NVML_MISMATCH: &str = "Mismatch in versions between nvidia-smi and NVML";

/// Where an NVML call failure as nvidia-smi words it starts in `line`: `Failed to <what> NVML:
/// <reason>`, `<what>` being a few plain words (`initialize`, `properly shut down`).
pub fn nvml_failure_start(line: &str) -> Option<usize> {
    // Most tools add the reason (`Failed to initialize NVML: Unknown Error`); some print the bare
    // failure (`Error: Failed to initialize NVML`), the reason being in another log.
    let colon = memchr::memmem::find(line.as_bytes(), NVML_COLON.as_bytes()).or_else(|| {
        let t = line
            .trim_end()
            .trim_end_matches(['.', '`', '"', '\''])
            .trim_end();
        t.ends_with(" NVML").then(|| t.len() - " NVML".len())
    })?;
    let start = line[..colon].rfind("Failed to ")?;
    let what = &line[start + "Failed to ".len()..colon];
    (!what.is_empty()
        && what.len() <= 32
        && what.bytes().all(|b| b.is_ascii_lowercase() || b == b' '))
    .then_some(start)
}

/// Error signals in a driver line, lower-case. Conservative on purpose: each was seen in a real
/// NVIDIA error line and in none of the harmless ones.
const ERROR_WORDS: &[&str] = &[
    "error",
    "fail",
    "timeout",
    "timed out",
    // `_issueRpcAndWait: rpcRecvPoll timedout for fn 76`: the GSP RPC poll gave up.
    "timedout",
    "fatal",
    "assert",
    "halted",
    "inaccessible",
    "invalid",
    "cannot",
    "can't",
    "unable",
    "not responding",
    "lost",
    "exceeded",
    "missing",
    "mismatch",
    "panic",
    "watchdog",
    "stuck",
    "hung",
    "os_schedule",
    "kgsphealthcheck",
    "bad state",
    "not supported",
    // Self-tests that read back nonsense: `kbusVerifyBar2_GM107: MMUTest BAR0 window offset
    // 0x70f000 returned garbage 0x0`.
    "garbage",
    // A GPU removed from the bus while still in use (surprise removal, a lost eGPU).
    "non-zero usage count",
    // `System Power Management attempted without driver procfs suspend interface`: suspend
    // will fail with PreserveVideoMemoryAllocations set.
    "attempted without",
];

/// Notices from the NVIDIA modules that mention an error word but report nothing wrong.
const HARMLESS: &[&str] = &[
    "loading NVIDIA UNIX",
    "Persistence mode",
    "nvidia-persistenced",
    "RmInitAdapter succeeded",
    "ACPI",
    "failed to open /proc/driver/nvidia/params", // user tools probing before load
    "module verification failed",
    "taints kernel",
    "tainting kernel",
    "inheriting taint",
    "vgaarb:",
    "mapping multiple BARs",
    "Loaded the UVM driver",
    "[drm] ",
    "skipping",
    "Unloading",
    // The PCI core's legacy-interrupt routing notices for the GPU ("can't derive routing for PCI
    // INT A", "PCI INT A: no GSI"): the driver uses MSI, and a VM without INTx routing prints them
    // on every boot.
    "PCI INT ",
    // `free_os_event: failed to find OS event`: a client freed an event handle the driver no
    // longer knows (monitoring agents do this on healthy GPUs); nothing about the GPU.
    "free_os_event",
];

/// A probe of what the GPU or the platform can do, or a lookup, answered "no", that the driver
/// handles by carrying on without it:
/// - an RM status check (`nvCheckOkFailedNoLog: Check failed: ...`) answered
///   `NV_ERR_NOT_SUPPORTED` or `NV_ERR_OBJECT_NOT_FOUND` (monitoring agents on MIG nodes ask
///   for a GPU-instance subscription their client does not have, every few seconds). Checks,
///   unlike assertions, mark failures the code handles; a check with any other status (invalid
///   data, no resources) stays an error.
/// - the PCIe chipset setup at load (`objClInitPcieChipset: *** Chipset Setup Function Error!`):
///   on a chipset it has no setup for, the driver keeps generic PCIe settings and the GPU works.
fn is_capability_probe(text: &str) -> bool {
    (text.contains("Check failed")
        && (text.contains("[NV_ERR_NOT_SUPPORTED]") || text.contains("[NV_ERR_OBJECT_NOT_FOUND]")))
        || (text.contains("objClInitPcieChipset") && text.contains("Chipset Setup Function"))
}

fn has_error_signal(text: &str) -> bool {
    // Lower-case only the first 256 bytes: the signal is in the words, not in register dumps.
    let mut buf = [0u8; 256];
    let n = text.len().min(buf.len());
    for (d, s) in buf.iter_mut().zip(text.as_bytes()) {
        *d = s.to_ascii_lowercase();
    }
    let lower = &buf[..n];
    ERROR_WORDS
        .iter()
        .any(|w| memchr::memmem::find_iter(lower, w.as_bytes()).any(|i| !in_member_path(lower, i)))
}

/// Whether the word at `i` is a member of a dotted field path (`threadStateDatabase.timeout.flags`)
/// rather than a word of the sentence: debug prints name fields, and a field called "timeout" or
/// "error" says nothing went wrong.
fn in_member_path(lower: &[u8], i: usize) -> bool {
    i >= 2 && lower[i - 1] == b'.' && lower[i - 2].is_ascii_alphanumeric()
}

fn is_harmless(text: &str) -> bool {
    HARMLESS.iter().any(|h| text.contains(h)) || is_identity_line(text)
}

/// `NVRM: GPU at PCI:0000:9b:00: GPU-...` identity lines, also those without a UUID we could
/// parse. Only as the start of the message: the same words inside a sentence name the GPU an
/// error is about (`Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 ... The GPU
/// likely needs to be reset.`).
fn is_identity_line(text: &str) -> bool {
    let t = text.trim_start();
    let t = t.strip_prefix("NVRM:").map_or(t, str::trim_start);
    t.starts_with("GPU at PCI:")
}

/// Whether an `NVRM: ` message body carries on the sentence of the line before it: the driver
/// prints a long notice as several lines, and a tail line ("corruption and stability problems, and
/// is not supported.") means nothing on its own. It starts with a lower-case word that is not a
/// function name (`nvAssertFailedNoLog:`, `os_schedule:`) and not itself an error word ("failed
/// to ...", which starts a message of its own).
pub fn continues_sentence(body: &str) -> bool {
    let first = body.split(' ').next().unwrap_or("");
    first.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && !first.contains([':', '_', '(', '='])
        && !ERROR_WORDS
            .iter()
            .any(|w| first.to_ascii_lowercase().starts_with(w))
}

/// Whether an `NVRM: ` message body ends its sentence (so the next line starts a new message).
pub fn ends_sentence(body: &str) -> bool {
    body.trim_end().ends_with(['.', '!', '?'])
}

/// Lines naming GSP firmware boot steps that failed: GSP never came up, so the GPU is unusable.
const GSP_BOOT: &[&str] = &[
    "Booter",
    "FWSEC",
    "vbiosPatch",
    "GSP-RM boot",
    "GSP firmware RM",
    "cannot bootstrap",
    "No firmware image found",
    "copy vbios",
    "GFW_BOOT",
    "_kgspBootGspRm",
    "kgspPrepareForBootstrap",
    "kfspSendBootCommands",
    "kgspWaitForRmInitDone",
    "Cannot attach gpu",
    "missing engine",
    "engine is missing",
];

/// GSP boot messages that are failures in themselves, with no error word in them.
const GSP_BOOT_FAILED: &[&str] = &[
    "No firmware image found",
    "too few interface entries",
    "too few interface entires", // sic, as the driver prints it
];

/// A line from an NVIDIA module other than NVRM: an error when it carries an error signal.
fn module_line(module: &'static str, msg: &str) -> Shape {
    let text = match msg.split_once(": ") {
        Some((_, t)) => t,
        // `nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context`: the
        // module, then `function:line`, then the level and the text.
        None => msg.split_once(' ').map_or(msg, |(_, t)| t),
    }
    .trim_end();
    // The module's own ERROR level is an error whatever the words after it ("..., skipping").
    // Tegra's nvgpu prints `17000000.gpu  function:line  [ERR]  text`: its [ERR] level is the
    // signal, and its other levels are not errors whatever their words.
    let level_error = text
        .split_whitespace()
        .take(3)
        .any(|w| w.trim_end_matches(':') == "ERROR" || w == "[ERR]");
    if module == "nvgpu" {
        return if level_error {
            Shape::ModuleError {
                module,
                pci: None,
                text: text.to_string(),
            }
        } else {
            Shape::Harmless
        };
    }
    // A known-harmless notice stays quiet whatever its level: nvidia-peermem logs the free
    // callback of a context already torn down ("ERROR detected invalid context, skipping further
    // processing") at ERROR, and its maintainers call it harmless.
    if is_harmless(text) || (!level_error && !has_error_signal(text)) {
        return Shape::Harmless;
    }
    Shape::ModuleError {
        module,
        pci: None,
        text: text.to_string(),
    }
}

fn parse_nvrm(m: &str) -> Shape {
    if let Some(x) = m.strip_prefix("Xid ") {
        return match parse_xid_after(x) {
            Some(x) => Shape::Xid(x),
            // Never silent: an Xid line in a shape we do not know is still reported.
            None => Shape::UnreadableXid,
        };
    }
    if m.starts_with(char::is_whitespace) {
        // Indented lines continue a multi-line report (GSP crash registers, explanations).
        let t = m.trim_start();
        if !t.is_empty() {
            return Shape::GspDump {
                opens: false,
                text: t.to_string(),
            };
        }
    }
    if m.starts_with("GPU at ") {
        if let Some(c) = re_gpu_uuid().captures(m) {
            if let Some(p) = pci(&c[1]) {
                return Shape::GpuUuid {
                    pci: p,
                    uuid: c[2].to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
                };
            }
        }
    }
    if let Some(rest) = m.strip_prefix("GPU Board Serial Number: ") {
        if let Some(serial) = rest.split_whitespace().next().filter(|s| s.len() <= 64) {
            return Shape::BoardSerial(serial.to_string());
        }
    }
    if m.starts_with("loading NVIDIA UNIX") {
        return match banner_version(m) {
            Some(version) => Shape::DriverLoaded { version },
            None => Shape::Harmless,
        };
    }
    // Many messages start with "GPU 0000:17:00.0: " (take the address) or "GPU6 " (an index).
    let (addr, body) = split_gpu_prefix(m);
    if body.contains("has fallen off the bus") {
        let p = addr.or_else(|| {
            body.strip_prefix("GPU at ")
                .and_then(|s| s.split_whitespace().next())
                .and_then(pci)
        });
        return Shape::FallenOffBus { pci: p };
    }
    if body.starts_with("The NVIDIA GPU ") {
        if let Some(c) = re_loading().captures(body) {
            if let Some(p) = pci(&c[1]) {
                let rest = c.get(2).map_or("", |x| x.as_str()).to_string();
                if rest.contains("fallen off the bus") {
                    return Shape::FallenOffBus { pci: Some(p) };
                }
                return Shape::TheNvidiaGpu { pci: p, rest };
            }
        }
    }
    if body.starts_with("fallen off the bus") {
        return Shape::FallenOffBusTail;
    }
    if body.starts_with("RC all channels") {
        if let Some(code) = re_rc_all().captures(body).and_then(|c| c[1].parse().ok()) {
            return Shape::RcAllChannels { code };
        }
    }
    if let Some(s) = parse_init(addr, body) {
        return s;
    }
    if body.starts_with("API mismatch") {
        if let Some(c) = re_api_head().captures(body) {
            return Shape::ApiMismatchHead {
                client: Some(c[1].to_string()),
                process: None,
                pid: None,
            };
        }
        if let Some(c) = re_api_head_new().captures(body) {
            return Shape::ApiMismatchHead {
                client: None,
                process: Some(c[1].to_string()),
                pid: c[2].parse().ok(),
            };
        }
    }
    if body.starts_with("has the version ") {
        if let Some(c) = re_api_client().captures(body) {
            return Shape::ApiMismatchClient {
                client: c[1].to_string(),
            };
        }
    }
    if body.starts_with("this kernel module has the version") || body.starts_with("the version ") {
        if let Some(c) = re_api_kernel().captures(body) {
            return Shape::ApiMismatchKernel {
                kernel: c[1].to_string(),
            };
        }
    }
    if body.starts_with("make sure that this kernel module and all NVIDIA driver")
        || body.starts_with("kernel module and all NVIDIA driver components")
    {
        return Shape::ApiMismatchTail { last: false };
    }
    if body.starts_with("components have the same version")
        || body.starts_with("have the same version")
    {
        return Shape::ApiMismatchTail { last: true };
    }
    if body.contains("RC watchdog") && body.contains("probably locked") {
        return Shape::DriverError {
            pci: addr,
            text: body.to_string(),
            critical: true,
        };
    }
    if body.contains("nvGpuOpsReportFatalError") || body.contains("global fatal error") {
        return Shape::DriverError {
            pci: addr,
            text: body.to_string(),
            critical: true,
        };
    }
    if body.contains("_kgspLogXid119") || body.contains("GSP Timeout Error") {
        return Shape::GspDump {
            opens: true,
            text: body.to_string(),
        };
    }
    if is_gsp_dump_line(body) {
        let opens = body.contains("GSP RPC buffer contains function");
        return Shape::GspDump {
            opens,
            text: body.to_string(),
        };
    }
    if (body.starts_with("The NVIDIA ") && body.contains("installed in this system"))
        // `Open nvidia.ko is only ready for use on Data Center GPUs.`: the explanation follows.
        || body.contains("is only ready for use on")
    {
        // `The NVIDIA NVIDIA GeForce GTX 1050 GPU installed in this system is supported through
        // the NVIDIA 580.xx Legacy drivers`: the explanation follows.
        return Shape::NotSupported {
            pci: addr,
            text: body.to_string(),
        };
    }
    if is_harmless(body) || is_capability_probe(body) {
        return Shape::Harmless;
    }
    if has_error_signal(body) {
        return Shape::DriverError {
            pci: addr,
            text: body.to_string(),
            critical: false,
        };
    }
    Shape::Other
}

/// The version in the load banner: `loading NVIDIA UNIX ... Kernel Module  575.51.03  Wed ...`.
fn banner_version(m: &str) -> Option<String> {
    // The open modules say `... Kernel Module for x86_64  570.158.01`: the version is one of the
    // next few words.
    let i = m.find("Kernel Module")?;
    m[i + "Kernel Module".len()..]
        .split_whitespace()
        .take(3)
        .find(|v| {
            v.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                && v.bytes().next().is_some_and(|b| b.is_ascii_digit())
                && v.contains('.')
        })
        .map(str::to_string)
}

/// Driver initialisation and probe failures after `NVRM: ` (and a GPU prefix).
fn parse_init(addr: Option<PciAddress>, body: &str) -> Option<Shape> {
    let fail = |what: String, code: Option<String>, folds: bool| {
        Some(Shape::InitFailure {
            pci: addr,
            what,
            code,
            folds,
        })
    };
    if body.starts_with("RmInitAdapter failed") {
        let c = re_rm_init().captures(body)?;
        return fail(
            "RmInitAdapter failed".into(),
            c.get(1).map(|x| x.as_str().to_string()),
            false,
        );
    }
    if body.starts_with("rm_init_adapter") {
        if let Some(c) = re_rm_init_minor()
            .captures(body)
            .or_else(|| re_rm_init_old().captures(body))
        {
            return fail(
                format!("rm_init_adapter failed for device minor {}", &c[1]),
                None,
                false,
            );
        }
    }
    if body.starts_with("RmInitAdapter: Cannot initialize GSP firmware RM") {
        return fail("cannot initialise GSP firmware RM".into(), None, false);
    }
    if body.starts_with("The NVIDIA probe routine") {
        if let Some(c) = re_probe_failed().captures(body) {
            return fail(
                format!("the NVIDIA probe routine failed for {} device(s)", &c[1]),
                None,
                false,
            );
        }
        if let Some(c) = re_probe_not_called().captures(body) {
            return fail(
                format!(
                    "the NVIDIA probe routine was not called for {} device(s) (another driver such as nouveau owns them)",
                    &c[1]
                ),
                None,
                true,
            );
        }
    }
    if body.starts_with("None of the NVIDIA devices were initialized")
        || body.starts_with("None of the NVIDIA graphics adapters were initialized")
    {
        return fail(
            "none of the NVIDIA devices were initialised".into(),
            None,
            false,
        );
    }
    if body.starts_with("No NVIDIA devices probed")
        || body.starts_with("No NVIDIA graphics adapter")
        || body.starts_with("No NVIDIA GPU found")
    {
        return fail("no NVIDIA GPU was found or probed".into(), None, false);
    }
    // `NVIDIA init module failed!`: the kernel module itself did not initialise, so no GPU is
    // usable (the lines before say why). Any spelling of "init module failed".
    let lower = body.to_ascii_lowercase();
    if [
        "init module failed",
        "init_module failed",
        "module init failed",
    ]
    .iter()
    .any(|k| lower.contains(k))
    {
        return fail(
            "the NVIDIA kernel module failed to initialise".into(),
            None,
            false,
        );
    }
    if body.contains("does not have the necessary power cables connected") {
        return fail(
            "the GPU's auxiliary power cables are not connected".into(),
            None,
            false,
        );
    }
    if body.contains("PCI I/O region assigned to your NVIDIA device is invalid") {
        return fail(
            "the PCI I/O region (BAR) assigned to the GPU is invalid".into(),
            None,
            true,
        );
    }
    let gsp_boot = GSP_BOOT.iter().any(|k| body.contains(k)) && has_error_signal(body);
    if (gsp_boot || GSP_BOOT_FAILED.iter().any(|k| body.contains(k))) && !is_harmless(body) {
        return fail(format!("GPU firmware boot failed: {body}"), None, false);
    }
    None
}

/// Splits `GPU 0000:17:00.0: text` into the address and the text, and drops a `GPU6 ` index
/// prefix (the driver's GPU instance number, not an address).
fn split_gpu_prefix(m: &str) -> (Option<PciAddress>, &str) {
    let Some(rest) = m.strip_prefix("GPU") else {
        return (None, m);
    };
    if let Some(r) = rest.strip_prefix(' ') {
        if let Some((a, body)) = r.split_once(": ") {
            if let Some(p) = pci(a) {
                return (Some(p), body);
            }
        }
        return (None, m);
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && rest[digits..].starts_with(' ') {
        return (None, &rest[digits + 1..]);
    }
    (None, m)
}

/// Lines of the GSP RPC diagnostic dump that follows a GSP timeout.
fn is_gsp_dump_line(body: &str) -> bool {
    let t = body.trim_start();
    let after_gpu = t
        .strip_prefix("GPU")
        .map(|s| {
            s.trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start()
        })
        .unwrap_or(t);
    after_gpu.starts_with("GSP RPC buffer")
        || after_gpu.starts_with("RPC history")
        || after_gpu.starts_with("RPC event history")
        || after_gpu.starts_with("entry function")
        || t.starts_with("_kgsp")
        || t.starts_with("****")
        || (body.starts_with(char::is_whitespace) && t.starts_with(['#', '-']))
}

/// Whether `s` starts with the X server NVIDIA driver's tag: `NVIDIA: ` or `NVIDIA(SCREEN): `
/// with a short screen name (`0`, `G0`, `GPU-0`).
pub fn xorg_tag_ok(s: &str) -> bool {
    xorg_body(s).is_some()
}

/// The text after the X driver's tag.
fn xorg_body(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("NVIDIA")?;
    // Some X servers wrote `NVIDIA (0):`.
    let rest = rest
        .strip_prefix(' ')
        .filter(|r| r.starts_with('('))
        .unwrap_or(rest);
    if let Some(body) = rest.strip_prefix(": ") {
        return Some(body);
    }
    let screen = rest.strip_prefix('(')?;
    let close = screen.find("): ")?;
    let name = &screen[..close];
    (!name.is_empty()
        && name.len() <= 16
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    .then(|| &screen[close + 3..])
}

/// The API mismatch as NVIDIA's user-space components (the X driver, GLX, nvidia-settings) tell
/// it, the kernel module's version first or their own first.
fn parse_user_api(msg: &str) -> Option<Shape> {
    if let Some(c) = re_user_api_kernel_first().captures(msg) {
        return Some(Shape::VersionMismatch {
            component: c
                .get(2)
                .map_or("NVIDIA driver component", |m| m.as_str())
                .to_string(),
            component_version: c.get(3).map(|m| m.as_str().to_string()),
            kernel: Some(c[1].to_string()),
        });
    }
    let c = re_user_api_component_first().captures(msg)?;
    Some(Shape::VersionMismatch {
        component: "NVIDIA driver component".into(),
        component_version: Some(c[1].to_string()),
        kernel: None,
    })
}

/// An error from the X server's NVIDIA driver (`(EE) NVIDIA(GPU-0): ...`, the marker already
/// removed). The X driver reports the kernel driver's failure to bring a GPU up in its own words;
/// the lines indented after it explain and are folded into it.
fn parse_xorg(msg: &str) -> Option<Shape> {
    let body = xorg_body(msg)?;
    if body.starts_with(char::is_whitespace) {
        return Some(Shape::Other);
    }
    let body = body.trim_end_matches(['`', ' ']);
    if let Some(s) = parse_user_api(body) {
        return Some(s);
    }
    // Older drivers: "Failed to initialize the NVIDIA graphics device PCI:1:0:0." (the line
    // "... graphics device!" that follows it explains, and folds).
    let gpu_at = body
        .strip_prefix("Failed to initialize the NVIDIA GPU at ")
        .or_else(|| {
            body.strip_prefix("Failed to initialize the NVIDIA graphics device ")
                .filter(|at| at.starts_with("PCI:"))
        });
    if let Some(at) = gpu_at {
        return Some(Shape::InitFailure {
            pci: xorg_pci(at),
            what: "the X server's NVIDIA driver failed to initialise the GPU (the kernel log says why)"
                .into(),
            code: None,
            folds: true,
        });
    }
    if body.starts_with("Failed to initialize the NVIDIA kernel module") {
        return Some(Shape::InitFailure {
            pci: None,
            what: "the X server's NVIDIA driver could not initialise the NVIDIA kernel module"
                .into(),
            code: None,
            folds: true,
        });
    }
    Some(Shape::Other)
}

/// The X server's `PCI:BUS:DEVICE:FUNCTION` (decimal, domain 0, or `BUS@DOMAIN:DEVICE:FUNCTION`).
fn xorg_pci(s: &str) -> Option<PciAddress> {
    let s = s.strip_prefix("PCI:")?;
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == ':' || c == '@'))
        .unwrap_or(s.len());
    let mut parts = s[..end].split(':');
    let first = parts.next()?;
    let (bus, domain) = first.split_once('@').unwrap_or((first, "0"));
    let device = parts.next()?.parse().ok()?;
    let function = parts.next()?.parse().ok()?;
    PciAddress::new(domain.parse().ok()?, bus.parse().ok()?, device, function)
}

/// Parses an Xid line after `NVRM: `.
pub fn parse_xid(m: &str) -> Option<XidLine> {
    parse_xid_after(m.strip_prefix("Xid ")?)
}

/// The Xid line grammar, read left to right without backtracking:
/// `(` [`PCI:`] ADDRESS `):` [spaces] NUMBER [`,` | spaces] [`pid=`PID`,`] [`name=`NAME`,`] REST.
/// A redacted address (`PCI:...`) still gives the Xid number.
fn parse_xid_after(x: &str) -> Option<XidLine> {
    let inner = x.strip_prefix('(')?;
    let close = inner.find("):")?;
    let addr = &inner[..close];
    if addr.contains('(') {
        return None;
    }
    // The address is the first word: on a MIG GPU the driver adds the instances after it
    // (`PCI:0000:01:00 GPU-I:05 GPU-CI:02`). An address the reporter redacted (`PCI:...`,
    // `PCI:0000:XX:00`, `PCI:<redacted>`) or the driver left out still gives the Xid number.
    let addr = addr.split_whitespace().next().unwrap_or("");
    let pci = PciAddress::parse(addr.strip_prefix("PCI:").unwrap_or(addr)).ok();
    let after = inner[close + 2..].trim_start_matches(' ');
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let xid: u32 = after[..digits].parse().ok()?;
    let mut tail = &after[digits..];
    if !tail.is_empty() {
        // The number ends at a comma or a space; anything else ("79x") is not this grammar.
        tail = if let Some(t) = tail.strip_prefix(',') {
            t
        } else if tail.starts_with(' ') {
            tail
        } else {
            return None;
        };
        tail = tail.trim_start();
    }
    let (mut pid, mut process) = (None, None);
    if let Some(rest) = tail.strip_prefix("pid=") {
        let end = rest.find(',').unwrap_or(rest.len());
        let v = rest[..end].trim().trim_matches('\'');
        pid = v.parse().ok();
        tail = rest[end..]
            .strip_prefix(',')
            .unwrap_or(&rest[end..])
            .trim_start();
    }
    if let Some(rest) = tail.strip_prefix("name=") {
        let end = rest.find(',').unwrap_or(rest.len());
        let v = rest[..end].trim();
        if !v.is_empty() && v != "<unknown>" && v != "'<unknown>'" {
            process = Some(v.to_string());
        }
        tail = rest[end..]
            .strip_prefix(',')
            .unwrap_or(&rest[end..])
            .trim_start();
    }
    Some(XidLine {
        pci,
        xid,
        pid,
        process,
        rest: tail.trim().to_string(),
        uuid: None,
    })
}

/// An NVML Xid event as the Kubernetes device plugin logs it:
/// `XidCriticalError: Xid=94 on Device=GPU-3b6e...; marking device as unhealthy.` The driver
/// printed the same Xid to the kernel log, which the pasted log often lacks.
fn parse_xid_event(msg: &str) -> Option<XidLine> {
    let rest = msg.strip_prefix("XidCriticalError: Xid=")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let xid = rest[..digits].parse().ok()?;
    let after = rest[digits..].trim_start();
    let device = after
        .strip_prefix("on")
        .map(str::trim_start)
        .and_then(|d| d.strip_prefix("Device="))
        .unwrap_or("");
    let uuid: String = device
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    // A UUID the reporter redacted (`GPU-XXXX`) names no GPU.
    let uuid = (uuid.starts_with("GPU-") || uuid.starts_with("MIG-"))
        .then_some(uuid)
        .filter(|u| u[4..].bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') && u.len() > 12);
    Some(XidLine {
        pci: None,
        xid,
        pid: None,
        process: None,
        rest:
            "Xid event reported through NVML (the Kubernetes device plugin marks the GPU unhealthy)"
                .into(),
        uuid,
    })
}

/// The SXid grammar: `nvidia-nvswitchN: SXid (PCI:ADDRESS): NUMBER, REST`.
fn parse_sxid(m: &str) -> Option<SxidLine> {
    let (switch, rest) = m.split_once(": SXid (")?;
    if !switch.starts_with("nvidia-nvswitch") || switch.contains(' ') {
        return None;
    }
    let close = rest.find("):")?;
    let addr = &rest[..close];
    // As for Xid lines: a redacted address still leaves the SXid number to read.
    let pci = pci(addr.strip_prefix("PCI:").unwrap_or(addr));
    let after = rest[close + 2..].trim_start();
    let digits = after.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 10 {
        return None;
    }
    let sxid = after[..digits].parse().ok()?;
    let rest = after[digits..].strip_prefix(',')?.trim().to_string();
    let lower = rest.as_bytes();
    let starts =
        |w: &str| lower.len() >= w.len() && lower[..w.len()].eq_ignore_ascii_case(w.as_bytes());
    let fatal = if starts("non-fatal") || starts("nonfatal") {
        Some(false)
    } else if starts("fatal") {
        Some(true)
    } else {
        None
    };
    Some(SxidLine {
        switch: switch.to_string(),
        pci,
        sxid,
        fatal,
        rest,
    })
}

/// The AER classes the kernel names, longest first (so "Multiple ..." wins over its tail).
const AER_CLASSES: &[&str] = &[
    "Multiple Uncorrected (Non-Fatal)",
    "Multiple Uncorrectable (Non-Fatal)",
    "Multiple Uncorrected (Fatal)",
    "Multiple Uncorrectable (Fatal)",
    "Multiple Correctable",
    "Multiple Corrected",
    "Uncorrected (Non-Fatal)",
    "Uncorrectable (Non-Fatal)",
    "Uncorrected (Fatal)",
    "Uncorrectable (Fatal)",
    "Correctable",
    "Corrected",
];

/// `pcieport|nvidia ADDRESS: [AER: ]TEXT`, read without regexes: AER lines come in bursts.
fn parse_aer(m: &str) -> Option<AerLine> {
    let (driver, rest) = m.split_once(' ')?;
    if driver != "pcieport" && driver != "nvidia" {
        return None;
    }
    // The address holds two colons itself (`0000:16:01.0`); the third ends it.
    let mut fields = rest.splitn(4, ':');
    let (a, b, c) = (fields.next()?, fields.next()?, fields.next()?);
    let after = fields.next()?;
    let addr = &rest[..a.len() + b.len() + c.len() + 2];
    let reporter = pci(addr)?;
    let after = after.trim_start();
    let has_aer = after.starts_with("AER:");
    let text = after
        .strip_prefix("AER:")
        .unwrap_or(after)
        .trim()
        .to_string();
    // Without the `AER:` tag only the older kernels' "PCIe Bus Error" lines and their detail
    // lines are AER; "pcieport ...: PCI bridge to [bus 04-24]" is not.
    let older_kernel_line = text.starts_with("PCIe Bus Error")
        || text.starts_with("device [")
        || text.starts_with('[')
        || text.starts_with("device has no AER-aware driver")
        || text.starts_with("broadcast error_detected message");
    if !has_aer && !older_kernel_line {
        return None;
    }
    let (mut source, mut class) = (None, None);
    let received = text
        .find(" error received")
        .or_else(|| text.find(" error message received"));
    if let Some(i) = received {
        let before = &text[..i];
        if let Some(c) = AER_CLASSES.iter().find(|c| before.ends_with(*c)) {
            class = Some(normalise_class(c.trim_start_matches("Multiple ")));
            let tail = &text[i..];
            let tail = tail[tail.find("received").map_or(0, |j| j + "received".len())..]
                .trim_start_matches(':')
                .trim_start();
            let tail = tail.strip_prefix("from").unwrap_or(tail).trim_start();
            let tail = match tail.strip_prefix("id=") {
                // `id=00e5` names a requester id, not an address; an address may follow.
                Some(t) => t.split_once(' ').map_or("", |(_, r)| r).trim_start(),
                None => tail,
            };
            source = tail.split_whitespace().next().and_then(pci);
        }
    } else if let Some(i) = text.find("severity=") {
        let v = &text[i + "severity=".len()..];
        class = AER_CLASSES
            .iter()
            .find(|c| v.starts_with(*c))
            .map(|c| normalise_class(c));
    }
    let status = if text.starts_with("device recovery failed") {
        Some(AerStatus::RecoveryFailed)
    } else if text.contains("link has been reset") {
        Some(AerStatus::LinkReset)
    } else if text.starts_with("can't recover")
        || text.starts_with("device has no AER-aware driver")
    {
        Some(AerStatus::CantRecover)
    } else {
        None
    };
    Some(AerLine {
        reporter,
        driver: driver.to_string(),
        source,
        class,
        nvidia_device: text.contains("[10de:"),
        status,
        text,
    })
}

/// Newer kernels say "Correctable"/"Uncorrectable"; older ones "Corrected"/"Uncorrected".
fn normalise_class(c: &str) -> String {
    c.replace("Correctable", "Corrected")
        .replace("Uncorrectable", "Uncorrected")
}

fn parse_nvidia_other(m: &str) -> Shape {
    if let Some(after) = m.strip_prefix("nvidia ") {
        if let Some(c) = re_fw_load().captures(m) {
            return Shape::InitFailure {
                pci: pci(&c[1]),
                what: format!("loading firmware {} failed with error {}", &c[2], &c[3]),
                code: Some(c[3].to_string()),
                folds: false,
            };
        }
        if let Some(c) = re_probe_driver().captures(m) {
            return Shape::InitFailure {
                pci: pci(&c[1]),
                what: format!("probe with driver nvidia failed with error {}", &c[2]),
                code: Some(c[2].to_string()),
                folds: false,
            };
        }
        // `nvidia 0000:17:00.0: text`: the PCI core speaking for the GPU. A power-management
        // callback of the GPU that returned an error (`PM: dpm_run_callback(): pci_pm_suspend+
        // 0x0/0x170 returns -5`) is an error too.
        let (addr, text) = after.split_once(": ").unwrap_or(("", ""));
        let pm_failed = text.starts_with("PM: ") && text.contains(" returns -");
        if !pm_failed && (is_harmless(text) || !has_error_signal(text)) {
            return Shape::Harmless;
        }
        return Shape::ModuleError {
            module: "nvidia",
            pci: pci(addr),
            text: text.trim_end().to_string(),
        };
    }
    if let Some(c) = re_probe_of().captures(m) {
        return Shape::InitFailure {
            pci: pci(&c[1]),
            what: format!("probe failed with error {}", &c[2]),
            code: Some(c[2].to_string()),
            folds: false,
        };
    }
    if let Some(s) = module_symbol(m) {
        return s;
    }
    if let Some(c) = re_version_magic().captures(m) {
        return Shape::InitFailure {
            pci: None,
            what: format!(
                "module {} was built for kernel '{}', not the running '{}'",
                &c[1],
                c[2].trim(),
                c[3].trim()
            ),
            code: None,
            folds: false,
        };
    }
    if let Some(c) = re_module_version_mismatch().captures(m) {
        return Shape::VersionMismatch {
            component: c[3].to_string(),
            component_version: Some(c[4].to_string()),
            kernel: Some(c[2].to_string()),
        };
    }
    if let Some(rest) = m.strip_prefix("nvidia-modeset: ") {
        if let Some(t) = rest
            .strip_prefix("ERROR: ")
            .or_else(|| rest.strip_prefix("WARNING: "))
        {
            return Shape::ModuleError {
                module: "nvidia-modeset",
                pci: None,
                text: t.trim_end().to_string(),
            };
        }
        return Shape::Harmless;
    }
    if let Some(s) = container_cli(m) {
        return s;
    }
    let name_end = m
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .unwrap_or(m.len());
    let module = match &m[..name_end] {
        // The vGPU host module, whose tag is bracketed: `[nvidia-vgpu-vfio] <uuid>: text`.
        "nvidia-vgpu-vfio" => "nvidia-vgpu-vfio",
        "nvidia-uvm" | "nvidia_uvm" => "nvidia-uvm",
        "nvidia-drm" | "nvidia_drm" => "nvidia-drm",
        "nvidia-nvlink" => "nvidia-nvlink",
        "nvidia-peermem" | "nvidia_peermem" => "nvidia-peermem",
        "nvidia-fs" | "nvidia_fs" => "nvidia-fs",
        "nvidia" => "nvidia",
        _ => return Shape::Harmless,
    };
    module_line(module, m)
}

/// The container toolkit's hook failing on NVML or the driver (`nvidia-container-cli:
/// initialization error: nvml error: driver/library version mismatch`, `... detection error: nvml
/// error: unknown error`): no container gets the GPU. Its other errors (cgroups, mounts, a missing
/// binary) are the container setup's, not the GPU's, and stay quiet.
fn container_cli(m: &str) -> Option<Shape> {
    let rest = m.strip_prefix("nvidia-container-cli")?;
    let (_, text) = rest.split_once(": ")?;
    let text = text.trim_end();
    let driver = text.contains("nvml error") || text.contains("driver error");
    if !driver {
        return Some(Shape::Harmless);
    }
    Some(Shape::ToolError {
        pci: None,
        critical: text.contains("version mismatch"),
        text: text.to_string(),
    })
}

/// A Fabric Manager record: bare, as its log file holds it (`[ERROR] [tid 841] ...`, the stamp
/// left in the prefix), or after the journal's `nv-fabricmanager[pid]: ` tag, with or without its
/// own stamp and level. A record at a level that is never a finding is harmless; journal text
/// without a level that is none of the known failures is left to the other daemon checks.
fn fabric_manager(msg: &str) -> Option<Shape> {
    use crate::classify::fabricmanager as fm;
    let of_record = |r: fm::Record<'_>| {
        let error = matches!(r.level, Some("ERROR" | "FATAL"));
        Some(match fm::classify(r.text, error) {
            Some(ev) => Shape::FabricManager(ev),
            None => Shape::Harmless,
        })
    };
    if msg.starts_with('[') {
        return fm::record(msg).and_then(of_record);
    }
    let rest = msg.strip_prefix("nv-fabricmanager[")?;
    let (pid, text) = rest.split_once("]: ")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if let Some(r) = fm::record(text) {
        return of_record(r);
    }
    fm::classify(text, false).map(Shape::FabricManager)
}

/// An NVIDIA user-space daemon (`nv-fabricmanager[29850]: ...`) saying it does not match the
/// kernel driver's version: like an API mismatch, nothing that needs both runs (without the
/// fabric manager an NVSwitch system runs no CUDA job). Its other messages are left to the
/// daemon's own logs.
fn daemon_version_mismatch(msg: &str) -> Option<Shape> {
    let (name, rest) = msg.split_once('[')?;
    if !(name.starts_with("nv-") || name.starts_with("nvidia-"))
        || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
    {
        return None;
    }
    let (pid, text) = rest.split_once("]: ")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let mismatch = lower.contains("version")
        && lower.contains("driver")
        && (lower.contains("mismatch") || lower.contains("match with"));
    mismatch.then(|| Shape::ModuleError {
        module: "NVIDIA daemon",
        pci: None,
        text: text.trim_end().to_string(),
    })
}

/// An address anywhere in a line (`(PCI:0000:01:00.0)`), for continuation lines that name it.
pub fn find_address(s: &str) -> Option<PciAddress> {
    re_any_addr()
        .captures_iter(s)
        .find_map(|c| c.get(1).and_then(|a| pci(a.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(m: &str) -> XidLine {
        match parse(m) {
            Shape::Xid(x) => x,
            other => panic!("{m}: {other:?}"),
        }
    }

    #[test]
    fn xid_variants() {
        let x = xid(
            "NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.",
        );
        assert_eq!(
            (x.pci.unwrap().to_string(), x.xid, x.pid),
            ("0000:17:00.0".into(), 79, Some(2207))
        );
        assert_eq!(x.process.as_deref(), Some("python3"));
        assert_eq!(x.rest, "GPU has fallen off the bus.");

        let x = xid(
            "NVRM: Xid (PCI:0000:17:00): 62, pid='<unknown>', name=<unknown>, 1a2b3c4d 0000 0000",
        );
        assert_eq!((x.pid, x.process.as_deref()), (None, None));
        assert_eq!(x.rest, "1a2b3c4d 0000 0000");

        let x = xid("NVRM: Xid (0000:02:00): 31, Ch 0000000b, engmask 00000120, intr 10000000");
        assert_eq!((x.xid, x.pid), (31, None));
        assert_eq!(x.rest, "Ch 0000000b, engmask 00000120, intr 10000000");

        let x = xid(
            "NVRM: Xid (PCI:4a7f1:00:00): 48, pid=1, name=x, An uncorrectable double bit error",
        );
        assert_eq!(x.pci.unwrap().to_string(), "4a7f1:00:00.0");
        let x = xid("NVRM: Xid (PCI:0008:01:00): 13, pid=5, name=a b, Graphics Exception");
        assert_eq!(x.process.as_deref(), Some("a b"));
        let x = xid("NVRM: Xid (PCI:0000:3b:00): 43, pid=25442, Ch 00000008");
        assert_eq!(
            (x.pid, x.process.as_deref(), x.rest.as_str()),
            (Some(25442), None, "Ch 00000008")
        );
        let x = xid("NVRM: Xid (PCI:0000:17:00): 119");
        assert_eq!((x.xid, x.rest.as_str()), (119, ""));
    }

    #[test]
    fn unreadable_xid_lines_are_not_dropped() {
        for m in [
            "NVRM: Xid (PCI:0000:17:00) 79 no colon",
            "NVRM: Xid (PCI:0000:17:00): 99999999999, x",
            "NVRM: Xid (PCI:0000:17:00 (x)): 79, x",
        ] {
            assert_eq!(parse(m), Shape::UnreadableXid, "{m}");
        }
        assert_eq!(parse("NVRM: Xidious text"), Shape::Other);
        // Spacing variants are read, not merely reported.
        assert_eq!(
            xid("NVRM: Xid (PCI:0000:17:00): 79 GPU has fallen off the bus.").xid,
            79
        );
        assert_eq!(
            xid("NVRM: Xid (PCI:0000:17:00):79, pid=1, name=x, y").pid,
            Some(1)
        );
        assert_eq!(
            xid("NVRM: Xid (PCI:0000:17:00): 13, pid='1234', name=x, y").pid,
            Some(1234)
        );
    }

    /// What is in the parentheses besides an address does not cost the Xid number: the MIG
    /// instances the driver adds, and every way reporters redact the address.
    #[test]
    fn xid_number_survives_mig_attribution_and_redaction() {
        let x = xid("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No");
        assert_eq!(
            (x.pci.map(|p| p.to_string()), x.xid, x.pid),
            (Some("0000:01:00.0".into()), 94, Some(7194))
        );
        assert_eq!(
            xid("NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, b").xid,
            13
        );
        for m in [
            "NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)",
            "NVRM: Xid (PCI:0000:XX:00): 48, pid=1, name=x, An uncorrectable double bit error",
            "NVRM: Xid (PCI:0000:xx:xx): 79, GPU has fallen off the bus.",
            "NVRM: Xid (PCI:<redacted>): 79, GPU has fallen off the bus.",
            "NVRM: Xid (PCI:****:**:**): 79, GPU has fallen off the bus.",
            "NVRM: Xid (garbage): 79, GPU has fallen off the bus.",
            "NVRM: Xid (): 79, GPU has fallen off the bus.",
        ] {
            let x = xid(m);
            assert!(
                x.pci.is_none() && [145, 48, 79].contains(&x.xid),
                "{m}: {x:?}"
            );
        }
    }

    /// An SXid line whose address the reporter redacted still gives the switch and SXid number.
    #[test]
    fn sxid_number_survives_redaction() {
        for m in [
            "nvidia-nvswitch1: SXid (PCI:...): 20034, Fatal, Link 48 LTSSM Fault Up",
            "nvidia-nvswitch1: SXid (PCI:0000:XX:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        ] {
            let Shape::Sxid(x) = parse(m) else {
                panic!("{m}: not an SXid");
            };
            assert_eq!(
                (x.switch.as_str(), x.pci, x.sxid, x.fatal),
                ("nvidia-nvswitch1", None, 20034, Some(true)),
                "{m}"
            );
        }
        let Shape::Sxid(x) = parse("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x1}")
        else {
            panic!("not an SXid");
        };
        assert_eq!(
            x.pci.map(|p| p.to_string()).as_deref(),
            Some("0000:05:00.0")
        );
    }

    /// A companion module at another version than nvidia.ko is a version mismatch, `.ko` or not.
    #[test]
    fn module_version_mismatch() {
        for (m, module, kernel, other) in [
            (
                "nvidia-modeset: Version mismatch: nvidia.ko(410.73) nvidia-modeset.ko(390.87)",
                "nvidia-modeset",
                "410.73",
                "390.87",
            ),
            (
                "nvidia-modeset: Version mismatch: nvidia.ko(378.13) nvidia-modeset(375.26)",
                "nvidia-modeset",
                "378.13",
                "375.26",
            ),
        ] {
            assert_eq!(
                parse(m),
                Shape::VersionMismatch {
                    component: module.into(),
                    component_version: Some(other.into()),
                    kernel: Some(kernel.into()),
                },
                "{m}"
            );
        }
        assert!(!matches!(
            parse("nvidia-modeset: Version mismatch: garbled"),
            Shape::VersionMismatch { .. }
        ));
    }

    /// NVIDIA's user-space components (X driver, GLX, nvidia-settings) tell the API mismatch in
    /// their own words, with or without an X driver tag, on one line or wrapped.
    #[test]
    fn user_space_api_mismatch() {
        let v = |component: &str, c: Option<&str>, k: Option<&str>| Shape::VersionMismatch {
            component: component.into(),
            component_version: c.map(Into::into),
            kernel: k.map(Into::into),
        };
        for (m, want) in [
            (
                "API mismatch: the NVIDIA kernel module has version 169.12, but this NVIDIA driver component has version 173.14.09. Please make sure",
                v("NVIDIA driver component", Some("173.14.09"), Some("169.12")),
            ),
            (
                "API mismatch: the NVIDIA kernel module has the version 1.0-9755, but this X module has the version 1.0-9631. Please make sure",
                v("X module", Some("1.0-9631"), Some("1.0-9755")),
            ),
            (
                "API mismatch: the NVIDIA kernel module has version 177.80,",
                v("NVIDIA driver component", None, Some("177.80")),
            ),
            (
                "API mismatch: this NVIDIA driver component has version 100.14.11, but the NVIDIA kernel module's version does not match. Please",
                v("NVIDIA driver component", Some("100.14.11"), None),
            ),
            (
                "NVIDIA: API mismatch: the NVIDIA kernel module has version 304.88, but",
                v("NVIDIA driver component", None, Some("304.88")),
            ),
        ] {
            assert_eq!(parse(m), want, "{m}");
        }
        assert!(!matches!(
            parse("API mismatch: something else entirely"),
            Shape::VersionMismatch { .. }
        ));
    }

    /// The Kubernetes device plugin logs the NVML Xid events it acts on; the GPU is named by UUID.
    #[test]
    fn xid_events_logged_by_the_device_plugin() {
        let Shape::Xid(x) = parse("XidCriticalError: Xid=94 on Device=GPU-3b6ec030-5adc-1847-e155-79f635584b4e; marking device as unhealthy.") else {
            panic!("not an Xid");
        };
        assert_eq!(
            (x.xid, x.pci, x.uuid.as_deref()),
            (94, None, Some("GPU-3b6ec030-5adc-1847-e155-79f635584b4e"))
        );
        let Shape::Xid(x) = parse("XidCriticalError: Xid=999 on  Device=GPU-XXXX, but") else {
            panic!("not an Xid");
        };
        assert_eq!((x.xid, x.uuid), (999, None), "a redacted UUID names no GPU");
        assert!(!matches!(parse("XidCriticalError: Xid=, x"), Shape::Xid(_)));
    }

    /// The X server's NVIDIA driver reports a GPU the kernel driver could not bring up as
    /// "Failed to initialize the NVIDIA GPU at PCI:B:D:F" (decimal bus), with explanation lines.
    #[test]
    fn x_driver_initialisation_failures() {
        assert_eq!(
            xorg_pci("PCI:82:0:0.  Please"),
            PciAddress::parse("0000:52:00.0").ok()
        );
        assert_eq!(
            xorg_pci("PCI:1:0:0."),
            PciAddress::parse("0000:01:00.0").ok()
        );
        assert_eq!(
            xorg_pci("PCI:65@1:0:1"),
            PciAddress::parse("0001:41:00.1").ok()
        );
        assert_eq!(xorg_pci("PCI:x"), None);
        for (m, pci) in [
            (
                "NVIDIA(GPU-0): Failed to initialize the NVIDIA GPU at PCI:82:0:0.  Please",
                Some("0000:52:00.0"),
            ),
            (
                "NVIDIA(0): Failed to initialize the NVIDIA GPU at PCI:1:0:0.`",
                Some("0000:01:00.0"),
            ),
            (
                "NVIDIA: Failed to initialize the NVIDIA kernel module. Please see the",
                None,
            ),
        ] {
            match parse(m) {
                Shape::InitFailure { pci: p, folds, .. } => {
                    assert_eq!(p.map(|p| p.to_string()).as_deref(), pci, "{m}");
                    assert!(folds, "{m}");
                }
                other => panic!("{m}: {other:?}"),
            }
        }
        // Older X servers and drivers.
        match parse("NVIDIA (0): Failed to initialize the NVIDIA graphics device PCI:1:0:0. ") {
            Shape::InitFailure { pci, .. } => {
                assert_eq!(pci.map(|p| p.to_string()).as_deref(), Some("0000:01:00.0"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse("NVIDIA(0): Failed to initialize the NVIDIA graphics device!"),
            Shape::Other
        );
        // Explanation lines, other X driver errors and tags of another shape.
        assert_eq!(
            parse("NVIDIA(GPU-0):     check your system's kernel log"),
            Shape::Other
        );
        assert_eq!(
            parse("NVIDIA(0): Failing initialization of X screen 0"),
            Shape::Other
        );
        assert!(!xorg_tag_ok(
            "NVIDIA-SMI has failed because it couldn't communicate"
        ));
        assert!(!xorg_tag_ok("NVIDIA(a very long screen name): x"));
        assert!(xorg_tag_ok("NVIDIA(G0): x"));

        // As a log: one finding, the explanation folded into it.
        let log = "[   159.042] (EE) NVIDIA(0): Failed to initialize the NVIDIA GPU at PCI:1:0:0.  Please\n\
                   [   159.042] (EE) NVIDIA(0):     check your system's kernel log for additional error\n\
                   [   159.042] (II) UnloadModule: \"nvidia\"\n\
                   [   159.042] (EE) NVIDIA(0): Failed to initialize the NVIDIA graphics device!\n\
                   [   159.043] (II) NVIDIA(0): NVIDIA GPU GeForce GT 650M at PCI:1:0:0";
        let mut c = crate::classify::Classifier::new();
        let mut out = Vec::new();
        for (i, line) in log.lines().enumerate() {
            let Some(split) = crate::classify::prefix::split(line) else {
                continue;
            };
            let at = crate::classify::LineOrigin {
                line: i as u64 + 1,
                seq: None,
                ts_usec: None,
                timestamp: None,
            };
            for m in &split.messages {
                c.push(m, &at, &mut out);
            }
        }
        c.flush(&mut out);
        assert_eq!(out.len(), 1, "{out:#?}");
        assert_eq!(out[0].kind, crate::model::FindingKind::DriverInitFailure);
        assert_eq!(out[0].origin.raw.len(), 3, "{:?}", out[0].origin.raw);
        assert_eq!(
            out[0].pci.map(|p| p.to_string()).as_deref(),
            Some("0000:01:00.0")
        );
    }

    #[test]
    fn fallen_off_the_bus_shapes() {
        assert!(matches!(
            parse("NVRM: GPU 0000:17:00.0: GPU has fallen off the bus."),
            Shape::FallenOffBus { pci: Some(_) }
        ));
        assert!(matches!(
            parse("NVRM: GPU at 0000:17:00.0 has fallen off the bus."),
            Shape::FallenOffBus { pci: Some(_) }
        ));
        assert!(matches!(
            parse("NVRM: The NVIDIA GPU 0000:17:00.0"),
            Shape::TheNvidiaGpu { .. }
        ));
        assert_eq!(
            parse("NVRM: fallen off the bus and is not responding to commands."),
            Shape::FallenOffBusTail
        );
        assert_eq!(
            parse("NVRM: RC all channels for critical error 79."),
            Shape::RcAllChannels { code: 79 }
        );
    }

    #[test]
    fn driver_failures() {
        assert!(
            matches!(parse("NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x62:0xffff:1863)"),
            Shape::InitFailure { pci: Some(_), code: Some(ref c), .. } if c == "0x62:0xffff:1863")
        );
        assert!(matches!(
            parse("NVRM: RmInitAdapter failed! (0x27:0x38:1193)"),
            Shape::InitFailure { pci: None, .. }
        ));
        assert!(matches!(
            parse("NVRM: GPU 0000:17:00.0: rm_init_adapter failed, device minor number 0"),
            Shape::InitFailure { pci: Some(_), .. }
        ));
        assert!(matches!(
            parse("NVRM: rm_init_adapter(0) failed"),
            Shape::InitFailure { .. }
        ));
        assert!(matches!(parse("nvidia 0000:17:00.0: loading /lib/firmware/nvidia/550.54.14/gsp_ga10x.bin failed with error -4"), Shape::InitFailure { pci: Some(_), .. }));
        assert!(matches!(
            parse("nvidia: Unknown symbol nvUvmInterfaceDeRegisterUvmOps (err -2)"),
            Shape::InitFailure { .. }
        ));
        assert!(matches!(
            parse("nvidia: disagrees about version of symbol module_layout"),
            Shape::InitFailure { .. }
        ));
        assert_eq!(
            parse("NVRM: API mismatch: the client has the version 550.90.07, but"),
            Shape::ApiMismatchHead {
                client: Some("550.90.07".into()),
                process: None,
                pid: None,
            }
        );
        assert_eq!(
            parse("NVRM: this kernel module has the version 550.54.14.  Please"),
            Shape::ApiMismatchKernel {
                kernel: "550.54.14".into()
            }
        );
    }

    #[test]
    fn harmless_lines() {
        for m in [
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024",
            "nvidia-uvm: Loaded the UVM driver, major device number 508.",
            "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.14",
            "nvidia: module license 'NVIDIA' taints kernel.",
            "nvidia: loading out-of-tree module taints kernel.",
            "nvidia: module verification failed: signature and/or required key missing - tainting kernel",
        ] {
            assert!(matches!(parse(m), Shape::Harmless | Shape::DriverLoaded { .. } | Shape::Other), "{m}: {:?}", parse(m));
        }
        assert_eq!(
            parse("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  575.51.03  Wed May 21 2025"),
            Shape::DriverLoaded {
                version: "575.51.03".into()
            }
        );
        assert_eq!(
            parse("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025"),
            Shape::DriverLoaded {
                version: "570.158.01".into()
            }
        );
    }
}
