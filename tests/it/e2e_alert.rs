//! End to end: a kernel-log fixture with an Xid 79 goes in, an HTTP receiver on loopback gets
//! the xidwatch.alert/v1 document, and the document holds the runbook's evidence gathered with
//! the fake tools and the fake sysfs tree (a degraded link under a root port with AER errors).

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::support::{self, wait_until, Receiver};

/// The toolkit's webhook receiver and its URL.
fn receiver() -> (String, Receiver) {
    let rx = Receiver::start();
    (rx.url(), rx)
}

/// Every answered request: headers (lower-case names) and body.
fn pairs(rx: &Receiver) -> Vec<(Vec<(String, String)>, String)> {
    rx.answered()
        .iter()
        .map(|r| (r.headers.clone(), r.text()))
        .collect()
}

#[test]
fn xid_79_reaches_the_webhook_with_runbook_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,9512238711,-;NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n",
    )
    .unwrap();
    let (url, got) = receiver();
    let config_path = webhook_config(
        dir.path(),
        &kmsg,
        &url,
        "[incidents]\nhost = \"gpu-node-7\"\n",
    );
    let child = support::Run::new(&config_path).spawn();

    let start = Instant::now();
    while got.answered().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no alert reached the receiver"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.stop();
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    let (headers, body) = pairs(&got)[0].clone();
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["schema"], "xidwatch.alert/v1");
    assert_eq!(doc["xid"], 79);
    assert_eq!(doc["host"], "gpu-node-7");
    assert_eq!(doc["severity"], "critical");
    assert!(
        doc["headline"]
            .as_str()
            .unwrap()
            .contains("fell off the bus"),
        "{}",
        doc["headline"]
    );
    let key = headers
        .iter()
        .find(|(k, _)| k == "idempotency-key")
        .map(|(_, v)| v.clone());
    assert_eq!(key.as_deref(), doc["id"].as_str());
    // The evidence: the fallen-off-bus runbook, run against the fake tools and sysfs.
    let ev = &doc["evidence"][0];
    assert_eq!(ev["runbook"], "fallen-off-bus");
    let steps = ev["steps"].as_array().unwrap();
    assert!(steps.len() >= 3, "{ev}");
    let all_notes: Vec<String> = steps
        .iter()
        .flat_map(|s| s["notes"].as_array().cloned().unwrap_or_default())
        .map(|n| n.as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        all_notes
            .iter()
            .any(|n| n.contains("GT/s") && n.contains('x')),
        "a degraded-link note from the fake sysfs: {all_notes:#?}"
    );
    let outputs: String = steps
        .iter()
        .map(|s| s["output"].as_str().unwrap_or_default())
        .collect();
    assert!(
        outputs.contains("NVIDIA"),
        "fake lspci/nvidia-smi output in the evidence: {outputs}"
    );
    assert!(doc["findings"][0]["raw"][0]
        .as_str()
        .unwrap()
        .contains("Xid (PCI:0000:17:00): 79"));
}

