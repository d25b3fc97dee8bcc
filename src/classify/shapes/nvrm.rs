//! `NVRM: ` lines and the other NVIDIA kernel modules' lines (nvidia-drm, nvidia-modeset, ...):
//! driver initialisation, GSP boot, banners and the generic error-word verdict.

use super::*;
pub(crate) use crate::classify::table::split_gpu_prefix;

/// Whether a `[drm:func [module]] *ERROR*` line is nvidia-drm's: the function is in
/// `[nvidia_drm]`, or the DRM core printed it for nvidia-drm (`... *ERROR* [nvidia-drm] ...`,
/// as `drm_new_set_master [drm]` does when nvidia-drm refuses modeset ownership).
pub fn is_nvidia_drm(msg: &str) -> bool {
    msg.contains("[nvidia_drm]") || msg.contains("[nvidia-drm]")
}

/// nvidia-drm's own notices, `[drm] [nvidia-drm] [GPU ID 0x00000100] TEXT`: most are harmless
/// ("Loading driver"), the ones with an error signal are errors (`nv_drm_reset_input_colorspace
/// failed with error code: -35`).
pub(super) fn drm_notice(rest: &str) -> Shape {
    let text = after_gpu_id(rest).trim();
    if is_harmless(text) || !has_error_signal(text) {
        return Shape::Harmless;
    }
    Shape::ModuleError {
        module: "nvidia-drm",
        pci: None,
        text: text.to_string(),
    }
}

/// nvidia-drm's text after the `[GPU ID 0x00000100] ` it puts before it, where it does.
pub(super) fn after_gpu_id(text: &str) -> &str {
    match text.strip_prefix("[GPU ID ") {
        Some(r) => r.split_once("] ").map_or(r, |(_, t)| t),
        None => text,
    }
}

