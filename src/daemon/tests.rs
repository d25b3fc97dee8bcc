//! The daemon's parts on plain values: a kernel log record through the classifier to a
//! handed-over incident, NVML's values applied by the pipeline, reload swapping the parts that
//! changed, and the order of the stop. Each test builds a real daemon (through [`build`]) on a
//! temporary directory: kernel log as a plain file, NVML off, alerts to a webhook nobody
//! answers, so every alert stays in the outbox where the test can read it.

use std::path::{Path, PathBuf};

use super::events::Event;
use super::*;
use crate::config::Config;
use crate::model::{FindingKind, PciAddress};
use crate::source::kmsg::follow::KmsgEvent;
use crate::source::kmsg::record::parse_record;
use crate::source::nvml::link::NvmlValue;

struct Dir {
    dir: tempfile::TempDir,
}

impl Dir {
    /// A config with `extra` appended; the kernel log holds `records`, the boot was an hour ago.
    fn new(records: &str, extra: &str) -> Dir {
        let dir = tempfile::tempdir().unwrap();
        let d = Dir { dir };
        std::fs::write(d.path("kmsg"), records).unwrap();
        std::fs::write(d.path("boot_id"), "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n").unwrap();
        let now = crate::clock::wall_ms() / 1000;
        std::fs::write(
            d.path("stat"),
            format!("cpu  1 2 3 4\nbtime {}\n", now - 3600),
        )
        .unwrap();
        d.write_config(extra);
        d
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> PathBuf {
        self.path("state")
    }

    fn write_config(&self, extra: &str) {
        let cfg = format!(
            "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n\
             [incidents]\nsettle_ms = 0\n\
             [[alerts.webhook]]\nname = \"hook\"\nurl = \"http://127.0.0.1:9/nothing-listens\"\nformat = \"json\"\ntimeout_secs = 1\n{extra}",
            self.path("kmsg"),
            self.path("sys"),
            self.state(),
        );
        std::fs::write(self.path("xidwatch.toml"), cfg).unwrap();
    }

    fn opts(&self) -> RunOptions {
        RunOptions {
            config: Config::load(Some(&self.path("xidwatch.toml"))).unwrap(),
            output: Output::Text,
            boot_id_path: self.path("boot_id"),
            boot_time_path: self.path("stat"),
        }
    }

    async fn build(&self) -> Daemon {
        build(&self.opts(), Hangup::never()).await.unwrap()
    }

    /// The alerts in the outbox, as text.
    fn outbox(&self) -> Vec<String> {
        let dir = self.state().join("alert-outbox");
        let mut out: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    // One file per alert; `meta.json` is the outbox's own.
                    .filter(|e| {
                        e.path().extension().is_some_and(|x| x == "json")
                            && e.file_name() != "meta.json"
                    })
                    .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }
}

fn xid(seq: u64, bus: &str, xid: u32) -> String {
    format!(
        "3,{seq},{},-;NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid=42, name=python3, test\n",
        1_000_000 + seq
    )
}

fn record(line: &str) -> KmsgEvent {
    KmsgEvent::Record {
        rec: parse_record(line.trim_end().as_bytes()).unwrap(),
        at_startup: false,
    }
}

fn saved_seq(state: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(state.join(checkpoint::CHECKPOINT)).ok()?;
    let saved: checkpoint::SavedIncidents = serde_json::from_str(&text).ok()?;
    saved.last_seq
}

#[tokio::test(flavor = "current_thread")]
async fn a_kernel_record_is_classified_and_handed_over_as_one_incident() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    d.handle(Event::Kmsg(vec![record(&xid(7, "17", 79))]))
        .await
        .unwrap();
    d.after().await;
    let snap = d.tel.snapshot();
    assert_eq!(snap.open_incidents_total, 1, "{:?}", snap.open_incidents);
    let inc = &snap.open_incidents[0];
    assert_eq!(inc.kind, "xid");
    assert_eq!(inc.pci, PciAddress::parse("0000:17:00.0").ok());
    // Handed over: the alert is durable in the outbox, named by the incident's id.
    let outbox = dir.outbox();
    assert_eq!(outbox.len(), 1, "{outbox:?}");
    assert!(outbox[0].contains(&inc.id), "{}", outbox[0]);
    // And the checkpoint may now move past the record.
    assert!(d.pipeline.flush(true).await);
    assert_eq!(saved_seq(&dir.state()), Some(7));
    d.stop().await;
}

