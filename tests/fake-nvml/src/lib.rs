//! A fake `libnvidia-ml.so` for xidwatch's tests: the real `nvml-wrapper` code loads it with
//! `dlopen` exactly as it would load NVIDIA's library, so the tests exercise the real symbol
//! loading, struct layouts and error mapping on machines without a GPU or a driver.
//!
//! `nvml-wrapper-sys` resolves every symbol lazily (a missing one only fails when called), so only
//! the functions xidwatch uses are exported:
//! `nvmlInit_v2`, `nvmlInitWithFlags`, `nvmlShutdown`, `nvmlErrorString`,
//! `nvmlSystemGetDriverVersion`, `nvmlDeviceGetCount_v2`, `nvmlDeviceGetHandleByIndex_v2`,
//! `nvmlDeviceGetPciInfo_v3`, `nvmlDeviceGetUUID`, `nvmlDeviceGetSerial`, `nvmlDeviceGetName`,
//! `nvmlDeviceGetIndex`, `nvmlDeviceGetSupportedEventTypes`, `nvmlDeviceRegisterEvents`,
//! `nvmlEventSetCreate`, `nvmlEventSetWait_v2`, `nvmlEventSetFree`, and the health readings:
//! temperature and its thresholds, throttle reasons, PCIe link (current and maximum), utilization,
//! remapped rows, retired pages, ECC counts and mode, the GPU recovery action (a field value),
//! power and its enforced limit, persistence mode, VBIOS version (see [`VALUE_KEYS`]), memory
//! used and total, the fabric registration (`nvmlDeviceGetGpuFabricInfo`), and the compute and
//! graphics process lists with each process's GPU memory.
//!
//! # Script
//!
//! The behaviour comes from the plain-text file named by `XIDWATCH_FAKE_NVML_SCRIPT`, read by the
//! first init after a full shutdown (init is reference counted, like NVML's). One directive a
//! line; `#` starts a comment; values cannot contain spaces.
//!
//! ```text
//! init ok                      # default; or `init error N`: init returns NVML return code N
//! driver_version 550.54.14     # absent: nvmlSystemGetDriverVersion returns NOT_SUPPORTED
//! device pci=0000:17:00.0 uuid=GPU-... serial=1650923011234 name=NVIDIA_H100_80GB_HBM3
//! event after_ms=50 gpu=0 type=xid data=79
//! event after_ms=10 gpu=1 type=sbe
//! event after_ms=10 gpu=1 type=dbe
//! event after_ms=10 gpu=0 type=gpu_lost
//! event after_ms=10 type=error code=999
//! hang nvmlDeviceGetCount_v2 30000 skip=1 times=1
//! device pci=0000:2a:00.0 temp=45 slowdown=90 gen=4 gen_max=4 width=16 width_max=16 util=90
//! set at_ms=2000 gpu=1 temp=93 width=4          # from 2 s after init on, GPU 1 reads these
//! ```
//!
//! Health readings: a `device` line takes any of the keys in [`VALUE_KEYS`] (numbers, `0x` for
//! hex) and `vbios=TEXT`; a key never given makes its getter return NOT_SUPPORTED, as NVML does on
//! boards without the sensor. `set at_ms=T gpu=N KEY=VALUE...` changes values from `T`
//! milliseconds after init on, so a script can play a temperature that climbs and stays, a spike,
//! or a link that drops under load. `lost=1` makes the GPU lost (as `gpu_lost` does, without
//! an event) and `lost=0` reachable again; `uuid=TEXT` makes it answer with another UUID, as
//! another board at the same address would.
//!
//! Processes: `compute=PID:MIB,...` and `graphics=PID:MIB,...` on a `device` line or in a `set`
//! give the lists `nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3` answer (`none`: an empty
//! list; `PID:-`: memory not available; never given: NOT_SUPPORTED). The pids mean nothing to
//! the fake; the test lays out the procfs fixture they are looked up in.
//!
//! Calls: with `XIDWATCH_FAKE_NVML_CALLS=FILE`, the name of every call that a `hang` directive
//! can name is appended to FILE as it comes in, one a line (a test counts polls with it).
//!
//! `device` lines define GPUs 0, 1, ... in order. Keys: `pci` (required, any width of domain),
//! `uuid`, `serial`, `name` (`_` stands for a space) — a missing one makes its getter return
//! NOT_SUPPORTED, as NVML does for a serial on boards without one —, `events` (the supported event
//! types, a comma list of `xid`, `sbe`, `dbe`, or `none`; default all three), `register_error=N`
//! (nvmlDeviceRegisterEvents fails with code N for this GPU).
//!
//! Events form one timeline that starts at the first nvmlEventSetWait_v2 after init; `after_ms`
//! counts from the previous event. A due event is handed to the waiting set if that set has
//! registered the event's type on its GPU, and otherwise dropped, as NVML drops events nobody
//! listens for. `gpu_lost` marks the GPU lost (from then on every call naming it returns
//! GPU_IS_LOST) and, if the waiting set registered that GPU, makes the wait return GPU_IS_LOST;
//! `error` makes the wait return `code`. Once the script's events are used up, every wait times
//! out. A missing or malformed script makes init return UNKNOWN, with the reason on stderr.
//!
//! `hang CALL MS [skip=N] [times=M]` makes the exported function `CALL` (its exact symbol name,
//! e.g. `nvmlDeviceGetCount_v2`; a name the fake does not export is refused) sleep `MS`
//! milliseconds before it answers, as a call into a wedged driver does. The first `skip` calls
//! (default 0) answer at once; after that, `times` calls (default: every one) are delayed. The
//! sleep holds no lock, so calls from other threads go on meanwhile. A hang on `nvmlInit_v2` or
//! `nvmlInitWithFlags` delays the init that read the script.
//!
//! Nothing here panics on purpose, and every export that does more than a lookup runs under
//! `catch_unwind`, so a bug in the fake shows up as NVML_ERROR_UNKNOWN rather than as undefined
//! behaviour in the test process.

#![allow(non_snake_case)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

type NvmlReturn = c_uint;

const SUCCESS: NvmlReturn = 0;
const ERROR_UNINITIALIZED: NvmlReturn = 1;
const ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const ERROR_TIMEOUT: NvmlReturn = 10;
const ERROR_GPU_IS_LOST: NvmlReturn = 15;
const ERROR_UNKNOWN: NvmlReturn = 999;

