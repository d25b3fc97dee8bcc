//! Classifier tests for the classes of lines that unseen round `s` (mining rigs, media and
//! homelab hosts) showed read badly, each on the round's real lines and on others of its class.

use super::testing;
use crate::model::{FindingKind, Severity};

fn loud(line: &str) -> Vec<crate::model::Finding> {
    testing::loud_line(line, true)
}

/// Old drivers print `NVRM Xid (PCI:...) : N, ...`: no colon after the tag, a space before the
/// colon after the address. Still an Xid, with its number and GPU.
#[test]
fn an_old_drivers_xid_line_is_an_xid() {
    for line in [
        "[12146.826127] NVRM Xid (PCI:0000:0b:00) : 32, Channel ID 00000009 intr 00008000",
        "Jan  3 10:00:01 rig kernel: NVRM Xid (PCI:0000:01:00) : 79, GPU has fallen off the bus.",
        "NVRM: Xid (PCI:0000:01:00) : 13, Graphics Exception",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::Xid, "{line}");
        let (xid, pci) = (f[0].xid, f[0].pci.map(|p| p.to_string()));
        assert!(xid.is_some() && pci.is_some(), "{line}: {f:?}");
    }
    let f =
        loud("[12146.826127] NVRM Xid (PCI:0000:0b:00) : 32, Channel ID 00000009 intr 00008000");
    assert_eq!(f[0].xid, Some(32));
    assert_eq!(
        f[0].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:0b:00.0")
    );
}

/// A tool that calls NVML and prints its return code by number (`error code 15`): the code's
/// name in NVML's header decides, a lost GPU being critical, an answer ("not supported") none.
#[test]
fn an_nvml_return_code_by_number_is_read_by_its_name() {
    let lost = [
        "WARN: NVML: can't get GPU #0, error code 15",
        "20220503 13:51:11 WARN: NVML: can't get temperature for GPU #0, error code 15",
        "20220503 13:51:11 WARN: NVML: can't get fan speed for GPU #0, error code 15",
    ];
    for line in lost {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].severity, Severity::Critical, "{line}");
    }
    let f = loud("20210918 14:09:54 WARN: NVML: can't get GPU #0, error code 999");
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(f[0].severity >= Severity::Warning);
    // An answer, not a fault: NVML_ERROR_NOT_SUPPORTED (3) for a fan reading on a passive card.
    assert!(loud("WARN: NVML: can't get fan speed for GPU #1, error code 3").is_empty());
    // A number NVML does not define is no NVML code.
    assert!(loud("NVML: something, error code 4242").is_empty());
    // By the source line of the call (a vGPU scheduler's hook): the same names decide. A lost
    // GPU (15) is critical; NVML_ERROR_UNINITIALIZED (1), a call before a successful init, is
    // the caller's answer, the init's own failure being the line that says why.
    let f = loud("[4pdvGPU Warn(38:140500277225280:hook.c:339)]: NVML error at line 339: 15");
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(f[0].message.starts_with("NVML error at line 339"), "{f:?}");
    assert_eq!(loud("NVML error at line 88: 999").len(), 1);
    for quiet in [
        "[4pdvGPU Warn(38:140500277225280:hook.c:339)]: NVML error at line 339: 1",
        "NVML error at line 339: 4242",
        "NVML error at line 339: 15 retrying with 2",
    ] {
        assert!(loud(quiet).is_empty(), "{quiet}");
    }
}

/// The vGPU host's manager daemon at its error level (`nvidia-vgpu-mgr[pid]: error: ...`): the
/// VM's vGPU failed. Its notices are quiet.
#[test]
fn the_vgpu_managers_errors_are_driver_errors() {
    for line in [
        "nvidia-vgpu-mgr[10884]: error: vmiop_log: NVOS status 0x56",
        "nvidia-vgpu-mgr[10884]: error: vmiop_log: Assertion Failed at 0xd3940183:293",
        "Jun 10 09:12:01 pve nvidia-vgpu-mgr[2011]: error: vmiop_log: (0x0): RPC RINGs are not valid",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::DriverError, "{line}");
    }
    assert!(loud("nvidia-vgpu-mgr[10884]: notice: vmiop_log: Initializing vGPU").is_empty());
}

/// The X server could not load the NVIDIA driver's GLX or video module: the X components of
/// the driver are missing or do not match.
#[test]
fn the_x_server_failing_to_load_an_nvidia_module_is_a_driver_error() {
    for line in [
        "[  7899.414] (EE) NVIDIA: Failed to load module \"glxserver_nvidia\" (module does not exist, 0)",
        "[    23.102] (EE) Failed to load module \"nvidia\" (module does not exist, 0)",
    ] {
        let f = loud(line);
        assert_eq!(f.len(), 1, "{line}: {f:?}");
        assert_eq!(f[0].kind, FindingKind::DriverError, "{line}");
    }
    // Another module's load failure is not ours.
    assert!(
        loud("[    23.102] (EE) Failed to load module \"fbdev\" (module does not exist, 0)")
            .is_empty()
    );
}

