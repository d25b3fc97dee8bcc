//! The classifier against every line shape the kernel and the driver print, with variants, the
//! harmless lines that must stay silent, and property tests that feed it garbage.

use proptest::prelude::*;
use xidwatch::classify::{prefix, Classifier, LineOrigin};
use xidwatch::model::{Detail, Finding, FindingKind, RecoveryAction, Severity};
use xidwatch::source::kmsg::parse_record;

/// Classifies a whole text as `scan` would (prefix split, multi-line folding, flush at the end).
fn classify(text: &str) -> Vec<Finding> {
    let mut c = Classifier::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(split) = prefix::split(line) else {
            continue;
        };
        let at = LineOrigin {
            line: i as u64 + 1,
            seq: split.prefix.seq,
            ts_usec: split.prefix.ts_usec,
            timestamp: split
                .prefix
                .text
                .as_deref()
                .map(xidwatch::model::Stamp::new),
        };
        for m in &split.messages {
            c.push(m, &at, &mut out);
        }
    }
    c.flush(&mut out);
    out
}

fn one(text: &str) -> Finding {
    let f = classify(text);
    assert_eq!(f.len(), 1, "{text}\n=> {f:#?}");
    f.into_iter().next().unwrap()
}

#[test]
fn xid_line_variants_extract_every_field() {
    struct Case {
        line: &'static str,
        pci: &'static str,
        xid: u32,
        pid: Option<u32>,
        process: Option<&'static str>,
    }
    let cases = [
        Case { line: "NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.", pci: "0000:17:00.0", xid: 79, pid: Some(2207), process: Some("python3") },
        Case { line: "NVRM: Xid (PCI:0000:17:00): 62, pid='<unknown>', name=<unknown>, 1a2b3c4d 0000 0000", pci: "0000:17:00.0", xid: 62, pid: None, process: None },
        Case { line: "NVRM: Xid (0000:02:00): 31, Ch 0000000b, engmask 00000120, intr 10000000", pci: "0000:02:00.0", xid: 31, pid: None, process: None },
        Case { line: "NVRM: Xid (PCI:0000:02:00): 31, pid=1, name=a.out, channel 0x0b00000a, intr 10000000. MMU Fault", pci: "0000:02:00.0", xid: 31, pid: Some(1), process: Some("a.out") },
        Case { line: "NVRM: Xid (PCI:0008:01:00): 48, pid=77, name=trainer, An uncorrectable double bit error", pci: "0008:01:00.0", xid: 48, pid: Some(77), process: Some("trainer") },
        Case { line: "NVRM: Xid (PCI:4a7f1:00:00): 79, pid=9, name=x, GPU has fallen off the bus.", pci: "4a7f1:00:00.0", xid: 79, pid: Some(9), process: Some("x") },
        Case { line: "NVRM: Xid (PCI:0000:C1:00): 119, pid=1833, name=nvidia-smi, Timeout after 6s of waiting for RPC response", pci: "0000:c1:00.0", xid: 119, pid: Some(1833), process: Some("nvidia-smi") },
        Case { line: "NVRM: Xid (PCI:0000:17:00.0): 43, pid=25442, Ch 00000008", pci: "0000:17:00.0", xid: 43, pid: Some(25442), process: None },
        Case { line: "NVRM: Xid (PCI:0000:17:00): 120, GSP task timeout", pci: "0000:17:00.0", xid: 120, pid: None, process: None },
    ];
    for c in cases {
        let f = one(c.line);
        assert_eq!(f.kind, FindingKind::Xid, "{}", c.line);
        assert_eq!(f.pci.unwrap().to_string(), c.pci, "{}", c.line);
        assert_eq!(f.xid, Some(c.xid), "{}", c.line);
        assert_eq!(f.pid, c.pid, "{}", c.line);
        assert_eq!(f.process.as_deref(), c.process, "{}", c.line);
        assert_eq!((f.origin.line, f.origin.lines), (1, 1));
    }
}

#[test]
fn the_domain_is_not_the_xid() {
    let f = one("NVRM: Xid (PCI:0013:01:00): 79, pid=1, name=x, GPU has fallen off the bus.");
    assert_eq!(f.xid, Some(79));
    assert_eq!(f.pci.unwrap().domain(), 0x13);
}

