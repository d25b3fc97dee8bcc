//! Runbooks end to end: the shipped runbooks load and serve every class of fault; whatever is not
//! exactly a command of the catalog is refused (a table of hostile argv, a property test);
//! programs run under a timeout that kills their whole process group, with capped output, a
//! cleared environment and no stdin, as an unprivileged user without capabilities; placeholders
//! without a value skip their step; log text never reaches a command line; secrets never reach
//! evidence. Programs are the fake tools in fixtures/fake-tools, /sys and /proc the trees in
//! fixtures/; no test needs a GPU, and only the one marked so needs root.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use xidwatch::model::{
    Category, Evidence, Finding, FindingKind, GpuIdentity, Incident, IncidentPhase, PciAddress,
    Severity, StepResult, StepStatus,
};
use xidwatch::runbook::{
    render_evidence, render_list, render_load_errors, render_show, Catalog, GpuUuid, LoadErrorKind,
    LogLine, NvmlError, NvmlProbe, NvmlQuery, Placeholder, Redactor, Rule, RunLimits, Runbook,
    RunbookEnv, RunbookSet, Subject, Template, Values, CHILD_PATH, SOURCE_DIR,
};

fn fixture(p: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(p)
}

fn env() -> RunbookEnv {
    RunbookEnv {
        search_path: vec![fixture("fake-tools")],
        sysfs_root: fixture("sysfs"),
        procfs_root: fixture("proc"),
        nvml: None,
        host: "test-host".into(),
        secrets: Redactor::default(),
        show_arguments: false,
    }
}

/// The shipped catalog plus every `run` argv of `steps`, as literal patterns (placeholders
/// become the slot of their type): tests of running programs need their fake tools allowed.
fn catalog_for(steps: &str) -> Catalog {
    let v: toml::Value = toml::from_str(steps).unwrap();
    let mut extra = Vec::new();
    for st in v
        .get("step")
        .and_then(|s| s.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(run) = st.get("run").and_then(|r| r.as_array()) {
            let words = run.iter().map(|w| {
                let w = w.as_str().unwrap();
                w.replace("{xid}", "{int:0-1000}")
                    .replace("{gpu_index}", "{gpu}")
                    .replace("{uuid}", "{gpu}")
            });
            extra.push(words.collect());
        }
    }
    Catalog::with_additions(&extra).unwrap_or_else(|e| panic!("{e}"))
}

/// A directory under /tmp that the unprivileged runbook user can write, and its name (tools take
/// a name, as the catalog allows no literal path outside its read roots).
fn scratch() -> (tempfile::TempDir, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("xw-rb-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    (dir, name)
}

fn gpu() -> PciAddress {
    PciAddress::parse("0000:17:00.0").unwrap()
}

fn shipped() -> RunbookSet {
    RunbookSet::load(&[PathBuf::from(SOURCE_DIR)], &Catalog::default())
        .unwrap_or_else(|e| panic!("{}", render_load_errors(&e)))
}

/// A fallback runbook with the given limits and steps.
fn test_runbook(limits: &str, steps: &str) -> Runbook {
    let text = format!(
        "title = \"test\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n{limits}\n{steps}"
    );
    Runbook::from_toml(Path::new("test.toml"), &text, &catalog_for(steps))
        .unwrap_or_else(|e| panic!("{}", render_load_errors(&e)))
}

fn subject(kind: FindingKind, xid: Option<u32>, category: Category) -> Subject {
    let mut s = Subject::manual(Some(gpu()), xid, Some(4242));
    s.kind = kind;
    s.category = category;
    s.severity = Severity::Critical;
    s
}

fn xid_subject(xid: u32, category: Category) -> Subject {
    subject(FindingKind::Xid, Some(xid), category)
}

fn step<'a>(ev: &'a Evidence, name: &str) -> &'a StepResult {
    ev.steps
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no step {name:?} in {}", render_evidence(ev)))
}

fn has_note(s: &StepResult, needle: &str) -> bool {
    s.notes.iter().any(|n| n.contains(needle))
}

async fn run(rb: &Runbook, s: &Subject) -> Evidence {
    rb.run(s, &env(), &RunLimits::default()).await
}

fn incident(findings: Vec<Finding>, kind: FindingKind, xid: Option<u32>) -> Incident {
    Incident {
        id: "test-incident".into(),
        phase: IncidentPhase::Opened,
        host: "test-host".into(),
        boot_id: None,
        kind,
        xid,
        pci: Some(gpu()),
        gpu: GpuIdentity::default(),
        severity: Severity::Critical,
        category: Category::Application,
        title: "test".into(),
        first_seen_ms: 0,
        last_seen_ms: 0,
        count: 1,
        findings,
        echoes: vec![],
        found_at_startup: false,
        before_lookback: false,
        runbook_override: None,
        dropped_alerts_before: 0,
        test: false,
        note: None,
        supersedes: Vec::new(),
        host_page: None,
        paged_as: Vec::new(),
    }
}

/// An incident whose every free-text field holds `text` (and whose UUID is `uuid`).
fn dirty_incident(text: &str, raw: Vec<String>, uuid: Option<String>) -> Incident {
    let mut f = Finding::new(
        FindingKind::Xid,
        Severity::Critical,
        Category::Application,
        text.to_string(),
    );
    f.xid = Some(13);
    f.pci = Some(gpu());
    f.pid = Some(4242);
    f.process = Some(text.to_string());
    f.message = text.to_string();
    f.gpu.uuid = uuid.clone();
    f.gpu.name = Some(text.to_string());
    f.origin.raw = raw;
    f.origin.timestamp = Some(text.into());
    let mut inc = incident(vec![f], FindingKind::Xid, Some(13));
    inc.title = text.to_string();
    inc.gpu.uuid = uuid;
    inc.gpu.serial = Some(text.to_string());
    inc
}

// ---------------------------------------------------------------------------------------------
// The shipped runbooks

#[test]
fn every_shipped_runbook_loads() {
    let set = shipped();
    let names: Vec<&str> = set.iter().map(|r| r.name()).collect();
    assert_eq!(
        names,
        [
            "application",
            "config-rejected",
            "driver",
            "driver-unresponsive",
            "fabric-manager",
            "fallback",
            "fallen-off-bus",
            "gpu-held",
            "gsp",
            "kernel-log-watch",
            "memory",
            "nvlink",
            "nvml-unavailable",
            "recovery-action",
            "service-down",
            "sxid",
            "thermal-power"
        ]
    );
    assert_eq!(set.fallback().map(|r| r.name()), Some("fallback"));
    for rb in set.iter() {
        assert!(
            !rb.meaning().is_empty() && !rb.next_steps().is_empty(),
            "{}",
            rb.name()
        );
        assert!(!rb.steps().is_empty(), "{}", rb.name());
    }
}

#[test]
fn shipped_runbooks_serve_every_class() {
    let set = shipped();
    let pick = |s: &Subject| set.select(s).map(|r| r.name().to_string());
    let classes: &[(&[u32], &str)] = &[
        (&[79, 167], "fallen-off-bus"),
        (&[48, 63, 64, 92, 94, 95, 140, 171, 172], "memory"),
        (&[119, 120, 143], "gsp"),
        (
            &[74, 136, 137, 144, 145, 146, 147, 148, 149, 150, 155],
            "nvlink",
        ),
        (&[13, 31, 43, 45], "application"),
        (&[54, 162, 163, 164, 165], "thermal-power"),
        (&[154], "recovery-action"),
    ];
    for (xids, want) in classes {
        for &x in *xids {
            // An Xid listed by number wins whatever category the classifier gave it.
            for c in Category::ALL {
                assert_eq!(
                    pick(&xid_subject(x, c)).as_deref(),
                    Some(*want),
                    "Xid {x} {c}"
                );
            }
        }
    }
    let kinds: &[(FindingKind, Category, &str)] = &[
        (FindingKind::FallenOffBus, Category::Pcie, "fallen-off-bus"),
        (FindingKind::GpuLost, Category::Pcie, "fallen-off-bus"),
        (FindingKind::GpuMissing, Category::Driver, "fallen-off-bus"),
        (FindingKind::PcieAer, Category::Pcie, "fallen-off-bus"),
        (FindingKind::EccError, Category::Memory, "memory"),
        (FindingKind::DriverInitFailure, Category::Driver, "driver"),
        (FindingKind::ApiMismatch, Category::Driver, "driver"),
        (FindingKind::DriverError, Category::Driver, "driver"),
        (
            FindingKind::NvmlUnavailable,
            Category::Driver,
            "nvml-unavailable",
        ),
        (
            FindingKind::DriverUnresponsive,
            Category::Driver,
            "driver-unresponsive",
        ),
        (FindingKind::DriverError, Category::Gsp, "gsp"),
        (FindingKind::Sxid, Category::Nvlink, "sxid"),
        // Watcher health: their own words and evidence, never the GPU fallback's.
        (
            FindingKind::KmsgOverrun,
            Category::Informational,
            "kernel-log-watch",
        ),
        (
            FindingKind::KmsgSequence,
            Category::Informational,
            "kernel-log-watch",
        ),
        (
            FindingKind::ConfigRejected,
            Category::Informational,
            "config-rejected",
        ),
        (
            FindingKind::GpuIdentity,
            Category::Informational,
            "fallback",
        ),
    ];
    for (kind, cat, want) in kinds {
        let s = subject(*kind, None, *cat);
        assert_eq!(pick(&s).as_deref(), Some(*want), "{kind} {cat}");
    }
    let mut sxid = subject(FindingKind::Sxid, Some(20034), Category::Nvlink);
    assert_eq!(pick(&sxid).as_deref(), Some("sxid"));
    sxid.xid = Some(79); // SXid 79 is not Xid 79
    assert_eq!(pick(&sxid).as_deref(), Some("sxid"));
    // Unknown Xids (catalog older than the driver) get the fallback.
    for x in [173, 999, 4000] {
        assert_eq!(
            pick(&xid_subject(x, Category::Informational)).as_deref(),
            Some("fallback")
        );
    }
    // Thermal and power by category.
    let s = subject(FindingKind::DriverError, None, Category::ThermalPower);
    assert_eq!(pick(&s).as_deref(), Some("thermal-power"));
    // Every kind and category is served by some runbook.
    for k in FindingKind::ALL {
        for c in Category::ALL {
            assert!(set.select(&subject(k, None, c)).is_some(), "{k} {c}");
        }
    }
}

