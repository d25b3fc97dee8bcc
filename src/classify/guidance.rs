//! What a finding means and what to do about it, in words for the on-call. Xids take theirs from
//! the catalog; the other kinds have theirs here.

use super::{catalog, shape_id};
use crate::model::{Detail, Finding, FindingKind};

/// Meaning and next step for a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Guidance {
    pub meaning: String,
    pub action: String,
    /// NVIDIA's resolution buckets with what they ask for, for Xids the catalog knows.
    pub nvidia: Vec<String>,
}

/// Guidance for one finding.
pub fn for_finding(f: &Finding) -> Guidance {
    let mut g = match (f.kind, f.xid.and_then(catalog::lookup)) {
        (FindingKind::Xid, Some(e)) => Guidance {
            meaning: e.summary.to_string(),
            action: e.check.to_string(),
            nvidia: nvidia_buckets(e),
        },
        (FindingKind::Xid, None) => Guidance {
            meaning: format!(
                "Xid {} is not in xidwatch's catalog (NVIDIA's copy of October 2025 ends at {}); the driver is newer than the catalog.",
                f.xid.unwrap_or(0),
                catalog::XID_CODES_MAX
            ),
            action: "Look the code up in NVIDIA's current Xid catalog and read the kernel log around it; treat it as a warning until you know more.".into(),
            nvidia: Vec::new(),
        },
        (FindingKind::DriverError, _) => driver_error_guidance(f),
        (kind, _) => kind_guidance(kind),
    };
    match &f.detail {
        Some(Detail::Recovery { to, .. }) => {
            g.action = format!("The driver asks for: {}. {}", to.describe(), g.action);
        }
        Some(Detail::Nvlink5 { decode, .. }) => {
            for d in decode {
                g.nvidia.push(format!(
                    "NVLink5 decode ({} layout): unit {}, {} ({}), immediate {}, investigate {}",
                    d.layout, d.unit, d.severity, d.origin, d.immediate, d.investigatory
                ));
            }
        }
        Some(Detail::ApiMismatch {
            client_version,
            kernel_version,
        }) => {
            g.meaning = format!(
                "User-space driver {} and kernel module {} differ, so no CUDA program or nvidia-smi can talk to the GPUs.",
                or_unknown(client_version),
                or_unknown(kernel_version)
            );
        }
        _ => {}
    }
    g
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "(version not in the log)"
    } else {
        s
    }
}

fn nvidia_buckets(e: &catalog::XidEntry) -> Vec<String> {
    let mut out = Vec::new();
    // The same bucket for both steps (Xid 48, 145, ...) is said once.
    let cells: &[(&str, &str)] = if e.immediate == e.investigatory {
        &[("immediate and investigate", e.immediate)]
    } else {
        &[("immediate", e.immediate), ("investigate", e.investigatory)]
    };
    for &(label, cell) in cells {
        if cell.is_empty() {
            continue;
        }
        let meanings: Vec<String> = catalog::bucket_meanings(cell)
            .iter()
            .map(|b| format!("{}: {}", b.name, b.meaning))
            .collect();
        if meanings.is_empty() {
            out.push(format!("{label} {cell}"));
        } else {
            out.push(format!("{label} {}", meanings.join(" / ")));
        }
    }
    out
}

