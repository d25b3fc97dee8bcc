//! Classifier tests for the classes of lines that unseen round `ak` (GPU containers beyond plain
//! Docker, driver builds on kernel updates, monitoring agents) showed read badly, each on the
//! round's real lines and on others of its class.

use super::testing;
use crate::model::{FindingKind, Severity};

/// The NVIDIA stack a GPU container needs, missing or not configured on the node, as each engine
/// says it: a CDI device of any NVIDIA kind that no specification names, containerd without the
/// `nvidia` runtime, the CDI specification not generated, the toolkit's CLI or `nvidia-smi` not
/// installed where a runtime or validator runs it, Nomad's plugin unable to list the GPUs. The
/// same words about another vendor's device or program stay quiet.
#[test]
fn a_nodes_missing_nvidia_container_stack_is_read_in_every_engines_words() {
    for line in [
        "      Warning  Failed     10s (x2 over 10s)  kubelet            Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: could not apply required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: unresolvable CDI devices management.nvidia.com/gpu=GPU-e78e68c0-4e6a-737e-f9cc-4223fe50aead",
        "      Warning  Failed     86s (x26 over 6m37s)  kubelet            Error: failed to create containerd container: CDI device injection failed: unresolvable CDI devices k8s.gpu.nvidia.com/device=gpu-1",
        r#"Feb 19 13:45:49 xi containerd[14192]: time="2026-02-19T13:45:49.346103748+01:00" level=error msg="RunPodSandbox failed" error="failed to create shim task: device cold plug failed: cold plug: CDI device injection failed: unresolvable CDI devices nvidia.com/pgpu=vfio1""#,
        r#"      Warning  FailedCreatePodSandBox  12s (x10 over 2m11s)  kubelet            Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for "nvidia" is configured"#,
        r#"kubelet[1311]: E0505 18:42:19.812688    1311 pod_workers.go:949] "Error syncing pod, skipping" err="failed to \"CreatePodSandbox\" with CreatePodSandboxError: \"Failed to create sandbox for pod: rpc error: code = Unknown desc = failed to get sandbox runtime: no runtime for \\\"nvidia\\\" is configured\"""#,
        r#"Jan 25 00:45:43 Pallas nvidia-ctk[1600]: time="2026-01-25T00:45:43+11:00" level=error msg="failed to generate CDI spec: failed to create device CDI specs: failed to construct device spec generators: failed to initialize NVML: Driver Not Loaded""#,
        r#"ERRO[0000] failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND "#,
        r#"FATA[0000] exec: "nvidia-container-cli": executable file not found in $PATH"#,
        r#"time="2021-11-17T07:42:32Z" level=info msg="Error: error validating toolkit installation: exec: \"nvidia-smi\": executable file not found in $PATH""#,
        "chroot: failed to run command 'nvidia-smi': No such file or directory",
        "2024-02-03T00:54:32.268-0500 [ERROR] client.device_mgr.nomad-device-nvidia: failed to get fingerprint nvidia devices: plugin=nvidia-gpu @module=nvidia-gpu",
    ] {
        let f = testing::one_of_kind(line, FindingKind::DriverError);
        assert_eq!(f.severity, Severity::Warning, "{line}");
    }
    for line in [
        "Error: failed to inject CDI devices: unresolvable CDI devices amd.com/gpu=all (on a node with nvidia cards)",
        r#"failed to get sandbox runtime: no runtime for "kata" is configured (nvidia runtime present)"#,
        r#"FATA[0000] exec: "runc": executable file not found in $PATH (nvidia)"#,
        "chroot: failed to run command 'nvidia-smi-helper': Permission denied",
        "2024-02-03T00:54:32.268-0500 [INFO]  client.device_mgr.nomad-device-nvidia: fingerprinted nvidia devices: count=8",
    ] {
        testing::quiet(line);
    }
}

/// A distribution's wrapper renames the toolkit's CLI (`nvidia-container-cli.real`): its errors
/// read as the CLI's own do, a driver failure loud and the container's set-up quiet.
#[test]
fn the_container_clis_renamed_binary_is_read_as_the_cli() {
    let l = "Warning  Failed     5s (x3 over 19s)  kubelet            Error: failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: nvidia-container-cli.real: initialization error: driver error: failed to process request: unknown";
    testing::one_of_kind(l, FindingKind::DriverError);
    let setup = "stderr: nvidia-container-cli.real: mount error: file creation failed: /var/lib/docker/overlay2/abc/merged/usr/bin/nvidia-smi: file exists: unknown";
    testing::quiet(setup);
}

