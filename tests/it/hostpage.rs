//! End to end: GPUs that fall off the bus together are one page for the host, naming every GPU
//! and the PCIe port they share, while a single GPU's fault is still its own ordinary page.

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::time::{Duration, Instant};

use super::support::{self, Receiver};

/// The toolkit's webhook receiver and its URL.
fn receiver() -> (String, Receiver) {
    let rx = Receiver::start();
    (rx.url(), rx)
}

/// A sysfs tree with two GPUs (19:00.0, 1a:00.0) behind one PCIe switch (upstream port
/// 17:00.0, downstream ports 18:00.0 and 18:04.0) under root port 16:01.0, and a third GPU
/// (3b:00.0) on a root port of its own.
fn sysfs(root: &Path) {
    let devices = root.join("bus/pci/devices");
    std::fs::create_dir_all(&devices).unwrap();
    for path in [
        "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:19:00.0",
        "pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:04.0/0000:1a:00.0",
        "pci0000:3a/0000:3a:01.0/0000:3b:00.0",
    ] {
        std::fs::create_dir_all(root.join("devices").join(path)).unwrap();
        let name = path.rsplit('/').next().unwrap();
        symlink(format!("../../../devices/{path}"), devices.join(name)).unwrap();
    }
}

fn xid(seq: u64, usecs: u64, bus: &str, xid: u32) -> String {
    format!("3,{seq},{usecs},-;NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
}

struct Run {
    _dir: tempfile::TempDir,
    kmsg: std::path::PathBuf,
    got: Receiver,
    daemon: support::Daemon,
}

impl Run {
    /// The daemon with a 500 ms settle delay, NVML off, paging one JSON webhook.
    fn start() -> Run {
        Run::start_with("")
    }

    /// [`Run::start`] with more `[incidents]` settings.
    fn start_with(incidents: &str) -> Run {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("sys");
        sysfs(&sys);
        let kmsg = dir.path().join("kmsg");
        std::fs::write(&kmsg, "").unwrap();
        let (url, got) = receiver();
        let state = dir.path().join("state");
        let config = format!(
            "[kmsg]\npath = {kmsg:?}\n[nvml]\nenabled = false\nsysfs_root = {sys:?}\n\
             [state]\ndir = {state:?}\n[incidents]\nsettle_ms = 500\n{incidents}\n\
             [runbooks]\nsearch_path = [{:?}]\nsysfs_root = {sys:?}\n\
             [[alerts.webhook]]\nname = \"hook\"\nurl = {url:?}\nformat = \"json\"\n",
            root.join("fixtures/fake-tools"),
        );
        let config_path = dir.path().join("xidwatch.toml");
        std::fs::write(&config_path, config).unwrap();
        let daemon = support::Run::new(&config_path).spawn();
        Run {
            _dir: dir,
            kmsg,
            got,
            daemon,
        }
    }

    /// Appends records in one write, as the kernel log grows.
    fn append(&self, records: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.kmsg)
            .unwrap();
        f.write_all(records.as_bytes()).unwrap();
    }

    /// Waits until some page satisfies `done`; returns every page received so far.
    fn wait_for(
        &self,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> Vec<serde_json::Value> {
        let start = Instant::now();
        loop {
            let pages: Vec<serde_json::Value> = self
                .got
                .bodies()
                .iter()
                .map(|b| serde_json::from_str(b).unwrap())
                .collect();
            if pages.iter().any(&done) {
                return pages;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no {what}; pages: {pages:#?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(self) {
        let s = self.daemon.stop();
        assert_eq!(s.code, Some(0), "{}", s.stderr);
    }
}

fn opened_xid79(pages: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    pages
        .iter()
        .filter(|p| p["phase"] == "opened" && p["xid"] == 79)
        .collect()
}

#[test]
fn two_gpus_falling_off_together_are_one_host_page_naming_both() {
    let run = Run::start();
    // Two GPUs behind the same switch, 20 ms apart in the kernel's clock, in one append.
    run.append(&(xid(1, 9_512_238_711, "19", 79) + &xid(2, 9_512_258_711, "1a", 79)));
    run.wait_for("Xid 79 page", |p| p["xid"] == 79);
    // Progress marker: a later fault on another GPU. Had the second GPU's opening page been
    // sent on its own, it would have been handed over before this one.
    run.append(&xid(3, 9_512_300_000, "3b", 13));
    let pages = run.wait_for("marker page", |p| p["xid"] == 13);
    let opened = opened_xid79(&pages);
    assert_eq!(opened.len(), 1, "{pages:#?}");
    let page = opened[0];
    let text = page.to_string();
    assert!(
        text.contains("0000:19:00.0") && text.contains("0000:1a:00.0"),
        "{text}"
    );
    let group = &page["host_group"];
    assert_eq!(group["gpus"].as_array().map(Vec::len), Some(2), "{text}");
    assert_eq!(group["shared_ports"][0], "0000:17:00.0", "{text}");
    assert!(
        page["headline"]
            .as_str()
            .unwrap()
            .contains("2 GPUs failed together"),
        "{text}"
    );
    assert!(
        page["next_steps"].as_str().unwrap().contains("PCIe switch"),
        "{text}"
    );
    // Each GPU keeps its own incident, named on the page.
    let ids: Vec<&str> = group["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["incident_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[0], ids[1]);
    assert_eq!(page["id"], ids[0], "{text}");
    // Every GPU's runbook ran, each on its own GPU, and its evidence is on the one page.
    let evidence: Vec<&str> = page["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["runbook"].as_str())
        .collect();
    for pci in ["0000:19:00.0", "0000:1a:00.0"] {
        let name = format!("fallen-off-bus ({pci})");
        assert!(evidence.contains(&name.as_str()), "{name}: {evidence:?}");
        let ev = page["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["runbook"] == name.as_str())
            .unwrap();
        assert!(
            ev["steps"].to_string().contains(&format!("/{pci}/")),
            "{pci}'s runbook read its own GPU: {ev:#}"
        );
    }
    // The page says how the GPU stands, as the verdict does.
    assert_eq!(page["gpu_state"]["state"], "failed", "{text}");
    run.stop();
}

/// A member of a host page goes on as its own incident, and its later notices name the page
/// it was shown in, so a receiver that never saw an opening page under its id can place them.
#[test]
fn a_host_page_members_later_notices_name_the_page() {
    // Reminders: a lost GPU's "still failing" notice, its own, once a second.
    let run = Run::start_with("remind_secs = 1");
    run.append(&(xid(1, 9_512_238_711, "19", 79) + &xid(2, 9_512_258_711, "1a", 79)));
    let pages = run.wait_for("the host page", |p| {
        p["xid"] == 79 && p["phase"] == "opened"
    });
    let lead = pages.iter().find(|p| p["phase"] == "opened").unwrap()["id"].clone();
    let pages = run.wait_for("the member's reminder", |p| {
        p["phase"] == "digest" && p["gpu"]["pci"] == "0000:1a:00.0"
    });
    let digest = pages
        .iter()
        .find(|p| p["phase"] == "digest" && p["gpu"]["pci"] == "0000:1a:00.0")
        .unwrap();
    assert_ne!(digest["id"], lead, "{digest:#}");
    assert_eq!(digest["host_page"], lead, "{digest:#}");
    assert_eq!(digest["gpu_state"]["state"], "failed", "{digest:#}");
    run.stop();
}

#[test]
fn a_single_gpu_falling_off_is_its_ordinary_page() {
    let run = Run::start();
    run.append(&xid(1, 9_512_238_711, "19", 79));
    run.wait_for("Xid 79 page", |p| p["xid"] == 79);
    run.append(&xid(2, 9_512_300_000, "3b", 13));
    let pages = run.wait_for("marker page", |p| p["xid"] == 13);
    let opened = opened_xid79(&pages);
    assert_eq!(opened.len(), 1, "{pages:#?}");
    let page = opened[0];
    assert!(page.get("host_group").is_none(), "{page:#}");
    assert!(
        !page["headline"]
            .as_str()
            .unwrap()
            .contains("GPUs failed together"),
        "{page:#}"
    );
    assert_eq!(page["gpu"]["pci"], "0000:19:00.0", "{page:#}");
    run.stop();
}
