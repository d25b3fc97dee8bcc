//! Health checks, the per-boot inventory and each GPU's history, end to end: the daemon runs
//! against the fake `libnvidia-ml.so` (through the real nvml-wrapper), whose script changes the
//! readings over time; incidents are read from `run --json`, pages from a webhook receiver on
//! loopback, and the stored state through `xidwatch inventory` and `xidwatch history`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::support::{self, wait_until, Receiver};

const SERIAL0: &str = "1650923011234";

/// The toolkit's webhook receiver and its URL.
fn receiver() -> (String, Receiver) {
    let rx = Receiver::start();
    (rx.url(), rx)
}

/// One machine: a directory with the state, the boot id, the fake NVML script and the kernel log.
struct Machine {
    dir: tempfile::TempDir,
}

/// The toolkit's harness, with `--json`: incidents on stdout, the log on stderr.
struct Daemon {
    d: support::Daemon,
    /// Where the fake NVML counts its calls.
    calls: PathBuf,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sys/bus/pci/devices")).unwrap();
        std::fs::create_dir_all(dir.path().join("proc")).unwrap();
        Machine { dir }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the config: NVML on the fake library, health polled every second, then `extra`.
    fn config(&self, extra: &str) -> PathBuf {
        let path = self.p("xidwatch.toml");
        // Each check is its own page here: no settle delay folding a GPU's findings together.
        let extra = if extra.contains("[incidents]\n") {
            extra.replace("[incidents]\n", "[incidents]\nsettle_ms = 0\n")
        } else {
            format!("{extra}[incidents]\nsettle_ms = 0\n")
        };
        std::fs::write(
            &path,
            format!(
                "[kmsg]\npath = {:?}\n[nvml]\nenabled = true\nlibrary = {:?}\nprobe_interval_secs = 3600\ncall_timeout_secs = 5\nsysfs_root = {:?}\nprocfs_root = {:?}\n[state]\ndir = {:?}\n[health]\ninterval_secs = 1\n{extra}",
                self.p("kmsg"),
                super::support::fake_nvml_library(),
                self.p("sys"),
                self.p("proc"),
                self.p("state"),
            ),
        )
        .unwrap();
        path
    }

    /// A boot: its id, its GPUs (the fake's script) and its kernel log.
    fn boot(&self, boot_id: &str, script: &str, kmsg: &str) {
        std::fs::write(self.p("boot_id"), format!("{boot_id}\n")).unwrap();
        std::fs::write(self.p("nvml.script"), script).unwrap();
        std::fs::write(self.p("kmsg"), kmsg).unwrap();
    }

    fn start(&self, config: &Path) -> Daemon {
        let d = support::Run::new(config)
            .json()
            .env("XIDWATCH_BOOT_ID_PATH", self.p("boot_id"))
            .nvml_script(&self.p("nvml.script"))
            .env("XIDWATCH_FAKE_NVML_CALLS", self.p("nvml.calls"))
            .state_dir(&self.p("state"))
            .spawn();
        Daemon {
            d,
            calls: self.p("nvml.calls"),
        }
    }

    /// Runs `xidwatch ARGS --config CONFIG` and returns its standard output.
    fn cli(&self, config: &Path, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(args)
            .arg("--config")
            .arg(config)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "xidwatch {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl Daemon {
    /// The first incident matching `pred`; panics after `limit` with what came.
    fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let all = self
            .d
            .wait_json_within(limit, what, |l| l.iter().any(&pred));
        all.into_iter().find(|v| pred(v)).unwrap()
    }

    /// Every incident so far.
    fn incidents(&self) -> Vec<serde_json::Value> {
        self.d.json()
    }

    /// Every incident of `kind` so far.
    fn of_kind(&self, kind: &str) -> Vec<serde_json::Value> {
        self.incidents()
            .into_iter()
            .filter(|v| v["kind"] == kind)
            .collect()
    }

    /// Waits until the log says `text` (the health task has polled at least that far).
    fn wait_log(&self, text: &str, limit: Duration) {
        self.d.wait_stderr_within(limit, text)
    }

    /// Health polls so far: each reads every GPU's temperature once.
    fn temperature_reads(&self) -> usize {
        support::nvml_calls(&self.calls, "nvmlDeviceGetTemperature")
    }

