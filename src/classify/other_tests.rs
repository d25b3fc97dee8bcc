//! Classifier tests for the "other" NVIDIA error families, one per class of line that real
//! reports showed read badly: each feeds saved-log lines through the prefix split and the
//! classifier, as `scan` does, and checks what comes out.

use super::testing;
use crate::model::{Finding, FindingKind, Severity};

fn scan(lines: &[&str]) -> Vec<Finding> {
    testing::read(lines, false)
}

fn loud(line: &str) -> Vec<Finding> {
    testing::loud_line(line, false)
}

#[test]
fn a_hung_task_in_any_kernels_wording_is_reported_with_the_holders_stack() {
    // Newer kernels name the lock holder; its stack (in the NVIDIA modules) follows.
    let f = scan(&[
        "INFO: task nvidia-modeset/:226 blocked on a semaphore likely last held by task kwin_wayland:1088",
        "task:kwin_wayland state:R running task stack:0 pid:1088 tgid:1088 ppid:1080",
        "Call Trace:",
        " ? kgspHealthCheck_TU102+0x54/0x350 [nvidia]",
        " ? nvkms_call_rm+0x4e/0x80 [nvidia_modeset]",
    ]);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].origin.line, 1);
    assert!(
        f[0].title.contains("nvidia-modeset/ hung"),
        "{}",
        f[0].title
    );
    // A holder line that names another task is a report of its own.
    let f = scan(&[
        "INFO: task a:1 blocked on a mutex likely last held by task b:2",
        "task:c state:D stack:0 pid:3",
        " uvm_ioctl+0x13e0/0x16f0 [nvidia_uvm]",
    ]);
    assert!(f.iter().all(|f| f.origin.line != 1), "{f:?}");
}

#[test]
fn a_hung_nvidia_kernel_thread_is_reported_without_frames() {
    // The kernel thread's name says which module hangs when no frame made it into the log.
    let f = loud("[ 246.7] INFO: task nvidia-modeset/:883 blocked for more than 122 seconds.");
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].title.contains("nvidia_modeset"), "{}", f[0].title);
    for t in [
        "INFO: task UVM global queue:412 blocked for more than 120 seconds.",
        "task:nvidia-smi      state:D stack:0     pid:5403 ppid:1 flags:0x00004002",
        "[  721.031434] INFO: task nvc:[driver]:6067 blocked for more than 120 seconds.",
    ] {
        assert_eq!(loud(t).len(), 1, "{t}");
    }
    // Other tasks need an NVIDIA frame; a running holder is no hang.
    assert!(loud("INFO: task python3:15277 blocked for more than 120 seconds.").is_empty());
    assert!(loud("task:nvidia-smi state:R running task stack:0 pid:1").is_empty());
}

/// A module read from the task's name is a guess: the frame or instruction pointer in an NVIDIA
/// module that follows says where the task is stuck, and names the incident's module.
#[test]
fn a_frame_or_rip_in_an_nvidia_module_refines_the_tasks_module() {
    for (second, third) in [
        (
            "[  721.028346] Call Trace:",
            "[  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]",
        ),
        (
            "[  721.028346] RIP: 0010:uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]",
            "[  721.028350] Code: 48 89 e5 41 57",
        ),
    ] {
        let loud = testing::loud_lines(
            &[
                "[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.",
                second,
                third,
            ],
            false,
        );
        assert_eq!(loud.len(), 1, "{loud:#?}");
        assert_eq!(loud[0].module.as_deref(), Some("nvidia_uvm"), "{second}");
    }
    // With no frame, the task's name is all there is.
    let f = loud("[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.");
    assert_eq!(f[0].module.as_deref(), Some("nvidia"));
}

#[test]
fn an_nvidia_module_the_loader_could_not_insert_is_a_driver_failure() {
    for l in [
        "Feb 15 12:31:57.623047 systemd-modules-load[1054]: Failed to insert module 'nvidia_uvm': Cannot allocate memory",
        "modprobe: ERROR: could not insert 'nvidia': No such device",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure);
        assert!(f[0].title.contains("could not be loaded"), "{}", f[0].title);
    }
    assert!(
        loud("systemd-modules-load[1]: Failed to insert module 'loop': No such device").is_empty()
    );
}

#[test]
fn modules_that_cannot_use_nvidia_symbols_are_driver_failures() {
    for l in [
        "[  366.264584] nv_peer_mem: disagrees about version of symbol nvidia_p2p_get_pages",
        "[  366.264587] nv_peer_mem: Unknown symbol nvidia_p2p_get_pages (err -22)",
        "[78175.093303] nvidia_fs: module using GPL-only symbols uses symbols nvidia_p2p_dma_unmap_pages from proprietary module nvidia.",
        "Jun 26 08:48:30 h kernel: [ 15.7] nvidia: disagrees about version of symbol i2c_get_adapter",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure, "{l}");
    }
    // Neither the module nor the symbol is NVIDIA's.
    for l in [
        "[ 10.573301] tegra_drm: disagrees about version of symbol drm_framebuffer_remove",
        "[ 366.264610] nv_peer_mem: disagrees about version of symbol ib_register_peer_memory_client",
    ] {
        assert!(loud(l).is_empty(), "{l}");
    }
}

#[test]
fn nvidia_drm_errors_in_every_shape_are_read() {
    for l in [
        // The DRM core prints it, tagged for nvidia-drm.
        "[drm:drm_new_set_master [drm]] *ERROR* [nvidia-drm] [GPU ID 0x00002700] Failed to grab modeset ownership",
        // nvidia-drm's own notice carrying an error.
        "Feb 20 01:34:20 localhost kernel: [drm] [nvidia-drm] [GPU ID 0x00002d00] nv_drm_reset_input_colorspace failed with error code: -35 !",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}");
        assert_eq!(f[0].title, "nvidia-drm error");
    }
    for l in [
        "[    9.165175] [drm] [nvidia-drm] [GPU ID 0x00000100] Loading driver",
        "[drm] [nvidia-drm] [GPU ID 0x00000300] Unloading driver",
        "[drm:drm_atomic_helper_wait_for_dependencies [drm_kms_helper]] *ERROR* [CRTC:53:crtc-2] flip_done timed out",
    ] {
        assert!(loud(l).is_empty(), "{l}");
    }
}

