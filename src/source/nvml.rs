//! The NVML source: GPU identity, ECC and GPU-lost signals (and NVML's view of Xids) from NVIDIA's
//! management library, through the `nvml-wrapper` crate.
//!
//! The kernel log stays the source of truth for Xids (NVML coalesces queued Xids and has missed
//! some); NVML is here for what the log cannot give: a device inventory with UUIDs and serials, ECC
//! events, and a "GPU is lost" signal. NVML is loaded at run time, so one binary runs on machines
//! with and without the driver; a machine without it is normal, not an alarm.
//!
//! Every NVML call can block for as long as the driver does, and a wedged driver is exactly when
//! xidwatch must keep watching. So one thread, the [`NvmlWorker`], owns the handle and makes every
//! call: init, event registration and waits, the lost-GPU probe's queries, runbook `nvml` steps.
//! Callers wait for its answer with a deadline; a call that misses it is reported once per stuck
//! episode as [`NvmlEvent::Unresponsive`], with the tasks in uninterruptible sleep as evidence
//! ([`blocked`]), and later callers fail at once instead of queueing behind it.
//!
//! This module turns what NVML says into typed values ([`NvmlEvent`], [`NvmlFailure`]); what
//! severity they have is decided by `classify::signals`, not here.

pub mod blocked;
pub mod health;
pub mod link;
pub mod query;
mod worker;

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::PciInfo;
use nvml_wrapper::{Device, EventSet, Nvml};

use crate::classify::signals;
use crate::model::{BlockedTask, Detail, Finding, FindingKind, GpuIdentity, Origin, PciAddress};

pub use worker::{CallError, NvmlWorker, WorkerOptions};

/// The soname the driver package installs; the unversioned `libnvidia-ml.so` only exists where
/// the development files are installed.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// How long one event wait lasts. Requests are served between waits, so this is also the most a
/// request waits for the worker to take it up while events are watched.
const WAIT_MS: u32 = 100;

/// How long a full channel is retried before the stop flag is looked at again.
const SEND_RETRY: Duration = Duration::from_millis(10);

/// The events xidwatch acts on. Clock, P-state and power-source events are noise for fault
/// detection.
const WANTED: EventTypes = EventTypes::CRITICAL_XID_ERROR
    .union(EventTypes::SINGLE_BIT_ECC_ERROR)
    .union(EventTypes::DOUBLE_BIT_ECC_ERROR);

/// One GPU as NVML enumerated it when the source was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    /// NVML's index, which is also `nvidia-smi`'s, so alerts match what the on-call types.
    pub index: u32,
    pub pci: PciAddress,
    pub uuid: Option<String>,
    /// `None` where NVML would not say: boards without an infoROM have no serial.
    pub serial: Option<String>,
    pub name: Option<String>,
}

impl GpuInfo {
    /// The identity findings for this GPU carry.
    pub fn identity(&self) -> GpuIdentity {
        GpuIdentity {
            index: Some(self.index),
            uuid: self.uuid.clone(),
            serial: self.serial.clone(),
            name: self.name.clone(),
        }
    }
}

/// What NVML said when it was opened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Opened {
    pub inventory: Vec<GpuInfo>,
    pub driver_version: Option<String>,
    /// GPUs NVML counts but could not describe, one line each: left out of the inventory rather
    /// than failing the source, since the other GPUs still need watching (and the lost-GPU probe
    /// reports the missing one).
    pub notes: Vec<String>,
}

/// Why NVML could not be used. The variants are the failures an on-call reacts to differently.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub enum NvmlFailure {
    /// No NVML library on this machine: no NVIDIA driver is installed.
    LibraryNotFound,
    /// The library is there but the kernel module is not loaded.
    DriverNotLoaded,
    /// User-space library and kernel module are different versions.
    VersionMismatch,
    /// A GPU fell off the bus or is otherwise unreachable.
    GpuLost,
    /// The driver refused this process (device node permissions, cgroups).
    NoPermission,
    /// Anything else, with NVML's (or the loader's) words.
    Other(String),
}

