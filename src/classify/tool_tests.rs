//! Classifier tests for the classes of line that round `u` (monitoring tools and NVML bindings,
//! Linux gaming and video, forum threads) and the misses left from rounds `s` and `t` showed
//! read badly. Each feeds saved-log lines through the literal prefilter and the prefix split, as
//! `scan` does, with the harmless neighbours that must stay quiet.

use super::testing;
use super::testing::quiet;
use crate::model::{Finding, FindingKind, Severity};

fn loud(line: &str) -> Vec<Finding> {
    testing::loud_line(line, true)
}

/// NVML's library cannot be loaded, in the words of each kind of program that loads it: an
/// exporter, a Rust binding's panic, Python's loader, a Go program's wrapped error, gpustat's
/// summary. Every NVML client on the machine fails the same way.
#[test]
fn nvml_library_that_cannot_be_loaded_is_read_in_every_wording() {
    for l in [
        "`Failed to collect metrics: could not load NVML library`",
        r#"called `Result::unwrap()` on an `Err` value: "Failed to load NVML library: libnvidia-ml.so: cannot open shared object file: No such file or directory""#,
        "OSError: libnvidia-ml.so.1: cannot open shared object file: No such file or directory",
        "Error on querying NVIDIA devices. Use --debug flag for details",
        r#"level=error msg="failed to start collector" error="unable to load the NVML library: libnvidia-ml.so.1: cannot open shared object file""#,
        "pynvml.NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert_eq!(f[0].severity, Severity::Warning, "{l}");
        assert!(f[0].title.contains("NVML"), "{l}: {}", f[0].title);
    }
    // The library's version line and a load that worked stay quiet.
    quiet("NVML library version: 570.195");
    quiet(
        r#"time=2025-09-09T20:19:25.194Z level=INFO msg="Attempting to initialize NVML library.""#,
    );
    quiet("Loaded NVML library libnvidia-ml.so.1 (version 550.54.14)");
}

/// A tool that wraps a module loader's output in its own error (the GPU operator's validator
/// quoting modprobe) is read by the loader's words, not by the module name the wrapper says
/// first: a quiet reading of the first message in a line gives way to a later message in it.
#[test]
fn a_failure_quoted_after_a_quiet_message_in_the_same_line_is_read() {
    for l in [
        "Error: error validating driver installation: error creating symlink creator: failed to load NVIDIA kernel modules: failed to load module nvidia-modeset: exit status 1; output=modprobe: ERROR: could not insert 'nvidia_modeset': No such device",
        "time=\"2024-01-01T00:00:00Z\" level=info msg=\"nvidia-driver-ctr: loading module\" output=\"modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\"",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert!(f[0].title.contains("could not be loaded"), "{l}: {f:?}");
    }
    // A quiet line whose later words name no failure stays quiet.
    quiet("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.14  Thu Feb 22 01:25:25 UTC 2024");
    quiet("[    5.123456] nvidia-uvm: Loaded the UVM driver, major device number 508.");
}

/// One of the NVIDIA services a GPU server needs (the persistence daemon, Fabric Manager, IMEX,
/// DCGM's host engine) could not be started, in systemd's words, systemctl's, or a provisioning
/// tool's. Services a desktop may lack without harm (nvidia-powerd) stay quiet.
#[test]
fn an_nvidia_service_that_cannot_start_is_a_driver_error() {
    for l in [
        r#"fatal: [ubuntu-xenial-01]: FAILED! => {"changed": false, "msg": "Unable to start service nvidia-persistenced: Job for nvidia-persistenced.service failed because the control process exited with error code. See \"systemctl status nvidia-persistenced.service\" and \"journalctl -xe\" for details.\n"}"#,
        "Job for nvidia-fabricmanager.service failed because the control process exited with error code.",
        "Mar 20 18:49:51 dgx systemd[1]: nvidia-fabricmanager.service: Failed with result 'exit-code'.",
        "Mar 20 18:49:51 dgx systemd[1]: Failed to start nvidia-persistenced.service - NVIDIA Persistence Daemon.",
        "Mar 20 18:49:51 dgx systemd[1]: nvidia-imex.service: Main process exited, code=exited, status=1/FAILURE",
        "Mar 20 18:49:51 dgx systemd[1]: nvidia-dcgm.service: Main process exited, code=killed, status=9/KILL",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert_eq!(f[0].severity, Severity::Warning, "{l}");
    }
    quiet(
        "ago 27 14:15:42 solus systemd[1]: nvidia-powerd.service: Failed with result 'exit-code'.",
    );
    quiet("Mar 27 14:37:50 sagecactus supergfxd[1166]: Job for nvidia-powerd.service failed because the control process exited with error code.");
    quiet("Mar 20 18:49:51 dgx systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence Daemon.");
    quiet("Mar 20 18:49:51 dgx systemd[1]: nvidia-persistenced.service: Deactivated successfully.");
    quiet("Mar 20 18:49:51 dgx systemd[1]: nvidia-persistenced.service: Main process exited, code=exited, status=0/SUCCESS");
}

