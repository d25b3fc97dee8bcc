//! The NVML source against a scripted fake `libnvidia-ml.so` (tests/fake-nvml), loaded through the
//! real nvml-wrapper code, so symbol loading, struct layouts and error mapping are all exercised
//! without a GPU.
//!
//! The fake reads its script from an environment variable, which is process-wide: every test holds
//! `LOCK` for its whole run.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use xidwatch::model::{Category, Detail, FindingKind, PciAddress, Severity};
use xidwatch::source::nvml::{
    CallError, GpuInfo, NvmlEvent, NvmlFailure, NvmlWorker, Opened, WorkerOptions,
};

static LOCK: Mutex<()> = Mutex::new(());

const UUID0: &str = "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f";
const UUID1: &str = "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";

fn fake_library() -> PathBuf {
    super::support::fake_nvml_library()
}

/// Holds the lock and the script for one scenario, and stops the workers it started (so the fake
/// is shut down and the next scenario's init reads its own script). The lock is the last field
/// so it is released last.
struct Scenario {
    dir: TempDir,
    lib: PathBuf,
    workers: Mutex<Vec<NvmlWorker>>,
    _lock: MutexGuard<'static, ()>,
}

fn scenario(script: &str) -> Scenario {
    let lock = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let lib = fake_library();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("script.txt");
    std::fs::write(&path, script).expect("write script");
    std::env::set_var("XIDWATCH_FAKE_NVML_SCRIPT", &path);
    std::fs::create_dir_all(dir.path().join("proc")).expect("procfs tree");
    Scenario {
        dir,
        lib,
        workers: Mutex::new(Vec::new()),
        _lock: lock,
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        let workers: Vec<NvmlWorker> = match self.workers.lock() {
            Ok(mut w) => w.drain(..).collect(),
            Err(p) => p.into_inner().drain(..).collect(),
        };
        for w in workers {
            let stopped = w.stop(Duration::from_secs(10));
            // A second panic while a failed test unwinds would abort every test.
            if !std::thread::panicking() {
                assert!(stopped, "the worker did not stop");
            }
        }
    }
}

impl Scenario {
    /// A worker on the fake library with `call_timeout`, and its event channel.
    fn worker_with(
        &self,
        lib: &Path,
        call_timeout: Duration,
        events: usize,
    ) -> (NvmlWorker, Receiver<NvmlEvent>) {
        let (tx, rx) = sync_channel(events);
        let w = NvmlWorker::spawn(
            WorkerOptions {
                library: Some(lib.to_path_buf()),
                call_timeout,
                open_timeout: Duration::from_secs(5),
                procfs_root: self.dir.path().join("proc"),
            },
            tx,
        )
        .expect("spawn the NVML worker");
        self.workers.lock().unwrap().push(w.clone());
        (w, rx)
    }

    fn worker(&self) -> (NvmlWorker, Receiver<NvmlEvent>) {
        self.worker_with(&self.lib, Duration::from_secs(5), 16)
    }

    fn open(&self) -> (NvmlWorker, Receiver<NvmlEvent>, Opened) {
        let (w, rx) = self.worker();
        let opened = w.wait_open().expect("open fake NVML");
        (w, rx, opened)
    }
}

fn pci(s: &str) -> PciAddress {
    PciAddress::parse(s).expect("valid test address")
}

fn next(rx: &Receiver<NvmlEvent>) -> NvmlEvent {
    rx.recv_timeout(Duration::from_secs(5))
        .expect("an NVML event within 5 s")
}