#[test]
fn test_alert_goes_through_every_channel_and_says_so() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let (url, got) = receiver();
    let config = format!(
        "[nvml]\nenabled = false\n[state]\ndir = {:?}\n[runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {:?}\n\
         [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n\
         [[alerts.webhook]]\nname = \"dead\"\nurl = \"http://127.0.0.1:9/nothing-listens\"\nformat = \"json\"\ntimeout_secs = 2\n",
        dir.path().join("state"),
        root.join("fixtures/fake-tools"),
        root.join("fixtures/sysfs"),
        root.join("fixtures/proc"),
    );
    let config_path = dir.path().join("xidwatch.toml");
    std::fs::write(&config_path, config).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["test-alert", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "one channel is down: {text}");
    assert!(text.contains("hook") && text.contains("dead"), "{text}");
    let (_, body) = pairs(&got)[0].clone();
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["test"], true);
    assert_eq!(
        doc["evidence"][0]["runbook"], "fallen-off-bus",
        "real evidence from this machine, from the runbook `xidwatch explain 79` names"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
        .args(["test-alert", "--channel", "hook", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

fn webhook_config(dir: &Path, kmsg: &Path, url: &str, extra: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = format!(
        "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[state]\ndir = {:?}\n\
         [runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {:?}\n{extra}\
         [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n",
        dir.join("state"),
        root.join("fixtures/fake-tools"),
        root.join("fixtures/sysfs"),
        root.join("fixtures/proc"),
    );
    let path = dir.join("xidwatch.toml");
    std::fs::write(&path, config).unwrap();
    path
}

#[test]
fn a_storm_sends_one_alert_with_evidence_and_one_digest() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    let mut storm = String::new();
    for seq in 0..2000u64 {
        storm.push_str(&format!(
            "4,{seq},{},-;NVRM: Xid (PCI:0000:17:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0)\n",
            1000 + seq
        ));
    }
    std::fs::write(&kmsg, storm).unwrap();
    let (url, got) = receiver();
    // No settle delay: the storm's repeats would all settle into the first alert, and this test
    // is about the digest that follows it.
    let config = webhook_config(
        dir.path(),
        &kmsg,
        &url,
        "[incidents]\nwindow_secs = 3\nsettle_ms = 0\n",
    );
    let d = support::Run::new(&config)
        .state_dir(&dir.path().join("state"))
        .spawn();
    // Nothing more is coming once the storm is read, its incident closed (the digest is its
    // last word) and the outbox empty.
    let status = d.wait_status(
        "the storm read, its incident closed, the outbox empty",
        |s| {
            support::daemon::kmsg_records(s) >= 2000
                && s["open_incidents_total"] == 0
                && support::daemon::outbox_count(s) == 0
                && support::daemon::delivered(s, "hook") >= 2
        },
    );
    assert_eq!(status["alerts"]["accepted_total"], 2, "{status:#}");
    d.stop();
    let docs: Vec<serde_json::Value> = pairs(&got)
        .iter()
        .map(|(_, b)| serde_json::from_str(b).unwrap())
        .collect();
    assert_eq!(docs.len(), 2, "one alert and one digest, not one per line");
    let opened = docs.iter().find(|d| d["phase"] == "opened").unwrap();
    let digest = docs.iter().find(|d| d["phase"] == "digest").unwrap();
    assert_eq!(opened["evidence"][0]["runbook"], "application");
    assert_eq!(digest["count"], 2000);
    assert_eq!(
        digest["evidence"].as_array().map_or(0, |e| e.len()),
        0,
        "no runbook per repeat"
    );
    assert_eq!(opened["id"], digest["id"]);
}

#[test]
fn an_alert_in_the_outbox_survives_sigkill_and_is_sent_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1,-;NVRM: Xid (PCI:0000:17:00): 48, pid=1, name=x, DBE\n",
    )
    .unwrap();
    // A port nothing listens on yet: delivery fails and is retried.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}/alerts");
    // Short retries: the promise is the outbox across the kill, not the backoff schedule (with
    // the default 2 s doubling, the attempts the first daemon failed on a loaded machine pushed
    // the restarted daemon's next try past the wait).
    let config = webhook_config(
        dir.path(),
        &kmsg,
        &url,
        "[alerts.retry]\ninitial_backoff_ms = 50\nmax_backoff_secs = 1\n",
    );
    let spawn = || support::Run::new(&config).spawn();
    let first = spawn();
    let outbox = dir.path().join("state/alert-outbox");
    let queued = || {
        std::fs::read_dir(&outbox)
            .map(|d| {
                d.flatten()
                    .filter(|e| {
                        e.path().extension().is_some_and(|x| x == "json")
                            && e.file_name() != "meta.json"
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    wait_until(Duration::from_secs(30), "the alert in the outbox", || {
        queued() >= 1
    });
    first.kill(); // SIGKILL: no chance to clean up
    assert!(queued() >= 1, "the outbox keeps the alert across a SIGKILL");

    // The receiver comes up on that port; a restarted daemon delivers what the outbox holds, and
    // the kernel log is not re-read (the position was saved), so there is exactly one alert.
    let got = Receiver::start_on(port);
    let second = spawn();
    wait_until(Duration::from_secs(30), "the redelivered alert", || {
        !got.answered().is_empty()
    });
    // Delivered alerts leave the outbox (the restarted daemon may also re-alert the incident
    // under the same id, at least once being the promise).
    wait_until(Duration::from_secs(30), "an empty outbox", || queued() == 0);
    second.stop();
    let bodies = pairs(&got);
    let ids: std::collections::BTreeSet<String> = bodies
        .iter()
        .map(|(_, b)| {
            serde_json::from_str::<serde_json::Value>(b).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one incident, whatever the retries: {bodies:#?}"
    );
}

/// A crash while the runbook of a new incident still runs: the alert was made durable before
/// the runbook started (held for its evidence), so the restarted daemon sends it, once, saying
/// why the evidence is missing.
#[test]
fn a_crash_during_the_runbook_loses_no_alert() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let rb = dir.path().join("runbooks");
    // The barrier's meeting place: a name under /tmp the unprivileged runbook user can write
    // (the catalog allows no literal path outside its read roots).
    let meet = tempfile::Builder::new()
        .prefix("xw-e2e-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        meet.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let barrier = meet
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    std::fs::create_dir_all(&rb).unwrap();
    std::fs::write(
        rb.join("slow.toml"),
        format!(
            "title = \"slow\"\n[[match]]\nxids = [48]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\
             [[step]]\nname = \"wait\"\nrun = [\"barrier\", {barrier:?}, \"2\"]\ntimeout_secs = 3\n"
        ),
    )
    .unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=1, name=x, DBE\n",
    )
    .unwrap();
    let (url, got) = receiver();
    let config = dir.path().join("xidwatch.toml");
    std::fs::write(
        &config,
        format!(
            "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[state]\ndir = {:?}\n\
             [incidents]\nsettle_ms = 0\n\
             [runbooks]\ndirs = [{rb:?}]\nsearch_path = [{:?}]\nallow = [[\"barrier\", {barrier:?}, \"2\"]]\n\
             [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n",
            dir.path().join("state"),
            root.join("fixtures/fake-tools"),
        ),
    )
    .unwrap();
    let spawn = || support::Run::new(&config).spawn();
    let open_incidents = || -> u64 {
        let out = Command::new(env!("CARGO_BIN_EXE_xidwatch"))
            .args(["status", "--json", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v["status"]["open_incidents_total"].as_u64())
            .unwrap_or(0)
    };
    let first = spawn();
    wait_until(Duration::from_secs(30), "the incident to open", || {
        open_incidents() >= 1
    });
    // The alert is durable (held in the outbox for its runbook's evidence) before the kill.
    let outbox = dir.path().join("state/alert-outbox");
    wait_until(
        Duration::from_secs(30),
        "the held alert in the outbox",
        || {
            std::fs::read_dir(&outbox).is_ok_and(|d| {
                d.filter_map(Result::ok).any(|e| {
                    e.file_name().to_string_lossy().ends_with(".json")
                        && e.file_name() != "meta.json"
                })
            })
        },
    );
    first.kill(); // SIGKILL while the runbook waits
    assert!(got.answered().is_empty(), "the runbook was still running");

    let second = spawn();
    wait_until(
        Duration::from_secs(30),
        "the alert after the restart",
        || !got.answered().is_empty(),
    );
    second.stop();
    let bodies = pairs(&got);
    assert_eq!(bodies.len(), 1, "sent once: {bodies:#?}");
    let doc: serde_json::Value = serde_json::from_str(&bodies[0].1).unwrap();
    assert_eq!(doc["xid"], 48);
    assert!(
        doc["evidence_note"]
            .as_str()
            .is_some_and(|n| n.contains("restarted while this incident's runbook ran")),
        "{doc:#}"
    );
}

/// A runbook step that prints a configured secret (here an `env:` header of the webhook): the
/// alert is stored (outbox, report) and sent with the secret cut out.
#[test]
fn a_secret_in_runbook_output_is_stored_and_sent_redacted() {
    let secret = "xw-e2e-token-5c1d9a7f3e";
    let dir = tempfile::tempdir().unwrap();
    let rb = dir.path().join("runbooks");
    std::fs::create_dir_all(&rb).unwrap();
    std::fs::write(
        rb.join("leaky.toml"),
        format!(
            "title = \"leaky\"\n[[match]]\nxids = [48]\n[guide]\nmeaning = \"m\"\nnext_steps = \"n\"\n\
             [[step]]\nname = \"prints a token\"\nrun = [\"echo-argv\", \"token={secret}\"]\n"
        ),
    )
    .unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1,-;NVRM: Xid (PCI:0000:2a:00): 48, pid=1, name=x, DBE\n",
    )
    .unwrap();
    let (url, got) = receiver();
    let extra = format!(
        "dirs = [{rb:?}]\nallow = [[\"echo-argv\", \"token={secret}\"]]\n\
         [alerts.outbox]\nkeep_reports = 10\n"
    );
    let config = webhook_config(dir.path(), &kmsg, &url, &extra);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}headers = {{ Authorization = \"env:XW_E2E_TOKEN\" }}\n"),
    )
    .unwrap();
    let child = support::Run::new(&config)
        .env("XW_E2E_TOKEN", secret)
        .spawn();
    wait_until(Duration::from_secs(30), "the alert", || {
        !got.answered().is_empty()
    });
    child.stop();
    let (headers, body) = pairs(&got)[0].clone();
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == secret),
        "the channel itself still uses the secret"
    );
    assert!(!body.contains(secret), "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["evidence"][0]["steps"][0]["output"], "token=<redacted>\n",
        "{body}"
    );
    // Nothing stored under the state directory (outbox, reports, state) holds it either.
    let mut stack = vec![dir.path().join("state")];
    let mut files = 0;
    while let Some(p) = stack.pop() {
        for e in std::fs::read_dir(&p).unwrap().flatten() {
            let path = e.path();
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                files += 1;
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !String::from_utf8_lossy(&bytes).contains(secret),
                    "{} holds the secret",
                    path.display()
                );
            }
        }
    }
    assert!(files > 0);
}

/// One GPU fault, one page: an AER error, then Xid 79 5 ms later, then its Xid 45 cleanup, all on
/// one GPU within 50 ms, reach the webhook as exactly one opened alert, led by the Xid 79, with
/// the AER and the Xid 45 counted in it. When the GPU has been quiet for the quiet period, one
/// resolved notice for the same incident follows. With `[handoff] scheduler = "slurm"` the page
/// carries the exact drain command.
#[test]
fn one_fault_is_one_page_led_by_its_cause_then_resolved() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,9512100231,-;pcieport 0000:16:01.0: AER: Uncorrected (Fatal) error received: 0000:17:00.0\n\
         3,1,9512100240,-;nvidia 0000:17:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, (Unregistered Agent ID)\n\
         3,2,9512105231,-;NVRM: Xid (PCI:0000:17:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
         4,3,9512150002,-;NVRM: Xid (PCI:0000:17:00): 45, pid=2207, name=python3, Ch 00000010\n",
    )
    .unwrap();
    let (url, got) = receiver();
    let config = webhook_config(
        dir.path(),
        &kmsg,
        &url,
        "[incidents]\nhost = \"gpu-node-7\"\nwindow_secs = 2\nquiet_secs = 1\nsettle_ms = 500\n\
         [handoff]\nscheduler = \"slurm\"\n",
    );
    let child = support::Run::new(&config).spawn();
    let docs = || -> Vec<serde_json::Value> {
        pairs(&got)
            .iter()
            .map(|(_, b)| serde_json::from_str(b).unwrap())
            .collect()
    };
    // The Xid 79 is a lost GPU: it never resolves on silence (nothing verifies it back here,
    // without NVML). An application's Xid 13 on another GPU does, after its quiet period.
    wait_until(Duration::from_secs(30), "the page", || {
        docs()
            .iter()
            .any(|d| d["phase"] == "opened" && d["xid"] == 79)
    });
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&kmsg)
            .unwrap();
        f.write_all(b"3,4,9513000000,-;NVRM: Xid (PCI:0000:2a:00): 13, pid=2207, name=python3, Graphics Exception\n")
            .unwrap();
    }
    wait_until(Duration::from_secs(30), "the resolved notice", || {
        docs().iter().any(|d| d["phase"] == "resolved")
    });
    // `status` lists it among the recently resolved incidents, in words and in JSON.
    let status = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_xidwatch"));
        cmd.arg("status");
        if json {
            cmd.arg("--json");
        }
        let out = cmd.arg("--config").arg(&config).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let st: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    let listed = &st["status"]["recently_resolved"];
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{st:#}");
    let text = status(false);
    assert!(text.contains("recently resolved: 1"), "{text}");
    let out = child.stop();
    let docs = docs();
    let opened: Vec<_> = docs
        .iter()
        .filter(|d| d["phase"] == "opened" && d["xid"] != 13)
        .collect();
    assert_eq!(opened.len(), 1, "one page: {docs:#?}\n{}", out.stderr);
    let page = opened[0];
    assert_eq!(page["xid"], 79, "led by the cause: {page:#}");
    assert_eq!(page["severity"], "critical");
    assert_eq!(page["findings"][0]["xid"], 79);
    let echoes = page["echoes"].as_array().unwrap();
    assert!(
        echoes.iter().any(|e| e["kind"] == "pcie_aer"),
        "the AER is in the page: {echoes:?}"
    );
    assert!(
        echoes.iter().any(|e| e["xid"] == 45),
        "the Xid 45 is in the page: {echoes:?}"
    );
    assert_eq!(page["evidence"][0]["runbook"], "fallen-off-bus");
    // The hand-off: an Xid 79 takes the GPU out, so the page carries the exact Slurm command.
    assert_eq!(
        page["handoff"]["commands"][0].as_str().unwrap(),
        format!(
            "scontrol update NodeName=gpu-node-7 State=DRAIN Reason=\"xidwatch: Xid 79 on 0000:17:00.0 (incident {})\"",
            page["id"].as_str().unwrap()
        )
    );
    let resolved: Vec<_> = docs.iter().filter(|d| d["phase"] == "resolved").collect();
    assert_eq!(resolved.len(), 1, "{docs:#?}");
    assert_eq!(resolved[0]["xid"], 13, "the lost GPU stays open: {docs:#?}");
    assert!(
        resolved[0]["handoff"].is_null(),
        "nothing to drain once resolved"
    );
    assert_eq!(
        listed[0]["id"], resolved[0]["id"],
        "status lists the resolved incident"
    );
    let h = resolved[0]["headline"].as_str().unwrap();
    assert!(
        h.starts_with("[RESOLVED]") && h.contains("quiet for 1 s"),
        "{h}"
    );
}

