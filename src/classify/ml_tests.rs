//! Classifier tests for the classes of line that the trackers of ML frameworks, inference
//! servers, schedulers, WSL, vGPU hosts and Jetson boards showed read badly: each feeds saved-log
//! lines through the prefix split and the classifier, as `scan` does, and checks what comes out,
//! with the harmless neighbours of each class that must stay quiet.

use super::testing;
use super::testing::quiet;
use crate::model::{Finding, FindingKind, Severity};

fn loud(line: &str) -> Vec<Finding> {
    testing::loud_line(line, true)
}

fn reported(line: &str) {
    let f = loud(line);
    assert!(
        f.iter().any(|f| f.kind == FindingKind::DriverError),
        "{line}: {f:?}"
    );
}

#[test]
fn a_gsp_rpc_poll_that_timedout_in_one_word_is_an_error() {
    reported("192.168.11.119: kern: warning: [2026-04-22T21:27:51.291919134Z]: NVRM: _issueRpcAndWait: rpcRecvPoll timedout for fn 76 sequence 4127!");
    reported("[ 1234.567890] NVRM: _issueRpcAndWait: rpcRecvPoll timedout for fn 10 sequence 77!");
}

#[test]
fn an_nvml_failure_without_a_reason_is_reported() {
    // Triton and other servers print the bare failure, prefixed by their own level word.
    reported("Error: Failed to initialize NVML");
    reported("W0214 14:42:55.356660 2383 metrics.cc:738] Failed to initialize NVML.");
    // The usual form with its reason still reads as before.
    reported("Failed to initialize NVML: Unknown Error");
    // Succeeding, or only naming NVML, is no failure.
    quiet("I0214 14:42:55.356857 2383 metrics.cc:710] Successfully initialized NVML");
    quiet("nvidia-docker-plugin | 2019/03/04 16:56:13 Loading NVIDIA management library");
}

#[test]
fn a_reworded_cannot_reach_the_driver_is_critical() {
    for line in [
        "2017-05-12 13:32:35 INFO juju-log Unable to communicate with the NVIDIA driver.",
        "gpu-check: error: could not communicate with the NVIDIA driver",
    ] {
        let f = loud(line);
        assert!(
            f.iter()
                .any(|f| f.kind == FindingKind::DriverError && f.severity == Severity::Critical),
            "{line}: {f:?}"
        );
    }
    // Advice that merely names the driver is not a failure.
    quiet("Make sure you can communicate with the NVIDIA driver before starting the job");
}

#[test]
fn the_container_hook_failing_on_nvml_is_reported_and_its_own_errors_are_not() {
    reported("docker: Error response from daemon: OCI runtime create failed: container_linux.go:370: starting container process caused: process_linux.go:459: container init caused: Running hook #0:: error running hook: exit status 1, stdout: , stderr: nvidia-container-cli: detection error: nvml error: unknown error: unknown.");
    let mismatch = loud("nvidia-container-cli: initialization error: nvml error: driver/library version mismatch: unknown");
    assert!(
        mismatch.iter().any(|f| f.severity == Severity::Critical),
        "{mismatch:?}"
    );
    // Cgroups, mounts and missing binaries are the container setup's problems, not the GPU's.
    quiet("docker: Error response from daemon: OCI runtime create failed: container_linux.go:370: starting container process caused: process_linux.go:459: container init caused: Running hook #0:: error running hook: exit status 1, stdout: , stderr: nvidia-container-cli: container error: cgroup subsystem devices not found: unknown.");
    quiet("nvidia-container-cli: mount error: file creation failed: /var/lib/docker/overlay2/merged/usr/bin/nvidia-smi: file exists: unknown");
}

#[test]
fn an_nvidia_smi_row_reading_err_is_reported() {
    reported("|   0  ERR!                Off  | 00000000:01:00.0  On |                  N/A |");
    reported("| ERR!  ERR!  ERR!    ERR! / ERR! |    202MiB /  5926MiB |     ERR!     Default |");
    // Healthy rows, and npm's own ERR!, are not.
    quiet(
        "|   0  Tesla P40                      Off | 00000000:00:10.0 Off |                  Off |",
    );
    quiet(
        "| N/A   64C    P0              54W / 250W |      0MiB / 24576MiB |      0%      Default |",
    );
    quiet("npm ERR! code E404");
    quiet("npm ERR!  404  Not Found - GET https://registry.npmjs.org/nvidia-smi");
}

