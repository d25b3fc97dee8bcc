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

mod events;
mod nvrm;
mod tools;
mod trace;
mod words;

pub use events::*;
pub use nvrm::*;
pub use tools::*;
pub use trace::*;
pub use words::*;

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
        /// Which failure ([`crate::classify::shape_id`]): the incident's key when no GPU is named.
        id: &'static str,
        pci: Option<PciAddress>,
        /// The NVIDIA module that failed, when the line names one.
        module: Option<String>,
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
        /// Whether `module` is only the task's name read as a module (`nvc:[driver]`, an NVIDIA
        /// tool or kernel thread): a frame in an NVIDIA module says better where it is stuck.
        by_task: bool,
        text: String,
    },
    /// One frame of a call trace; `module` when the frame is in an NVIDIA module.
    TraceFrame {
        module: Option<&'static str>,
    },
    Sxid(SxidLine),
    Aer(AerLine),
    /// A line of a firmware-first hardware error record (`[Hardware Error]: ...`, APEI/CPER).
    Cper(CperLine),
    /// The driver's load banner; carries the version (it decides the NVLink5 register layout).
    DriverLoaded {
        version: String,
    },
    /// A line a shape-table row read (built-in `shapes.toml` or the site's configuration).
    Row(crate::classify::table::RowMatch),
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

/// What one line of a firmware-first (APEI) hardware error record says. The firmware reports a
/// PCIe error in a block of lines: its severity, its section type, the device's address and its
/// vendor; the block is a GPU's error when the vendor is NVIDIA's or the device is a known GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CperLine {
    /// `Hardware error from APEI Generic Hardware Error Source: 1`: a record starts.
    Start,
    /// `event severity: fatal` (`recoverable`, `corrected`, `info`).
    Severity(String),
    /// `section_type: PCIe error`.
    Section(String),
    /// `device_id: 0000:e3:00.0` (the PCIe section's address).
    Device(PciAddress),
    /// `vendor_id: 0x10de, device_id: 0x2bb5`.
    Vendor(u16),
    Other,
}

/// Reads a `[Hardware Error]: ` line (after the record index `{8}` some kernels print first).
pub fn parse_cper(msg: &str) -> Option<CperLine> {
    let rest = msg
        .trim_start_matches(|c: char| c == '{' || c == '}' || c.is_ascii_digit())
        .strip_prefix("[Hardware Error]:")?
        .trim();
    Some(if rest.starts_with("Hardware error from APEI") {
        CperLine::Start
    } else if let Some(s) = rest.strip_prefix("event severity:") {
        CperLine::Severity(s.trim().to_ascii_lowercase())
    } else if let Some(s) = rest.strip_prefix("section_type:") {
        CperLine::Section(s.trim().to_string())
    } else if let Some(v) = rest.strip_prefix("vendor_id:") {
        let v = v.split(',').next().unwrap_or("").trim();
        let v = v.strip_prefix("0x").unwrap_or(v);
        u16::from_str_radix(v, 16).map_or(CperLine::Other, CperLine::Vendor)
    } else if let Some(d) = rest.strip_prefix("device_id:") {
        PciAddress::parse(d.trim()).map_or(CperLine::Other, CperLine::Device)
    } else {
        CperLine::Other
    })
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

/// A regex of a rare shape, behind a literal every line it matches holds: a line without the
/// literal is turned away by one substring search, and the regex is compiled the first time a
/// line with it comes. Why: these are tried in turn on every line of their prefix (every
/// `nvidia-uvm:` or `nvidia 0000:..:` line runs past the module-error ones), and one of them
/// (`[\w-]*`, Unicode classes) compiled to a one-pass DFA of a megabyte at its first try, an
/// ordinary log's first UVM banner paying for a version-magic error it never had.
pub(super) struct Guarded {
    /// A substring of every line the pattern matches (a test checks the pattern spells it).
    needle: &'static str,
    pattern: &'static str,
    re: OnceLock<Regex>,
}

impl Guarded {
    const fn new(needle: &'static str, pattern: &'static str) -> Guarded {
        Guarded {
            needle,
            pattern,
            re: OnceLock::new(),
        }
    }

    fn regex(&self) -> &Regex {
        self.re.get_or_init(|| {
            Regex::new(&self.pattern.replace("ADDR", ADDR)).expect("built-in regex")
        })
    }

    fn holds_needle(&self, text: &str) -> bool {
        crate::classify::find::find(text.as_bytes(), self.needle.as_bytes()).is_some()
    }

    pub(super) fn captures<'t>(&self, text: &'t str) -> Option<regex::Captures<'t>> {
        if !self.holds_needle(text) {
            return None;
        }
        self.regex().captures(text)
    }

    pub(super) fn captures_iter<'r, 't>(
        &'r self,
        text: &'t str,
    ) -> impl Iterator<Item = regex::Captures<'t>> + use<'r, 't> {
        let hit = self.holds_needle(text);
        hit.then(|| self.regex().captures_iter(text))
            .into_iter()
            .flatten()
    }
}