/// A reader that fails on a line (a defect; the unit tests' classifier panics on a marked line)
/// costs that line, not the watch: the next record's Xid 79 is still an incident, the checkpoint
/// moves past both (the record is not read again after a restart), and the failure is counted
/// where `xidwatch status` and the metrics show it.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_that_fails_on_a_line_costs_the_line_not_the_watch() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    let poison = format!(
        "3,6,1000006,-;NVRM: Xid (PCI:0000:2a:00): 13, pid=1, {}\n",
        crate::classify::POISON_FOR_TESTS
    );
    d.handle(Event::Kmsg(vec![
        record(&poison),
        record(&xid(7, "17", 79)),
    ]))
    .await
    .unwrap();
    d.after().await;
    assert_eq!(d.pipeline.stats.kmsg_unread, 1);
    assert_eq!(d.pipeline.stats.kmsg_records, 2);
    let snap = d.tel.snapshot();
    assert_eq!(snap.kmsg.unread, 1);
    assert_eq!(snap.open_incidents_total, 1, "{:?}", snap.open_incidents);
    assert_eq!(
        snap.open_incidents[0].pci,
        PciAddress::parse("0000:17:00.0").ok()
    );
    assert!(d.pipeline.flush(true).await);
    assert_eq!(saved_seq(&dir.state()), Some(7));
    d.stop().await;
}

/// A crash report whose only NVIDIA link is a later line with no message of its own (a DRM core
/// warning, then `... provided by nvidia_frontend_exit_module [nvidia]. ...`) is the driver's in
/// the daemon as in `scan`: one incident besides the Xid that follows it.
#[tokio::test(flavor = "current_thread")]
async fn a_crash_report_tied_by_a_later_line_is_the_drivers_in_the_daemon_too() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    d.handle(Event::Kmsg(vec![
        record("4,5,1000005,-;WARNING: CPU: 2 PID: 1090 at /build/linux-Uuaskm/linux-3.18.6/drivers/gpu/drm/drm_ioctl.c:143 drm_setversion+0x176/0x180 [drm]()"),
        record("4,6,1000006,-;No drm_driver.set_busid() implementation provided by nvidia_frontend_exit_module [nvidia]. Use drm_dev_set_unique() to set the unique name explicitly."),
        record(&xid(7, "17", 79)),
    ]))
    .await
    .unwrap();
    d.after().await;
    let snap = d.tel.snapshot();
    let kinds: Vec<&str> = snap
        .open_incidents
        .iter()
        .map(|i| i.kind.as_str())
        .collect();
    assert_eq!(snap.open_incidents_total, 2, "{kinds:?}");
    assert!(kinds.contains(&"xid"), "{kinds:?}");
    d.stop().await;
}

