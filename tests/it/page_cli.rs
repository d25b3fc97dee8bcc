//! What the on-call reads at the command line: `scan` never gives a false all-clear, counts are
//! worded right, help texts agree with what the commands do, and `check` says what it checked and
//! what is risky (cleartext http to another host).

use std::process::{Command, Output};

fn xidwatch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn scan_of_nothing_readable_is_no_all_clear() {
    let out = xidwatch(&["scan", "/nonexistent/kern.log"]);
    assert_eq!(out.status.code(), Some(2));
    let text = stdout(&out);
    assert!(!text.contains("No GPU faults found"), "{text}");
    assert!(
        text.contains("Nothing scanned: 1 input could not be read."),
        "{text}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kern.log"));
}

#[test]
fn one_finding_is_one_finding() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("kern.log");
    std::fs::write(
        &log,
        "[ 9512.238711] NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let text = stdout(&xidwatch(&["scan", log.to_str().unwrap()]));
    assert!(text.contains("Summary: 1 finding (1 critical)"), "{text}");
    assert!(!text.contains("1 findings"), "{text}");
}

#[test]
fn help_texts_agree_with_the_commands() {
    let explain = stdout(&xidwatch(&["explain", "--help"]));
    assert!(
        explain.contains("xidwatch explain <XID>") && explain.contains("xidwatch explain --list"),
        "{explain}"
    );
    let status = stdout(&xidwatch(&["status", "--help"]));
    for code in ["0 ", "3 ", "4 ", "78"] {
        assert!(
            status.lines().any(|l| l.trim_start().starts_with(code)),
            "exit status {code} in: {status}"
        );
    }
    let run = stdout(&xidwatch(&["runbook", "run", "--help"]));
    for flag in ["--pci", "--xid", "--pid", "--config"] {
        let line = run
            .lines()
            .find(|l| l.trim_start().starts_with(flag))
            .unwrap_or_else(|| panic!("{flag} in: {run}"));
        let words = line.trim_start()[flag.len()..]
            .split_whitespace()
            .filter(|w| !w.starts_with('<'))
            .count();
        assert!(words >= 3, "{flag} has help: {line:?}");
    }
}

#[test]
fn check_names_the_runbooks_and_warns_about_cleartext_to_another_host() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("xidwatch.toml");
    std::fs::write(
        &cfg,
        "[[alerts.webhook]]\nname = \"remote\"\nurl = \"http://receiver.example:8080/hook\"\nformat = \"json\"\n\
         [[alerts.webhook]]\nname = \"local\"\nurl = \"http://127.0.0.1:8080/hook\"\nformat = \"json\"\n\
         [[alerts.alertmanager]]\nname = \"am\"\nurls = [\"https://am.example:9093\", \"http://10.0.0.9:9093\"]\n\
         [handoff]\nscheduler = \"kubernetes\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = xidwatch(&["check", "--config", cfg.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 2, "{text}");
    assert!(
        warnings[0].contains("alerts.webhook[0] (remote).url")
            && warnings[0].contains("receiver.example")
    );
    assert!(
        warnings[1].contains("alerts.alertmanager[0] (am).urls[1]")
            && warnings[1].contains("10.0.0.9")
    );
    assert!(
        !text.contains("/hook"),
        "the URL's path (a token, for Slack) is not printed: {text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("runbooks: ")
            && l.contains("fallen-off-bus")
            && l.contains("checked")),
        "{text}"
    );
    assert!(text.contains("hand-off: kubernetes"), "{text}");
}
