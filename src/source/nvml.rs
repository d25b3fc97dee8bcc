//! The NVML source: GPU identity, ECC and GPU-lost signals (and NVML's view of Xids) from NVIDIA's
//! management library, through the `nvml-wrapper` crate.
//!
//! The kernel log stays the source of truth for Xids (NVML coalesces queued Xids and has missed
//! some); NVML is here for what the log cannot give: a device inventory with UUIDs and serials, ECC
//! events, and a "GPU is lost" signal. NVML is loaded at run time, so one binary runs on machines
//! with and without the driver; a machine without it is normal, not an alarm.
//!
//! `nvmlEventSetWait` blocks, so events are read on a dedicated std thread that hands [`NvmlEvent`]
//! values over a bounded channel; the async daemon never calls into NVML from its executor.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::PciInfo;
use nvml_wrapper::{Device, EventSet, Nvml};

use crate::model::{Category, Finding, FindingKind, GpuIdentity, Origin, PciAddress, Severity};

/// The soname the driver package installs; the unversioned `libnvidia-ml.so` only exists where
/// the development files are installed.
pub const DEFAULT_LIBRARY: &str = "libnvidia-ml.so.1";

/// Short enough that `stop` is honoured promptly, long enough that an idle thread costs nothing.
const WAIT_MS: u32 = 200;

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
    /// A machine without the driver is expected (CPU nodes run the same image); every other
    /// failure means a GPU node has lost its view of its GPUs.
    pub fn severity(&self) -> Severity {
        match self {
            NvmlFailure::LibraryNotFound => Severity::Info,
            _ => Severity::Critical,
        }
    }

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
    /// one.
    pub fn to_finding(&self) -> Option<Finding> {
        match self {
            NvmlFailure::LibraryNotFound => None,
            _ => Some(self.finding()),
        }
    }

    fn finding(&self) -> Finding {
        let title = match self {
            NvmlFailure::LibraryNotFound => {
                "NVML is not installed (no NVIDIA driver on this machine)".to_string()
            }
            _ => format!("NVML cannot reach the driver: {}", self.headline()),
        };
        let mut f = Finding::new(
            FindingKind::NvmlUnavailable,
            self.severity(),
            Category::Driver,
            title,
        );
        f.message = self.describe();
        f.origin = nvml_origin(format!("NVML: {}", self.describe()));
        f
    }
}

/// What the NVML event thread hands to the daemon.
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
    /// The event thread hit an error it cannot wait out and has ended; open the source again to
    /// resume.
    Failed(NvmlFailure),
}

impl NvmlEvent {
    /// The classifier's catalog owns Xid severities, so an Xid here carries a placeholder
    /// (Driver / Warning) that the catalog replaces; ECC and lost-GPU findings are final.
    pub fn to_finding(&self, inventory: &[GpuInfo]) -> Finding {
        let (kind, severity, category, title, what, pci) = match self {
            NvmlEvent::Failed(failure) => return failure.finding(),
            NvmlEvent::Xid { pci, xid } => (
                FindingKind::Xid,
                Severity::Warning,
                Category::Driver,
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
                Severity::Warning,
                Category::Memory,
                "Single-bit ECC error (corrected)".to_string(),
                "single-bit ECC error event".to_string(),
                Some(*pci),
            ),
            NvmlEvent::EccDoubleBit { pci } => (
                FindingKind::EccError,
                Severity::Critical,
                Category::Memory,
                "Double-bit ECC error (uncorrectable)".to_string(),
                "double-bit ECC error event".to_string(),
                Some(*pci),
            ),
            NvmlEvent::GpuLost { pci } => (
                FindingKind::GpuLost,
                Severity::Critical,
                Category::Pcie,
                "GPU is lost: NVML can no longer reach it".to_string(),
                "GPU_IS_LOST (fallen off the bus or otherwise inaccessible)".to_string(),
                *pci,
            ),
        };
        let mut f = Finding::new(kind, severity, category, title);
        if let NvmlEvent::Xid { xid, .. } = self {
            f.xid = xid.and_then(|x| u32::try_from(x).ok());
        }
        let at = pci.map_or_else(|| "an unidentified GPU".to_string(), |p| p.to_string());
        f.message = format!("NVML {what}");
        f.origin = nvml_origin(format!("NVML: {what} on {at}"));
        f.pci = pci;
        if let Some(gpu) = pci.and_then(|p| inventory.iter().find(|g| g.pci == p)) {
            f.gpu = GpuIdentity {
                index: Some(gpu.index),
                uuid: gpu.uuid.clone(),
                serial: gpu.serial.clone(),
                name: gpu.name.clone(),
            };
        }
        f
    }
}

