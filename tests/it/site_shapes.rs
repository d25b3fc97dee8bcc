//! The site's own shapes and silences (`[[classify.shape]]`, `[[classify.silence]]`) end to end:
//! `check` reports them and refuses a bad row by its key, `scan --config` reads an added wording
//! and stays silent on a silenced line, and a running daemon takes both on at a reload.
//!
//! The lines are real ones from the unseen rounds (`fixtures/unseen/`): a GPU health agent's own
//! summary of an Xid 79, which no built-in shape reads, and nvidia-modeset's "lost display
//! notification" warning, which the built-in shapes report and a site of desktops may know to be
//! harmless.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::support;

const AGENT: &str = "XID 79(GPU has fallen off the bus) detected on PCI:0000:ae:00";
const LOST: &str =
    "Jun 12 16:30:35 fedora-box kernel: nvidia-modeset: WARNING: GPU:0: Lost display notification (0:0x00000000); continuing.";

/// The rows a site would write for the two lines.
fn site_rows() -> String {
    format!(
        r#"
[[classify.shape]]
id = "site.agent-fell-off"
literal = "detected on PCI:"
pattern = 'XID 79\(GPU has fallen off the bus\) detected on PCI:{{pci}}'
kind = "fallen_off_bus"
severity = "critical"
category = "pcie"
title = "GPU has fallen off the bus (the health agent says)"
examples = ["{AGENT}"]

[[classify.silence]]
literal = "Lost display notification"
pattern = 'nvidia-modeset: WARNING: GPU:\d+: Lost display notification'
examples = ["{LOST}"]
"#
    )
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
    let log = write(dir.path(), "host.log", &format!("{LOST}\n{AGENT}\n"));
    // Without the site's rows: the display warning is reported, the agent's line is not read.
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
    assert_eq!(
        f["title"],
        "GPU has fallen off the bus (the health agent says)"
    );
    assert_eq!(f["kind"], "fallen_off_bus");
    assert_eq!(f["severity"], "critical");
    assert_eq!(f["category"], "pcie");
    assert_eq!(f["pci"], "0000:ae:00.0");
    assert_eq!(f["shape"], "site.agent-fell-off");
    // In a saved line, the message starts where the row's pattern matched.
    assert_eq!(f["message"], AGENT);
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
        text.contains("site shapes: 1 added (site.agent-fell-off), 1 silenced"),
        "{text}"
    );

    for (bad, key, words) in [
        (
            site_rows().replace("PCI:{pci}", "PCI:{address}"),
            "classify.shape[0].pattern",
            "unknown slot {address}",
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

    // Before: the agent's line is no one's; the marker Xid says the lines before it were read.
    append(0, AGENT);
    append(1, &xid("17"));
    let v = d.wait_json_within(limit, "the first marker", |l| {
        l.iter().any(|i| i["pci"] == "0000:17:00.0")
    });
    assert!(!v.iter().any(|i| i["pci"] == "0000:ae:00.0"), "{v:#?}");

    std::fs::write(&cfg, format!("{base}{}", site_rows())).expect("config");
    d.signal(libc::SIGHUP);
    d.wait_stderr_within(limit, "config reloaded");
    append(2, modeset);
    append(3, AGENT);
    append(4, &xid("2a"));
    let v = d.wait_json_within(limit, "the added wording and the second marker", |l| {
        l.iter().any(|i| i["pci"] == "0000:ae:00.0") && l.iter().any(|i| i["pci"] == "0000:2a:00.0")
    });
    let stopped = d.stop();
    let all = stopped.json();
    let added = v
        .iter()
        .find(|i| i["pci"] == "0000:ae:00.0")
        .expect("the agent's incident");
    assert_eq!(added["severity"], "critical", "{added:#}");
    assert_eq!(added["kind"], "fallen_off_bus", "{added:#}");
    assert!(
        !all.iter().any(|i| i.to_string().contains("Lost display")),
        "the silenced line paged: {all:#?}"
    );
}
