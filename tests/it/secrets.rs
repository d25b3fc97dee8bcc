//! Secrets outside the runbook steps: a receiver that echoes the request in its error answer
//! (as common web frameworks do) puts no URL token and no `Authorization` value into the log,
//! `xidwatch status`, `status.json`, `alert-status.json` or the outbox; an `env:` secret is not
//! in `/proc/PID/environ`, the daemon is not dumpable, and a reload still resolves the secret.

use super::support::{self, wait_until};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every secret of these tests has this in it: none of the daemon's outputs may.
const MARK: &str = "SECRET";

/// A receiver answering every request with `code` and a body echoing the request: its request
/// line, its headers and its body. Returns its base URL and the count of requests.
fn echo_receiver(code: u16) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let Ok(clone) = conn.try_clone() else {
                continue;
            };
            let mut r = BufReader::new(clone);
            let Some((head, body)) = super::support::read_request(&mut r) else {
                continue;
            };
            let mut echo = head.concat();
            echo.push_str("\r\n");
            echo.push_str(&String::from_utf8_lossy(&body));
            c.fetch_add(1, Ordering::SeqCst);
            let resp = format!(
                "HTTP/1.1 {code} Echo\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{echo}",
                echo.len()
            );
            let _ = conn.write_all(resp.as_bytes());
        }
    });
    (base, count)
}

/// Collects a child's standard error into a string, line by line.
fn collect_log(child: &mut Child) -> Arc<Mutex<String>> {
    let log = Arc::new(Mutex::new(String::new()));
    let l2 = log.clone();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            l2.lock().unwrap().push_str(&(line + "\n"));
        }
    });
    log
}

/// Every `last_error` string anywhere in `v`.
fn last_errors(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("last_error", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => last_errors(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| last_errors(x, out)),
        _ => {}
    }
}

/// The outbox entries' text, and the `last_error`s in them.
fn outbox(state: &Path) -> (String, Vec<String>) {
    let mut text = String::new();
    let mut errors = Vec::new();
    if let Ok(rd) = std::fs::read_dir(state.join("alert-outbox")) {
        for e in rd.filter_map(Result::ok) {
            let Ok(t) = std::fs::read_to_string(e.path()) else {
                continue;
            };
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) {
                last_errors(&v, &mut errors);
            }
            text.push_str(&t);
        }
    }
    (text, errors)
}

fn xidwatch(config: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn an_echoing_receiver_puts_no_secret_in_logs_status_or_outbox() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1,-;NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, DBE\n",
    )
    .unwrap();
    let (bad, bad_count) = echo_receiver(400);
    let (down, down_count) = echo_receiver(500);
    let config = dir.path().join("xidwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[state]\ndir = {state:?}\n\
             [incidents]\nsettle_ms = 0\n\
             [runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {:?}\n\
             [alerts.retry]\ninitial_backoff_ms = 20\nmax_backoff_secs = 1\nmax_attempts = 0\n\
             [[alerts.webhook]]\nname = \"bad\"\nformat = \"slack\"\n\
             url = \"{bad}/services/T000/B000/XXXXSECRET400?token=qqqSECRETqq\"\n\
             headers = {{ Authorization = \"Bearer tok400SECRETabc\" }}\n\
             [[alerts.webhook]]\nname = \"down\"\nformat = \"json\"\n\
             url = \"{down}/hooks/YYYYSECRET500\"\n\
             headers = {{ Authorization = \"Bearer tok500SECRETxyz\" }}\n",
            root.join("fixtures/fake-tools"),
            root.join("fixtures/sysfs"),
            root.join("fixtures/proc"),
        ),
    )
    .unwrap();
    let child = support::Run::new(&config).env("RUST_LOG", "debug").spawn();

    wait_until(
        Duration::from_secs(30),
        "the 400 and a few 500 answers",
        || bad_count.load(Ordering::SeqCst) >= 1 && down_count.load(Ordering::SeqCst) >= 3,
    );
    // Both failures recorded: in the outbox entry (still pending for "down") and the status.
    wait_until(
        Duration::from_secs(30),
        "both channels' errors in the outbox entry",
        || outbox(&state).1.len() >= 2,
    );
    let alert_status =
        || std::fs::read_to_string(state.join("alert-status.json")).unwrap_or_default();
    wait_until(
        Duration::from_secs(30),
        "both channels' errors in alert-status.json",
        || {
            let mut errs = Vec::new();
            if let Ok(v) = serde_json::from_str(&alert_status()) {
                last_errors(&v, &mut errs);
            }
            errs.iter().any(|e| e.contains("HTTP 400"))
                && errs.iter().any(|e| e.contains("HTTP 500"))
        },
    );
    let status_text = xidwatch(&config, &["status"]);
    let status_json = xidwatch(&config, &["status", "--json"]);
    let (outbox_text, outbox_errors) = outbox(&state);
    let alert_status = alert_status();
    let log = child.stop().stderr;
    let status_file = std::fs::read_to_string(state.join("status.json")).unwrap();

    // The answers were seen, and what came from the request in them was cut out.
    assert!(
        outbox_errors
            .iter()
            .any(|e| e.contains("HTTP 400") && e.contains("<redacted>"))
            && outbox_errors
                .iter()
                .any(|e| e.contains("HTTP 500") && e.contains("<redacted>")),
        "{outbox_errors:#?}"
    );
    assert!(
        log.contains("HTTP 400") && log.contains("HTTP 500"),
        "{log}"
    );
    assert!(status_json.contains("HTTP 500"), "{status_json}");
    assert!(status_file.contains("HTTP 500"), "{status_file}");
    assert!(status_text.contains("HTTP 500"), "{status_text}");
    for (what, text) in [
        ("the daemon's log", &log),
        ("`xidwatch status`", &status_text),
        ("`xidwatch status --json`", &status_json),
        ("status.json", &status_file),
        ("alert-status.json", &alert_status),
        ("the outbox", &outbox_text),
    ] {
        assert!(!text.contains(MARK), "a secret in {what}:\n{text}");
    }
    // Capped: no error text is a whole echoed request.
    for e in &outbox_errors {
        assert!(e.len() <= 600, "{} bytes: {e}", e.len());
    }
}