fn nvml_origin(raw: String) -> Origin {
    Origin {
        line: 0,
        lines: 1,
        raw: vec![raw],
        ..Origin::default()
    }
}

/// The running event thread.
#[derive(Debug)]
pub struct EventThread {
    pub handle: JoinHandle<()>,
    /// GPUs left out of event registration (or registered for fewer events), one line each, for
    /// the daemon's log: a GPU that cannot report ECC events should not look healthy by silence.
    pub notes: Vec<String>,
}

/// An initialised NVML with the inventory read at open time.
///
/// Cloning is cheap and shares the one NVML instance, so the daemon can keep a clone for
/// [`NvmlSource::reachable_gpus`] after handing the original to [`NvmlSource::spawn_events`].
#[derive(Debug, Clone)]
pub struct NvmlSource {
    nvml: Arc<Nvml>,
    inventory: Vec<GpuInfo>,
    driver_version: Option<String>,
    notes: Vec<String>,
}

impl NvmlSource {
    /// Loads NVML from `library` (`None` = the dynamic loader's search for [`DEFAULT_LIBRARY`]; a
    /// path without `/` is searched the same way), initialises it and reads the inventory.
    ///
    /// Blocks in NVML calls (seconds on a sick GPU), so an async caller runs it on a blocking
    /// thread.
    ///
    /// A GPU NVML counts but cannot describe is left out of the inventory with a line in
    /// [`NvmlSource::notes`] rather than failing the whole source: the other GPUs still need
    /// watching, and the lost-GPU probe reports the missing one.
    pub fn open(library: Option<&Path>) -> Result<NvmlSource, NvmlFailure> {
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
        let mut inventory = Vec::new();
        let mut notes = Vec::new();
        for index in 0..count {
            match read_gpu(&nvml, index) {
                Ok(gpu) => inventory.push(gpu),
                Err(note) => notes.push(note),
            }
        }
        Ok(NvmlSource {
            nvml: Arc::new(nvml),
            inventory,
            driver_version,
            notes,
        })
    }

    pub fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// GPUs left out of the inventory at open time, one line each.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Which PCI addresses NVML can reach now, for the lost-GPU probe: a GPU on the PCI bus but
    /// not in this list is present yet unusable. Re-queries NVML each time because the inventory
    /// is a snapshot from open time.
    pub fn reachable_gpus(&self) -> Result<Vec<PciAddress>, NvmlFailure> {
        let count = self.nvml.device_count().map_err(|e| classify(&e))?;
        Ok((0..count)
            .filter_map(|i| {
                let info = self
                    .nvml
                    .device_by_index(i)
                    .and_then(|d| d.pci_info())
                    .ok()?;
                pci_of(&info)
            })
            .collect())
    }