/// A GPU health agent's summary of an Xid (GPUd, round `r`) stands for the kernel's line: the Xid,
/// its GPU and its words. A NIC that prints its chip version as `XID 641` is no Xid.
#[test]
fn a_health_agents_xid_summary_is_an_xid() {
    let f = loud("XID 79(GPU has fallen off the bus) detected on PCI:0000:ae:00");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].xid, Some(79));
    assert_eq!(
        f[0].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:ae:00.0")
    );
    quiet("[Tue Jul 21 15:51:15 2026] r8169 0000:03:00.0 eth0: RTL8125B, 58:47:ca:7b:55:71, XID 641, IRQ 51");
    quiet("XID 79 detected on PCI:0000:ae:00");
}

/// Round `v` (scientific computing, robotics and simulation): machines being set up, in the words
/// of the installer, the old module loader, nvidia-docker and Docker without the container
/// toolkit, and NVML's failure without the space after its colon.
#[test]
fn setup_failures_of_installer_loader_and_container_runtime_are_read() {
    for l in [
        "ERROR: An NVIDIA kernel module 'nvidia-drm' appears to already be loaded in your kernel.  This may be because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon),",
        "nvidia-docker | 2018/06/29 01:40:55 Error: Could not load UVM kernel module",
        r#"docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]]."#,
        "docker: Error response from daemon: unknown or invalid runtime name: nvidia",
        "FATAL: Error inserting nvidia (/lib/modules/2.6.32-358.18.1.el6.x86_64/extra/nvidia.ko): No such device",
        ">Failed to initialize NVML:Function Not Found.",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
    }
    let f = loud("FATAL: Error inserting nvidia_uvm (/lib/modules/5.4.0/updates/dkms/nvidia-uvm.ko): Unknown symbol in module, or unknown parameter (see dmesg)");
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].title
            .contains("nvidia_uvm could not be loaded (Unknown symbol in module"),
        "{}",
        f[0].title
    );
    // Another driver's module, and Docker's other runtimes, are not ours.
    quiet("FATAL: Error inserting e1000e (/lib/modules/2.6.32/kernel/drivers/net/e1000e.ko): No such device");
    quiet("docker: Error response from daemon: unknown or invalid runtime name: runsc");
    quiet("NVIDIA: Using 24576.00 MB of virtual memory for indirect memory access.");
}

#[test]
fn the_x_drivers_glx_failure_is_read_with_its_explanation() {
    // Round w: the NVIDIA X driver finding no GLX module of its own, explained over four lines.
    let loud = testing::loud_lines(&[
        "[    14.472] (EE) NVIDIA(0): Failed to initialize the GLX module; please check in your X",
        "[    14.472] (EE) NVIDIA(0):     log file that the GLX module has been loaded in your X",
        "[    14.472] (EE) NVIDIA(0):     server, and that the module is the NVIDIA GLX module.  If",
    ], true);
    assert_eq!(loud.len(), 1, "{loud:#?}");
    assert!(loud[0].message.contains("GLX"), "{loud:#?}");
}

/// DKMS building the NVIDIA modules (round w): its failures are read where a line names the
/// NVIDIA module, its progress and status lines stay quiet.
#[test]
fn dkms_failures_of_the_nvidia_module_are_read_and_its_progress_is_quiet() {
    for l in [
        "Consult /var/lib/dkms/nvidia/580.119.02/build/make.log for more information.",
        "==> WARNING: `dkms install --no-depmod nvidia/580.119.02 -k 7.1.0-rc3-2-cachyos-rc' exited 10",
        "==> ERROR: Missing 7.0.9-arch1-1 kernel modules tree for module nvidia/580.119.02.",
        "dpkg: error processing package nvidia-dkms-580-open (--configure):",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert!(f[0].title.contains("NVIDIA"), "{l}: {}", f[0].title);
    }
    for l in [
        "==> dkms install --no-depmod nvidia/580.119.02 -k 6.18.32-1-cachyos-lts",
        "nvidia/535.113.01, 5.15.0-86-generic, x86_64: installed",
        "Signing key: /var/lib/dkms/mok.key",
        "Consult /var/lib/dkms/zfs/2.2.0/build/make.log for more information.",
        "dpkg: error processing package zfs-dkms (--configure):",
    ] {
        quiet(l);
    }
}

