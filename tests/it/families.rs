//! One test per family of NVIDIA error the corpus showed xidwatch used to miss, each made from
//! real lines of public bug reports (the source is named above each case; the same lines are in
//! `fixtures/corpus/`). Each checks the finding's kind, severity, GPU and what was folded in.

use xidwatch::classify::{prefix, Classifier, LineOrigin};
use xidwatch::model::{Category, Detail, Finding, FindingKind, Severity};
use xidwatch::source::file::Prefilter;

/// Classifies a text as `scan` does, prefilter included.
fn classify(text: &str) -> Vec<Finding> {
    let pre = Prefilter::new();
    let mut c = Classifier::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if !pre.is_candidate(line.as_bytes()) {
            continue;
        }
        let Some(split) = prefix::split(line) else {
            continue;
        };
        let at = LineOrigin {
            line: i as u64 + 1,
            seq: split.prefix.seq,
            ts_usec: split.prefix.ts_usec,
            timestamp: split
                .prefix
                .text
                .as_deref()
                .map(xidwatch::model::Stamp::new),
        };
        for m in &split.messages {
            c.push(m, &at, &mut out);
        }
    }
    c.flush(&mut out);
    out
}

fn loud(text: &str) -> Vec<Finding> {
    classify(text)
        .into_iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

fn pci(f: &Finding) -> Option<String> {
    f.pci.map(|p| p.to_string())
}

// https://github.com/Frogging-Family/nvidia-all/issues/394
// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/829
#[test]
fn newer_api_mismatch_wording_names_client_pid_and_both_versions() {
    let text = "[    9.424670] NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)
               NVRM: has the version 595.84, but this kernel module has
               NVRM: the version 595.80.  Please make sure that this
               NVRM: kernel module and all NVIDIA driver components
               NVRM: have the same version.";
    let f = loud(text);
    assert_eq!(f.len(), 1, "{f:#?}");
    let f = &f[0];
    assert_eq!(
        (f.kind, f.severity),
        (FindingKind::ApiMismatch, Severity::Critical)
    );
    assert_eq!(
        (f.process.as_deref(), f.pid),
        (Some("kwin_wayland"), Some(1005))
    );
    assert_eq!(f.origin.lines, 5);
    assert_eq!(
        f.detail,
        Some(Detail::ApiMismatch {
            client_version: "595.84".into(),
            kernel_version: "595.80".into()
        })
    );
    let f = loud(
        "Apr 19 12:34:42 Kyrios kernel: NVRM: API mismatch: the client 'nvidia-powerd' (pid 849)
                               NVRM: has the version 570.133.07, but this kernel module has
                               NVRM: the version 575.51.02.  Please make sure that this
                               NVRM: kernel module and all NVIDIA driver components
                               NVRM: have the same version.",
    );
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].process.as_deref(), Some("nvidia-powerd"));
}

// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230, /issues/673, /issues/943,
// https://github.com/ublue-os/bazzite/issues/2668, https://github.com/NVIDIA/nvtrust/issues/77
#[test]
fn gsp_boot_failures_are_initialisation_failures() {
    for line in [
        "[  127.849897] NVRM: GPU6 _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP",
        "[  127.849936] NVRM: GPU6 RmInitAdapter: Cannot initialize GSP firmware RM",
        "NVRM s_executeBooterUcode_TU102: Booter failed with non-zero error code: 0xa",
        "2024-07-02 18:46:08.681559 kernel:[   21.766727] NVRM kgspExecuteBooterUnloadIfNeeded_TU102: failed to execute Booter Unload: 0xffff",
        "[   10.842107] NVRM: s_vbiosPatchInterfaceData: too few interface entires found for FWSEC cmd 0x15",
        "[   10.842114] NVRM: s_prepareForFwsec_TU102: failed to prepare interface data for FWSEC cmd 0x15: 0x25",
        "[   23.991667] NVRM: RmFetchGspRmImages: No firmware image found",
        "[   46.402698] NVRM: GPU 0000:00:07.0: Failed to copy vbios to system memory.",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:#?}");
        assert_eq!(
            (f[0].kind, f[0].severity),
            (FindingKind::DriverInitFailure, Severity::Critical),
            "{line}"
        );
    }
    // The harmless booter notice from the same family of logs stays quiet.
    assert!(loud("Feb 02 01:08:04 Host-24 kernel: NVRM kgspExecuteBooterUnloadIfNeeded_TU102: skipping executing Booter Unload as WPR is not up").is_empty());
}

