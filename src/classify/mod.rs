//! Classification: turns kernel log messages into typed [`Finding`]s.
//!
//! [`Classifier`] is pure (no I/O, no clock): message lines go in with where they came from, and
//! findings come out. It keeps a little state because some findings span several lines (the
//! three-line "fallen off the bus", the API mismatch, SXid continuation lines, AER detail lines,
//! GSP dumps and crash reports, probe explanations, call traces) and because identity lines
//! (`GPU at PCI:...: GPU-uuid`, board serial) name a GPU for the findings that follow.

pub mod catalog;
pub mod fabricmanager;
pub mod guidance;
#[cfg(test)]
mod harmless_tests;
#[cfg(test)]
mod infra_tests;
pub mod overrides;
pub mod prefilter;
pub mod prefix;
pub mod shapes;
pub mod signals;
pub mod sxid;
pub mod table;

#[cfg(test)]
mod forum_tests;
#[cfg(test)]
mod ml_tests;
#[cfg(test)]
mod other_tests;
#[cfg(test)]
pub(crate) mod testing;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::model::{
    Category, Detail, Finding, FindingKind, GpuIdentity, Origin, PciAddress, RecoveryAction,
    Severity,
};
use catalog::Nvlink5Layout;
use shapes::{AerLine, AerStatus, Shape, SxidLine, XidLine};

pub use overrides::{XidOverride, XidOverrides};

/// Where one message line came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineOrigin {
    /// 1-based physical line number in a scanned file (0 for live sources).
    pub line: u64,
    pub seq: Option<u64>,
    pub ts_usec: Option<u64>,
    pub timestamp: Option<String>,
}

/// How many raw lines a folded finding keeps; the rest are counted in its message.
const MAX_FOLDED_LINES: usize = 32;
/// A multi-line message whose next line has not come within this many physical lines is
/// finished with what it has (mixed files interleave other lines).
const MAX_FOLD_GAP: u64 = 16;
/// A call trace's frames outside NVIDIA modules do not reach the classifier in `scan` (they hold
/// no NVIDIA literal), so the gap between the frames it sees is wider.
const MAX_TRACE_GAP: u64 = 96;
/// Bound on remembered GPU identities: a real machine has at most a few dozen GPUs.
const MAX_GPUS: usize = 1024;

/// Which lines a [`Pending::Fold`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FoldMode {
    /// NVRM lines that are not a message of their own: the explanation the driver prints after a
    /// probe or "not supported" message, the "BAR0 is 0M" line.
    Explain,
    /// The GSP crash report's indented register and libos lines.
    Crash,
}

/// A finding that may still take more lines.
#[derive(Debug)]
enum Pending {
    /// `The NVIDIA GPU <addr>` seen; the next lines decide.
    TheNvidiaGpu {
        finding: Finding,
        last_line: u64,
    },
    ApiMismatch {
        finding: Finding,
        client: Option<String>,
        kernel: Option<String>,
        last_line: u64,
    },
    Sxid {
        finding: Finding,
        switch: String,
        last_line: u64,
    },
    Aer {
        finding: Finding,
        reporter: PciAddress,
        last_line: u64,
    },
    Gsp {
        finding: Finding,
        last_line: u64,
    },
    Fold {
        finding: Finding,
        mode: FoldMode,
        last_line: u64,
    },
    /// A call trace or hung-task report; reported only when a frame is in an NVIDIA module.
    Trace {
        finding: Finding,
        task: Option<String>,
        hung: bool,
        module: Option<&'static str>,
        last_line: u64,
    },
}

impl Pending {
    fn last_line(&self) -> u64 {
        match self {
            Pending::TheNvidiaGpu { last_line, .. }
            | Pending::ApiMismatch { last_line, .. }
            | Pending::Sxid { last_line, .. }
            | Pending::Aer { last_line, .. }
            | Pending::Gsp { last_line, .. }
            | Pending::Fold { last_line, .. }
            | Pending::Trace { last_line, .. } => *last_line,
        }
    }

    fn gap(&self) -> u64 {
        match self {
            Pending::Trace { .. } => MAX_TRACE_GAP,
            _ => MAX_FOLD_GAP,
        }
    }
}

/// The stateful classifier. One per input stream.
#[derive(Debug, Default)]
pub struct Classifier {
    pending: Option<Pending>,
    gpus: HashMap<PciAddress, GpuIdentity>,
    /// GPUs known to be NVIDIA devices (named by a driver line), for AER severity.
    nvidia_devices: HashSet<PciAddress>,
    /// The GPU below a PCIe port, from the log (an AER event naming both) or from the caller
    /// (the daemon reads sysfs topology): AER on the port is then about that GPU.
    port_gpu: HashMap<PciAddress, PciAddress>,
    /// The last NVIDIA device that printed an AER line, and where: a port's AER lines right
    /// before or after it belong to the same event.
    last_nvidia_aer: Option<(PciAddress, u64)>,
    /// The last port that printed an AER line, and where.
    last_port_aer: Option<(PciAddress, u64)>,
    last_identity: Option<PciAddress>,
    /// The latest Xid and its GPU: "RC all channels for critical error N" names no GPU and
    /// follows the Xid N it is about.
    last_xid: Option<(u32, PciAddress)>,
    driver_version: Option<String>,
    /// A quiet `NVRM: ` notice whose sentence goes on in the next line (its line and timestamp):
    /// the tail lines are part of the same notice, not messages of their own.
    open_notice: Option<(u64, Option<u64>)>,
    /// Lines that matched a tag but no shape, counted for `--verbose` style reporting.
    pub unclassified: u64,
    /// The site's own rows (`[[classify.shape]]`, `[[classify.silence]]`), read before the
    /// built-in shapes: an operator's wording or silence wins.
    site: Option<Arc<table::Table>>,
}