/// A refused config's page names the file, the line and the key, never the value, and speaks of
/// no GPU: its words and its evidence are the config's, not the GPU fallback's.
#[test]
fn a_refused_config_page_names_the_key_not_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, "").unwrap();
    let (url, got) = receiver();
    let config = webhook_config(dir.path(), &kmsg, &url, "");
    let child = support::Run::new(&config).spawn();
    child.wait_stderr("caught up");
    let good = std::fs::read_to_string(&config).unwrap();
    let bad = good.replace(
        "[[alerts.webhook]]",
        "[incidents]\nwindow_secs = 987654321\n[[alerts.webhook]]",
    );
    std::fs::write(&config, &bad).unwrap();
    let line = bad
        .lines()
        .position(|l| l.starts_with("window_secs"))
        .unwrap()
        + 1;
    child.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(30), "the refusal page", || {
        !got.answered().is_empty()
    });
    child.stop();
    let (_, body) = pairs(&got)[0].clone();
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["kind"], "config_rejected", "{doc:#}");
    let headline = doc["headline"].as_str().unwrap();
    assert!(
        headline.contains("incidents.window_secs")
            && headline.contains(&format!("line {line}"))
            && headline.contains("xidwatch.toml"),
        "file, line and key in the headline: {headline}"
    );
    assert!(!body.contains("987654321"), "never the value: {body}");
    for gpu_word in ["GPU", "Xid", "nvidia-smi", "lspci"] {
        assert!(
            !body.contains(gpu_word),
            "no {gpu_word:?} in the page: {doc:#}"
        );
    }
    assert_eq!(doc["evidence"][0]["runbook"], "config-rejected");
}