/// A crash in core kernel code whose only out-of-tree modules are NVIDIA's is the driver's in
/// the daemon as in `scan`: its instruction pointer and module list reach the pending report.
#[tokio::test(flavor = "current_thread")]
async fn a_core_crash_that_only_nvidia_taints_is_the_drivers_in_the_daemon_too() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    d.handle(Event::Kmsg(vec![
        record("1,5,1000005,-;BUG: unable to handle page fault for address: ffffb1e0c0a3f000"),
        record("4,6,1000006,-;RIP: 0010:memcpy_orig+0x31/0x140"),
        record("4,7,1000007,-;Modules linked in: nvidia_uvm(POE) nvidia(POE) ext4"),
        record(&xid(8, "17", 79)),
    ]))
    .await
    .unwrap();
    d.after().await;
    let snap = d.tel.snapshot();
    let kinds: Vec<&str> = snap
        .open_incidents
        .iter()
        .map(|i| i.kind.as_str())
        .collect();
    assert_eq!(snap.open_incidents_total, 2, "{kinds:?}");
    d.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn nvml_values_teach_the_classifier_and_reach_the_counters() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    let pci = PciAddress::parse("0000:17:00.0").unwrap();
    let gpu = crate::source::nvml::GpuInfo {
        index: 3,
        pci,
        uuid: Some("GPU-aaaa".into()),
        serial: None,
        name: Some("Test GPU".into()),
    };
    let p = &mut d.pipeline;
    p.apply_nvml(
        NvmlValue::Learned {
            gpus: vec![gpu],
            driver_version: Some("550.54.14".into()),
        },
        false,
    );
    p.apply_nvml(
        NvmlValue::Up {
            up: true,
            state: Some("ok".into()),
        },
        false,
    );
    assert!(p.stats.nvml_up);
    assert_eq!(p.stats.gpus_seen, 1);
    // The status learns the GPUs and NVML's state from the same values.
    let snap = d.tel.snapshot();
    assert_eq!(
        (snap.gpus.len(), snap.nvml.up, snap.nvml.state.as_str()),
        (1, true, "ok")
    );
    let p = &mut d.pipeline;
    p.kmsg(&[record(&xid(1, "17", 79))]).unwrap();
    d.after().await;
    let snap = d.tel.snapshot();
    assert_eq!(snap.open_incidents_total, 1);
    assert!(
        dir.outbox()[0].contains("GPU-aaaa"),
        "the page names the board NVML described: {}",
        dir.outbox()[0]
    );
    d.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn reload_swaps_the_parts_that_changed_and_keeps_restart_settings() {
    let dir = Dir::new("", "[runbooks]\nmax_parallel_runbooks = 2\n");
    let mut d = dir.build().await;
    let window = d.pipeline.current.incidents.window_secs;
    let kmsg = d.pipeline.current.kmsg.path.clone();
    // Nothing changed on disk: a file event does not reload.
    d.handle(Event::ConfigChanged).await.unwrap();
    assert_eq!(d.tel.snapshot().config.reloads_ok, 0);

    // A valid change: the engine's settings and the runbooks are swapped in; the kernel log
    // path needs a restart and keeps its start-up value.
    std::fs::write(dir.path("other-kmsg"), "").unwrap();
    let cfg = std::fs::read_to_string(dir.path("xidwatch.toml"))
        .unwrap()
        .replace("max_parallel_runbooks = 2", "max_parallel_runbooks = 3")
        .replace(
            "settle_ms = 0",
            &format!("settle_ms = 0\nwindow_secs = {}", window + 7),
        )
        .replace(
            &format!("{:?}", dir.path("kmsg")),
            &format!("{:?}", dir.path("other-kmsg")),
        );
    std::fs::write(dir.path("xidwatch.toml"), cfg).unwrap();
    d.handle(Event::ConfigChanged).await.unwrap();
    let p = &d.pipeline;
    assert_eq!(d.tel.snapshot().config.reloads_ok, 1);
    assert_eq!(p.current.incidents.window_secs, window + 7);
    assert_eq!(p.current.kmsg.path, kmsg, "restart-only settings stay");
    assert_eq!(
        p.out.permits.available_permits(),
        3,
        "runbook slots rebuilt"
    );

    // A config that does not validate is refused: the old one stays, and it is a finding.
    std::fs::write(
        dir.path("xidwatch.toml"),
        "[incidents]\nsettle_ms = 999999\n",
    )
    .unwrap();
    d.handle(Event::Hangup).await.unwrap();
    d.after().await;
    let snap = d.tel.snapshot();
    assert_eq!(snap.config.reload_failures, 1);
    assert_eq!(d.pipeline.current.incidents.window_secs, window + 7);
    assert!(
        snap.findings
            .iter()
            .any(|f| f.kind == FindingKind::ConfigRejected.as_str()),
        "{:?}",
        snap.findings
    );
    d.stop().await;
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_hands_over_then_saves_then_reports_stopped() {
    let dir = Dir::new(&xid(4, "2a", 48), "");
    let d = dir.build().await;
    let tel = d.tel.clone();
    let (stop, shutdown) = Shutdown::new();
    let stopper = async {
        // Stop once the record read at start-up is an incident (a loaded machine may take
        // seconds; the deadline only keeps a broken daemon from hanging the test).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while tel.snapshot().open_incidents_total == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the record read at start-up never became an incident"
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(
            !dir.state().join("status.json").exists() || {
                let s: serde_json::Value = serde_json::from_slice(
                    &std::fs::read(dir.state().join("status.json")).unwrap(),
                )
                .unwrap();
                s.get("stopped_ms").is_none()
            }
        );
        assert!(
            control::socket_path(&dir.state()).exists(),
            "status answers while running"
        );
        stop.stop();
    };
    let (ran, ()) = tokio::join!(run(d, shutdown), stopper);
    ran.unwrap();
    // Handed over, then the checkpoint behind it, then the last status and the socket gone.
    assert_eq!(dir.outbox().len(), 1);
    assert_eq!(saved_seq(&dir.state()), Some(4));
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.state().join("status.json")).unwrap()).unwrap();
    assert!(status["stopped_ms"].as_u64().is_some(), "{status}");
    assert_eq!(status["open_incidents_total"], 1);
    assert!(!control::socket_path(&dir.state()).exists());
}