/// Round x: the other closing lines of a failed DKMS build of the NVIDIA module (DKMS 3's
/// autoinstall, the older Arch hook, make's own error inside the DKMS tree), mkinitcpio building
/// an image without an NVIDIA module it names, and the installer's other word order for a module
/// it could not load. Each is one table row; the same tools' lines for other modules, and make's
/// command lines that name the NVIDIA tree on every good build, stay quiet.
#[test]
fn the_nvidia_modules_build_and_initramfs_failures_are_read_and_other_modules_are_not() {
    for (l, title) in [
        (
            "dkms autoinstall on 7.1.3-4-liquorix-amd64/x86_64 failed for nvidia(10)",
            "exit status 10",
        ),
        (
            "==> Warning, `dkms install --no-depmod -m nvidia -v 455.50.10 -k 5.12.0-rc3-139-tkg-cfs' returned 10",
            "kernel 5.12.0-rc3-139-tkg-cfs",
        ),
        (
            "make[1]: *** [Makefile:1820: /var/lib/dkms/nvidia/465.24.02/build] Error 2",
            "465.24.02",
        ),
        (
            "make[2]: *** [scripts/Makefile.build:279: /var/lib/dkms/nvidia/465.24.02/build/nvidia-peermem/nvidia-ib-peermem-stub.o] Error 1",
            "Error 1",
        ),
        ("==> ERROR: module not found: `nvidia_uvm'", "initramfs"),
        ("module not found: 'nvidia_drm'`", "initramfs"),
        ("ERROR: Unable to load the 'nvidia-drm' kernel module.", "nvidia-drm"),
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::DriverInitFailure, "{l}");
        assert!(f[0].title.contains(title), "{l}: {}", f[0].title);
    }
    for l in [
        "dkms autoinstall on 6.15.2-1-liquorix-amd64/x86_64 failed for vboxhost(10)",
        "==> Warning, `dkms install --no-depmod -m zfs -v 2.2.0 -k 6.6.3-2-ck' returned 10",
        "make -j16 KERNELRELEASE=6.6.3-2-ck -C /lib/modules/6.6.3-2-ck/build M=/var/lib/dkms/nvidia/535.113.01/build",
        "make[1]: Leaving directory '/var/lib/dkms/nvidia/465.24.02/build'",
        "make[1]: *** [Makefile:1820: /var/lib/dkms/v4l2loopback/0.12.5/build] Error 2",
        "==> ERROR: module not found: `vboxdrv'",
        "ERROR: Unable to load the 'vboxdrv' kernel module.",
    ] {
        quiet(l);
    }
}

/// Round y: a piece of the driver's user space missing where a GPU is to be used, said by the
/// container hook that cannot mount a driver file and by the shell that cannot run `nvidia-smi`;
/// the hook's other mount errors and a shell missing other tools stay quiet.
#[test]
fn a_missing_piece_of_the_drivers_user_space_is_read_and_other_setup_errors_are_not() {
    for l in [
        "nvidia-container-cli: mount error: mount operation failed: /usr/bin/nvidia-smi: no such file or directory: unknown.",
        "nvidia-container-cli: mount error: stat failed: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: no such file or directory: unknown",
        "bash: nvidia-smi: command not found",
        "root@9d5cd5caa6d9:/# nvidia-smi: command not found",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::DriverError, "{l}");
        assert!(f[0].title.contains("user space"), "{l}: {}", f[0].title);
    }
    for l in [
        "nvidia-container-cli: mount error: failed to add device rules: unable to find any existing device filters attached to the cgroup: bpf_prog_query(BPF_CGROUP_DEVICE) failed: operation not permitted: unknown",
        "nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/abc/merged/usr/bin/nvidia-smi: file exists: unknown",
        "bash: nvcc: command not found",
    ] {
        quiet(l);
    }
}

/// Round `aa`: the container hook's errors that say the GPU or its driver is not there for the
/// container (no GPU adapter in WSL, a driver too old for the image's CUDA) are read; an image's
/// malformed requirement and the hook's set-up errors stay quiet.
#[test]
fn the_container_hooks_gpu_errors_are_read_and_its_setup_errors_are_not() {
    for line in [
        "nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.8, please update your driver to a newer version, or use an earlier cuda container: unknown",
        "nvidia-container-cli: initialization error: WSL environment detected but no adapters were found: unknown",
        "nvidia-container-cli: initialization error: driver rpc error: timed out: unknown",
        // As a page printed it, cut short.
        "nvidia-container-cli: initialization error: WSL environment detected but no adap",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert!(f[0].severity >= Severity::Warning, "{line}");
    }
    for line in [
        "nvidia-container-cli: requirement error: invalid expression: unknown",
        "nvidia-container-cli: initialization error: open failed: /proc/sys/kernel/overflowuid: permission denied: unknown",
        "nvidia-container-cli: container error: cgroup subsystem devices not found: unknown",
    ] {
        quiet(line);
    }
}

