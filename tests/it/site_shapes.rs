//! The site's own shapes and silences (`[[classify.shape]]`, `[[classify.silence]]`) end to end:
//! `check` reports them and refuses a bad row by its key, `scan --config` reads an added wording
//! and stays silent on a silenced line, and a running daemon takes both on at a reload.
//!
//! The lines are real ones from the unseen rounds (`fixtures/unseen/`): a GPU metrics exporter's
//! `err: exit status 12` (nvidia-smi's exit code when NVML's library cannot be loaded), which no
//! built-in shape reads because the line names neither nvidia-smi nor NVML but a site knows its own
//! exporter, and nvidia-modeset's "lost display notification" warning, which the built-in shapes
//! report and a site of desktops may know to be harmless.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::support;

const EXPORTER: &str = r#"ts=2022-03-05T12:15:01.058Z caller=exporter.go:157 level=error error="command failed. stderr:  err: exit status 12""#;
const LOST: &str =
    "Jun 12 16:30:35 fedora-box kernel: nvidia-modeset: WARNING: GPU:0: Lost display notification (0:0x00000000); continuing.";

/// The rows a site would write for the two lines.
fn site_rows() -> String {
    format!(
        r#"
[[classify.shape]]
id = "site.exporter-nvml-missing"
literal = "err: exit status 12"
pattern = 'caller=exporter\.go:{{int}} level=error error="command failed\. stderr: +err: exit status 12"'
kind = "driver_init_failure"
severity = "critical"
category = "driver"
title = "The GPU exporter's nvidia-smi cannot load NVML"
examples = ['{EXPORTER}']

[[classify.silence]]
literal = "Lost display notification"
pattern = 'nvidia-modeset: WARNING: GPU:\d+: Lost display notification'
examples = ["{LOST}"]
"#
    )
}

/// Whether an incident is the one the exporter's row opens.
fn is_exporters(i: &Value) -> bool {
    i.to_string().contains("site.exporter-nvml-missing")
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_xidwatch"))
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn scan_json(args: &[&str], log: &Path) -> Vec<Value> {
    let out = bin()
        .arg("scan")
        .arg("--json")
        .args(args)
        .arg(log)
        .output()
        .expect("running xidwatch");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

#[test]
fn scan_with_the_sites_rows_reads_an_added_wording_and_stays_silent_on_a_silenced_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = write(dir.path(), "host.log", &format!("{LOST}\n{EXPORTER}\n"));
    // Without the site's rows: the display warning is reported, the exporter's line is not read.
    let plain = scan_json(&[], &log);
    assert_eq!(plain.len(), 1, "{plain:#?}");
    assert!(plain[0]["message"]
        .as_str()
        .unwrap_or("")
        .contains("Lost display notification"));

    let cfg = write(dir.path(), "xidwatch.toml", &site_rows());
    let site = scan_json(&["--config", cfg.to_str().expect("path")], &log);
    assert_eq!(site.len(), 1, "{site:#?}");
    let f = &site[0];
    assert_eq!(f["title"], "The GPU exporter's nvidia-smi cannot load NVML");
    assert_eq!(f["kind"], "driver_init_failure");
    assert_eq!(f["severity"], "critical");
    assert_eq!(f["category"], "driver");
    assert!(f["pci"].is_null(), "{f:#}");
    assert_eq!(f["shape"], "site.exporter-nvml-missing");
    // In a saved line, the message starts where the row's pattern matched.
    assert_eq!(
        f["message"],
        EXPORTER.find("caller=").map_or("", |at| &EXPORTER[at..])
    );
}

#[test]
fn check_reports_the_sites_rows_and_refuses_a_bad_one_by_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = write(dir.path(), "xidwatch.toml", &site_rows());
    let out = bin()
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .expect("check");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("site shapes: 1 added (site.exporter-nvml-missing), 1 silenced"),
        "{text}"
    );

    for (bad, key, words) in [
        (
            site_rows().replace("go:{int}", "go:{line}"),
            "classify.shape[0].pattern",
            "unknown slot {line}",
        ),
        (
            site_rows().replace("severity = \"critical\"", "severity = \"loud\""),
            "classify.shape[0].severity",
            "unknown severity",
        ),
        (
            site_rows().replace(
                "Lost display notification'",
                "Lost display notification DP-1'",
            ),
            "classify.silence[0].examples[0]",
            "does not match",
        ),
    ] {
        let cfg = write(dir.path(), "bad.toml", &bad);
        let out = bin()
            .args(["check", "--config"])
            .arg(&cfg)
            .output()
            .expect("check");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(err.contains(key) && err.contains(words), "{key}: {err}");
    }
}

/// A daemon reads neither row before the reload that brings them in, and both after it: the
/// added wording pages, the silenced line stays silent.
#[test]
fn a_reload_brings_in_the_sites_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kmsg = write(dir.path(), "kmsg", "");
    let boot = write(
        dir.path(),
        "boot_id",
        "5f2c1e0a-7b3d-4c61-9e8f-0a1b2c3d4e5f\n",
    );
    let stat = dir.path().join("stat");
    support::write_boot_stat(&stat, 3600);
    let base = format!(
        "[kmsg]\npath = {:?}\naccept_userspace = false\n[nvml]\nenabled = false\nsysfs_root = {:?}\n[state]\ndir = {:?}\n",
        kmsg,
        dir.path().join("sys"),
        dir.path().join("state")
    );
    let cfg = write(dir.path(), "xidwatch.toml", &base);
    let d = support::Run::new(&cfg)
        .json()
        .env("XIDWATCH_BOOT_ID_PATH", boot.to_str().expect("path"))
        .env("XIDWATCH_BOOT_TIME_PATH", stat.to_str().expect("path"))
        .spawn();
    let limit = Duration::from_secs(20);
    d.wait_stderr_within(limit, "caught up");
    let append = |seq: u64, msg: &str| {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&kmsg)
            .expect("kmsg");
        writeln!(f, "4,{seq},{},-;{msg}", 1_000_000 + seq).expect("append");
    };
    let xid = |bus: &str| format!("NVRM: Xid (PCI:0000:{bus}:00): 79, pid=42, name=python3, test");
    let modeset = LOST.split_once("kernel: ").map_or(LOST, |(_, m)| m);

    // Before: the exporter's line is no one's; the marker Xid says the lines before it were read.
    append(0, EXPORTER);
    append(1, &xid("17"));
    let v = d.wait_json_within(limit, "the first marker", |l| {
        l.iter().any(|i| i["pci"] == "0000:17:00.0")
    });
    assert!(!v.iter().any(is_exporters), "{v:#?}");

    std::fs::write(&cfg, format!("{base}{}", site_rows())).expect("config");
    d.signal(libc::SIGHUP);
    d.wait_stderr_within(limit, "config reloaded");
    append(2, modeset);
    append(3, EXPORTER);
    append(4, &xid("2a"));
    let v = d.wait_json_within(limit, "the added wording and the second marker", |l| {
        l.iter().any(is_exporters) && l.iter().any(|i| i["pci"] == "0000:2a:00.0")
    });
    let stopped = d.stop();
    let all = stopped.json();
    let added = v
        .iter()
        .find(|i| is_exporters(i))
        .expect("the exporter's incident");
    assert_eq!(added["severity"], "critical", "{added:#}");
    assert_eq!(added["kind"], "driver_init_failure", "{added:#}");
    assert!(
        !all.iter().any(|i| i.to_string().contains("Lost display")),
        "the silenced line paged: {all:#?}"
    );
}