const EVENT_SBE: u64 = 1;
const EVENT_DBE: u64 = 2;
const EVENT_XID: u64 = 8;

/// Handles are opaque tagged integers, never dereferenced, so a handle the fake did not hand out
/// is recognised and refused instead of being followed.
const DEVICE_TAG: usize = 0x6e76_0000;
const SET_TAG: usize = 0x5e70_0000;
const MAX_HANDLES: usize = 0x1_0000;

/// `nvmlPciInfo_t` as NVML 12.x lays it out.
#[repr(C)]
pub struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlEventData_t`.
#[repr(C)]
pub struct EventData {
    device: *mut c_void,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

struct Device {
    domain: u32,
    bus: u32,
    device: u32,
    function: u32,
    uuid: Option<String>,
    serial: Option<String>,
    name: Option<String>,
    supported: u64,
    register_error: Option<NvmlReturn>,
    lost: bool,
    /// Health readings by key (see [`VALUE_KEYS`]); a key not set makes its getter return
    /// NOT_SUPPORTED, as NVML does on boards without the sensor or feature.
    values: HashMap<&'static str, u64>,
    vbios: Option<String>,
    /// Compute and graphics processes (`compute=`, `graphics=`); `None`: the list call answers
    /// NOT_SUPPORTED.
    compute: Option<Vec<(u32, Option<u64>)>>,
    graphics: Option<Vec<(u32, Option<u64>)>>,
}

/// The readings a `device` line or a `set` directive can give, and the NVML call that answers
/// each.
const VALUE_KEYS: [&str; 30] = [
    "temp",          // nvmlDeviceGetTemperature (GPU sensor), degrees C
    "slowdown",      // nvmlDeviceGetTemperatureThreshold (SLOWDOWN)
    "shutdown",      // nvmlDeviceGetTemperatureThreshold (SHUTDOWN)
    "throttle",      // nvmlDeviceGetCurrentClocksThrottleReasons, the bit mask
    "gen",           // nvmlDeviceGetCurrPcieLinkGeneration
    "gen_max",       // nvmlDeviceGetMaxPcieLinkGeneration
    "width",         // nvmlDeviceGetCurrPcieLinkWidth
    "width_max",     // nvmlDeviceGetMaxPcieLinkWidth
    "util",          // nvmlDeviceGetUtilizationRates, GPU percent
    "remap_corr",    // nvmlDeviceGetRemappedRows
    "remap_unc",     // nvmlDeviceGetRemappedRows
    "remap_pending", // nvmlDeviceGetRemappedRows (0 or 1)
    "remap_failed",  // nvmlDeviceGetRemappedRows (0 or 1)
    "pages_pending", // nvmlDeviceGetRetiredPagesPendingStatus (0 or 1)
    "retired_sbe",   // nvmlDeviceGetRetiredPages(_v2), multiple single-bit cause: count
    "retired_dbe",   // nvmlDeviceGetRetiredPages(_v2), double-bit cause: count
    "sbe_volatile",  // nvmlDeviceGetTotalEccErrors
    "dbe_volatile",  // nvmlDeviceGetTotalEccErrors
    "sbe_aggregate", // nvmlDeviceGetTotalEccErrors
    "dbe_aggregate", // nvmlDeviceGetTotalEccErrors
    "recovery",      // nvmlDeviceGetFieldValues, field 230 (GPU recovery action)
    "power_mw",      // nvmlDeviceGetPowerUsage
    "limit_mw",      // nvmlDeviceGetEnforcedPowerLimit
    "persistence",   // nvmlDeviceGetPersistenceMode (0 or 1)
    "ecc",           // nvmlDeviceGetEccMode, current and pending (0 or 1)
    "mem_used_mib",  // nvmlDeviceGetMemoryInfo_v2, used (MiB)
    "mem_total_mib", // nvmlDeviceGetMemoryInfo_v2, total (MiB; default 81920)
    "fabric_state", // nvmlDeviceGetGpuFabricInfo: 0 not supported, 1 not started, 2 in progress, 3 completed
    "fabric_status", // nvmlDeviceGetGpuFabricInfo: the NVML return code of the registration (default 0)
    "fabric_clique", // nvmlDeviceGetGpuFabricInfo: the clique id (default 0)
];

/// A process list key (`compute=`, `graphics=`): `none` for an empty list, else
/// `PID:MIB,PID:MIB` (the process's used GPU memory in MiB, or `PID:-` for "not available").
fn parse_procs(v: &str) -> Result<Vec<(u32, Option<u64>)>, String> {
    if v == "none" {
        return Ok(Vec::new());
    }
    v.split(',')
        .map(|p| {
            let (pid, mib) = p
                .split_once(':')
                .ok_or_else(|| format!("expected PID:MIB, got {p:?}"))?;
            let pid = pid
                .parse::<u32>()
                .map_err(|_| format!("not a pid: {pid:?}"))?;
            let mib = match mib {
                "-" => None,
                m => Some(
                    m.parse::<u64>()
                        .map_err(|_| format!("not a MiB count: {m:?}"))?,
                ),
            };
            Ok((pid, mib))
        })
        .collect()
}

fn value_key(k: &str) -> Option<&'static str> {
    VALUE_KEYS.iter().copied().find(|v| *v == k)
}

/// A `set` directive: from `at` after init on, GPU `gpu` reads these values.
struct SetValues {
    at: Duration,
    gpu: usize,
    values: Vec<(&'static str, u64)>,
    /// New process lists: (`true` for graphics, the list).
    procs: Vec<(bool, Vec<(u32, Option<u64>)>)>,
    /// `lost=1` / `lost=0`: the GPU is lost from then on / reachable again.
    lost: Option<bool>,
    /// `uuid=TEXT`: the GPU answers with another UUID from then on (another board).
    uuid: Option<String>,
}

enum EventKind {
    Typed { mask: u64, data: u64 },
    GpuLost,
    Error(NvmlReturn),
}

struct Event {
    after: Duration,
    gpu: Option<usize>,
    kind: EventKind,
}

/// A `hang` directive and how many calls it has seen.
struct Hang {
    call: &'static str,
    ms: u64,
    skip: u64,
    times: Option<u64>,
    seen: u64,
}

struct Script {
    init: NvmlReturn,
    hangs: Vec<Hang>,
    driver_version: Option<String>,
    devices: Vec<Device>,
    events: Vec<Event>,
    sets: Vec<SetValues>,
}

struct State {
    refcount: u32,
    driver_version: Option<String>,
    devices: Vec<Device>,
    queue: VecDeque<Event>,
    /// When the next queued event falls due; set by the first wait.
    next_due: Option<Instant>,
    /// Registered (GPU, event mask) per live event set.
    sets: HashMap<usize, HashMap<usize, u64>>,
    next_set: usize,
    hangs: Vec<Hang>,
    /// When init read the script: `set` directives count from here.
    started: Instant,
    /// `set` directives not yet due, in script order.
    pending_sets: VecDeque<SetValues>,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// A poisoned lock only means an earlier call panicked (and returned UNKNOWN); the data is still
/// the best the fake has.
fn state() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn guarded(f: impl FnOnce() -> NvmlReturn) -> NvmlReturn {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(ERROR_UNKNOWN)
}

/// Runs `f` on the initialised state, or answers UNINITIALIZED like NVML does.
fn with_state(f: impl FnOnce(&mut State) -> NvmlReturn) -> NvmlReturn {
    guarded(|| match state().as_mut() {
        Some(s) if s.refcount > 0 => f(s),
        _ => ERROR_UNINITIALIZED,
    })
}

fn parse_code(v: &str) -> Result<NvmlReturn, String> {
    v.parse::<NvmlReturn>()
        .map_err(|_| format!("not an NVML return code: {v:?}"))
}

fn parse_hex(v: &str, max: u32) -> Option<u32> {
    if v.is_empty() || v.len() > 8 {
        return None;
    }
    u32::from_str_radix(v, 16).ok().filter(|n| *n <= max)
}

/// `[domain:]bus:device[.function]`, hex.
fn parse_pci(v: &str) -> Option<(u32, u32, u32, u32)> {
    let (head, function) = match v.rsplit_once('.') {
        Some((h, f)) => (h, parse_hex(f, 7)?),
        None => (v, 0),
    };
    let parts: Vec<&str> = head.split(':').collect();
    match parts.as_slice() {
        [d, b, s] => Some((
            parse_hex(d, u32::MAX)?,
            parse_hex(b, 0xff)?,
            parse_hex(s, 0x1f)?,
            function,
        )),
        [b, s] => Some((0, parse_hex(b, 0xff)?, parse_hex(s, 0x1f)?, function)),
        _ => None,
    }
}

fn parse_events(v: &str) -> Result<u64, String> {
    if v == "none" {
        return Ok(0);
    }
    v.split(',').try_fold(0, |mask, t| match t {
        "xid" => Ok(mask | EVENT_XID),
        "sbe" => Ok(mask | EVENT_SBE),
        "dbe" => Ok(mask | EVENT_DBE),
        other => Err(format!("unknown event type {other:?}")),
    })
}

fn parse_script(text: &str) -> Result<Script, String> {
    let mut script = Script {
        init: SUCCESS,
        hangs: Vec::new(),
        driver_version: None,
        devices: Vec::new(),
        events: Vec::new(),
        sets: Vec::new(),
    };
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        let mut words = line.split_whitespace();
        let Some(directive) = words.next() else {
            continue;
        };
        let rest: Vec<&str> = words.collect();
        let at = |e: String| format!("line {}: {e}", n + 1);
        match directive {
            "init" => {
                script.init = match rest.as_slice() {
                    ["ok"] => SUCCESS,
                    ["error", code] => parse_code(code).map_err(at)?,
                    _ => return Err(at("expected `init ok` or `init error N`".into())),
                }
            }
            "driver_version" => match rest.as_slice() {
                [v] => script.driver_version = Some((*v).to_string()),
                _ => return Err(at("expected `driver_version TEXT`".into())),
            },
            "device" => script.devices.push(parse_device(&rest).map_err(at)?),
            "event" => script.events.push(parse_event(&rest).map_err(at)?),
            "hang" => script.hangs.push(parse_hang(&rest).map_err(at)?),
            "set" => script.sets.push(parse_set(&rest).map_err(at)?),
            other => return Err(at(format!("unknown directive {other:?}"))),
        }
    }
    for set in &script.sets {
        if set.gpu >= script.devices.len() {
            return Err(format!(
                "set names gpu={}, but only {} devices",
                set.gpu,
                script.devices.len()
            ));
        }
    }
    for e in &script.events {
        if let Some(g) = e.gpu {
            if g >= script.devices.len() {
                return Err(format!(
                    "event names gpu={g}, but only {} devices",
                    script.devices.len()
                ));
            }
        }
    }
    Ok(script)
}

fn key_values<'a>(words: &[&'a str]) -> Result<Vec<(&'a str, &'a str)>, String> {
    words
        .iter()
        .map(|w| {
            w.split_once('=')
                .ok_or_else(|| format!("expected key=value, got {w:?}"))
        })
        .collect()
}

fn parse_device(words: &[&str]) -> Result<Device, String> {
    let mut pci = None;
    let mut dev = Device {
        domain: 0,
        bus: 0,
        device: 0,
        function: 0,
        uuid: None,
        serial: None,
        name: None,
        supported: EVENT_XID | EVENT_SBE | EVENT_DBE,
        register_error: None,
        lost: false,
        values: HashMap::new(),
        vbios: None,
        compute: None,
        graphics: None,
    };
    for (k, v) in key_values(words)? {
        if let Some(key) = value_key(k) {
            dev.values.insert(key, parse_value(k, v)?);
            continue;
        }
        match k {
            "vbios" => dev.vbios = Some(v.to_string()),
            "compute" => dev.compute = Some(parse_procs(v)?),
            "graphics" => dev.graphics = Some(parse_procs(v)?),
            "pci" => pci = Some(parse_pci(v).ok_or_else(|| format!("bad pci {v:?}"))?),
            "uuid" => dev.uuid = Some(v.to_string()),
            "serial" => dev.serial = Some(v.to_string()),
            "name" => dev.name = Some(v.replace('_', " ")),
            "events" => dev.supported = parse_events(v)?,
            "register_error" => dev.register_error = Some(parse_code(v)?),
            other => return Err(format!("unknown device key {other:?}")),
        }
    }
    let (domain, bus, device, function) = pci.ok_or("device needs pci=")?;
    dev.domain = domain;
    dev.bus = bus;
    dev.device = device;
    dev.function = function;
    Ok(dev)
}

fn parse_value(k: &str, v: &str) -> Result<u64, String> {
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => v.parse::<u64>().ok(),
    };
    parsed.ok_or_else(|| format!("{k} needs a number, got {v:?}"))
}

/// `set at_ms=T gpu=N KEY=VALUE...`
fn parse_set(words: &[&str]) -> Result<SetValues, String> {
    let mut at = None;
    let mut gpu = None;
    let mut values = Vec::new();
    let mut procs = Vec::new();
    let (mut lost, mut uuid) = (None, None);
    for (k, v) in key_values(words)? {
        match k {
            "lost" => lost = Some(parse_value(k, v)? != 0),
            "uuid" => uuid = Some(v.to_string()),
            "compute" => procs.push((false, parse_procs(v)?)),
            "graphics" => procs.push((true, parse_procs(v)?)),
            "at_ms" => at = Some(parse_value(k, v)?),
            "gpu" => gpu = Some(usize::try_from(parse_value(k, v)?).map_err(|e| e.to_string())?),
            other => match value_key(other) {
                Some(key) => values.push((key, parse_value(k, v)?)),
                None => return Err(format!("unknown set key {other:?}")),
            },
        }
    }
    if values.is_empty() && procs.is_empty() && lost.is_none() && uuid.is_none() {
        return Err("set needs at least one KEY=VALUE".into());
    }
    Ok(SetValues {
        at: Duration::from_millis(at.ok_or("set needs at_ms=")?),
        gpu: gpu.ok_or("set needs gpu=")?,
        values,
        procs,
        lost,
        uuid,
    })
}

fn parse_event(words: &[&str]) -> Result<Event, String> {
    let mut after = 0u64;
    let mut gpu = None;
    let mut kind = None;
    let mut data = None;
    let mut code = None;
    for (k, v) in key_values(words)? {
        let num = || {
            v.parse::<u64>()
                .map_err(|_| format!("{k} needs a number, got {v:?}"))
        };
        match k {
            "after_ms" => after = num()?,
            "gpu" => gpu = Some(usize::try_from(num()?).map_err(|e| e.to_string())?),
            "type" => kind = Some(v),
            "data" => data = Some(num()?),
            "code" => code = Some(parse_code(v)?),
            other => return Err(format!("unknown event key {other:?}")),
        }
    }
    let kind = match kind {
        Some("xid") => EventKind::Typed {
            mask: EVENT_XID,
            data: data.ok_or("type=xid needs data=N")?,
        },
        Some("sbe") => EventKind::Typed {
            mask: EVENT_SBE,
            data: 0,
        },
        Some("dbe") => EventKind::Typed {
            mask: EVENT_DBE,
            data: 0,
        },
        Some("gpu_lost") => EventKind::GpuLost,
        Some("error") => EventKind::Error(code.ok_or("type=error needs code=N")?),
        Some(other) => return Err(format!("unknown event type {other:?}")),
        None => return Err("event needs type=".into()),
    };
    if gpu.is_none() && !matches!(kind, EventKind::Error(_)) {
        return Err("event needs gpu=N".into());
    }
    Ok(Event {
        after: Duration::from_millis(after),
        gpu,
        kind,
    })
}

/// Every function this library exports, for `hang` directives.
const EXPORTS: [&str; 40] = [
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetSerial",
    "nvmlDeviceGetName",
    "nvmlDeviceGetIndex",
    "nvmlDeviceGetSupportedEventTypes",
    "nvmlDeviceRegisterEvents",
    "nvmlEventSetCreate",
    "nvmlEventSetWait_v2",
    "nvmlEventSetFree",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetTemperatureThreshold",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetRemappedRows",
    "nvmlDeviceGetRetiredPagesPendingStatus",
    "nvmlDeviceGetRetiredPages",
    "nvmlDeviceGetRetiredPages_v2",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetVbiosVersion",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetGpuFabricInfo",
];

fn parse_hang(words: &[&str]) -> Result<Hang, String> {
    let [call, ms, opts @ ..] = words else {
        return Err("expected `hang CALL MS [skip=N] [times=M]`".into());
    };
    let call = EXPORTS
        .iter()
        .find(|e| *e == call)
        .ok_or_else(|| format!("hang: {call:?} is not a function this library exports"))?;
    let ms = ms
        .parse::<u64>()
        .map_err(|_| format!("hang: MS needs a number, got {ms:?}"))?;
    let mut hang = Hang {
        call,
        ms,
        skip: 0,
        times: None,
        seen: 0,
    };
    for (k, v) in key_values(opts)? {
        let n = v
            .parse::<u64>()
            .map_err(|_| format!("{k} needs a number, got {v:?}"))?;
        match k {
            "skip" => hang.skip = n,
            "times" => hang.times = Some(n),
            other => return Err(format!("unknown hang key {other:?}")),
        }
    }
    Ok(hang)
}

/// Appends `call` to the file named by `XIDWATCH_FAKE_NVML_CALLS`, one call a line: the
/// progress a test waits on ("two more polls have read the temperature") instead of sleeping.
fn record_call(call: &str) {
    use std::io::Write;
    static CALLS: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let Some(path) =
        CALLS.get_or_init(|| std::env::var_os("XIDWATCH_FAKE_NVML_CALLS").map(Into::into))
    else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = f.write_all(format!("{call}\n").as_bytes());
    }
}

/// Counts a call to `call` and, if a `hang` directive says so, sleeps before it is answered.
/// The state lock is released before sleeping.
fn hang_point(call: &str) {
    record_call(call);
    let delay = catch_unwind(AssertUnwindSafe(|| {
        let mut guard = state();
        let Some(s) = guard.as_mut() else { return 0 };
        let mut delay = 0;
        for h in s.hangs.iter_mut().filter(|h| h.call == call) {
            h.seen += 1;
            let delayed = h.seen.saturating_sub(h.skip);
            if delayed > 0 && h.times.is_none_or(|t| delayed <= t) {
                delay = delay.max(h.ms);
            }
        }
        delay
    }))
    .unwrap_or(0);
    if delay > 0 {
        std::thread::sleep(Duration::from_millis(delay));
    }
}

fn load_script() -> Result<Script, String> {
    let path = std::env::var_os("XIDWATCH_FAKE_NVML_SCRIPT")
        .ok_or("XIDWATCH_FAKE_NVML_SCRIPT is not set")?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.to_string_lossy()))?;
    parse_script(&text)
}

fn init() -> NvmlReturn {
    guarded(|| {
        let mut guard = state();
        if let Some(s) = guard.as_mut().filter(|s| s.refcount > 0) {
            s.refcount += 1;
            return SUCCESS;
        }
        *guard = None;
        let script = match load_script() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("fake-nvml: {e}");
                return ERROR_UNKNOWN;
            }
        };
        if script.init != SUCCESS {
            return script.init;
        }
        *guard = Some(State {
            refcount: 1,
            driver_version: script.driver_version,
            devices: script.devices,
            queue: script.events.into(),
            next_due: None,
            sets: HashMap::new(),
            next_set: 0,
            hangs: script.hangs,
            started: Instant::now(),
            pending_sets: {
                let mut sets = script.sets;
                // Stable: two directives for the same moment apply in script order.
                sets.sort_by_key(|s| s.at);
                sets.into()
            },
        });
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    let code = init();
    guarded(|| {
        hang_point("nvmlInit_v2");
        code
    })
}

#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    let code = init();
    guarded(|| {
        hang_point("nvmlInitWithFlags");
        code
    })
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    hang_point("nvmlShutdown");
    with_state(|s| {
        s.refcount -= 1;
        if s.refcount == 0 {
            s.sets.clear();
        }
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: NvmlReturn) -> *const c_char {
    hang_point("nvmlErrorString");
    let text: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        12 => c"NVML Shared Library Not Found",
        15 => c"GPU is lost",
        18 => c"Driver/library version mismatch",
        _ => c"Unknown Error",
    };
    text.as_ptr()
}

/// Copies `text` and its NUL into the caller's buffer, as NVML's string getters do.
///
/// # Safety
/// `buf` must be null or point to `len` writable bytes.
unsafe fn write_str(text: Option<&str>, buf: *mut c_char, len: c_uint) -> NvmlReturn {
    let Some(text) = text else {
        return ERROR_NOT_SUPPORTED;
    };
    if buf.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    let bytes = text.as_bytes();
    if bytes.len() >= len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller promises `len` bytes at `buf`; we write `bytes.len() + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

