//! The catalog of allowed commands: what a runbook step may run or read, decided before it ever
//! runs (pure).
//!
//! A step is allowed when its argv equals, token by token, one pattern of the catalog. A pattern
//! is a list of literal tokens and typed slots (`{pci}`, `{gpu}`, `{int:1-10000}`, ...). There is
//! no getopt model here on purpose: `--cle`, `--vacuum-t=1s` or `--reboot-argument status reboot`
//! are refused because they are not a pattern, not because anyone thought of them. A slot value
//! is checked against its type and never starts with `-`, so it cannot become an option.
//!
//! `read` steps are checked the same way against [`READ_ROOTS`]: a path is allowed when it is a
//! root or lies below one, written plainly, and names nothing in [`NEVER_IN_PATH`].
//!
//! Operators add patterns in the configuration, in the same syntax; every pattern, shipped or
//! added, must pass [`Pattern::parse`], which enforces the short list of things no pattern may
//! contain (see `docs/runbooks.md`).

use std::fmt;
use std::sync::Arc;

use crate::model::{ConfigIssue, PciAddress};

use super::confine::{Needs, Support};
use super::subject::GpuUuid;
use super::template::{Placeholder, SlotPart, Template};

/// The shipped catalog, one pattern per line, tokens separated by spaces.
pub const BUILTIN: &[&str] = &[
    "lsmod",
    "lspci -tv",
    "lspci -vvv -s {pci}",
    "lspci -D -nn -d 10de:",
    "lspci -D -nn -s {pci}",
    "modinfo -F {module_field} nvidia",
    "uname -r",
    "uname -a",
    "nvidia-smi --version",
    "nvidia-smi -L",
    "nvidia-smi -q",
    "nvidia-smi -q -i {gpu}",
    "nvidia-smi -q -d {sections}",
    "nvidia-smi -q -d {sections} -i {gpu}",
    "nvidia-smi --query-gpu={gpu_fields} --format={csv}",
    "nvidia-smi --query-gpu={gpu_fields} --format={csv} -i {gpu}",
    "nvidia-smi --query-compute-apps={app_fields} --format={csv}",
    "nvidia-smi --query-compute-apps={app_fields} --format={csv} -i {gpu}",
    "nvidia-smi topo -m",
    "nvidia-smi nvlink -s",
    "nvidia-smi nvlink -s -i {gpu}",
    "nvidia-smi nvlink -e",
    "nvidia-smi nvlink -e -i {gpu}",
    "nvidia-smi mig -lgip",
    "nvidia-smi mig -lgi",
    "nvidia-smi mig -lci",
    "nvidia-smi dmon -c 1",
    "nvidia-smi pmon -c 1",
    "journalctl -k -n {int:1-10000} --no-pager",
    "journalctl -k -b -n {int:1-10000} --no-pager",
    "journalctl -k --boot=-1 -n {int:1-10000} --no-pager",
    "journalctl -u {unit} -n {int:1-10000} --no-pager",
    "journalctl -u {unit} -b -n {int:1-10000} --no-pager",
    "ip link show",
    "ip -s link show",
    "systemctl status {unit} --no-pager",
    "systemctl is-active {unit}",
    "ls -la {path}",
];

/// Shipped patterns that read the kernel log, and so keep CAP_SYSLOG (needed when
/// `kernel.dmesg_restrict = 1`). No other step keeps any capability.
pub const BUILTIN_KERNEL_LOG: &[&str] = &["dmesg", "dmesg -T", "dmesg -T -l {levels}"];

/// What `read` steps (and `{path}` slots) may read: these paths and everything below them.
pub const READ_ROOTS: &[&str] = &[
    "/proc/driver/nvidia",
    "/proc/driver/nvidia-caps",
    "/sys/bus/pci/devices/{pci}",
    "/sys/module/nvidia",
    "/sys/module/nvidia_uvm",
    "/proc/{pid}/cmdline",
    "/proc/{pid}/status",
    "/proc/{pid}/stat",
    "/proc/version",
    "/proc/cmdline",
    "/proc/modules",
    "/proc/loadavg",
];