#[test]
fn configured_override_wins_and_a_missing_one_is_reported() {
    let set = shipped();
    let mut s = xid_subject(79, Category::Pcie);
    s.runbook_override = Some("memory".into());
    let sel = set.select_explained(&s).unwrap();
    assert_eq!(sel.runbook.name(), "memory");
    assert!(sel.reason.contains("configuration"));
    s.runbook_override = Some("no-such-runbook".into());
    let sel = set.select_explained(&s).unwrap();
    assert_eq!(sel.runbook.name(), "fallen-off-bus");
    assert!(sel.reason.contains("does not exist"), "{}", sel.reason);
}

#[test]
fn later_directories_override_by_name_and_ties_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let custom = "title = \"our memory runbook\"\n[[match]]\nxids = [48]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lsmod\"]\n";
    std::fs::write(dir.path().join("memory.toml"), custom).unwrap();
    // Two equally specific runbooks for Xid 31: the higher priority wins over the shipped one.
    let app = "title = \"ours\"\npriority = 5\n[[match]]\nxids = [31]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lsmod\"]\n";
    std::fs::write(dir.path().join("app-ours.toml"), app).unwrap();
    std::fs::write(dir.path().join("README.md"), "not a runbook").unwrap();
    let set = RunbookSet::load(
        &[PathBuf::from(SOURCE_DIR), dir.path().to_path_buf()],
        &Catalog::default(),
    )
    .unwrap_or_else(|e| panic!("{}", render_load_errors(&e)));
    let mem = set.get("memory").unwrap();
    assert_eq!(mem.title(), "our memory runbook");
    assert_eq!(
        mem.overrides(),
        [PathBuf::from(SOURCE_DIR).join("memory.toml")]
    );
    assert!(render_list(&set).contains("replaces"));
    // The replacement is whole: Xid 63 is no longer listed anywhere, so the fallback takes it.
    let pick = |x, c| set.select(&xid_subject(x, c)).unwrap().name().to_string();
    assert_eq!(pick(48, Category::Memory), "memory");
    assert_eq!(pick(63, Category::Memory), "fallback");
    assert_eq!(pick(31, Category::Application), "app-ours");
    assert_eq!(pick(13, Category::Application), "application");
}

#[test]
fn two_fallbacks_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let fb = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lsmod\"]\n";
    std::fs::write(dir.path().join("zz-other.toml"), fb).unwrap();
    let errs = RunbookSet::load(
        &[PathBuf::from(SOURCE_DIR), dir.path().to_path_buf()],
        &Catalog::default(),
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs[0].kind, LoadErrorKind::Conflict);
    assert!(errs[0].to_string().contains("zz-other.toml"), "{}", errs[0]);
    assert!(errs[0].to_string().contains("fallback.toml"), "{}", errs[0]);
    let (set, _) = RunbookSet::load_partial(
        &[PathBuf::from(SOURCE_DIR), dir.path().to_path_buf()],
        &Catalog::default(),
    );
    assert_eq!(set.fallback().map(|r| r.name()), Some("fallback"));
    assert!(set.get("zz-other").is_none());
}

#[tokio::test]
async fn every_shipped_runbook_runs_against_the_fakes() {
    let set = shipped();
    let lines = vec![
        LogLine {
            seq: Some(1),
            ts_usec: Some(9_512_000_000),
            text: "NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f".into(),
        },
        LogLine {
            seq: Some(2),
            ts_usec: Some(9_512_238_711),
            text: "NVRM: Xid (PCI:0000:17:00): 79, pid=4242, name=python3, GPU has fallen off the bus.".into(),
        },
    ];
    for rb in set.iter() {
        let s = xid_subject(79, Category::Pcie).with_kernel_log(lines.clone(), Some(1));
        let ev = run(rb, &s).await;
        assert_eq!(ev.runbook, rb.name());
        assert_eq!(ev.steps.len(), rb.steps().len());
        for st in &ev.steps {
            // Programs not faked (systemctl, journalctl, dkms, ps) are recorded as missing.
            assert!(
                matches!(
                    st.status,
                    StepStatus::Done { .. }
                        | StepStatus::Missing { .. }
                        | StepStatus::Skipped { .. }
                ),
                "{}: {}",
                rb.name(),
                render_evidence(&ev)
            );
            if let StepStatus::Missing { what } = &st.status {
                assert!(
                    ["systemctl", "journalctl", "dkms", "ps"]
                        .iter()
                        .any(|p| what.starts_with(p)),
                    "{}: {what}",
                    rb.name()
                );
            }
        }
        let text = render_evidence(&ev);
        assert!(text.contains(rb.meaning().lines().next().unwrap()));
        serde_json::to_string(&ev).unwrap();
    }
}

#[tokio::test]
async fn fallen_off_bus_reads_the_link_and_the_port_above() {
    let set = shipped();
    let ev = run(
        set.get("fallen-off-bus").unwrap(),
        &xid_subject(79, Category::Pcie),
    )
    .await;
    let link = step(&ev, "PCIe link of the GPU");
    assert_eq!(link.status, StepStatus::Done { exit_code: None });
    assert!(
        link.output.contains("current_link_speed: 2.5 GT/s PCIe"),
        "{}",
        link.output
    );
    assert!(
        has_note(
            link,
            "PCIe link at 2.5 GT/s x4 where the maximum is 16 GT/s x16"
        ) && has_note(link, "badly seated"),
        "{:?}",
        link.notes
    );
    assert!(has_note(step(&ev, "AER counters of the GPU"), "CmpltTO 2"));
    let port = step(&ev, "the port above the GPU (lspci)");
    assert_eq!(port.target, ["lspci", "-vvv", "-s", "0000:16:01.0"]);
    assert!(port.output.contains("Root Port"));
    assert!(step(&ev, "PCIe link of the port above").notes.is_empty());
    assert!(has_note(
        step(&ev, "GPUs the driver has"),
        "2 NVIDIA GPU(s) on the PCI bus but the driver has 1"
    ));
    assert!(has_note(
        step(&ev, "the GPU on the bus (lspci)"),
        "0000:17:00.0: lspci reports its link as downgraded"
    ));
    assert!(step(&ev, "the port above the GPU (lspci)").notes.is_empty());
    assert!(has_note(
        step(&ev, "NVIDIA devices on the bus"),
        "0000:18:00.0: configuration space reads return all ones"
    ));
    let text = render_evidence(&ev);
    assert!(text.contains("NOTE: PCIe link at 2.5 GT/s x4"), "{text}");
}

#[tokio::test]
async fn a_gpu_gone_from_the_bus_is_said_plainly() {
    let set = shipped();
    let mut s = xid_subject(79, Category::Pcie);
    s.pci = PciAddress::parse("0000:99:00.0").ok();
    let ev = run(set.get("fallen-off-bus").unwrap(), &s).await;
    let link = step(&ev, "PCIe link of the GPU");
    assert!(
        matches!(link.status, StepStatus::Missing { .. }),
        "{link:?}"
    );
    assert!(has_note(link, "not on the PCI bus"), "{:?}", link.notes);
    // No device, no port above it: those steps are skipped with the reason.
    let port = step(&ev, "the port above the GPU (lspci)");
    assert!(
        matches!(&port.status, StepStatus::Skipped { reason } if reason.contains("{parent_pci}")),
        "{port:?}"
    );
    // nvidia-smi cannot find it either.
    let ev = run(set.get("memory").unwrap(), &s).await;
    assert!(has_note(
        step(&ev, "ECC counters"),
        "the driver has lost this GPU"
    ));
}

#[tokio::test]
async fn memory_runbook_notes_a_pending_remap() {
    let set = shipped();
    let ev = run(
        set.get("memory").unwrap(),
        &xid_subject(48, Category::Memory),
    )
    .await;
    assert!(has_note(step(&ev, "remapped rows"), "row remap is pending"));
    assert!(has_note(step(&ev, "ECC counters"), "DRAM Uncorrectable 2"));
    assert_eq!(
        step(&ev, "ECC counters").target,
        ["nvidia-smi", "-q", "-d", "ECC", "-i", "0000:17:00.0"]
    );
    assert_eq!(
        step(&ev, "remapped rows (NVML)").status,
        StepStatus::Skipped {
            reason: "NVML is not available".into()
        }
    );
}

struct FakeNvml;

impl NvmlProbe for FakeNvml {
    fn query(&self, q: NvmlQuery, gpu: PciAddress) -> Result<String, NvmlError> {
        match q {
            NvmlQuery::RemappedRows => Ok(format!("gpu: {gpu}\npending: yes\nfailure: no\n")),
            _ => Err(NvmlError::NotSupported),
        }
    }
}