fn fill(dst: &mut [c_char], text: &str) {
    for (d, b) in dst.iter_mut().zip(text.bytes().chain(std::iter::repeat(0))) {
        *d = b as c_char;
    }
    if let Some(last) = dst.last_mut() {
        *last = 0;
    }
}

fn decode_handle(handle: *mut c_void, tag: usize) -> Option<usize> {
    (handle as usize)
        .checked_sub(tag)
        .filter(|i| *i < MAX_HANDLES)
}

/// The GPU behind `handle`, refusing unknown handles and lost GPUs.
fn device_of(s: &State, handle: *mut c_void) -> Result<usize, NvmlReturn> {
    let i = decode_handle(handle, DEVICE_TAG)
        .filter(|i| *i < s.devices.len())
        .ok_or(ERROR_INVALID_ARGUMENT)?;
    if s.devices[i].lost {
        return Err(ERROR_GPU_IS_LOST);
    }
    Ok(i)
}

/// Runs `f` on the GPU behind `handle`.
fn with_device(handle: *mut c_void, f: impl FnOnce(usize, &mut State) -> NvmlReturn) -> NvmlReturn {
    with_state(
        // Due sets first: one may make a lost GPU reachable again.
        |s| match {
            apply_due_sets(s);
            device_of(s, handle)
        } {
            Ok(i) => f(i, s),
            Err(code) => code,
        },
    )
}