#[test]
fn a_module_error_in_function_line_form_is_read_at_its_level() {
    // nvidia-peermem prints `module function:line LEVEL text`; its ERROR is an error even when
    // the words after it carry no error signal of their own.
    let f = loud("[ 1.0] nvidia-peermem nv_mem_get_pages:210 ERROR pages pinned by another client");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].title, "nvidia-peermem error");
    assert!(loud("nvidia-peermem nv_mem_client_init:402 INFO registered").is_empty());
    // A known-harmless notice stays quiet at any level: the free callback of a context already
    // torn down (Mellanox/nv_peer_memory#120, where the maintainers call it harmless).
    assert!(loud("[25033.266922] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, skipping further processing").is_empty());
}

#[test]
fn a_kernel_module_that_failed_to_initialise_is_a_driver_init_failure() {
    // ValveSoftware/SteamOS#209: the module itself did not come up.
    for line in [
        "[  441.171021] NVRM: NVIDIA init module failed!",
        "[    3.2] NVRM: nvidia init_module failed (-19)",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure, "{line}");
    }
}

#[test]
fn a_client_freeing_an_unknown_os_event_is_not_a_gpu_fault() {
    // NVIDIA/dcgm-exporter#736: a monitoring agent frees an event handle the driver no longer
    // knows, on a healthy GPU, with two detail lines after it.
    let f = scan(&[
        "[Wed Sep 16 05:23:27 2026] NVRM: free_os_event: failed to find OS event:",
        "[Wed Sep 16 05:23:27 2026] NVRM: free_os_event:    hParent: 0xc1d775c9",
        "[Wed Sep 16 05:23:27 2026] NVRM: free_os_event:    fd: 17",
    ]);
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:?}");
}

#[test]
fn nvml_texts_are_read_whatever_the_case_of_gpu() {
    for l in [
        "Unable to determine the device handle for gpu 0000:01:00.0: Not Found",
        "Unable to determine the device handle for GPU0000:A1:00.0: Unknown Error",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}");
        assert_eq!(
            f[0].pci.map(|p| p.to_string()).as_deref(),
            Some(if l.contains("A1") {
                "0000:a1:00.0"
            } else {
                "0000:01:00.0"
            }),
            "{l}"
        );
    }
}

#[test]
fn a_gpu_the_open_module_will_not_drive_is_reported_once_with_its_explanation() {
    let f = scan(&[
        "[    3.513141] NVRM: Open nvidia.ko is only ready for use on Data Center GPUs.",
        "[    3.513144] NVRM: To force use of Open nvidia.ko on other GPUs, see the",
        "[    3.513145] NVRM: 'OpenRmEnableUnsupportedGpus' kernel module parameter described",
        "[    3.513145] NVRM: in the README.",
    ]);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].title, "GPU not supported by the installed driver");
    assert_eq!(f[0].origin.raw.len(), 4);
}

#[test]
fn older_kernels_aer_status_for_the_gpu_is_aer() {
    let f = scan(&[
        "[74889.542031] pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010",
        "[74889.542234] pcieport 0000:00:02.0: broadcast error_detected message",
        "[74889.542239] nvidia 0000:02:00.0: device has no AER-aware driver",
    ]);
    let gpu = f
        .iter()
        .find(|f| f.origin.line == 3)
        .unwrap_or_else(|| panic!("{f:?}"));
    assert_eq!(gpu.kind, FindingKind::PcieAer);
    assert!(gpu.severity >= Severity::Warning);
    assert_eq!(
        gpu.pci.map(|p| p.to_string()).as_deref(),
        Some("0000:02:00.0")
    );
}

#[test]
fn pci_interrupt_routing_notices_under_the_gpus_name_are_quiet() {
    for l in [
        "[   29.499355] nvidia 25bed32b:00:00.0: can't derive routing for PCI INT A",
        "[   29.499357] nvidia 25bed32b:00:00.0: PCI INT A: no GSI",
        "[  652.483316] nvidia 0000:01:00.0: PCI INT A disabled",
    ] {
        assert!(loud(l).is_empty(), "{l}");
    }
}

#[test]
fn the_new_message_starts_do_not_take_host_names_or_other_modules() {
    use super::prefix::message_start;
    assert_eq!(
        message_start("[ 1.0] nvidia-peermem nv_get_p2p_free_callback:127 ERROR x"),
        Some(7)
    );
    assert_eq!(
        message_start("[ 1.0] nv_peer_mem: Unknown symbol nvidia_p2p_get_pages (err -22)"),
        Some(7)
    );
    assert_eq!(
        message_start("x systemd-modules-load[1]: Failed to insert module 'nvidia_uvm': E"),
        Some(27)
    );
    for l in [
        "Nov 29 08:14:03 nvidia-node-7 sshd:22 accepted",
        "Nov 29 08:14:03 nvidia-node-7 kernel: usb 1-1: new device",
        "systemd-modules-load[1]: Failed to insert module 'loop': E",
        "[drm] Initialized i915 1.6.0 for 0000:00:02.0 on minor 0",
    ] {
        assert_eq!(message_start(l), None, "{l}");
    }
}

#[test]
fn every_module_loader_failure_for_an_nvidia_module_is_read() {
    for l in [
        "modprobe: ERROR: ../libkmod/libkmod-module.c:809 kmod_module_insert_module() could not find module by name='nvidia_331_uvm'",
        "modprobe: ERROR: could not insert 'nvidia_331_uvm': Function not implemented",
        "modprobe: FATAL: Module nvidia-uvm not found.",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure, "{l}");
    }
    assert!(loud("modprobe: FATAL: Module loop not found.").is_empty());
}