/// Driver errors without an Xid come in families that call for different first steps; the shape
/// that read the line says which (its family, and for a module's error the module).
fn driver_error_guidance(f: &Finding) -> Guidance {
    let shape = f.shape.unwrap_or("");
    let display = matches!(f.module.as_deref(), Some("nvidia-drm" | "nvidia-modeset"));
    let family = shape_id::family(shape);
    let (meaning, action) = if family == "trace" {
        (
            "A task was stuck, or the kernel printed a call trace, inside an NVIDIA kernel module (named in the title, with the task).",
            "A task hung in nvidia or nvidia_uvm usually means the GPU stopped answering: look for an Xid, GSP or AER line around it, capture nvidia-bug-report.sh, then drain the node; only a reboot frees the stuck task.",
        )
    } else if family == "modeset" || (shape == shape_id::MODULE_ERROR && display) {
        (
            "The NVIDIA display driver reported an error (display engine, flip or modeset ownership).",
            "Display errors alone affect the desktop, not compute jobs; many of them next to Xids or GSP errors point at the GPU itself.",
        )
    } else if family == "tool" {
        (
            "nvidia-smi or NVML could not reach the driver, or one GPU (text pasted from the tool's output).",
            "Check that the kernel module is loaded and matches the user-space driver (cat /proc/driver/nvidia/version, modinfo nvidia); a missing device handle for one GPU means that GPU dropped off: look for Xid 79 or AER on it.",
        )
    } else if shape == shape_id::NEEDS_OPEN_MODULES {
        (
            "The GPU is driven only by NVIDIA's open kernel modules (every Blackwell GPU, and later), and the proprietary ones are loaded: the GPU is left unused.",
            "Install the open kernel modules of the same driver version (the -open package, or the .run installer with -m=kernel-open) and reboot.",
        )
    } else if shape == shape_id::NOT_SUPPORTED {
        (
            "The installed driver does not support this GPU (a legacy GPU, or the open kernel modules on a GPU without GSP); the GPU is left unused.",
            "Install the driver branch that supports it (the legacy branch, or the proprietary kernel modules) if the GPU is meant to be used.",
        )
    } else if shape == shape_id::GSP_CRASH {
        (
            "The GSP firmware on the GPU crashed or its watchdog fired; the driver printed the firmware's registers.",
            "Capture nvidia-bug-report.sh before any reset; the GPU needs a reset (the node a reboot if that fails); if it repeats, update the driver and open a case with the report.",
        )
    } else {
        return kind_guidance(FindingKind::DriverError);
    };
    Guidance {
        meaning: meaning.into(),
        action: action.into(),
        nvidia: Vec::new(),
    }
}

