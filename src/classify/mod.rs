//! Classification: turns kernel log messages into typed [`Finding`]s.
//!
//! [`Classifier`] is pure (no I/O, no clock): message lines go in with where they came from, and
//! findings come out. It keeps a little state because some findings span several lines (the
//! three-line "fallen off the bus", the API mismatch, SXid continuation lines, AER detail lines,
//! GSP dumps and crash reports, probe explanations, call traces) and because identity lines
//! (`GPU at PCI:...: GPU-uuid`, board serial) name a GPU for the findings that follow.

mod aer;
pub mod catalog;
mod emit;
pub mod fabricmanager;
pub mod find;
pub mod guidance;
#[cfg(test)]
mod harmless_tests;
#[cfg(test)]
mod infra_tests;
mod nvswitch;
pub mod overrides;
mod pending;
pub mod prefilter;
pub mod prefix;
pub mod saved;
mod severity;
pub mod shape_id;
pub mod shapes;
pub mod signals;
pub mod sxid;
pub mod table;
pub mod trim;
pub mod wide;
mod xid;

#[cfg(test)]
mod binding_tests;
#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod forum_tests;
#[cfg(test)]
mod ml_tests;
#[cfg(test)]
mod other_tests;
#[cfg(test)]
mod rig_tests;
#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tool_tests;

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use crate::model::{Category, Finding, FindingKind, GpuIdentity, Origin, PciAddress, Severity};
use pending::Pending;
use shapes::Shape;

pub use overrides::{XidOverride, XidOverrides};

/// Where one message line came from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LineOrigin {
    /// 1-based physical line number in a scanned file (0 for live sources).
    pub line: u64,
    pub seq: Option<u64>,
    pub ts_usec: Option<u64>,
    pub timestamp: Option<crate::model::Stamp>,
}

/// Bound on remembered GPU identities: a real machine has at most a few dozen GPUs.
const MAX_GPUS: usize = 1024;

/// Adds `pci` to the NVIDIA devices unless [`MAX_NVIDIA_DEVICES`] are known (a free function
/// for callers that hold another part of the classifier borrowed).
fn note_nvidia(devices: &mut FxHashSet<PciAddress>, pci: PciAddress) {
    if devices.len() < MAX_NVIDIA_DEVICES {
        devices.insert(pci);
    }
}

/// Bound on the addresses remembered as NVIDIA devices: every Xid, driver or AER line naming an
/// address adds one, and a hostile or corrupted log read by `scan` may name millions.
const MAX_NVIDIA_DEVICES: usize = 4 * MAX_GPUS;

/// A line on which [`Classifier::push`] panics in unit tests, as a reader with a defect would.
#[cfg(test)]
pub(crate) const POISON_FOR_TESTS: &str = "xidwatch-test: a line a reader fails on";