#[tokio::test]
async fn nvml_steps_use_the_probe_when_there_is_one() {
    let set = shipped();
    let mut e = env();
    e.nvml = Some(Arc::new(FakeNvml));
    let ev = set
        .get("memory")
        .unwrap()
        .run(
            &xid_subject(48, Category::Memory),
            &e,
            &RunLimits::default(),
        )
        .await;
    let s = step(&ev, "remapped rows (NVML)");
    assert_eq!(s.status, StepStatus::Done { exit_code: None });
    assert_eq!(s.output, "gpu: 0000:17:00.0\npending: yes\nfailure: no\n");
    assert_eq!(s.target, ["remapped_rows", "0000:17:00.0"]);
}

#[tokio::test]
async fn driver_runbook_compares_versions() {
    let set = shipped();
    let s = subject(FindingKind::ApiMismatch, None, Category::Driver);
    let ev = run(set.get("driver").unwrap(), &s).await;
    assert!(has_note(
        step(&ev, "user-space driver version"),
        "kernel module 550.54.14 is loaded but the user-space driver is 550.90.07"
    ));
    assert!(has_note(
        step(&ev, "module version on disk"),
        "the module on disk is 550.90.07 but 550.54.14 is loaded"
    ));
    assert!(step(&ev, "loaded modules").notes.is_empty());
    assert_eq!(step(&ev, "running kernel").output, "6.8.0-45-generic\n");
}

/// `[runbooks] show_arguments = true` is the operator's opt-in to the whole command line.
#[tokio::test]
async fn show_arguments_opts_in_to_the_whole_command_line() {
    let set = shipped();
    let rb = set.get("application").unwrap();
    let c: xidwatch::runbook::RunbooksConfig =
        toml::from_str("show_arguments = true\nprocfs_root = \"/nowhere\"").unwrap();
    let mut e = env();
    e.show_arguments = c.env().show_arguments;
    assert!(e.show_arguments);
    let ev = rb
        .run(
            &xid_subject(13, Category::Application),
            &e,
            &RunLimits::default(),
        )
        .await;
    let p = step(&ev, "the process (if still alive)");
    assert!(
        p.output
            .starts_with("==> cmdline <==\npython3 train.py --lr 0.1\n"),
        "{}",
        p.output
    );
}

#[tokio::test]
async fn application_runbook_reads_the_process() {
    let set = shipped();
    let rb = set.get("application").unwrap();
    let ev = run(rb, &xid_subject(13, Category::Application)).await;
    let p = step(&ev, "the process (if still alive)");
    assert_eq!(p.target, ["/proc/4242/cmdline", "/proc/4242/status"]);
    assert!(
        p.output.starts_with(
            "==> cmdline <==\npython3 train.py --lr <value>\njob: (its cgroup cannot be read)\n"
        ),
        "{}",
        p.output
    );
    assert!(
        p.output.contains("==> status <==\nName:\tpython3"),
        "{}",
        p.output
    );
    // A process that has exited.
    let mut s = xid_subject(13, Category::Application);
    s.pid = Some(999);
    let ev = run(rb, &s).await;
    let p = step(&ev, "the process (if still alive)");
    assert!(matches!(p.status, StepStatus::Missing { .. }));
    assert!(
        has_note(p, "process 999 is no longer running"),
        "{:?}",
        p.notes
    );
    // No pid at all: skipped, with the reason.
    s.pid = None;
    let ev = run(rb, &s).await;
    assert_eq!(
        step(&ev, "the process (if still alive)").status,
        StepStatus::Skipped {
            reason:
                "needs {pid} (the process id the driver named), which this incident does not have"
                    .into()
        }
    );
}

#[tokio::test]
async fn recovery_action_runbook_relays_the_drivers_verdict() {
    let set = shipped();
    let ev = run(
        set.get("recovery-action").unwrap(),
        &xid_subject(154, Category::Driver),
    )
    .await;
    assert!(has_note(
        step(&ev, "nvidia-smi full query"),
        "the driver asks for: GPU Reset Required"
    ));
    assert!(step(&ev, "processes on this GPU")
        .output
        .contains("4242, python3"));
}

// ---------------------------------------------------------------------------------------------
// Read-only by construction: the catalog