/// The registration report, which comes first.
fn watching(rx: &Receiver<NvmlEvent>) -> Vec<String> {
    match next(rx) {
        NvmlEvent::Watching { notes } => notes,
        other => panic!("expected the registration report first, got {other:?}"),
    }
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
    let (w, _rx, src) = s.open();
    assert_eq!(src.driver_version.as_deref(), Some("550.54.14"));
    assert!(src.notes.is_empty(), "{:?}", src.notes);
    let name = Some("NVIDIA H100 80GB HBM3".to_string());
    assert_eq!(
        src.inventory,
        vec![
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
    assert_eq!(src.inventory[0].pci.to_string(), "0000:17:00.0");
    assert_eq!(src.inventory[2].pci.to_string(), "4a7f1:00:00.0");
    assert_eq!(
        w.reachable_gpus().expect("reachable"),
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
    let (src, _rx, _) = s.open();
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
    // This script gives no ECC counts: the answer says why instead of inventing numbers.
    assert!(matches!(
        src.query(Q::EccErrors, pci("0000:17:00.0")),
        Err(E::Failed(_) | E::NotSupported)
    ));
}

#[test]
fn health_readings_come_through_the_wrapper_and_change_on_the_scripts_time() {
    use xidwatch::runbook::{NvmlProbe, NvmlQuery as Q};
    use xidwatch::source::nvml::health::RemapCounts;
    let s = scenario(&format!(
        "{TWO_GPUS}\
         device pci=0000:3b:00.0 temp=51 slowdown=92 shutdown=97 throttle=0x80 gen=5 gen_max=5 width=16 width_max=16 util=77 \
         remap_corr=2 remap_unc=1 remap_pending=1 pages_pending=0 retired_sbe=3 retired_dbe=1 dbe_volatile=4 dbe_aggregate=9 \
         recovery=1 power_mw=650000 limit_mw=700000 persistence=0 ecc=1 vbios=96.00.74.00.01\n\
         set at_ms=400 gpu=2 temp=88 width=8 dbe_volatile=5 recovery=0\n"
    ));
    let (w, _rx, opened) = s.open();
    assert_eq!(opened.inventory.len(), 3);
    let r = w.health_readings().expect("readings");
    // GPUs without readings answer NOT_SUPPORTED for each: every reading is absent.
    assert_eq!(r[0].temp_c, None);
    assert_eq!(r[0].remap, None);
    let g = &r[2];
    assert_eq!(g.pci, Some(pci("0000:3b:00.0")));
    assert_eq!(
        (g.temp_c, g.slowdown_c, g.shutdown_c),
        (Some(51), Some(92), Some(97))
    );
    assert_eq!(g.throttle, Some(0x80));
    assert_eq!(
        (g.link_gen, g.link_gen_max, g.link_width, g.link_width_max),
        (Some(5), Some(5), Some(16), Some(16))
    );
    assert_eq!(g.util_pct, Some(77));
    assert_eq!(
        g.remap,
        Some(RemapCounts {
            correctable: 2,
            uncorrectable: 1,
            pending: true,
            failed: false
        })
    );
    assert_eq!(g.pages_pending, Some(false));
    assert_eq!((g.retired_sbe, g.retired_dbe), (Some(3), Some(1)));
    assert_eq!((g.dbe_volatile, g.dbe_aggregate), (Some(4), Some(9)));
    assert_eq!(
        g.recovery,
        Some(1),
        "the field value, decoded by the wrapper"
    );
    assert_eq!((g.power_mw, g.limit_mw), (Some(650_000), Some(700_000)));
    assert_eq!((g.persistence, g.ecc_enabled), (Some(false), Some(true)));
    let rows = w
        .query(Q::RemappedRows, pci("0000:3b:00.0"))
        .expect("remapped rows for a runbook step");
    assert!(
        rows.contains("pending: true") && rows.contains("correctable: 2"),
        "{rows}"
    );
    let (_, vbios) = w.inventory().expect("inventory");
    assert_eq!(vbios[2].as_deref(), Some("96.00.74.00.01"));

    // The script's `set` takes effect at its time.
    let g = super::support::wait_for(super::support::LIMIT, "the script's `set`", || {
        let g = w.health_readings().expect("readings").remove(2);
        (g.temp_c == Some(88)).then_some(g)
    });
    assert_eq!((g.temp_c, g.link_width), (Some(88), Some(8)));
    assert_eq!((g.dbe_volatile, g.recovery), (Some(5), Some(0)));
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
    let (w, rx, opened) = s.open();
    let inventory = opened.inventory;
    assert!(watching(&rx).is_empty());

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
    // Requests are served between the waits, on the same handle.
    assert_eq!(w.reachable_gpus().expect("reachable"), vec![gpu1]);

    let finding = |e: &NvmlEvent| e.to_finding(&inventory).expect("a finding");
    // The catalog rates an NVML Xid as it rates the same Xid in the kernel log.
    let xid = finding(&got[0]);
    assert_eq!(xid.kind, FindingKind::Xid);
    assert_eq!(xid.xid, Some(79));
    assert_eq!(xid.pci, Some(gpu0));
    assert_eq!(xid.severity, Severity::Critical);
    assert_eq!(xid.gpu.index, Some(0));
    assert_eq!(xid.gpu.uuid.as_deref(), Some(UUID0));
    assert_eq!(xid.gpu.serial.as_deref(), Some("1650923011234"));
    assert_eq!(xid.gpu.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));

    let sbe = finding(&got[1]);
    assert_eq!(
        (sbe.kind, sbe.category, sbe.severity),
        (FindingKind::EccError, Category::Memory, Severity::Warning)
    );
    assert_eq!(sbe.detail, Some(Detail::Ecc { double_bit: false }));
    assert_eq!(sbe.gpu.index, Some(1));
    assert_eq!(sbe.gpu.serial, None);
    let dbe = finding(&got[2]);
    assert_eq!(
        (dbe.kind, dbe.category, dbe.severity),
        (FindingKind::EccError, Category::Memory, Severity::Critical)
    );
    assert_eq!(finding(&got[3]).xid, None);
    let lost = finding(&got[4]);
    assert_eq!(
        (lost.kind, lost.category, lost.severity),
        (FindingKind::GpuLost, Category::Pcie, Severity::Critical)
    );
    assert_eq!(lost.pci, Some(gpu0));
    assert_eq!(lost.gpu.uuid.as_deref(), Some(UUID0));
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
        let (w, _rx) = s.worker();
        let got = match w.wait_open() {
            Err(CallError::Failed(f)) => f,
            other => panic!("init error {code}: {other:?}"),
        };
        assert_eq!(got, want, "init error {code}");
        let f = got.to_finding().expect("a finding");
        assert_eq!(f.kind, FindingKind::NvmlUnavailable);
        assert_eq!(f.category, Category::Driver);
        assert_eq!(f.severity, Severity::Critical);
        assert!(
            f.title.starts_with("NVML cannot reach the driver: "),
            "{}",
            f.title
        );
        // Nothing is served by a worker without NVML.
        assert_eq!(w.reachable_gpus(), Err(CallError::Closed));
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
fn missing_library_is_not_a_finding_and_a_broken_one_is() {
    let s = scenario(TWO_GPUS);
    let (w, _rx) = s.worker_with(
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        Duration::from_secs(5),
        4,
    );
    let missing = w.wait_open().expect_err("no such library");
    assert_eq!(missing, CallError::Failed(NvmlFailure::LibraryNotFound));
    assert_eq!(NvmlFailure::LibraryNotFound.to_finding(), None);

    // A file that is there but is no library: a broken install, which must not be silenced.
    let not_a_library = s.dir.path().join("script.txt");
    let (w, _rx) = s.worker_with(&not_a_library, Duration::from_secs(5), 4);
    let broken = match w.wait_open() {
        Err(CallError::Failed(f)) => f,
        other => panic!("{other:?}"),
    };
    assert!(matches!(broken, NvmlFailure::Other(_)), "{broken:?}");
    assert_eq!(
        broken.to_finding().expect("a finding").severity,
        Severity::Critical
    );
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
    let (_w, rx, _) = s.open();
    let notes = watching(&rx);
    let text = notes.join("\n");
    assert_eq!(notes.len(), 3, "{text}");
    assert!(
        text.contains("GPU 1 (0000:2a:00.0): not watched for NVML events: registration refused"),
        "{text}"
    );
    assert!(
        text.contains("GPU 2 (0000:3b:00.0): NVML reports only Xid events"),
        "{text}"
    );
    assert!(
        text.contains("GPU 3 (0000:4c:00.0): not watched for NVML events"),
        "{text}"
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
}

#[test]
fn a_failed_wait_is_reported_and_requests_are_still_served() {
    let s = scenario(&format!("{TWO_GPUS}event after_ms=10 type=error code=9\n"));
    let (w, rx, _) = s.open();
    assert!(watching(&rx).is_empty());
    let event = next(&rx);
    assert_eq!(event, NvmlEvent::Failed(NvmlFailure::DriverNotLoaded));
    let f = event.to_finding(&[]).expect("a finding");
    assert_eq!(
        (f.kind, f.severity),
        (FindingKind::NvmlUnavailable, Severity::Critical)
    );
    assert_eq!(w.reachable_gpus().map(|r| r.len()), Ok(2));
}

#[test]
fn stop_ends_an_idle_worker_within_a_second() {
    let s = scenario(TWO_GPUS);
    let (w, rx, _) = s.open();
    assert!(watching(&rx).is_empty());
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "an idle GPU reports nothing"
    );
    let start = Instant::now();
    assert!(w.stop(Duration::from_secs(1)));
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_eq!(w.reachable_gpus(), Err(CallError::Closed));
}

#[test]
fn a_stalled_reader_does_not_pin_the_worker_past_stop() {
    let s = scenario(&format!(
        "{TWO_GPUS}
event after_ms=1 gpu=0 type=sbe
event after_ms=1 gpu=0 type=sbe
event after_ms=1 gpu=0 type=sbe
"
    ));
    let (w, rx) = s.worker_with(&s.lib, Duration::from_secs(5), 1);
    w.wait_open().expect("open");
    let next = || rx.recv_timeout(Duration::from_secs(10));
    assert!(matches!(next(), Ok(NvmlEvent::Watching { .. })));
    assert!(matches!(next(), Ok(NvmlEvent::EccSingleBit { .. })));
    // The worker now puts the second event in the one free place and waits to hand the third:
    // it has nothing else to do, so a moment is enough to be sure it is waiting.
    std::thread::sleep(Duration::from_millis(50));
    assert!(w.stop(Duration::from_secs(1)));
    // It was: the second event is there, and the third never got in.
    assert!(matches!(rx.try_recv(), Ok(NvmlEvent::EccSingleBit { .. })));
    assert!(rx.try_recv().is_err());
}

/// A fake procfs with one task stuck in the driver, one thread of a job stuck in it too, and a
/// sleeping one.
fn stuck_tasks(proc: &Path) {
    let task = |pid: u32, tid: u32, stat: &str, wchan: &str, stack: &str| {
        let d = proc
            .join(pid.to_string())
            .join("task")
            .join(tid.to_string());
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("stat"), stat).unwrap();
        std::fs::write(d.join("wchan"), wchan).unwrap();
        if !stack.is_empty() {
            std::fs::write(d.join("stack"), stack).unwrap();
        }
    };
    task(1, 1, "1 (systemd) S 0", "ep_poll", "");
    task(
        3150,
        3150,
        "3150 (nvidia-smi) D 1",
        "os_acquire_mutex",
        "[<0>] os_acquire_mutex+0x2b/0x40 [nvidia]\n[<0>] rm_ioctl+0x5e/0xa0 [nvidia]\n",
    );
    task(4242, 4242, "4242 (python3) S 1", "futex_wait_queue", "");
    task(4242, 4250, "4250 (pt_autograd_0) D 1", "uvm_spin_loop", "");
}

#[test]
fn a_hung_call_is_reported_once_with_the_stuck_tasks_and_later_calls_fail_fast() {
    // The probe's device count (the second call; init makes the first) hangs 1.5 s.
    let s = scenario(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 1500 skip=1 times=1\n"
    ));
    stuck_tasks(&s.dir.path().join("proc"));
    let (w, rx) = s.worker_with(&s.lib, Duration::from_millis(200), 16);
    w.wait_open().expect("open");
    assert!(watching(&rx).is_empty());

    let start = Instant::now();
    match w.reachable_gpus() {
        Err(CallError::Timeout { call, .. }) => assert_eq!(call, "nvmlDeviceGetCount"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_millis(700),
        "{waited:?}"
    );
    let stall = match next(&rx) {
        NvmlEvent::Unresponsive(s) => s,
        other => panic!("expected the stuck episode, got {other:?}"),
    };
    assert_eq!(stall.call, "nvmlDeviceGetCount");
    let stuck: Vec<(u32, u32, &str)> = stall
        .blocked
        .iter()
        .map(|t| (t.pid, t.tid, t.comm.as_str()))
        .collect();
    assert_eq!(
        stuck,
        vec![(3150, 3150, "nvidia-smi"), (4242, 4250, "pt_autograd_0")]
    );
    assert_eq!(stall.blocked[0].wchan.as_deref(), Some("os_acquire_mutex"));
    assert_eq!(
        stall.blocked[0].stack,
        vec![
            "os_acquire_mutex+0x2b/0x40 [nvidia]",
            "rm_ioctl+0x5e/0xa0 [nvidia]"
        ]
    );

    // While the worker is stuck, requests fail at once and say with what; no second report.
    use xidwatch::runbook::{NvmlProbe, NvmlQuery};
    for _ in 0..3 {
        let t = Instant::now();
        match w.reachable_gpus() {
            Err(CallError::Busy { call, .. }) => assert_eq!(call, "nvmlDeviceGetCount"),
            other => panic!("expected busy, got {other:?}"),
        }
        let q = w.query(NvmlQuery::Identity, pci("0000:17:00.0"));
        assert!(
            matches!(&q, Err(xidwatch::runbook::NvmlError::Failed(e)) if e.contains("NVML worker busy since")),
            "{q:?}"
        );
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "{:?}",
            t.elapsed()
        );
    }

    // The call returns: the episode ends, said once, and requests are answered again.
    match next(&rx) {
        NvmlEvent::Answering { call, stuck_for } => {
            assert_eq!(call, "nvmlDeviceGetCount");
            assert!(stuck_for >= Duration::from_millis(1200), "{stuck_for:?}");
        }
        other => panic!("expected the worker to answer again, got {other:?}"),
    }
    assert_eq!(w.reachable_gpus().map(|r| r.len()), Ok(2));
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "one report per episode"
    );

    let f = NvmlEvent::Unresponsive(stall)
        .to_finding(&[])
        .expect("a finding");
    assert_eq!(
        (f.kind, f.severity, f.category, f.pci),
        (
            FindingKind::DriverUnresponsive,
            Severity::Critical,
            Category::Driver,
            None
        )
    );
    assert!(
        f.origin
            .raw
            .iter()
            .any(|l| l.contains("pid 3150 (nvidia-smi) in os_acquire_mutex")),
        "{:?}",
        f.origin.raw
    );
    assert!(matches!(
        f.detail,
        Some(Detail::DriverUnresponsive { ref blocked, .. }) if blocked.len() == 2
    ));
}

