//! Multi-line findings: what a pending finding takes, and how it ends.

use super::severity::{aer_severity, class_of, set_sxid_severity, status_severity};
use super::shapes::Shape;
use super::{shapes, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, PciAddress, Severity};

/// How many raw lines a folded finding keeps; the rest are counted in its message.
pub(super) const MAX_FOLDED_LINES: usize = 32;
/// A multi-line message whose next line has not come within this many physical lines is
/// finished with what it has (mixed files interleave other lines).
pub(super) const MAX_FOLD_GAP: u64 = 16;
/// A call trace's frames outside NVIDIA modules do not reach the classifier in `scan` (they hold
/// no NVIDIA literal), so the gap between the frames it sees is wider.
pub(super) const MAX_TRACE_GAP: u64 = 96;

/// Which lines a [`Pending::Fold`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FoldMode {
    /// NVRM lines that are not a message of their own: the explanation the driver prints after a
    /// probe or "not supported" message, the "BAR0 is 0M" line.
    Explain,
    /// The GSP crash report's indented register and libos lines.
    Crash,
}

/// A finding that may still take more lines.
#[derive(Debug)]
pub(super) enum Pending {
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
        /// Whether a line said Fatal or Non-fatal yet (a continuation line may come first).
        severity_known: bool,
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
    /// A firmware-first hardware error record (APEI): reported when it is a PCIe error of an
    /// NVIDIA device.
    Cper {
        finding: Finding,
        severity: Option<String>,
        pcie: bool,
        device: Option<PciAddress>,
        nvidia: bool,
        last_line: u64,
    },
    /// A call trace or hung-task report; reported only when a frame is in an NVIDIA module, or
    /// when it is a crash in core kernel code on a kernel that only NVIDIA's modules taint.
    Trace {
        finding: Finding,
        task: Option<String>,
        hung: bool,
        module: Option<&'static str>,
        /// Whether `module` is only the task's name read as a module (`nvc:[driver]`, an NVIDIA
        /// tool): a frame in an NVIDIA module says better where the task is stuck.
        module_by_task: bool,
        last_line: u64,
        core: CoreLink,
    },
}

/// What ties a crash report to the driver when no line of it names an NVIDIA module: it is a
/// crash (a header, not a hung task or a bare call trace), its `Modules linked in:` line names
/// out-of-tree modules and all of them are NVIDIA's, and no instruction-pointer line puts the
/// fault in another module. Kernel developers hand such a report to NVIDIA ("Tainted: P O",
/// proprietary modules loaded); a crash inside another driver (`RIP: ... [amdgpu]`) with the
/// NVIDIA modules merely loaded is not this.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CoreLink {
    pub crash: bool,
    pub only_nvidia_out_of_tree: bool,
    pub ip_elsewhere: bool,
}

impl Pending {
    pub(super) fn last_line(&self) -> u64 {
        match self {
            Pending::TheNvidiaGpu { last_line, .. }
            | Pending::ApiMismatch { last_line, .. }
            | Pending::Sxid { last_line, .. }
            | Pending::Aer { last_line, .. }
            | Pending::Gsp { last_line, .. }
            | Pending::Fold { last_line, .. }
            | Pending::Cper { last_line, .. }
            | Pending::Trace { last_line, .. } => *last_line,
        }
    }

    pub(super) fn gap(&self) -> u64 {
        match self {
            Pending::Trace { .. } => MAX_TRACE_GAP,
            _ => MAX_FOLD_GAP,
        }
    }
}

/// The lines after `The NVIDIA GPU <addr> (PCI ID: ...)` (its `installed in this system ...`
/// tail, or a sentence of its own in some releases) that say the driver will not drive the GPU,
/// first match wins: the words, the shape, the title, the message.
const NOT_DRIVEN: &[(&[&str], &str, &str, &str)] = &[
    // Blackwell and later on the proprietary modules.
    (
        &["requires use of the NVIDIA open kernel modules"],
        super::shape_id::NEEDS_OPEN_MODULES,
        "GPU requires the NVIDIA open kernel modules",
        "this GPU is driven only by the NVIDIA open kernel modules; the proprietary ones are loaded",
    ),
    // "is not supported by the NVIDIA 550.54.14 driver release" / "supported through open
    // nvidia.ko" / "This NVIDIA driver is not compatible with this NVIDIA GPU" (the open modules
    // on a GPU without GSP, in the wording of some releases).
    (
        &["not supported", "supported through", "not compatible with this NVIDIA GPU"],
        super::shape_id::NOT_SUPPORTED,
        "GPU not supported by the installed driver",
        "the installed NVIDIA driver does not support this GPU (a legacy GPU, or the open kernel modules on a GPU without GSP)",
    ),
];