#[tokio::test(flavor = "current_thread")]
async fn a_stop_requested_before_the_loop_is_a_clean_shutdown() {
    let dir = Dir::new("", "");
    let d = dir.build().await;
    let (stop, shutdown) = Shutdown::new();
    stop.stop();
    assert!(shutdown.is_requested());
    run(d, shutdown).await.unwrap();
    let status: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.state().join("status.json")).unwrap()).unwrap();
    assert!(status["stopped_ms"].as_u64().is_some());
}

#[tokio::test(flavor = "current_thread")]
async fn kernel_log_events_are_counted_and_a_lost_reader_is_an_error() {
    let dir = Dir::new("", "");
    let mut d = dir.build().await;
    let p = &mut d.pipeline;
    // A program's line is counted, never classified (the key says how to accept it).
    let injected = "12,3,1000003,-;NVRM: Xid (PCI:0000:17:00): 79, pid=42, name=python3, test";
    p.kmsg(&[
        record(injected),
        KmsgEvent::Malformed("no semicolon".into()),
        KmsgEvent::Overrun {
            lost: 5,
            next_seq: 9,
            at_startup: false,
        },
    ])
    .unwrap();
    assert_eq!(p.stats.kmsg_records, 1);
    assert_eq!(p.stats.kmsg_userspace_ignored, 1);
    assert_eq!(p.stats.kmsg_malformed, 1);
    assert_eq!(p.stats.kmsg_lost, 5);
    d.after().await;
    let snap = d.tel.snapshot();
    assert_eq!(snap.open_incidents_total, 1, "the overrun only");
    assert_eq!(
        snap.open_incidents[0].kind,
        FindingKind::KmsgOverrun.as_str()
    );
    // The reader's end is the daemon's error, with its reason.
    let e = d
        .handle(Event::Kmsg(vec![KmsgEvent::Failed("gone".into())]))
        .await
        .unwrap_err();
    assert!(format!("{e:#}").contains("gone"), "{e:#}");
    d.stop().await;
}