// https://github.com/MrMEEE/ironhide/issues/41, https://github.com/h8d13/archinstoo/issues/244,
// https://github.com/MrMEEE/bumblebee-Old-and-abbandoned/issues/583,
// https://github.com/Cyridd/cmpunlocker/issues/4, https://github.com/negativo17/nvidia-driver/issues/97
#[test]
fn probe_and_adapter_failures_fold_their_explanations() {
    let f = loud(
        "[ 9687.215135] NVRM: The NVIDIA probe routine was not called for 1 device(s).
[ 9687.215145] NVRM: This can occur when a driver such as nouveau, rivafb,
[ 9687.215149] NVRM: nvidiafb, or rivatv was loaded and obtained ownership of
[ 9687.215153] NVRM: the NVIDIA device(s).
[ 9687.215161] NVRM: Try unloading the conflicting kernel module (and/or
[ 9687.215165] NVRM: reconfigure your kernel without the conflicting
[ 9687.215168] NVRM: driver(s)), then try loading the NVIDIA kernel module
[ 9687.215172] NVRM: again.
[ 9687.215178] NVRM: No NVIDIA graphics adapter probed!",
    );
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::DriverInitFailure);
    assert_eq!(f[0].origin.lines, 8);
    assert!(f[0].title.contains("not called for 1 device"));
    assert_eq!(f[1].kind, FindingKind::DriverInitFailure);

    // The unassigned BAR: the address comes from the folded line.
    let f = loud(
        "[    6.821212] NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:
               NVRM: BAR0 is 0M @ 0x0 (PCI:0000:01:00.0)
[    6.821283] NVRM: The NVIDIA probe routine failed for 1 device(s).",
    );
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(
        (f[0].origin.lines, pci(&f[0]).as_deref()),
        (2, Some("0000:01:00.0"))
    );

    // Not supported by this driver release: a warning with the explanation folded.
    let f = loud(
        "[  652.483304] NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1050) installed
[  652.483305] NVRM: in this system is not supported by the 280.13 NVIDIA Linux
[  652.483306] NVRM: graphics driver release.  Please see 'Appendix A -
[  652.483307] NVRM: Supported NVIDIA GPU Products' in this release's README,
[  652.483308] NVRM: available on the Linux graphics driver download page at
[  652.483309] NVRM: www.nvidia.com.
[  652.483325] nvidia: probe of 0000:01:00.0 failed with error -1",
    );
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(
        (f[0].kind, f[0].severity),
        (FindingKind::DriverError, Severity::Warning)
    );
    assert_eq!(f[0].origin.lines, 6);
    assert_eq!(f[1].kind, FindingKind::DriverInitFailure);
    assert_eq!(pci(&f[1]).as_deref(), Some("0000:01:00.0"));

    for line in [
        "[   21.238204] NVRM: osInitNvMapping: *** Cannot attach gpu",
        "nvidia: version magic '5.4.18-100.fc30.x86_64 SMP mod_unload ' should be '5.4.18-200.fc31.x86_64 SMP mod_unload '",
        "Jun 26 08:48:30 robocatsorin kernel: [   15.726225] nvidia: disagrees about version of symbol i2c_get_adapter",
        "[Sun May 17 15:55:50 2026] NVRM: No NVIDIA GPU found.",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure, "{line}");
    }
    // Other modules' symbol trouble is not NVIDIA's.
    assert!(
        loud("[  290.382246] ec_master: disagrees about version of symbol module_layout")
            .is_empty()
    );
}

// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1230 (GSP watchdog),
// https://github.com/zen-browser/desktop/issues/8303 (Xid 120 with its report),
// https://github.com/Neroued/ninfer/issues/12, https://github.com/NVIDIA/open-gpu-kernel-modules/issues/688
#[test]
fn gsp_crash_report_is_one_finding_with_its_registers() {
    let f = loud("Aug 07 17:19:17 ubuntu gsd-power[6248]: couldn't change dimming: Timeout was reached
Aug 07 17:19:18 ubuntu kernel: GSP task watchdog timeout @ pc:0x1250c5c, partition:2#0, task:3
Aug 07 17:19:18 ubuntu kernel: NVRM:     Reported by libos partition:2#4 kernel v3.1 [0] @ ts:1786148357
Aug 07 17:19:18 ubuntu kernel: NVRM:     RISC-V CSR State:
Aug 07 17:19:18 ubuntu kernel: NVRM:         sepc:0x0000000001250c5c     stval:0x0000000000000000  scause:0x8000000000000005
Aug 07 17:19:18 ubuntu kernel: NVRM:     RISC-V GPR State:");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        (f[0].kind, f[0].severity, f[0].category),
        (FindingKind::DriverError, Severity::Critical, Category::Gsp)
    );
    assert_eq!(f[0].origin.lines, 5);

    for line in [
        "Aug 10 22:40:59.883607 anthill kernel: NVRM: GPU0 _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 10 sequence 790!",
        "Aug 10 22:40:59.883660 anthill kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844",
        "Feb 17 08:00:34 abggdna-DGX-Station-A100 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!((f[0].kind, f[0].severity), (FindingKind::DriverError, Severity::Warning), "{line}");
    }
    // https://github.com/LiquidGalaxy/liquid-galaxy/issues/45
    let f =
        loud("[27297.939038] NVRM: os_schedule: Attempted to yield the CPU while in atomic or ");
    assert_eq!((f.len(), f[0].kind), (1, FindingKind::DriverError));
    // An RPC event the driver could not process opens a GSP dump (critical), like the timeouts.
    let f = loud("Oct 03 18:01:37 mnemosyne kernel: NVRM: _kgspProcessRpcEvent: Failed to process received event 0x1004 (RC_TRIGGERED) from GPU0: status=0x21");
    assert_eq!((f.len(), f[0].category), (1, Category::Gsp));
}