impl NvmlFailure {
    fn headline(&self) -> &str {
        match self {
            NvmlFailure::LibraryNotFound => "NVML library not found",
            NvmlFailure::DriverNotLoaded => "NVIDIA driver not loaded",
            NvmlFailure::VersionMismatch => "driver/library version mismatch",
            NvmlFailure::GpuLost => "a GPU is lost",
            NvmlFailure::NoPermission => "permission denied",
            NvmlFailure::Other(text) => text,
        }
    }

    /// One sentence for people: what failed and what it usually means.
    pub fn describe(&self) -> String {
        match self {
            NvmlFailure::LibraryNotFound => {
                "NVML library not found: no NVIDIA driver is installed on this machine".into()
            }
            NvmlFailure::DriverNotLoaded => {
                "NVIDIA driver not loaded: NVML is installed but the kernel module is not running".into()
            }
            NvmlFailure::VersionMismatch => "driver/library version mismatch: the NVML library and the loaded kernel module are different versions (usually a driver update without a reboot or module reload)".into(),
            NvmlFailure::GpuLost => {
                "a GPU is lost: it fell off the bus or is otherwise inaccessible".into()
            }
            NvmlFailure::NoPermission => {
                "permission denied: the driver refused this process (device node permissions or cgroups)".into()
            }
            NvmlFailure::Other(text) => format!("NVML failed: {text}"),
        }
    }

    /// `None` for a machine without NVML: that is not a finding, or every CPU node would report
    /// one. Every other failure means a GPU node has lost its view of its GPUs.
    pub fn to_finding(&self) -> Option<Finding> {
        match self {
            NvmlFailure::LibraryNotFound => None,
            _ => Some(self.finding()),
        }
    }

    fn finding(&self) -> Finding {
        let mut f = signals::finding(
            FindingKind::NvmlUnavailable,
            None,
            format!("NVML cannot reach the driver: {}", self.headline()),
        );
        f.message = self.describe();
        f.origin = nvml_origin(vec![format!("NVML: {}", self.describe())]);
        f
    }
}

/// An NVML call that missed its deadline: the start of a stuck episode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The call the worker is stuck in (`nvmlDeviceGetCount`, `nvmlEventSetWait`, ...).
    pub call: String,
    /// How long that call had been running when it was declared stuck.
    pub running: Duration,
    /// Tasks in uninterruptible sleep at that moment, at most [`blocked::MAX_TASKS`].
    pub blocked: Vec<BlockedTask>,
    /// D-state tasks beyond those listed.
    pub blocked_omitted: usize,
    /// Why the list is empty or short (procfs unreadable), if it is.
    pub blocked_note: Option<String>,
}

/// What the NVML worker hands to the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NvmlEvent {
    /// A critical Xid. `xid` is `None` when NVML reports the Xid as unknown (its value 999).
    Xid {
        pci: PciAddress,
        xid: Option<u64>,
    },
    EccSingleBit {
        pci: PciAddress,
    },
    EccDoubleBit {
        pci: PciAddress,
    },
    /// `pci` is `None` when NVML said a GPU is lost but no registered GPU could be singled out.
    GpuLost {
        pci: Option<PciAddress>,
    },
    /// Event registration is done; `notes` name GPUs left out of it (or registered for fewer
    /// events), one line each: a GPU that cannot report ECC events should not look healthy by
    /// silence.
    Watching {
        notes: Vec<String>,
    },
    /// NVML answered its init only after [`NvmlWorker::wait_open`] had given up: the inventory
    /// arrives late, and the daemon can still learn it.
    Opened(Box<Opened>),
    /// A call missed its deadline. Sent once per stuck episode.
    Unresponsive(Box<Stall>),
    /// The stuck call returned after `stuck_for`: the episode is over.
    Answering {
        call: String,
        stuck_for: Duration,
    },
    /// Waiting for events failed in a way that cannot be waited out; requests are still served,
    /// but no more events come until a restart.
    Failed(NvmlFailure),
}