#[test]
fn catalog_severity_and_unknown_codes() {
    let f = one("NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.");
    assert_eq!(f.severity, Severity::Critical);
    let f = one("NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, Graphics Exception");
    assert_eq!(f.severity, Severity::Warning);
    for code in [177, 250, 4000] {
        let f = one(&format!(
            "NVRM: Xid (PCI:0000:17:00): {code}, pid=1, name=x, something new"
        ));
        assert_eq!(f.kind, FindingKind::Xid);
        assert_eq!(f.xid, Some(code));
        assert_eq!(f.severity, Severity::Warning);
        assert!(
            f.title.contains(&format!("unknown Xid {code}")),
            "{}",
            f.title
        );
        assert!(f.title.contains("catalog may be older than the driver"));
    }
}

#[test]
fn secondary_xids_name_their_cause() {
    for (line, cause) in [
        ("NVRM: Xid (PCI:0000:17:00): 45, pid=2207, name=python3, Ch 00000001 caused by previous Xid 149", 149),
        ("NVRM: Xid (PCI:0000:17:00): 45, pid=2207, name=python3, Ch 00000001 caused by previous Xid 79.", 79),
    ] {
        assert_eq!(one(line).caused_by, Some(cause));
    }
    assert_eq!(
        one("NVRM: Xid (PCI:0000:17:00): 45, pid=1, name=x, Ch 00000001").caused_by,
        None
    );
}

#[test]
fn xid_13_location_and_74_link() {
    let f = one("NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0): Out Of Range Address");
    assert_eq!(
        f.detail,
        Some(Detail::GraphicsException {
            gpc: 2,
            tpc: 1,
            sm: 0
        })
    );
    let f = one(
        "NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, Graphics Exception: ESR 0x514730=0x201000e",
    );
    assert_eq!(f.detail, None);
    let f = one("NVRM: Xid (PCI:0000:c1:00): 74, pid=1, name=x, NVLink: fatal error detected on link 6(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)");
    assert_eq!(
        f.detail,
        Some(Detail::NvlinkError {
            link: 6,
            registers: vec![0, 0, 0x10000, 0, 0, 0, 0]
        })
    );
    let f = one(
        "NVRM: Xid (PCI:0000:c1:00): 74, NVLink: fatal error detected on link 11(0x10000, 0x0)",
    );
    assert!(matches!(
        f.detail,
        Some(Detail::NvlinkError { link: 11, .. })
    ));
}

#[test]
fn nvlink5_decodes_by_driver_version() {
    let line = "NVRM: Xid (PCI:0000:c1:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x00000007 0x00000001 0x00000000 0x00000000)";
    // No driver version known: both layouts are tried; IntrInfo 0x7 only fits V2's SRC_TRACK.
    let f = one(line);
    let Some(Detail::Nvlink5 {
        unit,
        link,
        intr_info,
        error_status,
        decode,
    }) = &f.detail
    else {
        panic!("{f:?}")
    };
    assert_eq!(
        (unit.as_str(), *link, *intr_info, *error_status),
        ("RLW_SRC_TRACK", Some(12), 7, 1)
    );
    assert_eq!(decode.len(), 1);
    assert_eq!(
        (decode[0].layout, decode[0].unit, decode[0].immediate),
        ("V2", "RLW_SRC_TRACK", "RESET_GPU")
    );
    assert_eq!(f.severity, Severity::Critical);

    // With an R550 banner first, the V1 layout applies and 0x7 decodes to nothing.
    let text = format!(
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 2024\n{line}"
    );
    let f = classify(&text).pop().unwrap();
    let Some(Detail::Nvlink5 { decode, .. }) = &f.detail else {
        panic!()
    };
    assert!(decode.is_empty());

    // V1 SRC_TRACK (IntrInfo[9:0] = 0011100010) with a non-fatal status: follow Xid 154.
    let text = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.86.15  x\nNVRM: Xid (PCI:0000:c1:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040000e2 0x00000004 0x0)";
    let f = classify(text).pop().unwrap();
    let Some(Detail::Nvlink5 { decode, .. }) = &f.detail else {
        panic!()
    };
    assert_eq!(decode.len(), 1);
    assert_eq!(
        (decode[0].layout, decode[0].immediate),
        ("V1", "XID_154_EVAL")
    );
    assert_eq!(f.severity, Severity::Warning);

    // 149 link-down rows carry no error status: any value matches.
    let f = one("NVRM: Xid (PCI:0000:c1:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 04 (0x00000011 0x12345678 0x0)");
    let Some(Detail::Nvlink5 { decode, .. }) = &f.detail else {
        panic!()
    };
    assert!(
        decode
            .iter()
            .any(|d| d.unit == "NETIR_LINK_DOWN" && d.immediate == "RESET_GPU"),
        "{decode:?}"
    );
}

