//! `xidwatch scan` and `xidwatch explain` as a user runs them: exit codes, JSON Lines contract,
//! gzip archives, and bad input that must never panic or go silent.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xidwatch"))
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/logs")
        .join(name)
}

fn scan(args: &[&str], files: &[&Path]) -> Output {
    bin()
        .arg("scan")
        .args(args)
        .args(files)
        .output()
        .expect("running xidwatch")
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON {l:?}: {e}")))
        .collect()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[test]
fn mixed_sample_shows_every_kind_with_the_contract_fields() {
    let out = scan(&["--json"], &[&fixture("mixed.log")]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_lines(&out);
    for kind in [
        "xid",
        "sxid",
        "fallen_off_bus",
        "driver_init_failure",
        "api_mismatch",
        "driver_error",
        "pcie_aer",
        "gpu_identity",
    ] {
        assert!(v.iter().any(|f| f["kind"] == kind), "no {kind} finding");
    }
    for f in &v {
        for key in [
            "kind", "xid", "pci", "pid", "process", "severity", "line", "lines", "message",
        ] {
            assert!(f.get(key).is_some(), "{key} missing in {f}");
        }
    }
    let x79 = v.iter().find(|f| f["xid"] == 79).unwrap();
    assert_eq!(x79["pci"], "0000:17:00.0");
    assert_eq!(x79["pid"], 2207);
    assert_eq!(x79["process"], "python3");
    assert_eq!(x79["severity"], "critical");
    assert_eq!(x79["line"], 19);
    assert_eq!(x79["lines"], 1);
    assert_eq!(
        x79["gpu"]["uuid"],
        "GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f"
    );
    let api = v.iter().find(|f| f["kind"] == "api_mismatch").unwrap();
    assert_eq!(
        (api["lines"].as_u64(), api["xid"].is_null()),
        (Some(4), true)
    );
    let sxid = v.iter().find(|f| f["kind"] == "sxid").unwrap();
    assert_eq!(sxid["lines"], 3);
    // Ordinary lines and the userspace "my Xid 79 test" line produce nothing.
    assert!(v.iter().all(|f| f["line"].as_u64().unwrap() >= 12));
}

#[test]
fn human_output_has_blocks_and_a_per_gpu_summary() {
    let out = scan(&[], &[&fixture("mixed.log")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("CRITICAL Xid 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"),
        "{text}"
    );
    assert!(text.contains("  meaning  "));
    assert!(text.contains("  action   "));
    assert!(text.contains("Summary: "));
    assert!(text.contains(
        "  GPU 0000:17:00.0 GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f serial 1650923011234:"
    ));
}

#[test]
fn exit_status_follows_the_worst_severity() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = dir.path().join("quiet.log");
    std::fs::write(&quiet, "[ 1.0] nvidia-uvm: Loaded the UVM driver, major device number 508.\n[ 2.0] eth0: link up\n").unwrap();
    let out = scan(&[], &[&quiet]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("No GPU faults found"));

    let info = dir.path().join("info.log");
    std::fs::write(
        &info,
        "NVRM: GPU at PCI:0000:17:00: GPU-5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n",
    )
    .unwrap();
    assert_eq!(scan(&[], &[&info]).status.code(), Some(0));

    let missing = dir.path().join("missing.log");
    let out = scan(&[], &[&quiet, &missing]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing.log") && err.contains("cannot read"),
        "{err}"
    );
}

#[test]
fn reads_standard_input() {
    let mut child = bin()
        .args(["scan", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, DBE\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let v = json_lines(&out);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["file"], "<stdin>");
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn gzip_archives_and_truncated_ones() {
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::read(fixture("mixed.log")).unwrap();
    let gz = dir.path().join("nvidia-bug-report.log.gz");
    let packed = gzip(&log);
    std::fs::write(&gz, &packed).unwrap();
    let plain = json_lines(&scan(&["--json"], &[&fixture("mixed.log")]));
    let out = scan(&["--json"], &[&gz]);
    assert_eq!(out.status.code(), Some(1));
    let unpacked = json_lines(&out);
    assert_eq!(plain.len(), unpacked.len());

    // Cut the archive in half: the readable part is reported, then a note and exit 2.
    let cut = dir.path().join("cut.log.gz");
    std::fs::write(&cut, &packed[..packed.len() / 2]).unwrap();
    let out = scan(&["--json"], &[&cut]);
    assert_eq!(out.status.code(), Some(2));
    let partial = json_lines(&out);
    assert!(
        !partial.is_empty() && partial.len() < plain.len(),
        "{} of {}",
        partial.len(),
        plain.len()
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cut.log.gz") && err.contains("read stopped"),
        "{err}"
    );
}

#[test]
fn bad_input_is_survived_and_said() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = Vec::new();
    data.extend_from_slice(b"\x00\x01\x02\xff\xfe binary garbage \x00\n");
    data.extend_from_slice(
        b"NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=\xff\xfe, GPU has fallen off the bus.\n",
    );
    data.extend_from_slice(b"NVRM: ");
    data.extend(std::iter::repeat_n(b'A', 3 << 20));
    data.extend_from_slice(b"\n");
    data.extend_from_slice(b"NVRM: Xid (PCI:0000:2a:00): 48, pid=2, name=y, DBE\n");
    let bad = dir.path().join("bad.log");
    std::fs::write(&bad, &data).unwrap();
    let out = scan(&["--json"], &[&bad]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_lines(&out);
    let xids: Vec<_> = v
        .iter()
        .map(|f| (f["xid"].as_u64(), f["line"].as_u64()))
        .collect();
    assert_eq!(xids, vec![(Some(79), Some(2)), (Some(48), Some(4))]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("binary data"), "{err}");
    assert!(err.contains("bad.log:3: note: line longer than"), "{err}");
    assert!(err.contains("invalid UTF-8"), "{err}");
}

#[test]
fn explain_prints_the_entry_and_the_list() {
    let out = bin().args(["explain", "79"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    for want in [
        "Xid 79",
        "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
        "severity",
        "critical",
        "meaning",
        "check",
        "RESTART_BM",
        "runbook",
    ] {
        assert!(text.contains(want), "{want} not in {text}");
    }
    let out = bin().args(["explain", "999"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("unknown to this catalog"));
    let out = bin().args(["explain", "--list"]).output().unwrap();
    // NVIDIA's 172 published codes and the five the driver defines past them (173-176, 185).
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 177);
    for (code, name) in [
        ("173", "C2C fatal link failure"),
        ("174", "Silent channel reset"),
        ("175", "Memory subsystem error"),
        ("176", "PCIe correctable-error fault"),
        ("185", "Sparing event"),
    ] {
        let out = bin().args(["explain", code]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(name), "explain {code}: {text}");
        assert!(
            !text.contains("unknown to this catalog"),
            "explain {code}: {text}"
        );
    }
}

/// A config that points runbooks at the fake tools and fake sysfs/procfs trees.
fn fake_machine_config(dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let p = dir.join("xidwatch.toml");
    std::fs::write(
        &p,
        format!(
            "[runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {:?}\n",
            root.join("fixtures/fake-tools"),
            root.join("fixtures/sysfs"),
            root.join("fixtures/proc")
        ),
    )
    .unwrap();
    p
}

#[test]
fn scan_with_runbooks_labels_the_evidence_as_this_machine_now() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fake_machine_config(dir.path());
    let out = bin()
        .args(["scan", "--runbooks"])
        .arg(&cfg)
        .arg(fixture("mixed.log"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1));
    assert!(text.contains("Evidence from THIS machine"), "{text}");
    assert!(text.contains("NOW, not from when the log was written"));
    assert!(
        text.contains("runbook fallen-off-bus for 0000:17:00.0"),
        "{text}"
    );
    // The fake sysfs has 0000:17:00.0 on a degraded link: its note reaches the output.
    assert!(text.contains("GT/s"), "{text}");

    let out = bin()
        .args(["scan", "--json", "--runbooks"])
        .arg(&cfg)
        .arg(fixture("mixed.log"))
        .output()
        .unwrap();
    let v = json_lines(&out);
    let ev: Vec<_> = v.iter().filter(|o| o["type"] == "evidence").collect();
    assert!(!ev.is_empty());
    assert!(ev
        .iter()
        .all(|e| e["note"].as_str().unwrap().contains("now")));
}

#[test]
fn runbook_commands_list_show_and_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fake_machine_config(dir.path());
    let out = bin()
        .args(["runbook", "list", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "fallen-off-bus",
        "memory",
        "gsp",
        "nvlink",
        "application",
        "thermal-power",
        "recovery-action",
        "driver",
        "sxid",
        "fallback",
    ] {
        assert!(text.contains(name), "{name} not listed: {text}");
    }
    let out = bin()
        .args(["runbook", "show", "memory", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nvidia-smi"));
    let out = bin()
        .args(["runbook", "show", "nope", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = bin()
        .args([
            "runbook",
            "run",
            "fallen-off-bus",
            "--pci",
            "0000:17:00.0",
            "--xid",
            "79",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("What it means") && text.contains("Evidence"),
        "{text}"
    );
    let out = bin()
        .args([
            "runbook",
            "run",
            "fallen-off-bus",
            "--pci",
            "17:00.0; reboot",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an address that does not parse never reaches a command"
    );
}

#[test]
fn check_refuses_a_config_that_is_not_a_regular_file_at_once() {
    let start = std::time::Instant::now();
    let out = bin()
        .args(["check", "--config", "/dev/zero"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("/dev/zero") && err.contains("not a regular file"),
        "{err}"
    );
    // Refused before reading: no time spent filling memory.
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}

/// Waits for `child` to end, killing it (and failing) if it does not within `limit`.
fn wait_or_kill(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    let start = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_fifo_is_read_once_and_scan_ends() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("kern.pipe");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let mut child = bin()
        .args(["scan", "--json"])
        .arg(&fifo)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The writer: opening blocks until scan opens the other end; one writer, then EOF.
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
            w.write_all(
                b"[ 10.000000] NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
            )
            .unwrap();
        })
    };
    let status = wait_or_kill(
        &mut child,
        std::time::Duration::from_secs(20),
        "scan of a FIFO",
    );
    writer.join().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "a warning or worse was found: {out}"
    );
    let v: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(v.len(), 1, "{out}");
    assert_eq!(v[0]["xid"], 79);
}

#[test]
fn a_file_truncated_while_it_is_scanned_ends_the_scan_not_the_process() {
    use std::os::unix::process::ExitStatusExt;
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("kern.log");
    {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(
            b"[ 10.000000] NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
        )
        .unwrap();
        let filler =
            "[ 11.000000] EXT4-fs (nvme0n1p2): mounted filesystem with ordered data mode.\n"
                .repeat((1 << 20) / 78);
        for _ in 0..64 {
            f.write_all(filler.as_bytes()).unwrap();
        }
    }
    let mut child = bin()
        .args(["scan", "--json"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // As soon as scan has the file open, cut it to a few KiB.
    let fd_dir = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let start = std::time::Instant::now();
    while !std::fs::read_dir(&fd_dir).is_ok_and(|rd| {
        rd.map_while(Result::ok)
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == path))
    }) {
        assert!(start.elapsed().as_secs() < 20, "scan never opened the file");
        if child.try_wait().unwrap().is_some() {
            break; // Done before we looked: nothing to cut, still a valid outcome.
        }
        std::thread::yield_now();
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let status = wait_or_kill(&mut child, std::time::Duration::from_secs(60), "scan");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert_eq!(
        status.signal(),
        None,
        "scan was killed by a signal: {status:?}"
    );
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("\"xid\":79"), "{out}");
}

/// Commands that send nothing need no alert secret: with a channel's `env:` variable unset (as it
/// is outside the service), `scan --runbooks` and `runbook run` warn and go on, as `status`
/// does; `check`, which vouches for the channels, still refuses.
#[test]
fn commands_that_send_nothing_need_no_alert_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fake_machine_config(dir.path());
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(
        "[[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"env:XIDWATCH_IT_NEVER_SET_HOOK\"\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let run = |args: &[&str]| {
        let out = bin()
            .args(args)
            .arg(&cfg)
            .args(["--xid", "79"].iter().filter(|_| args[0] == "runbook"))
            .env_remove("XIDWATCH_IT_NEVER_SET_HOOK")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["scan", "--runbooks"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("config error"), "{err}");
    assert!(err.contains("XIDWATCH_IT_NEVER_SET_HOOK"), "{err}");
    let (code, err) = run(&["runbook", "run", "fallback", "--config"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("sends nothing"), "{err}");
    let (code, err) = run(&["check", "--config"]);
    assert_eq!(code, Some(78), "{err}");
}

/// `check` names the node a drain command will be for: the configured host when `[handoff]`
/// names no node, not a placeholder.
#[test]
fn check_names_the_real_node_of_the_hand_off() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        format!(
            "[state]\ndir = {:?}\n[incidents]\nhost = \"gpu-node-42\"\n[handoff]\nscheduler = \"slurm\"\n",
            dir.path().join("state")
        ),
    )
    .unwrap();
    let out = bin()
        .args(["check", "--config"])
        .arg(&cfg)
        .env_remove("NODE_NAME")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("for node gpu-node-42") && !text.contains('<'),
        "{text}"
    );
}

/// The README's block of every key with its default, as it stands, passes `check`.
#[test]
fn the_readme_defaults_block_passes_check() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let at = readme.find("Every key, with its default").unwrap();
    let start = at + readme[at..].find("```toml\n").unwrap() + 8;
    let end = start + readme[start..].find("```\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(&cfg, &readme[start..end]).unwrap();
    let out = bin()
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `scan --runbooks` runs a runbook per incident, as the daemon does: an Xid 45 folded into the
/// Xid 79 before it is that fault's cleanup, and runs no application runbook of its own.
#[test]
fn a_folded_xid_45_runs_no_runbook_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fake_machine_config(dir.path());
    let log = dir.path().join("k.log");
    std::fs::write(
        &log,
        "[ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n\
         [ 9512.240012] NVRM: Xid (PCI:0000:17:00): 45, pid=2207, name=python3, Ch 00000001 caused by previous Xid 79\n",
    )
    .unwrap();
    for json in [false, true] {
        let mut cmd = bin();
        cmd.arg("scan");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.arg("--runbooks").arg(&cfg).arg(&log).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("fallen-off-bus"), "{text}");
        assert!(
            !text.contains("runbook application") && !text.contains("\"runbook\":\"application\""),
            "{text}"
        );
    }
}

/// Whichever first-stage loop runs (the AVX2 one, the AVX-512 one, or the packed searcher, as
/// `XIDWATCH_FIRST_STAGE` lets the bench choose on one CPU), `scan` finds the same, byte for byte,
/// on every log the project holds: the shipped samples and the real lines of the corpus and the
/// unseen rounds, read as one input so that line numbers cross their files.
#[test]
fn every_first_stage_loop_finds_the_same() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["logs", "corpus", "unseen"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "log") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() > 20, "the fixtures are there: {files:?}");
    let run = |stage: Option<&str>| {
        let mut cmd = bin();
        cmd.arg("scan").arg("--json").args(&files);
        match stage {
            Some(s) => cmd.env("XIDWATCH_FIRST_STAGE", s),
            None => cmd.env_remove("XIDWATCH_FIRST_STAGE"),
        };
        let out = cmd.output().expect("running xidwatch");
        assert!(out.status.code().is_some_and(|c| c <= 2), "{out:?}");
        out.stdout
    };
    let best = run(None);
    assert!(json_lines_of(&best) > 1000);
    for stage in ["vbmi", "packed"] {
        let got = run(Some(stage));
        assert!(got == best, "XIDWATCH_FIRST_STAGE={stage} found otherwise");
    }
}

fn json_lines_of(stdout: &[u8]) -> usize {
    stdout
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .count()
}