/// Applies the `set` directives that have fallen due.
fn apply_due_sets(s: &mut State) {
    let elapsed = s.started.elapsed();
    while s.pending_sets.front().is_some_and(|set| set.at <= elapsed) {
        let Some(set) = s.pending_sets.pop_front() else {
            break;
        };
        if let Some(d) = s.devices.get_mut(set.gpu) {
            if let Some(lost) = set.lost {
                d.lost = lost;
            }
            if let Some(uuid) = set.uuid {
                d.uuid = Some(uuid);
            }
            for (k, v) in set.values {
                d.values.insert(k, v);
            }
            for (graphics, list) in set.procs {
                if graphics {
                    d.graphics = Some(list);
                } else {
                    d.compute = Some(list);
                }
            }
        }
    }
}

/// Answers a getter of one value: NOT_SUPPORTED when the script gave none.
///
/// # Safety
/// `out` must be null or valid for a write.
unsafe fn write_value<T: TryFrom<u64>>(
    handle: *mut c_void,
    call: &str,
    key: &'static str,
    out: *mut T,
) -> NvmlReturn {
    hang_point(call);
    with_device(handle, |i, s| {
        if out.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let Some(v) = s.devices[i].values.get(key).copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        let Ok(v) = T::try_from(v) else {
            return ERROR_INVALID_ARGUMENT;
        };
        // SAFETY: non-null and valid per the caller.
        unsafe { out.write(v) };
        SUCCESS
    })
}