/// Path components never read, whatever root they are under: they hold secrets (`environ`),
/// consume or touch something when read (`kmsg`, `config`, `rom`, `resource*`, `vpd`), or lead
/// somewhere else (`root`, `cwd`, `fd`, `.`, `..`).
#[rustfmt::skip]
pub const NEVER_IN_PATH: &[&str] = &[
    "environ", "mem", "kmsg", "kcore", "pagemap", "config", "rom", "resource*", "vpd", "fd",
    "fdinfo", "map_files", "root", "cwd", "exe", "sysrq-trigger", ".", "..",
];

/// Programs the shipped catalog never names: shells, interpreters and launchers (they run
/// anything), what prints process environments (`ps e`), and what changes power state, modules,
/// processes or files. A guard on the project's own catalog, checked by a test; an operator's
/// `allow` entry is not held to it, because a list of bad programs never ends (`python3.11`,
/// `rbash`, launchers): what makes such an entry harmless is the kernel's confinement
/// ([`super::confine`]), which every step runs under.
#[rustfmt::skip]
pub const NEVER_PROGRAMS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "csh", "tcsh", "fish", "ash", "busybox", "toybox", "env",
    "sudo", "su", "doas", "pkexec", "runuser", "setpriv", "capsh", "nohup", "timeout", "xargs",
    "find", "nice", "ionice", "chroot", "nsenter", "unshare", "setsid", "stdbuf", "taskset", "chrt",
    "flock", "watch", "strace", "ltrace", "gdb", "script", "expect", "awk", "gawk", "mawk", "sed",
    "systemd-run", "ssh", "socat", "nc", "vi", "vim", "less", "more", "man", "python", "python3",
    "perl", "ruby", "lua", "php", "node", "tclsh", "ps", "pgrep", "reboot", "shutdown", "poweroff",
    "halt", "kexec", "init", "telinit", "rmmod", "modprobe", "insmod", "kill", "pkill", "killall",
    "setpci", "dd", "tee", "cp", "mv", "rm", "ipmitool",
];

/// Units `{unit}` may name: kept beside the type that carries one ([`ServiceUnit`]).
pub use super::subject::UNITS;
#[rustfmt::skip]
const MODULE_FIELDS: &[&str] = &[
    "version", "filename", "vermagic", "srcversion", "license", "description", "depends", "name",
];
/// `nvidia-smi -q -d` sections.
#[rustfmt::skip]
const SECTIONS: &[&str] = &[
    "MEMORY", "UTILIZATION", "ECC", "TEMPERATURE", "POWER", "CLOCK", "COMPUTE", "PIDS",
    "PERFORMANCE", "SUPPORTED_CLOCKS", "PAGE_RETIREMENT", "ACCOUNTING", "ENCODER_STATS",
    "SUPPORTED_GPU_TARGET_TEMP", "VOLTAGE", "FBC_STATS", "ROW_REMAPPER", "RESET_STATUS",
    "GSP_FIRMWARE_VERSION",
];
/// `nvidia-smi --query-gpu` fields.
#[rustfmt::skip]
const GPU_FIELDS: &[&str] = &[
    "timestamp", "index", "name", "uuid", "serial", "count", "driver_version", "vbios_version",
    "pci.bus_id", "pci.domain", "pci.bus", "pci.device", "pci.device_id", "pci.sub_device_id",
    "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max",
    "pstate", "persistence_mode", "compute_mode", "mig.mode.current", "fan.speed",
    "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "enforced.power.limit",
    "power.max_limit", "clocks.sm", "clocks.mem", "clocks.gr", "clocks.max.sm", "clocks.max.mem",
    "clocks.max.gr", "clocks_throttle_reasons.active", "clocks_event_reasons.active",
    "utilization.gpu", "utilization.memory", "memory.total", "memory.used", "memory.free",
    "ecc.mode.current", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total", "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count", "retired_pages.pending", "remapped_rows.correctable",
    "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
];
/// `nvidia-smi --query-compute-apps` fields.
#[rustfmt::skip]
const APP_FIELDS: &[&str] = &[
    "timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid", "process_name",
    "used_memory", "used_gpu_memory",
];
const CSV: &[&str] = &["csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits"];
const LEVELS: &[&str] = &[
    "emerg", "alert", "crit", "err", "warn", "notice", "info", "debug",
];