fn kind_guidance(kind: FindingKind) -> Guidance {
    let (meaning, action) = match kind {
        FindingKind::FallenOffBus => (
            "The GPU stopped answering on the PCIe bus: every job on it is lost and the driver cannot reach it until it is reset or the machine power-cycled.",
            "Before rebooting, save the kernel log and check the link: is the device still in lspci, at what link speed and width, any AER errors on its root port? Then drain the node and have the card, riser and power checked.",
        ),
        FindingKind::DriverInitFailure => (
            "The NVIDIA driver could not bring up a GPU (or any GPU): no job can use it.",
            "Compare the kernel module and user-space driver versions, check that the firmware files and module match the running kernel (DKMS), and read the kernel log around the failure.",
        ),
        FindingKind::ApiMismatch => (
            "The user-space driver and the kernel module are different versions, so nothing can talk to the GPUs.",
            "Usually a driver upgrade without a module reload: finish the upgrade (or roll it back) so both match, at a time of your choosing.",
        ),
        FindingKind::DriverError => (
            "The NVIDIA driver reported an error without an Xid: often GSP firmware timeouts or RPC failures that precede an Xid 119/120.",
            "Read the kernel log around it; if it repeats or an Xid follows, treat the GPU as faulty and drain it.",
        ),
        FindingKind::PcieAer => (
            "PCIe Advanced Error Reporting saw an error on this device's link.",
            "Corrected errors in small numbers are normal; uncorrected ones, or a steady stream, point at the link: check link speed and width against their maximum and reseat or replace the riser.",
        ),
        FindingKind::Sxid => (
            "An NVSwitch reported an error on the NVLink fabric.",
            "Fatal SXids take the fabric (and the GPUs behind it) down until the fabric manager recovers it; check the fabric manager log and the link named in the message.",
        ),
        FindingKind::GpuIdentity => (
            "The driver named this GPU's UUID or board serial.",
            "Nothing to do: later findings for this address carry it.",
        ),
        FindingKind::KmsgOverrun => (
            "Kernel log records were overwritten in the ring buffer before xidwatch could read them (the headline says how many); a GPU fault logged in them was not seen.",
            "Read the journal (journalctl -k) for the lost period; if it repeats, the log is flooded: find the source of the flood in the lines after the gap, or enlarge the ring buffer (log_buf_len=).",
        ),
        FindingKind::KmsgSequence => (
            "A kernel log record's sequence number jumped far ahead or went backwards; the kernel never numbers its records that way.",
            "Check what writes the log xidwatch reads ([kmsg] path): a rewritten or concatenated file explains it. Records after it are still read.",
        ),
        FindingKind::EccError => (
            "NVML reported an ECC error on the GPU's memory.",
            "Check ECC counters and remapped rows (nvidia-smi -q -d ECC,ROW_REMAPPER); double-bit errors need the GPU drained and reset.",
        ),
        FindingKind::GpuLost => (
            "NVML lost contact with the GPU.",
            "Treat it as fallen off the bus: check lspci, link state and the kernel log, then drain the node.",
        ),
        FindingKind::GpuMissing => (
            "A GPU at this PCI address is on the bus but the driver cannot reach it, or it left the bus since the last look.",
            "Compare lspci -D -d 10de: with nvidia-smi -L and read the kernel log for this address; a GPU the driver lost needs the node drained and a person to decide on a reboot.",
        ),
        FindingKind::NvmlUnavailable => (
            "NVML cannot reach the NVIDIA driver (the headline carries NVML's error): xidwatch sees no NVML events and cannot name GPUs by serial until it can; it still reads every Xid in the kernel log.",
            "Driver not loaded: check lsmod and the kernel log. Version mismatch: the module and the library differ after an upgrade; drain and reboot when a person decides. Insufficient permissions: check the service user's access to /dev/nvidia*.",
        ),
        FindingKind::ConfigRejected => (
            "A changed xidwatch config did not validate, so it was refused; the previous config stays in force. The headline names the file, the line and the key, never the value.",
            "Run `xidwatch check --config FILE` on the host for the whole error, fix the key it names, and save again (or send SIGHUP).",
        ),
        FindingKind::DriverUnresponsive => (
            "A call into the NVIDIA driver (through NVML) did not return: the driver is wedged, often because a GPU is failing or a process is stuck in the driver. Tools such as nvidia-smi will hang too.",
            "Read the kernel log and the stuck tasks listed here (their kernel stacks show where the driver holds them); do not start more GPU tools, they will hang as well. Drain the node; recovering usually takes a reboot, at a time of your choosing. xidwatch keeps watching the kernel log meanwhile.",
        ),
        FindingKind::GpuTemperature => (
            "The GPU has stayed at or above its temperature threshold for the whole sustain window, close to where the hardware slows it down (and, further up, shuts it off).",
            "Check the airflow and fans of this chassis, the inlet temperature, and whether the neighbours run hot too (a room or rack problem) or only this GPU (its heatsink, thermal paste or fan). nvidia-smi -q -d TEMPERATURE,PERFORMANCE shows the thresholds and whether it is already slowing down.",
        ),
        FindingKind::GpuThrottling => (
            "The hardware itself has been slowing this GPU down (HW slowdown, HW thermal slowdown or power brake) for several polls in a row: jobs on it run slower than they should.",
            "nvidia-smi -q -d PERFORMANCE names the active reasons. Thermal: check cooling. Power brake: the board or the chassis power supply asserted it; check the PSUs and the power cabling. HW slowdown without either: have the board checked.",
        ),
        FindingKind::PcieLinkDegraded => (
            "The GPU's PCIe link trained below its maximum generation or width while the GPU was busy (an idle GPU lowers its link to save power, so idle readings are not counted). Transfers to and from the GPU are slower, and a link that lost lanes often points at a riser, cable or slot fault.",
            "Compare LnkSta with LnkCap in lspci -vv for this address and look for AER errors on its root port. A width drop (x16 to x8 or x4) usually needs the card or riser reseated; plan it with the next maintenance.",
        ),
        FindingKind::MemoryRepair => (
            "The GPU's memory needs repair: a row remap is pending (it takes effect at the next GPU reset), a remap failed (no spare rows left in that bank), or pages wait for retirement.",
            "Pending: drain the GPU and reset it (or reboot) at a time of your choosing so the repair takes effect. Failed: the memory can no longer be repaired in place; replace the board / open an RMA. nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT shows the counters.",
        ),
        FindingKind::EccDbeIncrease => (
            "The GPU's volatile double-bit (uncorrectable) ECC count went up: data in its memory was corrupted and the process using it was likely killed.",
            "Drain the GPU, check nvidia-smi -q -d ECC,ROW_REMAPPER, and reset it so a remap takes effect; if uncorrectable errors come back, replace the board.",
        ),
        FindingKind::RecoveryAction => (
            "NVML says this GPU needs a recovery action (a GPU reset, a node reboot or a P2P drain), even if no Xid in the kernel log says so.",
            "Drain the GPU (or the node) and carry out the action NVML names, at a time of your choosing: xidwatch never resets or reboots anything itself.",
        ),
        FindingKind::PowerOverLimit => (
            "The GPU has drawn more power than its enforced limit for the whole sustain window; the board is expected to cap itself at the limit, so this points at a faulty power sensor or limit.",
            "Check nvidia-smi -q -d POWER for the limits in force and the draw, and whether the power-brake throttle reason is also active; have the board checked if it persists.",
        ),
        FindingKind::PersistenceModeOff => (
            "Persistence mode is off: the driver tears the GPU down when the last client exits and initialises it again for the next one, which slows job starts and can hide a GPU that fails its initialisation until a job tries it.",
            "Enable the NVIDIA persistence daemon (nvidia-persistenced) in the node's provisioning; xidwatch only reports it.",
        ),
        FindingKind::InventoryChanged => (
            "The GPU inventory differs from the previous boot's: a board was swapped (its serial changed), a GPU is gone, the driver changed, or a link's maximum is lower than before.",
            "Confirm the change was planned (a board replacement, a driver upgrade). An unplanned one, especially a lower maximum link or a GPU gone, needs the hardware checked; `xidwatch inventory --diff` shows the whole difference.",
        ),
        FindingKind::GpuHeldNoProcess => (
            "The GPU has been busy, or has held memory, for the whole window while NVML lists no process on it: a process in a pid namespace NVML does not report, a context left behind by a job that died, or a leftover from another container. No new job can use it fully.",
            "Find the owner: nvidia-smi --query-compute-apps and the runbook's views below, the scheduler's record of the last job on this GPU, and the containers on the node. Let that job end, or have its owner stop it; if nothing holds it, drain the node and reset the GPU at a time of your choosing. xidwatch kills nothing.",
        ),
        FindingKind::GpuHeldByGoneProcess => (
            "NVML lists a process on this GPU that is not running: the pid does not exist in xidwatch's pid namespace, or it is a zombie (exited, not reaped). Its GPU memory and context stay allocated until the driver lets them go.",
            "Find the owner from the pid, user and job named here (or the scheduler's record), and have the parent reap the zombie or the job's owner stop what is left of the job. If nothing is left to stop, drain the node and reset the GPU. xidwatch kills nothing.",
        ),
        FindingKind::GpuMemoryGrowth => (
            "One process's GPU memory has only grown through the whole window, without ever falling: a leak is likely, and the process will run out of GPU memory.",
            "Tell the owner (pid, user and job named here); they decide whether to restart the job. xidwatch kills nothing.",
        ),
        FindingKind::FabricNotRegistered => (
            "The GPU has not completed its NVSwitch / NVL fabric registration (not started, still in progress, or failed) for the whole window: CUDA cannot start work on it, so jobs fail without any Xid line.",
            "Check the Fabric Manager (systemctl status nvidia-fabricmanager and its log) and nvidia-smi -q for the fabric state; restart the Fabric Manager, or drain the node and reset the GPUs with NVIDIA's procedure for NVSwitch systems.",
        ),
        FindingKind::ServiceDown => (
            "A systemd unit the GPUs depend on is down, failed, or restarting in a loop. Without nvidia-fabricmanager an NVSwitch system's GPUs cannot start CUDA work (no Xid is logged); without nvidia-imex multi-node jobs cannot share memory; without nvidia-persistenced or DCGM the GPUs work, but slower to start or unmonitored.",
            "Read the unit's status and its last journal lines below for why it stopped; fix the cause and start it again (`systemctl start UNIT`). xidwatch never starts or stops a service itself; the incident ends when xidwatch sees the unit active again.",
        ),
        FindingKind::Xid => ("", ""),
    };
    Guidance {
        meaning: meaning.into(),
        action: action.into(),
        nvidia: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(log: &str) -> Finding {
        let lines: Vec<&str> = log.lines().collect();
        let mut f = crate::classify::testing::read(&lines, false);
        assert_eq!(f.len(), 1, "{f:#?}");
        f.remove(0)
    }

    #[test]
    fn advice_follows_the_shape_not_the_title() {
        // Real lines (fixtures/corpus): a hung task in nvidia_uvm, an nvidia-drm error, and an
        // nvidia-smi text.
        let cases = [
            (
                "[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.\n\
                 [  721.028346] Call Trace:\n\
                 [  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]",
                "stuck",
            ),
            (
                "[   33.1] [drm:nv_drm_load [nvidia_drm]] *ERROR* [nvidia-drm] [GPU ID 0x00000100] Failed to allocate NvKmsKapiDevice",
                "display",
            ),
            (
                "Failed to initialize NVML: Driver/library version mismatch",
                "nvidia-smi",
            ),
        ];
        for (log, word) in cases {
            let mut f = read(log);
            let before = for_finding(&f);
            assert!(before.meaning.contains(word), "{word}: {}", before.meaning);
            f.title = "reworded".into();
            assert_eq!(
                for_finding(&f),
                before,
                "{word}: the title chose the advice"
            );
        }
    }
}