#[test]
fn an_init_that_hangs_past_its_limit_is_reported_and_learnt_when_it_answers() {
    // Init's device count hangs 1.2 s; the open limit is 500 ms.
    let s = scenario(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 1200 times=1\n"
    ));
    let spawn = |open_timeout| {
        let (tx, rx) = sync_channel(16);
        let w = NvmlWorker::spawn(
            WorkerOptions {
                library: Some(s.lib.clone()),
                call_timeout: Duration::from_millis(200),
                open_timeout,
                procfs_root: s.dir.path().join("proc"),
            },
            tx,
        )
        .expect("spawn");
        s.workers.lock().unwrap().push(w.clone());
        (w, rx)
    };
    let (w, rx) = spawn(Duration::from_millis(500));
    // The daemon's way: hold the kernel log briefly, then go on while init goes on.
    let start = Instant::now();
    assert!(matches!(
        w.wait_open_for(Duration::from_millis(100)),
        Err(CallError::Opening { .. })
    ));
    assert!(start.elapsed() < Duration::from_millis(400));
    // A request meanwhile waits behind init and gives up without calling it stuck...
    assert!(matches!(w.reachable_gpus(), Err(CallError::Timeout { .. })));
    assert!(rx.try_recv().is_err(), "init is slow, not stuck, yet");
    // ...until init overruns its own limit, which the periodic check notices.
    while !w.check() {
        assert!(start.elapsed() < Duration::from_secs(1), "never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(start.elapsed() >= Duration::from_millis(500));
    assert!(matches!(next(&rx), NvmlEvent::Unresponsive(s) if s.call.starts_with("nvmlInit")));
    // The inventory comes late, then the episode ends, then events are watched.
    match next(&rx) {
        NvmlEvent::Opened(o) => assert_eq!(o.inventory.len(), 2),
        other => panic!("expected the late inventory, got {other:?}"),
    }
    assert!(matches!(next(&rx), NvmlEvent::Answering { .. }));
    assert!(watching(&rx).is_empty());
    assert_eq!(w.reachable_gpus().map(|r| r.len()), Ok(2));
    assert!(w.stop(Duration::from_secs(2)));

    // Waiting the whole open limit: the caller is told it timed out.
    std::fs::write(
        s.dir.path().join("script.txt"),
        format!("{TWO_GPUS}hang nvmlDeviceGetCount_v2 800 times=1\n"),
    )
    .unwrap();
    let (w, rx) = spawn(Duration::from_millis(300));
    assert!(matches!(w.wait_open(), Err(CallError::Timeout { .. })));
    assert!(matches!(next(&rx), NvmlEvent::Unresponsive(_)));
    assert!(matches!(next(&rx), NvmlEvent::Opened(_)));
}

#[test]
fn a_stuck_event_wait_is_noticed_though_no_request_waits() {
    // The fourth event wait hangs 1.5 s; its limit is the wait (100 ms) plus the call timeout.
    let s = scenario(&format!(
        "{TWO_GPUS}hang nvmlEventSetWait_v2 1500 skip=3 times=1\n"
    ));
    let (w, rx) = s.worker_with(&s.lib, Duration::from_millis(200), 16);
    w.wait_open().expect("open");
    assert!(watching(&rx).is_empty());
    let start = Instant::now();
    while !w.check() {
        assert!(start.elapsed() < Duration::from_secs(2), "never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    match next(&rx) {
        NvmlEvent::Unresponsive(s) => assert_eq!(s.call, "nvmlEventSetWait"),
        other => panic!("expected the stuck episode, got {other:?}"),
    }
    assert!(matches!(w.reachable_gpus(), Err(CallError::Busy { .. })));
    assert!(matches!(next(&rx), NvmlEvent::Answering { call, .. } if call == "nvmlEventSetWait"));
    assert!(!w.check());
    assert_eq!(w.reachable_gpus().map(|r| r.len()), Ok(2));
}

#[test]
fn requests_queued_behind_slow_calls_time_out_without_crying_wolf() {
    // Every device count after init takes 100 ms: slow, within the 400 ms limit, so at least two
    // queued calls fit in it even on a loaded machine (with 150 ms, one busy moment was enough
    // for the second to miss it).
    let s = scenario(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 100 skip=1\n"
    ));
    let (w, rx) = s.worker_with(&s.lib, Duration::from_millis(400), 16);
    w.wait_open().expect("open");
    assert!(watching(&rx).is_empty());
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let w = w.clone();
            std::thread::spawn(move || w.reachable_gpus())
        })
        .collect();
    let results: Vec<_> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let answered = results.iter().filter(|r| r.is_ok()).count();
    let timed_out = results
        .iter()
        .filter(|r| matches!(r, Err(CallError::Timeout { .. })))
        .count();
    assert!(answered >= 2, "{results:?}");
    assert_eq!(answered + timed_out, 8, "{results:?}");
    // Nobody was stuck: no episode is reported.
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "a slow queue is not a wedged driver"
    );
}