/// Why a step was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// The argv is not exactly a pattern of the catalog.
    NotInCatalog,
    /// The path is not under a read root, not written plainly, or names a never-read file.
    NotReadable,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rule::NotInCatalog => "not-in-catalog",
            Rule::NotReadable => "not-readable",
        })
    }
}

/// Why a step was refused, in words that name the nearest pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub rule: Rule,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.reason, self.rule)
    }
}

/// A typed slot: the values it takes never start with `-` and hold no `/` unless it is a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// A normalised PCI address, `dddd:bb:dd.f`.
    Pci,
    /// A GPU as `nvidia-smi -i` names it: an index (0-63), a PCI address or a UUID.
    Gpu,
    /// A process id.
    Pid,
    /// A decimal integer in a range.
    Int(u32, u32),
    /// A comma-separated list from a fixed vocabulary (or one word of it, when `list` is false).
    Words {
        name: &'static str,
        words: &'static [&'static str],
        list: bool,
    },
    /// A path allowed by [`READ_ROOTS`].
    Path,
}

const WORD_SLOTS: &[(&str, &[&str], bool)] = &[
    ("unit", UNITS, false),
    ("module_field", MODULE_FIELDS, false),
    ("sections", SECTIONS, true),
    ("gpu_fields", GPU_FIELDS, true),
    ("app_fields", APP_FIELDS, true),
    ("csv", CSV, false),
    ("levels", LEVELS, true),
];

impl Slot {
    fn parse(name: &str) -> Option<Slot> {
        let range = |r: &str| -> Option<Slot> {
            let (a, b) = r.split_once('-')?;
            let (a, b) = (a.parse().ok()?, b.parse().ok()?);
            (a <= b).then_some(Slot::Int(a, b))
        };
        match name {
            "pci" => Some(Slot::Pci),
            "gpu" => Some(Slot::Gpu),
            "pid" => Some(Slot::Pid),
            "path" => Some(Slot::Path),
            _ => name.strip_prefix("int:").and_then(range).or_else(|| {
                let (name, words, list) = WORD_SLOTS.iter().find(|w| w.0 == name)?;
                Some(Slot::Words {
                    name,
                    words,
                    list: *list,
                })
            }),
        }
    }

    /// Whether `v` is a value of this slot.
    pub fn valid(self, v: &str) -> bool {
        let int = |v: &str, lo: u32, hi: u32| {
            !v.is_empty()
                && v.bytes().all(|b| b.is_ascii_digit())
                && (v == "0" || !v.starts_with('0'))
                && v.parse::<u32>().is_ok_and(|n| (lo..=hi).contains(&n))
        };
        let pci = |v: &str| PciAddress::parse(v).is_ok_and(|a| a.to_string() == v);
        match self {
            Slot::Pci => pci(v),
            Slot::Gpu => {
                int(v, 0, 63) || pci(v) || GpuUuid::parse(v).is_some_and(|u| u.as_str() == v)
            }
            Slot::Pid => int(v, 1, 4_194_304),
            Slot::Int(lo, hi) => int(v, lo, hi),
            Slot::Words {
                words, list: true, ..
            } => v.split(',').all(|w| words.contains(&w)) && v.split(',').count() <= 32,
            Slot::Words { words, .. } => words.contains(&v),
            Slot::Path => check_read_path(v).is_ok(),
        }
    }

    /// Whether a placeholder's values (all of one checked type) belong to this slot; the value
    /// is checked again when the step runs.
    fn accepts(self, p: Placeholder) -> bool {
        use Placeholder::*;
        match self {
            Slot::Pci => matches!(p, Pci | ParentPci),
            Slot::Gpu => matches!(p, Pci | GpuIndex | Uuid),
            Slot::Pid => p == Pid,
            Slot::Int(..) => matches!(p, Xid | GpuIndex),
            Slot::Words { name: "unit", .. } => p == Unit,
            Slot::Words { .. } | Slot::Path => false,
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Slot::Pci => f.write_str("{pci}"),
            Slot::Gpu => f.write_str("{gpu}"),
            Slot::Pid => f.write_str("{pid}"),
            Slot::Path => f.write_str("{path}"),
            Slot::Int(a, b) => write!(f, "{{int:{a}-{b}}}"),
            Slot::Words { name, .. } => write!(f, "{{{name}}}"),
        }
    }
}