// https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045, /issues/484, /issues/270
#[test]
fn display_driver_errors_are_warnings() {
    let f = loud("Jun 12 16:30:32 fedora-box kernel: nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000ca7e:2:0:0x00000062
Jun 12 16:30:35 fedora-box kernel: nvidia-modeset: WARNING: GPU:0: Lost display notification (0:0x00000000); continuing.
Jun 12 16:30:41 fedora-box kernel: [drm:nv_drm_atomic_commit [nvidia_drm]] *ERROR* [nvidia-drm] [GPU ID 0x00000100] Flip event timeout on head 0
Jun 12 16:30:41 fedora-box kernel: Console: switching to colour frame buffer device 480x135");
    assert_eq!(f.len(), 3, "{f:#?}");
    assert!(f
        .iter()
        .all(|f| f.kind == FindingKind::DriverError && f.severity == Severity::Warning));
    assert_eq!(f[0].title, "nvidia-modeset error");
    assert_eq!(f[2].title, "nvidia-drm error");
    assert!(f[2].message.contains("Flip event timeout"));
    // The loading banners and allocation notices of the same modules stay quiet.
    assert!(loud("[   14.762771] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  390.67  Fri Jun  1 03:15:43 PDT 2018
[   14.863057] [drm] [nvidia-drm] [GPU ID 0x00000100] Loading driver
[   14.863058] [drm] Initialized nvidia-drm 0.0.0 20160202 for 0000:01:00.0 on minor 0
[   33.776592] nvidia-modeset: Allocated GPU:0 (GPU-af4ac54d-7aa0-d526-8d62-56515c1f9830) @ PCI:0000:01:00.0").is_empty());
}

// https://github.com/rwth-i6/returnn/issues/1480, https://github.com/NVIDIA/k8s-device-plugin/issues/77,
// https://github.com/ollama/ollama/issues/4342, https://github.com/yuq/linux-lima/issues/16
#[test]
fn traces_in_nvidia_modules_are_one_finding_naming_module_and_task() {
    let f = loud("[  +0.000049] task:python3.11      state:D stack:    0 pid:15277 ppid: 15257 flags:0x00000002
[  +0.000006] Call Trace:
[  +0.000003]  <TASK>
[  +0.000004]  __schedule+0x23d/0x590
[  +0.000011]  schedule+0x4e/0xb0
[  +0.000003]  schedule_preempt_disabled+0xe/0x10
[  +0.000003]  __mutex_lock.constprop.0+0x263/0x490
[  +0.000005]  __mutex_lock_slowpath+0x13/0x20
[  +0.000003]  mutex_lock+0x34/0x40
[  +0.000005]  uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]
[  +0.000084]  ? __kmalloc+0x179/0x330
[  +0.000008]  ? alloc_internal.part.0+0x24/0x30 [nvidia_uvm]
[  +0.000053]  uvm_page_table_range_vec_init+0x191/0x260 [nvidia_uvm]");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        (f[0].kind, f[0].severity),
        (FindingKind::DriverError, Severity::Warning)
    );
    assert_eq!(f[0].title, "task python3.11 hung in the nvidia_uvm module");
    assert_eq!(f[0].origin.line, 1);

    let f = loud(
        "[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.
[  721.028229]       Tainted: P           O    4.4.146-1.el7.elrepo.x86_64 #1
[  721.028346] Call Trace:
[  721.028360]  [<ffffffff8170e16e>] ? schedule_preempt_disabled+0xe/0x10
[  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]",
    );
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        f[0].title,
        "task nvc:[driver] hung in the nvidia_uvm module"
    );

    let f = loud(
        "May 11 10:54:31 localhost kernel: [<ffffffff85a71988>] ? do_vfs_ioctl+0x3a8/0x5c0
May 11 10:54:31 localhost kernel: [<ffffffffc074c130>] ? nvidia_unlocked_ioctl+0x20/0x30 [nvidia]
May 11 10:54:31 localhost kernel: [<ffffffffc074bf28>] ? nvidia_ioctl.isra.22+0x728/0x910 [nvidia]
May 11 10:54:31 localhost kernel: [<ffffffffc1237e38>] ? rm_ioctl+0x58/0xb0 [nvidia]",
    );
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].title, "kernel call trace in the nvidia module");
    assert_eq!(f[0].origin.lines, 3);

    // A hung task whose frames are all in another driver is not reported.
    assert!(loud(
        "[ 3021.755145] INFO: task kodi-gbm:464 blocked for more than 120 seconds.
[ 3021.773418] Call trace:
[ 3021.798530]  lima_vm_bo_del+0x1b8/0x1d0 [lima]
[ 3021.802927]  lima_gem_object_close+0x88/0xd0 [lima]"
    )
    .is_empty());
}

