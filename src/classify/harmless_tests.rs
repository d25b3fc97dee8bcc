//! Classes of real lines that look like errors and are not GPU faults, each next to the real
//! error it must not be confused with. Lines are from public bug reports (the harmless-lines
//! corpus names them).

use super::shapes::{self, Shape};
use super::testing;
use super::{Classifier, LineOrigin};
use crate::model::{Finding, FindingKind, Severity};

/// Runs saved-log lines through the classifier as `scan` does (numbered lines, prefix split).
fn classify(text: &str) -> Vec<Finding> {
    testing::read(&text.lines().collect::<Vec<_>>(), false)
}

fn loud(f: &[Finding]) -> Vec<&Finding> {
    f.iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

fn is_error(s: &Shape) -> bool {
    matches!(
        s,
        Shape::DriverError { .. } | Shape::ModuleError { .. } | Shape::InitFailure { .. }
    )
}

#[test]
fn pci_interrupt_routing_notices_are_not_errors() {
    for m in [
        "nvidia 25bed32b:00:00.0: can't derive routing for PCI INT A",
        "nvidia 25bed32b:00:00.0: PCI INT A: no GSI",
        "nvidia 0000:01:00.0: PCI INT A -> GSI 16 (level, low) -> IRQ 16",
    ] {
        assert_eq!(shapes::parse(m), Shape::Harmless, "{m}");
    }
    // The PCI core failing to power the GPU up is still an error.
    assert!(is_error(&shapes::parse(
        "nvidia 0000:01:00.0: Unable to change power state from D3cold to D0, device inaccessible"
    )));
}

#[test]
fn capability_probes_answered_no_are_not_errors() {
    assert_eq!(
        shapes::parse("NVRM: nvCheckOkFailedNoLog: Check failed: Call not supported [NV_ERR_NOT_SUPPORTED] (0x00000056) returned from pEntry->pCallback(pGpu, pEntry->pCallbackParam) @ kernel_fifo.c:3021"),
        Shape::Harmless
    );
    // https://github.com/NVIDIA/dcgm-exporter/issues/657: a monitoring agent on a MIG node.
    assert_eq!(
        shapes::parse("NVRM: GPU0 nvCheckOkFailedNoLog: Check failed: Requested object not found [NV_ERR_OBJECT_NOT_FOUND] (0x00000057) returned from gisubscriptionGetGPUInstanceSubscription(pRsClient, RES_GET_HANDLE(pSubdevice), &pGPUInstanceSubscription) @ kernel_mig_manager.c:3105"),
        Shape::Harmless
    );
    // https://github.com/NVIDIA/open-gpu-kernel-modules/issues/421 and /489: working laptops.
    assert_eq!(
        shapes::parse("NVRM objClInitPcieChipset: *** Chipset Setup Function Error!"),
        Shape::Harmless
    );
    // A check with any other status, and an assertion even on "not supported", stay errors.
    for m in [
        "NVRM: nvCheckOkFailedNoLog: Check failed: Invalid data passed [NV_ERR_INVALID_DATA] (0x00000025) returned from kgspPrepareForBootstrap_HAL(pGpu, pKernelGsp, KGSP_BOOT_MODE_NORMAL) @ kernel_gsp.c:3664",
        "NVRM: GPU0 nvAssertOkFailedNoLog: Assertion failed: Call not supported [NV_ERR_NOT_SUPPORTED] (0x00000056) returned from status @ kernel_channel.c:2827",
        "NVRM: nvCheckOkFailedNoLog: Check failed: Ran out of a critical resource, other than memory [NV_ERR_INSUFFICIENT_RESOURCES] (0x0000001A) returned from kfspSendBootCommands_HAL(pGpu, pKernelFsp) @ kernel_fsp.c:1", 
    ] {
        assert!(is_error(&shapes::parse(m)), "{m}");
    }
}

#[test]
fn an_error_word_naming_a_field_is_not_a_signal() {
    let m = "NVRM _threadNodeInitTime: Bad threadStateDatabase.timeout.flags: 0x0!";
    assert!(!is_error(&shapes::parse(m)), "{:?}", shapes::parse(m));
    // The same word in the sentence is one.
    for m in [
        "NVRM kgspWaitForGfwBootOk_TU102: failed to wait for GFW_BOOT: (progress 0x0)",
        "NVRM: GPU0 _threadNodeCheckTimeout: timeout was hit",
        "NVRM: GPU 0000:01:00.0: RPC timeout. status=0x65",
    ] {
        assert!(is_error(&shapes::parse(m)), "{m}");
    }
}

#[test]
fn the_tail_of_a_quiet_multi_line_notice_is_part_of_it() {
    // https://github.com/OpenELEC/OpenELEC.tv/issues/2328
    let vga = "\
[   12.692759] NVRM: Your system is not currently configured to drive a VGA console
[   12.692769] NVRM: on the primary VGA device. The NVIDIA Linux graphics driver
[   12.692774] NVRM: requires the use of a text-mode VGA console. Use of other console
[   12.692778] NVRM: drivers including, but not limited to, vesafb, may result in
[   12.692782] NVRM: corruption and stability problems, and is not supported.";
    assert!(loud(&classify(vga)).is_empty(), "{:#?}", classify(vga));
    // The same notice as one rsyslog line with `#012` between its lines.
    let one_line = "Jan  1 00:00:12 h kernel: NVRM: Your system is not currently configured to drive a VGA console#012NVRM: on the primary VGA device. The NVIDIA Linux graphics driver#012NVRM: requires the use of a text-mode VGA console. Use of other console#012NVRM: drivers including, but not limited to, vesafb, may result in#012NVRM: corruption and stability problems, and is not supported.";
    assert!(
        loud(&classify(one_line)).is_empty(),
        "{:#?}",
        classify(one_line)
    );

    // A new message after a quiet line is judged on its own: a function name, an error word
    // first, a line not directly after, or a finished sentence before it.
    for text in [
        "NVRM: Your system is not currently configured to drive a VGA console\nNVRM: nvAssertFailedNoLog: Assertion failed: 0 @ osinit.c:1982",
        "NVRM: Your system is not currently configured to drive a VGA console\nNVRM: failed to copy vbios to system memory.",
        "NVRM: Your system is not currently configured to drive a VGA console\nsomething else\nNVRM: corruption and stability problems, and is not supported.",
        "NVRM: Persistence mode is deprecated and will be removed in a future release.\nNVRM: corruption and stability problems, and is not supported.",
    ] {
        assert_eq!(loud(&classify(text)).len(), 1, "{text}");
    }

    // Live records carry no line numbers: the tail must come within a millisecond.
    let live = |gap_usec: u64| {
        let mut c = Classifier::new();
        let mut out = Vec::new();
        for (i, m) in [
            "NVRM: drivers including, but not limited to, vesafb, may result in",
            "NVRM: corruption and stability problems, and is not supported.",
        ]
        .iter()
        .enumerate()
        {
            let at = LineOrigin {
                ts_usec: Some(12_692_778 + i as u64 * gap_usec),
                ..LineOrigin::default()
            };
            c.push(m, &at, &mut out);
        }
        out.len()
    };
    assert_eq!(live(4), 0);
    assert_eq!(live(5_000_000), 1);

    assert!(shapes::continues_sentence("on the primary VGA device."));
    assert!(!shapes::continues_sentence(
        "nvAssertFailedNoLog: Assertion failed"
    ));
    assert!(!shapes::continues_sentence(
        "os_schedule: Attempted to yield"
    ));
    assert!(!shapes::continues_sentence(
        "GPU 0000:01:00.0: RmInitAdapter failed!"
    ));
    assert!(shapes::ends_sentence("and is not supported. "));
    assert!(!shapes::ends_sentence("may result in"));
}

#[test]
fn aer_on_devices_that_are_not_gpus_is_recorded_not_raised() {
    // https://github.com/geerlingguy/raspberry-pi-pcie-devices/issues/600 (a SATA controller)
    let f = classify(
        "\
[ 58.308035] ahci 0000:01:00.0: AER: can't recover (no error_detected callback)
[ 58.315292] pcieport 0000:00:00.0: AER: device recovery failed
[ 58.321146] pcieport 0000:00:00.0: AER: Uncorrected (Non-Fatal) error received: 0000:00:00.0
[ 58.329622] pcieport 0000:00:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)
[ 58.340801] pcieport 0000:00:00.0: device [14e4:2712] error status/mask=00044000/00400000
[ 58.370330] ahci 0000:01:00.0: AER: can't recover (no error_detected callback)
[ 58.377586] pcieport 0000:00:00.0: AER: device recovery failed",
    );
    assert!(!f.is_empty());
    assert!(f.iter().all(|f| f.kind == FindingKind::PcieAer));
    assert!(loud(&f).is_empty(), "{f:#?}");

    // The same non-fatal error from a GPU, or with the GPU's own line after it, is a warning;
    // a failed recovery on the port above the GPU is critical.
    let f = classify(
        "\
pcieport 0000:00:01.2: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0
nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)
pcieport 0000:00:01.2: AER: device recovery failed",
    );
    assert_eq!(f[0].severity, Severity::Critical, "{f:#?}");
    // The switch port above it reports the failed recovery: tied to the GPU named just before,
    // even when that GPU's line was folded into the port's finding.
    let f = classify(
        "\
pcieport 0000:00:01.2: AER: Uncorrectable (Non-Fatal) error received from 0000:63:00.0
nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)
pcieport 0000:62:00.0: AER: device recovery failed",
    );
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(f[1].severity, Severity::Critical, "{f:#?}");
    assert_eq!(
        f[1].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:63:00.0")
    );
    let f = classify("nvidia 0000:17:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)");
    assert_eq!(f[0].severity, Severity::Warning);
    // A fatal error on a device not known to be a GPU stays a warning: the GPU may be below.
    let f =
        classify("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0");
    assert_eq!(f[0].severity, Severity::Warning);
}