/// The NVIDIA installer's failures with the kernel modules, in each of its wordings (round `ac`,
/// driver installs on a cluster platform): a module that did not build, a build that left no
/// module, a module that did not load, a DKMS build or install that failed. All are read for
/// NVIDIA's modules only (the lines that name one, which the prefilter finds by `nvidia`), and
/// the installer's progress lines stay quiet.
#[test]
fn the_installers_module_failures_are_read_in_every_wording() {
    for l in [
        "ERROR: The nvidia-uvm kernel module failed to build. This kernel module is required for the proper operation of CUDA. If you do not need to use CUDA, you can try to install this driver package again with the '--no-unified-memory' option.",
        "ERROR: The nvidia-uvm kernel module was not created.",
        "ERROR: The nvidia kernel module was not created.",
        "ERROR: The nvidia-drm kernel module failed to load. This kernel module is required for the proper operation of DRM-KMS.",
        "ERROR: Failed to run '/usr/sbin/dkms build -m nvidia -v 410.73 -k 4.4.0-62-generic':",
        // Older installers quote the command in backticks (round `af`).
        "ERROR: Failed to run `/usr/sbin/dkms build -m nvidia -v 340.108 -k 5.6.13-300.fc32.x86_64`: ",
        "ERROR: Failed to install the kernel module through DKMS.  No kernel module was installed; please",
    ] {
        let f = testing::one_of_kind(l, FindingKind::DriverInitFailure);
        assert_eq!(f.severity, Severity::Critical, "{l}");
    }
    for l in [
        // Another vendor's module: no NVIDIA word, not ours.
        "ERROR: The vboxdrv kernel module failed to build.",
        "ERROR: The zfs kernel module was not created.",
        // The installer's progress lines name the same command without failing.
        "Running: dkms build -m nvidia -v 410.73 -k 4.4.0-62-generic",
        "Installing the kernel module through DKMS for nvidia 410.73",
    ] {
        quiet(l);
    }
}

/// nvidia-smi's words when NVML's library is missing (round `ad`, a distrobox container): no
/// program on the machine can query a GPU. (NVML's failure in its long name, `failed to initialize
/// NVIDIA Management Library`, is not read: its literal, the only one such a line holds, cost the
/// prefilter's first stage a third more passes on a container host's log; see
/// fixtures/unseen/README.md, round `ad`.)
#[test]
fn nvidia_smis_missing_library_is_read() {
    let l = "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.";
    testing::one_of_kind(l, FindingKind::DriverError);
}

/// The X server's own error when its NVIDIA GLX finds no NVIDIA X driver of its version (round
/// `af`, a half-installed legacy driver): found by the X server's `(EE)` mark, read only in those
/// words.
#[test]
fn the_x_servers_glx_without_an_nvidia_x_driver_is_read() {
    testing::one_of_kind(
        "[   272.035] (EE) Failed to initialize GLX extension (Compatible NVIDIA X driver not found)",
        FindingKind::DriverError,
    );
    quiet("[   272.035] (II) Initializing extension GLX");
    quiet("[   272.035] Failed to initialize GLX extension (Compatible NVIDIA X driver not found)");
}

/// Jetson's user-space GPU failures (round `ai`): Tegra's memory manager without `/dev/nvmap`,
/// a CDI request for a GPU no specification names, and the container hook missing a device node
/// of the driver. Each leaves a program or a container without the GPU.
#[test]
fn jetson_user_space_gpu_failures_are_read() {
    for l in [
        "NvRmMemInitNvmap failed with No such file or directory",
        "Jul 27 12:26:37 nixos /nix/store/jsmfi4447h39f4xrawfhajjdvnqglzqi-gdm-43.0/libexec/gdm-x-session[1085]: NvRmMemInitNvmap failed with Permission denied",
        "failed to create task for container: failed to create shim task: OCI runtime create failed: could not apply required modification to OCI specification: error modifying OCI spec: failed to inject CDI devices: unresolvable CDI devices nvidia.com/gpu=tegra: unknown",
        "nvidia-container-cli: mount error: stat failed: /dev/nvidiactl: no such file or directory",
    ] {
        testing::one_of_kind(l, FindingKind::DriverError);
    }
    // The hook's other mount errors are the container's set-up, not the GPU.
    quiet("nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/x/merged/run/nvidia-persistenced/socket: no such device or address");
}