// ---- The daemon as a process, with a wedged driver ----

/// `xidwatch run --json` with the fake library, a regular-file kmsg and a notify socket; its
/// incidents (JSON lines) and log are collected as they come, with the time each incident came.
struct Wedged {
    d: super::support::Daemon,
    /// sd_notify messages, with the time each came.
    notes: std::sync::Arc<Mutex<Vec<(Instant, String)>>>,
    started: Instant,
}

impl Wedged {
    fn start(config: &Path, env: &[(&str, &Path)]) -> Wedged {
        let run = env.iter().fold(
            super::support::Run::new(config)
                .json()
                .env("WATCHDOG_USEC", "200000"),
            |r, (k, v)| r.env(k, v),
        );
        Wedged {
            d: run.spawn(),
            notes: std::sync::Arc::default(),
            started: Instant::now(),
        }
    }

    /// The incidents so far, with the time each came.
    fn incidents(&self) -> Vec<(Instant, serde_json::Value)> {
        self.d.json_timed()
    }

    /// The log so far.
    fn log(&self) -> String {
        self.d.stderr()
    }

    /// The first incident matching `pred`, and when it came; panics after `limit`.
    fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> (Instant, serde_json::Value) {
        let start = Instant::now();
        loop {
            if let Some(hit) = self.incidents().into_iter().find(|(_, v)| pred(v)) {
                return hit;
            }
            assert!(
                start.elapsed() < limit,
                "no {what} within {limit:?}; incidents: {:#?}\nlog:\n{}",
                self.incidents(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Wedged {
    /// Writes a config (probe every second, NVML calls limited to 1 s, a fake procfs with stuck
    /// tasks), the fake NVML `script` and an empty kmsg file into a fresh directory, and starts
    /// the daemon there with a notify socket.
    fn launch(script: &str) -> (TempDir, Wedged) {
        use std::os::unix::net::UnixDatagram;
        let dir = tempfile::tempdir().unwrap();
        let p = |name: &str| dir.path().join(name);
        std::fs::write(p("nvml.script"), script).unwrap();
        std::fs::write(p("kmsg"), "").unwrap();
        std::fs::write(p("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        std::fs::create_dir_all(p("sys/bus/pci/devices")).unwrap();
        stuck_tasks(&p("proc"));
        std::fs::write(
            p("xidwatch.toml"),
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = true\nlibrary = {:?}\nprobe_interval_secs = 1\ncall_timeout_secs = 1\nsysfs_root = {:?}\nprocfs_root = {:?}\n[state]\ndir = {:?}\n\
                 # Latency here is the pipeline's own: no settle delay before the first alert.\n\
                 [incidents]\nsettle_ms = 0\n",
                p("kmsg"),
                fake_library(),
                p("sys"),
                p("proc"),
                p("state")
            ),
        )
        .unwrap();
        let sock = UnixDatagram::bind(p("notify.sock")).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut d = Wedged::start(
            &p("xidwatch.toml"),
            &[
                ("XIDWATCH_BOOT_ID_PATH", &p("boot_id")),
                (
                    "XIDWATCH_BOOT_TIME_PATH",
                    super::support::recent_boot_stat(),
                ),
                ("XIDWATCH_FAKE_NVML_SCRIPT", &p("nvml.script")),
                ("NOTIFY_SOCKET", &p("notify.sock")),
            ],
        );
        // Every notification from here on, with the time it came.
        let n2 = d.notes.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n) = sock.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                n2.lock().unwrap().push((Instant::now(), text));
            }
        });
        d.started = Instant::now();
        (dir, d)
    }

    fn append_kmsg(dir: &Path, record: &str) -> Instant {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("kmsg"))
            .unwrap();
        std::io::Write::write_all(&mut f, record.as_bytes()).unwrap();
        Instant::now()
    }

    fn noted(&self, what: &str) -> Option<Instant> {
        self.notes
            .lock()
            .unwrap()
            .iter()
            .find(|(_, m)| m == what)
            .map(|(t, _)| *t)
    }
}

#[test]
fn a_wedged_driver_delays_no_kernel_log_finding_and_starves_no_watchdog() {
    // The probe's device count (the call after init's) hangs 30 s, as on a wedged driver.
    let (dir, d) = Wedged::launch(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 30000 skip=1 times=1\n"
    ));
    let notes = d.notes.clone();

