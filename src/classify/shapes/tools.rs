//! Texts of the tools around the driver: nvidia-smi and NVML, the X server's NVIDIA driver, the
//! user-space API mismatch, the container toolkit, Fabric Manager and the device plugin.

use super::*;

/// nvidia-smi and NVML error texts pasted into logs and reports.
/// The fixed wordings are rows of the shape table (`tool.*`); Rust keeps the ones that depend on
/// where a phrase sits or on the reason that follows it, NVML's exception names and the table.
pub(super) fn parse_tool(msg: &str) -> Option<Shape> {
    use crate::classify::table::{Table, Tag};
    let t = msg.trim();
    if let Some(m) = Table::builtin().read(t, Tag::None, None) {
        return Some(Shape::Row(m));
    }
    let (critical, pci) = if driver_unreachable_start(t) == Some(0) {
        (true, None)
    } else if nvml_failure_start(t) == Some(0) {
        // `Failed to initialize NVML: ...`, `Failed to properly shut down NVML: ...`: a kernel
        // module and a library of different versions stop every NVML client (critical), the
        // other reasons stop this one.
        let reason = t.split_once(NVML_COLON).map_or("", |(_, r)| r.trim_start());
        (reason.starts_with("Driver/library version mismatch"), None)
    } else if let Some(name) = nvml_exception(t) {
        // A lost GPU is critical; a capability or permission answer is no fault at all.
        if NVML_ANSWERS.contains(&name) {
            return Some(Shape::Harmless);
        }
        (name == "GpuIsLost", None)
    } else if let Some((0, name)) = nvml_code(t) {
        if NVML_ANSWERS.contains(&name) {
            return Some(Shape::Harmless);
        }
        (matches!(name, "GpuIsLost" | "ResetRequired"), None)
    } else if is_smi_error_row(t) {
        // A GPU row of the nvidia-smi table whose fields read `ERR!`: nvidia-smi could not read
        // the GPU at all.
        (false, None)
    } else if t.starts_with("nvmlDevice") {
        // A bare NVML call failure (`nvmlDeviceGetCount ...`); stays here until a real line of
        // this shape is among the fixtures to be a table row's example.
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
pub(super) const DRIVER_UNREACHABLE: &str = "communicate with the NVIDIA driver";

/// Where a "cannot communicate with the NVIDIA driver" sentence starts in `line`: at the failure
/// words just before the phrase (`Unable to`, `Failed to`, `Could not`, `couldn't`).
pub fn driver_unreachable_start(line: &str) -> Option<usize> {
    let i = crate::classify::find::find(line.as_bytes(), DRIVER_UNREACHABLE.as_bytes())?;
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
/// `NVMLError_GpuIsLost: GPU is lost`, with the class's module path however the binding's
/// package lays it out (`pynvml.nvml.NVMLError_...`, `nvidia_smi.NVMLError_...`). The error's
/// name, when `t` is such a line.
pub fn nvml_exception(t: &str) -> Option<&str> {
    let rest = &t[module_path_len(t)..];
    let rest = rest.strip_prefix(NVML_EXCEPTION)?;
    let end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    (end > 0 && rest[end..].starts_with(':')).then(|| &rest[..end])
}

/// The length of a Python module path at the start of `t` (`pynvml.nvml.`): dotted identifiers,
/// the last dot included; 0 when there is none.
pub(crate) fn module_path_len(t: &str) -> usize {
    let run = t.bytes().take_while(|&b| is_module_path_byte(b)).count();
    t[..run].rfind('.').map_or(0, |d| d + 1)
}

/// A byte of a Python module path: an identifier's or a dot.
pub fn is_module_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.')
}

/// The class prefix of NVML's Python exceptions.
pub const NVML_EXCEPTION: &str = "NVMLError_";

/// NVML errors that answer a question ("not supported here", "not allowed for this user", "no
/// such object") rather than report a fault: tools ask and carry on.
pub(super) const NVML_ANSWERS: &[&str] = &[
    "NotSupported",
    "NoPermission",
    "NotFound",
    "FunctionNotFound",
    "InvalidArgument",
    "AlreadyInitialized",
    "Uninitialized",
    "InsufficientSize",
    "InUse",
    "NoData",
    "VgpuEccNotSupported",
    "FreqNotSupported",
    "ArgumentVersionMismatch",
    "Deprecated",
    "NotReady",
];

/// NVML's return codes by number (`nvmlReturn_t` in NVIDIA's `nvml.h`), named as its Python
/// binding names its exceptions, so that a code by number and an exception by name read alike.
const NVML_CODES: &[(u32, &str)] = &[
    (1, "Uninitialized"),
    (2, "InvalidArgument"),
    (3, "NotSupported"),
    (4, "NoPermission"),
    (5, "AlreadyInitialized"),
    (6, "NotFound"),
    (7, "InsufficientSize"),
    (8, "InsufficientPower"),
    (9, "DriverNotLoaded"),
    (10, "Timeout"),
    (11, "IrqIssue"),
    (12, "LibraryNotFound"),
    (13, "FunctionNotFound"),
    (14, "CorruptedInforom"),
    (15, "GpuIsLost"),
    (16, "ResetRequired"),
    (17, "OperatingSystem"),
    (18, "LibRmVersionMismatch"),
    (19, "InUse"),
    (20, "Memory"),
    (21, "NoData"),
    (22, "VgpuEccNotSupported"),
    (23, "InsufficientResources"),
    (24, "FreqNotSupported"),
    (25, "ArgumentVersionMismatch"),
    (26, "Deprecated"),
    (27, "NotReady"),
    (28, "GpuNotFound"),
    (29, "InvalidState"),
    (999, "Unknown"),
];

/// Where an NVML call failure that a tool reports by its return code starts, at `NVML`, with the
/// code's name. By number: `WARN: NVML: can't get GPU #0, error code 15` (a miner's words), `NVML:
/// cannot get fan speed, error 999 (an internal driver error occurred)` (another miner's, with
/// NVML's description of the code), `NVML error at line 339: 1` (a vGPU scheduler's hook, by its
/// source line); by the name a binding gives the code: `NVML power get failed with status:
/// GPUIsLost` (a .NET binding's enum), `... failed with code: NVML_ERROR_GPU_IS_LOST`. A number or
/// a name NVML does not define is no NVML code.
pub fn nvml_code(line: &str) -> Option<(usize, &'static str)> {
    let at = crate::classify::find::find(line.as_bytes(), b"NVML")?;
    let rest = &line[at..];
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let by_number = |code: &str| {
        let code: u32 = code.parse().ok()?;
        NVML_CODES.iter().find(|c| c.0 == code).map(|c| c.1)
    };
    let name = if let Some(i) = crate::classify::find::find(rest.as_bytes(), b"error code ") {
        let n = &rest[i + "error code ".len()..];
        by_number(&n[..digits(n)])?
    } else if let Some(n) = rest.strip_prefix("NVML error at line ") {
        let n = n[digits(n)..].strip_prefix(": ")?;
        let d = digits(n);
        // The code ends the message: `: 1` and nothing but punctuation after it.
        if !n[d..].trim_end_matches(['.', ' ', '\r']).is_empty() {
            return None;
        }
        by_number(&n[..d])?
    } else if let Some(i) = crate::classify::find::find(rest.as_bytes(), b", error ") {
        // `, error 999` ending the message or followed by the code's description in parentheses.
        let n = &rest[i + ", error ".len()..];
        let d = digits(n);
        let after = n[d..].trim_end();
        if !(after.is_empty() || after.starts_with(" (")) {
            return None;
        }
        by_number(&n[..d])?
    } else {
        code_by_name(rest)?
    };
    Some((at, name))
}

/// NVML's return code by the name a binding gives it, after a failure's `status: ` or `code: `
/// (`GPUIsLost`, `GpuIsLost`, `NVML_ERROR_GPU_IS_LOST`): the name as [`NVML_CODES`] spells it.
fn code_by_name(rest: &str) -> Option<&'static str> {
    let b = rest.as_bytes();
    // Only where the line says something failed (`failed`, `Error`): a status that is read out,
    // not one that is complained of, is no failure.
    let failed = crate::classify::find::find(b, b"fail").is_some()
        || crate::classify::find::find(b, b"rror").is_some();
    if !failed {
        return None;
    }
    let i = ["status: ", "code: "]
        .iter()
        .find_map(|k| crate::classify::find::find(b, k.as_bytes()).map(|i| i + k.len()))?;
    let word = &rest[i..];
    let end = word
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(word.len());
    if !word[end..]
        .trim_end_matches(['.', ' ', '\r', ')', '"', '\''])
        .is_empty()
    {
        return None;
    }
    let word = &word[..end];
    let word = word
        .strip_prefix("NVML_ERROR_")
        .or_else(|| word.strip_prefix("ERROR_"))
        .unwrap_or(word);
    // `GPU_IS_LOST` and `GPUIsLost` are `GpuIsLost`: the letters alike but for case, no `_`.
    let letters = |s: &'static str| s.bytes().map(|b| b.to_ascii_lowercase());
    let key = || {
        word.bytes()
            .filter(|&b| b != b'_')
            .map(|b| b.to_ascii_lowercase())
    };
    NVML_CODES
        .iter()
        .find(|c| letters(c.1).eq(key()))
        .map(|c| c.1)
}

/// The nvidia-smi marker for a field it could not read, padded as the table prints it (a
/// single-spaced `ERR!` is npm's, not nvidia-smi's).
pub const SMI_ERR_FIELD: &str = "  ERR!  ";

/// Whether `t` is a row of the nvidia-smi GPU table (`|   0  ERR!   Off  | 00000000:01:00.0 ...|`)
/// with a field that reads `ERR!`.
pub fn is_smi_error_row(t: &str) -> bool {
    let t = t.trim();
    t.len() > 2 && t.starts_with('|') && t.ends_with('|') && t.contains(SMI_ERR_FIELD)
}

/// Without the space after it: some tools print `Failed to initialize NVML:Function Not Found.`
pub(super) const NVML_COLON: &str = " NVML:";

/// Where an NVML call failure as nvidia-smi words it starts in `line`: `Failed to <what> NVML:
/// <reason>`, `<what>` being a few plain words (`initialize`, `properly shut down`).
pub fn nvml_failure_start(line: &str) -> Option<usize> {
    // Most tools add the reason (`Failed to initialize NVML: Unknown Error`); some print the bare
    // failure (`Error: Failed to initialize NVML`), the reason being in another log.
    let colon =
        crate::classify::find::find(line.as_bytes(), NVML_COLON.as_bytes()).or_else(|| {
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

/// Whether `s` starts with the X server NVIDIA driver's tag: `NVIDIA: ` or `NVIDIA(SCREEN): `
/// with a short screen name (`0`, `G0`, `GPU-0`).
pub fn xorg_tag_ok(s: &str) -> bool {
    xorg_body(s).is_some()
}

/// The text after the X driver's tag.
pub(super) fn xorg_body(s: &str) -> Option<&str> {
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
pub(super) fn parse_user_api(msg: &str) -> Option<Shape> {
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
pub(super) fn parse_xorg(msg: &str) -> Option<Shape> {
    let body = xorg_body(msg)?;
    if body.starts_with(char::is_whitespace) {
        return Some(Shape::Other);
    }
    let body = body.trim_end_matches(['`', ' ']);
    if let Some(s) = parse_user_api(body) {
        return Some(s);
    }
    if x_module_load_failure(body) {
        return Some(x_module_error(body));
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
            id: crate::classify::shape_id::INIT_X_GPU,
            pci: xorg_pci(at),
            module: None,
            what: "the X server's NVIDIA driver failed to initialise the GPU (the kernel log says why)"
                .into(),
            code: None,
            folds: true,
        });
    }
    // Older drivers say "load" where newer ones say "initialize".
    if body.starts_with("Failed to initialize the NVIDIA kernel module")
        || body.starts_with("Failed to load the NVIDIA kernel module")
    {
        return Some(Shape::InitFailure {
            id: crate::classify::shape_id::INIT_X_MODULE,
            pci: None,
            module: None,
            what: "the X server's NVIDIA driver could not initialise the NVIDIA kernel module"
                .into(),
            code: None,
            folds: true,
        });
    }
    Some(Shape::Other)
}

/// The X server failing to load an NVIDIA module: its loader's `Failed to load module "nvidia"
/// (module does not exist, 0)`, or the NVIDIA driver's own `NVIDIA: Failed to load module
/// "glxserver_nvidia" ...` (its GLX extension) or `Failed to initialize the GLX module`. The
/// driver's X components are missing or do not match it, and X runs without the GPU.
pub fn x_module_load_failure(body: &str) -> bool {
    body.strip_prefix("Failed to load module \"")
        .and_then(|rest| rest.split('"').next())
        .is_some_and(|module| module.contains("nvidia"))
        // The loader naming the file it could not load, where the file or what it lacked is
        // NVIDIA's (`Failed to load /usr/lib/xorg/modules/drivers/nvidia_drv.so: ... Undefined
        // symbol "TimerForce"`, a GLX whose `libnvidia-tls.so.346.35` is missing).
        || body
            .strip_prefix("Failed to load /")
            .and_then(|rest| rest.split_once(": "))
            .is_some_and(|(path, why)| {
                path.rsplit('/').next().is_some_and(|f| f.contains("nvidia"))
                    || path.contains("/nvidia")
                    || why.contains("libnvidia")
            })
        // The NVIDIA driver finding no GLX module of its own loaded (`Failed to initialize the
        // GLX module; please check in your X log file that the GLX module has been loaded`):
        // another GLX is in its place, or none.
        || body.starts_with("Failed to initialize the GLX module")
}

/// The finding for [`x_module_load_failure`]: an error of the X server's NVIDIA driver module.
pub(super) fn x_module_error(body: &str) -> Shape {
    Shape::ModuleError {
        module: "nvidia_drv",
        pci: None,
        text: body.to_string(),
    }
}

/// The X server's `PCI:BUS:DEVICE:FUNCTION` (decimal, domain 0, or `BUS@DOMAIN:DEVICE:FUNCTION`).
pub(super) fn xorg_pci(s: &str) -> Option<PciAddress> {
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

/// The container toolkit's hook failing on NVML, CUDA or the driver (`nvidia-container-cli:
/// initialization error: nvml error: driver/library version mismatch`, `... detection error: nvml
/// error: unknown error`), finding no GPU where it looks for one, or finding the host's driver
/// too old for the image: no container gets the GPU. Its other errors (cgroups, mounts, a missing
/// binary, an image's malformed requirement) are the container setup's, not the GPU's, and stay
/// quiet.
pub(super) fn container_cli(m: &str) -> Option<Shape> {
    let rest = m.strip_prefix("nvidia-container-cli")?;
    let (_, text) = rest.split_once(": ")?;
    let text = text.trim_end();
    let driver = CONTAINER_CLI_GPU_CAUSES.iter().any(|c| text.contains(c));
    if !driver {
        return Some(Shape::Harmless);
    }
    Some(Shape::ToolError {
        pci: None,
        critical: text.contains("version mismatch"),
        text: text.to_string(),
    })
}

/// What the container hook's error says about the GPU or its driver, not the container's set-up.
const CONTAINER_CLI_GPU_CAUSES: &[&str] = &[
    // NVML or the driver failing, or CUDA failing to start on the GPU (`initialization error:
    // cuda error: unknown error`), or the hook's helper not answering for the driver
    // (`driver rpc error: timed out`).
    "nvml error",
    "driver error",
    "driver rpc error",
    "cuda error",
    // WSL without a GPU passed through to it (`initialization error: WSL environment detected
    // but no adapters were found`): the GPU is missing from the machine's point of view. The
    // hook says "WSL environment detected but" of nothing else, and pages cut the line short.
    "WSL environment detected but",
    // The image needs a newer CUDA than the host's driver gives (`requirement error:
    // unsatisfied condition: cuda>=12.8, please update your driver ...`): the node cannot run
    // it until its driver is upgraded. A malformed requirement (`invalid expression`) is the
    // image's mistake and stays quiet.
    "unsatisfied condition",
    // A device node of the driver missing on the host (`mount error: stat failed: /dev/nvidiactl:
    // no such file or directory`): the kernel module is not loaded, or its nodes were never made.
    "stat failed: /dev/nvidia",
];

/// A Fabric Manager record: bare, as its log file holds it (`[ERROR] [tid 841] ...`, the stamp
/// left in the prefix), or after the journal's `nv-fabricmanager[pid]: ` tag, with or without its
/// own stamp and level. A record at a level that is never a finding is harmless; journal text
/// without a level that is none of the known failures is left to the other daemon checks.
pub(super) fn fabric_manager(msg: &str) -> Option<Shape> {
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
pub(super) fn daemon_version_mismatch(msg: &str) -> Option<Shape> {
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