/// One token of a pattern: literal text, or a slot after a literal prefix that is empty or ends
/// in `=` (`--query-gpu={gpu_fields}`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Lit(String),
    Slot(String, Slot),
}

impl Tok {
    fn parse(text: &str) -> Result<Tok, String> {
        let Some(open) = text.find('{') else {
            return Ok(Tok::Lit(text.to_string()));
        };
        let (prefix, rest) = text.split_at(open);
        let name = rest
            .strip_prefix('{')
            .and_then(|r| r.strip_suffix('}'))
            .ok_or_else(|| format!("{text:?}: a slot is a whole token or follows `--opt=`"))?;
        let slot = Slot::parse(name).ok_or_else(|| {
            format!("{text:?}: unknown slot {{{name}}} (known: pci, gpu, pid, int:A-B, path, unit, module_field, sections, gpu_fields, app_fields, csv, levels)")
        })?;
        if !(prefix.is_empty() || prefix.ends_with('=')) {
            return Err(format!(
                "{text:?}: a slot may fill an option's value (`--opt={{slot}}`), never its name"
            ));
        }
        Ok(Tok::Slot(prefix.to_string(), slot))
    }

    fn matches_str(&self, a: &str) -> bool {
        match self {
            Tok::Lit(l) => l == a,
            Tok::Slot(prefix, slot) => a
                .strip_prefix(prefix.as_str())
                .is_some_and(|v| slot.valid(v)),
        }
    }

    fn matches_template(&self, t: &Template) -> bool {
        match (self, t.as_literal()) {
            (_, Some(lit)) => self.matches_str(lit),
            (Tok::Lit(_), None) => false,
            (Tok::Slot(prefix, slot), None) => match t.slot_part(prefix) {
                Some(SlotPart::One(p)) => slot.accepts(p),
                _ => false,
            },
        }
    }
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Lit(l) => f.write_str(l),
            Tok::Slot(prefix, slot) => write!(f, "{prefix}{slot}"),
        }
    }
}

/// One allowed argv.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    toks: Vec<Tok>,
    kernel_log: bool,
    shipped: bool,
}

impl Pattern {
    /// Parses an operator's pattern (`[runbooks] allow`): the program is a literal plain name;
    /// slots only fill a whole token or an option's value; literal tokens are printable ASCII
    /// without spaces and never mention `environ`; a literal path (any token, or option value,
    /// with a `/`, and `.` or `..`) is absolute and lies under [`READ_ROOTS`]. It runs with no
    /// capability and none of the shipped patterns' extra access ([`Pattern::needs`]).
    pub fn parse(tokens: &[String]) -> Result<Pattern, String> {
        Pattern::parse_as(tokens, false, false)
    }

