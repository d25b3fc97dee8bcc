//! From a line's shape to its finding: kind, severity, category and title per shape.

use super::pending::{FoldMode, Pending};
use super::shape_id as id;
use super::shapes::Shape;
use super::{base, base_owned, catalog, table, Classifier, LineOrigin};
use crate::model::{Category, Detail, Finding, FindingKind, GpuIdentity, Severity};

impl Classifier {
    pub(super) fn handle(
        &mut self,
        shape: Shape,
        msg: &str,
        at: &LineOrigin,
        out: &mut Vec<Finding>,
    ) {
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
                    id::GPU_UUID,
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
                    id::BOARD_SERIAL,
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
                    id::FALLEN_OFF_BUS,
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
                        id::RC_ALL_CHANNELS_79,
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
                        id::RC_ALL_CHANNELS,
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
                    id::NOT_RESPONDING,
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
                    id::FALLEN_OFF_BUS_TAIL,
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
                id: shape,
                pci,
                module,
                what,
                code,
                folds,
            } => {
                let mut f = base(
                    shape,
                    FindingKind::DriverInitFailure,
                    Severity::Critical,
                    Category::Driver,
                    &format!("driver initialisation failure: {what}"),
                    msg,
                    at,
                );
                f.pci = pci;
                f.module = module;
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
                    id::API_MISMATCH,
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
            Shape::VersionMismatch {
                component,
                component_version,
                kernel,
            } => {
                // The component refuses to work with the loaded kernel module: the same split as
                // the kernel's own API mismatch message.
                let mut f = base(id::API_VERSION_MISMATCH,
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
            // A line of the API mismatch message with no head above it (the head lost, cut by a
            // paste, or all that a `grep` kept): only this message says these words, so it is the
            // API mismatch, with what the line gives; the message's later lines fold in, and its
            // last line ends it.
            Shape::ApiMismatchClient { .. }
            | Shape::ApiMismatchKernel { .. }
            | Shape::ApiMismatchTail { .. } => {
                let finding = base(
                    id::API_MISMATCH_TAIL,
                    FindingKind::ApiMismatch,
                    Severity::Critical,
                    Category::Driver,
                    "driver API mismatch: user-space driver and kernel module versions differ",
                    msg,
                    at,
                );
                let ends = matches!(shape, Shape::ApiMismatchTail { last: true });
                let (client, kernel) = match shape {
                    Shape::ApiMismatchClient { client } => (Some(client), None),
                    Shape::ApiMismatchKernel { kernel } => (None, Some(kernel)),
                    _ => (None, None),
                };
                self.pending = Some(Pending::ApiMismatch {
                    finding,
                    client,
                    kernel,
                    last_line: at.line,
                });
                if ends {
                    self.flush(out);
                }
            }
            Shape::GspDump { opens, text } => {
                if !opens && !text.contains("_kgsp") && !text.contains("GSP") {
                    // A register line with nothing to attach to.
                    return;
                }
                let mut f = base(
                    id::GSP_RPC_DUMP,
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
                    id::GSP_CRASH,
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
                    id::NOT_SUPPORTED,
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
                let shape = if critical {
                    id::DRIVER_FATAL
                } else {
                    id::DRIVER_ERROR
                };
                let mut f = base(shape, FindingKind::DriverError, sev, cat, title, msg, at);
                f.pci = pci;
                f.message = text;
                out.push(self.enrich(f));
            }
            Shape::ModuleError { module, pci, text } => {
                let mut f = base(
                    id::MODULE_ERROR,
                    FindingKind::DriverError,
                    Severity::Warning,
                    Category::Driver,
                    &format!("{module} error"),
                    msg,
                    at,
                );
                f.module = Some(module.to_string());
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
                    id::TOOL_ERROR,
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
                task,
                hung,
                module,
                by_task,
                text,
            } => {
                let f = base(
                    id::CALL_TRACE,
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
                    module_by_task: by_task && module.is_some(),
                    last_line: at.line,
                    core: super::pending::CoreLink {
                        crash: !hung && super::shapes::is_crash_header(&text),
                        ..Default::default()
                    },
                });
            }
            Shape::TraceFrame { module } => {
                // A frame whose header was not seen (cut off, or outside the excerpt).
                if module.is_some() {
                    let f = base(
                        id::CALL_TRACE,
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
                        module_by_task: false,
                        last_line: at.line,
                        core: Default::default(),
                    });
                }
            }
            Shape::Sxid(s) => self.sxid(s, msg, at),
            Shape::FabricManager(ev) => out.push(self.fabric_manager(ev, msg, at)),
            Shape::Aer(a) => self.aer(a, msg, at, out),
            // A record starts at its head, or, pasted without it, at its PCIe section's
            // `device_id: 0000:01:00.0` line (only that section names a device by its address):
            // of unknown severity then, its `vendor_id` line below saying whose device it is, as
            // in a whole record.
            Shape::Cper(
                line @ (super::shapes::CperLine::Start | super::shapes::CperLine::Device(_)),
            ) => {
                let device = match line {
                    super::shapes::CperLine::Device(d) => Some(d),
                    _ => None,
                };
                let f = base(
                    id::AER_APEI,
                    FindingKind::PcieAer,
                    Severity::Info,
                    Category::Pcie,
                    "PCIe error reported by the firmware (APEI)",
                    msg,
                    at,
                );
                self.pending = Some(Pending::Cper {
                    finding: f,
                    severity: None,
                    pcie: device.is_some(),
                    device,
                    nvidia: false,
                    last_line: at.line,
                });
            }
            // Another line of a record without its start: nothing to attach it to.
            Shape::Cper(_) => {}
            Shape::Row(m) => self.row(m, msg, at, out),
            Shape::DriverLoaded { version } => self.driver_version = Some(version),
            Shape::UnreadableXid => {
                let f = base(
                    id::XID_UNREADABLE,
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
    pub(super) fn row(
        &mut self,
        m: table::RowMatch,
        msg: &str,
        at: &LineOrigin,
        out: &mut Vec<Finding>,
    ) {
        if m.silence {
            return;
        }
        let mut f = base_owned(
            m.id,
            Finding::new(m.kind, m.severity, m.category, m.title),
            m.message
                .unwrap_or_else(|| msg.strip_prefix("NVRM: ").unwrap_or(msg).to_string()),
            msg,
            at,
        );
        f.pci = m.pci;
        f.pid = m.pid;
        f.xid = m.xid;
        f.gpu.index = m.gpu;
        f.module = m.module;
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
}