#[test]
fn a_failed_power_management_callback_in_nvidia_code_is_an_error() {
    let f = loud("PM: pci_pm_suspend(): nv_pmops_suspend+0x0/0x40 [nvidia] returns -5");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].title, "nvidia error");
    for l in [
        "PM: dpm_run_callback(): pci_pm_suspend+0x0/0x150 returns -5",
        "PM: suspend entry (deep)",
    ] {
        assert!(loud(l).is_empty(), "{l}");
    }
}

#[test]
fn a_driver_self_test_that_reads_back_garbage_is_an_error() {
    let f = loud("[   67.529695] NVRM kbusVerifyBar2_GM107: MMUTest BAR0 window offset 0x70f000 returned garbage 0x0");
    assert_eq!(f.len(), 1, "{f:?}");
}

#[test]
fn gpu_removal_in_use_and_broken_suspend_setups_are_errors() {
    for l in [
        "[ 12.2] NVRM: Attempting to remove device 0000:01:00.0 with non-zero usage count!",
        "[ 12.3] NVRM: GPU 0000:01:00.0: PreserveVideoMemoryAllocations module parameter is set. System Power Management attempted without driver procfs suspend interface. Please refer to the 'Configuring Power Management Support' section in the driver README.",
        "[ 14.1] nvidia 0000:01:00.0: PM: dpm_run_callback(): pci_pm_suspend+0x0/0x170 returns -5",
    ] {
        assert_eq!(loud(l).len(), 1, "{l}");
    }
    assert!(loud("[ 14.1] nvidia 0000:01:00.0: PM: calling pci_pm_suspend+0x0/0x170 @ 1, parent: 0000:00:01.0").is_empty());
}

#[test]
fn a_kernel_crash_in_an_nvidia_task_or_module_is_one_finding_and_others_stay_silent() {
    // ich777/unraid-nvidia-driver#3: a page fault while nvidia-smi was in the kernel.
    let loud = testing::loud_lines(&[
        "Feb 19 21:53:17 Dragon kernel: BUG: unable to handle page fault for address: ffffc90011110200",
        "Feb 19 21:53:17 Dragon kernel: #PF: supervisor write access in kernel mode",
        "Feb 19 21:53:17 Dragon kernel: #PF: error_code(0x0002) - not-present page",
        "Feb 19 21:53:17 Dragon kernel: Oops: 0002 [#1] PREEMPT SMP NOPTI",
        "Feb 19 21:53:17 Dragon kernel: CPU: 5 PID: 9577 Comm: nvidia-smi Tainted: P           O      5.19.17-Unraid #2",
        "Feb 19 21:53:17 Dragon kernel: Hardware name: System manufacturer System Product Name/ROG STRIX B450-F GAMING II, BIOS 5003 02/03/2023",
    ], false);
    assert_eq!(loud.len(), 1, "{loud:#?}");
    assert_eq!(
        loud[0].origin.line, 1,
        "the finding starts at the crash header"
    );
    assert!(loud[0].title.contains("nvidia-smi"), "{}", loud[0].title);

    // A soft lockup whose frames are in nvidia_uvm.
    let loud = testing::loud_lines(&[
        "[ 5021.1] watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python3:4242]",
        "[ 5021.2] CPU: 3 PID: 4242 Comm: python3 Tainted: P           OE     6.5.0-14-generic #14~22.04.1-Ubuntu",
        "[ 5021.3] RIP: 0010:uvm_va_block_make_resident+0x1a2/0x5e0 [nvidia_uvm]",
    ], false);
    assert_eq!(loud.len(), 1, "{loud:#?}");
    assert!(loud[0].title.contains("nvidia_uvm"), "{}", loud[0].title);

    // A crash in someone else's code on a machine with the NVIDIA modules loaded: silent.
    let f = scan(&[
        "[  463.506574] BUG: kernel NULL pointer dereference, address: 0000000000000040",
        "[  463.506581] Oops: 0000 [#1] PREEMPT SMP NOPTI",
        "[  463.506590] Modules linked in: nvidia_uvm(POE) nvidia_drm(POE) nvidia_modeset(POE) nvidia(POE) btusb ext4",
        "[  463.506600] CPU: 2 PID: 1187 Comm: systemd-udevd Tainted: P           OE     6.8.0 #1",
        "[  463.506610] RIP: 0010:ext4_readdir+0x3c/0x9a0 [ext4]",
        "[  463.506620] Call Trace:",
        "[  463.506630]  iterate_dir+0x8b/0x1a0",
        "[  463.506640]  __x64_sys_getdents64+0x7a/0x120",
        "[ 3021.755145] watchdog: BUG: soft lockup - CPU#7 stuck for 23s! [pytest:25222]",
        "[ 3021.755150] CPU: 7 PID: 25222 Comm: pytest Not tainted 5.4.0 #1",
    ]);
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
}

#[test]
fn a_kernel_warning_from_nvidia_source_is_a_trace_in_any_header_form() {
    for (line, module) in [
        // NVIDIA/open-gpu-kernel-modules (g corpus): the classic header, module in brackets.
        ("[ 2596.378589] WARNING: CPU: 87 PID: 4035 at /build/source/kernel-open/nvidia-drm/nvidia-drm-crtc.h:335 __nv_drm_handle_flip_event+0x14c/0x228 [nvidia_drm]", "nvidia_drm"),
        // Debian's NVIDIA packaging list: the packager's shortened copy, no module in brackets.
        ("WARNING at nvidia-drm/nvidia-drm-drv.c:1221 nv_drm_revoke_modeset_permission+0x327/0x340", "nvidia_drm"),
        // Newer kernels put the source first and the CPU last.
        ("[ 12.5] WARNING: kernel-open/nvidia-uvm/uvm_va_block.c:4242 at uvm_va_block_make_resident+0x1a2/0x5e0, CPU#3: python3/4242", "nvidia_uvm"),
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert!(f[0].title.contains(module), "{line}: {}", f[0].title);
    }
    // Someone else's warning, and another program's "WARNING:" sentence about NVIDIA: silent.
    for line in [
        "[ 3.1] WARNING: CPU: 0 PID: 1 at drivers/gpu/drm/i915/display/intel_display.c:123 intel_modeset_init+0x2c/0x40 [i915]",
        "WARNING: nvidia-installer was forced to guess the X library path '/usr/lib' and X module path '/usr/lib/xorg/modules'",
    ] {
        assert!(loud(line).is_empty(), "{line}");
    }
}