/// # Safety
/// `version` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    hang_point("nvmlSystemGetDriverVersion");
    // SAFETY: forwarded from the caller.
    with_state(|s| unsafe { write_str(s.driver_version.as_deref(), version, length) })
}

/// # Safety
/// `count` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    hang_point("nvmlDeviceGetCount_v2");
    with_state(|s| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null and valid per the caller.
        unsafe { *count = s.devices.len() as c_uint };
        SUCCESS
    })
}

/// # Safety
/// `device` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *mut c_void,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetHandleByIndex_v2");
    with_state(|s| {
        let i = index as usize;
        if device.is_null() || i >= s.devices.len() {
            return ERROR_INVALID_ARGUMENT;
        }
        apply_due_sets(s);
        if s.devices[i].lost {
            return ERROR_GPU_IS_LOST;
        }
        // SAFETY: non-null and valid per the caller.
        unsafe { *device = (DEVICE_TAG + i) as *mut c_void };
        SUCCESS
    })
}

/// # Safety
/// `pci` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: *mut c_void,
    pci: *mut PciInfo,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetPciInfo_v3");
    with_device(device, |i, s| {
        if pci.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let d = &s.devices[i];
        let mut info = PciInfo {
            bus_id_legacy: [0; 16],
            domain: d.domain,
            bus: d.bus,
            device: d.device,
            pci_device_id: 0x2330_10de,
            pci_sub_system_id: 0x16c1_10de,
            bus_id: [0; 32],
        };
        // NVML's own spellings: eight-digit domain, upper-case hex.
        fill(
            &mut info.bus_id,
            &format!(
                "{:08X}:{:02X}:{:02X}.{:X}",
                d.domain, d.bus, d.device, d.function
            ),
        );
        fill(
            &mut info.bus_id_legacy,
            &format!(
                "{:04X}:{:02X}:{:02X}.{:X}",
                d.domain, d.bus, d.device, d.function
            ),
        );
        // SAFETY: non-null and valid per the caller.
        unsafe { pci.write(info) };
        SUCCESS
    })
}