    fn parse_as(tokens: &[String], kernel_log: bool, shipped: bool) -> Result<Pattern, String> {
        let Some(program) = tokens.first() else {
            return Err("a pattern needs at least the program".into());
        };
        if tokens.len() > 32 {
            return Err("a pattern has at most 32 tokens".into());
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '+');
        if program.is_empty() || program.starts_with(['-', '.']) || !program.chars().all(plain) {
            return Err(format!(
                "{program:?}: the program must be a plain name, found in the system directories"
            ));
        }
        let mut toks = vec![Tok::Lit(program.clone())];
        for t in &tokens[1..] {
            if t.is_empty() || !t.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!("{t:?}: tokens are printable ASCII without spaces"));
            }
            if t.contains("environ") {
                return Err(format!("{t:?}: no pattern reads process environments"));
            }
            let tok = Tok::parse(t)?;
            if let Tok::Lit(l) = &tok {
                // Anything path-like is an absolute path under the read roots (the working
                // directory is `/`, so a relative path reaches as far as an absolute one).
                let path = l.split_once('=').map_or(l.as_str(), |(_, v)| v);
                if path.contains('/') || path == "." || path == ".." {
                    check_read_path(path).map_err(|r| r.reason)?;
                }
            }
            toks.push(tok);
        }
        Ok(Pattern {
            toks,
            kernel_log,
            shipped,
        })
    }

    fn parse_line(line: &str, kernel_log: bool) -> Pattern {
        let words: Vec<String> = line.split(' ').map(str::to_string).collect();
        match Pattern::parse_as(&words, kernel_log, true) {
            Ok(p) => p,
            // The shipped lines are constants, checked by a test.
            Err(e) => panic!("shipped pattern {line:?}: {e}"),
        }
    }

    /// The program, as looked up in the system directories.
    pub fn program(&self) -> &str {
        match &self.toks[0] {
            Tok::Lit(p) => p,
            Tok::Slot(..) => "",
        }
    }

    /// Whether the step keeps CAP_SYSLOG to read the kernel log.
    pub fn kernel_log(&self) -> bool {
        self.kernel_log
    }

    /// Whether the pattern is the project's own rather than an operator's.
    pub fn shipped(&self) -> bool {
        self.shipped
    }

    /// What the step may do beyond reading files, inside its confinement: decided by the
    /// shipped catalog per program; an operator's entry gets nothing more.
    pub fn needs(&self) -> Needs {
        if !self.shipped {
            return Needs::default();
        }
        let program = self.program();
        Needs {
            gpu_devices: program == "nvidia-smi",
            kernel_log: self.kernel_log,
            system_bus: program == "systemctl",
            netlink: program == "ip",
        }
    }

    /// Whether an argv as it will run (placeholders filled) is exactly this pattern.
    pub fn matches(&self, argv: &[String]) -> bool {
        argv.len() == self.toks.len() && self.toks.iter().zip(argv).all(|(t, a)| t.matches_str(a))
    }

    fn matches_templates(&self, argv: &[Template]) -> bool {
        argv.len() == self.toks.len()
            && self
                .toks
                .iter()
                .zip(argv)
                .all(|(t, a)| t.matches_template(a))
    }

    /// How close an argv comes: same program first, then tokens that match, then length.
    fn closeness(&self, argv: &[Template]) -> (bool, usize, isize) {
        let same = argv.first().and_then(Template::as_literal) == Some(self.program());
        let hits = self
            .toks
            .iter()
            .zip(argv)
            .filter(|(t, a)| t.matches_template(a))
            .count();
        (
            same,
            hits,
            -(self.toks.len() as isize - argv.len() as isize).abs(),
        )
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<String> = self.toks.iter().map(|t| t.to_string()).collect();
        f.write_str(&words.join(" "))
    }
}

/// The allowed commands: the shipped patterns and the operator's additions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Catalog {
    patterns: Vec<Arc<Pattern>>,
}

impl Default for Catalog {
    fn default() -> Self {
        let plain = BUILTIN.iter().map(|l| Pattern::parse_line(l, false));
        let klog = BUILTIN_KERNEL_LOG
            .iter()
            .map(|l| Pattern::parse_line(l, true));
        Catalog {
            patterns: plain.chain(klog).map(Arc::new).collect(),
        }
    }
}

impl Catalog {
    /// The shipped catalog plus `extra` patterns (`[runbooks] allow`), each checked as
    /// [`Pattern::parse`] says; an error names the pattern. Additions need Landlock on this
    /// kernel: without it nothing would hold an unknown program to reading.
    pub fn with_additions(extra: &[Vec<String>]) -> Result<Catalog, ConfigIssue> {
        Catalog::with_additions_under(extra, Support::probe())
    }