/// R595's Xid 154 action for GPUs in a multi-node NVLink (IMEX) domain is read as its own
/// action, not as an unknown text, and is critical: the whole domain must be recovered.
#[test]
fn xid_154_recover_imex_domain() {
    let f = scan(&["NVRM: Xid (PCI:0000:1b:00): 154, GPU recovery action changed from 0x0 (None) to 0x5 (Recover IMEX Domain)"]);
    let f = f
        .iter()
        .find(|f| f.xid == Some(154))
        .unwrap_or_else(|| panic!("no Xid 154 in {f:#?}"));
    assert_eq!(f.severity, Severity::Critical);
    let s = format!("{:?}", f.detail);
    assert!(s.contains("RecoverImexDomain"), "{s}");
    assert_eq!(
        crate::model::RecoveryAction::from_text("Recover IMEX Domain").describe(),
        "recover the IMEX domain (every node sharing its NVLink memory)"
    );
    assert_eq!(
        crate::model::RecoveryAction::from_text("System Reboot Required"),
        crate::model::RecoveryAction::SystemReboot
    );
    assert_eq!(
        crate::model::RecoveryAction::from_text("Bus Reset Required"),
        crate::model::RecoveryAction::BusReset
    );
}

/// A crash report whose only NVIDIA link is its task: named in a lockup header's brackets, or
/// an NVIDIA device's threaded interrupt handler in the `Comm:` line (real lines, public
/// reports).
#[test]
fn a_crash_in_an_nvidia_task_is_the_drivers() {
    let lockup = testing::read(
        &["Jun 03 10:40:15 pop-os kernel: watchdog: BUG: soft lockup - CPU#2 stuck for 104s! [nvidia-modeset/:1314]"],
        true,
    );
    assert_eq!(lockup.len(), 1, "{lockup:#?}");
    assert_eq!(lockup[0].module.as_deref(), Some("nvidia_modeset"));
    assert!(lockup[0].severity >= Severity::Warning);

    let irq = testing::read(
        &[
            "Nov 15 07:37:53 chaoran-zenbook kernel: BUG: unable to handle page fault for address: 0000000000001a81",
            "Nov 15 07:37:53 chaoran-zenbook kernel: #PF: supervisor read access in kernel mode",
            "Nov 15 07:37:53 chaoran-zenbook kernel: Oops: 0000 [#2] PREEMPT SMP PTI",
            "Nov 15 07:37:53 chaoran-zenbook kernel: CPU: 11 PID: 1094 Comm: irq/181-nvidia Tainted: P      D W  OE     5.3.11-1-MANJARO #1",
            "Nov 15 07:37:53 chaoran-zenbook kernel: RIP: 0010:exit_thread+0x12/0xc0",
        ],
        true,
    );
    assert_eq!(irq.len(), 1, "{irq:#?}");
    assert_eq!(irq[0].origin.line, 1, "the report starts at its header");
    assert_eq!(irq[0].module.as_deref(), Some("nvidia"));

    // Another driver's interrupt thread is not the driver's.
    let other = testing::read(
        &[
            "kernel: BUG: unable to handle page fault for address: 0000000000001a81",
            "kernel: CPU: 11 PID: 1094 Comm: irq/33-iwlwifi Tainted: P      D W  OE     5.3.11-1-MANJARO #1",
        ],
        false,
    );
    assert!(other.is_empty(), "{other:#?}");
}

/// A kernel warning whose header names another module and whose next line, no message of its
/// own, names the NVIDIA module it is about (real lines, a public report): one finding from the
/// header. The same warning without that line is not the driver's.
#[test]
fn a_warning_is_the_drivers_when_a_line_of_it_names_the_module() {
    let lines = [
        "[ 2643.243066] ------------[ cut here ]------------",
        "[ 2643.243081] WARNING: CPU: 2 PID: 1090 at /build/linux-Uuaskm/linux-3.18.6/drivers/gpu/drm/drm_ioctl.c:143 drm_setversion+0x176/0x180 [drm]()",
        "[ 2643.243123] No drm_driver.set_busid() implementation provided by nvidia_frontend_exit_module [nvidia]. Use drm_dev_set_unique() to set the unique name explicitly.",
        "[ 2643.243124] Modules linked in:",
    ];
    let found = testing::read(&lines, true);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].origin.line, 2);
    assert_eq!(found[0].module.as_deref(), Some("nvidia"));
    assert_eq!(found[0].origin.lines, 2);

    let without = testing::read(&[lines[0], lines[1], lines[3]], true);
    assert!(without.is_empty(), "{without:#?}");

    // The daemon reads the same report as kernel records, messages without prefixes.
    let mut c = super::Classifier::new();
    let mut live = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let msg = l.split_once("] ").map_or(*l, |(_, m)| m);
        let at = super::LineOrigin {
            seq: Some(i as u64),
            ts_usec: Some(2_643_243_000 + i as u64),
            ..super::LineOrigin::default()
        };
        c.push(msg, &at, &mut live);
    }
    c.flush(&mut live);
    assert_eq!(live.len(), 1, "{live:#?}");
    assert_eq!(live[0].module.as_deref(), Some("nvidia"));
}