/// # Safety
/// `uuid` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut c_void,
    uuid: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetUUID");
    // SAFETY: forwarded from the caller.
    with_device(device, |i, s| unsafe {
        write_str(s.devices[i].uuid.as_deref(), uuid, length)
    })
}

/// # Safety
/// `serial` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device: *mut c_void,
    serial: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetSerial");
    // SAFETY: forwarded from the caller.
    with_device(device, |i, s| unsafe {
        write_str(s.devices[i].serial.as_deref(), serial, length)
    })
}

/// # Safety
/// `name` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut c_void,
    name: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetName");
    // SAFETY: forwarded from the caller.
    with_device(device, |i, s| unsafe {
        write_str(s.devices[i].name.as_deref(), name, length)
    })
}

/// # Safety
/// `index` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: *mut c_void, index: *mut c_uint) -> NvmlReturn {
    hang_point("nvmlDeviceGetIndex");
    with_device(device, |i, _| {
        if index.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null and valid per the caller.
        unsafe { *index = i as c_uint };
        SUCCESS
    })
}

/// # Safety
/// `event_types` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: *mut c_void,
    event_types: *mut c_ulonglong,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetSupportedEventTypes");
    with_device(device, |i, s| {
        if event_types.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: non-null and valid per the caller.
        unsafe { *event_types = s.devices[i].supported };
        SUCCESS
    })
}

/// # Safety
/// `set` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut c_void) -> NvmlReturn {
    hang_point("nvmlEventSetCreate");
    with_state(|s| {
        if set.is_null() || s.next_set >= MAX_HANDLES {
            return ERROR_INVALID_ARGUMENT;
        }
        let id = s.next_set;
        s.next_set += 1;
        s.sets.insert(id, HashMap::new());
        // SAFETY: non-null and valid per the caller.
        unsafe { *set = (SET_TAG + id) as *mut c_void };
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: *mut c_void,
    event_types: c_ulonglong,
    set: *mut c_void,
) -> NvmlReturn {
    hang_point("nvmlDeviceRegisterEvents");
    with_device(device, |i, s| {
        if let Some(code) = s.devices[i].register_error {
            return code;
        }
        if event_types & !s.devices[i].supported != 0 {
            return ERROR_NOT_SUPPORTED;
        }
        let Some(regs) = decode_handle(set, SET_TAG).and_then(|id| s.sets.get_mut(&id)) else {
            return ERROR_INVALID_ARGUMENT;
        };
        *regs.entry(i).or_insert(0) |= event_types;
        SUCCESS
    })
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: *mut c_void) -> NvmlReturn {
    hang_point("nvmlEventSetFree");
    with_state(
        |s| match decode_handle(set, SET_TAG).and_then(|id| s.sets.remove(&id)) {
            Some(_) => SUCCESS,
            None => ERROR_INVALID_ARGUMENT,
        },
    )
}

/// What one look at the timeline found.
enum Step {
    Deliver(NvmlReturn, Option<EventData>),
    SleepUntil(Instant),
    TimedOut,
}

fn step(s: &mut State, set_id: usize, deadline: Instant) -> Step {
    let now = Instant::now();
    let Some(regs) = s.sets.get(&set_id).cloned() else {
        return Step::Deliver(ERROR_INVALID_ARGUMENT, None);
    };
    loop {
        let Some(event) = s.queue.front() else {
            return if now >= deadline {
                Step::TimedOut
            } else {
                Step::SleepUntil(deadline)
            };
        };
        let due = *s.next_due.get_or_insert(now + event.after);
        if due > now {
            return if due > deadline {
                if now >= deadline {
                    Step::TimedOut
                } else {
                    Step::SleepUntil(deadline)
                }
            } else {
                Step::SleepUntil(due)
            };
        }
        let Some(event) = s.queue.pop_front() else {
            return Step::TimedOut;
        };
        if let Some(next) = s.queue.front() {
            s.next_due = Some(due + next.after);
        }
        let registered = event.gpu.and_then(|g| regs.get(&g).copied());
        match event.kind {
            EventKind::Error(code) => return Step::Deliver(code, None),
            EventKind::GpuLost => {
                let Some(g) = event.gpu else { continue };
                let was_lost = std::mem::replace(&mut s.devices[g].lost, true);
                if registered.is_some() && !was_lost {
                    return Step::Deliver(ERROR_GPU_IS_LOST, None);
                }
            }
            EventKind::Typed { mask, data } => {
                let (Some(g), Some(reg)) = (event.gpu, registered) else {
                    continue;
                };
                if reg & mask != 0 && !s.devices[g].lost {
                    return Step::Deliver(
                        SUCCESS,
                        Some(EventData {
                            device: (DEVICE_TAG + g) as *mut c_void,
                            event_type: mask,
                            event_data: data,
                            gpu_instance_id: 0,
                            compute_instance_id: 0,
                        }),
                    );
                }
            }
        }
    }
}

/// # Safety
/// `data` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut c_void,
    data: *mut EventData,
    timeoutms: c_uint,
) -> NvmlReturn {
    hang_point("nvmlEventSetWait_v2");
    guarded(|| {
        let Some(set_id) = decode_handle(set, SET_TAG) else {
            return ERROR_INVALID_ARGUMENT;
        };
        if data.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeoutms));
        loop {
            // The lock is never held while sleeping, so other threads' calls (the lost-GPU probe,
            // inventory reads) go on while a wait blocks, as they do with NVML.
            let next = {
                let mut guard = state();
                match guard.as_mut() {
                    Some(s) if s.refcount > 0 => step(s, set_id, deadline),
                    _ => return ERROR_UNINITIALIZED,
                }
            };
            match next {
                Step::Deliver(code, event) => {
                    if let Some(event) = event {
                        // SAFETY: non-null and valid per the caller.
                        unsafe { data.write(event) };
                    }
                    return code;
                }
                Step::TimedOut => return ERROR_TIMEOUT,
                Step::SleepUntil(t) => {
                    std::thread::sleep(t.saturating_duration_since(Instant::now()))
                }
            }
        }
    })
}