/// The guarded regexes: `name: needle, pattern;` each, and [`guarded_all`] for the tests.
macro_rules! guarded_res {
    ($($name:ident: $needle:expr, $pat:expr;)*) => {
        $(
            fn $name() -> &'static Guarded {
                static RE: Guarded = Guarded::new($needle, $pat);
                &RE
            }
        )*
        #[cfg(test)]
        fn guarded_all() -> Vec<(&'static str, &'static Guarded)> {
            vec![$((stringify!($name), $name())),*]
        }
    };
}

guarded_res! {
    re_rm_init: "RmInitAdapter failed!", r"^RmInitAdapter failed!\s*(?:\(([^)]*)\))?";
    re_api_head: "API mismatch: the client has the version ",
        r"^API mismatch: the client has the version (\S+?),? but";
    re_api_head_new: "API mismatch: the client '",
        r"^API mismatch: the client '([^']{0,64})' \(pid (\d+)\)";
    re_api_client: "has the version ", r"^has the version (\S+?),? but";
    re_api_kernel: "the version ", r"^(?:this kernel module has )?the version (\S+?)\.?\s+Please";
    re_rc_all: "RC all channels for critical error ", r"^RC all channels for critical error (\d+)";
    re_loading: "The NVIDIA GPU ", r"^The NVIDIA GPU (ADDR)\s*(.*)$";
    re_fw_load: " failed with error ",
        r"^nvidia (ADDR): (?:Direct firmware load for|loading) (\S+) failed with error (-?\d+)";
    re_probe_driver: ": probe with driver nvidia failed with error ",
        r"^nvidia (ADDR): probe with driver nvidia failed with error (-?\d+)";
    re_probe_of: "nvidia: probe of ", r"^nvidia: probe of (ADDR) failed with error (-?\d+)";
    re_module_sym: "symbol", r"^([\w-]+): (disagrees about version of symbol|Unknown symbol) (\S+)";
    re_gpl_only: ": module using GPL-only symbols uses symbols ",
        r"^([\w-]+): module using GPL-only symbols uses symbols (?:(\S+) )?from proprietary module (\S+?)\.?$";
    re_version_magic: ": version magic '",
        r"^(nvidia[\w-]*): version magic '([^']*)' should be '([^']*)'";
    re_any_addr: "PCI:", r"PCI:(ADDR)";
    re_user_api_kernel_first: " the NVIDIA kernel module has ",
        r"^API [Mm]ismatch[:,] the NVIDIA kernel module has (?:the )?version ([^\s,]+),?(?:\s+but this (NVIDIA driver component|X module) has (?:the )?version ([^\s,]+?)\.?(?:\s|$))?";
    re_user_api_component_first: "his NVIDIA driver component has ",
        r"^API [Mm]ismatch[:,] [Tt]his NVIDIA driver component has (?:the )?version ([^\s,]+),? but the NVIDIA kernel module's version does not match";
    re_module_version_mismatch: ": Version mismatch: nvidia.ko(",
        r"^(nvidia[\w-]*): Version mismatch: nvidia\.ko\(([^()\s]+)\) ([\w-]+?)(?:\.ko)?\(([^()\s]+)\)";
}

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

/// The message of an `NVRM` tag whose colon a reporter who retyped the line moved or dropped the
/// space after (`NVRM :Xid (PCI:0000:81:00): 79, ...`, `NVRM:Xid (...`): the text after the colon.
/// Only before an Xid, the one message a reporter retypes this way that the grammar after it
/// still checks; the kernel's own `NVRM: ` is read by the tag's exact shape.
pub fn retyped_nvrm(s: &str) -> Option<&str> {
    let rest = s.strip_prefix("NVRM")?.trim_start_matches(' ');
    let rest = rest.strip_prefix(':')?;
    let body = rest.trim_start_matches(' ');
    (body.starts_with("Xid (") && !s.starts_with("NVRM: ")).then_some(body)
}

