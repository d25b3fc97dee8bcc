//! Classifier tests for the classes of lines that unseen round `aj` (GPU compute outside ML
//! frameworks, desktops with emulators, VR and browsers) showed read badly, each on the round's
//! real lines and on others of its class.

use super::testing;
use crate::model::{FindingKind, Severity};

/// NVML's return codes as each binding spells them: Python's exception classes under any module
/// path, a .NET or C enum's name after a failure's `status:` or `code:`, the number with NVML's
/// description of it. A lost GPU is critical; an answer ("not supported") is no fault.
#[test]
fn nvml_return_codes_are_read_in_every_bindings_spelling() {
    for (line, want) in [
        ("pynvml.nvml.NVMLError_Unknown: Unknown Error", Severity::Warning),
        (
            "pynvml.nvml.NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version mismatch.",
            Severity::Warning,
        ),
        ("  File \"x.py\", line 3, raise pynvml.nvml.NVMLError_GpuIsLost: GPU is lost", Severity::Critical),
        (
            "[2019-07-25 07:05:13] [ERROR] [NVML] System.Exception: NVML power get failed with status: GPUIsLost",
            Severity::Critical,
        ),
        (
            "[2019-07-25 07:05:13] [ERROR] [NVML] System.Exception: NVML get temp failed with code: GPUIsLost",
            Severity::Critical,
        ),
        ("NVML call failed with code: NVML_ERROR_GPU_IS_LOST", Severity::Critical),
        (
            "13:27:27:762\t1778\tNVML: cannot get fan speed, error 999 (an internal driver error occurred)",
            Severity::Warning,
        ),
        ("NVML: cannot get temperature, error 15", Severity::Critical),
    ] {
        let f = testing::one_of_kind(line, FindingKind::DriverError);
        assert_eq!(f.severity, want, "{line}");
    }
    for quiet in [
        // Answers, not faults: a passive card has no fan, a user may not read everything.
        "NVML: cannot get fan speed, error 3 (Not Supported)",
        "pynvml.nvml.NVMLError_NotSupported: Not Supported",
        "NVML power get failed with status: NotSupported",
        // No code NVML defines, or no failure around it.
        "NVML: cannot get fan speed, error 4242",
        "NVML status: GPUIsLost",
        "NVML get load failed with status: GPUIsLostAgain",
        "NVML: cannot get fan speed, error 999 and more",
    ] {
        testing::quiet(quiet);
    }
}

/// An Xid line whose reporter retyped the tag with its colon moved (`NVRM :Xid`) or the space
/// after it dropped (`NVRM:Xid`) is still an Xid, with its number and GPU. The kernel's own shapes
/// read as before.
#[test]
fn a_retyped_xid_tag_is_still_an_xid() {
    for line in [
        "NVRM :Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus",
        "NVRM : Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus",
        "Jan  3 10:00:01 node kernel: NVRM:Xid (PCI:0000:81:00): 79, GPU has fallen off the bus.",
    ] {
        let f = testing::one_of_kind(line, FindingKind::Xid);
        assert_eq!(f.xid, Some(79), "{line}");
        assert_eq!(
            f.pci.map(|p| p.to_string()).as_deref(),
            Some("0000:81:00.0"),
            "{line}"
        );
    }
    // Not an Xid after all: the retyped tag before anything else is no tag.
    testing::quiet("NVRM :notes from the reporter");
}

/// A hung task whose trace was pasted without the frames' offsets (a reporter's cleanup): the
/// bare symbols are frames inside the report, a `symbol [module]` frame ties it to the module,
/// and it is one finding over all its lines.
#[test]
fn a_trace_pasted_without_offsets_is_read_by_its_frames() {
    let lines = [
        "INFO: task sway:967 blocked for more than 1228 seconds.",
        "task:sway            state:D stack:0     pid:967   ppid:925",
        "Call Trace:",
        " __schedule",
        " schedule",
        " schedule_timeout",
        " down",
        " nvkms_ioctl_from_kapi_try_pmlock [nvidia_modeset]",
        " ApplyModeSetConfig [nvidia_modeset]",
        " nv_drm_atomic_apply_modeset_config [nvidia_drm]",
        " drm_mode_atomic_ioctl",
        "INFO: task sway:967 blocked on a semaphore likely last held by task nvidia-modeset/:727",
    ];
    let f = testing::loud_lines(&lines, true);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].module.as_deref(), Some("nvidia_modeset"), "{f:?}");
    assert_eq!(f[0].origin.lines as usize, lines.len(), "{f:?}");
    // The same report in another module's code is not the driver's.
    let other: Vec<String> = lines
        .iter()
        .map(|l| {
            l.replace("[nvidia_modeset]", "[i915]")
                .replace("[nvidia_drm]", "[i915]")
        })
        .map(|l| l.replace("nvidia-modeset/", "kworker/"))
        .collect();
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    assert!(testing::loud_lines(&other, true).is_empty());
    // A bare symbol outside a report is nothing.
    assert!(testing::loud_lines(&[" __schedule", " schedule"], true).is_empty());
}