/// Multi-line driver messages whose first line carries no error word (real lines, public
/// reports): the GPU that needs the open kernel modules (its second line indented, with or
/// without the tag), and the missing interrupt line with the driver's BIOS advice below it.
#[test]
fn multi_line_driver_messages_are_one_finding() {
    for second in [
        "               NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
        "               installed in this system requires use of the NVIDIA open kernel modules.",
        "[    5.559842] NVRM: installed in this system requires use of the NVIDIA open kernel modules.",
    ] {
        let found = testing::read(
            &[
                "[    5.559842] NVRM: The NVIDIA GPU 0000:02:00.0 (PCI ID: 10de:2c58)",
                second,
                "[    5.559858] NVRM: GPU 0000:02:00.0: RmInitAdapter failed! (0x22:0x56:884)",
            ],
            true,
        );
        assert_eq!(found.len(), 2, "{second}: {found:#?}");
        assert_eq!(found[0].title, "GPU requires the NVIDIA open kernel modules");
        assert_eq!(found[0].origin.lines, 2, "{second}");
        assert_eq!(found[0].pci.map(|p| p.to_string()).as_deref(), Some("0000:02:00.0"));
        assert_eq!(found[1].kind, FindingKind::DriverInitFailure);
    }

    let irq = testing::read(
        &[
            "[   60.644750] NVRM: Can't find an IRQ for your NVIDIA card!",
            "[   60.644757] NVRM: Please check your BIOS settings.",
            "[   60.644764] NVRM: [Plug & Play OS] should be set to NO",
            "[   60.644771] NVRM: [Assign IRQ to VGA] should be set to YES",
            "[   60.644781] nvidia: probe of 0000:01:00.0 failed with error -1",
        ],
        true,
    );
    assert_eq!(irq.len(), 2, "{irq:#?}");
    assert_eq!(irq[0].kind, FindingKind::DriverInitFailure);
    assert_eq!(irq[0].origin.lines, 4);
    assert_eq!(irq[1].kind, FindingKind::DriverInitFailure);
}

/// A firmware-first (APEI) hardware error record: the firmware reports a GPU's PCIe error in a
/// block of `[Hardware Error]` lines (real lines, a public write-up of a replay-timer error on
/// an NVIDIA GPU). It is one finding about the device the record names, as bad as the record
/// says; the same record for another vendor's device is not a GPU's.
#[test]
fn a_firmware_error_record_of_a_gpu_is_one_finding() {
    let record = |severity: &str, vendor: &str| -> Vec<String> {
        [
            "{8}[Hardware Error]: Hardware error from APEI Generic Hardware Error Source: 514",
            "{8}[Hardware Error]: It has been corrected by h/w and requires no further action",
            &format!("{{8}}[Hardware Error]: event severity: {severity}"),
            "{8}[Hardware Error]:  Error 0, type: corrected",
            "{8}[Hardware Error]:  fru_text: PcieError",
            "{8}[Hardware Error]:   section_type: PCIe error",
            "{8}[Hardware Error]:   port_type: 1, legacy PCI end point",
            "{8}[Hardware Error]:   command: 0x0406, status: 0x0010",
            "{8}[Hardware Error]:   device_id: 0000:e3:00.0",
            &format!("{{8}}[Hardware Error]:   vendor_id: {vendor}, device_id: 0x2bb5"),
            "{8}[Hardware Error]:   aer_cor_status: 0x00001000, aer_cor_mask: 0x00000000",
            "nvidia 0000:e3:00.0: aer_status: 0x00001000, aer_mask: 0x00000000",
        ]
        .map(str::to_string)
        .to_vec()
    };
    for (severity, expect) in [
        ("corrected", Severity::Info),
        ("recoverable", Severity::Warning),
        ("fatal", Severity::Critical),
    ] {
        let lines = record(severity, "0x10de");
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        let found = testing::read(&refs, true);
        assert_eq!(found.len(), 1, "{severity}: {found:#?}");
        assert_eq!(found[0].kind, FindingKind::PcieAer);
        assert_eq!(found[0].severity, expect, "{severity}");
        assert_eq!(found[0].origin.line, 1);
        assert_eq!(found[0].origin.lines, 11);
        assert_eq!(
            found[0].pci.map(|p| p.to_string()).as_deref(),
            Some("0000:e3:00.0")
        );
    }
    let lines = record("fatal", "0x8086");
    let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
    let other = testing::read(&refs[..11], true);
    assert!(other.is_empty(), "{other:#?}");
}

/// A crash in core kernel code on a kernel whose only out-of-tree modules are NVIDIA's is the
/// driver's (the unseen rounds' labelling rule, and what kernel developers answer such a report
/// with). The same crash with another out-of-tree module loaded, or with its instruction pointer
/// in another driver, is not; read as `scan` reads, through the prefilter.
#[test]
fn a_core_kernel_crash_on_a_kernel_only_nvidia_taints_is_the_drivers() {
    let modern = |modules: &str| {
        vec![
            "[ 8812.101] BUG: unable to handle page fault for address: ffffb1e0c0a3f000".to_string(),
            "[ 8812.102] #PF: supervisor read access in kernel mode".to_string(),
            "[ 8812.103] Oops: 0000 [#1] PREEMPT SMP NOPTI".to_string(),
            "[ 8812.104] CPU: 12 PID: 3391 Comm: python3 Tainted: P           OE      6.5.0-35-generic #35~22.04.1-Ubuntu".to_string(),
            "[ 8812.105] RIP: 0010:memcpy_orig+0x31/0x140".to_string(),
            "[ 8812.106] Call Trace:".to_string(),
            "[ 8812.107]  <TASK>".to_string(),
            format!("[ 8812.108] Modules linked in: {modules}"),
            "[ 8812.109] CR2: ffffb1e0c0a3f000".to_string(),
        ]
    };
    let read = |lines: &[String]| {
        let refs: Vec<&str> = lines.iter().map(String::as_str).collect();
        testing::read(&refs, true)
    };
    let f = read(&modern(
        "nvidia_uvm(POE) nvidia_drm(POE) nvidia_modeset(POE) nvidia(POE) btusb ext4 mlx5_core",
    ));
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].origin.line, 1);
    assert_eq!(
        f[0].shape,
        Some(crate::classify::shape_id::CORE_CRASH_NVIDIA_TAINTED)
    );
    assert!(f[0].severity >= Severity::Warning);
    // Another out-of-tree module: no longer NVIDIA's alone.
    let f = read(&modern("zfs(PO) nvidia(POE) ext4"));
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
    // The fault in another driver's code (an old kernel's `IP:` line), NVIDIA merely loaded.
    let f = scan(&[
        "[   19.067885] BUG: unable to handle kernel NULL pointer dereference at 0000000000000010",
        "[   19.067889] IP: [<ffffffffc01cc246>] amdgpu_bo_list_set+0x196/0x3d0 [amdgpu]",
        "[   19.067905] PGD 0 ",
        "[   19.067907] Oops: 0000 [#2] SMP ",
        "[   19.067908] Modules linked in: hid_logitech_hidpp snd_usb_audio nvidia(POE) amdgpu psmouse",
    ]);
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
    // arm64, a Raspberry Pi with a GTX 1080, right after the driver failed to initialise it.
    let f = testing::read(
        &[
            "[   38.523167] Unable to handle kernel write to read-only memory at virtual address ffffffc0096dc3e1",
            "[   38.532214] Mem abort info:",
            "[   38.579212] Internal error: Oops: 9600004f [#1] PREEMPT SMP",
            "[   38.584860] Modules linked in: bnep hci_uart btbcm bluetooth ecdh_generic ecc 8021q garp stp llc nvidia_drm(PO) nvidia_modeset(PO) nvidia(PO) brcmfmac bcm2835_isp(C) bcm2835_codec(C) brcmutil bcm2835_v4l2(C) vc4",
        ],
        true,
    );
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].origin.line, 1);
    // A hung task is no crash: its module list decides nothing.
    let f = testing::read(
        &[
            "[  242.1] INFO: task kworker/3:1:120 blocked for more than 120 seconds.",
            "[  242.2] Modules linked in: nvidia(POE)",
        ],
        true,
    );
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
}

