//! Classifier tests for the classes of line that forum threads, distribution trackers and
//! vendor pages showed read badly: each feeds saved-log lines through the prefix split and the
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
fn a_kernel_line_quoted_by_another_tool_or_in_prose_is_read() {
    // A health agent's report quotes the kernel line; a pasted comment quotes it in backticks
    // or single quotes. The quote is where the message starts.
    let quoted = [
        r#"[XID found] (54 minutes ago) "NVRM: Xid (PCI:0000:9b:00): 119, pid=4071838, name=python, Timeout after 45s of waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801702 0x4).""#,
        "the log says `NVRM: Xid (PCI:0000:9b:00): 119, pid=28232, name=cache_mgr_main, Timeout after 45s of waiting for RPC response from GPU4 GSP!`",
        "dmesg: 'NVRM: Xid (PCI:0000:9b:00): 119, pid=28098, name=gpu-feature-dis, Timeout after 45s of waiting for RPC response from GPU4 GSP!'",
    ];
    for line in quoted {
        let f = loud(line);
        assert!(
            f.iter()
                .any(|f| f.kind == FindingKind::Xid && f.xid == Some(119)),
            "{line}: {f:?}"
        );
    }
    // A quoted host name is still not a driver tag.
    assert!(loud(r#"ssh "nvidia-node-7": connection refused"#).is_empty());
}

#[test]
fn a_module_refused_nvidias_gpl_only_symbols_in_either_wording() {
    // Older kernels name only the module that owns the symbols, newer ones the symbol too.
    for line in [
        "[Jan18 08:23] nvidia_fs: module using GPL-only symbols uses symbols from proprietary module nvidia.",
        "[78175.093303] nvidia_fs: module using GPL-only symbols uses symbols nvidia_p2p_dma_unmap_pages from proprietary module nvidia.",
    ] {
        let f = loud(line);
        assert!(
            f.iter().any(|f| f.kind == FindingKind::DriverInitFailure
                && f.title.contains("GPL-only symbols of nvidia")),
            "{line}: {f:?}"
        );
    }
    // Using (not refusing) the proprietary module's symbols only taints the kernel.
    assert!(loud("[95755.008404] nvidia_uvm: module uses symbols from proprietary module nvidia, inheriting taint.").is_empty());
    // Another vendor's GPL-only trouble is not ours.
    assert!(
        loud("zfs: module using GPL-only symbols uses symbols from proprietary module spl.")
            .is_empty()
    );
}

#[test]
fn nvidia_smi_reports_of_any_nvml_call_failing_are_read() {
    // `Failed to <what> NVML: <reason>`, whatever the call.
    for line in [
        "Failed to properly shut down NVML: Function Not Found",
        "``Failed to initialize NVML: Unknown Error``",
        "Mismatch in versions between nvidia-smi and NVML.",
    ] {
        let f = loud(line);
        assert!(
            f.iter().any(|f| f.kind == FindingKind::DriverError),
            "{line}: {f:?}"
        );
    }
    // A driver update waiting for a reboot stops every NVML client: critical, as before.
    let f = loud("Failed to initialize NVML: Driver/library version mismatch");
    assert!(f.iter().any(|f| f.severity == Severity::Critical), "{f:?}");
    // Prose about NVML that is not nvidia-smi's failure wording stays quiet.
    assert!(loud("NVML: Failed to query fan speed, using default").is_empty());
    assert!(loud("Failed to create directory /var/run/nvidia-persistenced: NVML: n/a").is_empty());
}

#[test]
fn a_line_pasted_as_inline_code_is_read_as_without_the_backticks() {
    // Comments paste single log lines in backticks; the closing one hid the module of a frame.
    let f = scan(&[
        "`[  136.672490] RIP: 0010:GrabOwnership+0x4/0x40 [nvidia_modeset]`",
        "`May 11 10:54:31 localhost kernel: [<ffffffffc074c130>] ? nvidia_unlocked_ioctl+0x20/0x30 [nvidia]`",
    ]);
    assert!(
        f.iter()
            .any(|f| f.severity >= Severity::Warning && f.origin.line == 1),
        "{f:?}"
    );
    // What the message says in quotes is kept: only the backticks after it go.
    let f = loud("`nvidia: version magic '5.4.18-100.fc30.x86_64 SMP mod_unload ' should be '5.4.18-200.fc31.x86_64 SMP mod_unload '`");
    assert!(
        f.iter().any(|f| f.kind == FindingKind::DriverInitFailure),
        "{f:?}"
    );
}
