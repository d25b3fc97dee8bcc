//! `scan`'s text output grouped with the daemon's incident engine: one fault with its echoes is
//! one block led by the cause, the summary is worst first, an NVSwitch is called an NVSwitch, an
//! unreadable input is never "no faults", and `explain --list | head` ends quietly.

use std::io::Write;
use std::process::{Command, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xidwatch"))
}

fn scan_text(text: &str) -> (String, String, Option<i32>) {
    let mut child = bin()
        .arg("scan")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running xidwatch");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("writing stdin");
    let out = child.wait_with_output().expect("waiting for xidwatch");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.code(),
    )
}

/// Block headlines: lines that start with a severity word.
fn headlines(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("CRITICAL") || l.starts_with("WARNING") || l.starts_with("info"))
        .collect()
}

#[test]
fn one_xid_79_with_its_echoes_is_one_block_led_by_the_cause() {
    let (out, _, code) = scan_text(
        "[ 9512.100231] pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0
[ 9512.100240] nvidia 0000:17:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)
[ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.
[ 9512.238750] NVRM: GPU 0000:17:00.0: GPU has fallen off the bus.
[ 9512.238790] NVRM: The NVIDIA GPU 0000:17:00.0
[ 9512.238790] NVRM: (PCI ID: 10de:2330) installed in this system has
[ 9512.238790] NVRM: fallen off the bus and is not responding to commands.
[ 9512.240012] NVRM: Xid (PCI:0000:17:00): 45, pid=2207, name=python3, Ch 00000001 caused by previous Xid 79
[ 9512.240100] NVRM: Xid (PCI:0000:17:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)
",
    );
    assert_eq!(code, Some(1));
    let h = headlines(&out);
    assert_eq!(h.len(), 1, "{out}");
    assert!(h[0].starts_with("CRITICAL Xid 79"), "{out}");
    assert!(
        out.contains("echoes   pcie_aer x1, fallen_off_bus x2, Xid 45 x1, Xid 154 x1"),
        "{out}"
    );
    assert!(out.contains("Summary: 6 findings"), "{out}");
}

#[test]
fn the_same_fault_after_its_window_is_a_new_block() {
    // Kernel timestamps drive the windows: 300 s later, the same Xid is a new incident.
    let (out, _, _) = scan_text(
        "[  100.000000] NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, An uncorrectable double bit error
[  100.500000] NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, An uncorrectable double bit error
[ 1000.000000] NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, An uncorrectable double bit error
",
    );
    let h = headlines(&out);
    assert_eq!(h.len(), 2, "{out}");
    assert!(out.contains("repeats  2 times"), "{out}");
}

#[test]
fn summary_is_worst_first_names_nvswitches_and_counts_in_good_grammar() {
    let (out, _, _) = scan_text(
        "[ 1.0] NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, Graphics Exception: ESR 0x0
[ 2.0] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Fatal, Link 30 LTSSM Fault Up
",
    );
    let summary: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("Summary"))
        .collect();
    assert_eq!(
        summary[0], "Summary: 2 findings (1 critical, 1 warning)",
        "{out}"
    );
    assert!(
        summary[1].starts_with("  NVSwitch 0000:85:00.0: 1 finding, worst critical"),
        "{out}"
    );
    assert!(
        summary[2].starts_with("  GPU 0000:17:00.0: 1 finding, worst warning"),
        "{out}"
    );
    assert!(
        out.contains("  nvswitch 0000:85:00.0"),
        "the block names the NVSwitch: {out}"
    );

    let (out, _, _) =
        scan_text("[ 1.0] NVRM: Xid (PCI:0000:17:00): 79, GPU has fallen off the bus.\n");
    assert!(out.contains("Summary: 1 finding (1 critical)"), "{out}");
}

#[test]
fn an_unreadable_input_is_never_no_faults_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.log");
    let out = bin().arg("scan").arg(&missing).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        !stdout.contains("No GPU faults found in 1 input"),
        "{stdout}"
    );
    assert!(stdout.contains("could not be read"), "{stdout}");
}

#[test]
fn explain_list_into_a_closed_pipe_ends_quietly() {
    for args in [
        &["explain", "--list"][..],
        &["explain", "--list", "--sxid"][..],
    ] {
        let mut child = bin()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Close the pipe before the list is written, as `| head -0` does (the list fits in a
        // pipe buffer, so reading a line first would not make the write fail).
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

#[test]
fn explain_sxid_names_the_catalog_and_its_source() {
    let out = bin().args(["explain", "--sxid", "20034"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SXid 20034  LTSSM Fault Up"), "{text}");
    assert!(text.contains("NVSwitch"), "{text}");
    assert!(text.contains("Fabric Manager"), "{text}");
}

#[test]
fn findings_without_an_address_group_per_problem_not_into_one() {
    // https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1045 and /issues/1230
    let (out, _, _) = scan_text(
        "Jun 12 16:30:32 fedora-box kernel: nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000ca7e:2:0:0x00000062
Jun 12 16:30:32 fedora-box kernel: nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000ca7e:4:0:0x00000062
Jun 12 16:30:41 fedora-box kernel: [drm:nv_drm_atomic_commit [nvidia_drm]] *ERROR* [nvidia-drm] [GPU ID 0x00000100] Flip event timeout on head 0
Aug 07 17:19:18 ubuntu kernel: GSP task watchdog timeout @ pc:0x1250c5c, partition:2#0, task:3
Aug 07 17:19:18 ubuntu kernel: NVRM:     Reported by libos partition:2#4 kernel v3.1 [0] @ ts:1786148357
",
    );
    let h = headlines(&out);
    assert_eq!(h.len(), 3, "{out}");
    assert!(h[0].starts_with("WARNING  nvidia-modeset error"), "{out}");
    assert!(h[1].starts_with("WARNING  nvidia-drm error"), "{out}");
    assert!(
        h[2].starts_with("CRITICAL GSP firmware crash report"),
        "{out}"
    );
    assert!(out.contains("repeats  2 times"), "{out}");
    assert!(
        out.contains("GSP firmware on the GPU crashed"),
        "its own guidance: {out}"
    );
}