/// Steps that are not exactly a command of the catalog, each refused. Every case of the issue,
/// abbreviations and `=` forms of the write options of every allowed program, options that take
/// a value and hide a verb, path and symlink tricks, placeholder values and literal values that
/// look like options, and reads outside the read roots.
const HOSTILE: &[&str] = &[
    // Reported: accepted by the old deny-list.
    r#"run = ["dmesg", "--cle"]"#,
    r#"run = ["dmesg", "--read-c"]"#,
    r#"run = ["journalctl", "--vacuum-t=1s"]"#,
    r#"run = ["journalctl", "--rot"]"#,
    r#"run = ["journalctl", "--flu"]"#,
    r#"run = ["journalctl", "-n", "1", "--cursor-f=/tmp/cursor"]"#,
    r#"run = ["systemctl", "--reboot-argument", "status", "reboot"]"#,
    r#"run = ["date", "--se=2000-01-01"]"#,
    r#"run = ["hostname", "--fil=/tmp/name"]"#,
    r#"run = ["ip", "-ba", "/tmp/cmds"]"#,
    r#"run = ["ps", "eww", "-C", "xidwatch"]"#,
    // dmesg: clearing, console control, endless forms, bundles.
    r#"run = ["dmesg", "-C"]"#,
    r#"run = ["dmesg", "--clear"]"#,
    r#"run = ["dmesg", "--clea"]"#,
    r#"run = ["dmesg", "-c"]"#,
    r#"run = ["dmesg", "--read-clear"]"#,
    r#"run = ["dmesg", "-Tc"]"#,
    r#"run = ["dmesg", "-cT"]"#,
    r#"run = ["dmesg", "-T", "-c"]"#,
    r#"run = ["dmesg", "-D"]"#,
    r#"run = ["dmesg", "--console-off"]"#,
    r#"run = ["dmesg", "-E"]"#,
    r#"run = ["dmesg", "-n", "1"]"#,
    r#"run = ["dmesg", "--console-level=1"]"#,
    r#"run = ["dmesg", "--console-lev", "1"]"#,
    r#"run = ["dmesg", "-w"]"#,
    r#"run = ["dmesg", "-T", "-l", "--clear"]"#,
    r#"run = ["dmesg", "-T", "-l", "err,--clear"]"#,
    // journalctl: vacuum, rotate, flush, sync, files written, bounds.
    r#"run = ["journalctl", "--vacuum-size=1M"]"#,
    r#"run = ["journalctl", "--vacuum-s=1M"]"#,
    r#"run = ["journalctl", "--vacuum-files=1"]"#,
    r#"run = ["journalctl", "--vacuum-time=1s"]"#,
    r#"run = ["journalctl", "--rotate"]"#,
    r#"run = ["journalctl", "--flush"]"#,
    r#"run = ["journalctl", "--sync"]"#,
    r#"run = ["journalctl", "--relinquish-var"]"#,
    r#"run = ["journalctl", "--cursor-file=/tmp/cursor"]"#,
    r#"run = ["journalctl", "--setup-keys"]"#,
    r#"run = ["journalctl", "--update-catalog"]"#,
    r#"run = ["journalctl", "-k", "-n", "50", "--no-pager", "--rotate"]"#,
    r#"run = ["journalctl", "-k", "-n", "50", "--no-pager", "--vacuum-t=1s"]"#,
    r#"run = ["journalctl", "-k", "-n=50", "--no-pager"]"#,
    r#"run = ["journalctl", "-k", "-n50", "--no-pager"]"#,
    r#"run = ["journalctl", "-k", "-n", "100000", "--no-pager"]"#,
    r#"run = ["journalctl", "-k", "-n", "-1", "--no-pager"]"#,
    r#"run = ["journalctl", "-u", "sshd", "-n", "5", "--no-pager"]"#,
    r#"run = ["journalctl", "-u", "--flush", "-n", "5", "--no-pager"]"#,
    r#"run = ["journalctl", "-u", "xidwatch", "-n", "5", "--no-pager", "--flush"]"#,
    r#"run = ["journalctl", "-k", "-n", "5"]"#,
    // systemctl: verbs, and options that take a value and hide one.
    r#"run = ["systemctl", "reboot"]"#,
    r#"run = ["systemctl", "poweroff"]"#,
    r#"run = ["systemctl", "kexec"]"#,
    r#"run = ["systemctl", "suspend"]"#,
    r#"run = ["systemctl", "restart", "nvidia-persistenced"]"#,
    r#"run = ["systemctl", "stop", "nvidia-fabricmanager"]"#,
    r#"run = ["systemctl", "kill", "nvidia-fabricmanager"]"#,
    r#"run = ["systemctl", "isolate", "rescue.target"]"#,
    r#"run = ["systemctl", "daemon-reload"]"#,
    r#"run = ["systemctl", "--reboot-argument=x", "status", "nvidia-persistenced", "--no-pager"]"#,
    r#"run = ["systemctl", "status", "reboot", "--no-pager"]"#,
    r#"run = ["systemctl", "status", "--force", "--no-pager"]"#,
    r#"run = ["systemctl", "is-active", "nvidia-persistenced", "reboot"]"#,
    r#"run = ["systemctl", "-H", "otherhost", "status", "xidwatch", "--no-pager"]"#,
    // nvidia-smi: resets, settings, files written, loops, value-hidden options.
    r#"run = ["nvidia-smi", "-r"]"#,
    r#"run = ["nvidia-smi", "--gpu-reset"]"#,
    r#"run = ["nvidia-smi", "-r", "-i", "{pci}"]"#,
    r#"run = ["nvidia-smi", "-pm", "1"]"#,
    r#"run = ["nvidia-smi", "--persistence-m=1"]"#,
    r#"run = ["nvidia-smi", "-pl", "250"]"#,
    r#"run = ["nvidia-smi", "--power-limit=250"]"#,
    r#"run = ["nvidia-smi", "-e", "0"]"#,
    r#"run = ["nvidia-smi", "--ecc-config=0"]"#,
    r#"run = ["nvidia-smi", "-p", "0"]"#,
    r#"run = ["nvidia-smi", "-c", "3"]"#,
    r#"run = ["nvidia-smi", "-mig", "1"]"#,
    r#"run = ["nvidia-smi", "-ac", "1215,1410"]"#,
    r#"run = ["nvidia-smi", "-rac"]"#,
    r#"run = ["nvidia-smi", "-lgc", "1000,1400"]"#,
    r#"run = ["nvidia-smi", "--lock-gpu-clocks=1000"]"#,
    r#"run = ["nvidia-smi", "mig", "-dgi"]"#,
    r#"run = ["nvidia-smi", "mig", "-cgi", "9", "-C"]"#,
    r#"run = ["nvidia-smi", "nvlink", "-r", "0"]"#,
    r#"run = ["nvidia-smi", "drain", "-p", "{pci}", "-m", "1"]"#,
    r#"run = ["nvidia-smi", "-q", "-f", "/tmp/out"]"#,
    r#"run = ["nvidia-smi", "-q", "--filename=/tmp/out"]"#,
    r#"run = ["nvidia-smi", "--query-gpu=index", "--format=csv", "-f", "/tmp/out"]"#,
    r#"run = ["nvidia-smi", "-q", "-l", "1"]"#,
    r#"run = ["nvidia-smi", "dmon"]"#,
    r#"run = ["nvidia-smi", "pmon", "-c", "0"]"#,
    r#"run = ["nvidia-smi", "-q", "-d", "ECC", "-r"]"#,
    r#"run = ["nvidia-smi", "-q", "-d", "ECC,--reset"]"#,
    r#"run = ["nvidia-smi", "--query-gpu=index,--gpu-reset", "--format=csv"]"#,
    r#"run = ["nvidia-smi", "-q", "-i", "0", "--gpu-reset"]"#,
    // lspci: config space dumps, direct hardware access, files read or written.
    r#"run = ["lspci", "-xxx", "-s", "{pci}"]"#,
    r#"run = ["lspci", "-xxxx", "-s", "{pci}"]"#,
    r#"run = ["lspci", "-vvv", "-s", "{pci}", "-xxx"]"#,
    r#"run = ["lspci", "-vv", "-s", "{pci}"]"#,
    r#"run = ["lspci", "-s", "{pci}", "-vvv"]"#,
    r#"run = ["lspci", "-vvvs", "{pci}"]"#,
    r#"run = ["lspci", "-vvv", "-s", "17:00.0"]"#,
    r#"run = ["lspci", "-H1"]"#,
    r#"run = ["lspci", "-tv", "-H", "1"]"#,
    r#"run = ["lspci", "-F", "/tmp/dump"]"#,
    r#"run = ["lspci", "-q"]"#,
    // modinfo, uname, ip, and others.
    r#"run = ["modinfo", "-F", "version", "/tmp/evil.ko"]"#,
    r#"run = ["modinfo", "-Fversion", "nvidia"]"#,
    r#"run = ["modinfo", "-b", "/tmp", "-F", "version", "nvidia"]"#,
    r#"run = ["modinfo", "-F", "version", "nvidia", "nvidia_uvm"]"#,
    r#"run = ["ip", "link", "set", "ib0", "down"]"#,
    r#"run = ["ip", "-b", "/tmp/cmds"]"#,
    r#"run = ["ip", "-batch", "/tmp/cmds"]"#,
    r#"run = ["ip", "-force", "-b", "/tmp/cmds"]"#,
    r#"run = ["ip", "netns", "exec", "x", "reboot"]"#,
    r#"run = ["ip", "-s", "link", "show", "-b", "/tmp/cmds"]"#,
    r#"run = ["sysctl", "-w", "kernel.panic=1"]"#,
    r#"run = ["setpci", "-s", "{pci}", "COMMAND=0"]"#,
    r#"run = ["rmmod", "nvidia"]"#,
    r#"run = ["modprobe", "-r", "nvidia"]"#,
    r#"run = ["reboot"]"#,
    r#"run = ["kill", "-9", "{pid}"]"#,
    r#"run = ["tee", "/sys/bus/pci/devices/{pci}/remove"]"#,
    r#"run = ["cat", "/proc/1/environ"]"#,
    r#"run = ["ps", "e", "-p", "{pid}"]"#,
    r#"run = ["ls", "-la", "/etc"]"#,
    r#"run = ["ls", "-la", "/proc/1/environ"]"#,
    // Programs by path, relative, disguised, or through a shell or launcher.
    r#"run = ["/usr/bin/nvidia-smi", "-L"]"#,
    r#"run = ["./nvidia-smi", "-L"]"#,
    r#"run = ["../../usr/bin/dmesg"]"#,
    r#"run = ["bin/lspci", "-tv"]"#,
    r#"run = ["/proc/self/fd/3"]"#,
    r#"run = ["nvidia-smi ", "-L"]"#,
    r#"run = ["NVIDIA-SMI", "-L"]"#,
    r#"run = ["{pci}"]"#,
    r#"run = ["env", "PATH=/tmp", "nvidia-smi", "-L"]"#,
    r#"run = ["sudo", "nvidia-smi", "-L"]"#,
    r#"run = ["busybox", "reboot"]"#,
    r#"run = ["sh", "-c", "reboot"]"#,
    r#"run = ["bash", "-c", "nvidia-smi -r"]"#,
    r#"run = ["xargs", "reboot"]"#,
    r#"run = ["timeout", "1", "reboot"]"#,
    r#"run = ["python3", "-c", "import os"]"#,
    r#"run = ["find", "/", "-delete"]"#,
    // Placeholders where their type does not belong, and values that look like options.
    r#"run = ["nvidia-smi", "-{xid}"]"#,
    r#"run = ["nvidia-smi", "-q", "-i", "{xid}"]"#,
    r#"run = ["lspci", "-vvv", "-s", "{pid}"]"#,
    r#"run = ["journalctl", "-k", "-n", "{pid}", "--no-pager"]"#,
    r#"run = ["nvidia-smi", "--query-gpu={pci}", "--format=csv"]"#,
    r#"run = ["systemctl", "status", "{uuid}", "--no-pager"]"#,
    r#"run = ["lspci", "-vvv", "-s", "x{pci}"]"#,
    r#"run = ["nvidia-smi", "-q", "-i", "-r"]"#,
    r#"run = ["nvidia-smi", "-q", "-i", "--gpu-reset"]"#,
    r#"run = ["lspci", "-vvv", "-s", "--help"]"#,
    r#"run = ["modinfo", "-F", "-k", "nvidia"]"#,
    r#"run = ["nvidia-smi", "-q", "-d", "-r"]"#,
    r#"run = ["ls", "-la", "--help"]"#,
    // Reads outside the roots, through `..`, or of never-read files.
    r#"read = "/etc/shadow""#,
    r#"read = "/proc/{pid}/environ""#,
    r#"read = "/proc/1/environ""#,
    r#"read = "/proc/kmsg""#,
    r#"read = "/proc/kcore""#,
    r#"read = "/proc/sysrq-trigger""#,
    r#"read = "/proc/{pid}/mem""#,
    r#"read = "/proc/{pid}/root/etc/shadow""#,
    r#"read = "/proc/{pid}/cwd/secret""#,
    r#"read = "/proc/{pid}/fd/0""#,
    r#"read = "/sys/bus/pci/devices/{pci}/config""#,
    r#"read = "/sys/bus/pci/devices/{pci}/rom""#,
    r#"read = "/sys/bus/pci/devices/{pci}/resource0""#,
    r#"read = "/sys/bus/pci/devices/{pci}/resource2_wc""#,
    r#"read = "/sys/bus/pci/devices/{pci}/vpd""#,
    r#"read = "/sys/bus/pci/devices/{pci}/../../../../etc/shadow""#,
    r#"read = "/proc/driver/nvidia/../../1/environ""#,
    r#"read = "/proc/driver/nvidia//version""#,
    r#"read = "proc/driver/nvidia/version""#,
    r#"read = "/sys/kernel/debug/x""#,
    r#"read = "/proc/{pci}/status""#,
    r#"read = "/sys/bus/pci/devices/{pid}/x""#,
];

