//! The shapes of the lines the NVIDIA driver and the PCIe core print, as pure parsers from one
//! message line (prefix already removed) to a typed [`Shape`].
//!
//! Regexes run only on lines that already passed the literal prefilter and the tag check, so their
//! cost does not show on the hot path.

use std::sync::OnceLock;

use regex::Regex;

use crate::model::PciAddress;

/// One understood message line, before catalog lookup and multi-line folding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    Xid(XidLine),
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
    /// decides whether it is a fall off the bus or a harmless "not supported" notice.
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
    },
    /// `NVRM: API mismatch: the client has the version X, but`
    ApiMismatchHead {
        client: String,
    },
    /// `NVRM: this kernel module has the version Y.  Please`
    ApiMismatchKernel {
        kernel: String,
    },
    /// The last two lines of the API mismatch message.
    ApiMismatchTail,
    /// A GSP / RPC diagnostic line: opens or continues a GSP dump.
    GspDump {
        opens: bool,
        text: String,
    },
    /// Other NVRM errors without an Xid.
    DriverError {
        pci: Option<PciAddress>,
        text: String,
        critical: bool,
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
    pub pci: PciAddress,
    pub xid: u32,
    pub pid: Option<u32>,
    pub process: Option<String>,
    /// The message after the address, Xid, pid and name.
    pub rest: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SxidLine {
    pub switch: String,
    pub pci: PciAddress,
    pub sxid: u32,
    /// `Some(true)` Fatal, `Some(false)` Non-fatal, `None` for a continuation line.
    pub fatal: Option<bool>,
    pub rest: String,
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
    pub text: String,
}

const ADDR: &str = r"[0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{1,2}:[0-9A-Fa-f]{1,2}(?:\.[0-7])?";

struct Re {
    xid: Regex,
    pid_name: Regex,
    gpu_uuid: Regex,
    serial: Regex,
    gpu_prefix: Regex,
    rm_init: Regex,
    rm_init_minor: Regex,
    rm_init_old: Regex,
    api_head: Regex,
    api_kernel: Regex,
    rc_all: Regex,
    probe_failed: Regex,
    loading: Regex,
    sxid: Regex,
    aer_dev: Regex,
    aer_received: Regex,
    aer_class: Regex,
    fw_load: Regex,
    probe_driver: Regex,
    module_sym: Regex,
    banner: Regex,
}

fn re() -> &'static Re {
    static RE: OnceLock<Re> = OnceLock::new();
    RE.get_or_init(|| {
        let r = |s: &str| Regex::new(&s.replace("ADDR", ADDR)).expect("built-in regex");
        Re {
            // Anchor on "): <number>": the first number after "Xid" is the PCI domain.
            xid: r(r"^Xid \((?:PCI:)?(ADDR)\):\s*(\d{1,10})(?:(?:,\s*|\s+)(.*))?$"),
            pid_name: r(r"^(?:pid=('?<unknown>'?|'?\d+'?),?\s*)?(?:name=([^,]*),?\s*)?(.*)$"),
            gpu_uuid: r(r"^GPU at (?:PCI:)?(ADDR): (GPU-[0-9A-Fa-f-]{8,64})"),
            serial: r(r"^GPU Board Serial Number: (\S{1,64})"),
            gpu_prefix: r(r"^GPU (ADDR): (.*)$"),
            rm_init: r(r"^RmInitAdapter failed!\s*(?:\(([^)]*)\))?"),
            rm_init_minor: r(r"^rm_init_adapter failed, device minor number (\d+)"),
            rm_init_old: r(r"^rm_init_adapter\((\d+)\) failed"),
            api_head: r(r"^API mismatch: the client has the version (\S+?),? but"),
            api_kernel: r(r"^this kernel module has the version (\S+?)\.?\s+Please"),
            rc_all: r(r"^RC all channels for critical error (\d+)"),
            probe_failed: r(r"^The NVIDIA probe routine failed for (\d+) device"),
            loading: r(r"^The NVIDIA GPU (ADDR)\s*(.*)$"),
            sxid: r(r"^(nvidia-nvswitch\d*): SXid \((?:PCI:)?(ADDR)\): (\d{1,10}),\s*(.*)$"),
            aer_dev: r(r"^(pcieport|nvidia) (ADDR): AER: (.*)$"),
            aer_received: r(
                r"(Corrected|Uncorrected \((?:Fatal|Non-Fatal)\)|Multiple Corrected|Multiple Uncorrected \((?:Fatal|Non-Fatal)\)) error (?:message )?received(?::| from)\s*(?:id=\S+\s*)?(ADDR)?",
            ),
            aer_class: r(r"severity=(Corrected|Uncorrected \((?:Fatal|Non-Fatal)\))"),
            fw_load: r(r"^nvidia (ADDR): (?:Direct firmware load for|loading) (\S+) failed with error (-?\d+)"),
            probe_driver: r(r"^nvidia (ADDR): probe with driver nvidia failed with error (-?\d+)"),
            module_sym: r(r"^(nvidia[\w-]*): (disagrees about version of symbol|Unknown symbol) (\S+)"),
            banner: r(r"^loading NVIDIA UNIX .*?Kernel Module\s+(\d+\.\d+(?:\.\d+)?)"),
        }
    })
}