#[test]
fn every_crash_header_is_found_by_a_literal() {
    // A header the trace reader knows but no literal finds is never read (`kernel BUG at` was
    // not, for want of the colon of `BUG:`).
    let lits = crate::classify::prefilter::candidate_literals();
    for h in super::shapes::CRASH_HEADERS {
        assert!(lits.iter().any(|l| h.contains(l)), "{h:?}");
    }
    // A die line is a header wherever its literal is, and only a die line is.
    for (line, at) in [
        (
            "[61437.188055] divide error: 0000 [#1] PREEMPT SMP",
            Some(15),
        ),
        (
            "Nov 27 05:43:22 vertex kernel: Oops: 0000 [#1] PREEMPT SMP NOPTI",
            Some(31),
        ),
        ("[  317.617675] invalid opcode: 0000 [#1] SMP ", Some(15)),
        (
            "[ 1.0] Internal error: Oops: 96000004 [#1] PREEMPT SMP",
            Some(23),
        ),
        ("[ 1.0] stack segment: 0000 [#1] SMP PTI", Some(7)),
        ("[ 1.0] see issue [#1] for details", None),
        ("[ 1.0] Oops: 0000 [#x] SMP", None),
        ("[ 1.0] Oops: zz [#1] SMP", None),
        ("[ 1.0] 0000 [#1] SMP", None),
        // A character of several bytes right before the words, or as the words.
        ("[ 1.0] x\u{d7}Oops: 0000 [#1] SMP", Some(10)),
        ("[ 1.0] \u{e9}: 0000 [#1] SMP", None),
        ("\u{2026}Oops: 0000 [#1] SMP", Some(3)),
        // A bracket before the die line does not hide it.
        ("[ 1.0] see [#12] Oops: 0000 [#1] SMP", Some(17)),
    ] {
        assert_eq!(super::shapes::die_start(line), at, "{line}");
        if at.is_some() {
            assert!(line.contains(super::shapes::DIE_LITERAL));
            assert!(lits.contains(&super::shapes::DIE_LITERAL));
        }
    }
    // A sanitizer report in NVIDIA's source holds `nvidia`; elsewhere it is no header.
    let ubsan = "UBSAN: array-index-out-of-bounds in build/nvidia/535.171.04/build/nvidia-uvm/uvm_pmm_gpu.c:2038:44";
    assert!(super::shapes::is_nvidia_sanitizer_report(ubsan));
    assert!(lits.iter().any(|l| ubsan.contains(l)));
    assert!(!super::shapes::is_nvidia_sanitizer_report(
        "UBSAN: shift-out-of-bounds in drivers/gpu/drm/amd/display/dc/core/dc.c:1234:5"
    ));
    // A BUG_ON report in NVIDIA's suspend helper (round w's real lines), read through the
    // prefilter as `scan` reads it: one finding from its header on, whatever ordinary line comes
    // between.
    let loud = testing::loud_lines(&[
        "Aug 23 12:46:38 fish kernel: kernel BUG at lib/list_debug.c:23!",
        "Aug 23 12:46:38 fish kernel: fbcon: Taking over console",
        "Aug 23 12:46:38 fish kernel: invalid opcode: 0000 [#1] PREEMPT SMP NOPTI",
        "Aug 23 12:46:38 fish kernel: CPU: 5 PID: 15384 Comm: nvidia-sleep.sh Tainted: P           OE      6.4.11-200.fc38.x86_64 #1",
        "Aug 23 12:46:38 fish kernel: RIP: 0010:__list_add_valid+0x42/0xa0",
    ], true);
    assert_eq!(loud.len(), 1, "{loud:#?}");
    assert!(loud[0].origin.raw[0].contains("kernel BUG at"), "{loud:#?}");
    assert!(loud[0].module.is_some(), "{loud:#?}");
}

/// Round `aa`: an Xid line whose address the reporter cut out whole, parentheses and all, still
/// gives the Xid and its words, in each of the driver's spacings; a text that only names an Xid
/// is no Xid line.
#[test]
fn an_xid_line_without_its_address_still_gives_the_xid() {
    for (line, xid) in [
        (
            "NVRM: Xid: 154, GPU recovery action changed to 0x2 (Node Reboot Required)",
            154,
        ),
        ("[ 512.4] NVRM: Xid: 79, GPU has fallen off the bus.", 79),
        (
            "Jan  3 10:00:01 gpu kernel: NVRM: Xid:  48, pid=311, name=python3, An uncorrectable double bit error",
            48,
        ),
    ] {
        let f = testing::loud_line(line, true);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::Xid, "{line}");
        assert_eq!(f[0].xid, Some(xid), "{line}");
        assert_eq!(f[0].pci, None, "{line}");
    }
    let f = testing::loud_line(
        "NVRM: Xid: 154, GPU recovery action changed to 0x2 (Node Reboot Required)",
        true,
    );
    assert!(f[0].message.contains("Node Reboot Required"), "{f:?}");
    assert!(testing::loud_line("the Xid: field of the report", true).is_empty());
}