impl NvmlEvent {
    /// The finding for this event, or `None` for news that is only for the log ([`Watching`],
    /// [`Opened`], [`Answering`]). Severities come from `classify::signals`.
    ///
    /// [`Watching`]: NvmlEvent::Watching
    /// [`Opened`]: NvmlEvent::Opened
    /// [`Answering`]: NvmlEvent::Answering
    pub fn to_finding(&self, inventory: &[GpuInfo]) -> Option<Finding> {
        let (kind, detail, title, what, pci) = match self {
            NvmlEvent::Failed(failure) => return Some(failure.finding()),
            NvmlEvent::Unresponsive(stall) => return Some(stall_finding(stall)),
            NvmlEvent::Watching { .. } | NvmlEvent::Opened(_) | NvmlEvent::Answering { .. } => {
                return None
            }
            NvmlEvent::Xid { pci, xid } => (
                FindingKind::Xid,
                None,
                match xid {
                    Some(x) => format!("Xid {x} (reported by NVML)"),
                    None => "Xid of unknown number (reported by NVML)".to_string(),
                },
                match xid {
                    Some(x) => format!("critical Xid event, Xid {x}"),
                    None => "critical Xid event, Xid unknown".to_string(),
                },
                Some(*pci),
            ),
            NvmlEvent::EccSingleBit { pci } => (
                FindingKind::EccError,
                Some(Detail::Ecc { double_bit: false }),
                "Single-bit ECC error (corrected)".to_string(),
                "single-bit ECC error event".to_string(),
                Some(*pci),
            ),
            NvmlEvent::EccDoubleBit { pci } => (
                FindingKind::EccError,
                Some(Detail::Ecc { double_bit: true }),
                "Double-bit ECC error (uncorrectable)".to_string(),
                "double-bit ECC error event".to_string(),
                Some(*pci),
            ),
            NvmlEvent::GpuLost { pci } => (
                FindingKind::GpuLost,
                None,
                "GPU is lost: NVML can no longer reach it".to_string(),
                "GPU_IS_LOST (fallen off the bus or otherwise inaccessible)".to_string(),
                *pci,
            ),
        };
        let mut f = signals::finding(kind, detail, title);
        if let NvmlEvent::Xid { xid, .. } = self {
            // The catalog rates a numbered Xid (and names it).
            f.xid = xid.and_then(|x| u32::try_from(x).ok());
            signals::rate(&mut f);
        }
        let at = pci.map_or_else(|| "an unidentified GPU".to_string(), |p| p.to_string());
        f.message = format!("NVML {what}");
        f.origin = nvml_origin(vec![format!("NVML: {what} on {at}")]);
        f.pci = pci;
        if let Some(gpu) = pci.and_then(|p| inventory.iter().find(|g| g.pci == p)) {
            f.gpu = gpu.identity();
        }
        Some(f)
    }
}

/// A wedged driver is a host-wide fault (one stuck call holds every later one), so the finding
/// names no GPU. Its evidence is the D-state tasks: in the typed detail for machines, and one
/// line each in the finding's lines for people.
fn stall_finding(stall: &Stall) -> Finding {
    let secs = stall.running.as_secs_f64();
    let mut f = signals::finding(
        FindingKind::DriverUnresponsive,
        Some(Detail::DriverUnresponsive {
            call: stall.call.clone(),
            waited_ms: u64::try_from(stall.running.as_millis()).unwrap_or(u64::MAX),
            blocked: stall.blocked.clone(),
            blocked_omitted: stall.blocked_omitted,
        }),
        format!(
            "NVIDIA driver unresponsive: {} has not returned",
            stall.call
        ),
    );
    let total = stall.blocked.len() + stall.blocked_omitted;
    f.message = format!(
        "NVML call {} had not returned after {secs:.1} s; {total} task(s) in uninterruptible sleep (D state)",
        stall.call
    );
    let mut lines = vec![format!("NVML: {}", f.message)];
    lines.extend(stall.blocked.iter().map(blocked::describe));
    if stall.blocked_omitted > 0 {
        lines.push(format!(
            "... and {} more task(s) in D state",
            stall.blocked_omitted
        ));
    }
    if let Some(note) = &stall.blocked_note {
        lines.push(note.clone());
    }
    f.origin = nvml_origin(lines);
    f
}