/// Lines naming GSP firmware boot steps that failed: GSP never came up, so the GPU is unusable.
pub(super) const GSP_BOOT: &[&str] = &[
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
pub(super) const GSP_BOOT_FAILED: &[&str] = &[
    "No firmware image found",
    "too few interface entries",
    "too few interface entires", // sic, as the driver prints it
];

/// A line from an NVIDIA module other than NVRM: an error when it carries an error signal.
pub(super) fn module_line(module: &'static str, msg: &str) -> Shape {
    let text = match msg.split_once(": ") {
        Some((_, t)) => t,
        // `nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context`: the
        // module, then `function:line`, then the level and the text.
        None => msg.split_once(' ').map_or(msg, |(_, t)| t),
    }
    .trim_end();
    module_text(module, text)
}

/// A line of gdrcopy's kernel module (`gdrdrv`, NVIDIA's GPUDirect copy driver), whose tag has no
/// space after its colon and, in newer releases, the function and a colon after it:
/// `gdrdrv:gdrdrv_init:loading gdrdrv version 2.5 ...`, `gdrdrv:nvidia_p2p_get_pages(va=...)
/// failed [ret = -22]`. `body` is the text after `gdrdrv:`.
pub(super) fn gdrdrv_line(body: &str) -> Shape {
    let func = body
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    let text = match body[func..].strip_prefix(':') {
        Some(t) if func > 0 => t,
        _ => body,
    };
    module_text("gdrdrv", text.trim())
}

/// The verdict on a module line's text (its tag and function removed): an error when it carries
/// the module's ERROR level or an error word, unless it is a known-harmless notice.
fn module_text(module: &'static str, text: &str) -> Shape {
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

/// The driver's identity line, `GPU at PCI:0000:17:00: GPU-5f2c1e0a-...`: the address and the
/// UUID (its hex lower-cased after a `GPU-` prefix). The grammar is the pattern
/// `^GPU at (?:PCI:)?(ADDR): (GPU-[0-9A-Fa-f-]{8,64})` (a test holds the two to the same answers),
/// read by hand: every GPU prints this line at every driver load, and the pattern's captures
/// cost a tenth of reading a GPU host's NVIDIA lines.
pub(super) fn gpu_uuid_line(m: &str) -> Option<(PciAddress, String)> {
    let rest = m.strip_prefix("GPU at ")?;
    let rest = rest.strip_prefix("PCI:").unwrap_or(rest);
    let sep = crate::classify::find::find(rest.as_bytes(), b": GPU-")?;
    let addr = &rest[..sep];
    if !is_pci_text(addr) {
        return None;
    }
    let p = pci(addr)?;
    let after = &rest.as_bytes()[sep + 2 + 4..];
    let run = after
        .iter()
        .take(64)
        .take_while(|c| c.is_ascii_hexdigit() || **c == b'-')
        .count();
    if run < 8 {
        return None;
    }
    let mut uuid = String::with_capacity(4 + run);
    uuid.push_str("GPU-");
    for &c in &after[..run] {
        uuid.push(char::from(c.to_ascii_lowercase()));
    }
    Some((p, uuid))
}

/// Whether `s` is exactly `[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?`, the
/// address form of the driver's lines.
fn is_pci_text(s: &str) -> bool {
    let b = s.as_bytes();
    let hex_run = |at: usize, max: usize| {
        let n = b[at.min(b.len())..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .count();
        (1..=max).contains(&n).then_some(at + n)
    };
    let Some(i) = hex_run(0, 8) else { return false };
    if b.get(i) != Some(&b':') {
        return false;
    }
    let Some(i) = hex_run(i + 1, 2) else {
        return false;
    };
    if b.get(i) != Some(&b':') {
        return false;
    }
    let Some(i) = hex_run(i + 1, 2) else {
        return false;
    };
    match &b[i..] {
        [] => true,
        [b'.', f] => (b'0'..=b'7').contains(f),
        _ => false,
    }
}

pub(super) fn parse_nvrm(m: &str) -> Shape {
    if let [b'X', b'i', b'd', b' ' | b':', ..] = m.as_bytes() {
        let after = if m.as_bytes()[3] == b' ' {
            &m[4..]
        } else {
            &m[3..]
        };
        return match parse_xid_after(after) {
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
    if let Some((p, uuid)) = gpu_uuid_line(m) {
        return Shape::GpuUuid { pci: p, uuid };
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
        // A head cut before its versions (`API mismatch: the client has the version`, where a
        // paste or a terminal stopped): still the API mismatch, versions unknown.
        if body.starts_with("API mismatch: the client") {
            return Shape::ApiMismatchHead {
                client: None,
                process: None,
                pid: None,
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
pub(super) fn banner_version(m: &str) -> Option<String> {
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

/// Driver initialisation and probe failures after `NVRM: ` (and a GPU prefix): the fixed
/// wordings are rows of the shape table (`init.*`); Rust keeps the one whose early return guards
/// the GSP boot check, the any-spelling "init module failed" and the GSP boot word lists.
pub(super) fn parse_init(addr: Option<PciAddress>, body: &str) -> Option<Shape> {
    use crate::classify::table::{Table, Tag};
    if let Some(m) = Table::builtin().read(body, Tag::Nvrm, addr) {
        return Some(Shape::Row(m));
    }
    use crate::classify::shape_id as id;
    let fail = |id: &'static str, what: String, code: Option<String>, folds: bool| {
        Some(Shape::InitFailure {
            id,
            pci: addr,
            module: None,
            what,
            code,
            folds,
        })
    };
    if body.starts_with("RmInitAdapter failed") {
        let c = re_rm_init().captures(body)?;
        return fail(
            id::INIT_RM_ADAPTER,
            "RmInitAdapter failed".into(),
            c.get(1).map(|x| x.as_str().to_string()),
            false,
        );
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
            id::INIT_MODULE,
            "the NVIDIA kernel module failed to initialise".into(),
            None,
            false,
        );
    }
    let gsp_boot = GSP_BOOT.iter().any(|k| body.contains(k)) && has_error_signal(body);
    if (gsp_boot || GSP_BOOT_FAILED.iter().any(|k| body.contains(k))) && !is_harmless(body) {
        return fail(
            id::INIT_FIRMWARE_BOOT,
            format!("GPU firmware boot failed: {body}"),
            None,
            false,
        );
    }
    None
}

/// Lines of the GSP RPC diagnostic dump that follows a GSP timeout.
pub(super) fn is_gsp_dump_line(body: &str) -> bool {
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

pub(super) fn parse_nvidia_other(m: &str) -> Shape {
    if let Some(after) = m.strip_prefix("nvidia ") {
        if let Some(c) = re_fw_load().captures(m) {
            if is_harmless(&c[2]) {
                return Shape::Harmless;
            }
            return Shape::InitFailure {
                id: crate::classify::shape_id::INIT_FIRMWARE_LOAD,
                pci: pci(&c[1]),
                module: None,
                what: format!("loading firmware {} failed with error {}", &c[2], &c[3]),
                code: Some(c[3].to_string()),
                folds: false,
            };
        }
        if let Some(c) = re_probe_driver().captures(m) {
            return Shape::InitFailure {
                id: crate::classify::shape_id::INIT_PROBE_DRIVER,
                pci: pci(&c[1]),
                module: None,
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
            id: crate::classify::shape_id::INIT_PROBE,
            pci: pci(&c[1]),
            module: None,
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
            id: crate::classify::shape_id::INIT_VERSION_MAGIC,
            pci: None,
            module: Some(c[1].to_string()),
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
    if m.starts_with("nvidia-modeset: ") {
        // Rows `modeset.*` of the shape table: its ERROR and WARNING levels, and the rest quiet.
        if let Some(r) = crate::classify::table::Table::builtin().read(
            m,
            crate::classify::table::Tag::None,
            None,
        ) {
            return if r.silence {
                Shape::Harmless
            } else {
                Shape::Row(r)
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