/// Records lost from the kernel log: the page speaks of the log, not of a GPU; its evidence is
/// what came right after the gap (what flooded the log), not the Xid lines before it.
#[test]
fn an_overrun_page_has_its_own_words_and_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let kmsg = dir.path().join("kmsg");
    std::fs::write(
        &kmsg,
        "3,0,1000,-;NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=x, Graphics Exception\n\
         6,600,2000,-;mlx5_core 0000:3b:00.0: flood of link state messages\n\
         6,601,2001,-;mlx5_core 0000:3b:00.0: flood of link state messages\n",
    )
    .unwrap();
    let (url, got) = receiver();
    let config = webhook_config(dir.path(), &kmsg, &url, "");
    let child = support::Run::new(&config).spawn();
    let overrun = || {
        pairs(&got)
            .iter()
            .map(|(_, b)| serde_json::from_str::<serde_json::Value>(b).unwrap())
            .find(|d| d["kind"] == "kmsg_overrun")
    };
    wait_until(Duration::from_secs(30), "the overrun page", || {
        overrun().is_some()
    });
    child.stop();
    let doc = overrun().unwrap();
    assert!(
        doc["headline"]
            .as_str()
            .unwrap()
            .contains("599 records lost"),
        "{doc:#}"
    );
    assert_eq!(doc["evidence"][0]["runbook"], "kernel-log-watch");
    assert!(doc["gpu"].is_null());
    let words = format!("{} {}", doc["meaning"], doc["next_steps"]);
    assert!(
        !words.contains("Xid catalog"),
        "not the GPU fallback's words: {words}"
    );
    let steps = doc["evidence"][0]["steps"].as_array().unwrap();
    let excerpt = steps
        .iter()
        .find(|s| s["kind"] == "kmsg")
        .map(|s| s["output"].as_str().unwrap_or_default().to_string())
        .unwrap();
    assert!(excerpt.contains("flood of link state"), "{excerpt}");
    assert!(
        !excerpt.contains("Xid"),
        "no unrelated Xid lines: {excerpt}"
    );
}