    /// Starts the event thread.
    ///
    /// Registration happens on the thread (an NVML event set borrows the NVML instance, so it
    /// cannot be built here and moved), and this call waits for it so `notes` can report GPUs
    /// that refused; like [`NvmlSource::open`] it can therefore block for as long as NVML does. A refusing GPU is left out rather than failing the source, because NVML
    /// frees the whole event set when one registration fails and the others still need
    /// watching.
    pub fn spawn_events(
        self,
        tx: SyncSender<NvmlEvent>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<EventThread> {
        let (ready_tx, ready_rx) = sync_channel(1);
        let handle = std::thread::Builder::new()
            .name("xidwatch-nvml".into())
            .spawn(move || event_thread(self, tx, stop, ready_tx))?;
        let notes = ready_rx.recv().unwrap_or_else(|_| {
            vec!["the NVML event thread ended before it registered for events".into()]
        });
        Ok(EventThread { handle, notes })
    }
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
/// must not pin the thread. `false` when the thread should end.
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

fn event_thread(
    source: NvmlSource,
    tx: SyncSender<NvmlEvent>,
    stop: Arc<AtomicBool>,
    ready: SyncSender<Vec<String>>,
) {
    let nvml: &Nvml = &source.nvml;
    let mut notes = Vec::new();
    let mut regs = plan(nvml, &source.inventory, &mut notes);
    let mut set = match build_set(nvml, &mut regs, &mut notes) {
        Ok(set) => set,
        Err(e) => {
            let failure = classify(&e);
            notes.push(format!("cannot create an NVML event set: {failure}"));
            let _ = ready.send(notes);
            deliver(&tx, &stop, NvmlEvent::Failed(failure));
            return;
        }
    };
    if regs.is_empty() {
        notes.push("no GPU is registered for NVML events; the NVML event thread only idles".into());
    }
    // The caller may have given up waiting; the thread still runs.
    let _ = ready.send(notes);
    drop(ready);

    // Set while a GPU_IS_LOST that no GPU could be blamed for has been reported, so a wait that
    // keeps failing the same way reports it once, not every 200 ms.
    let mut unattributed = false;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(WAIT_MS) {
            Ok(data) => {
                unattributed = false;
                for event in events_of(&data, &regs, &source.inventory) {
                    if !deliver(&tx, &stop, event) {
                        return;
                    }
                }
            }
            Err(NvmlError::Timeout) => {}
            Err(NvmlError::GpuLost) => {
                let lost: Vec<PciAddress> = regs
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
                    if !unattributed && !deliver(&tx, &stop, NvmlEvent::GpuLost { pci: None }) {
                        return;
                    }
                    unattributed = true;
                    // A wait that fails at once would otherwise spin.
                    std::thread::sleep(Duration::from_millis(u64::from(WAIT_MS)));
                    continue;
                }
                for pci in &lost {
                    if !deliver(&tx, &stop, NvmlEvent::GpuLost { pci: Some(*pci) }) {
                        return;
                    }
                }
                // A set that still holds the lost GPU keeps failing; rebuild it without.
                regs.retain(|r| !lost.contains(&r.pci));
                drop(set);
                set = match build_set(nvml, &mut regs, &mut Vec::new()) {
                    Ok(set) => set,
                    Err(e) => {
                        deliver(&tx, &stop, NvmlEvent::Failed(classify(&e)));
                        return;
                    }
                };
            }
            Err(e) => {
                deliver(&tx, &stop, NvmlEvent::Failed(classify(&e)));
                return;
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

/// Runbook `nvml` steps, answered through the same NVML handle the source uses. Queries the
/// wrapper has no call for (remapped rows, NVLink counters) say so instead of guessing; the
/// shipped runbooks also ask nvidia-smi for those.
impl crate::runbook::NvmlProbe for NvmlSource {
    fn query(
        &self,
        query: crate::runbook::NvmlQuery,
        gpu: PciAddress,
    ) -> Result<String, crate::runbook::NvmlError> {
        use crate::runbook::{NvmlError as E, NvmlQuery as Q};
        use nvml_wrapper::enum_wrappers::device::{
            Clock, EccCounter, MemoryError, RetirementCause, TemperatureSensor,
        };
        let info = self
            .inventory
            .iter()
            .find(|g| g.pci == gpu)
            .ok_or(E::GpuNotFound)?;
        let fail = |e: NvmlError| match e {
            NvmlError::NotSupported => E::NotSupported,
            other => E::Failed(other.to_string()),
        };
        if query == Q::Identity {
            return Ok(format!(
                "index: {}\npci: {}\nname: {}\nuuid: {}\nserial: {}\ndriver: {}",
                info.index,
                info.pci,
                info.name.as_deref().unwrap_or("?"),
                info.uuid.as_deref().unwrap_or("?"),
                info.serial.as_deref().unwrap_or("?"),
                self.driver_version.as_deref().unwrap_or("?"),
            ));
        }
        let d = self.nvml.device_by_index(info.index).map_err(fail)?;
        let mut out = String::new();
        let mut line = |k: &str, v: String| out.push_str(&format!("{k}: {v}\n"));
        match query {
            Q::EccErrors => {
                for (name, err, counter) in [
                    (
                        "corrected_volatile",
                        MemoryError::Corrected,
                        EccCounter::Volatile,
                    ),
                    (
                        "uncorrected_volatile",
                        MemoryError::Uncorrected,
                        EccCounter::Volatile,
                    ),
                    (
                        "corrected_aggregate",
                        MemoryError::Corrected,
                        EccCounter::Aggregate,
                    ),
                    (
                        "uncorrected_aggregate",
                        MemoryError::Uncorrected,
                        EccCounter::Aggregate,
                    ),
                ] {
                    line(
                        name,
                        d.total_ecc_errors(err, counter).map_err(fail)?.to_string(),
                    );
                }
            }
            Q::RetiredPages => {
                line(
                    "pending_retirement",
                    d.are_pages_pending_retired().map_err(fail)?.to_string(),
                );
                for (name, cause) in [
                    (
                        "retired_single_bit",
                        RetirementCause::MultipleSingleBitEccErrors,
                    ),
                    ("retired_double_bit", RetirementCause::DoubleBitEccError),
                ] {
                    line(
                        name,
                        d.retired_pages(cause).map_err(fail)?.len().to_string(),
                    );
                }
            }
            Q::Temperature => line(
                "gpu_celsius",
                d.temperature(TemperatureSensor::Gpu)
                    .map_err(fail)?
                    .to_string(),
            ),
            Q::Power => {
                line(
                    "draw_milliwatts",
                    d.power_usage().map_err(fail)?.to_string(),
                );
                line(
                    "limit_milliwatts",
                    d.enforced_power_limit().map_err(fail)?.to_string(),
                );
            }
            Q::Clocks => {
                for (name, clock) in [
                    ("graphics", Clock::Graphics),
                    ("sm", Clock::SM),
                    ("memory", Clock::Memory),
                ] {
                    let now = d.clock_info(clock).map_err(fail)?;
                    let max = d.max_clock_info(clock).map_err(fail)?;
                    line(&format!("{name}_mhz"), format!("{now} of {max}"));
                }
            }
            Q::ThrottleReasons => line(
                "active",
                format!("{:?}", d.current_throttle_reasons().map_err(fail)?),
            ),
            Q::PcieLink => {
                line(
                    "gen",
                    format!(
                        "{} of {}",
                        d.current_pcie_link_gen().map_err(fail)?,
                        d.max_pcie_link_gen().map_err(fail)?
                    ),
                );
                line(
                    "width",
                    format!(
                        "x{} of x{}",
                        d.current_pcie_link_width().map_err(fail)?,
                        d.max_pcie_link_width().map_err(fail)?
                    ),
                );
                line(
                    "replay_counter",
                    d.pcie_replay_counter().map_err(fail)?.to_string(),
                );
            }
            Q::Processes => {
                for p in d.running_compute_processes().map_err(fail)? {
                    let mem = match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => {
                            format!("{} MiB", b >> 20)
                        }
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => "?".into(),
                    };
                    line(&format!("pid {}", p.pid), mem);
                }
            }
            Q::RemappedRows | Q::Nvlink => return Err(E::NotSupported),
            Q::Identity => {}
        }
        Ok(out)
    }
}