#[test]
fn driver_states_that_stop_the_gpu_are_reported() {
    // https://github.com/NVIDIA/open-gpu-kernel-modules/issues/230: the open modules refuse a
    // GeForce GPU; the explanation folds into the one finding.
    let f = classify(
        "\
[    3.513141] NVRM: Open nvidia.ko is only ready for use on Data Center GPUs.
[    3.513144] NVRM: To force use of Open nvidia.ko on other GPUs, see the
[    3.513145] NVRM: 'OpenRmEnableUnsupportedGpus' kernel module parameter described
[    3.513145] NVRM: in the README.",
    );
    assert_eq!(loud(&f).len(), 1, "{f:#?}");
    assert_eq!(f[0].origin.lines, 4);
    // https://github.com/pop-os/pop/issues/3590: the GPU's suspend callback failed.
    assert!(is_error(&shapes::parse(
        "nvidia 0000:01:00.0: PM: pci_pm_suspend(): nv_pmops_suspend [nvidia] returns -5"
    )));
    assert!(is_error(&shapes::parse(
        "nvidia 0000:01:00.0: PM: dpm_run_callback(): pci_pm_suspend returns -5"
    )));
}

/// The optional GSP log firmware missing at boot: the driver itself says non-fatal, and newer
/// drivers ask for it at every boot, so a fleet would page on every reboot. The GSP firmware the
/// driver needs, missing, stays a critical initialisation failure.
#[test]
fn the_optional_gsp_log_firmware_missing_is_not_an_error() {
    let quiet = classify(
        "[    5.1] nvidia 0000:05:00.0: firmware: failed to load nvidia/595.71.05/gsp_log_ga10x.bin (-2)\n\
         [    5.2] NVRM: RmFetchGspRmImages: Failed to load gsp_log_*.bin, no GSP-RM logs will be printed (non-fatal)\n\
         [    5.3] nvidia 0000:01:00.0: Direct firmware load for nvidia/570.86.15/gsp_log_ga10x.bin failed with error -2\n",
    );
    assert!(loud(&quiet).is_empty(), "{quiet:#?}");
    let needed = classify(
        "[    5.5] nvidia 0000:06:00.0: loading /lib/firmware/nvidia/570.172.08/gsp_ga10x.bin failed with error -4\n",
    );
    assert_eq!(needed.len(), 1, "{needed:#?}");
    assert_eq!(needed[0].kind, FindingKind::DriverInitFailure);
    assert_eq!(needed[0].severity, Severity::Critical);
}