/// An arm64 oops (a Raspberry Pi with a PCIe card, Grace, Jetson) starts at `Unable to handle
/// kernel ...`; it is the driver's when its `pc :` or a frame is in an NVIDIA module, and one
/// finding from the header on. One in core code with no NVIDIA line stays quiet.
#[test]
fn an_arm64_oops_in_an_nvidia_module_is_one_finding_from_its_header() {
    let f = testing::read(
        &[
            "[   38.523167] Unable to handle kernel write to read-only memory at virtual address ffffffc0096dc3e1",
            "[   38.532214] Mem abort info:",
            "[   38.535043]   ESR = 0x9600004f",
            "[   38.579212] Internal error: Oops: 9600004f [#1] PREEMPT SMP",
            "[   38.600000] pc : _nv000816rm+0x1c/0x40 [nvidia]",
            "[   38.600001] lr : _nv000815rm+0x2c/0x60 [nvidia]",
            "[   38.600002] Call trace:",
            "[   38.600003]  _nv000816rm+0x1c/0x40 [nvidia]",
        ],
        true,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].origin.line, 1, "{f:?}");
    assert!(f[0].severity >= Severity::Warning);
    // The same header in another driver's oops (a display controller's, a public report).
    let quiet = testing::read(
        &[
            "[ 2227.011089] Unable to handle kernel NULL pointer dereference at virtual address 00000000",
            "[ 2227.029027] Internal error: Oops: 96000005 [#1] SMP",
            "[ 2227.058116] PC is at vop_crtc_bandwidth+0x1f8/0x2dc",
            "[ 2227.062992] LR is at vop_crtc_bandwidth+0xe4/0x2dc",
        ],
        true,
    );
    assert!(
        quiet.iter().all(|f| f.severity < Severity::Warning),
        "{quiet:?}"
    );
}

/// Round z: an oops whose instruction pointer line lost its brackets in the paste
/// (`...+0x4/0x10 nvidia_modeset`, a Thunderbolt dock unplugged) is the driver's all the same; the
/// same line naming another module, or a bare word after no `+offset/length`, ties nothing.
#[test]
fn an_instruction_pointer_without_brackets_still_names_its_module() {
    use super::shapes::ip_line_module;
    assert_eq!(
        ip_line_module(
            "RIP: 0010:_ZN11DisplayPort10DeviceImpl14isFECSupportedEv+0x4/0x10 nvidia_modeset"
        ),
        Some(Some("nvidia_modeset"))
    );
    assert_eq!(
        ip_line_module("RIP: 0010:rb_erase+0x1c/0x3a0 [nvidia]"),
        Some(Some("nvidia"))
    );
    assert_eq!(ip_line_module("RIP: 0010:rb_erase+0x1c/0x3a0"), Some(None));
    assert_eq!(
        ip_line_module("RIP: 0010:0xffffffffc0a1b2c3 unknown"),
        Some(None)
    );
    let f = testing::loud_lines(
        &[
            "BUG: kernel NULL pointer dereference, address: 0x0000000000000409",
            "#PF: supervisor read access in kernel mode",
            "#PF: error_code(0x0000) - not-present page",
            "RIP: 0010:_ZN11DisplayPort10DeviceImpl14isFECSupportedEv+0x4/0x10 nvidia_modeset",
        ],
        true,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].origin.line, 1, "{f:?}");
    let quiet = testing::loud_lines(
        &[
            "BUG: kernel NULL pointer dereference, address: 0x0000000000000409",
            "RIP: 0010:drm_dp_mst_topology_mgr_set_mst+0x4/0x10 amdgpu",
        ],
        true,
    );
    assert!(quiet.is_empty(), "{quiet:?}");
}

/// Round z: the macOS driver's kernel panic after reading all ones from an eGPU is a fall off the
/// bus; a read error whose configuration space still answers is not.
#[test]
fn the_macos_drivers_all_ones_read_is_a_fall_off_the_bus() {
    let f = testing::loud_line(
        "panic(cpu 2 caller 0xffffff7fa21c15ef): NVRM[0/133:0:0]: Read Error 0x00000000: CFG 0xffffffff 0xffffffff 0xffffffff, BAR0 0x93000000 0xffffff9242460000 0x132000a1, D0, P0/4",
        true,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].kind, crate::model::FindingKind::FallenOffBus);
    let f = testing::read(
        &["panic(cpu 2 caller 0xffffff7fa21c15ef): NVRM[0/133:0:0]: Read Error 0x00000000: CFG 0x1b8110de 0x00100007 0x03000000, BAR0 0x93000000"],
        true,
    );
    assert!(
        f.iter()
            .all(|f| f.kind != crate::model::FindingKind::FallenOffBus),
        "{f:?}"
    );
}
