//! End to end: what the page says about the process an Xid line names. The program, its option
//! names and its job go out; the values of its arguments never do, and a pid the kernel has given
//! to another process is not quoted at all.

use std::path::Path;

use super::support::{self, Receiver};

/// The toolkit's webhook receiver and its URL.
fn receiver() -> (String, Receiver) {
    let rx = Receiver::start();
    (rx.url(), rx)
}

/// A process under `proc/PID`: its command line, `comm`, start time (clock ticks) and cgroup.
fn process(root: &Path, pid: u32, argv: &[&str], comm: &str, start: u64, cgroup: &str) {
    let dir = root.join(pid.to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmdline = argv.join("\0").into_bytes();
    cmdline.push(0);
    std::fs::write(dir.join("cmdline"), cmdline).unwrap();
    std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
    std::fs::write(dir.join("status"), format!("Name:\t{comm}\nPid:\t{pid}\n")).unwrap();
    std::fs::write(
        dir.join("stat"),
        format!("{pid} ({comm}) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 1 1\n"),
    )
    .unwrap();
    std::fs::write(dir.join("cgroup"), cgroup).unwrap();
}

/// Runs the daemon on one kernel log record with `proc` as its procfs and returns the webhook
/// document and the report file's text.
fn page_for(record: &str, make_proc: impl Fn(&Path)) -> (String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join("proc");
    make_proc(&proc);
    let kmsg = dir.path().join("kmsg");
    std::fs::write(&kmsg, format!("{record}\n")).unwrap();
    let (url, got) = receiver();
    let state = dir.path().join("state");
    let config = format!(
        "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\n[state]\ndir = {state:?}\n\
         [incidents]\nsettle_ms = 0\n\
         [runbooks]\nsearch_path = [{:?}]\nsysfs_root = {:?}\nprocfs_root = {proc:?}\n\
         [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n",
        root.join("fixtures/fake-tools"),
        root.join("fixtures/sysfs"),
    );
    let config_path = dir.path().join("xidwatch.toml");
    std::fs::write(&config_path, config).unwrap();
    let d = support::Run::new(&config_path).spawn();
    let reports = state.join("alert-reports");
    let report = || {
        std::fs::read_dir(&reports).ok().and_then(|rd| {
            rd.map_while(Result::ok)
                .find(|e| e.file_name().to_string_lossy().ends_with(".txt"))
                .and_then(|e| std::fs::read_to_string(e.path()).ok())
        })
    };
    support::wait_until(support::LIMIT, "an alert and its report", || {
        !got.bodies().is_empty() && report().is_some()
    });
    let s = d.stop();
    assert_eq!(s.code, Some(0), "{}", s.stderr);
    let body = got.bodies()[0].clone();
    (body, report().unwrap_or_default())
}

#[test]
fn a_jobs_arguments_stay_off_the_page_and_its_program_options_and_job_go_on_it() {
    let (body, report) = page_for(
        "4,0,9512238711,-;NVRM: Xid (PCI:0000:17:00): 13, pid=5151, name=python3, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0)",
        |proc| {
            process(
                proc,
                5151,
                &[
                    "/usr/bin/python3",
                    "train.py",
                    "--api-key=SECRET1",
                    "--db-password",
                    "SECRET2",
                    "positional-secret",
                ],
                "python3",
                100,
                "0::/system.slice/slurmstepd.scope/job_12345/step_0/user/task_0\n",
            )
        },
    );
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["evidence"][0]["runbook"], "application", "{body}");
    for (what, text) in [("webhook", &body), ("report", &report)] {
        assert!(!text.contains("SECRET"), "{what}: {text}");
        assert!(!text.contains("positional-secret"), "{what}: {text}");
        assert!(
            text.contains(
                "/usr/bin/python3 train.py --api-key=<value> --db-password <value> <1 argument>"
            ),
            "{what}: {text}"
        );
        assert!(text.contains("Slurm job 12345, step 0"), "{what}: {text}");
    }
}

#[test]
fn a_reused_pid_is_named_as_another_process_and_nothing_of_it_is_shown() {
    let (body, report) = page_for(
        "4,0,9512238711,-;NVRM: Xid (PCI:0000:17:00): 13, pid=1, name=trainer, Graphics SM Warp Exception on (GPC 2, TPC 1, SM 0)",
        |proc| {
            process(
                proc,
                1,
                &["/sbin/init", "splash-token"],
                "systemd",
                1,
                "0::/init.scope\n",
            )
        },
    );
    for (what, text) in [("webhook", &body), ("report", &report)] {
        assert!(
            text.contains("pid 1 now belongs to another process (systemd)"),
            "{what}: {text}"
        );
        assert!(!text.contains("/sbin/init"), "{what}: {text}");
        assert!(!text.contains("splash-token"), "{what}: {text}");
        assert!(!text.contains("init.scope"), "{what}: {text}");
    }
}