fn nvml_origin(raw: Vec<String>) -> Origin {
    Origin {
        line: 0,
        lines: u32::try_from(raw.len()).unwrap_or(u32::MAX),
        raw,
        ..Origin::default()
    }
}

/// Loads NVML from `library` (`None` = the dynamic loader's search for [`DEFAULT_LIBRARY`]; a
/// path without `/` is searched the same way), initialises it and reads the inventory. Blocks in
/// NVML calls, so only the worker calls it.
fn open(library: Option<&Path>) -> Result<(Nvml, Opened), NvmlFailure> {
    let name: &OsStr = library.map_or(OsStr::new(DEFAULT_LIBRARY), Path::as_os_str);
    let nvml = Nvml::builder()
        .lib_path(name)
        .init()
        .map_err(|e| classify_load(&e, name))?;
    // nvml-wrapper's Drop impls call these two through `expect`; a library without them would
    // panic the daemon on the first drop, so it is refused here and leaked instead.
    if nvml.lib().nvmlShutdown.is_err() || nvml.lib().nvmlEventSetFree.is_err() {
        std::mem::forget(nvml);
        return Err(NvmlFailure::Other(format!(
            "{} is not a usable NVML library (no nvmlShutdown or nvmlEventSetFree)",
            name.to_string_lossy()
        )));
    }
    let driver_version = nvml.sys_driver_version().ok();
    let count = nvml.device_count().map_err(|e| classify(&e))?;
    let mut opened = Opened {
        driver_version,
        ..Opened::default()
    };
    for index in 0..count {
        match read_gpu(&nvml, index) {
            Ok(gpu) => opened.inventory.push(gpu),
            Err(note) => opened.notes.push(note),
        }
    }
    Ok((nvml, opened))
}

/// Which PCI addresses NVML can reach now, for the lost-GPU probe: a GPU on the PCI bus but not
/// in this list is present yet unusable. Re-queries NVML each time because the inventory is a
/// snapshot from open time.
fn reachable(nvml: &Nvml) -> Result<Vec<PciAddress>, NvmlFailure> {
    let count = nvml.device_count().map_err(|e| classify(&e))?;
    Ok((0..count)
        .filter_map(|i| {
            let info = nvml.device_by_index(i).and_then(|d| d.pci_info()).ok()?;
            pci_of(&info)
        })
        .collect())
}

/// What [`reachable`] finds, with each GPU's UUID and serial as NVML reads them now (not the
/// inventory's, which is from open time: a swapped board must read as another board).
fn reached(nvml: &Nvml) -> Result<Vec<crate::model::Reached>, NvmlFailure> {
    let count = nvml.device_count().map_err(|e| classify(&e))?;
    let text = |r: Result<String, NvmlError>| r.ok().filter(|s| !s.trim().is_empty());
    Ok((0..count)
        .filter_map(|i| {
            let d = nvml.device_by_index(i).ok()?;
            let pci = d.pci_info().ok().as_ref().and_then(pci_of)?;
            Some(crate::model::Reached {
                pci,
                uuid: text(d.uuid()),
                serial: text(d.serial()),
            })
        })
        .collect())
}