    /// [`Catalog::with_additions`] on a kernel that offers `support`.
    pub fn with_additions_under(
        extra: &[Vec<String>],
        support: Support,
    ) -> Result<Catalog, ConfigIssue> {
        let mut c = Catalog::default();
        if !extra.is_empty() && !support.allows_operator_programs() {
            return Err(ConfigIssue::new(
                "runbooks.allow",
                format!(
                    "{} entr{} refused: this kernel offers no Landlock ({support}), and only Landlock keeps a program the catalog does not know from writing, connecting or signalling",
                    extra.len(),
                    if extra.len() == 1 { "y" } else { "ies" }
                ),
            ));
        }
        for (i, p) in extra.iter().enumerate() {
            let pattern = Pattern::parse(p)
                .map_err(|e| ConfigIssue::new(format!("runbooks.allow[{i}]"), e))?;
            c.patterns.push(Arc::new(pattern));
        }
        Ok(c)
    }

    pub fn patterns(&self) -> impl Iterator<Item = &Pattern> {
        self.patterns.iter().map(|p| &**p)
    }

    /// The pattern a `run` step's argv is, or a refusal naming the nearest one.
    pub fn check_run(&self, argv: &[Template]) -> Result<Arc<Pattern>, Refusal> {
        if let Some(p) = self.patterns.iter().find(|p| p.matches_templates(argv)) {
            return Ok(p.clone());
        }
        let shown: Vec<String> = argv.iter().map(|t| t.to_string()).collect();
        let nearest = self.patterns.iter().max_by_key(|p| p.closeness(argv));
        Err(Refusal {
            rule: Rule::NotInCatalog,
            reason: match nearest {
                Some(p) => format!(
                    "{:?} is not a command of the catalog; the nearest is `{p}` (see docs/runbooks.md to add one)",
                    shown.join(" ")
                ),
                None => "the catalog is empty".into(),
            },
        })
    }
}

/// Checks a `read` step's path as written, placeholders and all: absolute, each placeholder a
/// whole component of its type where the root has a slot, nothing never-read.
pub fn check_read(path: &Template) -> Result<(), Refusal> {
    let comps = path.components();
    let refuse = |why: String| Refusal {
        rule: Rule::NotReadable,
        reason: format!("{path}: {why}"),
    };
    let Some(("", rest)) = comps
        .split_first()
        .map(|(f, r)| (f.as_literal().unwrap_or("?"), r))
    else {
        return Err(refuse("write an absolute path".into()));
    };
    for c in rest {
        match c.as_literal() {
            Some(l) => check_component(l).map_err(refuse)?,
            // A placeholder's value is [A-Za-z0-9:.-], never `.` or `..`.
            None if matches!(c.slot_part(""), Some(SlotPart::One(_))) => {}
            None => return Err(refuse("a placeholder fills a whole component".into())),
        }
    }
    if !under_root(rest, Tok::matches_template) {
        return Err(refuse(roots_only()));
    }
    Ok(())
}

/// Checks a path as it will be read: absolute, plain, under a read root, nothing never-read.
pub fn check_read_path(path: &str) -> Result<(), Refusal> {
    let refuse = |why: String| Refusal {
        rule: Rule::NotReadable,
        reason: format!("{path}: {why}"),
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(refuse("write an absolute path".into()));
    };
    let comps: Vec<&str> = rest.split('/').collect();
    for c in &comps {
        check_component(c).map_err(refuse)?;
    }
    if !under_root(&comps, |t, c| t.matches_str(c)) {
        return Err(refuse(roots_only()));
    }
    Ok(())
}

/// Whether path components (those after the leading `/`) are a read root or lie below one.
fn under_root<T>(comps: &[T], matches: impl Fn(&Tok, &T) -> bool) -> bool {
    READ_ROOTS.iter().any(|root| {
        let r: Vec<Tok> = root[1..]
            .split('/')
            .filter_map(|c| Tok::parse(c).ok())
            .collect();
        comps.len() >= r.len() && r.iter().zip(comps).all(|(t, c)| matches(t, c))
    })
}

fn roots_only() -> String {
    format!("only these may be read: {}", READ_ROOTS.join(", "))
}