// https://github.com/rwth-i6/returnn/issues/1500, https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1229
#[test]
fn aer_on_the_root_port_above_a_gpu_is_tied_to_the_gpu() {
    let f = classify("[  +0.000844] nvidia 0000:03:00.0: AER: can't recover (no error_detected callback)
[  +0.000001] snd_hda_intel 0000:03:00.1: AER: can't recover (no error_detected callback)
[  +0.000008] pcieport 0000:00:03.0: AER: device recovery failed
[  +0.000001] pcieport 0000:00:03.0: AER: Multiple Uncorrected (Fatal) error received: 0000:00:03.0
[  +0.000004] pcieport 0000:00:03.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)
[  +1.050439] pcieport 0000:00:03.0: AER: Root Port link has been reset (0)");
    assert!(f.iter().all(|f| f.kind == FindingKind::PcieAer), "{f:#?}");
    assert!(f.len() >= 3, "{f:#?}");
    // Every finding names the GPU, and the port as the reporter.
    for x in &f {
        assert_eq!(pci(x).as_deref(), Some("0000:03:00.0"), "{x:#?}");
    }
    assert_eq!(
        f[1].severity,
        Severity::Critical,
        "recovery of the GPU's link failed"
    );
    assert!(
        matches!(&f[1].detail, Some(Detail::Aer { reporter: Some(r), .. }) if r.to_string() == "0000:00:03.0")
    );

    // "error received from" the GPU: the port's line is about the GPU.
    let f = classify(
        "pcieport 0000:00:01.2: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0
nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)
pcieport 0000:62:00.0: AER: device recovery failed",
    );
    assert_eq!(pci(&f[0]).as_deref(), Some("0000:63:00.0"));
    assert!(f.iter().all(|x| x.severity >= Severity::Warning), "{f:#?}");

    // The daemon learns the topology from sysfs instead.
    let mut c = Classifier::new();
    c.learn_port(
        "0000:16:01.0".parse().unwrap(),
        "0000:17:00.0".parse().unwrap(),
    );
    let mut out = Vec::new();
    c.push(
        "pcieport 0000:16:01.0: AER: device recovery failed",
        &LineOrigin::default(),
        &mut out,
    );
    assert_eq!(
        (pci(&out[0]).as_deref(), out[0].severity),
        (Some("0000:17:00.0"), Severity::Critical)
    );
}