/// `nvmlUtilization_t`.
#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlFieldValue_t`; the value union is eight bytes, read here as its unsigned-int member.
#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: NvmlReturn,
    value: c_ulonglong,
}

/// NVML's field id for the GPU recovery action (`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`).
const FIELD_RECOVERY_ACTION: c_uint = 230;
const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;

/// # Safety
/// `temp` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: *mut c_void,
    sensor: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    if sensor != 0 {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetTemperature", "temp", temp) }
}

/// # Safety
/// `temp` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device: *mut c_void,
    kind: c_uint,
    temp: *mut c_uint,
) -> NvmlReturn {
    let key = match kind {
        0 => "shutdown",
        1 => "slowdown",
        _ => {
            hang_point("nvmlDeviceGetTemperatureThreshold");
            return ERROR_NOT_SUPPORTED;
        }
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetTemperatureThreshold", key, temp) }
}

/// # Safety
/// `reasons` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: *mut c_void,
    reasons: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        write_value(
            device,
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            "throttle",
            reasons,
        )
    }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetCurrPcieLinkGeneration", "gen", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetMaxPcieLinkGeneration", "gen_max", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetCurrPcieLinkWidth", "width", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetMaxPcieLinkWidth", "width_max", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *mut c_void,
    out: *mut Utilization,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetUtilizationRates");
    with_device(device, |i, s| {
        if out.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let Some(gpu) = s.devices[i].values.get("util").copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        let gpu = gpu.min(100) as c_uint;
        // SAFETY: non-null and valid per the caller.
        unsafe { out.write(Utilization { gpu, memory: gpu }) };
        SUCCESS
    })
}

/// Rows are supported when the script gave `remap_corr`; the other three default to 0.
///
/// # Safety
/// Each pointer must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRemappedRows(
    device: *mut c_void,
    corr: *mut c_uint,
    unc: *mut c_uint,
    pending: *mut c_uint,
    failed: *mut c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetRemappedRows");
    with_device(device, |i, s| {
        if corr.is_null() || unc.is_null() || pending.is_null() || failed.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let v = &s.devices[i].values;
        if !v.contains_key("remap_corr") {
            return ERROR_NOT_SUPPORTED;
        }
        let get = |k| v.get(k).copied().unwrap_or(0) as c_uint;
        // SAFETY: non-null and valid per the caller.
        unsafe {
            corr.write(get("remap_corr"));
            unc.write(get("remap_unc"));
            pending.write(get("remap_pending"));
            failed.write(get("remap_failed"));
        }
        SUCCESS
    })
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPagesPendingStatus(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        write_value(
            device,
            "nvmlDeviceGetRetiredPagesPendingStatus",
            "pages_pending",
            out,
        )
    }
}

/// The retired-page list of one cause (0: multiple single-bit, 1: double-bit): `count` pages at
/// made-up addresses.
///
/// # Safety
/// `count` must be null or valid for reads and writes; `addresses` and `timestamps` null or
/// valid for `*count` writes.
unsafe fn retired_pages(
    call: &str,
    device: *mut c_void,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> NvmlReturn {
    hang_point(call);
    with_device(device, |i, s| {
        let key = match cause {
            0 => "retired_sbe",
            1 => "retired_dbe",
            _ => return ERROR_INVALID_ARGUMENT,
        };
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let Some(n) = s.devices[i].values.get(key).copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        let n = n.min(4096) as c_uint;
        // SAFETY: valid per the caller.
        let room = unsafe { *count };
        // SAFETY: valid per the caller.
        unsafe { *count = n };
        if room < n || addresses.is_null() {
            return if n == 0 {
                SUCCESS
            } else {
                ERROR_INSUFFICIENT_SIZE
            };
        }
        for k in 0..n as usize {
            // SAFETY: the caller gave room for `room >= n` entries.
            unsafe {
                *addresses.add(k) = 0x1000 * (k as u64 + 1);
                if !timestamps.is_null() {
                    *timestamps.add(k) = 1_700_000_000 + k as u64;
                }
            }
        }
        SUCCESS
    })
}

/// # Safety
/// See [`retired_pages`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages(
    device: *mut c_void,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        retired_pages(
            "nvmlDeviceGetRetiredPages",
            device,
            cause,
            count,
            addresses,
            std::ptr::null_mut(),
        )
    }
}

/// # Safety
/// See [`retired_pages`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetRetiredPages_v2(
    device: *mut c_void,
    cause: c_uint,
    count: *mut c_uint,
    addresses: *mut c_ulonglong,
    timestamps: *mut c_ulonglong,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        retired_pages(
            "nvmlDeviceGetRetiredPages_v2",
            device,
            cause,
            count,
            addresses,
            timestamps,
        )
    }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: *mut c_void,
    error_type: c_uint,
    counter_type: c_uint,
    out: *mut c_ulonglong,
) -> NvmlReturn {
    let key = match (error_type, counter_type) {
        (0, 0) => "sbe_volatile",
        (1, 0) => "dbe_volatile",
        (0, 1) => "sbe_aggregate",
        (1, 1) => "dbe_aggregate",
        _ => return ERROR_INVALID_ARGUMENT,
    };
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetTotalEccErrors", key, out) }
}