/// Loader errors need the library name to tell "no driver here" (Info) from "driver installed
/// but its library is broken" (Critical): both surface as a dlopen failure.
fn classify_load(e: &NvmlError, library: &OsStr) -> NvmlFailure {
    match e {
        NvmlError::LibloadingError(inner) => {
            let text = inner.to_string();
            let file = Path::new(library)
                .file_name()
                .unwrap_or(library)
                .to_string_lossy();
            if text.contains("No such file or directory") && text.contains(&*file) {
                NvmlFailure::LibraryNotFound
            } else {
                NvmlFailure::Other(format!("cannot load {}: {text}", library.to_string_lossy()))
            }
        }
        NvmlError::FailedToLoadSymbol(text) => NvmlFailure::Other(format!(
            "{} is not a usable NVML library: {text}",
            library.to_string_lossy()
        )),
        other => classify(other),
    }
}

fn classify(e: &NvmlError) -> NvmlFailure {
    match e {
        NvmlError::LibraryNotFound => NvmlFailure::LibraryNotFound,
        NvmlError::DriverNotLoaded => NvmlFailure::DriverNotLoaded,
        NvmlError::LibRmVersionMismatch => NvmlFailure::VersionMismatch,
        NvmlError::GpuLost => NvmlFailure::GpuLost,
        NvmlError::NoPermission => NvmlFailure::NoPermission,
        other => NvmlFailure::Other(other.to_string()),
    }
}

/// NVML's bus id (`00000000:17:00.0`) carries the function; the numeric fields do not, so they
/// are only the fallback.
fn pci_of(info: &PciInfo) -> Option<PciAddress> {
    PciAddress::parse(info.bus_id.trim()).ok().or_else(|| {
        PciAddress::new(
            info.domain,
            u8::try_from(info.bus).ok()?,
            u8::try_from(info.device).ok()?,
            0,
        )
    })
}

fn read_gpu(nvml: &Nvml, index: u32) -> Result<GpuInfo, String> {
    let device = nvml
        .device_by_index(index)
        .map_err(|e| format!("GPU {index}: NVML cannot open it: {}", classify(&e)))?;
    let info = device.pci_info().map_err(|e| {
        format!(
            "GPU {index}: NVML cannot read its PCI address: {}",
            classify(&e)
        )
    })?;
    let pci = pci_of(&info).ok_or_else(|| {
        format!(
            "GPU {index}: NVML gave an unusable PCI address {:?}",
            info.bus_id
        )
    })?;
    let text = |r: Result<String, NvmlError>| r.ok().filter(|s| !s.trim().is_empty());
    Ok(GpuInfo {
        index,
        pci,
        uuid: text(device.uuid()),
        serial: text(device.serial()),
        name: text(device.name()),
    })
}

/// One GPU the event set listens to.
struct Registration {
    index: u32,
    pci: PciAddress,
    types: EventTypes,
    /// NVML's device handle as a number, to tell which GPU an event names without another NVML
    /// call (which fails once that GPU is lost).
    handle: usize,
}

fn handle_of(device: &Device<'_>) -> usize {
    // SAFETY: `handle` only returns the stored pointer; it is `unsafe` because of what a caller
    // might do with it, and it is only compared here.
    unsafe { device.handle() as usize }
}

fn label(index: u32, pci: PciAddress) -> String {
    format!("GPU {index} ({pci})")
}

/// Decides what to register per GPU. Asking for unsupported types makes NVML refuse the whole
/// registration (and free the set), so only supported ones are asked for.
fn plan(nvml: &Nvml, inventory: &[GpuInfo], notes: &mut Vec<String>) -> Vec<Registration> {
    let mut regs = Vec::new();
    for gpu in inventory {
        let who = label(gpu.index, gpu.pci);
        let supported = match nvml
            .device_by_index(gpu.index)
            .and_then(|d| d.supported_event_types())
        {
            Ok(s) => s,
            Err(e) => {
                notes.push(format!(
                    "{who}: not watched for NVML events: cannot read its supported event types: {}",
                    classify(&e)
                ));
                continue;
            }
        };
        let types = supported & WANTED;
        if types.is_empty() {
            notes.push(format!(
                "{who}: not watched for NVML events: it supports none of Xid, single-bit ECC, double-bit ECC"
            ));
            continue;
        }
        if types != WANTED {
            notes.push(format!(
                "{who}: NVML reports only {} events for it (ECC may be disabled)",
                type_names(types)
            ));
        }
        regs.push(Registration {
            index: gpu.index,
            pci: gpu.pci,
            types,
            handle: 0,
        });
    }
    regs
}

