//! The NVML source against a scripted fake `libnvidia-ml.so` (tests/fake-nvml), loaded through the
//! real nvml-wrapper code, so symbol loading, struct layouts and error mapping are all exercised
//! without a GPU.
//!
//! The fake reads its script from an environment variable, which is process-wide: every test holds
//! `LOCK` for its whole run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use xidwatch::model::{Category, FindingKind, PciAddress, Severity};
use xidwatch::source::nvml::{GpuInfo, NvmlEvent, NvmlFailure, NvmlSource};

static LOCK: Mutex<()> = Mutex::new(());

const UUID0: &str = "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f";
const UUID1: &str = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";

fn fake_library() -> PathBuf {
    super::support::fake_nvml_library()
}

/// Holds the lock and the script for one scenario. The lock is the last field so it is released
/// last.
struct Scenario {
    dir: TempDir,
    lib: PathBuf,
    _lock: MutexGuard<'static, ()>,
}

fn scenario(script: &str) -> Scenario {
    let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_library();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("script.txt");
    std::fs::write(&path, script).expect("write script");
    std::env::set_var("XIDWATCH_FAKE_NVML_SCRIPT", &path);
    Scenario {
        dir,
        lib,
        _lock: lock,
    }
}

impl Scenario {
    fn open(&self) -> Result<NvmlSource, NvmlFailure> {
        NvmlSource::open(Some(&self.lib))
    }
}

fn pci(s: &str) -> PciAddress {
    PciAddress::parse(s).expect("valid test address")
}

fn next(rx: &Receiver<NvmlEvent>) -> NvmlEvent {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("an NVML event within 5 s")
}