#[test]
fn hostile_steps_are_refused_naming_file_step_and_nearest_pattern() {
    assert!(HOSTILE.len() >= 100, "{} cases", HOSTILE.len());
    let catalog = Catalog::default();
    let dir = tempfile::tempdir().unwrap();
    for (i, step) in HOSTILE.iter().enumerate() {
        let text = format!(
            "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\n[[step]]\nname = \"fine\"\nrun = [\"lsmod\"]\n\n[[step]]\nname = \"bad one\"\n{step}\n"
        );
        let path = dir.path().join(format!("case{i}.toml"));
        std::fs::write(&path, &text).unwrap();
        let errs = RunbookSet::load(&[dir.path().to_path_buf()], &catalog).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(errs.len(), 1, "{step}: {errs:?}");
        let e = &errs[0];
        assert!(e.is_refusal(), "{step}: {e}");
        assert_eq!(e.path, path);
        let at = e.step.as_ref().unwrap();
        assert_eq!((at.index, at.name.as_deref()), (2, Some("bad one")));
        let shown = e.to_string();
        assert!(
            shown.starts_with(&format!(
                "{}: step 2 \"bad one\" (line 11): refused [",
                path.display()
            )),
            "{shown}"
        );
        if step.starts_with("run") {
            assert_eq!(
                e.kind,
                LoadErrorKind::Refused(Rule::NotInCatalog),
                "{shown}"
            );
            assert!(shown.contains("the nearest is `"), "{shown}");
            // The same argv, as it would run, matches no pattern either.
            let v: toml::Value = toml::from_str(step).unwrap();
            let argv: Vec<String> = v["run"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_string())
                .collect();
            assert!(!catalog.patterns().any(|p| p.matches(&argv)), "{step}");
        } else {
            assert_eq!(e.kind, LoadErrorKind::Refused(Rule::NotReadable), "{shown}");
        }
    }
}

#[test]
fn the_nearest_pattern_is_the_one_meant() {
    let text = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lspci\", \"-vv\", \"-s\", \"{pci}\"]\n";
    let errs = Runbook::from_toml(Path::new("rb.toml"), text, &Catalog::default()).unwrap_err();
    assert!(
        errs[0]
            .to_string()
            .contains("the nearest is `lspci -vvv -s {pci}`"),
        "{}",
        errs[0]
    );
}