/// The uid the daemon runs as here: this test's own, or `nobody` when the test runs as root (a
/// non-dumpable process's `/proc/PID` files belong to root, which only shows for another user).
fn daemon_uid() -> Option<u32> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    (unsafe { libc::geteuid() } == 0).then_some(65534)
}

#[test]
fn an_env_secret_is_not_in_proc_environ_the_daemon_is_not_dumpable_and_reload_resolves_it() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let as_uid = daemon_uid();
    if let Some(uid) = as_uid {
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&state, Some(uid), Some(uid)).unwrap();
    }
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let (base, _) = echo_receiver(200);
    let url = format!("{base}/services/T000/B000/ENVSECRETTOKEN42");
    let config = dir.path().join("xidwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[state]\ndir = {state:?}\n\
             [runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {:?}\n\
             [[alerts.webhook]]\nname = \"hook\"\nformat = \"json\"\nurl = \"env:XIDWATCH_IT_HOOK_URL\"\n",
            root.join("fixtures/fake-tools"),
            root.join("fixtures/sysfs"),
            root.join("fixtures/proc"),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
    cmd.args(["run", "--config"])
        .env(
            "XIDWATCH_BOOT_TIME_PATH",
            super::support::recent_boot_stat(),
        )
        .arg(&config)
        .env_remove("NOTIFY_SOCKET")
        .env("XIDWATCH_IT_HOOK_URL", &url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(uid) = as_uid {
        cmd.uid(uid).gid(uid);
    }
    let mut child = cmd.spawn().unwrap();
    let log = collect_log(&mut child);
    wait_until(Duration::from_secs(30), "the daemon to watch", || {
        if let Ok(Some(st)) = child.try_wait() {
            panic!("the daemon exited ({st}):\n{}", log.lock().unwrap());
        }
        log.lock().unwrap().contains("caught up")
    });
    let environ = format!("/proc/{}/environ", child.id());

    // Not dumpable: the kernel gives its /proc files to root.
    let owner = std::fs::metadata(&environ).unwrap().uid();
    assert_eq!(
        owner,
        0,
        "/proc/PID/environ of a non-root daemon belongs to root only when it is not dumpable\n{}",
        log.lock().unwrap()
    );
    // Unreadable for the same user; for root (who may read it), without the value.
    match std::fs::read(&environ) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains("ENVSECRETTOKEN42") && !text.contains(&url),
                "the env: secret is still in the environment block ({} bytes)",
                bytes.len()
            );
        }
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}"),
    }

    // A reload reads the config again, and the secret with it.
    super::support::signal(&child, libc::SIGHUP);
    wait_until(Duration::from_secs(30), "the reload", || {
        log.lock().unwrap().contains("config reloaded")
    });
    super::support::sigterm(&child);
    child.wait().unwrap();
    let log = log.lock().unwrap().clone();
    assert!(
        !log.contains("refused") && !log.contains("not set"),
        "{log}"
    );
    assert!(!log.contains("ENVSECRETTOKEN42"), "{log}");
}