#[test]
fn xid_154_recovery_actions() {
    for (to, want, sev) in [
        (
            "0x1 (GPU Reset Required)",
            RecoveryAction::GpuReset,
            Severity::Critical,
        ),
        (
            "0x2 (Node Reboot Required)",
            RecoveryAction::NodeReboot,
            Severity::Critical,
        ),
        (
            "0x3 (Drain P2P)",
            RecoveryAction::DrainP2p,
            Severity::Warning,
        ),
        (
            "0x4 (Drain and Reset)",
            RecoveryAction::DrainAndReset,
            Severity::Critical,
        ),
        ("0x0 (None)", RecoveryAction::None, Severity::Info),
        (
            "0x5 (OS Reboot Required)",
            RecoveryAction::OsReboot,
            Severity::Critical,
        ),
        (
            "0x6 (PF FLR Required)",
            RecoveryAction::PfFlr,
            Severity::Critical,
        ),
        (
            "0x9 (Call The Shaman)",
            RecoveryAction::Other("Call The Shaman".into()),
            Severity::Critical,
        ),
        (
            "0x9",
            RecoveryAction::Other("0x9".into()),
            Severity::Critical,
        ),
    ] {
        let f = one(&format!(
            "NVRM: Xid (PCI:0000:17:00): 154, GPU recovery action changed from 0x0 (None) to {to}"
        ));
        assert_eq!(
            f.detail,
            Some(Detail::Recovery {
                from: RecoveryAction::None,
                to: want
            }),
            "{to}"
        );
        assert_eq!(f.severity, sev, "{to}");
    }
}

#[test]
fn sxid_continuations_fold_into_one_finding() {
    let text = "\
[ 1.1] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Fatal, Link 30 LTSSM Fault Up
[ 1.2] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Severity 1 Engine instance 30 Sub-engine instance 00
[ 1.3] nvidia-nvswitch2: SXid (PCI:0000:85:00.0): 20034, Data {0x00000000, 0x00000000}
[ 1.4] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 04 egress non-posted PRIV error (First)
[ 1.5] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Severity 0 Engine instance 04 Sub-engine instance 00
";
    let f = classify(text);
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(
        (f[0].kind, f[0].xid, f[0].severity),
        (FindingKind::Sxid, Some(20034), Severity::Critical)
    );
    assert_eq!((f[0].origin.line, f[0].origin.lines), (1, 3));
    assert!(
        matches!(&f[0].detail, Some(Detail::Sxid { fatal: true, link: Some(30), continuation }) if continuation.len() == 2)
    );
    assert_eq!(
        (f[1].xid, f[1].severity, f[1].origin.lines),
        (Some(12028), Severity::Warning, 2)
    );
}

#[test]
fn identity_lines_enrich_later_findings() {
    let text = "\
NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f
NVRM: GPU Board Serial Number: 1650923011234
NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.
NVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=x, GPU has fallen off the bus.
";
    let f = classify(text);
    assert_eq!(f.len(), 4);
    assert_eq!(
        (f[0].kind, f[0].severity),
        (FindingKind::GpuIdentity, Severity::Info)
    );
    assert_eq!(
        f[2].gpu.uuid.as_deref(),
        Some("GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f")
    );
    assert_eq!(f[2].gpu.serial.as_deref(), Some("1650923011234"));
    assert!(
        f[3].gpu.is_empty(),
        "another GPU must not borrow the identity"
    );
}