    // The stuck call becomes one critical, host-wide incident naming the stuck tasks.
    let (stuck_at, stuck) = d.wait_for("driver_unresponsive", Duration::from_secs(15), |v| {
        v["kind"] == "driver_unresponsive"
    });
    assert_eq!(stuck["severity"], "critical", "{stuck}");
    assert!(stuck.get("pci").is_none_or(|p| p.is_null()), "{stuck}");
    let finding = &stuck["findings"][0];
    assert_eq!(
        finding["detail"]["type"], "driver_unresponsive",
        "{finding}"
    );
    assert_eq!(finding["detail"]["call"], "nvmlDeviceGetCount", "{finding}");
    assert_eq!(finding["detail"]["blocked"][0]["comm"], "nvidia-smi");
    assert_eq!(finding["detail"]["blocked"][0]["wchan"], "os_acquire_mutex");
    let raw = finding["origin"]["raw"].to_string();
    assert!(
        raw.contains("pid 4242 tid 4250 (pt_autograd_0) in uvm_spin_loop"),
        "{raw}"
    );

    // While the call is still stuck (it returns 30 s after it began; the incident above says it
    // is), an Xid in the kernel log is reported at its usual latency.
    let written = Wedged::append_kmsg(
        dir.path(),
        "3,1,1000001,-;NVRM: Xid (PCI:0000:17:00): 79, pid=42, name=python3, GPU has fallen off the bus.\n",
    );
    let (xid_at, xid) = d.wait_for("the Xid 79", Duration::from_secs(15), |v| v["xid"] == 79);
    let latency = xid_at - written;
    eprintln!("Xid 79 reported {latency:?} after it was written, with NVML stuck");
    assert!(latency < Duration::from_secs(1), "{latency:?}");
    // With what NVML told at start: the inventory was read before the driver wedged.
    assert_eq!(xid["gpu"]["uuid"], UUID0);