impl Classifier {
    /// A line of a pending crash report that holds no message of its own (`No
    /// drm_driver.set_busid() implementation provided by nvidia_frontend_exit_module [nvidia].`):
    /// when it names an NVIDIA module in brackets it ties the report to that module, and is part
    /// of it. Any other line is left alone (it neither joins nor ends the report). Returns
    /// whether the line was taken.
    pub fn report_line(&mut self, text: &str, at: &LineOrigin) -> bool {
        let Some(Pending::Trace {
            finding,
            module,
            last_line,
            core,
            ..
        }) = self.pending.as_mut()
        else {
            return false;
        };
        if at.line > *last_line + MAX_TRACE_GAP {
            return false;
        }
        // The modules linked in, and the instruction pointer in another module or in core code:
        // what decides a crash that names no NVIDIA module (see `CoreLink`).
        if let Some(only_nvidia) = shapes::modules_linked_in(text) {
            core.only_nvidia_out_of_tree = only_nvidia;
            fold_raw(finding, text, at, last_line);
            return true;
        }
        if let Some(ip) = shapes::ip_line_module(text) {
            match ip {
                Some(m) if shapes::is_nvidia_module(m) => {}
                Some(_) => core.ip_elsewhere = true,
                None => {}
            }
            fold_raw(finding, text, at, last_line);
            return true;
        }
        let Some(named) = shapes::named_module(text) else {
            return false;
        };
        if module.is_none() {
            *module = Some(named);
        }
        fold_raw(finding, text, at, last_line);
        true
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
                if hung {
                    finding.shape = Some(super::shape_id::HUNG_TASK);
                }
                finding.module = Some(module.to_string());
                finding.title = match (&task, hung) {
                    (Some(t), true) => format!("task {t} hung in the {module} module"),
                    (Some(t), false) => {
                        format!("kernel call trace in the {module} module (task {t})")
                    }
                    (None, _) => format!("kernel call trace in the {module} module"),
                }
                .into();
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
            // A crash in core kernel code on a kernel only NVIDIA's modules taint.
            Pending::Trace {
                mut finding,
                task,
                module: None,
                core:
                    CoreLink {
                        crash: true,
                        only_nvidia_out_of_tree: true,
                        ip_elsewhere: false,
                    },
                ..
            } => {
                finding.shape = Some(super::shape_id::CORE_CRASH_NVIDIA_TAINTED);
                finding.module = Some("nvidia".to_string());
                finding.title =
                    "kernel crash in core code; NVIDIA's are the only out-of-tree modules loaded"
                        .into();
                finding.message = format!(
                    "kernel crash outside any module, on a kernel whose only out-of-tree modules are NVIDIA's{}",
                    task.map(|t| format!(", task {t}")).unwrap_or_default()
                );
                out.push(finding);
            }
            // A trace without NVIDIA frames is none of xidwatch's business.
            Pending::Trace { module: None, .. } => {}
            Pending::Cper {
                mut finding,
                severity,
                pcie,
                device: Some(device),
                nvidia,
                ..
            } if pcie && (nvidia || self.nvidia_devices.contains(&device)) => {
                let sev = severity.unwrap_or_else(|| "unknown".into());
                finding.severity = match sev.as_str() {
                    "fatal" => Severity::Critical,
                    "recoverable" => Severity::Warning,
                    _ => Severity::Info,
                };
                finding.pci = Some(device);
                finding.title =
                    format!("PCIe {sev} error on {device}, reported by the firmware (APEI)").into();
                finding.detail = Some(Detail::Aer {
                    reporter: None,
                    class: format!("{sev} (firmware-first, APEI)"),
                });
                self.note_nvidia(device);
                out.push(self.enrich(finding));
            }
            // Another device's record, or one that names no PCIe device.
            Pending::Cper { .. } => {}
            Pending::Sxid { finding, .. }
            | Pending::Aer { finding, .. }
            | Pending::Gsp { finding, .. }
            | Pending::Fold { finding, .. } => out.push(self.enrich(finding)),
        }
    }

    /// Offers a line to the pending multi-line finding. Returns the shape back when the line is
    /// not part of it (after finishing the pending finding).
    pub(super) fn extend_pending(
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
                if let Some(&(_, shape, title, message)) = NOT_DRIVEN
                    .iter()
                    .find(|(words, ..)| words.iter().any(|w| msg.contains(w)))
                {
                    // The driver will not drive this GPU: one finding that takes the driver's
                    // explanation lines after it.
                    let mut f = finding.clone();
                    fold_raw(&mut f, msg, at, last_line);
                    f.kind = FindingKind::DriverError;
                    f.severity = Severity::Warning;
                    f.category = Category::Driver;
                    f.title = title.into();
                    f.message = message.into();
                    f.shape = Some(shape);
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
                    severity_known,
                    last_line,
                },
                Shape::Sxid(s),
            ) if s.switch == *switch
                && s.pci == finding.pci
                && Some(s.sxid) == finding.xid
                && (s.fatal.is_none() || !*severity_known) =>
            {
                if let Some(fatal) = s.fatal {
                    // The head line after a continuation line that came first ("Data {...}"
                    // before "Non-fatal, Link 44"): the finding learns its severity.
                    let msg_text = s.rest.clone();
                    set_sxid_severity(finding, s.sxid, fatal);
                    *severity_known = true;
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
                        super::note_nvidia(&mut self.nvidia_devices, p);
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
                    module_by_task,
                    last_line,
                    ..
                },
                Shape::TraceFrame { module: m },
            ) => {
                if module.is_none() || (*module_by_task && m.is_some()) {
                    *module = *m;
                    *module_by_task = false;
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
                    module_by_task,
                    last_line,
                    ..
                },
                Shape::TraceStart {
                    task: t,
                    hung: h,
                    module: m,
                    by_task,
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
                // A module the line names (`RIP: ...[nvidia_uvm]`) refines one read from the
                // task's name, as a frame does.
                if module.is_none() || (*module_by_task && m.is_some() && !*by_task) {
                    *module = *m;
                    *module_by_task = *by_task && m.is_some();
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            (
                Pending::Cper {
                    finding,
                    severity,
                    pcie,
                    device,
                    nvidia,
                    last_line,
                },
                Shape::Cper(l),
            ) if *l != shapes::CperLine::Start => {
                match l {
                    shapes::CperLine::Severity(s) => *severity = Some(s.clone()),
                    shapes::CperLine::Section(s) => *pcie |= s.starts_with("PCIe"),
                    shapes::CperLine::Device(d) => {
                        device.get_or_insert(*d);
                    }
                    shapes::CperLine::Vendor(v) => *nvidia |= *v == 0x10de,
                    shapes::CperLine::Start | shapes::CperLine::Other => {}
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            // A line of the report that is no message of its own but names an NVIDIA module
            // (`... provided by nvidia_frontend_exit_module [nvidia].` under a DRM core warning):
            // the report is the driver's.
            (
                Pending::Trace {
                    finding,
                    module,
                    last_line,
                    ..
                },
                Shape::Other | Shape::Harmless,
            ) if shapes::named_module(msg).is_some() => {
                if module.is_none() {
                    *module = shapes::named_module(msg);
                }
                fold_raw(finding, msg, at, last_line);
                None
            }
            // A frame whose paste lost its offsets and names no module (` __schedule`, indented
            // under the report's `Call Trace:`): a bare symbol on a line of its own, which alone
            // would say nothing, is a frame only inside a report.
            (
                Pending::Trace {
                    finding, last_line, ..
                },
                Shape::Other | Shape::Harmless,
            ) if shapes::is_bare_symbol(msg) => {
                fold_raw(finding, msg, at, last_line);
                None
            }
            _ => {
                self.flush(out);
                Some(shape)
            }
        }
    }
}

/// Whether `msg` is the X server NVIDIA driver's, as the first line of `f` is: its explanation
/// lines fold into its finding as the kernel driver's do.
pub(super) fn same_x_driver(f: &Finding, msg: &str) -> bool {
    msg.starts_with("NVIDIA")
        && f.origin
            .raw
            .first()
            .is_some_and(|r| r.starts_with("NVIDIA"))
}

/// Whether a hung-task report says its task waits on `task` ("likely last held by task B:123"),
/// so that B's stack that follows belongs to the report.
pub(super) fn held_by(f: &Finding, task: &Option<String>) -> bool {
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
pub(super) fn fold_raw(f: &mut Finding, msg: &str, at: &LineOrigin, last_line: &mut u64) {
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