#[test]
fn operator_additions_are_exact_and_keep_the_argument_rules() {
    let extra = |p: &[&str]| Catalog::with_additions(&[p.iter().map(|s| s.to_string()).collect()]);
    let c = extra(&["ibstat", "{int:1-4}"]).unwrap();
    let load = |argv: &str| {
        let text = format!("title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = {argv}\n");
        Runbook::from_toml(Path::new("x.toml"), &text, &c)
    };
    assert!(load(r#"["ibstat", "2"]"#).is_ok());
    for bad in [
        r#"["ibstat"]"#,
        r#"["ibstat", "5"]"#,
        r#"["ibstat", "2", "-x"]"#,
        r#"["ibstat", "--2"]"#,
    ] {
        assert!(load(bad).is_err(), "{bad}");
    }
    // Programs are not listed (a shell or `reboot` is harmless inside the confinement, shown by
    // the confinement tests); paths, slots and tokens still are.
    for never in [
        &["/usr/sbin/ibstat"][..],
        &["cat", "/proc/self/environ"],
        &["grep", "-r", "token", "/proc"],
        &["nvidia-smi", "-{int:1-9}"],
        &["{pci}"],
        &["ibstat", "a b"],
    ] {
        assert!(extra(never).is_err(), "{never:?}");
    }
}

/// Tokens random argv are made of: every program and literal of the catalog, slot values, and
/// hostile options.
const TOKENS: &[&str] = &[
    "lsmod",
    "lspci",
    "modinfo",
    "uname",
    "nvidia-smi",
    "journalctl",
    "dmesg",
    "ip",
    "systemctl",
    "ls",
    "-tv",
    "-vvv",
    "-vv",
    "-s",
    "-D",
    "-nn",
    "-d",
    "10de:",
    "-F",
    "version",
    "nvidia",
    "-r",
    "-a",
    "--version",
    "-L",
    "-q",
    "-i",
    "-d",
    "ECC",
    "ECC,POWER",
    "--format=csv",
    "topo",
    "-m",
    "nvlink",
    "-e",
    "mig",
    "-lgi",
    "dmon",
    "pmon",
    "-c",
    "1",
    "0",
    "50",
    "-k",
    "-b",
    "-n",
    "--no-pager",
    "-u",
    "xidwatch",
    "link",
    "show",
    "status",
    "is-active",
    "-T",
    "-l",
    "err",
    "0000:17:00.0",
    "17:00.0",
    "-la",
    "/proc/driver/nvidia",
    "--clear",
    "--cle",
    "-C",
    "--rot",
    "--flush",
    "--vacuum-t=1s",
    "reboot",
    "--reboot-argument",
    "-xxx",
    "-H1",
    "-f",
    "/tmp/x",
    "--gpu-reset",
    "-pm",
    "e",
    "eww",
    "--query-gpu=index",
    "--query-gpu=index,name",
    "set",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// A random argv loads exactly when it is a pattern of the catalog, token for token; and an
    /// argv with an abbreviated long option is never one.
    #[test]
    fn argv_that_is_no_pattern_is_refused(
        argv in prop::collection::vec(prop::sample::select(TOKENS), 1..7),
        cut in 3usize..12,
    ) {
        let catalog = Catalog::default();
        let argv: Vec<String> = argv.into_iter().map(String::from).collect();
        let load = |argv: &[String]| {
            let run = toml::Value::Array(argv.iter().map(|a| toml::Value::String(a.clone())).collect());
            let text = format!("title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = {run}\n");
            Runbook::from_toml(Path::new("p.toml"), &text, &catalog).is_ok()
        };
        let is_pattern = catalog.patterns().any(|p| p.matches(&argv));
        prop_assert_eq!(load(&argv), is_pattern, "{:?}", argv);
        // Abbreviate one long option: getopt would take it, the catalog never does.
        if let Some(i) = argv.iter().position(|a| a.starts_with("--") && !a.contains('=') && a.len() > cut) {
            let mut short = argv.clone();
            short[i].truncate(cut);
            prop_assert!(!load(&short), "{:?}", short);
        }
    }
}

#[test]
fn a_refused_runbook_fails_the_load_with_every_problem_listed() {
    let dir = tempfile::tempdir().unwrap();
    let good = "title = \"g\"\n[[match]]\nxids = [13]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lsmod\"]\n";
    let bad = "title = \"b\"\n[[match]]\nxids = [79]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nname = \"reset it\"\nrun = [\"nvidia-smi\", \"-r\", \"-i\", \"{pci}\"]\n[[step]]\nrun = [\"rmmod\", \"nvidia\"]\n";
    std::fs::write(dir.path().join("good.toml"), good).unwrap();
    std::fs::write(dir.path().join("bad.toml"), bad).unwrap();
    let errs = RunbookSet::load(&[dir.path().to_path_buf()], &Catalog::default()).unwrap_err();
    assert_eq!(errs.len(), 2, "{}", render_load_errors(&errs));
    let report = render_load_errors(&errs);
    assert!(
        report.contains("bad.toml: step 1 \"reset it\" (line 7): refused [not-in-catalog]: \"nvidia-smi -r -i {pci}\" is not a command of the catalog; the nearest is `nvidia-smi -q -i {gpu}`"),
        "{report}"
    );
    assert!(
        report.contains("bad.toml: step 2 \"rmmod nvidia\" (line 10): refused [not-in-catalog]"),
        "{report}"
    );
    assert!(!report.contains("good.toml"));
    assert!(report.contains("2 problem(s) in runbooks, 2 of them refused steps"));
    // A daemon can go on with what loaded; the refused runbook is not among it.
    let (set, errs) = RunbookSet::load_partial(&[dir.path().to_path_buf()], &Catalog::default());
    assert_eq!(errs.len(), 2);
    assert_eq!(set.iter().map(|r| r.name()).collect::<Vec<_>>(), ["good"]);
}

#[test]
fn format_errors_name_the_place() {
    let p = Path::new("runbooks/typo.toml");
    let load = |text: &str| Runbook::from_toml(p, text, &Catalog::default()).unwrap_err();
    let head = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n";
    // Unknown keys, with toml's line and column.
    let e = load(&format!(
        "{head}[[step]]\nrun = [\"lsmod\"]\ntimout_secs = 3\n"
    ));
    assert_eq!(e[0].kind, LoadErrorKind::Syntax);
    assert_eq!(e[0].line, Some(8));
    let shown = e[0].to_string();
    assert!(shown.contains("unknown field `timout_secs`"), "{shown}");
    assert!(shown.contains("line 8, column 1"), "{shown}");
    let e = load(&format!(
        "{head}colour = \"red\"\n[[step]]\nrun = [\"lsmod\"]\n"
    ));
    assert!(
        e[0].to_string().contains("unknown field `colour`"),
        "{}",
        e[0]
    );
    // Values that make no sense.
    for (bad, needle) in [
        (
            "[[step]]\nrun = [\"lsmod\"]\nread = \"/proc/version\"\n",
            "exactly one of run, read, kmsg or nvml",
        ),
        (
            "[[step]]\nrun = [\"echo\", \"{message}\"]\n",
            "unknown placeholder {message}",
        ),
        ("[[step]]\nnvml = \"reset_gpu\"\n", "unknown nvml query"),
        (
            "[[step]]\nrun = [\"lsmod\"]\ntimeout_secs = 0\n",
            "timeout_secs = 0",
        ),
        (
            "[[step]]\nkmsg = { lines_before = 3, seconds_before = 3 }\n",
            "not both",
        ),
        (
            "[[match]]\nkinds = [\"xdi\"]\n[[step]]\nrun = [\"lsmod\"]\n",
            "unknown kind \"xdi\"",
        ),
        (
            "[[match]]\nxids = [\"150-144\"]\n[[step]]\nrun = [\"lsmod\"]\n",
            "empty",
        ),
        (
            "[[match]]\n[[step]]\nrun = [\"lsmod\"]\n",
            "would match everything",
        ),
        ("", "no [[step]]"),
    ] {
        let e = load(&format!("{head}{bad}"));
        assert!(
            e.iter().any(|e| e.to_string().contains(needle)),
            "{bad}: {e:?}"
        );
        assert!(e.iter().all(|e| e.path == p));
    }
    let e = load("title = \"t\"\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"lsmod\"]\n");
    assert!(e[0].to_string().contains("matches nothing"), "{}", e[0]);
    let e = Runbook::from_toml(
        Path::new("Bad Name.toml"),
        &format!("{head}[[step]]\nrun = [\"lsmod\"]\n"),
        &Catalog::default(),
    )
    .unwrap_err();
    assert!(e[0].to_string().contains("runbook's name"), "{}", e[0]);
    let errs = RunbookSet::load(
        &[PathBuf::from("/nonexistent/runbooks")],
        &Catalog::default(),
    )
    .unwrap_err();
    assert_eq!(errs[0].kind, LoadErrorKind::Io);
}

// ---------------------------------------------------------------------------------------------
// Running programs

fn pid_gone(pid: i32) -> bool {
    // Dead, or a zombie waiting for a reaper that is not us.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

fn wait_gone(pid: i32) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if pid_gone(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The pid the fake sleeper printed as "WHO PID" on stderr.
fn read_pid(output: &str, who: &str) -> i32 {
    output
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{who} "))?.parse().ok())
        .unwrap_or_else(|| panic!("no \"{who} PID\" in {output:?} (the fake tool did not start?)"))
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let rb = test_runbook(
        "[limits]\nstep_timeout_secs = 1",
        "[[step]]\nname = \"sleeper\"\nrun = [\"fake-sleeper\"]\n",
    );
    let t0 = Instant::now();
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    let took = t0.elapsed();
    let s = &ev.steps[0];
    assert_eq!(s.status, StepStatus::TimedOut { after_ms: 1000 }, "{s:?}");
    assert!(s.output.starts_with("started\n"), "{s:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let parent = read_pid(&s.output, "parent");
    let child = read_pid(&s.output, "child");
    assert!(
        wait_gone(parent),
        "the program {parent} survived its timeout"
    );
    assert!(wait_gone(child), "its child {child} survived the timeout");
    assert!(render_evidence(&ev).contains("TIMED OUT after 1000 ms (process group killed)"));
}

#[tokio::test]
async fn output_is_capped_and_the_rest_counted() {
    let rb = test_runbook(
        "[limits]\nmax_output_bytes = 4096",
        "[[step]]\nname = \"flood\"\nrun = [\"fake-flood\", \"1000000\"]\n\n[[step]]\nname = \"small\"\nrun = [\"fake-flood\", \"10\"]\n",
    );
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    let flood = step(&ev, "flood");
    assert_eq!(flood.status, StepStatus::Done { exit_code: Some(0) });
    assert_eq!(flood.output.len(), 4096);
    assert!(flood.output.bytes().all(|b| b == b'x'));
    assert_eq!(flood.bytes_dropped, 1_000_000 + 5 - 4096);
    let small = step(&ev, "small");
    assert_eq!(small.output, "xxxxxxxxxxoops\n"); // stdout, then stderr
    assert_eq!(small.bytes_dropped, 0);
}

#[tokio::test]
async fn an_endless_flood_is_capped_and_killed() {
    let rb = test_runbook(
        "[limits]\nmax_output_bytes = 1000\nstep_timeout_secs = 0.3",
        "[[step]]\nrun = [\"fake-flood\", \"forever\"]\n",
    );
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    let s = &ev.steps[0];
    assert_eq!(s.status, StepStatus::TimedOut { after_ms: 300 });
    assert_eq!(s.output.len(), 1000);
    assert!(s.output.starts_with("0123456789abcdef\n"));
    assert!(s.bytes_dropped > 0);
}

#[tokio::test]
async fn programs_get_a_clean_environment_and_no_stdin() {
    let rb = test_runbook("", "[[step]]\nrun = [\"env-dump\"]\n");
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    let out = &ev.steps[0].output;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines.contains(&format!("PATH={CHILD_PATH}").as_str()),
        "{out}"
    );
    assert!(lines.contains(&"LC_ALL=C"), "{out}");
    // An empty working directory of its own, not `/`: a relative path names nothing.
    let cwd = lines.iter().find_map(|l| l.strip_prefix("cwd=")).unwrap();
    assert!(cwd.starts_with('/') && cwd != "/", "{out}");
    assert!(lines.contains(&"listing=[]"), "{out}");
    assert!(lines.contains(&"stdin=[]"), "{out}");
    // Nothing of this process leaks: the only variables are the two set, and what the shell
    // running the fake tool adds itself.
    let shell_own = ["PWD", "OLDPWD", "SHLVL", "_"];
    for l in lines.iter().filter(|l| {
        !["cwd=", "stdin=", "listing="]
            .iter()
            .any(|p| l.starts_with(p))
    }) {
        let name = l.split('=').next().unwrap_or("");
        assert!(
            ["PATH", "LC_ALL"].contains(&name) || shell_own.contains(&name),
            "unexpected variable {l:?} in\n{out}"
        );
    }
    // (This process has variables of its own, HOME, PATH and the like; none reached the child.)
    assert!(std::env::vars().any(|(k, _)| !["PATH", "LC_ALL"].contains(&k.as_str())));
}

/// `/proc/self/status` of a step, as the fake tool id-caps prints it: field -> value.
async fn status_of_a_step(env: &RunbookEnv) -> std::collections::BTreeMap<String, String> {
    let rb = test_runbook("", "[[step]]\nrun = [\"id-caps\"]\n");
    let ev = rb
        .run(
            &Subject::manual(None, None, None),
            env,
            &RunLimits::default(),
        )
        .await;
    let s = &ev.steps[0];
    assert_eq!(s.status, StepStatus::Done { exit_code: Some(0) }, "{s:?}");
    s.output
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

#[tokio::test]
async fn programs_run_without_privileges() {
    // Whoever runs the tests: no new privileges, and no capability the program holds or passes
    // on. (The inheritable set grants nothing by itself; under a system call filter that refuses
    // capset, as the service unit's does, it may keep what the daemon had.)
    let st = status_of_a_step(&env()).await;
    assert_eq!(st["NoNewPrivs"], "1", "{st:?}");
    for set in ["CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(st[set], "0000000000000000", "{set}: {st:?}");
    }
}

/// CI runs this as root: the step runs as the service user or nobody, with an empty bounding
/// set, whoever started xidwatch (sudo xidwatch runbook run / test-alert / scan --runbooks go
/// through the same code).
#[tokio::test]
#[ignore = "needs root"]
async fn as_root_programs_run_as_an_unprivileged_user() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "run this test as root");
    let st = status_of_a_step(&env()).await;
    let uids: Vec<&str> = st["Uid"].split_whitespace().collect();
    let want = [libc_user("xidwatch"), libc_user("nobody")]
        .into_iter()
        .flatten()
        .next()
        .expect("a user xidwatch or nobody");
    let want = want.to_string();
    assert_eq!(
        uids,
        [want.as_str(); 4],
        "real, effective, saved, fs: {st:?}"
    );
    assert!(!st["Groups"].split_whitespace().any(|g| g == "0"), "{st:?}");
    for set in ["CapBnd", "CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(st[set], "0000000000000000", "{set}: {st:?}");
    }
    assert_eq!(st["NoNewPrivs"], "1", "{st:?}");
}

fn libc_user(name: &str) -> Option<u32> {
    let out = std::process::Command::new("id")
        .args(["-u", name])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// As root, the shipped `dmesg` pattern keeps CAP_SYSLOG (and only it), so the unprivileged
/// user still reads the kernel log where `kernel.dmesg_restrict = 1`.
#[tokio::test]
#[ignore = "needs root"]
async fn as_root_kernel_log_patterns_keep_cap_syslog_only() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "run this test as root");
    let text = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"dmesg\"]\n";
    let rb = Runbook::from_toml(Path::new("k.toml"), text, &Catalog::default()).unwrap();
    let mut env = RunbookEnv::system();
    env.sysfs_root = fixture("sysfs");
    let ev = rb
        .run(
            &Subject::manual(None, None, None),
            &env,
            &RunLimits::default(),
        )
        .await;
    let s = &ev.steps[0];
    let restrict = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").unwrap_or_default();
    assert_eq!(
        s.status,
        StepStatus::Done { exit_code: Some(0) },
        "dmesg_restrict={restrict} {s:?}"
    );
    assert!(!s.output.trim().is_empty());
}

#[tokio::test]
async fn secrets_are_cut_out_of_the_evidence() {
    let secret = "xw-secret-9f8e7d6c5b4a";
    let mut env = env();
    env.secrets = Redactor::new([secret.to_string()]);
    let rb = test_runbook(
        "",
        &format!(
            "[[step]]\nname = \"leaky\"\nrun = [\"echo-argv\", \"token={secret}\"]\n\
             [[step]]\nname = \"cut\"\nrun = [\"echo-argv\", \"token={secret}\"]\nmax_output_bytes = 16\n"
        ),
    );
    let ev = rb
        .run(
            &Subject::manual(None, None, None),
            &env,
            &RunLimits::default(),
        )
        .await;
    let shown = format!("{ev:?}{}", render_evidence(&ev));
    assert!(!shown.contains(secret), "{shown}");
    assert_eq!(ev.steps[0].output, "token=<redacted>\n");
    assert_eq!(ev.steps[0].target, ["echo-argv", "token=<redacted>"]);
    // Cut by the output cap in the middle: the part kept is cut out as well.
    assert_eq!(ev.steps[1].output, "token=<redacted>");
    assert!(ev.steps[1].bytes_dropped > 0);
}

#[tokio::test]
async fn missing_unrunnable_and_disguised_programs_are_recorded() {
    let rb = test_runbook(
        "",
        "[[step]]\nname = \"missing\"\nrun = [\"not-installed-anywhere\"]\n[[step]]\nname = \"noexec\"\nrun = [\"not-executable\"]\n[[step]]\nname = \"sneaky\"\nrun = [\"sneaky\", \"-c\", \"id\"]\n",
    );
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    assert!(
        matches!(&step(&ev, "missing").status, StepStatus::Missing { what } if what.starts_with("not-installed-anywhere is not installed")),
        "{:?}",
        step(&ev, "missing")
    );
    assert!(
        matches!(&step(&ev, "noexec").status, StepStatus::Failed { error } if error.contains("not executable")),
        "{:?}",
        step(&ev, "noexec")
    );
    // An allowed name that is a link to another program (here a shell) is refused when it would
    // run: what runs must be the program the pattern names.
    let sneaky = step(&ev, "sneaky");
    assert!(
        matches!(&sneaky.status, StepStatus::Failed { error } if error.contains("another program")),
        "{sneaky:?}"
    );
    assert!(sneaky.output.is_empty());
}

#[tokio::test]
async fn steps_run_side_by_side_up_to_the_limit() {
    let (_together, name) = scratch();
    let steps = |d: &str| {
        format!(
            "[[step]]\nname = \"a\"\nrun = [\"barrier\", \"{d}\", \"2\"]\n[[step]]\nname = \"b\"\nrun = [\"barrier\", \"{d}\", \"2\"]\n"
        )
    };
    let rb = test_runbook(
        "[limits]\nconcurrency = 2\nstep_timeout_secs = 20",
        &steps(&name),
    );
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    for s in &ev.steps {
        assert_eq!(s.status, StepStatus::Done { exit_code: Some(0) }, "{s:?}");
        assert_eq!(s.output, "met\n");
    }
    // One at a time: each waits in vain for a partner and is killed at its timeout.
    let (_alone, name) = scratch();
    let rb = test_runbook(
        "[limits]\nconcurrency = 1\nstep_timeout_secs = 0.3",
        &steps(&name),
    );
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    assert_eq!(ev.steps[0].status, StepStatus::TimedOut { after_ms: 300 });
    assert_eq!(ev.steps[1].status, StepStatus::TimedOut { after_ms: 300 });
}

#[tokio::test]
async fn the_budget_bounds_the_whole_runbook() {
    let (_dir, d) = scratch();
    let rb = test_runbook(
        "[limits]\nbudget_secs = 0.5\nconcurrency = 1\nstep_timeout_secs = 30",
        &format!("[[step]]\nname = \"first\"\nrun = [\"fake-sleeper\", \"{d}\"]\n[[step]]\nname = \"second\"\nrun = [\"fake-sleeper\", \"{d}\"]\n"),
    );
    let t0 = Instant::now();
    let ev = run(&rb, &Subject::manual(None, None, None)).await;
    assert!(t0.elapsed() < Duration::from_secs(10));
    let first = step(&ev, "first");
    assert!(
        matches!(first.status, StepStatus::TimedOut { after_ms } if after_ms <= 500),
        "{first:?}"
    );
    assert!(
        has_note(first, "cut short by the runbook's budget of 0.5 s"),
        "{:?}",
        first.notes
    );
    assert!(
        matches!(&step(&ev, "second").status, StepStatus::Skipped { reason } if reason.contains("budget")),
        "{:?}",
        step(&ev, "second")
    );
    // The caller's ceiling applies too.
    let limits = RunLimits {
        max_step_timeout: Duration::from_millis(200),
        ..RunLimits::default()
    };
    let rb = test_runbook(
        "",
        "[[step]]\nrun = [\"fake-flood\", \"forever\"]\ntimeout_secs = 30\n",
    );
    let ev = rb
        .run(&Subject::manual(None, None, None), &env(), &limits)
        .await;
    assert_eq!(ev.steps[0].status, StepStatus::TimedOut { after_ms: 200 });
}

// ---------------------------------------------------------------------------------------------
// Placeholders and log text

#[tokio::test]
async fn a_step_without_its_value_is_skipped_with_the_reason() {
    let rb = test_runbook(
        "",
        "[[step]]\nname = \"by pid\"\nrun = [\"echo-argv\", \"{pid}\"]\n[[step]]\nname = \"by uuid\"\nread = \"/proc/driver/nvidia/gpus/{uuid}\"\n[[step]]\nname = \"plain\"\nrun = [\"echo-argv\", \"ok\"]\n",
    );
    let ev = run(&rb, &Subject::manual(Some(gpu()), None, None)).await;
    let s = step(&ev, "by pid");
    assert_eq!(
        s.status,
        StepStatus::Skipped {
            reason:
                "needs {pid} (the process id the driver named), which this incident does not have"
                    .into()
        }
    );
    assert_eq!(s.target, ["echo-argv", "{pid}"]);
    assert!(
        matches!(&step(&ev, "by uuid").status, StepStatus::Skipped { reason } if reason.contains("{uuid}"))
    );
    assert_eq!(step(&ev, "plain").output, "ok\n");
}

#[tokio::test]
async fn log_text_cannot_reach_an_argv() {
    let evil = "$(reboot); nvidia-smi -r `rmmod nvidia` {pci} {pid} --gpu-reset\n\x1b[2J";
    let raw = vec![format!(
        "NVRM: Xid (PCI:0000:17:00): 13, pid=4242, name={evil}"
    )];
    let inc = dirty_incident(
        evil,
        raw,
        Some(format!("GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f {evil}")),
    );
    let s = Subject::from(&inc);
    assert_eq!(s.uuid, None, "a malformed UUID is dropped, not used");
    let rb = test_runbook(
        "",
        "[[step]]\nname = \"argv\"\nrun = [\"echo-argv\", \"{pci}\", \"{xid}\", \"{pid}\", \"--id={pci}\"]\n\
         [[step]]\nname = \"uuid\"\nrun = [\"echo-argv\", \"{uuid}\"]\n\
         [[step]]\nname = \"log\"\nkmsg = { lines_before = 5, lines_after = 5 }\n",
    );
    let ev = run(&rb, &s).await;
    let argv = step(&ev, "argv");
    let want = ["0000:17:00.0", "13", "4242", "--id=0000:17:00.0"];
    assert_eq!(argv.target[1..], want);
    assert_eq!(argv.output, want.map(|w| format!("{w}\n")).concat());
    assert!(
        matches!(&step(&ev, "uuid").status, StepStatus::Skipped { reason } if reason.contains("{uuid}"))
    );
    // The log text is shown in the excerpt, neutralised, and nowhere else.
    let log = step(&ev, "log");
    assert!(
        log.output.contains("name=$(reboot); nvidia-smi -r"),
        "{}",
        log.output
    );
    assert!(!log.output.contains('\x1b'));
    for st in &ev.steps {
        assert!(st.target.iter().all(|t| !t.contains("reboot")), "{st:?}");
    }
    // A well-formed UUID is used.
    let inc = dirty_incident(
        evil,
        vec![],
        Some("GPU-5F2C1E0A-7b3d-4c61-9e8f-0a1b2c3d4e5f".into()),
    );
    let ev = run(&rb, &Subject::from(&inc)).await;
    assert_eq!(
        step(&ev, "uuid").output,
        "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Whatever the log said, every placeholder expands to the same checked value.
    #[test]
    fn no_log_text_changes_an_expansion(
        text in ".*",
        raw in prop::collection::vec(".*", 0..4),
        uuid in ".*",
    ) {
        prop_assume!(GpuUuid::parse(&uuid).is_none());
        let clean = Subject::from(&dirty_incident("", vec![], None));
        let dirty = Subject::from(&dirty_incident(&text, raw, Some(uuid)));
        let port = PciAddress::parse("0000:16:01.0").ok();
        for p in Placeholder::ALL {
            let t = Template::parse(&format!("-x={p}/{p}")).unwrap();
            prop_assert_eq!(
                t.expand(&Values::for_subject(&clean, port)),
                t.expand(&Values::for_subject(&dirty, port))
            );
        }
    }
}

#[tokio::test]
async fn the_excerpt_comes_from_the_incident() {
    let mut cause = Finding::new(
        FindingKind::Xid,
        Severity::Critical,
        Category::Pcie,
        "off the bus",
    );
    cause.xid = Some(79);
    cause.pci = Some(gpu());
    cause.origin.seq = Some(1187);
    cause.origin.ts_usec = Some(9_512_238_711);
    cause.origin.raw = vec![
        "NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus."
            .into(),
    ];
    let mut before = Finding::new(
        FindingKind::GpuIdentity,
        Severity::Info,
        Category::Informational,
        "id",
    );
    before.origin.seq = Some(1180);
    before.origin.ts_usec = Some(9_512_000_000);
    before.origin.raw =
        vec!["NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f".into()];
    let mut inc = incident(vec![cause, before], FindingKind::Xid, Some(79));
    inc.gpu.uuid = Some("GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f".into());
    inc.count = 3;
    let s = Subject::from(&inc);
    assert_eq!(s.log_anchor, Some(1));
    assert!(s.uuid.is_some());
    let rb = test_runbook("", "[[step]]\nkmsg = { seconds_before = 60 }\n");
    let ev = run(&rb, &s).await;
    assert_eq!(
        ev.steps[0].output,
        "  [ 9512.000000] NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n\
         > [ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n"
    );
    assert!(has_note(&ev.steps[0], "counted 3 occurrences"));
    assert_eq!(ev.steps[0].target, ["60 s before, 0 s after"]);
}

// ---------------------------------------------------------------------------------------------
// On-call output

#[tokio::test]
async fn list_show_and_evidence_read_well() {
    let set = shipped();
    let list = render_list(&set);
    for rb in set.iter() {
        assert!(list.contains(rb.name()), "{list}");
    }
    assert!(
        list.contains("anything no other runbook serves (fallback)"),
        "{list}"
    );
    assert!(list.contains("xid 79, 167"), "{list}");
    let show = render_show(set.get("memory").unwrap());
    assert!(show.contains("nvidia-smi -q -d ECC -i {pci}"), "{show}");
    assert!(
        show.contains("What it means:") && show.contains("What to do next:"),
        "{show}"
    );
    assert!(show.contains("(run, needs {pci}, timeout 15 s)"), "{show}");
    let ev = run(
        set.get("memory").unwrap(),
        &xid_subject(48, Category::Memory),
    )
    .await;
    let text = render_evidence(&ev);
    assert!(
        text.starts_with("Runbook memory on test-host at "),
        "{text}"
    );
    assert!(text.contains("What the evidence says:\n  - "), "{text}");
    assert!(
        text.contains("\n  - a row remap is pending: it takes effect at the next GPU reset; drain the GPU's jobs and schedule a reset (xidwatch never resets anything) [2]\n"),
        "{text}"
    );
    assert!(text.contains("    | GPU 00000000:17:00.0"), "{text}");
    assert!(text.contains("skipped: NVML is not available"), "{text}");
}

#[test]
fn running_is_a_send_future_for_the_daemon() {
    fn assert_send<T: Send>(_: &T) {}
    let set = shipped();
    let (s, e, l) = (xid_subject(79, Category::Pcie), env(), RunLimits::default());
    let fut = set.run_for(&s, &e, &l);
    assert_send(&fut);
}

#[test]
fn the_docs_list_the_whole_catalog() {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/runbooks.md"))
            .unwrap();
    use xidwatch::runbook::safety::{BUILTIN, BUILTIN_KERNEL_LOG, READ_ROOTS};
    for line in BUILTIN.iter().chain(BUILTIN_KERNEL_LOG).chain(READ_ROOTS) {
        assert!(
            docs.lines().any(|l| l == *line),
            "docs/runbooks.md does not list `{line}`"
        );
    }
}

/// What runs is what was checked: the name must lead, through any links, to a file of that
/// name that nobody but root (or this user) can change, found in an absolute directory.
#[tokio::test]
async fn path_and_symlink_tricks_are_refused_when_a_step_would_run() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let rb = test_runbook("", "[[step]]\nrun = [\"echo-argv\", \"ok\"]\n");
    let run_in = |dir: PathBuf| {
        let mut env = env();
        env.search_path = vec![dir];
        let rb = rb.clone();
        async move {
            let ev = rb
                .run(
                    &Subject::manual(None, None, None),
                    &env,
                    &RunLimits::default(),
                )
                .await;
            ev.steps[0].clone()
        }
    };
    let real = fixture("fake-tools/echo-argv");

    // A link of the same name to the real program: resolved, checked, run.
    let d = tempfile::tempdir().unwrap();
    symlink(&real, d.path().join("echo-argv")).unwrap();
    let s = run_in(d.path().to_path_buf()).await;
    assert_eq!(s.output, "ok\n", "{s:?}");

    // A link to another program.
    let d = tempfile::tempdir().unwrap();
    symlink(fixture("fake-tools/uname"), d.path().join("echo-argv")).unwrap();
    let s = run_in(d.path().to_path_buf()).await;
    assert!(
        matches!(&s.status, StepStatus::Failed { error } if error.contains("another program")),
        "{s:?}"
    );

    // A copy anyone could have changed.
    let d = tempfile::tempdir().unwrap();
    let copy = d.path().join("echo-argv");
    std::fs::copy(&real, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = run_in(d.path().to_path_buf()).await;
    assert!(
        matches!(&s.status, StepStatus::Failed { error } if error.contains("others could change it")),
        "{s:?}"
    );

    // A relative search directory.
    let s = run_in(PathBuf::from("fixtures/fake-tools")).await;
    assert!(
        matches!(&s.status, StepStatus::Failed { error } if error.contains("relative")),
        "{s:?}"
    );
    assert!(s.output.is_empty());
}

/// The argv as it will run is matched again: a value outside its slot's range refuses the step
/// even though the placeholder's type fitted at load.
#[tokio::test]
async fn the_argv_as_filled_in_is_matched_again() {
    let text = "title = \"t\"\nfallback = true\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n[[step]]\nrun = [\"echo-argv\", \"{xid}\"]\n";
    let catalog =
        Catalog::with_additions(&[vec!["echo-argv".into(), "{int:1-10}".into()]]).unwrap();
    let rb = Runbook::from_toml(Path::new("t.toml"), text, &catalog).unwrap();
    let ev = run(&rb, &Subject::manual(None, Some(7), None)).await;
    assert_eq!(ev.steps[0].output, "7\n");
    let ev = run(&rb, &Subject::manual(None, Some(79), None)).await;
    let s = &ev.steps[0];
    assert!(
        matches!(&s.status, StepStatus::Failed { error } if error.contains("\"echo-argv 79\" as filled in is not `echo-argv {int:1-10}`")),
        "{s:?}"
    );
    assert!(s.output.is_empty());
}

/// Every kind of configured secret (inline, `env:`, `file:`; URLs, headers, HMAC keys, SMTP
/// passwords) reaches the runbook environment's redactor, and nothing else does.
#[test]
fn every_configured_secret_is_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "file-secret-2b7c\n").unwrap();
    // An `env:` secret: a variable this process has (tests do not change their environment).
    let from_env = std::env::var("PATH").unwrap();
    let text = format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = \"https://hooks.example.com/T0/inline-secret-4f2a\"\n\
         format = \"json\"\nhmac_secret = \"env:PATH\"\n\
         headers = {{ Authorization = \"file:{}\" }}\n\
         [[alerts.email]]\nname = \"mail\"\nsmtp_url = \"smtps://mail.example.com:465\"\nfrom = \"a@example.com\"\n\
         to = [\"b@example.com\"]\nusername = \"u\"\npassword = \"inline:smtp-secret-6a9c\"\n",
        file.display()
    );
    let config = xidwatch::config::Config::from_toml(&text, None).unwrap_or_else(|e| panic!("{e}"));
    let env = xidwatch::daemon::runbook_env(&config);
    let out = env.secrets.text(&format!(
        "a https://hooks.example.com/T0/inline-secret-4f2a b {from_env} c file-secret-2b7c d smtp-secret-6a9c e"
    ));
    assert_eq!(out, "a <redacted> b <redacted> c <redacted> d <redacted> e");
}