    // The watchdog was fed all along (every 100 ms asked; no gap near the call timeout), up to
    // after the Xid.
    let fed_after = |t: Instant| {
        notes
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, m)| m == "WATCHDOG=1" && *at > t)
            .count()
    };
    super::support::wait_until(
        super::support::LIMIT,
        "the watchdog fed after the Xid",
        || fed_after(xid_at) >= 2,
    );
    let pings: Vec<Instant> = notes
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, m)| m == "WATCHDOG=1")
        .map(|(t, _)| *t)
        .filter(|t| *t >= stuck_at - Duration::from_millis(1500))
        .collect();
    assert!(
        notes.lock().unwrap().iter().any(|(_, m)| m == "READY=1"),
        "READY=1"
    );
    assert!(pings.len() >= 10, "{} pings", pings.len());
    let gap = pings
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    eprintln!("longest watchdog gap while NVML was stuck: {gap:?}");
    assert!(gap < Duration::from_millis(500), "{gap:?}");

    // Said once, not once per probe round (three more rounds, counted by the daemon itself);
    // and the log says what happened.
    let state = dir.path().join("state");
    let rounds = || {
        super::support::status_of(&state)
            .map_or(0, |st| st["nvml"]["probe_rounds"].as_u64().unwrap_or(0))
    };
    let seen = rounds();
    super::support::wait_until(super::support::LIMIT, "three more probe rounds", || {
        rounds() >= seen + 3
    });
    let all = d.incidents();
    assert_eq!(
        all.iter()
            .filter(|(_, v)| v["kind"] == "driver_unresponsive")
            .count(),
        1,
        "{all:#?}"
    );
    assert!(d.log().contains("NVML is unresponsive"), "{}", d.log());

    // SIGTERM is honoured promptly with the worker still stuck in the driver.
    let stopping = Instant::now();
    let s = d.d.stop();
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    assert!(stopping.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_call_timeout_is_checked_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("xidwatch.toml");
    for bad in ["0", "601"] {
        std::fs::write(&path, format!("[nvml]\ncall_timeout_secs = {bad}\n")).unwrap();
        let err = xidwatch::config::Config::load(Some(&path))
            .expect_err("refused")
            .to_string();
        assert!(err.contains("nvml.call_timeout_secs"), "{err}");
    }
    std::fs::write(
        &path,
        "[nvml]\ncall_timeout_secs = 3\nprocfs_root = \"/srv/proc\"\n",
    )
    .unwrap();
    let c = xidwatch::config::Config::load(Some(&path)).expect("valid");
    assert_eq!(c.nvml.call_timeout_secs, 3);
    assert_eq!(c.nvml.procfs_root, Path::new("/srv/proc"));
    assert_eq!(
        xidwatch::config::NvmlConfig::default().call_timeout_secs,
        10
    );
}