/// Round `aa`: a firmware (APEI) PCIe error record pasted from its `device_id` line on, without
/// the record's head, is still the record of the device it names when its vendor line says
/// NVIDIA; the same cut record of another vendor's device is not reported.
#[test]
fn a_firmware_pcie_record_without_its_head_is_read_by_its_device() {
    let nvidia = [
        "[Thu Apr  9 04:50:00 2026] {3}[Hardware Error]:   device_id: 0000:01:00.0",
        "[Thu Apr  9 04:50:00 2026] {3}[Hardware Error]:   slot: 0",
        "[Thu Apr  9 04:50:00 2026] {3}[Hardware Error]:   secondary_bus: 0x00",
        "[Thu Apr  9 04:50:00 2026] {3}[Hardware Error]:   vendor_id: 0x10de, device_id: 0x2204",
    ];
    let f: Vec<Finding> = testing::read(&nvidia, true)
        .into_iter()
        .filter(|f| f.kind == FindingKind::PcieAer)
        .collect();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        f[0].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:01:00.0")
    );
    assert_eq!((f[0].origin.line, f[0].origin.lines), (1, 4), "{f:?}");
    let other: Vec<String> = nvidia
        .iter()
        .map(|l| l.replace("0x10de", "0x8086"))
        .collect();
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    assert!(testing::read(&other, true).is_empty());
}

#[test]
fn a_log_naming_endless_addresses_keeps_the_classifiers_memory_bounded() {
    // Every Xid line names its GPU; a corrupted or hostile log handed to `scan` may name a new
    // address on every line. The maps keyed by address stop growing at their bounds, and the
    // lines past them are still read.
    let mut c = super::Classifier::new();
    let mut out = Vec::new();
    let n = 3 * super::MAX_NVIDIA_DEVICES;
    for i in 0..n {
        let line = format!(
            "NVRM: Xid (PCI:{:04x}:{:02x}:00): 13, pid=1, name=a, Graphics Exception",
            i / 256,
            i % 256
        );
        let at = super::LineOrigin {
            line: i as u64 + 1,
            seq: None,
            ts_usec: None,
            timestamp: None,
        };
        c.push(&line, &at, &mut out);
    }
    c.flush(&mut out);
    assert_eq!(out.len(), n, "every line is still read");
    assert_eq!(c.nvidia_devices.len(), super::MAX_NVIDIA_DEVICES);
    assert!(c.gpus.len() <= super::MAX_GPUS);
}

/// The API mismatch message read from whichever of its lines a paste kept (round `ae`): a head
/// cut before its versions, or a later line alone, is the API mismatch; the lines after it fold
/// into one finding, and a whole message is still one finding.
#[test]
fn an_api_mismatch_is_read_from_any_of_its_lines() {
    for lines in [
        &["NVRM: API mismatch: the client has the version"][..],
        &["[   31.147688] NVRM: make sure that this kernel module and all NVIDIA driver"][..],
        &["NVRM: components have the same version."][..],
        &[
            "[ 12.1] NVRM: API mismatch: the client has the version 550.90.07, but",
            "[ 12.1] NVRM: this kernel module has the version 550.54.14.  Please",
            "[ 12.1] NVRM: make sure that this kernel module and all NVIDIA driver",
            "[ 12.1] NVRM: components have the same version.",
        ][..],
        // The head lost: the rest is one finding from its first line.
        &[
            "[ 12.1] NVRM: this kernel module has the version 550.54.14.  Please",
            "[ 12.1] NVRM: make sure that this kernel module and all NVIDIA driver",
            "[ 12.1] NVRM: components have the same version.",
        ][..],
        &[
            "[ 12.1] NVRM: make sure that this kernel module and all NVIDIA driver",
            "[ 12.1] NVRM: components have the same version.",
        ][..],
    ] {
        let f = scan(lines);
        assert_eq!(f.len(), 1, "{lines:?}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::ApiMismatch, "{lines:?}");
        assert_eq!(f[0].severity, Severity::Critical, "{lines:?}");
        assert_eq!(f[0].origin.line, 1, "{lines:?}");
        assert_eq!(f[0].origin.lines as usize, lines.len(), "{lines:?}");
    }
}

/// The driver's 64-bit BAR message (round `ae`): its first line has no error word, and the GPU is
/// not brought up; the explanation lines under it fold in.
#[test]
fn the_64_bit_bar_message_is_an_initialisation_failure_with_its_explanation() {
    let f = scan(&[
        "[ 7768.998937] NVRM: This is a 64-bit BAR mapped above 4GB by the system",
        "NVRM: BIOS or the Linux kernel, but the PCI bridge",
        "NVRM: immediately upstream of this GPU does not define",
        "NVRM: a matching prefetchable memory window.",
        "[ 7768.998938] NVRM: This may be due to a known Linux kernel bug. Please",
        "NVRM: see the README section on 64-bit BARs for additional",
        "NVRM: information.",
    ]);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::DriverInitFailure);
    assert_eq!(f[0].severity, Severity::Critical);
    assert_eq!(f[0].origin.lines, 7, "{f:?}");
}

/// A module loader's failure for an NVIDIA module in systemd's "could not find" wording (round
/// `ae`), beside its "could not insert" one; another module in the same words is not ours.
#[test]
fn systemds_loader_that_finds_no_nvidia_module_is_read() {
    let f = loud(
        "Oct 02 08:56:17 lilith systemd-modules-load[336]: Failed to find module 'nvidia-uvm'",
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::DriverInitFailure);
    assert_eq!(f[0].module.as_deref(), Some("nvidia-uvm"));
    assert!(
        loud("Oct 02 08:56:17 lilith systemd-modules-load[336]: Failed to find module 'zfs'")
            .is_empty()
    );
}