/// Answers the GPU recovery action field (from `recovery`); every other field is NOT_SUPPORTED
/// in its own slot, as NVML answers fields one by one.
///
/// # Safety
/// `values` must be null or point to `count` valid entries.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: *mut c_void,
    count: i32,
    values: *mut FieldValue,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetFieldValues");
    with_device(device, |i, s| {
        let Ok(n) = usize::try_from(count) else {
            return ERROR_INVALID_ARGUMENT;
        };
        if values.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let recovery = s.devices[i].values.get("recovery").copied();
        for k in 0..n {
            // SAFETY: the caller gave `count` entries.
            let v = unsafe { &mut *values.add(k) };
            v.timestamp = 1_700_000_000_000_000;
            match (v.field_id, recovery) {
                (FIELD_RECOVERY_ACTION, Some(r)) => {
                    v.value_type = VALUE_TYPE_UNSIGNED_INT;
                    v.nvml_return = SUCCESS;
                    v.value = r & 0xffff_ffff;
                }
                _ => v.nvml_return = ERROR_NOT_SUPPORTED,
            }
        }
        SUCCESS
    })
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetPowerUsage", "power_mw", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetEnforcedPowerLimit", "limit_mw", out) }
}

/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPersistenceMode(
    device: *mut c_void,
    out: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe { write_value(device, "nvmlDeviceGetPersistenceMode", "persistence", out) }
}

/// # Safety
/// `current` and `pending` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device: *mut c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetEccMode");
    with_device(device, |i, s| {
        if current.is_null() || pending.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let Some(v) = s.devices[i].values.get("ecc").copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        // SAFETY: non-null and valid per the caller.
        unsafe {
            current.write(u32::from(v != 0));
            pending.write(u32::from(v != 0));
        }
        SUCCESS
    })
}

/// # Safety
/// `version` must be null or point to `length` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetVbiosVersion(
    device: *mut c_void,
    version: *mut c_char,
    length: c_uint,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetVbiosVersion");
    // SAFETY: forwarded from the caller.
    with_device(device, |i, s| unsafe {
        write_str(s.devices[i].vbios.as_deref(), version, length)
    })
}

/// `nvmlProcessInfo_t` (v2 layout, which the `_v3` calls fill).
#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// NVML's "not available" for a process's used memory and for the instance ids.
const NOT_AVAILABLE: c_ulonglong = u64::MAX;

/// Answers a process list call: the count alone (`infos` null or too short: INSUFFICIENT_SIZE,
/// as NVML does), or the list.
///
/// # Safety
/// `count` must be null or valid for reads and writes; `infos` null or valid for `*count` writes.
unsafe fn running_processes(
    device: *mut c_void,
    call: &str,
    graphics: bool,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    hang_point(call);
    with_device(device, |i, s| {
        if count.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let d = &s.devices[i];
        let Some(list) = (if graphics { &d.graphics } else { &d.compute }) else {
            return ERROR_NOT_SUPPORTED;
        };
        let n = list.len() as c_uint;
        // SAFETY: non-null and valid per the caller.
        let room = unsafe { count.read() };
        // SAFETY: as above.
        unsafe { count.write(n) };
        if n == 0 {
            return SUCCESS;
        }
        if infos.is_null() || room < n {
            return ERROR_INSUFFICIENT_SIZE;
        }
        for (k, (pid, mib)) in list.iter().enumerate() {
            let info = ProcessInfo {
                pid: *pid,
                used_gpu_memory: mib.map_or(NOT_AVAILABLE, |m| m << 20),
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            };
            // SAFETY: k < n <= room, which the caller made valid.
            unsafe { infos.add(k).write(info) };
        }
        SUCCESS
    })
}

/// # Safety
/// See [`running_processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        running_processes(
            device,
            "nvmlDeviceGetComputeRunningProcesses_v3",
            false,
            count,
            infos,
        )
    }
}

/// # Safety
/// See [`running_processes`].
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> NvmlReturn {
    // SAFETY: forwarded from the caller.
    unsafe {
        running_processes(
            device,
            "nvmlDeviceGetGraphicsRunningProcesses_v3",
            true,
            count,
            infos,
        )
    }
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// Supported when the script gave `mem_used_mib`.
///
/// # Safety
/// `out` must be null or valid for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut c_void,
    out: *mut MemoryV2,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetMemoryInfo_v2");
    with_device(device, |i, s| {
        if out.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let v = &s.devices[i].values;
        let Some(used) = v.get("mem_used_mib").copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        let total = v.get("mem_total_mib").copied().unwrap_or(81_920).max(used);
        // SAFETY: non-null and valid per the caller.
        let version = unsafe { (*out).version };
        // SAFETY: as above.
        unsafe {
            out.write(MemoryV2 {
                version,
                total: total << 20,
                reserved: 0,
                free: (total - used) << 20,
                used: used << 20,
            })
        };
        SUCCESS
    })
}

/// `nvmlGpuFabricInfo_t`.
#[repr(C)]
pub struct FabricInfo {
    cluster_uuid: [u8; 16],
    status: NvmlReturn,
    clique_id: c_uint,
    state: u8,
}

/// Supported when the script gave `fabric_state`.
///
/// # Safety
/// `out` must be null or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuFabricInfo(
    device: *mut c_void,
    out: *mut FabricInfo,
) -> NvmlReturn {
    hang_point("nvmlDeviceGetGpuFabricInfo");
    with_device(device, |i, s| {
        if out.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        let v = &s.devices[i].values;
        let Some(state) = v.get("fabric_state").copied() else {
            return ERROR_NOT_SUPPORTED;
        };
        let mut cluster_uuid = [0u8; 16];
        cluster_uuid[0] = 0xc1;
        cluster_uuid[15] = 0x01;
        let info = FabricInfo {
            cluster_uuid,
            status: v.get("fabric_status").copied().unwrap_or(0) as NvmlReturn,
            clique_id: v.get("fabric_clique").copied().unwrap_or(0) as c_uint,
            state: state.min(255) as u8,
        };
        // SAFETY: non-null and valid per the caller.
        unsafe { out.write(info) };
        SUCCESS
    })
}