fn check_component(c: &str) -> Result<(), String> {
    let never = NEVER_IN_PATH.iter().any(|n| match n.strip_suffix('*') {
        Some(stem) => c.starts_with(stem),
        None => c == *n,
    });
    if never {
        return Err(format!(
            "{c:?} is never read (secrets, side effects, or a way out)"
        ));
    }
    let plain = |ch: char| ch.is_ascii_alphanumeric() || matches!(ch, '_' | '-' | '.' | ':' | '+');
    if c.is_empty() || !c.chars().all(plain) {
        return Err(format!(
            "{c:?}: write the path plainly (no '//', no odd characters)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn the_shipped_catalog_passes_its_own_rules() {
        let c = Catalog::default();
        assert_eq!(
            c.patterns().count(),
            BUILTIN.len() + BUILTIN_KERNEL_LOG.len()
        );
        for r in READ_ROOTS {
            assert!(check_read(&Template::parse(r).unwrap()).is_ok(), "{r}");
        }
    }

    #[test]
    fn slots_check_their_values() {
        assert!(Slot::Pci.valid("0000:17:00.0") && !Slot::Pci.valid("17:00.0"));
        assert!(Slot::Gpu.valid("3") && !Slot::Gpu.valid("-3") && !Slot::Gpu.valid("64"));
        assert!(Slot::Int(1, 10).valid("10") && !Slot::Int(1, 10).valid("010"));
        let s = Slot::parse("sections").unwrap();
        assert!(s.valid("ECC,POWER") && !s.valid("ECC,") && !s.valid("--ecc"));
        assert!(Slot::Path.valid("/sys/bus/pci/devices/0000:17:00.0/aer_dev_fatal"));
        assert!(!Slot::Path.valid("/sys/bus/pci/devices/0000:17:00.0/config"));
    }

    #[test]
    fn a_match_is_exact() {
        let p = Pattern::parse(&argv("nvidia-smi -q -d {sections} -i {gpu}")).unwrap();
        assert!(p.matches(&argv("nvidia-smi -q -d ECC -i 0000:17:00.0")));
        assert!(!p.matches(&argv("nvidia-smi -q -d ECC -i --reset")));
        assert!(!p.matches(&argv("nvidia-smi -q -d ECC -i 0 -r")));
    }

    #[test]
    fn additions_keep_the_argument_rules_and_gain_no_access() {
        let landlock = Support {
            landlock_abi: Some(7),
            seccomp: true,
        };
        let add = |p: &str| Catalog::with_additions_under(&[argv(p)], landlock);
        for bad in [
            "/usr/bin/lspci",
            "{pci}",
            "nvidia-smi -{int:1-9}",
            "cat /proc/1/environ",
            "grep -r x /proc",
            "lspci -s {nope}",
            "ls {pci}x",
        ] {
            assert!(add(bad).is_err(), "{bad}");
        }
        // No program list: a shell or an interpreter is harmless inside the confinement, and an
        // operator's nvidia-smi gets no device access that the shipped one has.
        for p in ["ibstat", "sh -c x", "python3.11", "nvidia-smi -r"] {
            let c = add(p).unwrap_or_else(|e| panic!("{p}: {e}"));
            let mine = c.patterns().last().unwrap();
            assert!(!mine.shipped());
            assert_eq!(mine.needs(), Needs::default(), "{p}");
        }
        let shipped = Catalog::default();
        let smi = shipped
            .patterns()
            .find(|p| p.program() == "nvidia-smi")
            .unwrap();
        assert!(smi.needs().gpu_devices && !smi.needs().system_bus);
    }

    #[test]
    fn without_landlock_additions_are_refused() {
        let bare = Support {
            landlock_abi: None,
            seccomp: true,
        };
        let e = Catalog::with_additions_under(&[argv("ibstat")], bare).unwrap_err();
        assert!(
            e.key == "runbooks.allow" && e.message.contains("Landlock"),
            "{e}"
        );
        assert!(Catalog::with_additions_under(&[], bare).is_ok());
    }

    #[test]
    fn the_shipped_catalog_names_no_shell_interpreter_or_state_changer() {
        for p in Catalog::default().patterns() {
            assert!(!NEVER_PROGRAMS.contains(&p.program()), "{p}");
        }
    }
}