impl Classifier {
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the classifier the driver version (from NVML or a banner line): it decides the
    /// NVLink5 register layout.
    pub fn set_driver_version(&mut self, version: &str) {
        self.driver_version = Some(version.to_string());
    }

    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// Records what NVML knows about a GPU, so findings for its address carry it.
    pub fn learn_gpu(&mut self, pci: PciAddress, identity: GpuIdentity) {
        self.nvidia_devices.insert(pci);
        if self.gpus.len() < MAX_GPUS || self.gpus.contains_key(&pci) {
            let slot = self.gpus.entry(pci).or_default();
            merge_identity(slot, &identity);
        }
    }

    /// Records that `gpu` sits below the PCIe port `port` (from sysfs topology), so AER lines the
    /// port prints are reported as being about that GPU.
    pub fn learn_port(&mut self, port: PciAddress, gpu: PciAddress) {
        if self.port_gpu.len() < MAX_GPUS || self.port_gpu.contains_key(&port) {
            self.port_gpu.insert(port, gpu);
            self.nvidia_devices.insert(gpu);
        }
    }

    /// Sets the site's rows (from the configuration; a reload sets the new ones). What is pending
    /// stays pending: a reload does not cut a multi-line message in two.
    pub fn set_site(&mut self, site: Arc<table::Table>) {
        self.site = (!site.is_empty()).then_some(site);
    }

    /// The site's rows, when there are any.
    pub fn site(&self) -> Option<&table::Table> {
        self.site.as_deref()
    }

    /// Whether a multi-line finding is waiting for more lines.
    pub fn has_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Feeds one message line (starting at its tag, prefix removed).
    pub fn push(&mut self, msg: &str, at: &LineOrigin, out: &mut Vec<Finding>) {
        let parsed = match self
            .site
            .as_deref()
            .and_then(|t| t.read(msg.trim(), table::Tag::None, None))
        {
            // A silenced line is as quiet as a known-harmless one.
            Some(m) if m.silence => Shape::Harmless,
            Some(m) => Shape::Row(m),
            None => shapes::parse(msg),
        };
        let shape = self.notice_tail(parsed, msg, at);
        if let Some(p) = &self.pending {
            if at.line > p.last_line() + p.gap() {
                self.flush(out);
            }
        }
        let shape = match self.extend_pending(shape, msg, at, out) {
            Some(shape) => shape,
            None => return,
        };
        self.handle(shape, msg, at, out);
    }

    /// Reads the tail lines of a quiet multi-line `NVRM: ` notice as part of it: "is not supported"
    /// at the end of the driver's advice about the VGA console is not an error, since the notice it
    /// ends is not one. Only the generic error-word verdict is taken back; a line in any shape of
    /// its own keeps it.
    fn notice_tail(&mut self, shape: Shape, msg: &str, at: &LineOrigin) -> Shape {
        let follows = self.open_notice.take().is_some_and(|(line, ts)| {
            if at.line > 0 {
                // The next physical line, or the same one (a record or rsyslog line that holds
                // several message lines).
                at.line == line || at.line == line + 1
            } else {
                // Live records carry no line numbers: the lines of one notice come within
                // microseconds of each other.
                matches!((ts, at.ts_usec), (Some(a), Some(b)) if b >= a && b - a <= 1_000)
            }
        });
        let Some(body) = msg.strip_prefix("NVRM: ") else {
            return shape;
        };
        let tail = follows && shapes::continues_sentence(body);
        let quiet = matches!(shape, Shape::Harmless | Shape::Other);
        let shape = match shape {
            Shape::DriverError {
                critical: false, ..
            } if tail => Shape::Harmless,
            s => s,
        };
        if (quiet || tail) && !shapes::ends_sentence(body) {
            self.open_notice = Some((at.line, at.ts_usec));
        }
        shape
    }

    /// Finishes any multi-line finding with what it has (end of input, or the live source went
    /// quiet).
    pub fn flush(&mut self, out: &mut Vec<Finding>) {
        let Some(p) = self.pending.take() else { return };
        match p {
            // A lone "The NVIDIA GPU ..." line never became a fall off the bus: harmless.
            Pending::TheNvidiaGpu { .. } => {}
            Pending::ApiMismatch {
                mut finding,
                client,
                kernel,
                ..
            } => {
                finding.detail = Some(Detail::ApiMismatch {
                    client_version: client.unwrap_or_default(),
                    kernel_version: kernel.unwrap_or_default(),
                });
                out.push(finding);
            }
            Pending::Trace {
                mut finding,
                task,
                hung,
                module: Some(module),
                ..
            } => {
                finding.title = match (&task, hung) {
                    (Some(t), true) => format!("task {t} hung in the {module} module"),
                    (Some(t), false) => {
                        format!("kernel call trace in the {module} module (task {t})")
                    }
                    (None, _) => format!("kernel call trace in the {module} module"),
                };
                finding.message = format!(
                    "{}; module {module}{}",
                    if hung {
                        "hung task (blocked in the kernel)"
                    } else {
                        "kernel call trace"
                    },
                    task.map(|t| format!(", task {t}")).unwrap_or_default()
                );
                out.push(finding);
            }
            // A trace without NVIDIA frames is none of xidwatch's business.
            Pending::Trace { module: None, .. } => {}
            Pending::Sxid { finding, .. }
            | Pending::Aer { finding, .. }
            | Pending::Gsp { finding, .. }
            | Pending::Fold { finding, .. } => out.push(self.enrich(finding)),
        }
    }