/// The container's own set-up failing under the NVIDIA hook (cgroup device rules, a sandbox's
/// mount or capability limits, the loader cache inside the image) and the runtimes' lines that
/// only repeat that a hook exited are not the GPU's state: they stay quiet, as the hook's own
/// set-up errors always have.
#[test]
fn a_containers_own_setup_failing_under_the_nvidia_hook_stays_quiet() {
    for line in [
        "nvidia-container-cli: mount error: mount operation failed: /tmp/enroot/pccl+containertest+0.1/usr/lib/firmware/nvidia/470.57.02: operation not permitted",
        "[ERROR] nvidia-container-cli: ldcache error: process /usr/sbin/ldconfig failed with error code: 1",
        "FATAL:   container creation failed: nvidia-container-cli failed with exit status 1: nvidia-container-cli: permission error: capability change failed: operation not permitted",
        "[ERROR] /etc/enroot/hooks.d/98-nvidia.sh exited with return code 1",
        "Error: OCI runtime error: error executing hook `/usr/bin/nvidia-container-runtime-hook` (exit code: 1)",
    ] {
        testing::quiet(line);
    }
}

/// The driver not building or not loading after a kernel update, as each builder says it:
/// akmods, a distribution's DKMS hook naming the module, make inside the module's DKMS tree
/// (targets with spaces in their brackets too), and the installer on a Secure Boot machine whose
/// key the kernel does not trust. Another module's build, and the installer's advice, are quiet.
#[test]
fn the_driver_failing_to_build_or_load_after_a_kernel_update_is_read() {
    for (line, sev) in [
        ("Building and installing nvidia-kmod [FAILED]", Severity::Warning),
        ("Building DKMS module 'nvidia-367.35' for kernel-4.7.2_1... FAILED!", Severity::Warning),
        ("DKMS module 'nvidia-367.35' failed to build, please check /var/lib/dkms", Severity::Warning),
        ("make[2]: *** [/var/lib/dkms/nvidia/435.27.08/build/Kbuild:181: module_symvers_sanity_check] Error 1", Severity::Warning),
        ("ERROR: The kernel module failed to load, because it was not signed by a key that is trusted by the kernel. Please try installing the driver again, and sign the kernel module when prompted to do so.", Severity::Critical),
    ] {
        let f = testing::one_of_kind(line, FindingKind::DriverInitFailure);
        assert_eq!(f.severity, sev, "{line}");
    }
    for line in [
        "Building and installing nvidia-kmod [  OK  ]",
        "Building DKMS module 'vboxhost-6.1.26' for kernel-5.13.12_1... FAILED! (nvidia host)",
        "make[2]: Leaving directory '/var/lib/dkms/nvidia/435.27.08/build'",
        "  CC [M]  /var/lib/dkms/nvidia/435.27.08/build/nvidia/nv.o",
    ] {
        testing::quiet(line);
    }
}

/// A monitor that finds no NVML library to load (`nvtop`-like tools) says the driver's user
/// space is missing where it runs.
#[test]
fn a_monitor_finding_no_nvml_library_is_read() {
    testing::one_of_kind(
        "NVML library is not installed or not found at the default path.",
        FindingKind::DriverError,
    );
}

/// The GPU's DMA faulting in the IOMMU, on the GPU's own name, and the driver's words for a
/// mapping the GPU cannot make or a call that broke its locking rules, are driver errors; an
/// IOMMU notice about another device, or the driver's debug chatter about its mappings, is
/// quiet, by the classifier's rules and not only because the prefilter drops it. Round al's
/// lines.
#[test]
fn iommu_faults_and_impossible_mappings_of_the_gpu_are_read() {
    for line in [
        "[172391.638261] nvidia 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0018 address=0x4d7201180 flags=0x0020]",
        "Sep 21 09:59:59 runtime kernel: nvidia 0000:07:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0003 address=0x80000040 flags=0x0020]",
        "[ 3661.211951] NVRM: memdescMapIommu: 0x8000000d2ff0000-0x8000000d2ff0fff is not addressable by GPU 0x100 [0x0-0x7fffffffffff]",
        "NVRM: _kbusCreateStaticBar1IOMMUMapping: The peer DMA address 0x6000400000 is not aligned at 0x20000000",
        "[  854.764480] NVRM rmapiAllocWithSecInfo: RMAPI_GPU_LOCK_INTERNAL alloc requested without holding the RMAPI lock",
    ] {
        testing::one_of_kind(line, FindingKind::DriverError);
    }
    for line in [
        "[172391.638255] amd_iommu_report_page_fault: 10432 callbacks suppressed",
        "[ 7460.483919] ahci 0000:81:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x001c address=0xd0826240 flags=0x0020]",
        "   3315 Nov 26 22:38:10 Android kernel: NVRM: memdescPrintMemdesc: Has additional IOMMU mapping for IOVA space 0x100 starting @ 0xff4df000",
        "[411161.565307] NVRM: VM: nv_alloc_pages: 1 pages, nodeid -1",
    ] {
        testing::quiet_unfiltered(line);
    }
}