/// NVIDIA's user-space driver that cannot open a GPU's device file (round `ae`, a Tesla short of
/// power): read through the prefilter and the prefix split, as `scan` reads it.
#[test]
fn a_device_file_the_user_space_driver_cannot_open_is_read() {
    let f = testing::loud_line(
        "NVIDIA: could not open the device file /dev/nvidia0 (Input/output error).",
        true,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, FindingKind::DriverError);
    assert!(f[0].title.contains("/dev/nvidia0"), "{}", f[0].title);
    assert!(f[0].title.contains("Input/output error"), "{}", f[0].title);
}

/// Round at's undefined-behaviour sanitizer report in nvidia-uvm, read through the prefilter as
/// `scan` reads it: one finding from its header (which names the module's source) on, named by the
/// module of the package's build tree, not the package's folder above it. The same report in
/// another module's source stays quiet.
#[test]
fn a_sanitizer_report_in_nvidia_source_is_read_from_its_header() {
    // ollama/ollama#3903.
    let f = testing::loud_lines(&[
        "[   48.005440] ------------[ cut here ]------------",
        "[   48.005441] UBSAN: array-index-out-of-bounds in build/nvidia/535.171.04/build/nvidia-uvm/uvm_pmm_gpu.c:2038:44",
        "[   48.005443] index 0 is out of range for type 'uvm_gpu_chunk_t *[*]'",
        "[   48.005445] CPU: 24 PID: 3014 Comm: ollama Tainted: P           O       6.8.0-31-generic #31-Ubuntu",
        "[   48.005448] Call Trace:",
        "[   48.005450]  <TASK>",
        "[   48.005458]  uvm_pmm_gpu_alloc+0x2f5/0x6d0 [nvidia_uvm]",
    ], true);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(
        f[0].origin.line, 2,
        "the finding starts at the sanitizer's header"
    );
    assert!(f[0].title.contains("nvidia_uvm"), "{}", f[0].title);
    let f = testing::read(&[
        "[  20.1] UBSAN: shift-out-of-bounds in drivers/gpu/drm/amd/display/dc/core/dc.c:1234:5",
        "[  20.2] shift exponent 64 is too large for 64-bit type 'long unsigned int'",
    ], false);
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
    testing::quiet_unfiltered("UBSAN: this sentence is not in any source");
}

#[test]
fn a_record_whose_lines_a_console_joined_with_the_kernel_escape_is_read_as_its_lines() {
    // siderolabs/extensions#227: Talos's console prints a kernel record as it reads it from
    // `/dev/kmsg`, its newlines still written `\x0a`.
    let f = scan(&[
        "kern:    info: [2023-09-14T03:08:37.409886757Z]: nvidia 0000:00:10.0: vgaarb: changed VGA decodes: olddecodes=none,decodes=none:owns=io+mem",
        "kern: warning: [2023-09-14T03:08:37.411164757Z]: NVRM: The NVIDIA GPU 0000:00:10.0 (PCI ID: 10de:1b38)\\x0aNVRM: installed in this system is not supported by the\\x0aNVRM: NVIDIA 535.54.03 driver release.\\x0aNVRM: Please see 'Appendix A - Supported NVIDIA GPU Products'\\x0aNVRM: in this release's README, available on the operating system\\x0aNVRM: specific graphics driver download page at www.nvidia.com.",
    ]);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].title, "GPU not supported by the installed driver");
    assert_eq!(f[0].origin.line, 2);
}

/// Round `at`: an oops whose `BUG:` line the paste cut off starts at its die line, and its
/// instruction pointer in nvidia-modeset makes it the driver's; under a `BUG:` header the die line
/// is a line of that report, not a second one.
#[test]
fn an_oops_is_read_from_its_die_line_where_its_header_was_cut() {
    // dunst-project/dunst#785, whose header was cut (the report starts at its die line, line
    // 3), and the same report under its header (one report from line 1).
    let cut: &[&str] = &[
        "Nov 27 05:43:22 vertex kernel: #PF: supervisor read access in kernel mode",
        "Nov 27 05:43:22 vertex kernel: #PF: error_code(0x0000) - not-present page",
        "Nov 27 05:43:22 vertex kernel: Oops: 0000 [#1] PREEMPT SMP NOPTI",
        "Nov 27 05:43:22 vertex kernel: CPU: 3 PID: 585 Comm: Xorg Tainted: P           OE     5.9.10-arch1-1 #1",
        "Nov 27 05:43:22 vertex kernel: RIP: 0010:_nv002670kms+0x60/0x100 [nvidia_modeset]",
    ];
    let whole: &[&str] = &[
        "[ 5.0] BUG: kernel NULL pointer dereference, address: 0000000000000010",
        "[ 5.0] #PF: supervisor read access in kernel mode",
        "[ 5.0] Oops: 0000 [#1] SMP NOPTI",
        "[ 5.0] CPU: 2 PID: 95917 Comm: python3 Tainted: P           OE     5.4.0-1043-azure #45",
        "[ 5.0] RIP: 0010:_nv002670kms+0x60/0x100 [nvidia_modeset]",
    ];
    for (lines, first) in [(cut, 3), (whole, 1)] {
        let f = testing::loud_lines(lines, true);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].origin.line, first, "{f:#?}");
        assert_eq!(f[0].module.as_deref(), Some("nvidia_modeset"));
    }
    // A die line whose report names no NVIDIA module stays quiet.
    let f = testing::read(
        &[
            "[61437.188055] divide error: 0000 [#1] PREEMPT SMP",
            "[61437.188084] Modules linked in: dm_mod xfs bbswitch(O) ip6table_filter",
            "[61437.188090] RIP: 0010:ext4_readdir+0x3c/0x9a0 [ext4]",
        ],
        true,
    );
    assert!(f.iter().all(|f| f.severity < Severity::Warning), "{f:#?}");
}