/// The configuration refuses what would widen what runs: a relative search directory, the old
/// program allowlist, an addition that reads outside the read roots; each error names its key.
#[test]
fn the_configuration_cannot_widen_what_runs() {
    for (text, needle) in [
        (
            "[runbooks]\nsearch_path = [\".\"]\n",
            "runbooks.search_path: … is relative",
        ),
        (
            "[runbooks]\nsearch_path = [\"/usr/bin\", \"relbin\"]\n",
            "runbooks.search_path: … is relative",
        ),
        (
            "[runbooks]\nallowed_programs = [\"lsmod\"]\n",
            "runbooks.allowed_programs: no longer exists",
        ),
        (
            "[runbooks]\nallow = [\"lspci\"]\n",
            "never a bare program name",
        ),
        (
            "[runbooks]\nallow = [[\"cat\", \"/etc/xidwatch/xidwatch.toml\"]]\n",
            "runbooks.allow[0]: …: only these may be read",
        ),
        (
            "[runbooks]\nallow = [[\"cat\", \"/proc/1/environ\"]]\n",
            "no pattern reads process environments",
        ),
    ] {
        let err = xidwatch::config::Config::from_toml(text, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{text}: {err}");
    }
}

/// The kernel log lines a runbook sees, and the page shows, carry each line's own time where
/// the finding kept one per line (a detail line under its head).
#[test]
fn each_kernel_log_line_keeps_its_own_time() {
    let mut f = Finding::new(
        FindingKind::FallenOffBus,
        Severity::Critical,
        Category::Pcie,
        "fell off the bus",
    );
    f.origin.ts_usec = Some(100_000_001);
    f.origin.seq = Some(7);
    f.origin.raw = vec!["head".into(), "detail".into()];
    f.origin.raw_ts_usec = vec![Some(100_000_001), Some(101_000_003)];
    let inc = incident(vec![f], FindingKind::FallenOffBus, None);
    let s = Subject::from(&inc);
    let times: Vec<Option<u64>> = s.kernel_log.iter().map(|l| l.ts_usec).collect();
    assert_eq!(times, [Some(100_000_001), Some(101_000_003)]);
}
