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
//! `nvmlEventSetCreate`, `nvmlEventSetWait_v2`, `nvmlEventSetFree`.
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
//! ```
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
            other => return Err(at(format!("unknown directive {other:?}"))),
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
    };
    for (k, v) in key_values(words)? {
        match k {
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
const EXPORTS: [&str; 17] = [
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

/// Counts a call to `call` and, if a `hang` directive says so, sleeps before it is answered.
/// The state lock is released before sleeping.
fn hang_point(call: &str) {
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
    with_state(|s| match device_of(s, handle) {
        Ok(i) => f(i, s),
        Err(code) => code,
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