    /// Waits until `polls` more health polls of `gpus` GPUs were read and the next one has
    /// begun, so what the last of them found has been handed on.
    fn wait_polls(&self, polls: usize, gpus: usize) {
        let seen = self.temperature_reads();
        wait_until(
            support::LIMIT,
            &format!("{polls} more health polls"),
            || self.temperature_reads() > seen + polls * gpus,
        );
    }

    /// SIGTERM, and the exit must be clean.
    fn stop(self) -> String {
        let s = self.d.stop();
        assert_eq!(s.code, Some(0), "{}", s.stderr);
        s.stderr
    }
}

#[test]
fn a_sustained_temperature_opens_one_incident_and_a_spike_does_not() {
    let m = Machine::new();
    // GPU 0 spikes to 95 °C for about two seconds (two polls); GPU 1 climbs to 93 °C and stays. Both slow down at
    // 92 °C, so the limit is min(85, 92 - 5) = 85 °C.
    m.boot(
        "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f",
        &format!(
            "init ok\ndriver_version 550.54.14\n\
             device pci=0000:17:00.0 serial={SERIAL0} temp=45 slowdown=92\n\
             device pci=0000:2a:00.0 serial=1650923011299 temp=45 slowdown=92\n\
             set at_ms=700 gpu=0 temp=95\nset at_ms=2600 gpu=0 temp=44\n\
             set at_ms=700 gpu=1 temp=93\n"
        ),
        "",
    );
    // Incidents close after a second, so a second report after the restart below would open a
    // new one rather than fold into the first.
    let config = m.config("[health.temperature]\nsustain_secs = 3\n[incidents]\nwindow_secs = 1\n");
    let d = m.start(&config);
    let hot = d.wait_for("the sustained temperature", Duration::from_secs(20), |v| {
        v["kind"] == "gpu_temperature"
    });
    assert_eq!(hot["pci"], "0000:2a:00.0", "{hot:#}");
    assert_eq!(hot["severity"], "warning");
    assert_eq!(hot["gpu"]["serial"], "1650923011299");
    assert!(
        hot["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("at or above 85 °C"),
        "{hot:#}"
    );
    // Three more polls: still one incident, and none for the spike.
    d.wait_polls(3, 2);
    let all = d.of_kind("gpu_temperature");
    assert_eq!(all.len(), 1, "{all:#?}");
    // The gauge names the failing check and its GPU, and nothing else.
    let status: serde_json::Value =
        serde_json::from_str(&m.cli(&config, &["status", "--json"])).unwrap();
    assert_eq!(
        status["status"]["health"]["failing"],
        serde_json::json!([["gpu_temperature", "0000:2a:00.0"]]),
        "{status:#}"
    );
    let text = m.cli(&config, &["status"]);
    assert!(
        text.contains("failing     gpu_temperature on 0000:2a:00.0"),
        "{text}"
    );
    d.stop();

    // A restart in the same boot, the GPU still hot: what was told is remembered, nobody is
    // paged again (the sustain window and two more polls pass).
    std::fs::write(
        m.p("nvml.script"),
        format!(
            "init ok\ndriver_version 550.54.14\n\
             device pci=0000:17:00.0 serial={SERIAL0} temp=45 slowdown=92\n\
             device pci=0000:2a:00.0 serial=1650923011299 temp=93 slowdown=92\n"
        ),
    )
    .unwrap();
    let d = m.start(&config);
    d.wait_log("xidwatch watching", Duration::from_secs(20));
    // The sustain window (3 s at one poll a second) and two more polls.
    d.wait_polls(5, 2);
    assert!(
        d.of_kind("gpu_temperature").is_empty(),
        "{:#?}",
        d.incidents()
    );
    let status: serde_json::Value =
        serde_json::from_str(&m.cli(&config, &["status", "--json"])).unwrap();
    assert_eq!(
        status["status"]["health"]["failing"],
        serde_json::json!([["gpu_temperature", "0000:2a:00.0"]]),
        "still failing: {status:#}"
    );
    d.stop();
}

#[test]
fn a_link_drop_to_x4_under_load_is_found_and_an_idle_link_is_not() {
    let m = Machine::new();
    // GPU 0 idles and drops its link to save power (Gen1 x4); GPU 1 is 95% busy when its link
    // drops from x16 to x4.
    m.boot(
        "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e60",
        "init ok\n\
         device pci=0000:17:00.0 serial=A0 gen=4 gen_max=4 width=16 width_max=16 util=0\n\
         device pci=0000:2a:00.0 serial=A1 gen=4 gen_max=4 width=16 width_max=16 util=95\n\
         set at_ms=300 gpu=0 gen=1 width=4\n\
         set at_ms=300 gpu=1 width=4\n",
        "",
    );
    let config = m.config("");
    let d = m.start(&config);
    let link = d.wait_for("the degraded link", Duration::from_secs(20), |v| {
        v["kind"] == "pcie_link_degraded"
    });
    assert_eq!(link["pci"], "0000:2a:00.0", "{link:#}");
    let title = link["title"].as_str().unwrap();
    assert!(
        title.contains("Gen4 x4") && title.contains("x16"),
        "{title}"
    );
    // Two more polls.
    d.wait_polls(2, 2);
    let all = d.of_kind("pcie_link_degraded");
    assert_eq!(all.len(), 1, "the idle GPU is not reported: {all:#?}");
    d.stop();
}

const TWO: &str = "init ok\ndriver_version 550.54.14\n\
    device pci=0000:17:00.0 uuid=GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f serial=1650923011234 name=NVIDIA_H100_80GB_HBM3 vbios=96.00.74.00.01 gen=5 gen_max=5 width=16 width_max=16 ecc=1 persistence=1\n\
    device pci=0000:2a:00.0 uuid=GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0 serial=1650923011299 name=NVIDIA_H100_80GB_HBM3 vbios=96.00.74.00.01 gen=5 gen_max=5 width=16 width_max=16 ecc=1 persistence=1\n";

#[test]
fn a_gpu_missing_against_the_expected_count_is_critical_and_named() {
    let m = Machine::new();
    let one = TWO.lines().take(3).collect::<Vec<_>>().join("\n") + "\n";

    // A configured count and no baseline yet: the count is short, the address cannot be named.
    m.boot("11111111-1111-1111-1111-111111111111", &one, "");
    let config = m.config("[inventory]\nexpected_gpus = 2\n");
    let d = m.start(&config);
    let miss = d.wait_for("gpu_missing", Duration::from_secs(20), |v| {
        v["kind"] == "gpu_missing"
    });
    assert_eq!(miss["severity"], "critical");
    assert!(
        miss["title"]
            .as_str()
            .unwrap()
            .contains("1 of 2 expected GPUs present"),
        "{miss:#}"
    );
    d.stop();

    // Learned from the baseline: the previous boot had two; this one has one. The one gone is
    // named, and the inventory diff says so too.
    let config = m.config("");
    m.boot("22222222-2222-2222-2222-222222222222", TWO, "");
    let d = m.start(&config);
    d.wait_log("inventory of this boot: 2 GPU(s)", Duration::from_secs(20));
    d.stop();
    m.boot("33333333-3333-3333-3333-333333333333", &one, "");
    let d = m.start(&config);
    let miss = d.wait_for("gpu_missing", Duration::from_secs(20), |v| {
        v["kind"] == "gpu_missing"
    });
    assert_eq!(miss["pci"], "0000:2a:00.0", "{miss:#}");
    assert!(miss["title"]
        .as_str()
        .unwrap()
        .contains("GPU 0000:2a:00.0 is missing: 1 of 2 expected GPUs present"));
    let gone = d.wait_for("the inventory change", Duration::from_secs(20), |v| {
        // Opened in this boot: the previous boot's "GPU new" notice ends with the reboot.
        v["kind"] == "inventory_changed" && v["pci"] == "0000:2a:00.0" && v["phase"] == "opened"
    });
    assert!(
        gone["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("GPU gone (was serial 1650923011299)"),
        "{gone:#}"
    );
    let text = m.cli(&config, &["status"]);
    assert!(
        text.contains("GPU count   1 of 2 expected (MISSING)"),
        "{text}"
    );
    d.stop();
}

#[test]
fn a_serial_changed_between_two_boots_is_reported_and_attached_to_the_gpus_incidents() {
    let m = Machine::new();
    let (url, got) = receiver();
    let config = m.config(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n"
    ));
    m.boot("44444444-4444-4444-4444-444444444444", TWO, "");
    let d = m.start(&config);
    d.wait_log("inventory of this boot: 2 GPU(s)", Duration::from_secs(20));
    d.stop();
    assert!(m
        .cli(&config, &["inventory", "--diff"])
        .contains("no previous boot"));

    // The board in 0000:17:00.0 was swapped during the reboot; then it faults.
    m.boot(
        "55555555-5555-5555-5555-555555555555",
        &TWO.replace("serial=1650923011234", "serial=1650923019999"),
        "3,1,1000001,-;NVRM: Xid (PCI:0000:17:00): 79, pid=42, name=python3, GPU has fallen off the bus.\n",
    );
    let d = m.start(&config);
    let swapped = d.wait_for("the board swap", Duration::from_secs(20), |v| {
        v["kind"] == "inventory_changed"
    });
    assert_eq!(swapped["pci"], "0000:17:00.0", "{swapped:#}");
    assert!(
        swapped["title"].as_str().unwrap().contains("board swapped"),
        "{swapped:#}"
    );
    assert!(swapped["findings"][0]["message"]
        .as_str()
        .unwrap()
        .contains("serial changed from 1650923011234 to 1650923019999"));
    // The Xid's page carries the diff of its GPU.
    wait_until(Duration::from_secs(30), "the Xid 79 page", || {
        got.docs().iter().any(|d| d["xid"] == 79)
    });
    let page = got.docs().iter().find(|d| d["xid"] == 79).cloned().unwrap();
    let diff = page["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["runbook"] == "inventory-diff")
        .unwrap_or_else(|| panic!("no inventory diff on the page: {page:#}"));
    assert!(diff["steps"][0]["notes"][0]
        .as_str()
        .unwrap()
        .contains("serial changed from 1650923011234 to 1650923019999"));
    d.stop();

    let json: serde_json::Value =
        serde_json::from_str(&m.cli(&config, &["inventory", "--diff", "--json"])).unwrap();
    assert_eq!(json[0]["what"], "serial", "{json:#}");
    assert_eq!(json[0]["before"], "1650923011234");
    let text = m.cli(&config, &["inventory"]);
    assert!(
        text.contains("0000:17:00.0") && text.contains("serial 1650923019999"),
        "{text}"
    );
    assert!(text.contains("VBIOS 96.00.74.00.01"), "{text}");
}

#[test]
fn history_counts_across_restarts_and_reboots_and_a_repeat_offender_is_escalated() {
    let m = Machine::new();
    let (url, got) = receiver();
    let config = m.config(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n"
    ));
    let xid79 = "3,1,1000001,-;NVRM: Xid (PCI:0000:17:00): 79, pid=42, name=python3, GPU has fallen off the bus.\n";
    let page_note = |doc: &serde_json::Value| -> String {
        doc["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["runbook"] == "gpu-history")
            .flat_map(|e| e["steps"][0]["notes"].as_array().cloned().unwrap())
            .map(|n| n.as_str().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let pages = |n: usize| {
        wait_until(Duration::from_secs(30), &format!("{n} pages"), || {
            got.docs().iter().filter(|d| d["xid"] == 79).count() >= n
        });
        got.docs()
            .iter()
            .filter(|d| d["xid"] == 79)
            .cloned()
            .collect::<Vec<_>>()
    };

    // First boot: the first Xid 79 on this board.
    m.boot("66666666-6666-6666-6666-666666666666", TWO, xid79);
    let d = m.start(&config);
    let first = pages(1).remove(0);
    let note = page_note(&first);
    assert!(
        note.contains("history: the first Xid 79 on this board (serial 1650923011234) in 30 days"),
        "{note}"
    );
    assert!(!first["next_steps"]
        .as_str()
        .unwrap()
        .starts_with("Replace the board"));
    d.stop();
    // A restart in the same boot re-reads nothing and counts nothing twice.
    let d = m.start(&config);
    d.wait_log("xidwatch watching", Duration::from_secs(20));
    d.stop();

    // After a reboot the board faults again: the second within 30 days meets the default rule.
    m.boot("77777777-7777-7777-7777-777777777777", TWO, xid79);
    let d = m.start(&config);
    let second = pages(2).remove(1);
    let note = page_note(&second);
    assert!(
        note.contains("history: the 2nd Xid 79 on this board (serial 1650923011234) in 30 days"),
        "{note}"
    );
    assert!(note.contains("repeat offender"), "{note}");
    let next = second["next_steps"].as_str().unwrap();
    assert!(
        next.starts_with("Replace the board / open an RMA: this is the 2nd Xid 79"),
        "{next}"
    );
    let history = second["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["runbook"] == "gpu-history")
        .unwrap();
    assert!(
        history["steps"][0]["output"]
            .as_str()
            .unwrap()
            .contains(first["id"].as_str().unwrap()),
        "the earlier incident is attached: {history:#}"
    );
    d.stop();

    let events: serde_json::Value = serde_json::from_str(&m.cli(
        &config,
        &["history", "--gpu", SERIAL0, "--since", "7d", "--json"],
    ))
    .unwrap();
    assert_eq!(events.as_array().unwrap().len(), 2, "{events:#}");
    assert_eq!(events[0]["xid"], 79);
    assert_eq!(events[0]["board"], "serial:1650923011234");
    let text = m.cli(&config, &["history", "--gpu", "0000:2a:00.0"]);
    assert_eq!(text.trim(), "no events");
}

#[test]
fn every_other_check_reaches_an_incident_with_its_severity() {
    let m = Machine::new();
    // One GPU with everything wrong at once: the driver asks for a reset, a row remap is
    // pending, the hardware thermal slowdown is on, persistence mode is off, the power draw is
    // over the limit; 1.5 s in, the uncorrectable ECC count goes up. The other GPU is healthy.
    m.boot(
        "88888888-8888-8888-8888-888888888888",
        "init ok\n\
         device pci=0000:17:00.0 serial=B0 recovery=1 remap_corr=0 remap_unc=1 remap_pending=1 \
         throttle=0x40 persistence=0 power_mw=760000 limit_mw=700000 dbe_volatile=0\n\
         device pci=0000:2a:00.0 serial=B1 recovery=0 remap_corr=0 throttle=0x4 persistence=1 \
         power_mw=300000 limit_mw=700000 dbe_volatile=7\n\
         set at_ms=1500 gpu=0 dbe_volatile=2\n",
        "",
    );
    let config = m.config("[health.throttling]\npolls = 2\n[health.power]\nsustain_secs = 1\n");
    let d = m.start(&config);
    for (kind, severity) in [
        ("recovery_action", "critical"),
        ("memory_repair", "warning"),
        ("gpu_throttling", "warning"),
        ("persistence_mode_off", "info"),
        ("power_over_limit", "warning"),
        ("ecc_dbe_increase", "critical"),
    ] {
        let inc = d.wait_for(kind, Duration::from_secs(20), |v| v["kind"] == kind);
        assert_eq!(inc["severity"], severity, "{inc:#}");
        assert_eq!(inc["pci"], "0000:17:00.0", "{inc:#}");
    }
    let reset = &d.of_kind("recovery_action")[0];
    assert!(
        reset["title"]
            .as_str()
            .unwrap()
            .contains("GPU reset required"),
        "{reset:#}"
    );
    let dbe = &d.of_kind("ecc_dbe_increase")[0];
    assert!(
        dbe["findings"][0]["message"]
            .as_str()
            .unwrap()
            .contains("volatile double-bit ECC count 0 -> 2"),
        "{dbe:#}"
    );
    // The healthy GPU (software power cap only, a DBE count left from before) raised nothing.
    d.wait_polls(1, 2);
    let on_other: Vec<_> = d
        .incidents()
        .iter()
        .filter(|v| v["pci"] == "0000:2a:00.0")
        .cloned()
        .collect();
    assert!(on_other.is_empty(), "{on_other:#?}");
    d.stop();
}

#[test]
fn without_nvml_the_count_is_taken_from_the_pci_bus() {
    let m = Machine::new();
    let dev = m.p("sys/bus/pci/devices/0000:17:00.0");
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("class"), "0x030200\n").unwrap();
    m.boot("99999999-9999-9999-9999-999999999999", "init ok\n", "");
    let config = m.p("xidwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kmsg]\npath = {:?}\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n[health]\ninterval_secs = 1\n[inventory]\nexpected_gpus = 2\n[incidents]\nsettle_ms = 0\n",
            m.p("kmsg"),
            m.p("sys"),
            m.p("state"),
        ),
    )
    .unwrap();
    let d = m.start(&config);
    let miss = d.wait_for("gpu_missing", Duration::from_secs(20), |v| {
        v["kind"] == "gpu_missing"
    });
    assert_eq!(miss["severity"], "critical");
    assert!(
        miss["title"]
            .as_str()
            .unwrap()
            .contains("1 of 2 expected GPUs present"),
        "{miss:#}"
    );
    d.stop();
}

/// The incidents so far, with the time each first arrived.
fn arrivals(d: &Daemon) -> Vec<serde_json::Value> {
    d.incidents()
}

#[test]
fn a_gpu_held_by_nobody_opens_one_incident_per_case_after_its_window_and_ends_when_free() {
    let m = Machine::new();
    // procfs: pid 4242 runs (python3, uid 54321, a Slurm job), 4343 is a zombie, 4444 is absent.
    let proc = m.p("proc");
    std::fs::create_dir_all(proc.join("4242")).unwrap();
    std::fs::write(proc.join("4242/stat"), "4242 (python3) S 1 1 1\n").unwrap();
    std::fs::write(proc.join("4242/comm"), "python3\n").unwrap();
    std::fs::write(
        proc.join("4242/status"),
        "Name:\tpython3\nState:\tS (sleeping)\nUid:\t54321\t54321\t54321\t54321\n",
    )
    .unwrap();
    std::fs::write(
        proc.join("4242/cgroup"),
        "0::/system.slice/slurmstepd.scope/job_12345/step_0/user/task_0\n",
    )
    .unwrap();
    std::fs::create_dir_all(proc.join("4343")).unwrap();
    std::fs::write(proc.join("4343/stat"), "4343 (trainer) Z 1 1 1\n").unwrap();
    // GPU 0: busy with no process, free at 5 s. GPU 1: held by an absent pid, free at 5 s.
    // GPU 2: held by a zombie. GPU 3: busy with a live process. GPU 4: a 1 s spike with no
    // process. GPU 5: the live process's memory grows every second for 4 s, then stays.
    m.boot(
        "99999999-9999-9999-9999-999999999999",
        "init ok\n\
         device pci=0000:17:00.0 util=90 mem_used_mib=300 compute=none graphics=none\n\
         device pci=0000:2a:00.0 util=0 mem_used_mib=2400 compute=4444:2048\n\
         device pci=0000:3b:00.0 util=0 mem_used_mib=1400 compute=4343:1024\n\
         device pci=0000:4c:00.0 util=95 mem_used_mib=40000 compute=4242:39000\n\
         device pci=0000:5d:00.0 util=90 mem_used_mib=300 compute=none\n\
         device pci=0000:6e:00.0 util=40 mem_used_mib=1300 compute=4242:1000\n\
         set at_ms=1000 gpu=4 util=0\n\
         set at_ms=5000 gpu=0 util=0\n\
         set at_ms=5000 gpu=1 mem_used_mib=300 compute=none\n\
         set at_ms=1000 gpu=5 compute=4242:1200\nset at_ms=2000 gpu=5 compute=4242:1400\n\
         set at_ms=3000 gpu=5 compute=4242:1600\nset at_ms=4000 gpu=5 compute=4242:1800\n",
        "",
    );
    let config = m.config(
        "[health.gpu_held]\nsustain_secs = 3\n[health.memory_growth]\nenabled = true\nsustain_secs = 3\nmin_growth_mib = 100\n",
    );
    let started = Instant::now();
    let d = m.start(&config);
    let limit = Duration::from_secs(30);
    let idle = d.wait_for("GPU held with no process", limit, |v| {
        v["kind"] == "gpu_held_no_process"
    });
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "before the window"
    );
    assert_eq!(idle["pci"], "0000:17:00.0", "{idle:#}");
    assert_eq!(idle["severity"], "warning");
    let msg = idle["findings"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("utilization 90%") && msg.contains("holder: none"),
        "{msg}"
    );
    let gone = d.wait_for("held by an absent pid", limit, |v| {
        v["kind"] == "gpu_held_by_gone_process" && v["pci"] == "0000:2a:00.0"
    });
    let msg = gone["findings"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("pid 4444") && msg.contains("no such process in xidwatch's pid namespace"),
        "{msg}"
    );
    let zombie = d.wait_for("held by a zombie", limit, |v| {
        v["kind"] == "gpu_held_by_gone_process" && v["pci"] == "0000:3b:00.0"
    });
    let msg = zombie["findings"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("pid 4343 (zombie") && msg.contains("trainer"),
        "{msg}"
    );
    let grew = d.wait_for("memory that only grows", limit, |v| {
        v["kind"] == "gpu_memory_growth"
    });
    assert_eq!(grew["pci"], "0000:6e:00.0", "{grew:#}");
    let msg = grew["findings"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("pid 4242 (python3, ") && msg.contains("uid 54321") && msg.contains("12345"),
        "{msg}"
    );
    // A state: no resolved notice while the GPU is still held (the first ones came at 3 s,
    // GPUs 0 and 1 are held until 5 s).
    let resolved = |pci: &str| {
        arrivals(&d)
            .into_iter()
            .filter(|v| v["phase"] == "resolved" && v["pci"] == pci)
            .collect::<Vec<_>>()
    };
    assert!(resolved("0000:17:00.0").is_empty(), "{:#?}", arrivals(&d));
    // GPUs 0 and 1 are free from 5 s on; each check ends after a whole free window, and only
    // then is its incident resolved, the same incident.
    d.wait_log(
        "health check gpu_held_no_process passes again on 0000:17:00.0",
        limit,
    );
    d.wait_log(
        "health check gpu_held_by_gone_process passes again on 0000:2a:00.0",
        limit,
    );
    for (opened, pci) in [(&idle, "0000:17:00.0"), (&gone, "0000:2a:00.0")] {
        let end = d.wait_for("the verified end", limit, |v| {
            v["phase"] == "resolved" && v["pci"] == pci
        });
        assert_eq!(end["id"], opened["id"], "{end:#}");
        assert_eq!(end["kind"], opened["kind"], "{end:#}");
    }
    let status: serde_json::Value =
        serde_json::from_str(&m.cli(&config, &["status", "--json"])).unwrap();
    let failing = status["status"]["health"]["failing"].to_string();
    assert!(!failing.contains("0000:17:00.0"), "{failing}");
    assert!(!failing.contains("0000:2a:00.0"), "{failing}");
    assert!(
        failing.contains("[\"gpu_held_by_gone_process\",\"0000:3b:00.0\"]"),
        "the zombie still holds GPU 2: {failing}"
    );
    assert!(
        resolved("0000:3b:00.0").is_empty(),
        "the zombie's incident stays open: {:#?}",
        arrivals(&d)
    );
    // By now (more than two windows in), the live process and the spike opened nothing, and
    // each case opened one incident.
    let all = arrivals(&d);
    for pci in ["0000:4c:00.0", "0000:5d:00.0"] {
        assert!(!all.iter().any(|v| v["pci"] == pci), "{pci}: {all:#?}");
    }
    for (kind, pci) in [
        ("gpu_held_no_process", "0000:17:00.0"),
        ("gpu_held_by_gone_process", "0000:2a:00.0"),
        ("gpu_held_by_gone_process", "0000:3b:00.0"),
        ("gpu_memory_growth", "0000:6e:00.0"),
    ] {
        let mut ids: Vec<String> = all
            .iter()
            .filter(|v| v["kind"] == kind && v["pci"] == pci)
            .map(|v| v["id"].to_string())
            .collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 1, "{kind} on {pci}: {all:#?}");
    }
    d.stop();
}

#[test]
fn fabric_registration_in_progress_past_its_window_is_found_and_completed_ends_it() {
    let m = Machine::new();
    // GPU 0: registration in progress until 6 s, then complete. GPU 1: no fabric (not
    // supported, state 0). GPU 2: complete from the start.
    m.boot(
        "77777777-7777-7777-7777-777777777777",
        "init ok\n\
         device pci=0000:17:00.0 fabric_state=2 fabric_clique=7\n\
         device pci=0000:2a:00.0 fabric_state=0\n\
         device pci=0000:3b:00.0 fabric_state=3 fabric_clique=7\n\
         set at_ms=6000 gpu=0 fabric_state=3\n",
        "",
    );
    let config = m.config("[health.fabric]\nsustain_secs = 3\n");
    let started = Instant::now();
    let d = m.start(&config);
    let limit = Duration::from_secs(30);
    let f = d.wait_for("fabric not registered", limit, |v| {
        v["kind"] == "fabric_not_registered"
    });
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "before the window"
    );
    assert_eq!(f["pci"], "0000:17:00.0", "{f:#}");
    assert_eq!(f["severity"], "critical");
    let msg = f["findings"][0]["message"].as_str().unwrap();
    assert!(
        msg.contains("in progress") && msg.contains("clique 7"),
        "{msg}"
    );
    d.wait_log(
        "health check fabric_not_registered passes again on 0000:17:00.0",
        limit,
    );
    let all = arrivals(&d);
    let fabric: Vec<_> = all
        .iter()
        .filter(|v| v["kind"] == "fabric_not_registered")
        .map(|v| (v["id"].to_string(), v["pci"].to_string()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(fabric.len(), 1, "{all:#?}");
    d.stop();
}

/// A health check's incident is a state: a pending row remap stays open past a short window
/// and quiet period while the fake still reports it (the check reports once, then is silent),
/// and is resolved, with a notice that says it was verified, only once the remap is done.
#[test]
fn a_pending_row_remap_is_resolved_only_when_the_check_verifies_it_done() {
    let m = Machine::new();
    let (url, got) = receiver();
    // The remap is pending until 7 s; the other GPU is healthy throughout.
    m.boot(
        "66666666-6666-6666-6666-666666666666",
        "init ok\n\
         device pci=0000:17:00.0 serial=B0 remap_corr=0 remap_unc=1 remap_pending=1\n\
         device pci=0000:2a:00.0 serial=B1 remap_corr=0 remap_unc=0 remap_pending=0\n\
         set at_ms=7000 gpu=0 remap_pending=0\n",
        "",
    );
    let config = m.config(&format!(
        "[[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n[incidents]\nwindow_secs = 1\nquiet_secs = 1\n"
    ));
    let d = m.start(&config);
    let limit = Duration::from_secs(30);
    let opened = d.wait_for("memory_repair", limit, |v| v["kind"] == "memory_repair");
    let seen = Instant::now();
    assert_eq!(opened["pci"], "0000:17:00.0", "{opened:#}");
    // Past its window and quiet period (2 s) with room to spare: an event would be resolved by
    // now; this one stays open while the check still fails.
    wait_until(limit, "three seconds past the page", || {
        assert!(
            !arrivals(&d).iter().any(|v| v["phase"] == "resolved"),
            "resolved while the remap is still pending: {:#?}",
            arrivals(&d)
        );
        seen.elapsed() >= Duration::from_secs(3)
    });
    let status: serde_json::Value =
        serde_json::from_str(&m.cli(&config, &["status", "--json"])).unwrap();
    let failing = status["status"]["health"]["failing"].to_string();
    assert!(
        failing.contains("[\"memory_repair\",\"0000:17:00.0\"]"),
        "the check still fails: {failing}"
    );
    assert!(!arrivals(&d).iter().any(|v| v["phase"] == "resolved"));
    // The remap is done at 7 s: the check passes, and the same incident ends.
    let end = d.wait_for("the verified end", limit, |v| v["phase"] == "resolved");
    assert_eq!(end["id"], opened["id"], "{end:#}");
    d.wait_log(
        "health check memory_repair passes again on 0000:17:00.0",
        limit,
    );
    wait_until(limit, "the resolved notice on the webhook", || {
        got.docs().iter().any(|v| v["phase"] == "resolved")
    });
    let hooks = got.docs().clone();
    let notice = hooks.iter().find(|v| v["phase"] == "resolved").unwrap();
    let headline = notice["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("[RESOLVED]") && headline.contains("(passes again: verified at "),
        "{headline}"
    );
    assert_eq!(
        hooks.iter().filter(|v| v["phase"] == "resolved").count(),
        1,
        "{hooks:#?}"
    );
    d.stop();
}