fn type_names(types: EventTypes) -> String {
    let mut names = Vec::new();
    if types.contains(EventTypes::CRITICAL_XID_ERROR) {
        names.push("Xid");
    }
    if types.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
        names.push("single-bit ECC");
    }
    if types.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        names.push("double-bit ECC");
    }
    names.join(", ")
}

enum Attempt<'n> {
    Done(EventSet<'n>),
    /// Registration `i` failed; nvml-wrapper has already freed the set.
    Refused(usize, NvmlError),
}

fn attempt<'n>(nvml: &'n Nvml, regs: &mut [Registration]) -> Result<Attempt<'n>, NvmlError> {
    let mut set = nvml.create_event_set()?;
    for (i, reg) in regs.iter_mut().enumerate() {
        let device = match nvml.device_by_index(reg.index) {
            Ok(d) => d,
            Err(e) => return Ok(Attempt::Refused(i, e)),
        };
        reg.handle = handle_of(&device);
        set = match device.register_events(reg.types, set) {
            Ok(set) => set,
            Err(e) => return Ok(Attempt::Refused(i, e.error)),
        };
    }
    Ok(Attempt::Done(set))
}

/// Builds an event set over `regs`, dropping each GPU that refuses and starting over, since a
/// refusal frees the set with every earlier registration in it. Ends because `regs` shrinks.
fn build_set<'n>(
    nvml: &'n Nvml,
    regs: &mut Vec<Registration>,
    notes: &mut Vec<String>,
) -> Result<EventSet<'n>, NvmlError> {
    loop {
        match attempt(nvml, regs)? {
            Attempt::Done(set) => return Ok(set),
            Attempt::Refused(i, e) => {
                let reg = regs.remove(i);
                notes.push(format!(
                    "{}: not watched for NVML events: registration refused: {}",
                    label(reg.index, reg.pci),
                    classify(&e)
                ));
            }
        }
    }
}

/// Hands one event over without blocking past `stop`: a bounded channel with a stalled reader
/// must not pin the thread. `false` when the reader is gone or `stop` is set.
fn deliver(tx: &SyncSender<NvmlEvent>, stop: &AtomicBool, mut event: NvmlEvent) -> bool {
    loop {
        match tx.try_send(event) {
            Ok(()) => return true,
            Err(TrySendError::Disconnected(_)) => return false,
            Err(TrySendError::Full(back)) => {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                event = back;
                std::thread::sleep(SEND_RETRY);
            }
        }
    }
}

/// The event set and the GPUs in it, as the worker keeps them between waits.
struct Watch<'n> {
    set: Option<EventSet<'n>>,
    regs: Vec<Registration>,
    /// Set while a GPU_IS_LOST that no GPU could be blamed for has been reported, so a wait that
    /// keeps failing the same way reports it once, not every wait.
    unattributed: bool,
}