/// The stateful classifier. One per input stream.
#[derive(Debug, Default)]
pub struct Classifier {
    pending: Option<Pending>,
    gpus: FxHashMap<PciAddress, GpuIdentity>,
    /// GPUs known to be NVIDIA devices (named by a driver line), for AER severity.
    nvidia_devices: FxHashSet<PciAddress>,
    /// The GPU below a PCIe port, from the log (an AER event naming both) or from the caller
    /// (the daemon reads sysfs topology): AER on the port is then about that GPU.
    port_gpu: FxHashMap<PciAddress, PciAddress>,
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
        self.note_nvidia(pci);
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
            self.note_nvidia(gpu);
        }
    }

    /// Remembers that `pci` is an NVIDIA device (its AER lines are then about a GPU), up to
    /// [`MAX_NVIDIA_DEVICES`] addresses.
    fn note_nvidia(&mut self, pci: PciAddress) {
        note_nvidia(&mut self.nvidia_devices, pci);
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
        // The unit tests' stand-in for a reader's defect: the daemon must skip such a line and
        // go on watching (src/daemon/tests.rs).
        #[cfg(test)]
        if msg.contains(POISON_FOR_TESTS) {
            panic!("a reader failed on a line (test)");
        }
        let (msg, parsed) = self.read_message(msg);
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
        // Bytes, not `strip_prefix`: the size-built binary calls `memcmp` for that, on every
        // line of a storm.
        let body = match msg.as_bytes() {
            [b'N', b'V', b'R', b'M', b':', b' ', ..] => &msg[6..],
            _ => return shape,
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

    /// Reads one message: the site's rows first, then the built-in shapes.
    ///
    /// When that reading is quiet and a later message starts in the same line, the later one is
    /// read, and kept when it says more. A wrapper often names an NVIDIA module or service before
    /// it quotes the tool that failed (`failed to load module nvidia-modeset: exit status 1;
    /// output=modprobe: ERROR: could not insert 'nvidia_modeset': No such device`, Ansible's
    /// `Unable to start service nvidia-persistenced: Job for nvidia-persistenced.service
    /// failed`): the first tag in the line is then only the wrapper's words. A line the site
    /// silenced stays silent, and the driver's own `NVRM:` messages keep their reading (their
    /// quiet ones continue multi-line messages).
    fn read_message<'m>(&self, msg: &'m str) -> (&'m str, Shape) {
        /// Later messages tried in one line: a bound on the work per line.
        const MAX_LATER: usize = 4;
        let site = self
            .site
            .as_deref()
            .and_then(|t| t.read(msg.trim(), table::Tag::None, None));
        let first = match site {
            // A silenced line is as quiet as a known-harmless one.
            Some(m) if m.silence => return (msg, Shape::Harmless),
            Some(m) => return (msg, Shape::Row(m)),
            None => shapes::parse(msg),
        };
        if !matches!(first, Shape::Harmless | Shape::Other) || msg.starts_with("NVRM") {
            return (msg, first);
        }
        let mut rest = msg;
        for _ in 0..MAX_LATER {
            let Some(space) = rest.find(' ') else { break };
            let after = &rest[space..];
            let Some(start) = prefix::message_start(after)
                .or_else(|| self.site.as_deref().and_then(|t| t.message_start(after)))
            else {
                break;
            };
            let later = after[start..].trim_end();
            let shape = match self
                .site
                .as_deref()
                .and_then(|t| t.read(later.trim(), table::Tag::None, None))
            {
                Some(m) if m.silence => return (msg, first),
                Some(m) => Shape::Row(m),
                None => shapes::parse(later),
            };
            if !matches!(shape, Shape::Harmless | Shape::Other) {
                return (later, shape);
            }
            rest = later;
        }
        (msg, first)
    }

    /// Attaches what is known about the GPU at the finding's address.
    #[inline]
    fn enrich(&self, mut f: Finding) -> Finding {
        if let Some(id) = f.pci.and_then(|p| self.gpus.get(&p)) {
            merge_identity(&mut f.gpu, id);
        }
        f
    }
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
    shape: &'static str,
    kind: FindingKind,
    sev: Severity,
    cat: Category,
    title: &str,
    msg: &str,
    at: &LineOrigin,
) -> Finding {
    let message = msg.strip_prefix("NVRM: ").unwrap_or(msg).to_string();
    base_owned(
        shape,
        Finding::new(kind, sev, cat, title.to_string()),
        message,
        msg,
        at,
    )
}

/// [`base`] with the finding's class and title and its message already built (no copy of
/// either).
#[inline]
fn base_owned(
    shape: &'static str,
    mut f: Finding,
    message: String,
    msg: &str,
    at: &LineOrigin,
) -> Finding {
    f.shape = Some(shape);
    f.message = message;
    f.origin = Origin {
        line: at.line,
        lines: 1,
        seq: at.seq,
        ts_usec: at.ts_usec,
        timestamp: at.timestamp.clone(),
        raw: vec![msg.to_string()],
        // Empty: a raw line without an entry has the finding's own time (`Origin::line_ts`), and
        // a vector per finding was an allocation and a free for every line of a storm.
        raw_ts_usec: Vec::new(),
    };
    f
}