#[test]
fn an_init_that_hangs_holds_neither_ready_nor_the_kernel_log_longer_than_a_call() {
    // Init's device count takes 3 s; one NVML call may take 1 s.
    let (dir, d) = Wedged::launch(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 3000 times=1\n"
    ));
    let start = d.started;
    let wait_ready = Instant::now();
    while d.noted("READY=1").is_none() {
        assert!(wait_ready.elapsed() < Duration::from_secs(10), "no READY=1");
        std::thread::sleep(Duration::from_millis(5));
    }
    let ready = d.noted("READY=1").unwrap() - start;
    eprintln!("READY=1 {ready:?} after start, with NVML's init hanging 3 s");
    assert!(ready < Duration::from_millis(2500), "{ready:?}");

    // While init still hangs, an Xid is reported at once (without NVML's identity yet).
    let written = Wedged::append_kmsg(
        dir.path(),
        "3,1,1000001,-;NVRM: Xid (PCI:0000:17:00): 79, pid=42, name=python3, GPU has fallen off the bus.\n",
    );
    let (at, x79) = d.wait_for("the Xid 79", Duration::from_secs(10), |v| v["xid"] == 79);
    assert!(at - written < Duration::from_secs(1), "{:?}", at - written);
    assert!(at - start < Duration::from_millis(2900), "{:?}", at - start);
    assert!(x79["gpu"]["uuid"].is_null(), "{x79}");

    // When init answers, its GPUs are learnt: a later fault carries NVML's identity.
    let wait = Instant::now();
    while !d.log().contains("NVML answered its init late") {
        assert!(wait.elapsed() < Duration::from_secs(10), "{}", d.log());
        std::thread::sleep(Duration::from_millis(10));
    }
    Wedged::append_kmsg(
        dir.path(),
        "3,2,2000001,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=42, name=python3, An uncorrectable double bit error\n",
    );
    let (_, x48) = d.wait_for("the Xid 48", Duration::from_secs(10), |v| v["xid"] == 48);
    assert_eq!(x48["gpu"]["uuid"], UUID1, "{x48}");
    // 3 s is slow, not stuck: no driver_unresponsive.
    let all = d.incidents();
    assert!(
        all.iter().all(|(_, v)| v["kind"] != "driver_unresponsive"),
        "{all:#?}"
    );
}

#[test]
fn a_stop_requested_while_nvml_opens_is_a_clean_shutdown() {
    // Init's device count takes 3 s (the open waits 1 s for it): SIGTERM comes in the middle of
    // the set-up, as when systemd stops a unit that is still starting.
    let (_dir, d) = Wedged::launch(&format!(
        "{TWO_GPUS}hang nvmlDeviceGetCount_v2 3000 times=1\n"
    ));
    let wait = Instant::now();
    while !d.log().contains("kernel log: first start in this boot") {
        assert!(wait.elapsed() < Duration::from_secs(10), "{}", d.log());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(d.noted("READY=1").is_none(), "still setting up");
    let s = d.d.stop();
    assert_eq!(
        s.code,
        Some(0),
        "not killed by the signal's default action: {:?}\n{}",
        s.code,
        s.stderr
    );
}
