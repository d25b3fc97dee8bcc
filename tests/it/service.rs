//! The binary run exactly as the shipped systemd unit runs it: its ExecStart (binary and config
//! paths swapped for test ones), the environment systemd gives it, and a notification socket of
//! the test's own. It must say READY=1, WATCHDOG=1 and STOPPING=1, log without timestamps under
//! journald, and exit 0 on SIGTERM.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn unit() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/xidwatch.service"))
        .unwrap()
}

fn directive(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .trim()
        .to_string()
}

#[test]
fn runs_as_the_unit_would() {
    let unit = unit();
    assert_eq!(directive(&unit, "Type"), "notify");
    let exec: Vec<String> = directive(&unit, "ExecStart")
        .split_whitespace()
        .map(String::from)
        .collect();
    let watchdog_secs: u64 = directive(&unit, "WatchdogSec")
        .trim_end_matches('s')
        .parse()
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1,-;NVRM: Xid (PCI:0000:17:00): 79, pid=1, name=x, GPU has fallen off the bus.\n",
    )
    .unwrap();
    // The shipped default config, with the test's kmsg and no NVML.
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/xidwatch.toml"),
    )
    .unwrap();
    let config = shipped
        .replacen("\n[kmsg]\n", &format!("\n[kmsg]\npath = {kmsg:?}\n"), 1)
        .replacen("\n[nvml]\n", "\n[nvml]\nenabled = false\n", 1);
    let config_path = dir.path().join("xidwatch.toml");
    std::fs::write(&config_path, config).unwrap();

    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();

    let mut args: Vec<String> = exec[1..].to_vec();
    let at = args
        .iter()
        .position(|a| a == "--config")
        .expect("ExecStart passes --config");
    args[at + 1] = config_path.to_string_lossy().into_owned();
    let state = dir.path().join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(&args)
        .env_clear()
        .env(
            "XIDWATCH_BOOT_TIME_PATH",
            super::support::recent_boot_stat(),
        )
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("LANG", "C.UTF-8")
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", (watchdog_secs * 1_000_000).to_string())
        .env("WATCHDOG_PID", "")
        .env("STATE_DIRECTORY", &state)
        .env("CONFIGURATION_DIRECTORY", dir.path())
        .env("JOURNAL_STREAM", "8:12345")
        .env("INVOCATION_ID", "0123456789abcdef0123456789abcdef")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();

    let mut seen: Vec<String> = Vec::new();
    let mut buf = [0u8; 512];
    while !(seen.iter().any(|m| m == "READY=1") && seen.iter().any(|m| m == "WATCHDOG=1")) {
        let n = sock
            .recv(&mut buf)
            .expect("READY=1 and WATCHDOG=1 within 15 s");
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    // With no channel configured, the report goes to standard output (the journal).
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            all.push_str(&line);
            all.push('\n');
            if line.contains("fell off the bus") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(15))
        .expect("the report on standard output");
    super::support::sigterm(&child);
    loop {
        let n = sock.recv(&mut buf).expect("STOPPING=1");
        if &buf[..n] == b"STOPPING=1" {
            break;
        }
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // State went where systemd's StateDirectory= says.
    assert!(state.join("position.json").is_file());
    // Under journald: a syslog priority prefix journald maps to the level, and no timestamps of
    // our own (journald adds them).
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap_or("");
    assert!(first.starts_with("<6>kernel log"), "{err}");
    assert!(!first.contains("202"), "no timestamp: {err}");
    assert!(err.lines().all(|l| l.starts_with('<')), "{err}");
}