#[test]
fn fallen_off_the_bus_without_an_xid() {
    for text in [
        "NVRM: GPU 0000:17:00.0: GPU has fallen off the bus.",
        "NVRM: GPU at 0000:17:00.0 has fallen off the bus.",
        "NVRM: GPU at PCI:0000:17:00 has fallen off the bus.",
    ] {
        let f = one(text);
        assert_eq!(
            (f.kind, f.pci.unwrap().to_string().as_str()),
            (FindingKind::FallenOffBus, "0000:17:00.0"),
            "{text}"
        );
        assert_eq!(f.severity, Severity::Critical);
    }
    // Three lines, as three dmesg lines, one kmsg record and one rsyslog line.
    for (text, lines) in [
        ("[ 1.0] NVRM: The NVIDIA GPU 0000:17:00.0\n[ 1.0] NVRM: (PCI ID: 10de:2330) installed in this system has\n[ 1.0] NVRM: fallen off the bus and is not responding to commands.", 3),
        ("3,42,100,-;NVRM: The NVIDIA GPU 0000:17:00.0\\x0aNVRM: (PCI ID: 10de:2330) installed in this system has\\x0aNVRM: fallen off the bus and is not responding to commands.\\x0a", 1),
        ("Nov 29 08:14:03 h kernel: NVRM: The NVIDIA GPU 0000:17:00.0#012NVRM: (PCI ID: 10de:2330) installed in this system has#012NVRM: fallen off the bus and is not responding to commands.", 1),
    ] {
        let f = one(text);
        assert_eq!(f.kind, FindingKind::FallenOffBus, "{text}");
        assert_eq!(f.pci.unwrap().to_string(), "0000:17:00.0");
        assert_eq!(f.origin.lines, lines, "{text}");
        assert_eq!(f.origin.raw.len(), 3);
    }
    // After its Xid, the RC line is about the same GPU (so it folds into that incident).
    let f = classify("NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.\nNVRM: RC all channels for critical error 79.");
    assert_eq!(
        f[1].pci.map(|p| p.to_string()).as_deref(),
        Some("0000:17:00.0")
    );
    let f = one("NVRM: RC all channels for critical error 79.");
    assert_eq!(f.kind, FindingKind::FallenOffBus);
}

#[test]
fn the_not_supported_family_is_one_warning_with_its_explanation_folded() {
    for (text, lines) in [
        ("NVRM: The NVIDIA GPU 0000:17:00.0 (PCI ID: 10de:1db6)\nNVRM: installed in this system is not supported by open\nNVRM: nvidia.ko because it does not include the required GPU\nNVRM: System Processor (GSP).", 4),
        ("NVRM: The NVIDIA GPU 0000:17:00.0\nNVRM: (PCI ID: 10de:1db6) installed in this system is\nNVRM: not supported by the NVIDIA 550.54.14 driver release.", 3),
    ] {
        let f = one(text);
        assert_eq!((f.kind, f.severity), (FindingKind::DriverError, Severity::Warning), "{text}");
        assert_eq!(f.pci.map(|p| p.to_string()).as_deref(), Some("0000:17:00.0"));
        assert_eq!(f.origin.lines, lines, "{text}");
    }
}