/// Classifies one message line (starting at its tag).
pub fn parse(msg: &str) -> Shape {
    if matches!(msg.as_bytes().first(), Some(b'[' | b'{')) {
        if let Some(c) = parse_cper(msg) {
            return Shape::Cper(c);
        }
    }
    if let [b'N', b'V', b'R', b'M', b':', b' ', ..] = msg.as_bytes() {
        return parse_nvrm(crate::classify::trim::end(&msg[6..]));
    }
    if let Some(body) = retyped_nvrm(msg) {
        return parse_nvrm(crate::classify::trim::end(body));
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
        // A tool's text that starts with its name (`nvidia-persistenced failed to initialize`,
        // the installer's `nvidia-installer.log' for details`): the `tool.*` and `installer.*`
        // rows of the shape table, before the modules' own readings.
        use crate::classify::table::{Table, Tag};
        if let Some(r) = Table::builtin().read(msg, Tag::None, None).filter(|r| {
            matches!(
                crate::classify::shape_id::family(r.id),
                "tool" | "installer"
            )
        }) {
            return Shape::Row(r);
        }
        return parse_nvidia_other(msg);
    }
    // Its own messages only: the module loader's lines about it put a space after the colon
    // (`gdrdrv: Unknown symbol nvidia_p2p_get_pages (err -22)`) and are read below.
    if let Some(body) = msg.strip_prefix("gdrdrv:").filter(|b| !b.starts_with(' ')) {
        return gdrdrv_line(body);
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
    if let Some(body) = msg.strip_prefix("(EE) ") {
        if x_module_load_failure(body.trim_end()) {
            return x_module_error(body.trim_end());
        }
    }
    if msg.starts_with("GSP task ") {
        return Shape::GspCrash {
            text: msg.trim_end().to_string(),
        };
    }
    if let Some(rest) = msg.strip_prefix("[drm ERROR :") {
        // FreeBSD's form: `[drm ERROR :func] [nvidia-drm] [GPU ID 0x00000100] TEXT`.
        if is_nvidia_drm(msg) {
            let text = rest.split_once("] [nvidia-drm] ").map_or(rest, |(_, t)| t);
            let text = nvrm::after_gpu_id(text);
            return Shape::ModuleError {
                module: "nvidia-drm",
                pci: None,
                text: text.trim().to_string(),
            };
        }
        return Shape::Harmless;
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

/// An address anywhere in a line (`(PCI:0000:01:00.0)`), for continuation lines that name it.
pub fn find_address(s: &str) -> Option<PciAddress> {
    re_any_addr()
        .captures_iter(s)
        .find_map(|c| c.get(1).and_then(|a| pci(a.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The identity line's hand reader gives the pattern's answers: on real identity lines, on
    /// every address form and UUID length at the pattern's edges, and on near misses.
    #[test]
    fn the_identity_line_reader_answers_as_its_pattern() {
        let re =
            Regex::new(&r"^GPU at (?:PCI:)?(ADDR): (GPU-[0-9A-Fa-f-]{8,64})".replace("ADDR", ADDR))
                .expect("pattern");
        let by_pattern = |m: &str| {
            re.captures(m).and_then(|c| {
                Some((
                    pci(&c[1])?,
                    c[2].to_ascii_lowercase().replacen("gpu-", "GPU-", 1),
                ))
            })
        };
        let mut lines = vec![
            "GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f".to_string(),
            "GPU at 0000:17:00.0: GPU-5F2C1E0A-7B3D-4C61-9E8F-0A1B2C3D4E5F".to_string(),
            "GPU at PCI:0000:17:00: GPU-5f2c1e0a".to_string(),
            "GPU at PCI:0000:17:00: GPU-5f2c1e0".to_string(),
            "GPU at PCI:00000000:3b:00.7: GPU-aaaaaaaa-bbbb".to_string(),
            "GPU at PCI:00000000:3b:00.8: GPU-aaaaaaaa-bbbb".to_string(),
            "GPU at PCI:000000000:3b:00: GPU-aaaaaaaa-bbbb".to_string(),
            "GPU at PCI:0000:3b:000: GPU-aaaaaaaa-bbbb".to_string(),
            "GPU at PCI:0000:3b: GPU-aaaaaaaa-bbbb".to_string(),
            "GPU at PCI:0000:3b:00: GPU-x: GPU-aaaaaaaa".to_string(),
            "GPU at PCI:0000:3b:00: gpu-aaaaaaaa".to_string(),
            "GPU at PCI:PCI:0000:3b:00: GPU-aaaaaaaa".to_string(),
            "GPU at  0000:3b:00: GPU-aaaaaaaa".to_string(),
            "GPU at 0000:3b:00: GPU-aaaaaaaa, serial 1".to_string(),
            format!("GPU at 0000:3b:00: GPU-{}", "ab-".repeat(30)),
            "GPU at ...: GPU-aaaaaaaa".to_string(),
            "GPU at PCI:0000:3b:00:".to_string(),
            "GPU Board Serial Number: 1".to_string(),
        ];
        let before = lines.len();
        lines.extend(
            crate::classify::testing::fixture_lines()
                .iter()
                .filter_map(|l| {
                    crate::classify::find::find(l.as_bytes(), b"NVRM: GPU at ")
                        .map(|i| l[i + 6..].to_string())
                }),
        );
        assert!(
            lines.len() - before > 50,
            "the fixtures' identity lines were read"
        );
        for l in &lines {
            assert_eq!(nvrm::gpu_uuid_line(l), by_pattern(l), "{l}");
        }
    }

    /// Every guarded regex requires its needle, so the guard turns no line away that the regex
    /// would match: checked on the parsed pattern (literal parts in a row, through groups, hold
    /// the needle, or every branch of an alternation does).
    #[test]
    fn a_guarded_regex_matches_only_lines_with_its_needle() {
        use regex_syntax::hir::HirKind;
        for (name, g) in guarded_all() {
            let hir = regex_syntax::parse(&g.pattern.replace("ADDR", ADDR)).expect(name);
            // The required text: literal parts in a row (a group is its content); anything
            // optional or variable ends the run.
            // An alternation whose every branch holds the needle holds it.
            fn walk(h: &regex_syntax::hir::Hir, runs: &mut Vec<String>, needle: &str) {
                let name = needle;
                match h.kind() {
                    HirKind::Concat(parts) => parts.iter().for_each(|p| walk(p, runs, needle)),
                    HirKind::Capture(c) => walk(&c.sub, runs, needle),
                    HirKind::Alternation(alts) => {
                        let all = alts.iter().all(|a| {
                            let mut r = vec![String::new()];
                            walk(a, &mut r, needle);
                            r.iter().any(|x| x.contains(needle))
                        });
                        runs.push(if all {
                            needle.to_string()
                        } else {
                            String::new()
                        });
                        runs.push(String::new());
                    }
                    HirKind::Literal(l) => runs
                        .last_mut()
                        .expect("a run")
                        .push_str(std::str::from_utf8(&l.0).expect(name)),
                    HirKind::Look(_) => {}
                    _ => runs.push(String::new()),
                }
            }
            let mut runs = vec![String::new()];
            walk(&hir, &mut runs, g.needle);
            assert!(
                runs.iter().any(|r| r.contains(g.needle)),
                "{name}: needle {:?} not required by {:?} (required runs {runs:?})",
                g.needle,
                g.pattern
            );
        }
    }

    /// A line without the needle is turned away before the regex exists.
    #[test]
    fn a_line_without_the_needle_compiles_nothing() {
        static G: Guarded = Guarded::new(": rare text ", r"^(\w+): rare text (\d+)");
        assert!(G
            .captures("nvidia-uvm: Loaded the UVM driver, major device number 508")
            .is_none());
        assert!(
            G.re.get().is_none(),
            "compiled for a line without the needle"
        );
        let c = G.captures("nvidia: rare text 42").expect("a match");
        assert_eq!(&c[2], "42");
        assert_eq!(G.captures_iter("x: rare text 1").count(), 1);
    }

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
        // Table rows: their shape names the row, the GPU prefix gives the address.
        assert!(matches!(
            parse("NVRM: GPU 0000:17:00.0: rm_init_adapter failed, device minor number 0"),
            Shape::Row(m) if m.id == "init.rm-init-adapter-minor" && m.pci.is_some()
        ));
        assert!(matches!(
            parse("NVRM: rm_init_adapter(0) failed"),
            Shape::Row(m) if m.id == "init.rm-init-adapter-old"
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