/// The toolkit end to end: a scenario written from typed values, one Xid 79 paged to a webhook
/// and by email to an SMTP sink, the daemon's progress read from its status socket.
#[test]
fn one_fault_pages_the_webhook_and_email_alike() {
    let mail = support::SmtpSink::start();
    let hook = Receiver::start();
    let mut s = support::Scenario::new();
    s.set("incidents.settle_ms", 0)
        .set("incidents.host", "gpu-node-7")
        .fixture_runbooks()
        .webhook("hook", &hook.url())
        .email("mail", mail.addr(), "oncall@example.com")
        .fast_retry();
    s.append_kmsg(
        "3,0,9512238711,-;NVRM: Xid (PCI:0000:17:00): 79, pid=2207, name=python3, GPU has fallen off the bus.\n",
    );
    let d = s.spawn();
    let status = d.wait_status("both channels delivered", |st| {
        support::daemon::delivered(st, "hook") >= 1 && support::daemon::delivered(st, "mail") >= 1
    });
    assert_eq!(support::daemon::kmsg_records(&status), 1, "{status:#}");
    let page = &hook.docs()[0];
    assert_eq!(page["xid"], 79);
    assert_eq!(page["host"], "gpu-node-7");
    let mails = mail.wait_mails(1);
    assert_eq!(mails[0].to, ["oncall@example.com"]);
    let id = page["id"].as_str().unwrap();
    assert!(
        mails[0]
            .unfolded()
            .contains(&format!("X-Xidwatch-Incident: {id}")),
        "{}",
        mails[0].data
    );
    let stopped = d.stop();
    assert_eq!(stopped.code, Some(0), "{}", stopped.stderr);
}