#[test]
fn driver_communication_failures() {
    for (text, kind, pci) in [
        ("NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x62:0xffff:1863)", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("NVRM: GPU 0000:17:00.0: rm_init_adapter failed, device minor number 0", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("NVRM: RmInitAdapter failed! (0x27:0x38:1193)", FindingKind::DriverInitFailure, None),
        ("NVRM: rm_init_adapter(0) failed", FindingKind::DriverInitFailure, None),
        ("NVRM: RmInitAdapter: Cannot initialize GSP firmware RM", FindingKind::DriverInitFailure, None),
        ("NVRM: GPU 0000:17:00.0: RmInitAdapter: Cannot initialize GSP firmware RM", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("nvidia 0000:17:00.0: loading /lib/firmware/nvidia/550.54.14/gsp_ga10x.bin failed with error -4", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("nvidia 0000:17:00.0: Direct firmware load for nvidia/550.54.14/gsp_tu10x.bin failed with error -2", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("NVRM: The NVIDIA probe routine failed for 1 device(s).", FindingKind::DriverInitFailure, None),
        ("NVRM: None of the NVIDIA devices were initialized.", FindingKind::DriverInitFailure, None),
        ("NVRM: No NVIDIA devices probed.", FindingKind::DriverInitFailure, None),
        ("nvidia 0000:17:00.0: probe with driver nvidia failed with error -1", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("nvidia: disagrees about version of symbol module_layout", FindingKind::DriverInitFailure, None),
        ("nvidia: Unknown symbol nvUvmInterfaceDeRegisterUvmOps (err -2)", FindingKind::DriverInitFailure, None),
        ("nvidia_uvm: Unknown symbol nvUvmInterfaceSessionCreate (err -2)", FindingKind::DriverInitFailure, None),
        ("NVRM: _kgspLogXid119: ********* GSP Timeout Error *********", FindingKind::DriverError, None),
        ("NVRM: GPU0 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data 0x0000000020800a4c 0x0.", FindingKind::DriverError, None),
        ("NVRM: nvGpuOpsReportFatalError: uvm encountered global fatal error 0x60, requiring os reboot to recover.", FindingKind::DriverError, None),
        ("NVRM: GPU 0000:17:00.0: Failed to allocate memory for the GPU object", FindingKind::DriverError, Some("0000:17:00.0")),
        ("NVRM: GPU 0000:17:00.0: GPU does not have the necessary power cables connected.", FindingKind::DriverInitFailure, Some("0000:17:00.0")),
        ("NVRM: This PCI I/O region assigned to your NVIDIA device is invalid:", FindingKind::DriverInitFailure, None),
        ("NVRM: krcWatchdogRecovery_IMPL: RC watchdog: GPU is probably locked!  Notify Timeout Seconds: 7", FindingKind::DriverError, None),
    ] {
        let f = one(text);
        assert_eq!(f.kind, kind, "{text}");
        assert_eq!(f.pci.map(|p| p.to_string()).as_deref(), pci, "{text}");
        assert!(f.severity >= Severity::Warning, "{text}");
    }
}

#[test]
fn api_mismatch_is_one_finding_with_both_versions() {
    let text = "\
[ 5.1] NVRM: API mismatch: the client has the version 550.90.07, but
[ 5.1] NVRM: this kernel module has the version 550.54.14.  Please
[ 5.1] NVRM: make sure that this kernel module and all NVIDIA driver
[ 5.1] NVRM: components have the same version.
[ 6.0] NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.
";
    let f = classify(text);
    assert_eq!(f.len(), 2);
    assert_eq!(f[0].kind, FindingKind::ApiMismatch);
    assert_eq!((f[0].origin.line, f[0].origin.lines), (1, 4));
    assert_eq!(
        f[0].detail,
        Some(Detail::ApiMismatch {
            client_version: "550.90.07".into(),
            kernel_version: "550.54.14".into()
        })
    );
    // Cut short (the log ends after two lines): still one finding with both versions.
    let f = one("NVRM: API mismatch: the client has the version 535.1, but\nNVRM: this kernel module has the version 550.2.  Please");
    assert!(
        matches!(&f.detail, Some(Detail::ApiMismatch { client_version, kernel_version }) if client_version == "535.1" && kernel_version == "550.2")
    );
}

#[test]
fn pcie_aer_lines_naming_a_gpu() {
    let text = "\
pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0
nvidia 0000:17:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)
pcieport 0000:16:01.0: AER: Corrected error message received from 0000:17:00.0
pcieport 0000:16:01.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)
pcieport 0000:16:01.0: AER:   device [10de:2330] error status/mask=00000001/0000e000
pcieport 0000:16:01.0: AER:    [ 0] RxErr
nvidia 0000:17:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)
";
    let f = classify(text);
    assert_eq!(f.len(), 3, "{f:#?}");
    assert!(f
        .iter()
        .all(|f| f.kind == FindingKind::PcieAer && f.pci.unwrap().to_string() == "0000:17:00.0"));
    assert_eq!((f[0].severity, f[0].origin.lines), (Severity::Critical, 2));
    assert_eq!((f[1].severity, f[1].origin.lines), (Severity::Info, 4));
    assert_eq!(f[2].severity, Severity::Warning);
    // An uncorrected fatal error on a device never seen as NVIDIA is still worth a warning.
    let f = one("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0");
    assert_eq!(f.severity, Severity::Warning);
    // A detail line on its own has nothing to attach to.
    assert!(classify("pcieport 0000:00:01.0: AER:    [ 0] RxErr").is_empty());
}

#[test]
fn harmless_lines_produce_nothing() {
    let text = "\
[    4.812233] nvidia: loading out-of-tree module taints kernel.
[    4.812240] nvidia: module license 'NVIDIA' taints kernel.
[    4.812241] nvidia: module verification failed: signature and/or required key missing - tainting kernel
[    4.899102] nvidia-nvlink: Nvlink Core is being initialized, major device number 511
[    4.901442] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024
[    5.002011] nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.14
[    5.021876] nvidia-uvm: Loaded the UVM driver, major device number 508.
[    5.100000] nvidia 0000:17:00.0: enabling device (0000 -> 0002)
[    5.100001] nvidia 0000:17:00.0: vgaarb: changed VGA decodes: olddecodes=io+mem,decodes=none:owns=none
[    5.200000] [drm] [nvidia-drm] [GPU ID 0x00001700] Loading driver
[   12.118842] systemd[1]: Started nvidia-persistenced.service - NVIDIA Persistence Daemon.
[   12.118843] nvidia-persistenced[812]: Started (812)
[ 8811.004120] python3[22871]: training step 1000: my Xid 79 test is fine
[ 8811.004121] myapp: NVRM lookalike without the tag
";
    let f = classify(text);
    assert!(f.is_empty(), "{f:#?}");
}

#[test]
fn kmsg_records_round_trip_through_the_classifier() {
    let r = parse_record(b"3,1187,9512238711,-;NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:17:00.0\n").unwrap();
    let mut c = Classifier::new();
    let mut out = Vec::new();
    let at = LineOrigin {
        line: 0,
        seq: Some(r.seq),
        ts_usec: Some(r.ts_usec),
        timestamp: None,
    };
    for l in r.lines() {
        c.push(l, &at, &mut out);
    }
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].origin.seq, Some(1187));
}

fn escape(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in msg {
        if b == b'\\' || !(0x20..0x7f).contains(&b) {
            out.extend_from_slice(format!("\\x{b:02x}").as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn record_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_record(&bytes);
    }

    #[test]
    fn escaped_messages_round_trip(prio in 0u32..2048, seq: u64, ts: u64, msg in "[ -~\n\t\u{e9}]{0,200}") {
        let mut rec = format!("{prio},{seq},{ts},-;").into_bytes();
        rec.extend(escape(msg.as_bytes()));
        rec.extend_from_slice(b"\n SUBSYSTEM=pci\n");
        let r = parse_record(&rec).unwrap();
        prop_assert_eq!(&r.message, &msg);
        prop_assert_eq!((r.seq, r.ts_usec, r.facility, r.level as u32), (seq, ts, prio >> 3, prio & 7));
        prop_assert_eq!(r.field("SUBSYSTEM"), Some("pci"));
    }

    #[test]
    fn classifier_never_panics_on_arbitrary_lines(lines in proptest::collection::vec("[ -~\u{e9}\u{2026}\u{1F600}]{0,8}(NVRM: |nvidia|pcieport |nvidia-nvswitch1: SXid |: 0000 \\[#1\\] |fabricmanager\\[1\\]: |BUG: |)[ -~\u{e9}\u{2026}\u{1F600}]{0,120}", 0..20)) {
        let _ = classify(&lines.join("\n"));
    }

    #[test]
    fn xid_fields_survive_any_process_name(pid in 1u32..4_000_000, xid in 1u32..400, name in "[a-zA-Z0-9_.-]{1,15}", bus in 0u8..=255) {
        let line = format!("NVRM: Xid (PCI:0000:{bus:02x}:00): {xid}, pid={pid}, name={name}, something");
        let f = one(&line);
        prop_assert_eq!(f.xid, Some(xid));
        prop_assert_eq!(f.pid, Some(pid));
        prop_assert_eq!(f.process.as_deref(), Some(name.as_str()));
        prop_assert_eq!(f.pci.unwrap().bus(), bus);
    }
}