#[test]
fn the_vgpu_host_modules_bracketed_tag_is_a_module_tag() {
    reported("[] [nvidia-vgpu-vfio] a581675d-19eb-4f50-aa64-6aeb378c58c3: start failed. status: 0x0 Timeout Occured");
    reported("[ 5412.332211] [nvidia-vgpu-vfio] 0b5fd3fb-2389-4a22-ba70-52969a26b9d5: start failed. status: 0x1 Timeout Occured");
    quiet("[ 5412.332211] [nvidia-vgpu-vfio] 0b5fd3fb-2389-4a22-ba70-52969a26b9d5: vGPU migration disabled");
    // Other bracketed nvidia names stay what they were (nvidia-drm's notices have their own
    // reading).
    quiet("[drm] [nvidia-drm] [GPU ID 0x00000100] Loading driver");
}

#[test]
fn tegra_nvgpu_errors_are_read_by_their_level() {
    for line in [
        "[   70.800122] nvgpu: 17000000.gpu                nvgpu_cic_mon_init:75   [ERR]  Err inj callback registration failed: -22",
        // No error word: the [ERR] level alone says it.
        "[   70.854698] nvgpu: 17000000.gpu engine_fb_queue_set_element_use_state:144  [ERR]  FBQ last received queue element not processed yet queue_pos 0",
        "Jul 10 16:36:36 jetson-agx-orin-devkit kernel: nvgpu: 17000000.gpu       nvgpu_tsg_set_ctx_mmu_error:1069 [ERR]  TSG 8 generated a mmu fault",
    ] {
        reported(line);
    }
    // Other levels are not errors whatever their words; other tools naming nvgpu are not it.
    quiet("[    7.101010] nvgpu: 17000000.gpu          gk20a_init_pmu_setup_sw:512  [INF]  pmu timeout set to 2000 ms");
    quiet("0, Orin (nvgpu), [N/A], [N/A], [N/A], [N/A], [N/A]");
    quiet("GPU models and configuration: GPU 0: Orin (nvgpu)");
}

#[test]
fn an_nvidia_daemon_out_of_step_with_the_driver_is_reported() {
    reported("Nov 05 13:55:26 node1 nv-fabricmanager[104230]: fabric manager NVIDIA GPU driver interface version 550.127.05 don't match with driver version 550.120. Please update with matching NVIDIA driver package.");
    reported("Nov 05 13:55:26 node1 nv-fabricmanager[104230]: fabric manager NVIDIA GPU driver interface version 550.127.05 doesn't match with driver version 550.120. Please update with the matching NVIDIA driver package.");
    // The daemons' other messages, failures included, are left to their own logs.
    quiet("May 16 15:10:22 ip-192-168-38-187.us-west-2.compute.internal nv-fabricmanager[29850]: [May 16 2025 15:10:21] [INFO] [tid 30042] GPU probe request received from node Id 0 and module Id 7 GUID 0x3b");
    quiet("Nov 05 13:55:26 node1 systemd[1]: Starting NVIDIA fabric manager service...");
    quiet(
        r#"Sep 18 03:19:01 ubuntu2404 nvidia-fabricmanager-start.sh[4753]: "/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg" failed! Exit code: 1"#,
    );
    quiet("Feb 13 18:44:28 sm1 nvidia-vgpud[2009]: error: failed to send vGPU configuration info to RM: 6");
}

#[test]
fn nvmls_python_exceptions_are_read_by_their_name() {
    reported("pynvml.NVMLError_Unknown: Unknown Error");
    let lost = loud("    pynvml.NVMLError_GpuIsLost: GPU is lost");
    assert!(
        lost.iter().any(|f| f.severity == Severity::Critical),
        "{lost:?}"
    );
    reported("NVMLError_DriverNotLoaded: Driver Not Loaded");
    // Answers to a question, and the raise statement itself, are no fault.
    quiet("pynvml.NVMLError_NotSupported: Not Supported");
    quiet("pynvml.nvml.NVMLError_NoPermission: Insufficient Permissions");
    quiet("    raise NVMLError(ret)");
}