impl<'n> Watch<'n> {
    /// Registers every GPU of `inventory` that can report what xidwatch wants. A refusing GPU is
    /// left out (with a note) rather than failing the source, because NVML frees the whole event
    /// set when one registration fails and the others still need watching.
    fn register(
        nvml: &'n Nvml,
        inventory: &[GpuInfo],
    ) -> (Watch<'n>, Result<Vec<String>, NvmlFailure>) {
        let mut notes = Vec::new();
        let mut regs = plan(nvml, inventory, &mut notes);
        match build_set(nvml, &mut regs, &mut notes) {
            Ok(set) => {
                if regs.is_empty() {
                    notes.push(
                        "no GPU is registered for NVML events; only requests are served".into(),
                    );
                }
                (
                    Watch {
                        set: Some(set),
                        regs,
                        unattributed: false,
                    },
                    Ok(notes),
                )
            }
            Err(e) => (
                Watch {
                    set: None,
                    regs: Vec::new(),
                    unattributed: false,
                },
                Err(classify(&e)),
            ),
        }
    }

    fn is_waiting(&self) -> bool {
        self.set.is_some()
    }

    /// One wait of [`WAIT_MS`], and what came of it. A failure that cannot be waited out drops
    /// the set (and is returned as [`NvmlEvent::Failed`]); requests are still served.
    fn wait(&mut self, nvml: &'n Nvml, inventory: &[GpuInfo]) -> Vec<NvmlEvent> {
        let Some(set) = self.set.as_mut() else {
            return Vec::new();
        };
        match set.wait(WAIT_MS) {
            Ok(data) => {
                self.unattributed = false;
                events_of(&data, &self.regs, inventory)
            }
            Err(NvmlError::Timeout) => Vec::new(),
            Err(NvmlError::GpuLost) => {
                let lost: Vec<PciAddress> = self
                    .regs
                    .iter()
                    .filter(|r| {
                        matches!(
                            nvml.device_by_index(r.index).and_then(|d| d.pci_info()),
                            Err(NvmlError::GpuLost)
                        )
                    })
                    .map(|r| r.pci)
                    .collect();
                if lost.is_empty() {
                    let first = !self.unattributed;
                    self.unattributed = true;
                    // A wait that fails at once would otherwise spin.
                    std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                    return if first {
                        vec![NvmlEvent::GpuLost { pci: None }]
                    } else {
                        Vec::new()
                    };
                }
                let mut out: Vec<NvmlEvent> = lost
                    .iter()
                    .map(|p| NvmlEvent::GpuLost { pci: Some(*p) })
                    .collect();
                // A set that still holds the lost GPU keeps failing; rebuild it without.
                self.regs.retain(|r| !lost.contains(&r.pci));
                self.set = None;
                match build_set(nvml, &mut self.regs, &mut Vec::new()) {
                    Ok(set) => self.set = Some(set),
                    Err(e) => out.push(NvmlEvent::Failed(classify(&e))),
                }
                out
            }
            Err(e) => {
                self.set = None;
                vec![NvmlEvent::Failed(classify(&e))]
            }
        }
    }
}

/// Turns one NVML event into ours. An event naming a GPU that cannot be identified is dropped:
/// without an address it cannot be tied to anything, and the kernel log carries the same Xid.
fn events_of(
    data: &nvml_wrapper::struct_wrappers::event::EventData<'_>,
    regs: &[Registration],
    inventory: &[GpuInfo],
) -> Vec<NvmlEvent> {
    let handle = handle_of(&data.device);
    let pci = regs
        .iter()
        .find(|r| r.handle == handle)
        .map(|r| r.pci)
        .or_else(|| {
            let index = data.device.index().ok()?;
            inventory.iter().find(|g| g.index == index).map(|g| g.pci)
        })
        .or_else(|| pci_of(&data.device.pci_info().ok()?));
    let Some(pci) = pci else {
        return Vec::new();
    };
    let mut events = Vec::new();
    if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
        let xid = match data.event_data {
            Some(XidError::Value(v)) => Some(v),
            Some(XidError::Unknown) | None => None,
        };
        events.push(NvmlEvent::Xid { pci, xid });
    }
    if data.event_type.contains(EventTypes::SINGLE_BIT_ECC_ERROR) {
        events.push(NvmlEvent::EccSingleBit { pci });
    }
    if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
        events.push(NvmlEvent::EccDoubleBit { pci });
    }
    events
}