/// FreeBSD's words for the NVIDIA driver failing: its kernel linker refusing the module built
/// for another kernel, and its DRM's error form (`[drm ERROR :func] [nvidia-drm] ...`).
#[test]
fn freebsds_module_and_drm_failures_are_read() {
    let f = testing::one_of_kind(
        "KLD nvidia.ko: depends on kernel - not available or version mismatch",
        FindingKind::DriverInitFailure,
    );
    assert!(f.title.contains("nvidia"), "{}", f.title);
    testing::one_of_kind(
        "[drm ERROR :__nv_drm_gem_nvkms_memory_prime_get_sg_table] [nvidia-drm] [GPU ID 0x00000100] Cannot create sg_table for NvKmsKapiMemory 0x0xfffff8038b2c1a08",
        FindingKind::DriverError,
    );
    for line in [
        "KLD nvidia.ko: loaded at 0xffffffff82e00000",
        "KLD if_em.ko: depends on kernel - not available or version mismatch",
        "[drm ERROR :drm_atomic_helper_wait_for_flip_done] [CRTC:51:crtc-0] flip_done timed out",
    ] {
        testing::quiet_unfiltered(line);
    }
}

/// The device plugin's verdict after a health event, on its own line and as it follows the Xid it
/// saw: the GPU is withdrawn from scheduling. Another resource's quoted name is quiet.
#[test]
fn the_device_plugins_unhealthy_verdict_is_read() {
    let f = testing::one_of_kind(
        "'nvidia.com/gpu' device marked unhealthy: GPU-e3dbf294-2783-f38b-4274-5bc836df5be1",
        FindingKind::DriverError,
    );
    assert!(f.title.contains("GPU-e3dbf294"), "{}", f.title);
    let read = testing::loud_lines(
        &[
            "I0624 22:58:05.486697       1 health.go:185] XidCriticalError: Xid=79 on Device=GPU-adb24b25-1db1-436e-d958-ddee5da83d07; marking device as unhealthy.",
            "I0624 22:58:05.486727       1 server.go:276] 'nvidia.com/gpu' device marked unhealthy: GPU-adb24b25-1db1-436e-d958-ddee5da83d07",
        ],
        true,
    );
    assert_eq!(read.len(), 2, "{read:#?}");
    testing::quiet_unfiltered("I0624 22:58:05.486727       1 server.go:276] 'example.com/fpga' device marked unhealthy: FPGA-1");
}

/// The legacy drivers' and old tools' words for an NVIDIA module that does not load: the X
/// driver's older "load" wording, the X loader naming NVIDIA's file by its path, insmod naming the
/// module's file, a module tool that finds no NVIDIA module, and modprobe's failed install command
/// for it (the module named inside the sentence is no driver tag). Other modules, rmmod finding
/// the module in use and modprobe ignoring an option are quiet. Round an's lines.
#[test]
fn old_drivers_and_tools_failing_to_load_nvidias_modules_are_read() {
    for line in [
        "[  1574.862](EE) NVIDIA: Failed to load the NVIDIA kernel module. Please check your",
        "(EE) Failed to load /usr/local/lib/xorg/modules/xlibre-25.0/drivers/nvidia_drv.so: /usr/local/lib/xorg/modules/xlibre-25.0/drivers/nvidia_drv.so: Undefined symbol \"TimerForce\"",
        "[    75.235] (EE) Failed to load /usr/lib64/nvidia-bumblebee/xorg/modules/extensions/libglx.so: libnvidia-tls.so.346.35: cannot open shared object file: No such file or directory",
        "insmod: ERROR: could not insert module /root/opt/nvidia/390.77/1967.3.0/lib64/modules/4.14.88-coreos/kernel/drivers/video/nvidia/nvidia.ko: Unknown symbol in module",
        "modinfo: ERROR: Module nvidia not found.",
        "Error running install command 'modprobe -i nvidia-legacy-304xx ' for module nvidia: retcode 127",
    ] {
        assert!(!testing::loud_line(line, true).is_empty(), "{line}");
    }
    for line in [
        "[    75.235] (EE) Failed to load /usr/lib/xorg/modules/libglamoregl.so: libGL.so.1: cannot open shared object file",
        "insmod: ERROR: could not insert module /lib/modules/6.1/extra/vboxdrv.ko: Invalid module format",
        "rmmod: ERROR: Module nvidia_drm is in use",
        "rmmod: ERROR: Module nvidia is in use by: nvidia_modeset",
        "modprobe: WARNING: could not find option 'NVreg_Foo' for module nvidia: ignored",
    ] {
        testing::quiet_unfiltered(line);
    }
}

