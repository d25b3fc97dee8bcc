//! Classifier tests for the classes of line that the trackers of GPU cluster tooling (DCGM
//! exporter, NVSentinel, the container toolkit, health agents) and the kernel captures those
//! agents keep showed read badly: each feeds saved-log lines through the literal prefilter and
//! the prefix split, as `scan` does, with the harmless neighbours that must stay quiet.

use super::testing;
use crate::model::Finding;

fn loud(line: &str) -> Vec<Finding> {
    testing::loud_line(line, true)
}

#[test]
fn an_error_naming_its_gpu_as_gpu_at_pci_is_not_an_identity_line() {
    // After a run of Xid 119s the driver stops printing each GSP RPC error and says the GPU
    // needs a reset; the sentence names the GPU with the same words as the identity line.
    let l = "[Sun Feb 23 16:24:36 2025] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset.";
    assert!(!loud(l).is_empty(), "{l}");
    // The identity lines themselves stay quiet, with or without a UUID we can parse.
    for quiet in [
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d",
        "[1084456.074554] NVRM: GPU at PCI:0000:09:00: GPU-26fba6b2-9e52-006e-68db-4ce18382a5ea",
        "[Mon Mar  6 21:09:45 2023] NVRM: GPU at PCI:0000:61:00: GPU-81f5d81e-7906-c145-3def-82e281d7b260",
    ] {
        let f = loud(quiet);
        assert!(f.is_empty(), "{quiet}: {f:?}");
    }
}

/// Round `t` (enterprise Kubernetes and HPC stacks): a container runtime that quotes its hook's
/// stderr whole puts the NVIDIA hook's error after an escaped newline (`\n`) inside one line.
#[test]
fn a_hook_error_after_an_escaped_newline_is_read() {
    let l = r#"4月 28 15:08:10 master-02 containerd[3862899]: time="2026-04-28T15:08:10.867655874+08:00" level=error msg="StartContainer for \"8c9e\" failed" error="failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: error during container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: detection error: nvml error: unknown error: unknown""#;
    let f = loud(l);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].origin.raw[0].starts_with("nvidia-container-cli: detection error"),
        "{f:?}"
    );
    // A path or a name that merely ends in `\n` before the word is still no tag.
    assert!(loud(r"C:\\nvidia: something").is_empty());
}

/// The stacks' own words for the NVIDIA pieces they need being absent or unable to start:
/// the container toolkit's CLI, NVML's library, DCGM, and a driver that cannot be replaced.
#[test]
fn the_stacks_missing_nvidia_pieces_are_driver_errors() {
    for l in [
        "ch-fromhost: 204: ch-fromhost: nvidia-container-cli: not found",
        "slurmstepd: error: pyxis:     [ERROR] Command not found: nvidia-container-cli, see https://github.com/NVIDIA/libnvidia-container",
        r#"FATAL:   container creation failed: exec: "/usr/bin/nvidia-container-cli": stat /usr/bin/nvidia-container-cli: no such file or directory"#,
        "DEBUG 10-01 12:03:47 [__init__.py:76] Exception happens when checking CUDA platform: NVML Shared Library Not Found",
        r#"time=2025-09-09T20:19:25.195Z level=ERROR msg="Cannot init NVML library; err: Unknown Error""#,
        "W0921 16:33:36.433532 5424 metrics.cc:731] DCGM unable to start: DCGM initialization error",
        "Could not unload NVIDIA driver kernel modules, driver is in use",
        "   nvidia-container-cli: initialization error: cuda error: unknown error",
    ] {
        let f = loud(l);
        assert_eq!(f.len(), 1, "{l}: {f:?}");
        assert_eq!(f[0].kind, crate::model::FindingKind::DriverError, "{l}");
    }
    // The same tools when all is well stay quiet.
    for quiet in [
        "ch-fromhost: nvidia-container-cli found at /usr/bin/nvidia-container-cli",
        "I0921 16:33:36.433532 5424 metrics.cc:757] Collecting metrics for GPU 0: NVIDIA A100",
        "nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/x/merged/run/nvidia-persistenced/socket: no such device or address",
    ] {
        assert!(loud(quiet).is_empty(), "{quiet}");
    }
}

/// The installer's summary when it gives up, as a GPU operator's driver container prints it: no
/// driver was installed. Its pointer to the log in other words stays quiet.
#[test]
fn the_installers_failure_summary_is_a_driver_init_failure() {
    let f = loud("ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.  You may find suggestions on fixing installation problems in the README available on the Linux driver download page at www.nvidia.com.");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, crate::model::FindingKind::DriverInitFailure);
    assert!(loud("Please see the log entries 'Kernel module load error' and 'Kernel messages' at the end of the file '/var/log/nvidia-installer.log' for more information.").is_empty());
}