fn join_within(handle: JoinHandle<()>, limit: Duration) {
    let start = Instant::now();
    while !handle.is_finished() {
        assert!(
            start.elapsed() < limit,
            "event thread still running after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    handle.join().expect("event thread did not panic");
}

const TWO_GPUS: &str = "
# two H100s, the second without a serial number
init ok
driver_version 550.54.14
device pci=0000:17:00.0 uuid=GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f serial=1650923011234 name=NVIDIA_H100_80GB_HBM3
device pci=0000:2a:00.0 uuid=GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0 name=NVIDIA_H100_80GB_HBM3   # no serial
";

#[test]
fn inventory_is_read_through_nvml_wrapper() {
    let s = scenario(&format!(
        "{TWO_GPUS}device pci=4a7f1:00:00.0 uuid=GPU-aaaa serial=42 name=NVIDIA_A100\n"
    ));
    let src = s.open().expect("open fake NVML");
    assert_eq!(src.driver_version(), Some("550.54.14"));
    assert!(src.notes().is_empty(), "{:?}", src.notes());
    let name = Some("NVIDIA H100 80GB HBM3".to_string());
    assert_eq!(
        src.inventory(),
        &[
            GpuInfo {
                index: 0,
                pci: pci("0000:17:00.0"),
                uuid: Some(UUID0.into()),
                serial: Some("1650923011234".into()),
                name: name.clone(),
            },
            GpuInfo {
                index: 1,
                pci: pci("0000:2a:00.0"),
                uuid: Some(UUID1.into()),
                serial: None,
                name,
            },
            GpuInfo {
                index: 2,
                pci: pci("4a7f1:00:00.0"),
                uuid: Some("GPU-aaaa".into()),
                serial: Some("42".into()),
                name: Some("NVIDIA A100".into()),
            },
        ]
    );
    // NVML spells the bus id `00000000:17:00.0`; the inventory holds the normalised value.
    assert_eq!(src.inventory()[0].pci.to_string(), "0000:17:00.0");
    assert_eq!(src.inventory()[2].pci.to_string(), "4a7f1:00:00.0");
    assert_eq!(
        src.reachable_gpus().expect("reachable"),
        vec![
            pci("0000:17:00.0"),
            pci("0000:2a:00.0"),
            pci("4a7f1:00:00.0")
        ]
    );
}

#[test]
fn runbook_nvml_steps_are_answered_through_the_same_handle() {
    use xidwatch::runbook::{NvmlError as E, NvmlProbe, NvmlQuery as Q};
    let s = scenario(TWO_GPUS);
    let src = s.open().expect("open fake NVML");
    let id = src
        .query(Q::Identity, pci("0000:17:00.0"))
        .expect("identity");
    assert!(
        id.contains(UUID0) && id.contains("serial: 1650923011234"),
        "{id}"
    );
    assert_eq!(
        src.query(Q::Identity, pci("0000:99:00.0")),
        Err(E::GpuNotFound)
    );
    assert_eq!(
        src.query(Q::RemappedRows, pci("0000:17:00.0")),
        Err(E::NotSupported)
    );
    // The fake exports no ECC call: the answer says why instead of inventing numbers.
    assert!(matches!(
        src.query(Q::EccErrors, pci("0000:17:00.0")),
        Err(E::Failed(_) | E::NotSupported)
    ));
}

#[test]
fn events_arrive_in_order_with_the_right_gpu() {
    let s = scenario(&format!(
        "{TWO_GPUS}
event after_ms=50 gpu=0 type=xid data=79
event after_ms=10 gpu=1 type=sbe
event after_ms=10 gpu=1 type=dbe
event after_ms=10 gpu=1 type=xid data=999   # NVML's 'unknown Xid'
event after_ms=10 gpu=0 type=gpu_lost
event after_ms=10 gpu=0 type=xid data=13    # a lost GPU reports nothing more
event after_ms=10 gpu=1 type=xid data=31
"
    ));
    let src = s.open().expect("open fake NVML");
    let inventory = src.inventory().to_vec();
    let prober = src.clone();
    let (tx, rx) = sync_channel(16);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = src.spawn_events(tx, stop.clone()).expect("spawn");
    assert!(thread.notes.is_empty(), "{:?}", thread.notes);

    let (gpu0, gpu1) = (pci("0000:17:00.0"), pci("0000:2a:00.0"));
    let got: Vec<NvmlEvent> = (0..6).map(|_| next(&rx)).collect();
    assert_eq!(
        got,
        vec![
            NvmlEvent::Xid {
                pci: gpu0,
                xid: Some(79)
            },
            NvmlEvent::EccSingleBit { pci: gpu1 },
            NvmlEvent::EccDoubleBit { pci: gpu1 },
            NvmlEvent::Xid {
                pci: gpu1,
                xid: None
            },
            NvmlEvent::GpuLost { pci: Some(gpu0) },
            NvmlEvent::Xid {
                pci: gpu1,
                xid: Some(31)
            },
        ]
    );
    assert_eq!(prober.reachable_gpus().expect("reachable"), vec![gpu1]);

    let xid = got[0].to_finding(&inventory);
    assert_eq!(xid.kind, FindingKind::Xid);
    assert_eq!(xid.xid, Some(79));
    assert_eq!(xid.pci, Some(gpu0));
    assert_eq!(
        (xid.category, xid.severity),
        (Category::Driver, Severity::Warning)
    );
    assert_eq!(xid.gpu.index, Some(0));
    assert_eq!(xid.gpu.uuid.as_deref(), Some(UUID0));
    assert_eq!(xid.gpu.serial.as_deref(), Some("1650923011234"));
    assert_eq!(xid.gpu.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));

    let sbe = got[1].to_finding(&inventory);
    assert_eq!(
        (sbe.kind, sbe.category, sbe.severity),
        (FindingKind::EccError, Category::Memory, Severity::Warning)
    );
    assert_eq!(sbe.gpu.index, Some(1));
    assert_eq!(sbe.gpu.serial, None);
    let dbe = got[2].to_finding(&inventory);
    assert_eq!(
        (dbe.kind, dbe.category, dbe.severity),
        (FindingKind::EccError, Category::Memory, Severity::Critical)
    );
    assert_eq!(got[3].to_finding(&inventory).xid, None);
    let lost = got[4].to_finding(&inventory);
    assert_eq!(
        (lost.kind, lost.category, lost.severity),
        (FindingKind::GpuLost, Category::Pcie, Severity::Critical)
    );
    assert_eq!(lost.pci, Some(gpu0));
    assert_eq!(lost.gpu.uuid.as_deref(), Some(UUID0));

    stop.store(true, Ordering::Relaxed);
    join_within(thread.handle, Duration::from_secs(1));
}

#[test]
fn init_failures_are_classified() {
    for (code, want) in [
        (9, NvmlFailure::DriverNotLoaded),
        (18, NvmlFailure::VersionMismatch),
        (4, NvmlFailure::NoPermission),
        (15, NvmlFailure::GpuLost),
        (
            999,
            NvmlFailure::Other("an internal driver error occurred".into()),
        ),
    ] {
        let s = scenario(&format!("init error {code}\n{TWO_GPUS}").replace("init ok\n", ""));
        let got = s.open().expect_err("init must fail");
        assert_eq!(got, want, "init error {code}");
        assert_eq!(got.severity(), Severity::Critical);
        let f = got.to_finding().expect("a finding");
        assert_eq!(f.kind, FindingKind::NvmlUnavailable);
        assert_eq!(f.category, Category::Driver);
        assert_eq!(f.severity, Severity::Critical);
        assert!(
            f.title.starts_with("NVML cannot reach the driver: "),
            "{}",
            f.title
        );
    }
    let mismatch = NvmlFailure::VersionMismatch
        .to_finding()
        .expect("a finding");
    assert_eq!(
        mismatch.title,
        "NVML cannot reach the driver: driver/library version mismatch"
    );
}

#[test]
fn missing_library_is_info_and_a_broken_one_is_not() {
    let s = scenario(TWO_GPUS);
    let missing = NvmlSource::open(Some(Path::new("/nonexistent/libnvidia-ml.so.1")))
        .expect_err("no such library");
    assert_eq!(missing, NvmlFailure::LibraryNotFound);
    assert_eq!(missing.severity(), Severity::Info);
    assert_eq!(missing.to_finding(), None);

    // A file that is there but is no library: a broken install, which must not be silenced.
    let not_a_library = s.dir.path().join("script.txt");
    let broken = NvmlSource::open(Some(&not_a_library)).expect_err("not a library");
    assert!(matches!(broken, NvmlFailure::Other(_)), "{broken:?}");
    assert_eq!(broken.severity(), Severity::Critical);
}

#[test]
fn a_refusing_gpu_is_skipped_and_the_others_still_report() {
    let s = scenario(
        "
driver_version 550.54.14
device pci=0000:17:00.0 uuid=GPU-a
device pci=0000:2a:00.0 uuid=GPU-b register_error=999
device pci=0000:3b:00.0 uuid=GPU-c events=xid
device pci=0000:4c:00.0 uuid=GPU-d events=none
event after_ms=20 gpu=1 type=xid data=79
event after_ms=10 gpu=2 type=sbe
event after_ms=10 gpu=2 type=xid data=48
event after_ms=10 gpu=0 type=dbe
",
    );
    let src = s.open().expect("open fake NVML");
    let (tx, rx) = sync_channel(4);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = src.spawn_events(tx, stop.clone()).expect("spawn");
    let notes = thread.notes.join("\n");
    assert_eq!(thread.notes.len(), 3, "{notes}");
    assert!(
        notes.contains("GPU 1 (0000:2a:00.0): not watched for NVML events: registration refused"),
        "{notes}"
    );
    assert!(
        notes.contains("GPU 2 (0000:3b:00.0): NVML reports only Xid events"),
        "{notes}"
    );
    assert!(
        notes.contains("GPU 3 (0000:4c:00.0): not watched for NVML events"),
        "{notes}"
    );
    // GPU 1's Xid and GPU 2's SBE were never registered, so NVML drops them.
    assert_eq!(
        next(&rx),
        NvmlEvent::Xid {
            pci: pci("0000:3b:00.0"),
            xid: Some(48)
        }
    );
    assert_eq!(
        next(&rx),
        NvmlEvent::EccDoubleBit {
            pci: pci("0000:17:00.0")
        }
    );
    stop.store(true, Ordering::Relaxed);
    join_within(thread.handle, Duration::from_secs(1));
}

#[test]
fn a_failed_wait_is_reported_and_ends_the_thread() {
    let s = scenario(&format!("{TWO_GPUS}event after_ms=10 type=error code=9\n"));
    let src = s.open().expect("open fake NVML");
    let (tx, rx) = sync_channel(4);
    let thread = src
        .spawn_events(tx, Arc::new(AtomicBool::new(false)))
        .expect("spawn");
    let event = next(&rx);
    assert_eq!(event, NvmlEvent::Failed(NvmlFailure::DriverNotLoaded));
    let f = event.to_finding(&[]);
    assert_eq!(
        (f.kind, f.severity),
        (FindingKind::NvmlUnavailable, Severity::Critical)
    );
    join_within(thread.handle, Duration::from_secs(1));
}

#[test]
fn stop_ends_an_idle_thread_within_a_second() {
    let s = scenario(TWO_GPUS);
    let src = s.open().expect("open fake NVML");
    let (tx, rx) = sync_channel(1);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = src.spawn_events(tx, stop.clone()).expect("spawn");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!thread.handle.is_finished());
    stop.store(true, Ordering::Relaxed);
    join_within(thread.handle, Duration::from_secs(1));
    assert!(rx.try_recv().is_err(), "an idle GPU reports nothing");
}

#[test]
fn a_stalled_reader_does_not_pin_the_thread_past_stop() {
    let s = scenario(&format!(
        "{TWO_GPUS}
event after_ms=1 gpu=0 type=sbe
event after_ms=1 gpu=0 type=sbe
event after_ms=1 gpu=0 type=sbe
"
    ));
    let src = s.open().expect("open fake NVML");
    let (tx, rx) = sync_channel(1);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = src.spawn_events(tx, stop.clone()).expect("spawn");
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    join_within(thread.handle, Duration::from_secs(1));
    assert_eq!(
        rx.try_recv(),
        Ok(NvmlEvent::EccSingleBit {
            pci: pci("0000:17:00.0")
        })
    );
}