/// The driver's "not compatible" is an error word: a mapping it cannot make, and the
/// unsupported-GPU message in its other wording, read as one finding with its explanation lines
/// (as the `is not supported` wording is). Round aq's lines.
#[test]
fn the_drivers_not_compatible_is_an_error_and_ends_the_unsupported_gpu_message() {
    let f = testing::one_of_kind(
        "Feb 27 19:22:25 nvidia-arch kernel: NVRM: dmaAllocMapping_GM107: Virtual address 0xACE0000 is not compatible with page size 0x200000 or page offset 0x0.",
        FindingKind::DriverError,
    );
    assert_eq!(f.severity, Severity::Warning);
    let read = testing::loud_lines(
        &[
            "NVRM: The NVIDIA GPU 0000:09:00.0 (PCI ID: 10de:1b80)",
            "NVRM: This NVIDIA driver is not compatible with this NVIDIA GPU",
            "NVRM: because it does not include the required GPU.",
        ],
        true,
    );
    assert_eq!(read.len(), 1, "{read:#?}");
    assert_eq!(read[0].shape, Some(super::shape_id::NOT_SUPPORTED));
    assert_eq!(read[0].origin.line, 1);
    assert_eq!(read[0].origin.lines, 3);
    assert_eq!(
        read[0].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:09:00.0")
    );
    testing::quiet_unfiltered("NVRM: dmaAllocMapping_GM107: Virtual address 0xACE0000 is compatible with page size 0x200000.");
}

/// The PCI core refusing a power-state change is the GPU's failure under the NVIDIA driver's
/// name (the driver's probe fails on a card that stays in D3); under the PCI core's own name or
/// another driver's (`nvidia-gpu` is the USB-C controller's I2C driver) it stays context, as
/// earlier rounds label it.
#[test]
fn a_refused_power_state_change_under_the_nvidia_driver_is_read() {
    let f = testing::one_of_kind(
        "[    8.008226] nvidia 0000:03:00.0: Refused to change power state, currently in D3",
        FindingKind::DriverError,
    );
    assert_eq!(
        f.pci.map(|p| p.to_string()).as_deref(),
        Some("0000:03:00.0")
    );
    for line in [
        "[1084456.746765] nvidia-gpu 0000:09:00.3: Refused to change power state, currently in D3",
        "      Nov 12 13:21:51 nostromo kernel: pci 0000:01:00.0: Refused to change power state, currently in D0",
        "[1084456.807851] xhci_hcd 0000:09:00.2: Refused to change power state, currently in D3",
    ] {
        testing::quiet_unfiltered(line);
    }
}

/// gdrcopy's kernel module (`gdrdrv`, NVIDIA's GPUDirect copy driver) tags its lines with no
/// space after the colon, the function after it in newer releases: its failures are read, its
/// load banners are quiet, and the module loader's lines about it keep their reading.
#[test]
fn gdrcopys_kernel_module_failures_are_read_and_its_banners_are_quiet() {
    let f = testing::one_of_kind(
        "gdrdrv:nvidia_p2p_get_pages(va=704fe0000 len=327680 p2p_token=0 va_space=0) failed [ret = -22]",
        FindingKind::DriverError,
    );
    assert_eq!(f.module.as_deref(), Some("gdrdrv"));
    let f = testing::one_of_kind(
        "[12345.678901] gdrdrv:__gdrdrv_pin_buffer:nvidia_p2p_get_pages(va=7f0000000000 len=65536 p2p_token=0 va_space=0 callback=0x0) failed [ret = -22]",
        FindingKind::DriverError,
    );
    assert_eq!(f.module.as_deref(), Some("gdrdrv"));
    // The message is the module's text: the tag and the function that printed it are not.
    assert!(
        f.message.starts_with("nvidia_p2p_get_pages("),
        "{}",
        f.message
    );
    testing::one_of_kind(
        "[55580.715176] gdrdrv: Unknown symbol nvidia_p2p_get_pages (err -22)",
        FindingKind::DriverInitFailure,
    );
    for line in [
        "[691802.796281] gdrdrv:gdrdrv_init:loading gdrdrv version 2.5 built for proprietary NVIDIA driver",
        "[691802.796286] gdrdrv:gdrdrv_init:device registered with major number 490",
        "[691802.796290] gdrdrv:gdrdrv_init:Persistent mapping will be used",
        "[691802.796290] xgdrdrv:init:nvidia_p2p_get_pages failed",
    ] {
        testing::quiet_unfiltered(line);
    }
}