    /// Offers a line to the pending multi-line finding. Returns the shape back when the line is
    /// not part of it (after finishing the pending finding).
    fn extend_pending(
        &mut self,
        shape: Shape,
        msg: &str,
        at: &LineOrigin,
        out: &mut Vec<Finding>,
    ) -> Option<Shape> {
        let Some(p) = self.pending.as_mut() else {
            return Some(shape);
        };
        let line = at.line;
        match (p, &shape) {
            (Pending::TheNvidiaGpu { finding, last_line }, _) => {
                if matches!(shape, Shape::FallenOffBusTail) || msg.contains("fallen off the bus") {
                    fold_raw(finding, msg, at, last_line);
                    let f = finding.clone();
                    self.pending = None;
                    let f = self.enrich(f);
                    out.push(f);
                    return None;
                }
                if let (Shape::Other, Some(rest)) = (&shape, msg.strip_prefix("NVRM: ")) {
                    // "(PCI ID: 10de:2330) installed in this system has": keep waiting.
                    if rest.starts_with("(PCI ID") && finding.origin.raw.len() < 3 {
                        fold_raw(finding, msg, at, last_line);
                        return None;
                    }
                }
                if msg.contains("not supported") || msg.contains("supported through") {
                    // "installed in this system is not supported by the NVIDIA 550.54.14 driver
                    // release" / "by open nvidia.ko": the driver will not drive this GPU.
                    let mut f = finding.clone();
                    fold_raw(&mut f, msg, at, last_line);
                    f.kind = FindingKind::DriverError;
                    f.severity = Severity::Warning;
                    f.category = Category::Driver;
                    f.title = "GPU not supported by the installed driver".into();
                    f.message = "the installed NVIDIA driver does not support this GPU (a legacy GPU, or the open kernel modules on a GPU without GSP)".into();
                    let last = *last_line;
                    self.pending = Some(Pending::Fold {
                        finding: f,
                        mode: FoldMode::Explain,
                        last_line: last,
                    });
                    return None;
                }
                // Anything else: a lone notice.
                self.pending = None;
                if matches!(shape, Shape::Other | Shape::DriverError { .. })
                    && msg.starts_with("NVRM: ")
                {
                    return None;
                }
                Some(shape)
            }
            (
                Pending::ApiMismatch {
                    client,
                    last_line,
                    finding,
                    ..
                },
                Shape::ApiMismatchClient { client: c },
            ) => {
                *client = Some(c.clone());
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::ApiMismatch {
                    finding,
                    kernel,
                    last_line,
                    ..
                },
                Shape::ApiMismatchKernel { kernel: k },
            ) => {
                *kernel = Some(k.clone());
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::ApiMismatch {
                    finding, last_line, ..
                },
                Shape::ApiMismatchTail { last },
            ) => {
                fold_raw(finding, msg, at, last_line);
                if *last {
                    self.flush(out);
                }
                None
            }
            (
                Pending::Sxid {
                    finding,
                    switch,
                    last_line,
                },
                Shape::Sxid(s),
            ) if s.switch == *switch
                && s.pci == finding.pci
                && Some(s.sxid) == finding.xid
                && (s.fatal.is_none() || finding_sxid_unknown(finding)) =>
            {
                if let Some(fatal) = s.fatal {
                    // The head line after a continuation line that came first ("Data {...}"
                    // before "Non-fatal, Link 44"): the finding learns its severity.
                    let msg_text = s.rest.clone();
                    set_sxid_severity(finding, s.sxid, fatal);
                    finding.message = msg_text;
                } else if let Some(Detail::Sxid { continuation, .. }) = finding.detail.as_mut() {
                    if continuation.len() < MAX_FOLDED_LINES {
                        continuation.push(s.rest.clone());
                    }
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Aer {
                    finding,
                    reporter,
                    last_line,
                },
                Shape::Aer(a),
            ) if a.source.is_none()
                && (a.reporter == *reporter || Some(a.reporter) == finding.pci)
                && (a.class.is_none() || a.class.as_deref() == Some(class_of(finding))) =>
            {
                if a.nvidia_device || a.driver == "nvidia" {
                    if let Some(p) = finding.pci {
                        self.nvidia_devices.insert(p);
                    }
                    if a.driver == "nvidia" && a.reporter != *reporter {
                        self.port_gpu.insert(*reporter, a.reporter);
                        finding.pci = Some(a.reporter);
                    }
                    if a.driver == "nvidia" {
                        // As for a line of its own: a port's status line next names this GPU.
                        self.last_nvidia_aer = Some((a.reporter, line));
                    }
                    finding.severity = aer_severity(class_of(finding), true);
                }
                if let Some(st) = a.status {
                    let nvidia = finding
                        .pci
                        .is_some_and(|p| self.nvidia_devices.contains(&p));
                    finding.severity = finding.severity.max(status_severity(st, nvidia));
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            (Pending::Gsp { finding, last_line }, Shape::GspDump { text, .. })
                if !text.contains("_kgspLogXid119") =>
            {
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Fold {
                    finding,
                    mode: FoldMode::Crash,
                    last_line,
                },
                Shape::GspDump { .. },
            ) => {
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Fold {
                    finding,
                    mode: FoldMode::Explain,
                    last_line,
                },
                Shape::Other | Shape::Harmless | Shape::GspDump { opens: false, .. },
            ) if msg.starts_with("NVRM") || same_x_driver(finding, msg) => {
                if finding.pci.is_none() {
                    finding.pci = shapes::find_address(msg);
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Trace {
                    finding,
                    module,
                    last_line,
                    ..
                },
                Shape::TraceFrame { module: m },
            ) => {
                if module.is_none() {
                    *module = *m;
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Trace {
                    finding,
                    task,
                    hung,
                    module,
                    last_line,
                },
                Shape::TraceStart {
                    task: t,
                    hung: h,
                    module: m,
                    ..
                },
            ) if t.is_none() || task.is_none() || task == t || held_by(finding, t) => {
                // "task:NAME state:D" after "INFO: task NAME blocked", then "Call Trace:", then
                // a "RIP:" line: one report. "INFO: task A blocked on a semaphore likely last
                // held by task B" is followed by B's stack: the same report.
                if task.is_none() {
                    task.clone_from(t);
                }
                *hung |= *h;
                if module.is_none() {
                    *module = *m;
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            _ => {
                self.flush(out);
                Some(shape)
            }
        }
    }

    fn handle(&mut self, shape: Shape, msg: &str, at: &LineOrigin, out: &mut Vec<Finding>) {
        match shape {
            Shape::Xid(x) => {
                let uuid = x.uuid.clone();
                let mut f = self.xid_finding(x, msg, at);
                if f.gpu.uuid.is_none() {
                    f.gpu.uuid = uuid;
                }
                out.push(f);
            }
            Shape::GpuUuid { pci, uuid } => {
                self.last_identity = Some(pci);
                self.learn_gpu(
                    pci,
                    GpuIdentity {
                        uuid: Some(uuid),
                        ..GpuIdentity::default()
                    },
                );
                let mut f = base(
                    FindingKind::GpuIdentity,
                    Severity::Info,
                    Category::Informational,
                    "GPU identity",
                    msg,
                    at,
                );
                f.pci = Some(pci);
                out.push(self.enrich(f));
            }
            Shape::BoardSerial(serial) => {
                let mut f = base(
                    FindingKind::GpuIdentity,
                    Severity::Info,
                    Category::Informational,
                    "GPU board serial",
                    msg,
                    at,
                );
                if let Some(pci) = self.last_identity {
                    self.learn_gpu(
                        pci,
                        GpuIdentity {
                            serial: Some(serial.clone()),
                            ..GpuIdentity::default()
                        },
                    );
                    f.pci = Some(pci);
                } else {
                    f.gpu.serial = Some(serial);
                }
                out.push(self.enrich(f));
            }
            Shape::FallenOffBus { pci } => {
                let mut f = base(
                    FindingKind::FallenOffBus,
                    Severity::Critical,
                    Category::Pcie,
                    "GPU has fallen off the bus",
                    msg,
                    at,
                );
                f.pci = pci;
                f.xid = None;
                out.push(self.enrich(f));
            }
            Shape::RcAllChannels { code } => {
                let pci = self.last_xid.filter(|(x, _)| *x == code).map(|(_, p)| p);
                if code == 79 {
                    let mut f = base(
                        FindingKind::FallenOffBus,
                        Severity::Critical,
                        Category::Pcie,
                        "GPU has fallen off the bus (all channels reset for critical error 79)",
                        msg,
                        at,
                    );
                    f.pci = pci;
                    out.push(self.enrich(f));
                } else {
                    let (sev, cat) = catalog::lookup(code)
                        .map_or((Severity::Warning, Category::Driver), |e| {
                            (e.severity, e.category)
                        });
                    let mut f = base(
                        FindingKind::DriverError,
                        sev,
                        cat,
                        &format!("all channels reset for critical error {code}"),
                        msg,
                        at,
                    );
                    f.caused_by = Some(code);
                    f.pci = pci;
                    out.push(self.enrich(f));
                }
            }
            Shape::TheNvidiaGpu { pci, .. } => {
                let mut f = base(
                    FindingKind::FallenOffBus,
                    Severity::Critical,
                    Category::Pcie,
                    "GPU has fallen off the bus and is not responding to commands",
                    msg,
                    at,
                );
                f.pci = Some(pci);
                self.pending = Some(Pending::TheNvidiaGpu {
                    finding: f,
                    last_line: at.line,
                });
            }
            Shape::FallenOffBusTail => {
                // The tail without its head (the head was lost or cut off): still a fall.
                let f = base(
                    FindingKind::FallenOffBus,
                    Severity::Critical,
                    Category::Pcie,
                    "GPU has fallen off the bus (address not in the log)",
                    msg,
                    at,
                );
                out.push(f);
            }
            Shape::InitFailure {
                pci,
                what,
                code,
                folds,
            } => {
                let mut f = base(
                    FindingKind::DriverInitFailure,
                    Severity::Critical,
                    Category::Driver,
                    &format!("driver initialisation failure: {what}"),
                    msg,
                    at,
                );
                f.pci = pci;
                f.detail = Some(Detail::InitFailure { code });
                if folds {
                    self.pending = Some(Pending::Fold {
                        finding: f,
                        mode: FoldMode::Explain,
                        last_line: at.line,
                    });
                } else {
                    out.push(self.enrich(f));
                }
            }
            Shape::ApiMismatchHead {
                client,
                process,
                pid,
            } => {
                let mut f = base(
                    FindingKind::ApiMismatch,
                    Severity::Critical,
                    Category::Driver,
                    "driver API mismatch: user-space driver and kernel module versions differ",
                    msg,
                    at,
                );
                f.process = process;
                f.pid = pid;
                self.pending = Some(Pending::ApiMismatch {
                    finding: f,
                    client,
                    kernel: None,
                    last_line: at.line,
                });
            }
            Shape::ApiMismatchKernel { kernel } => {
                // The head was lost: report what we have.
                let mut f = base(
                    FindingKind::ApiMismatch,
                    Severity::Critical,
                    Category::Driver,
                    "driver API mismatch: user-space driver and kernel module versions differ",
                    msg,
                    at,
                );
                f.detail = Some(Detail::ApiMismatch {
                    client_version: String::new(),
                    kernel_version: kernel,
                });
                out.push(f);
            }
            Shape::VersionMismatch {
                component,
                component_version,
                kernel,
            } => {
                // The component refuses to work with the loaded kernel module: the same split as
                // the kernel's own API mismatch message.
                let mut f = base(
                    FindingKind::ApiMismatch,
                    Severity::Critical,
                    Category::Driver,
                    &format!(
                        "driver version mismatch: {component} {} does not match the kernel module {}",
                        component_version.as_deref().unwrap_or("(version not in the log)"),
                        kernel.as_deref().unwrap_or("(version not in the log)")
                    ),
                    msg,
                    at,
                );
                f.detail = Some(Detail::ApiMismatch {
                    client_version: component_version.unwrap_or_default(),
                    kernel_version: kernel.unwrap_or_default(),
                });
                out.push(f);
            }
            Shape::ApiMismatchClient { .. } | Shape::ApiMismatchTail { .. } => {}
            Shape::GspDump { opens, text } => {
                if !opens && !text.contains("_kgsp") && !text.contains("GSP") {
                    // A register line with nothing to attach to.
                    return;
                }
                let mut f = base(
                    FindingKind::DriverError,
                    Severity::Critical,
                    Category::Gsp,
                    "GSP firmware timeout or RPC failure",
                    msg,
                    at,
                );
                f.message = text;
                self.pending = Some(Pending::Gsp {
                    finding: f,
                    last_line: at.line,
                });
            }
            Shape::GspCrash { text } => {
                let mut f = base(
                    FindingKind::DriverError,
                    Severity::Critical,
                    Category::Gsp,
                    "GSP firmware crash report (watchdog timeout or task panic)",
                    msg,
                    at,
                );
                f.message = text;
                self.pending = Some(Pending::Fold {
                    finding: f,
                    mode: FoldMode::Crash,
                    last_line: at.line,
                });
            }
            Shape::NotSupported { pci, text } => {
                let mut f = base(
                    FindingKind::DriverError,
                    Severity::Warning,
                    Category::Driver,
                    "GPU not supported by the installed driver",
                    msg,
                    at,
                );
                f.pci = pci;
                f.message = text;
                self.pending = Some(Pending::Fold {
                    finding: f,
                    mode: FoldMode::Explain,
                    last_line: at.line,
                });
            }
            Shape::DriverError {
                pci,
                text,
                critical,
            } => {
                let cat = if text.contains("GSP") || text.contains("RPC") || text.contains("gsp") {
                    Category::Gsp
                } else {
                    Category::Driver
                };
                let sev = if critical {
                    Severity::Critical
                } else {
                    Severity::Warning
                };
                let title = if critical {
                    "fatal driver error"
                } else {
                    "NVIDIA driver error"
                };
                let mut f = base(FindingKind::DriverError, sev, cat, title, msg, at);
                f.pci = pci;
                f.message = text;
                out.push(self.enrich(f));
            }
            Shape::ModuleError { module, pci, text } => {
                let mut f = base(
                    FindingKind::DriverError,
                    Severity::Warning,
                    Category::Driver,
                    &format!("{module} error"),
                    msg,
                    at,
                );
                f.pci = pci;
                f.message = text;
                out.push(self.enrich(f));
            }
            Shape::ToolError {
                pci,
                text,
                critical,
            } => {
                let sev = if critical {
                    Severity::Critical
                } else {
                    Severity::Warning
                };
                let mut f = base(
                    FindingKind::DriverError,
                    sev,
                    Category::Driver,
                    "nvidia-smi / NVML cannot reach the driver or the GPU",
                    msg,
                    at,
                );
                f.pci = pci;
                f.message = text;
                out.push(self.enrich(f));
            }
            Shape::TraceStart {
                task, hung, module, ..
            } => {
                let f = base(
                    FindingKind::DriverError,
                    Severity::Warning,
                    Category::Driver,
                    "kernel call trace",
                    msg,
                    at,
                );
                self.pending = Some(Pending::Trace {
                    finding: f,
                    task,
                    hung,
                    module,
                    last_line: at.line,
                });
            }
            Shape::TraceFrame { module } => {
                // A frame whose header was not seen (cut off, or outside the excerpt).
                if module.is_some() {
                    let f = base(
                        FindingKind::DriverError,
                        Severity::Warning,
                        Category::Driver,
                        "kernel call trace",
                        msg,
                        at,
                    );
                    self.pending = Some(Pending::Trace {
                        finding: f,
                        task: None,
                        hung: false,
                        module,
                        last_line: at.line,
                    });
                }
            }
            Shape::Sxid(s) => self.sxid(s, msg, at),
            Shape::FabricManager(ev) => out.push(self.fabric_manager(ev, msg, at)),
            Shape::Aer(a) => self.aer(a, msg, at, out),
            Shape::Row(m) => self.row(m, msg, at, out),
            Shape::DriverLoaded { version } => self.driver_version = Some(version),
            Shape::UnreadableXid => {
                let f = base(
                    FindingKind::Xid,
                    Severity::Warning,
                    Category::Driver,
                    "an Xid line in a shape xidwatch cannot read (reported as it is)",
                    msg,
                    at,
                );
                out.push(f);
            }
            Shape::Harmless => {}
            Shape::Other => self.unclassified += 1,
        }
    }

    /// A finding a shape-table row made: the row wrote its kind, severity, category and title.
    fn row(&mut self, m: table::RowMatch, msg: &str, at: &LineOrigin, out: &mut Vec<Finding>) {
        if m.silence {
            return;
        }
        let mut f = base_owned(
            m.kind,
            m.severity,
            m.category,
            m.title,
            m.message
                .unwrap_or_else(|| msg.strip_prefix("NVRM: ").unwrap_or(msg).to_string()),
            msg,
            at,
        );
        f.shape = Some(m.id);
        f.pci = m.pci;
        f.pid = m.pid;
        f.xid = m.xid;
        f.gpu.index = m.gpu;
        if m.kind == FindingKind::DriverInitFailure {
            f.detail = Some(Detail::InitFailure { code: None });
        }
        match m.fold {
            Some(table::Fold::Explain) => {
                self.pending = Some(Pending::Fold {
                    finding: f,
                    mode: FoldMode::Explain,
                    last_line: at.line,
                });
            }
            None => out.push(self.enrich(f)),
        }
    }

    fn xid_finding(&mut self, x: XidLine, msg: &str, at: &LineOrigin) -> Finding {
        if let Some(p) = x.pci {
            self.nvidia_devices.insert(p);
            self.last_xid = Some((x.xid, p));
        }
        let entry = catalog::lookup(x.xid);
        let (sev, cat, title) = match entry {
            Some(e) => {
                let mut title = String::with_capacity(16 + e.mnemonic.len());
                title.push_str("Xid ");
                push_u32(&mut title, x.xid);
                title.push(' ');
                title.push_str(e.mnemonic);
                (e.severity, e.category, title)
            }
            None => (
                Severity::Warning,
                Category::Driver,
                format!(
                    "unknown Xid {} (the catalog may be older than the driver)",
                    x.xid
                ),
            ),
        };
        let caused = caused_by(&x.rest);
        let detail = xid_detail(x.xid, &x.rest, self.driver_version.as_deref());
        let mut f = base_owned(FindingKind::Xid, sev, cat, title, x.rest, msg, at);
        f.caused_by = caused;
        f.detail = detail;
        f.xid = Some(x.xid);
        f.pci = x.pci;
        f.pid = x.pid;
        f.process = x.process;
        match &f.detail {
            Some(Detail::Recovery { to, .. }) => f.severity = to.severity(),
            Some(Detail::Nvlink5 { decode, .. }) if !decode.is_empty() => {
                let fatal = decode.iter().any(|d| {
                    d.severity.starts_with("Fatal") || d.severity.starts_with("Link Fatal")
                });
                // The decode table is the authority once a row matches.
                let ignorable = decode.iter().all(|d| d.immediate == "IGNORE");
                f.severity = if fatal {
                    Severity::Critical
                } else if ignorable {
                    Severity::Info
                } else {
                    Severity::Warning
                };
            }
            _ => {}
        }
        self.enrich(f)
    }

    fn sxid(&mut self, s: SxidLine, msg: &str, at: &LineOrigin) {
        let mut f = base(
            FindingKind::Sxid,
            Severity::Warning,
            Category::Nvlink,
            "",
            msg,
            at,
        );
        f.xid = Some(s.sxid);
        f.pci = s.pci;
        f.detail = Some(Detail::Sxid {
            fatal: s.fatal.unwrap_or(false),
            link: link_number(&s.rest),
            continuation: Vec::new(),
        });
        match s.fatal {
            Some(fatal) => set_sxid_severity(&mut f, s.sxid, fatal),
            None => {
                f.title = sxid_title(s.sxid, None);
            }
        }
        f.message = s.rest;
        self.pending = Some(Pending::Sxid {
            finding: f,
            switch: s.switch,
            last_line: at.line,
        });
    }

    /// A Fabric Manager error. Its NVSwitch errors are SXids (named from the SXid catalog, the
    /// switch as the finding's device, the port as its link); its own failures stop every CUDA
    /// job on an NVSwitch system, so they are critical though no Xid follows.
    fn fabric_manager(
        &mut self,
        ev: fabricmanager::FmEvent,
        msg: &str,
        at: &LineOrigin,
    ) -> Finding {
        use fabricmanager::FmEvent;
        let title = match ev {
            FmEvent::SwitchError {
                fatal,
                sxid: no,
                switch,
                physical_id,
                port,
            } => {
                let mut f = base(
                    FindingKind::Sxid,
                    Severity::Warning,
                    Category::Nvlink,
                    "",
                    msg,
                    at,
                );
                f.xid = Some(no);
                f.pci = switch;
                f.detail = Some(Detail::Sxid {
                    fatal,
                    link: port,
                    continuation: Vec::new(),
                });
                set_sxid_severity(&mut f, no, fatal);
                let mut where_ = String::new();
                if let Some(p) = physical_id {
                    where_ += &format!(" switch {p}");
                }
                if let Some(p) = port {
                    where_ += &format!(" port {p}");
                }
                f.title = format!("{}{where_}, reported by Fabric Manager", f.title);
                return self.enrich(f);
            }
            FmEvent::Aborted { topology: true } => {
                "Fabric Manager aborted: the NVSwitch topology it found is not one it supports"
            }
            FmEvent::Aborted { topology: false } => "Fabric Manager aborted",
            FmEvent::GpuHandleMissing => {
                "Fabric Manager cannot find a GPU of the job's NVLink multicast team"
            }
            FmEvent::SwitchDriverRequestFailed => {
                "Fabric Manager's request to the NVSwitch driver failed"
            }
            FmEvent::OtherError => "Fabric Manager error",
        };
        let sev = if matches!(ev, FmEvent::OtherError) {
            Severity::Warning
        } else {
            Severity::Critical
        };
        base(
            FindingKind::DriverError,
            sev,
            Category::Nvlink,
            title,
            msg,
            at,
        )
    }

    fn aer(&mut self, a: AerLine, msg: &str, at: &LineOrigin, out: &mut Vec<Finding>) {
        let near = |last: Option<(PciAddress, u64)>| {
            last.filter(|(_, l)| at.line == 0 || at.line <= l + 8)
                .map(|(p, _)| p)
        };
        if a.driver == "nvidia" {
            self.nvidia_devices.insert(a.reporter);
            // A port's AER lines just before the GPU's own: the port is above this GPU.
            if let Some(port) = near(self.last_port_aer) {
                self.port_gpu.entry(port).or_insert(a.reporter);
            }
            self.last_nvidia_aer = Some((a.reporter, at.line));
        } else {
            if let Some(gpu) = near(self.last_nvidia_aer) {
                self.port_gpu.entry(a.reporter).or_insert(gpu);
            }
            if let Some(src) = a.source.filter(|s| *s != a.reporter) {
                if self.nvidia_devices.contains(&src) || a.nvidia_device {
                    self.port_gpu.entry(a.reporter).or_insert(src);
                }
            }
            self.last_port_aer = Some((a.reporter, at.line));
        }
        if a.nvidia_device {
            self.nvidia_devices.insert(a.source.unwrap_or(a.reporter));
        }
        // The device the line is about: the named source, else the GPU below the reporting port,
        // else the reporter itself.
        let gpu_below = self.port_gpu.get(&a.reporter).copied();
        let device = match a.source {
            Some(s) if s != a.reporter => s,
            _ => gpu_below.unwrap_or(a.reporter),
        };
        let nvidia = self.nvidia_devices.contains(&device);
        if let Some(st) = a.status {
            let mut f = base(
                FindingKind::PcieAer,
                status_severity(st, nvidia),
                Category::Pcie,
                &format!(
                    "PCIe AER: {} on {device}",
                    match st {
                        AerStatus::RecoveryFailed => "device recovery failed",
                        AerStatus::LinkReset => "link reset",
                        AerStatus::CantRecover => "the driver cannot recover from the error",
                    }
                ),
                msg,
                at,
            );
            f.pci = Some(device);
            f.message = a.text;
            f.detail = Some(Detail::Aer {
                reporter: (a.reporter != device).then_some(a.reporter),
                class: match st {
                    AerStatus::RecoveryFailed => "recovery failed",
                    AerStatus::LinkReset => "link reset",
                    AerStatus::CantRecover => "no recovery (the driver has no error handler)",
                }
                .into(),
            });
            out.push(self.enrich(f));
            return;
        }
        if a.source.is_none() && a.class.is_none() {
            // A detail line with no "error received" before it: nothing to attach to.
            return;
        }
        let class = a.class.clone().unwrap_or_else(|| "unspecified".into());
        let mut f = base(
            FindingKind::PcieAer,
            aer_severity(&class, nvidia),
            Category::Pcie,
            &format!(
                "PCIe AER: {} error on {}",
                class.to_ascii_lowercase(),
                device
            ),
            msg,
            at,
        );
        f.pci = Some(device);
        f.message = a.text;
        f.detail = Some(Detail::Aer {
            reporter: (a.reporter != device).then_some(a.reporter),
            class,
        });
        self.pending = Some(Pending::Aer {
            finding: f,
            reporter: a.reporter,
            last_line: at.line,
        });
    }

    /// Attaches what is known about the GPU at the finding's address.
    fn enrich(&self, mut f: Finding) -> Finding {
        if let Some(id) = f.pci.and_then(|p| self.gpus.get(&p)) {
            merge_identity(&mut f.gpu, id);
        }
        f
    }
}

/// How bad an AER recovery status is: a GPU whose link could not be recovered is gone.
/// A failed recovery or link reset on an NVIDIA device, or on the port above one, costs the GPU.
/// On a device the log never ties to an NVIDIA GPU it is another driver's problem: when a GPU
/// is below, the nvidia driver's own "can't recover" line comes first (it has no AER callbacks)
/// and ties the port to it; without it the device that could not recover is a disk, a NIC, a
/// USB or Thunderbolt controller. Recorded, not raised.
fn status_severity(st: AerStatus, nvidia: bool) -> Severity {
    match (st, nvidia) {
        (AerStatus::RecoveryFailed | AerStatus::CantRecover, true) => Severity::Critical,
        (_, true) => Severity::Warning,
        (_, false) => Severity::Info,
    }
}

fn finding_sxid_unknown(f: &Finding) -> bool {
    f.title.ends_with("(severity not in the log)")
}

fn sxid_title(sxid: u32, fatal: Option<bool>) -> String {
    let what = match fatal {
        Some(true) => "fatal",
        Some(false) => "non-fatal",
        None => "severity not in the log",
    };
    match sxid::lookup(sxid) {
        Some(e) => format!("NVSwitch SXid {sxid} {} ({what})", e.name),
        None => format!("NVSwitch SXid {sxid} ({what})"),
    }
}

/// Sets an SXid finding's severity from the line's Fatal/Non-fatal word; the catalog, when it
/// knows the SXid, may make it worse, never better.
fn set_sxid_severity(f: &mut Finding, sxid_no: u32, fatal: bool) {
    f.severity = if fatal || sxid::lookup(sxid_no).is_some_and(|e| e.fatal) {
        Severity::Critical
    } else {
        Severity::Warning
    };
    f.title = sxid_title(sxid_no, Some(fatal));
    if let Some(Detail::Sxid { fatal: fl, .. }) = f.detail.as_mut() {
        *fl = fatal;
    }
}

/// Appends a number without going through `format!`.
fn push_u32(s: &mut String, mut n: u32) {
    let mut buf = [0u8; 10];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    s.push_str(std::str::from_utf8(&buf[i..]).unwrap_or("?"));
}

fn merge_identity(into: &mut GpuIdentity, from: &GpuIdentity) {
    if from.index.is_some() {
        into.index = from.index;
    }
    if from.uuid.is_some() {
        into.uuid.clone_from(&from.uuid);
    }
    if from.serial.is_some() {
        into.serial.clone_from(&from.serial);
    }
    if from.name.is_some() {
        into.name.clone_from(&from.name);
    }
}

fn base(
    kind: FindingKind,
    sev: Severity,
    cat: Category,
    title: &str,
    msg: &str,
    at: &LineOrigin,
) -> Finding {
    let message = msg.strip_prefix("NVRM: ").unwrap_or(msg).to_string();
    base_owned(kind, sev, cat, title.to_string(), message, msg, at)
}

/// [`base`] with the title and message already built (no copy of either).
fn base_owned(
    kind: FindingKind,
    sev: Severity,
    cat: Category,
    title: String,
    message: String,
    msg: &str,
    at: &LineOrigin,
) -> Finding {
    let mut f = Finding::new(kind, sev, cat, title);
    f.message = message;
    f.origin = Origin {
        line: at.line,
        lines: 1,
        seq: at.seq,
        ts_usec: at.ts_usec,
        timestamp: at.timestamp.clone(),
        raw: vec![msg.to_string()],
        raw_ts_usec: vec![at.ts_usec],
    };
    f
}

/// Whether `msg` is the X server NVIDIA driver's, as the first line of `f` is: its explanation
/// lines fold into its finding as the kernel driver's do.
fn same_x_driver(f: &Finding, msg: &str) -> bool {
    msg.starts_with("NVIDIA")
        && f.origin
            .raw
            .first()
            .is_some_and(|r| r.starts_with("NVIDIA"))
}

/// Whether a hung-task report says its task waits on `task` ("likely last held by task B:123"),
/// so that B's stack that follows belongs to the report.
fn held_by(f: &Finding, task: &Option<String>) -> bool {
    let (Some(t), Some(first)) = (task, f.origin.raw.first()) else {
        return false;
    };
    first
        .split_once("last held by task ")
        .is_some_and(|(_, holder)| {
            holder
                .strip_prefix(t.as_str())
                .is_some_and(|r| r.starts_with(':'))
        })
}

/// Adds a physical line to a folded finding: counted always, kept up to the bound.
fn fold_raw(f: &mut Finding, msg: &str, at: &LineOrigin, last_line: &mut u64) {
    let line = at.line;
    if line != *last_line || line == 0 {
        f.origin.lines += 1;
    }
    *last_line = line.max(*last_line);
    if f.origin.raw.len() < MAX_FOLDED_LINES {
        // Each folded line keeps its own time: the lines before it keep the finding's.
        let first = f.origin.ts_usec;
        let o = &mut f.origin;
        o.raw_ts_usec.resize(o.raw.len(), first);
        o.raw.push(msg.to_string());
        o.raw_ts_usec.push(at.ts_usec.or(first));
    }
}

fn class_of(f: &Finding) -> &str {
    match &f.detail {
        Some(Detail::Aer { class, .. }) => class,
        _ => "",
    }
}

/// A fatal error takes the link down: critical on a GPU, and still a warning on a device not
/// (yet) known to be one, since the GPU may be below. A non-fatal uncorrected error loses one
/// transaction and the link stays up: a warning on a GPU, and on other devices (NVMe, NICs,
/// USB and Thunderbolt controllers) another driver's business. A later line naming the GPU
/// raises the folded finding to the GPU's severity.
fn aer_severity(class: &str, nvidia: bool) -> Severity {
    if class.starts_with("Uncorrected (Fatal)") {
        if nvidia {
            Severity::Critical
        } else {
            Severity::Warning
        }
    } else if class.starts_with("Uncorrected") && nvidia {
        Severity::Warning
    } else {
        Severity::Info
    }
}

fn caused_by(rest: &str) -> Option<u32> {
    static F: std::sync::OnceLock<memchr::memmem::Finder<'static>> = std::sync::OnceLock::new();
    let i = F
        .get_or_init(|| memchr::memmem::Finder::new(b"caused by previous Xid "))
        .find(rest.as_bytes())?;
    let n = &rest[i + "caused by previous Xid ".len()..];
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

fn link_number(rest: &str) -> Option<u32> {
    let i = rest.find("Link ")?;
    let n = &rest[i + 5..];
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

fn parse_num_after(hay: &str, key: &str) -> Option<u32> {
    let i = hay.find(key)?;
    let n = hay[i + key.len()..].trim_start();
    let end = n.find(|c: char| !c.is_ascii_digit()).unwrap_or(n.len());
    n[..end].parse().ok()
}

fn hex_u32(s: &str) -> Option<u32> {
    let t = s.trim().trim_end_matches(',');
    let t = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

/// Extracts the per-Xid fields: 13 location, 74 link and registers, 144-150 decode, 154 action.
fn xid_detail(xid: u32, rest: &str, driver: Option<&str>) -> Option<Detail> {
    match xid {
        13 => {
            let at = rest.find("GPC ")?;
            let loc = &rest[at..];
            let gpc = parse_num_after(loc, "GPC ")?;
            let tpc = parse_num_after(loc, "TPC ")?;
            let sm = parse_num_after(loc, "SM ")?;
            Some(Detail::GraphicsException { gpc, tpc, sm })
        }
        74 => {
            let i = rest.find("on link ")?;
            let after = &rest[i + "on link ".len()..];
            let end = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            let link = after[..end].parse().ok()?;
            let registers = after[end..]
                .strip_prefix('(')
                .and_then(|r| r.split(')').next())
                .map(|r| r.split([',', ' ']).filter_map(hex_u32).collect())
                .unwrap_or_default();
            Some(Detail::NvlinkError { link, registers })
        }
        144..=150 => {
            let unit = rest.split_whitespace().next()?.to_string();
            let open = rest.find('(')?;
            let mut regs =
                rest[open + 1..].split(|c: char| c.is_whitespace() || c == ')' || c == ',');
            let mut next_hex = || regs.by_ref().find(|s| !s.is_empty()).and_then(hex_u32);
            let intr_info = next_hex()?;
            let error_status = next_hex()?;
            let layout = driver.and_then(Nvlink5Layout::for_driver);
            Some(Detail::Nvlink5 {
                unit,
                link: link_number(rest),
                intr_info,
                error_status,
                decode: catalog::decode_nvlink5(xid, intr_info, error_status, layout),
            })
        }
        154 => {
            let i = rest.find("changed from ")?;
            let s = &rest[i + "changed from ".len()..];
            let (from, to) = s.split_once(" to ")?;
            Some(Detail::Recovery {
                from: action(from),
                to: action(to),
            })
        }
        _ => None,
    }
}

/// `0x1 (GPU Reset Required)` -> the action; a bare value without words is kept as text.
fn action(s: &str) -> RecoveryAction {
    let s = s.trim().trim_end_matches('.');
    match (s.find('('), s.rfind(')')) {
        (Some(a), Some(b)) if b > a => RecoveryAction::from_text(&s[a + 1..b]),
        _ => RecoveryAction::Other(s.to_string()),
    }
}