// https://github.com/DualCoder/vgpu_unlock/issues/114
#[test]
fn older_pcie_bus_error_lines_without_the_aer_tag() {
    let f = classify("pcieport 0000:00:01.1: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Receiver ID)
pcieport 0000:00:01.1:  device [8086:6f03] error status/mask=00000020/00000000");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::PcieAer);
    assert!(
        matches!(&f[0].detail, Some(Detail::Aer { class, .. }) if class == "Uncorrected (Fatal)")
    );
    // Other pcieport lines are not AER.
    assert!(classify("[   26.118074] pcieport 0000:02:01.0: PCI bridge to [bus 04-24]").is_empty());
}

#[test]
fn redacted_addresses_still_give_the_xid() {
    // https://github.com/NVIDIA/nccl/issues/2241: the reporter replaced the addresses with "...".
    for (line, xid) in [
        ("kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)", 145),
        ("kernel: NVRM: Xid (PCI:...): 137, RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error", 137),
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!((f[0].kind, f[0].pci, f[0].xid), (FindingKind::Xid, None, Some(xid)), "{line}");
    }
    // Other ways of redacting seen in templates and docs (no real report used them), built from
    // the driver's grammar.
    for line in [
        "NVRM: Xid (PCI:xxxx:xx:xx): 48, pid=1, name=x, An uncorrectable double bit error",
        "NVRM: Xid (PCI:0000:XX:00): 79, pid=1, name=x, GPU has fallen off the bus.",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!((f[0].kind, f[0].pci), (FindingKind::Xid, None), "{line}");
        assert!(f[0].xid == Some(79) || f[0].xid == Some(48));
        assert_eq!(f[0].severity, Severity::Critical);
    }
}

// https://github.com/NVIDIA/nvidia-docker/issues/1553, https://github.com/qixuema/envs/issues/4,
// https://github.com/tinygrad/open-gpu-kernel-modules/issues/47, https://github.com/jamesstringer90/Easy-GPU-PV/issues/276
#[test]
fn nvidia_smi_and_nvml_error_texts() {
    let f = loud("Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error");
    assert_eq!(
        (f[0].severity, pci(&f[0]).as_deref()),
        (Severity::Critical, Some("0000:09:00.0"))
    );
    let f = loud("Unable to determine the device handle for GPU0000:07:00.0: Unknown Error");
    assert_eq!(pci(&f[0]).as_deref(), Some("0000:07:00.0"));
    for (line, sev) in [
        ("NVIDIA-SMI has failed because it couldn‘t communicate with the NVIDIA driver.", Severity::Critical),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.", Severity::Critical),
        ("Failed to initialize NVML: Driver/library version mismatch", Severity::Critical),
        ("Error: nvmlDeviceGetHandleByIndex(): Unknown Error", Severity::Warning),
        ("No devices were found", Severity::Warning),
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!((f[0].kind, f[0].severity), (FindingKind::DriverError, sev), "{line}");
    }
}

// https://github.com/NVIDIA/nvtrust/issues/124, https://github.com/leptonai/gpud/pull/338
#[test]
fn sxids_name_the_nvswitch_and_use_the_catalog() {
    let f = loud("[   38.175561] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Data {0x0000002b, 0x0000002b, 0x00000000, 0x0000002b, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}
[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 Minion Link DLREQ interrupt
[   38.180708] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Severity 0 Engine instance 44 Sub-engine instance 00");
    assert_eq!(
        f.len(),
        1,
        "the Data line before the head belongs to it: {f:#?}"
    );
    assert_eq!(
        (f[0].kind, f[0].severity, f[0].xid),
        (FindingKind::Sxid, Severity::Warning, Some(22013))
    );
    assert_eq!(
        f[0].title,
        "NVSwitch SXid 22013 Minion Link DLREQ interrupt (non-fatal)"
    );
    assert_eq!(f[0].origin.lines, 3);
    let f = loud("kern  :err   : 2025-01-25T10:34:54,859532+00:00 nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}");
    assert_eq!(
        f[0].title,
        "NVSwitch SXid 12028 egress nonposted PRIV error (severity not in the log)"
    );
}

// https://github.com/Bumblebee-Project/Bumblebee/issues/554, https://github.com/NVIDIA/nvtrust/issues/77
#[test]
fn any_nvidia_module_line_with_an_error_signal_is_at_least_a_warning() {
    for line in [
        "[   49.261465] NVRM: os_pci_init_handle: invalid context!",
        "[  279.950855] NVRM: gpuHandleSanityCheckRegReadError_GH100: Possible bad register read: addr: 0x110804,  regvalue: 0xbadf4100,  error code: Unknown SYS_PRI_ERROR_CODE",
        "[87669.726589] NVRM: nvidia_frontend_open: minor 0, module->open() failed, error -5",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}");
        assert_eq!(f[0].kind, FindingKind::DriverError, "{line}");
    }
    // Known-harmless lines of the same modules stay quiet.
    for line in [
        "[   23.989750] nvidia: loading out-of-tree module taints kernel.",
        "nvidia: module verification failed: signature and/or required key missing - tainting kernel",
        "[   25.182630] nvidia_uvm: module uses symbols from proprietary module nvidia, inheriting taint.",
        "[   25.188515] nvidia-uvm: Loaded the UVM driver, major device number 506.",
        "[   24.021693] nvidia 0000:01:00.0: vgaarb: changed VGA decodes: olddecodes=io+mem,decodes=none:owns=none",
        "[   76.006780] nvidia 0000:02:00.0: [drm] Cannot find any crtc or sizes",
        "[    6.860482] NVRM: GPU at 0000:01:00.0 has software scheduler ENABLED with policy BEST_EFFORT.",
        "[   75.588764] NVRM: kgspCheckGspRmCcCleanup_GH100: CC secret cleanup successful!",
        "[   24.020428] nvidia-nvlink: Nvlink Core is being initialized, major device number 239",
    ] {
        assert!(loud(line).is_empty(), "{line}: {:#?}", loud(line));
    }
}