fn pci(s: &str) -> Option<PciAddress> {
    PciAddress::parse(s).ok()
}

/// Classifies one message line (starting at its tag).
pub fn parse(msg: &str) -> Shape {
    if let Some(rest) = msg.strip_prefix("NVRM: ") {
        return parse_nvrm(rest.trim_end());
    }
    if msg.starts_with("nvidia-nvswitch") {
        if let Some(s) = parse_sxid(msg) {
            return Shape::Sxid(s);
        }
        return Shape::Other;
    }
    if msg.starts_with("pcieport ") || msg.starts_with("nvidia ") {
        if let Some(a) = parse_aer(msg) {
            return Shape::Aer(a);
        }
    }
    if msg.starts_with("nvidia") {
        return parse_nvidia_other(msg);
    }
    Shape::Other
}

fn parse_nvrm(m: &str) -> Shape {
    let r = re();
    if m.starts_with("Xid ") {
        return match parse_xid(m) {
            Some(x) => Shape::Xid(x),
            // Never silent: an Xid line in a shape we do not know is still reported.
            None => Shape::UnreadableXid,
        };
    }
    if let Some(c) = r.gpu_uuid.captures(m) {
        if let Some(p) = pci(&c[1]) {
            return Shape::GpuUuid {
                pci: p,
                uuid: c[2].to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
            };
        }
    }
    if let Some(c) = r.serial.captures(m) {
        return Shape::BoardSerial(c[1].to_string());
    }
    if m.starts_with("loading NVIDIA UNIX") {
        return match r.banner.captures(m) {
            Some(c) => Shape::DriverLoaded {
                version: c[1].to_string(),
            },
            None => Shape::Harmless,
        };
    }
    // Many messages start with "GPU 0000:17:00.0: "; take the address, classify the rest.
    let (addr, body) = match r.gpu_prefix.captures(m) {
        Some(c) => match (pci(&c[1]), c.get(2)) {
            (Some(p), Some(b)) => (Some(p), b.as_str()),
            _ => (None, m),
        },
        None => (None, m),
    };
    if body.contains("has fallen off the bus") {
        let p = addr.or_else(|| {
            body.strip_prefix("GPU at ")
                .and_then(|s| s.split_whitespace().next())
                .and_then(pci)
        });
        return Shape::FallenOffBus { pci: p };
    }
    if let Some(c) = r.loading.captures(body) {
        if let Some(p) = pci(&c[1]) {
            let rest = c.get(2).map_or("", |x| x.as_str()).to_string();
            if rest.contains("fallen off the bus") {
                return Shape::FallenOffBus { pci: Some(p) };
            }
            return Shape::TheNvidiaGpu { pci: p, rest };
        }
    }
    if body.starts_with("fallen off the bus") {
        return Shape::FallenOffBusTail;
    }
    if let Some(c) = r.rc_all.captures(body) {
        if let Ok(code) = c[1].parse() {
            return Shape::RcAllChannels { code };
        }
    }
    if let Some(c) = r.rm_init.captures(body) {
        return Shape::InitFailure {
            pci: addr,
            what: "RmInitAdapter failed".into(),
            code: c.get(1).map(|x| x.as_str().to_string()),
        };
    }
    if let Some(c) = r.rm_init_minor.captures(body) {
        return Shape::InitFailure {
            pci: addr,
            what: format!("rm_init_adapter failed for device minor {}", &c[1]),
            code: None,
        };
    }
    if let Some(c) = r.rm_init_old.captures(body) {
        return Shape::InitFailure {
            pci: addr,
            what: format!("rm_init_adapter failed for device minor {}", &c[1]),
            code: None,
        };
    }
    if body.starts_with("RmInitAdapter: Cannot initialize GSP firmware RM") {
        return Shape::InitFailure {
            pci: addr,
            what: "cannot initialise GSP firmware RM".into(),
            code: None,
        };
    }
    if let Some(c) = r.probe_failed.captures(body) {
        return Shape::InitFailure {
            pci: addr,
            what: format!("the NVIDIA probe routine failed for {} device(s)", &c[1]),
            code: None,
        };
    }
    if body.starts_with("None of the NVIDIA devices were initialized") {
        return Shape::InitFailure {
            pci: addr,
            what: "none of the NVIDIA devices were initialised".into(),
            code: None,
        };
    }
    if body.starts_with("No NVIDIA devices probed") {
        return Shape::InitFailure {
            pci: addr,
            what: "no NVIDIA devices probed".into(),
            code: None,
        };
    }
    if let Some(c) = r.api_head.captures(body) {
        return Shape::ApiMismatchHead {
            client: c[1].to_string(),
        };
    }
    if let Some(c) = r.api_kernel.captures(body) {
        return Shape::ApiMismatchKernel {
            kernel: c[1].to_string(),
        };
    }
    if body.starts_with("make sure that this kernel module and all NVIDIA driver")
        || body.starts_with("components have the same version")
    {
        return Shape::ApiMismatchTail;
    }
    if body.contains("does not have the necessary power cables connected") {
        return Shape::InitFailure {
            pci: addr,
            what: "the GPU's auxiliary power cables are not connected".into(),
            code: None,
        };
    }
    if body.contains("PCI I/O region assigned to your NVIDIA device is invalid") {
        return Shape::InitFailure {
            pci: addr,
            what: "the PCI I/O region assigned to the GPU is invalid".into(),
            code: None,
        };
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
    if is_harmless_nvrm(body) {
        return Shape::Harmless;
    }
    let lower = body.to_ascii_lowercase();
    if [
        "error",
        "failed",
        "failure",
        "timeout",
        "timed out",
        "fatal",
    ]
    .iter()
    .any(|w| lower.contains(w))
    {
        return Shape::DriverError {
            pci: addr,
            text: body.to_string(),
            critical: false,
        };
    }
    Shape::Other
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

fn is_harmless_nvrm(body: &str) -> bool {
    const HARMLESS: &[&str] = &[
        "loading NVIDIA UNIX",
        "Persistence mode",
        "nvidia-persistenced",
        "GPU at PCI:", // identity lines without a UUID we could parse
        "RmInitAdapter succeeded",
        "ACPI",
        "failed to open /proc/driver/nvidia/params", // user tools probing before load
    ];
    HARMLESS.iter().any(|h| body.starts_with(h))
}

/// Parses an Xid line after `NVRM: `.
pub fn parse_xid(m: &str) -> Option<XidLine> {
    let r = re();
    let c = r.xid.captures(m)?;
    let pci = pci(&c[1])?;
    let xid: u32 = c[2].parse().ok()?;
    let tail = c.get(3).map_or("", |x| x.as_str());
    let (mut pid, mut process, mut rest) = (None, None, tail.to_string());
    if let Some(pc) = r.pid_name.captures(tail) {
        pid = pc
            .get(1)
            .and_then(|p| p.as_str().trim_matches('\'').parse().ok());
        process = pc
            .get(2)
            .map(|n| n.as_str().trim())
            .filter(|n| !n.is_empty() && *n != "<unknown>" && *n != "'<unknown>'")
            .map(str::to_string);
        rest = pc.get(3).map_or("", |x| x.as_str()).to_string();
    }
    Some(XidLine {
        pci,
        xid,
        pid,
        process,
        rest: rest.trim().to_string(),
    })
}

fn parse_sxid(m: &str) -> Option<SxidLine> {
    let c = re().sxid.captures(m)?;
    let rest = c[4].trim().to_string();
    let lower = rest.to_ascii_lowercase();
    let fatal = if lower.starts_with("non-fatal") || lower.starts_with("nonfatal") {
        Some(false)
    } else if lower.starts_with("fatal") {
        Some(true)
    } else {
        None
    };
    Some(SxidLine {
        switch: c[1].to_string(),
        pci: pci(&c[2])?,
        sxid: c[3].parse().ok()?,
        fatal,
        rest,
    })
}

fn parse_aer(m: &str) -> Option<AerLine> {
    let r = re();
    let c = r.aer_dev.captures(m)?;
    let reporter = pci(&c[2])?;
    let text = c[3].trim().to_string();
    let (mut source, mut class) = (None, None);
    if let Some(rc) = r.aer_received.captures(&text) {
        class = Some(rc[1].trim_start_matches("Multiple ").to_string());
        source = rc.get(2).and_then(|a| pci(a.as_str()));
    } else if let Some(cc) = r.aer_class.captures(&text) {
        class = Some(cc[1].to_string());
    }
    Some(AerLine {
        reporter,
        driver: c[1].to_string(),
        source,
        class,
        nvidia_device: text.contains("[10de:"),
        text,
    })
}

fn parse_nvidia_other(m: &str) -> Shape {
    let r = re();
    if let Some(c) = r.fw_load.captures(m) {
        return Shape::InitFailure {
            pci: pci(&c[1]),
            what: format!("loading firmware {} failed with error {}", &c[2], &c[3]),
            code: Some(c[3].to_string()),
        };
    }
    if let Some(c) = r.probe_driver.captures(m) {
        return Shape::InitFailure {
            pci: pci(&c[1]),
            what: format!("probe with driver nvidia failed with error {}", &c[2]),
            code: Some(c[2].to_string()),
        };
    }
    if let Some(c) = r.module_sym.captures(m) {
        return Shape::InitFailure {
            pci: None,
            what: format!("module {}: {} {}", &c[1], &c[2], &c[3]),
            code: None,
        };
    }
    Shape::Harmless
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
            (x.pci.to_string(), x.xid, x.pid),
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
        assert_eq!(x.pci.to_string(), "4a7f1:00:00.0");
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
            "NVRM: Xid (garbage): 79, x",
            "NVRM: Xid (PCI:0000:17:00): 99999999999, x",
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
                client: "550.90.07".into()
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
    }
}
